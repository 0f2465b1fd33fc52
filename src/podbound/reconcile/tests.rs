//! One pass over one claim against a scripted API server (`crate::mock_api`) and caches filled by
//! hand: the requests the read-before-write loop sends, and that a write follows only the live
//! read. The caches are stale in each case, so a pass that wrote from them would send another
//! request than the one asserted.

use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::mock_api::{self, Answer, Log, Sent};

const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/cache";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const GRACE: Duration = Duration::from_secs(600);

/// Claim `cache` of `ns`, bound by annotation to pod `runner`, created and recorded as waiting for
/// it long before the grace.
fn claim() -> Claim {
    let mut claim = unrecorded();
    let annotations = claim.metadata.annotations.get_or_insert_default();
    annotations.insert(WAITING.into(), "runner@2020-01-01T00:00:00Z".into());
    claim
}

const WAITING: &str = "statefulsets.kubernetes.io/bound-to-pod-waiting-since";

/// Claim `cache` as [`claim`], created long before the grace, but never seen waiting (annotated
/// just now, say).
fn unrecorded() -> Claim {
    serde_json::from_value(json!({
        "metadata": {"name": "cache", "namespace": "ns", "uid": "uid-claim",
            "resourceVersion": "5", "creationTimestamp": "2020-01-01T00:00:00Z",
            "annotations": {"statefulsets.kubernetes.io/bound-to-pod": "runner"}}
    }))
    .expect("claim")
}

/// Pod `name` with UID `uid`, mounting the claim `cache` when `mounts`.
fn pod(name: &str, uid: &str, mounts: bool) -> Value {
    let volumes = if mounts {
        json!([{"name": "v", "persistentVolumeClaim": {"claimName": "cache"}}])
    } else {
        json!([])
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": volumes},
        "status": {"phase": "Running"}})
}

fn pod_list(items: Vec<Value>) -> Answer {
    let list = json!({"apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": "9"}, "items": items});
    (200, list)
}

/// A context over the scripted server, its caches holding `cached` pods.
fn context<F>(cached: Vec<Value>, answer: F) -> (Context, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let metrics = Arc::new(Metrics::default());
    let (reporter, runner) = crate::pass::test_parts::<Claim>(
        crate::naming::Controller::PodBound,
        &client,
        &metrics,
        false,
    );
    let leadership = Arc::new(Leadership::always());
    let (caches, _feeds) = Caches::new(&client, Some("ns"), None, false);
    caches.pods.apply(&Event::Init);
    for p in cached {
        let p = serde_json::from_value(p).expect("pod");
        caches.pods.apply(&Event::InitApply(p));
    }
    caches.pods.apply(&Event::InitDone);
    let binder = Actor::new(client.clone(), reporter, leadership.clone());
    let claims = kube::runtime::reflector::store::<Claim>().0;
    let ctx = Context::new(client, (caches, claims), binder, GRACE, leadership, runner);
    (ctx, log)
}

/// A list of the namespace's pods: by name (`Some(name)`, field selector) or all of them.
fn listed(sent: &Sent) -> Option<Option<String>> {
    (sent.method == "GET" && sent.path == PODS).then(|| {
        sent.query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name%3D"))
            .map(str::to_string)
    })
}

/// The requests besides Events, with lists told apart: `LIST runner`, `LIST *`, `PATCH`, ...
fn requests(log: &Log) -> Vec<String> {
    let line = |s: &Sent| match listed(s) {
        Some(Some(name)) => format!("LIST {name}"),
        Some(None) => "LIST *".into(),
        None => format!("{} {}", s.method, s.path.trim_start_matches(CLAIM)),
    };
    log.writes_and_reads().iter().map(line).collect()
}

/// The cache still holds the pod of the name under its old UID; read live, it was replaced. The
/// owner patch names the live pod's UID, after exactly one list by name.
#[tokio::test]
async fn a_binding_is_to_the_uid_read_live_not_the_cached_one() {
    let (ctx, log) = context(vec![pod("runner", "uid-old", false)], |sent| {
        match listed(sent) {
            Some(_) => pod_list(vec![pod("runner", "uid-new", false)]),
            None => (200, json!({})),
        }
    });
    ctx.pass(&claim()).await.expect("pass");
    assert_eq!(requests(&log), ["LIST runner", "PATCH "]);
    let patch = &log.writes_and_reads()[1].body;
    assert_eq!(
        patch[2]["value"],
        json!([{"apiVersion": "v1", "kind": "Pod",
        "name": "runner", "uid": "uid-new", "blockOwnerDeletion": false}])
    );
}

