//! The reporter shared by the three controllers: one outcome becomes the Event, the metric and the
//! log line together, so no controller can publish one without the others. Under `--dry-run` the
//! writes a controller would make are outcomes too (`DryRun`), reported the same way.
//!
//! Every outcome has a key that tells its occurrences apart (an ordinal, a claim's UID, the API's
//! answer). The key is the Event's `action`: kube's recorder folds Events of one object, reason and
//! action into one series, so distinct occurrences stay distinct series. An outcome whose object,
//! reason and key this process reported already is not reported again, as long as it is among the
//! [`MEMORY`] most recently reported ones ([`Recent`]: the least recently reported is forgotten
//! first, so a full memory never repeats what was just reported).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::naming::Controller;
use crate::reason::{Kind, Reason};

/// How many reported (object, reason, key) are remembered; beyond, the least recently reported
/// is forgotten.
const MEMORY: usize = 10_000;
/// Longest Event note and action (the API's limits are 1 kB and 128 characters).
const MAX_NOTE: usize = 1000;
const MAX_ACTION: usize = 128;

/// One thing a pass did or found, about one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// What happened.
    pub reason: Reason,
    /// The object the Event is on.
    pub regarding: ObjectReference,
    /// The object written, when it is not `regarding` (a cleanup pod, a claim).
    pub related: Option<ObjectReference>,
    /// The Event's note, the log line's message.
    pub note: String,
    /// Tells occurrences apart; the Event's action.
    pub key: String,
}

impl Outcome {
    /// An outcome keyed by its reason alone (one per object).
    pub fn new(reason: Reason, regarding: ObjectReference, note: String) -> Self {
        Outcome {
            reason,
            regarding,
            related: None,
            note,
            key: reason.as_str().to_string(),
        }
    }

    /// This outcome with its own key (occurrences of one reason on one object told apart).
    pub fn key(mut self, key: String) -> Self {
        self.key = key;
        self
    }

    /// This outcome with the object it wrote.
    pub fn related(mut self, related: ObjectReference) -> Self {
        self.related = Some(related);
        self
    }
}

/// Publishes the outcomes of one controller.
pub struct Reporter {
    controller: Controller,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    dry_run: bool,
    /// (object UID, reason, key) reported by this process, the most recent ones.
    reported: Mutex<Recent>,
}

/// What was reported, bounded: at most `capacity` entries, each the object's UID and a 64-bit hash
/// of the reason and key (a key may be a whole note). A repeat counts as a new report, so an
/// outcome reported on every pass stays remembered; when full, the least recently reported entry
/// is forgotten.
struct Recent {
    capacity: usize,
    /// Entry → when it was last reported (a counter).
    last: HashMap<(String, u64), u64>,
    /// The same entries by when they were last reported, oldest first.
    order: BTreeMap<u64, (String, u64)>,
    clock: u64,
}

impl Recent {
    fn new(capacity: usize) -> Self {
        Recent {
            capacity: capacity.max(1),
            last: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Whether `(uid, reason, key)` is not among the remembered ones; it is the most recent now.
    fn first(&mut self, uid: &str, reason: Reason, key: &str) -> bool {
        let mut hasher = DefaultHasher::new();
        (reason.as_str(), key).hash(&mut hasher);
        let entry = (uid.to_string(), hasher.finish());
        self.clock += 1;
        let new = match self.last.insert(entry.clone(), self.clock) {
            Some(before) => {
                self.order.remove(&before);
                false
            }
            None => true,
        };
        self.order.insert(self.clock, entry);
        while self.last.len() > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.last.remove(&oldest);
        }
        new
    }

    /// Forgets every entry of the object with `uid`.
    fn forget(&mut self, uid: &str) {
        self.last.retain(|(of, _), _| of != uid);
        self.order.retain(|_, (of, _)| of != uid);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.len()
    }
}

impl Reporter {
    /// A reporter for `controller`: Events through `client` under `identity`; under `dry_run` also the `DryRun` record.
    pub fn new(
        controller: Controller,
        client: Client,
        identity: kube::runtime::events::Reporter,
        metrics: Arc<Metrics>,
        dry_run: bool,
    ) -> Self {
        Reporter {
            controller,
            recorder: Recorder::new(client, identity),
            metrics,
            dry_run,
            reported: Mutex::new(Recent::new(MEMORY)),
        }
    }

