//! A watch that keeps everything it saw, so a test can assert on a whole window ("claim X was never
//! deleted", "no cleanup pod was ever scheduled") instead of sleeping and looking once at the end.
//!
//! [`Recorder::start`] runs a kube watcher in a task and returns once the initial list is in; every
//! later change is appended in the order the API server sent it, with the time it arrived. An
//! object that disappears while the watch relists (after a 410 Gone) is recorded as
//! [`SeenKind::Vanished`], so no deletion goes unrecorded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::{WatchStreamExt, watcher::Config};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use statefulset_scaledown_controller::resuming::WatchBackoff;

const POLL: Duration = Duration::from_millis(50);

/// The annotation [`Recorder::close_window`] sets.
pub const WINDOW_MARK: &str = "e2e.scaledown.io/window-closed";

/// How a change reached us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeenKind {
    /// Listed when the watch (re)started.
    Listed,
    /// Added or modified.
    Applied,
    /// Deleted (the object's last state).
    Deleted,
    /// Gone when the watch relisted: deleted while the watch was down (last state we saw).
    Vanished,
}

/// One recorded change of one object.
#[derive(Clone, Debug)]
pub struct Seen<K> {
    pub kind: SeenKind,
    pub name: String,
    pub uid: String,
    /// `metadata.resourceVersion` as a number (0 if it is not one). All objects of this test
    /// cluster live in one etcd, so these numbers order changes across kinds as well.
    pub resource_version: u64,
    /// `metadata.deletionTimestamp` is set, or the object is gone.
    pub deleting: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// When the change arrived, and how long after the recorder started.
    pub at: Instant,
    pub since_start: Duration,
    pub object: Arc<K>,
}

impl<K> Seen<K> {
    /// The object is gone (deleted, or vanished during a relist).
    pub fn gone(&self) -> bool {
        matches!(self.kind, SeenKind::Deleted | SeenKind::Vanished)
    }
}

struct Log<K> {
    seen: Vec<Seen<K>>,
    errors: Vec<String>,
    /// Objects present after the last change, by UID (for relists).
    present: HashMap<String, Arc<K>>,
    /// UIDs listed since the current relist began.
    relisting: Option<HashSet<String>>,
    synced: bool,
}

/// Everything one watch saw since it started. The watch stops when the recorder is dropped.
pub struct Recorder<K> {
    log: Arc<Mutex<Log<K>>>,
    task: tokio::task::JoinHandle<()>,
    what: String,
    started: Instant,
}