/// The cache still shows the pod; read live, it is gone, and the namespace's list shows another
/// pod mounting the claim. Three decisions, two reads, no write: the claim is in use.
#[tokio::test]
async fn a_pod_gone_live_with_another_user_is_kept() {
    let (ctx, log) = context(vec![pod("runner", "uid-old", false)], |sent| {
        match listed(sent) {
            Some(Some(_)) => pod_list(Vec::new()),
            Some(None) => pod_list(vec![pod("reader", "uid-reader", true)]),
            None => mock_api::deleted(),
        }
    });
    ctx.pass(&claim()).await.expect("pass");
    assert_eq!(requests(&log), ["LIST runner", "LIST *"]);
    let events = log.published();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with(
            "Warning ClaimInUse: claim cache outlived pod runner but is mounted by reader"
        ),
        "{events:?}"
    );
}

/// The cache holds no pod: a deletion decided on the cache is confirmed by a live list of the
/// namespace (empty) and sent with the claim's UID and resourceVersion as preconditions.
#[tokio::test]
async fn a_deletion_follows_a_live_list_of_the_namespace() {
    let (ctx, log) = context(Vec::new(), |sent| match listed(sent) {
        Some(_) => pod_list(Vec::new()),
        None => mock_api::deleted(),
    });
    ctx.pass(&claim()).await.expect("pass");
    assert_eq!(requests(&log), ["LIST *", "DELETE "]);
    let delete = &log.writes_and_reads()[1].body;
    assert_eq!(delete["preconditions"]["uid"], "uid-claim");
    assert_eq!(delete["preconditions"]["resourceVersion"], "5");
}

/// An old claim whose pod never showed, not yet seen waiting (annotated just now): its wait is
/// recorded on it, by a patch that tests its UID and resourceVersion, and it is not deleted; its
/// grace starts now. (Before the record, this pass deleted it: it was older than the grace.)
#[tokio::test]
async fn an_old_claim_not_seen_waiting_is_recorded_not_deleted() {
    let (ctx, log) = context(Vec::new(), |sent| match listed(sent) {
        Some(_) => pod_list(Vec::new()),
        None => (200, json!({})),
    });
    let before = Timestamp::now();
    ctx.pass(&unrecorded()).await.expect("pass");
    assert_eq!(requests(&log), ["PATCH "]);
    let sent = &log.writes_and_reads()[0];
    assert_eq!(sent.content_type, "application/json-patch+json");
    let ops = &sent.body;
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/metadata/uid", "value": "uid-claim"})
    );
    assert_eq!(
        ops[1],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "5"})
    );
    assert_eq!(ops[2]["op"], "add");
    assert_eq!(
        ops[2]["path"],
        "/metadata/annotations/statefulsets.kubernetes.io~1bound-to-pod-waiting-since"
    );
    let value = ops[2]["value"].as_str().unwrap_or_default();
    let (pod, since) = value.split_once('@').expect("<pod>@<time>");
    assert_eq!(pod, "runner");
    let since: Timestamp = since.parse().expect("a time");
    assert!(since.as_second() >= before.as_second(), "{value} is now");
}

/// The cache holds no pod, but the live list shows one that mounts the claim: no delete.
#[tokio::test]
async fn a_user_seen_only_live_stops_the_deletion() {
    let (ctx, log) = context(Vec::new(), |sent| match listed(sent) {
        Some(_) => pod_list(vec![pod("reader", "uid-reader", true)]),
        None => mock_api::deleted(),
    });
    ctx.pass(&claim()).await.expect("pass");
    assert_eq!(requests(&log), ["LIST *"]);
}

/// A refusal decided on the cache reads nothing: no request but its Warning.
#[tokio::test]
async fn a_refusal_reads_nothing() {
    let (ctx, log) = context(Vec::new(), |_| {
        mock_api::status(500, "", "no request expected")
    });
    let mut refused = claim();
    let annotations = refused.metadata.annotations.get_or_insert_default();
    annotations.insert("statefulsets.kubernetes.io/bound-to-pod".into(), " ".into());
    ctx.pass(&refused).await.expect("pass");
    assert!(requests(&log).is_empty(), "{:?}", requests(&log));
    let events = log.published();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("Warning PodBindingRefused"),
        "{events:?}"
    );
}
