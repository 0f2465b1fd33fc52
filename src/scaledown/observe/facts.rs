//! The facts themselves: plain data about one StatefulSet, its ordinals, claims and pods, as
//! `observe` builds them and `decide` reads them (tests write them down directly).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;

use crate::naming;

/// Everything `decide` may look at for one StatefulSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// The set's own facts.
    pub set: SetFacts,
    /// Every ordinal that has a claim of this set, a pod named after it, or a cleanup pod of it.
    pub ordinals: BTreeMap<u32, OrdinalFacts>,
    /// Cleanup pods in flight (not finished, not being deleted) across everything we watch.
    pub cleanups_in_flight: usize,
    /// Creations of a cleanup pod the API server refused, per ordinal (this process's memory).
    pub rejections: BTreeMap<u32, Rejection>,
    /// Ordinals whose claim the last live read of the namespace found not proven this set's
    /// (this process's memory): their cleanup pods are created only on a live read.
    pub disputed: BTreeSet<u32>,
    /// Where the set's facts come from: dangerous steps are only planned from a live read.
    pub read: SetRead,
    /// The time the pass decides at.
    pub now: Timestamp,
}

/// Whether `Observed::set` was read from the watch cache or from the API server just now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetRead {
    /// Everything from the watch caches.
    #[default]
    Cached,
    /// The set read from the API server just now; claims and pods from the caches.
    LiveSet,
    /// The set, and the claims and pods of its namespace, read from the API server just now.
    LiveAll,
}

/// The API server refused to create the cleanup pod of an ordinal (admission, quota, validation,
/// size, server error): how often in a row, the last time, and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Refusals in a row.
    pub count: u32,
    /// When the last one came.
    pub last: Timestamp,
    /// Its HTTP status code.
    pub code: u16,
    /// Its message.
    pub message: String,
}

/// What this controller recorded on the StatefulSet about the cleanup pod of one ordinal: the UID
/// of the pod it created and confirmed, and the claims (name -> UID) that pod was created for.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The UID of the cleanup pod.
    pub pod: String,
    /// The claims it was created for (name -> UID).
    #[serde(default)]
    pub claims: BTreeMap<String, String>,
}

/// A cleanup pod created (gated) in this pass, waiting for its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The ordinal it cleans up.
    pub ordinal: u32,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// Which attempt (1 for the first).
    pub attempt: u32,
    /// The claims it mounts (name -> UID).
    pub claims: BTreeMap<String, String>,
}

/// The record annotation is ours; anything larger than this was not written by us.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// Parses the record annotation. Anything malformed proves nothing, so it reads as no record.
pub fn parse_records(raw: Option<&str>) -> BTreeMap<u32, Record> {
    let Some(raw) = raw.filter(|r| r.len() <= MAX_RECORD_BYTES) else {
        return BTreeMap::new();
    };
    serde_json::from_str::<BTreeMap<String, Record>>(raw)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((naming::parse_ordinal(&k)?, v)))
        .collect()
}

/// The record annotation's value for `records`.
pub fn format_records(records: &BTreeMap<u32, Record>) -> String {
    let by_name: BTreeMap<String, &Record> =
        records.iter().map(|(k, v)| (k.to_string(), v)).collect();
    serde_json::to_string(&by_name).unwrap_or_else(|_| "{}".into())
}