impl<K> Drop for Recorder<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Recorder<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Starts watching `api` with `config` and returns once the initial list is recorded.
    pub async fn start(api: Api<K>, config: Config) -> Recorder<K> {
        let what = format!("{} watch", K::kind(&K::DynamicType::default()));
        let log = Arc::new(Mutex::new(Log {
            seen: Vec::new(),
            errors: Vec::new(),
            present: HashMap::new(),
            relisting: None,
            synced: false,
        }));
        let started = Instant::now();
        let sink = log.clone();
        let task = tokio::spawn(async move {
            // The controller's own short backoff: after an API server restart the recorder is back
            // within about 2 s, so the times it records are not its own recovery.
            let mut stream = watcher::watcher(api, config)
                .backoff(WatchBackoff::default())
                .boxed();
            while let Some(item) = stream.next().await {
                let mut log = sink.lock().unwrap_or_else(|p| p.into_inner());
                match item {
                    Ok(event) => log.apply(event, started),
                    Err(e) => log.errors.push(e.to_string()),
                }
            }
        });
        let recorder = Recorder {
            log,
            task,
            what,
            started,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !recorder.lock().synced {
            assert!(
                Instant::now() < deadline,
                "e2e: the {} did not list within 60 s; errors: {:?}",
                recorder.what,
                recorder.lock().errors
            );
            tokio::time::sleep(POLL).await;
        }
        recorder
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log<K>> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the recorder started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Everything seen so far, in order.
    pub fn seen(&self) -> Vec<Seen<K>> {
        self.lock().seen.clone()
    }

    /// How many changes have been seen so far (a mark for [`Recorder::since`]).
    pub fn mark(&self) -> usize {
        self.lock().seen.len()
    }

    /// The changes seen after `mark`.
    pub fn since(&self, mark: usize) -> Vec<Seen<K>> {
        self.lock().seen.get(mark..).unwrap_or_default().to_vec()
    }

    /// The changes that match `pred`, in order.
    pub fn matching(&self, pred: impl Fn(&Seen<K>) -> bool) -> Vec<Seen<K>> {
        self.lock()
            .seen
            .iter()
            .filter(|s| pred(s))
            .cloned()
            .collect()
    }

    /// The first change that matches `pred`.
    pub fn first(&self, pred: impl Fn(&Seen<K>) -> bool) -> Option<Seen<K>> {
        self.lock().seen.iter().find(|s| pred(s)).cloned()
    }

    /// Every change of objects named `name`, in order.
    pub fn of(&self, name: &str) -> Vec<Seen<K>> {
        self.matching(|s| s.name == name)
    }

    /// The UIDs seen under `name`, in the order they first appeared.
    pub fn uids_of(&self, name: &str) -> Vec<String> {
        let mut uids: Vec<String> = Vec::new();
        for s in self.of(name) {
            if !uids.contains(&s.uid) {
                uids.push(s.uid);
            }
        }
        uids
    }

    /// The first sign that the object with `uid` is being deleted or is gone.
    pub fn deletion_of(&self, uid: &str) -> Option<Seen<K>> {
        self.first(|s| s.uid == uid && s.deleting)
    }

    /// Errors of the watch stream so far (it recovers from them on its own).
    pub fn errors(&self) -> Vec<String> {
        self.lock().errors.clone()
    }

    /// Waits until some change, recorded before or during the wait, matches `pred`; returns the
    /// first. `pred` must not query this recorder (its lock is held): see
    /// [`Recorder::wait_until_record`].
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Seen<K>) -> bool,
    ) -> Seen<K> {
        self.wait_for_since(0, what, timeout, pred).await
    }

    /// Like [`Recorder::wait_for`], for changes recorded after `mark`.
    pub async fn wait_for_since(
        &self,
        mark: usize,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Seen<K>) -> bool,
    ) -> Seen<K> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self
                .lock()
                .seen
                .get(mark..)
                .unwrap_or_default()
                .iter()
                .find(|s| pred(s))
            {
                return s.clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "e2e: timed out after {timeout:?} waiting for {what} ({} saw {} changes; watch errors: {:?})",
                    self.what,
                    self.mark(),
                    self.errors()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Closes a window with a positive marker: annotates object `name` through `api` with a fresh
    /// value and waits until this watch delivers that change. A watch delivers changes in the
    /// order of their resource versions, so everything that happened to the watched objects
    /// before the marker is recorded by then: an absence asserted over the changes before the
    /// returned one is an absence in the cluster, not a watch that lags.
    pub async fn close_window(&self, api: &Api<K>, name: &str) -> Seen<K> {
        let value = format!("{}", self.started.elapsed().as_nanos());
        let patch = serde_json::json!({"metadata": {"annotations": {WINDOW_MARK: value}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("e2e: annotate {name} to close the window: {e}"));
        let what = format!("the window marker on {name}");
        self.wait_for(&what, Duration::from_secs(60), |s| {
            s.name == name && s.annotations.get(WINDOW_MARK) == Some(&value)
        })
        .await
    }

    /// Waits until `check` (which may query this recorder) holds; panics with `what` after
    /// `timeout`. For conditions over the whole record, such as a count.
    pub async fn wait_until_record(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Self) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !check(self) {
            if Instant::now() >= deadline {
                panic!(
                    "e2e: timed out after {timeout:?} waiting for {what} ({} saw {} changes; watch errors: {:?})",
                    self.what,
                    self.mark(),
                    self.errors()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `pred` matches or `timeout` passes; returns the first match, if any. For
    /// windows that end either way ("until the warning appears or the claim is deleted").
    pub async fn wait_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&Seen<K>) -> bool,
    ) -> Option<Seen<K>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.first(&pred) {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl<K> Log<K>
where
    K: Resource + Clone,
{
    fn apply(&mut self, event: WatchEvent<K>, started: Instant) {
        match event {
            WatchEvent::Init => self.relisting = Some(HashSet::new()),
            WatchEvent::InitApply(obj) => {
                if let Some(listed) = self.relisting.as_mut() {
                    listed.insert(obj.uid().unwrap_or_default());
                }
                self.push(SeenKind::Listed, Arc::new(obj), started);
            }
            WatchEvent::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                let vanished: Vec<Arc<K>> = self
                    .present
                    .iter()
                    .filter(|(uid, _)| !listed.contains(*uid))
                    .map(|(_, obj)| obj.clone())
                    .collect();
                for obj in vanished {
                    self.push(SeenKind::Vanished, obj, started);
                }
                self.synced = true;
            }
            WatchEvent::Apply(obj) => self.push(SeenKind::Applied, Arc::new(obj), started),
            WatchEvent::Delete(obj) => self.push(SeenKind::Deleted, Arc::new(obj), started),
        }
    }

    fn push(&mut self, kind: SeenKind, object: Arc<K>, started: Instant) {
        let uid = object.uid().unwrap_or_default();
        let gone = matches!(kind, SeenKind::Deleted | SeenKind::Vanished);
        if gone {
            self.present.remove(&uid);
        } else {
            self.present.insert(uid.clone(), object.clone());
        }
        let now = Instant::now();
        self.seen.push(Seen {
            kind,
            name: object.name_any(),
            uid,
            resource_version: object
                .resource_version()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            deleting: gone || object.meta().deletion_timestamp.is_some(),
            labels: object.labels().clone(),
            annotations: object.annotations().clone(),
            at: now,
            since_start: now.duration_since(started),
            object,
        });
    }
}

// === pods ===

/// A pod's phase ("Pending", "Running", ...), or "" before it has one.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The node a pod was scheduled to.
pub fn node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The names of a pod's scheduling gates.
pub fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

/// A pod that was scheduled (has a node) or got a phase past Pending: it ran, or could have.
pub fn ran(pod: &Pod) -> bool {
    node(pod).is_some() || matches!(phase(pod), "Running" | "Succeeded" | "Failed")
}

// === events.k8s.io/v1 Events ===

/// `reportingController` of the controller under test.
pub const REPORTING_CONTROLLER: &str = "statefulset-scaledown-controller";

/// Whether the controller under test published this Event (the StatefulSet controller reports
/// `SuccessfulCreate` and `SuccessfulDelete` too).
pub fn ours(e: &Event) -> bool {
    e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
}

/// Events are one object per series; these helpers look at the latest state of each.
pub fn event_reason(e: &Event) -> &str {
    e.reason.as_deref().unwrap_or("")
}

pub fn event_note(e: &Event) -> &str {
    e.note.as_deref().unwrap_or("")
}

/// The name of the object the Event is about.
pub fn event_regarding(e: &Event) -> &str {
    e.regarding
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .unwrap_or("")
}

impl Recorder<Event> {
    /// The latest state of every Event object (series) of ours seen, in order of first appearance.
    pub fn latest_events(&self) -> Vec<Arc<Event>> {
        let mut order: Vec<String> = Vec::new();
        let mut latest: HashMap<String, Arc<Event>> = HashMap::new();
        for s in self
            .seen()
            .into_iter()
            .filter(|s| !s.gone() && ours(&s.object))
        {
            if !latest.contains_key(&s.uid) {
                order.push(s.uid.clone());
            }
            latest.insert(s.uid.clone(), s.object.clone());
        }
        order.iter().filter_map(|u| latest.remove(u)).collect()
    }

    /// The Events (latest state of each) about object `regarding` with `reason`.
    pub fn events(&self, regarding: &str, reason: &str) -> Vec<Arc<Event>> {
        self.latest_events()
            .into_iter()
            .filter(|e| event_regarding(e) == regarding && event_reason(e) == reason)
            .collect()
    }

    /// Waits for an Event of ours about `regarding` with `reason` (and returns it).
    pub async fn wait_event(&self, regarding: &str, reason: &str, timeout: Duration) -> Arc<Event> {
        let what = format!("Event {reason} about {regarding}");
        self.wait_for(&what, timeout, |s| {
            ours(&s.object)
                && event_regarding(&s.object) == regarding
                && event_reason(&s.object) == reason
        })
        .await
        .object
    }

    /// One line per Event series, for failure messages.
    pub fn describe(&self) -> String {
        self.latest_events()
            .iter()
            .map(|e| {
                format!(
                    "{} {} {} x{}: {}",
                    event_regarding(e),
                    e.type_.as_deref().unwrap_or(""),
                    event_reason(e),
                    e.series.as_ref().map_or(1, |s| s.count),
                    event_note(e)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