    /// Whether writes are carried out (not `--dry-run`).
    pub fn writes(&self) -> bool {
        !self.dry_run
    }

    /// Under `--dry-run`, reports the write `what` (a phrase: "delete claim data-web-2") as a
    /// `DryRun` outcome on `regarding` and returns true: the caller skips the write. Returns false
    /// otherwise.
    pub async fn skipped(&self, regarding: &ObjectReference, what: &str) -> bool {
        if !self.dry_run {
            return false;
        }
        self.would(regarding, what).await;
        true
    }

    /// Reports the write `what` (a phrase: "delete claim data-web-2") that a dry run did not
    /// make, as a `DryRun` outcome on `regarding`: for a writer that knows itself whether it
    /// writes and hands its dry-run records to the pass's report stage.
    pub async fn would(&self, regarding: &ObjectReference, what: &str) {
        let note = format!("dry-run: would {what}");
        let outcome = Outcome::new(Reason::DryRun, regarding.clone(), note).key(what.into());
        self.report(outcome).await;
    }

    /// The Event, the metric and the log line of `outcome`, once per object, reason and key.
    pub async fn report(&self, outcome: Outcome) {
        if !self.first(&outcome) {
            return;
        }
        self.metrics.event(outcome.reason);
        self.log(&outcome);
        let event = Event {
            type_: match outcome.reason.kind() {
                Kind::Warning => EventType::Warning,
                Kind::Normal => EventType::Normal,
            },
            reason: outcome.reason.as_str().into(),
            note: Some(truncate(&outcome.note, MAX_NOTE)),
            action: truncate(&outcome.key, MAX_ACTION),
            secondary: outcome.related,
        };
        if let Err(e) = self.recorder.publish(&event, &outcome.regarding).await {
            let (kind, name) = described(&outcome.regarding);
            warn!(controller = self.controller.as_str(), kind, namespace = ?outcome.regarding.namespace, name, reason = %outcome.reason, error = %e, "could not publish event");
        }
    }

    /// Forgets what was reported about the object with `uid` (it was deleted).
    pub fn forget(&self, uid: &str) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        reported.forget(uid);
    }

    fn first(&self, outcome: &Outcome) -> bool {
        let uid = outcome.regarding.uid.as_deref().unwrap_or_default();
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        reported.first(uid, outcome.reason, &outcome.key)
    }

    fn log(&self, outcome: &Outcome) {
        let controller = self.controller.as_str();
        let (kind, name) = described(&outcome.regarding);
        let namespace = outcome.regarding.namespace.as_deref().unwrap_or("");
        let reason = outcome.reason.as_str();
        match outcome.reason.kind() {
            Kind::Warning => {
                warn!(
                    controller,
                    kind, namespace, name, reason, "{}", outcome.note
                )
            }
            Kind::Normal => {
                info!(
                    controller,
                    kind, namespace, name, reason, "{}", outcome.note
                )
            }
        }
    }
}