/// Facts about the StatefulSet itself: identity, our annotations, its spec and status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetFacts {
    /// The set's namespace.
    pub namespace: String,
    /// The set's name.
    pub name: String,
    /// The set's UID.
    pub uid: String,
    /// The set's resourceVersion.
    pub resource_version: String,
    /// `metadata.generation`: changes with every spec change (the confirmation's compare-and-swap).
    pub generation: i64,
    /// The record annotation, raw (to compare-and-swap it) and parsed.
    pub record_raw: Option<String>,
    /// The record, parsed (ordinal -> record).
    pub records: BTreeMap<u32, Record>,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
    /// The set is being deleted.
    pub deleting: bool,
    /// Our deletion mark ([`naming::DELETION_ANNOTATION`]), raw.
    pub deletion_mark: Option<String>,
    /// The template annotation, when present and not blank.
    pub template: Option<String>,
    /// The names of its volumeClaimTemplates, in order.
    pub claim_templates: Vec<String>,
    /// `spec.selector`.
    pub selector: Option<LabelSelector>,
    /// `spec.selector.matchLabels`: the StatefulSet controller puts them on every claim it makes.
    pub match_labels: BTreeMap<String, String>,
    /// `spec.replicas`.
    pub replicas: u32,
    /// `spec.ordinals.start`.
    pub start: u32,
    /// `podManagementPolicy: Parallel`.
    pub parallel: bool,
    /// `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`.
    pub when_scaled_delete: bool,
    /// `persistentVolumeClaimRetentionPolicy.whenDeleted: Delete`.
    pub when_deleted_delete: bool,
    /// `status.observedGeneration`: the generation the StatefulSet controller last acted on.
    pub observed_generation: i64,
    /// `status.replicas`: the pods the StatefulSet controller counts, from its own pod cache.
    pub status_replicas: u32,
    /// The paused annotation is `"true"`: no new cleanup pod for this set.
    pub paused: bool,
    /// Our status annotations as last written (the status, and its reason).
    pub status: Option<String>,
    /// The reason annotation as last written.
    pub status_reason: Option<String>,
    /// The inherit annotation, raw (`decide` reads it with the flag).
    pub inherit: Option<String>,
    /// The scheduling fields of the set's pod template, as pod spec JSON
    /// (`template::inherit::scheduling_of`): what its cleanup pod inherits when the set inherits.
    /// The cache keeps them only for sets that inherit; for the others this is empty.
    pub scheduling: serde_json::Map<String, serde_json::Value>,
}

impl SetFacts {
    /// Whether the set carries our finalizer.
    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == naming::FINALIZER)
    }

    /// The ordinal `claim` is of this set by its name, for one of its claim templates.
    pub fn claim_ordinal(&self, claim: &str) -> Option<u32> {
        self.claim_templates
            .iter()
            .find_map(|t| naming::claim_ordinal(claim, t, &self.name))
    }

    /// Whether a claim template of this set gives a claim the name `claim`.
    pub fn makes_claim(&self, claim: &str) -> bool {
        self.claim_ordinal(claim).is_some()
    }

    /// Whether the set still runs a pod at `ordinal`.
    pub fn wants(&self, ordinal: u32) -> bool {
        !self.deleting && self.in_spec(ordinal)
    }

    /// Whether `ordinal` lies in `[start, start + replicas)`, deleted or not.
    pub fn in_spec(&self, ordinal: u32) -> bool {
        ordinal >= self.start
            && u64::from(ordinal) < u64::from(self.start) + u64::from(self.replicas)
    }
}

/// Facts about one ordinal of the set: its claims and its pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrdinalFacts {
    /// The claims of this ordinal that exist, in claim-template order.
    pub claims: Vec<ClaimFacts>,
    /// The pod named `<set>-<ordinal>`, if any.
    pub pod: Option<PodFacts>,
    /// When that pod's deletion began (`metadata.deletionTimestamp`), if it is being deleted.
    pub terminating_since: Option<Timestamp>,
}

/// Facts about one claim of an ordinal.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimFacts {
    /// The claim template it was made from.
    pub template: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The claim is being deleted.
    pub deleting: bool,
    /// Our retry bookkeeping: the attempt to create next, set before a failed pod is deleted.
    pub next_attempt: Option<u32>,
    /// Why the claim is not proven this set's (`None`: it is; see [`claim_ownership`]): another
    /// object owns it, it carries another set's labels, or another set could own it by name.
    pub not_ours: Option<String>,
    /// Pods other than this ordinal's cleanup pod that mount the claim and have not finished.
    pub used_by: Vec<String>,
}

impl ClaimFacts {
    /// A claim a new pod can mount and we may start a cleanup on.
    pub fn live(&self) -> bool {
        !self.deleting
    }
}

