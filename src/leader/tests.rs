//! The deadline on the paused clock, and the election against a scripted Lease server: a server
//! that keeps one Lease, honours `metadata.resourceVersion` in a patch as the API server does (a
//! mismatch is `409 Conflict`), merges every patch as a JSON merge patch, and answers reads after
//! a delay the test sets.

use std::sync::Mutex;

use serde_json::{Value, json};

use super::*;
use crate::mock_api::{self, Log, Sent, status};

const ME: &str = "me";

fn config() -> ElectionConfig {
    ElectionConfig {
        namespace: "ns".into(),
        lease_name: "lock".into(),
        identity: ME.into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    }
}

/// The one Lease of the scripted server.
#[derive(Default)]
struct Server {
    /// `None`: there is no Lease.
    spec: Option<Value>,
    resource_version: u64,
    /// How long a read takes.
    read_delay: Duration,
    /// Another candidate takes the Lease over just before our next write arrives.
    rival_first: bool,
}

impl Server {
    fn lease(&self) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ns",
                "resourceVersion": self.resource_version.to_string()},
            "spec": self.spec.clone().unwrap_or(json!({}))})
    }

    fn answer(&mut self, sent: &Sent) -> (mock_api::Answer, Duration) {
        match sent.method.as_str() {
            "GET" if self.spec.is_none() => (status(404, "NotFound", "no lease"), Duration::ZERO),
            "GET" => ((200, self.lease()), self.read_delay),
            "POST" if self.spec.is_some() => {
                (status(409, "AlreadyExists", "exists"), Duration::ZERO)
            }
            "POST" => {
                self.write(sent.body["spec"].clone());
                ((201, self.lease()), Duration::ZERO)
            }
            "PATCH" => (self.patch(&sent.body), Duration::ZERO),
            _ => (status(405, "MethodNotAllowed", "no"), Duration::ZERO),
        }
    }

    fn patch(&mut self, body: &Value) -> mock_api::Answer {
        if std::mem::take(&mut self.rival_first) {
            self.take_over("rival");
        }
        let precondition = body["metadata"]["resourceVersion"].as_str();
        if precondition.is_some_and(|rv| rv != self.resource_version.to_string()) {
            return status(409, "Conflict", "the object has been modified");
        }
        let mut spec = self.spec.clone().unwrap_or(json!({}));
        if let (Some(spec), Some(patch)) = (spec.as_object_mut(), body["spec"].as_object()) {
            for (key, value) in patch {
                if value.is_null() {
                    spec.remove(key);
                } else {
                    spec.insert(key.clone(), value.clone());
                }
            }
        }
        self.write(spec);
        (200, self.lease())
    }

    fn take_over(&mut self, holder: &str) {
        self.write(json!({"holderIdentity": holder, "leaseDurationSeconds": 15,
            "renewTime": "2020-01-01T00:00:00.000000Z"}));
    }

    fn write(&mut self, spec: Value) {
        self.spec = Some(spec);
        self.resource_version += 1;
    }

    fn holder(&self) -> Option<String> {
        self.spec.as_ref()?["holderIdentity"]
            .as_str()
            .map(String::from)
    }
}

type Shared = Arc<Mutex<Server>>;

fn lock(server: &Shared) -> std::sync::MutexGuard<'_, Server> {
    server.lock().unwrap_or_else(|p| p.into_inner())
}

/// The election of `config()` against `server`, as a task that runs until the returned token is
/// cancelled.
fn elect(
    server: &Shared,
) -> (
    Arc<Leadership>,
    JoinHandle<Result<()>>,
    CancellationToken,
    Log,
) {
    let answering = server.clone();
    let (client, log) = mock_api::serve_slow(move |sent| lock(&answering).answer(sent));
    let leadership = Arc::new(Leadership::elected());
    let stop = CancellationToken::new();
    let task = spawn(
        client,
        config(),
        &leadership,
        &Arc::new(Metrics::default()),
        &stop,
    );
    (leadership, task, stop, log)
}

/// Advances the paused clock by `by`, in steps of 100 ms (so the tasks run in between).
async fn pass(by: Duration) {
    let step = Duration::from_millis(100);
    let mut left = by;
    while !left.is_zero() {
        let d = left.min(step);
        tokio::time::advance(d).await;
        tokio::task::yield_now().await;
        left -= d;
    }
}

/// Lets `secs` seconds pass (see [`pass`]), then asserts whether `leadership` may write.
async fn after(secs: u64, leadership: &Leadership, may_write: bool, why: &str) {
    pass(Duration::from_secs(secs)).await;
    assert_eq!(leadership.may_write(), may_write, "{why}");
}