fn described(object: &ObjectReference) -> (&str, &str) {
    (
        object.kind.as_deref().unwrap_or(""),
        object.name.as_deref().unwrap_or(""),
    )
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock_api;

    fn reporter(dry_run: bool) -> (Reporter, Arc<Metrics>, mock_api::Log) {
        let (client, log) = mock_api::serve(|_| mock_api::status(500, "InternalError", "unused"));
        let metrics = Arc::new(Metrics::default());
        let identity = kube::runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        };
        let reporter = Reporter::new(
            Controller::PodBound,
            client,
            identity,
            metrics.clone(),
            dry_run,
        );
        (reporter, metrics, log)
    }

    fn claim(uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some("cache".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    fn count(metrics: &Metrics, reason: Reason) -> String {
        let start = format!("scaledown_events_total{{reason=\"{}\"}} ", reason.as_str());
        let text = metrics.encode();
        let line = text.lines().find(|l| l.starts_with(&start)).unwrap_or("");
        line.trim_start_matches(&start).to_string()
    }

    #[tokio::test]
    async fn an_outcome_is_one_event_one_count_once_per_object_reason_and_key() {
        let (reporter, metrics, log) = reporter(false);
        let refused = |uid: &str, note: &str| {
            Outcome::new(Reason::PodBindingRefused, claim(uid), note.into()).key(note.into())
        };
        reporter.report(refused("u1", "names no pod")).await;
        reporter.report(refused("u1", "names no pod")).await;
        reporter.report(refused("u1", "a StatefulSet's pod")).await;
        reporter.report(refused("u2", "names no pod")).await;
        let events = log.events();
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(
            events
                .iter()
                .all(|e| e.0 == "Warning" && e.1 == "PodBindingRefused")
        );
        assert_eq!(count(&metrics, Reason::PodBindingRefused), "3");
        let posted = &log.all()[0].body;
        assert_eq!(posted["action"], "names no pod", "the key is the action");
        assert_eq!(posted["regarding"]["uid"], "u1");
    }

    /// A full memory forgets the least recently reported outcome only: what was just reported (or
    /// repeated) is not reported again, and the memory never grows past its bound. (It was cleared
    /// when full, and then every outcome was reported again.)
    #[tokio::test]
    async fn a_full_memory_forgets_the_oldest_and_never_repeats_a_recent_event() {
        let (mut reporter, metrics, _) = reporter(false);
        reporter.reported = Mutex::new(Recent::new(3));
        let note = |n: usize| {
            let key = format!("note {n}");
            Outcome::new(Reason::ClaimInUse, claim("u1"), key.clone()).key(key)
        };
        // Each report is counted once with its Event (the recorder may fold a repeat into a series).
        let reported = || count(&metrics, Reason::ClaimInUse);
        for n in 0..3 {
            reporter.report(note(n)).await;
        }
        // Repeated: now the most recent, so "note 1" is the oldest.
        reporter.report(note(0)).await;
        reporter.report(note(3)).await; // full: forgets "note 1"
        assert_eq!(reported(), "4");
        for n in [3, 0, 2] {
            reporter.report(note(n)).await;
        }
        assert_eq!(reported(), "4", "a recent one was reported again");
        reporter.report(note(1)).await;
        assert_eq!(reported(), "5", "the forgotten one is new again");

        let mut recent = Recent::new(100);
        for n in 0..10_000 {
            recent.first(&format!("uid-{n}"), Reason::ClaimInUse, &"x".repeat(2_000));
            assert!(recent.len() <= 100 && recent.order.len() <= 100);
        }
        assert!(!recent.first("uid-9999", Reason::ClaimInUse, &"x".repeat(2_000)));
        assert!(recent.first("uid-0", Reason::ClaimInUse, &"x".repeat(2_000)));
        recent.forget("uid-0");
        assert_eq!((recent.len(), recent.order.len()), (99, 99));
    }

    #[tokio::test]
    async fn under_dry_run_a_write_is_a_dry_run_event_and_a_count() {
        let (reporter, metrics, log) = reporter(true);
        assert!(!reporter.writes());
        let what = "delete claim cache (pod runner is gone)";
        assert!(reporter.skipped(&claim("u1"), what).await);
        assert!(reporter.skipped(&claim("u1"), what).await, "still skipped");
        let events = log.events();
        assert_eq!(events.len(), 1, "reported once: {events:?}");
        assert_eq!(events[0].1, "DryRun");
        assert_eq!(events[0].2, format!("dry-run: would {what}"));
        assert_eq!(count(&metrics, Reason::DryRun), "1");
    }

    #[tokio::test]
    async fn without_dry_run_nothing_is_skipped_or_sent() {
        let (reporter, metrics, log) = reporter(false);
        assert!(reporter.writes());
        assert!(!reporter.skipped(&claim("u1"), "delete claim cache").await);
        assert!(log.all().is_empty());
        assert_eq!(count(&metrics, Reason::DryRun), "0");
    }

    #[tokio::test]
    async fn long_notes_and_keys_are_cut_to_the_api_limits() {
        let (reporter, _, log) = reporter(false);
        let long = "é".repeat(700);
        let outcome = Outcome::new(Reason::ClaimInUse, claim("u1"), long.clone()).key(long);
        reporter.report(outcome).await;
        let body = &log.all()[0].body;
        assert!(body["note"].as_str().unwrap_or_default().len() <= MAX_NOTE);
        assert!(body["action"].as_str().unwrap_or_default().len() <= MAX_ACTION);
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("abcdef", 4), "abcd");
        assert_eq!(truncate("ab", 4), "ab");
        // "é" is two bytes: a cut inside it falls back to the character's start.
        assert_eq!(truncate("aéb", 2), "a");
    }
}