/// Facts about the pod named after an ordinal.
#[derive(Clone, Debug, PartialEq)]
pub struct PodFacts {
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// The pod is being deleted.
    pub deleting: bool,
    /// Whose pod it is.
    pub role: PodRole,
}

/// Whose pod a pod named after an ordinal is.
#[derive(Clone, Debug, PartialEq)]
pub enum PodRole {
    /// A pod of the StatefulSet (its controller ownerReference is this set).
    Stateful,
    /// A cleanup pod this controller created and confirmed: its UID is in the set's record.
    Cleanup(CleanupFacts),
    /// A pod that looks like a cleanup pod (our label or owner annotation) but whose UID is not in
    /// the record: forged, left by another controller, or created by us just before a crash and
    /// never confirmed. `gated`: it still carries our confirm gate, so it never ran. `created`: when
    /// (a fresh gated one may be another writer's, about to be recorded).
    Unproven {
        /// It still carries our confirm gate.
        gated: bool,
        /// When it was created.
        created: Option<Timestamp>,
    },
    /// Neither: somebody else's pod, or a stateful pod orphaned by `--cascade=orphan`.
    Foreign,
}

/// Facts about a cleanup pod of ours.
#[derive(Clone, Debug, PartialEq)]
pub struct CleanupFacts {
    /// The pod's phase.
    pub phase: Phase,
    /// Which attempt (1 for the first).
    pub attempt: u32,
    /// The claims the pod was created for (name -> UID), from our record on the set, never from
    /// the pod, whose annotations anyone who may edit pods can change.
    pub claims: BTreeMap<String, String>,
    /// It still carries our confirm gate (recorded but not yet released: a crash in between).
    pub gated: bool,
    /// How it failed, when it did.
    pub failure: Option<Failure>,
    /// When the pod was created (for the cleanup duration metric and the pending timeout).
    pub created: Option<Timestamp>,
    /// It was bound to a node (so it is past scheduling).
    pub scheduled: bool,
    /// The kubelet restarted a container of the pod after it failed (`restartPolicy: OnFailure`,
    /// the default): the pod stays Running and never reaches Failed, so this is the only sign of a
    /// failing cleanup script.
    pub restarts: Option<Restarts>,
}

/// Restarts of a cleanup pod's containers after a failure, from their statuses.
#[derive(Clone, Debug, PartialEq)]
pub struct Restarts {
    /// Restarts of all its containers (init containers included).
    pub count: u32,
    /// The container whose last run failed, and how (`lastState.terminated`).
    pub container: String,
    /// The reason of its last failed run.
    pub reason: String,
    /// The exit code of its last failed run.
    pub exit_code: i32,
}

/// A cleanup pod's `status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not running yet (gated, unscheduled, pulling).
    Pending,
    /// Running.
    Running,
    /// Every container exited 0.
    Succeeded,
    /// A container failed and is not restarted.
    Failed,
    /// No phase, or one we do not know.
    Unknown,
}

/// How a cleanup pod failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The pod's or the failed container's reason, e.g. `Error`, `DeadlineExceeded`.
    pub reason: String,
    /// The failed container's exit code.
    pub exit_code: Option<i32>,
    /// When it finished.
    pub finished_at: Option<Timestamp>,
    /// The failed container's termination message (`terminationMessagePath`, or the tail of its
    /// log under `terminationMessagePolicy: FallbackToLogsOnError`), as [`said`] shortens it.
    pub message: Option<String>,
}

/// At most this many characters of a container's termination message go into Events and the
/// status reason (an Event's note holds at most 1 KiB).
pub const MESSAGE_CHARS: usize = 300;

/// A termination message on one line (runs of whitespace as one space) and at most
/// [`MESSAGE_CHARS`] characters, its end kept (the last lines of a log say why it failed); `None`
/// when it is blank.
pub fn said(message: &str) -> Option<String> {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let count = line.chars().count();
    if count == 0 {
        return None;
    }
    if count <= MESSAGE_CHARS {
        return Some(line);
    }
    let tail: String = line.chars().skip(count - (MESSAGE_CHARS - 1)).collect();
    Some(format!("…{tail}"))
}