/// A Lease read that takes 3 s (longer than the retry period, longer than the 2 s a read was once
/// allowed) is waited for and the renewal retried: leadership is kept. Only once no renewal has
/// succeeded for the renew deadline are writes refused, and then the election ends with
/// `LeadershipLost`.
#[tokio::test(start_paused = true)]
async fn a_slow_lease_read_is_retried_until_the_renew_deadline() {
    let server = Shared::default();
    let (leadership, task, _stop, _log) = elect(&server);
    after(3, &leadership, true, "leads after creating the Lease").await;
    assert_eq!(lock(&server).holder().as_deref(), Some(ME));

    lock(&server).read_delay = Duration::from_secs(3);
    for second in 0..40 {
        let why = format!("slow reads, {second} s in: still leading");
        after(1, &leadership, true, &why).await;
        assert!(
            !task.is_finished(),
            "slow reads, {second} s in: still running"
        );
    }

    // The API server stops answering reads: the last renewal was sent at most 5 s ago (3 s read,
    // then the patch), so writes go on for at least 5 s more, and stop within the deadline.
    lock(&server).read_delay = Duration::from_secs(3600);
    after(
        4,
        &leadership,
        true,
        "within the deadline of the last renewal",
    )
    .await;
    let why = "the renew deadline passed without a renewal";
    after(7, &leadership, false, why).await;
    pass(Duration::from_secs(1)).await;
    assert!(task.is_finished(), "the election has ended");
    let ended = task.await.expect("the election task");
    assert!(matches!(ended, Err(Error::LeadershipLost)), "{ended:?}");
}

/// The patches that made `ME` the holder of a Lease someone else held.
fn takeovers(log: &Log) -> Vec<Sent> {
    log.all()
        .into_iter()
        .filter(|s| s.method == "PATCH" && s.body["spec"]["holderIdentity"] == ME)
        .filter(|s| s.body["spec"].get("leaseTransitions") == Some(&json!(1)))
        .collect()
}

/// An expired Lease of another holder is taken over by a patch that carries the resourceVersion
/// it was read at; at shutdown the leader gives it up the same way.
#[tokio::test(start_paused = true)]
async fn a_takeover_carries_the_resource_version_it_read() {
    let server = Shared::default();
    lock(&server).take_over("gone");
    let read_at = lock(&server).resource_version.to_string();
    let (leadership, task, stop, log) = elect(&server);
    let why = "the other term is not over (by our clock)";
    after(10, &leadership, false, why).await;
    after(8, &leadership, true, "the expired Lease is ours").await;
    let taken = takeovers(&log);
    assert_eq!(taken.len(), 1, "{:?}", log.lines());
    assert_eq!(
        taken[0].body["metadata"]["resourceVersion"], read_at,
        "{}",
        taken[0].body
    );
    assert_eq!(taken[0].content_type, "application/merge-patch+json");

    let before = lock(&server).resource_version.to_string();
    stop.cancel();
    task.await
        .expect("the election task")
        .expect("a clean stop");
    let last = log.all().pop().expect("a request");
    assert_eq!(last.method, "PATCH", "released: {:?}", log.lines());
    assert_eq!(last.body["spec"]["holderIdentity"], Value::Null);
    assert_eq!(last.body["metadata"]["resourceVersion"], before);
    assert_eq!(lock(&server).holder(), None, "the Lease is free");
}

/// Two candidates take over the same expired Lease: the other one writes first, so our write,
/// based on the older read, is refused (409) and we do not lead; the other's term is respected.
#[tokio::test(start_paused = true)]
async fn of_two_candidates_taking_over_only_one_wins() {
    let server = Shared::default();
    lock(&server).take_over("gone");
    lock(&server).rival_first = true;
    let (leadership, _task, _stop, log) = elect(&server);
    for second in 0..28 {
        let why = format!("{second} s in: the rival won");
        after(1, &leadership, false, &why).await;
        assert_ne!(lock(&server).holder().as_deref(), Some(ME), "{second} s in");
    }
    assert_eq!(lock(&server).holder().as_deref(), Some("rival"));
    assert!(
        log.all().iter().any(|s| s.method == "PATCH"),
        "we did try: {:?}",
        log.lines()
    );
}

/// The deadline is read on the paused clock: writes stop exactly at it, not some time later.
#[tokio::test(start_paused = true)]
async fn writes_stop_at_the_renew_deadline_by_the_local_clock() {
    assert!(
        Leadership::always().may_write(),
        "without election this process always writes"
    );
    let l = Leadership::elected();
    assert!(!l.may_write(), "a candidate does not write");
    l.set(true, Some(Instant::now() + Duration::from_millis(50)));
    tokio::time::advance(Duration::from_millis(49)).await;
    assert!(l.may_write(), "1 ms before the deadline");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(
        !l.may_write(),
        "at the deadline, even before the election task notices"
    );
    l.set(true, Some(Instant::now() + Duration::from_secs(10)));
    assert!(l.may_write(), "a renewal moves the deadline");
    l.set(false, None);
    assert!(!l.may_write(), "not leading");
}

#[test]
fn becoming_leader_is_announced() {
    let l = Leadership::elected();
    let mut rx = l.subscribe();
    l.set(true, Some(Instant::now() + Duration::from_secs(1)));
    assert!(rx.has_changed().unwrap_or(false) && *rx.borrow_and_update());
    l.set(true, Some(Instant::now() + Duration::from_secs(2)));
    assert!(
        !rx.has_changed().unwrap_or(true),
        "a renewal is not a change"
    );
}
