//! OBSERVE: plain facts about one StatefulSet, its claims and the pods named after its ordinals.
//!
//! The facts are built from whatever objects the caller has (the watch caches, or a live read from
//! the API server before a dangerous step), so `decide` never sees a Kubernetes client and tests can
//! write facts down directly. No IO here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::{Resource, ResourceExt};

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

/// Objects to observe one StatefulSet from: the caches, or objects read live from the API server.
pub struct Sources<'a> {
    /// StatefulSets of the namespace (for claim names that fit two sets).
    pub sets: &'a [Arc<StatefulSet>],
    /// Claims of the namespace (metadata).
    pub claims: &'a [Arc<PartialObjectMeta<PersistentVolumeClaim>>],
    /// Pods, pruned to what we read (see `caches::prune_pod`): names, owners, claim volumes, phase.
    pub pods: &'a [Arc<Pod>],
    /// Full cleanup pods (label `scaledown-pod`), for their failure details.
    pub cleanup_pods: &'a [Arc<Pod>],
    /// Cleanup pods in flight across everything watched.
    pub cleanups_in_flight: usize,
    /// Refused creations per ordinal (this process's memory).
    pub rejections: BTreeMap<u32, Rejection>,
    /// Where the set's facts come from.
    pub read: SetRead,
    /// The time the pass decides at.
    pub now: Timestamp,
}

/// Facts about `set` from `sources`. Objects of other namespaces in `sources` are ignored.
pub fn observe(set: &StatefulSet, sources: &Sources<'_>) -> Observed {
    let facts = set_facts(set);
    let ns = facts.namespace.as_str();
    let in_ns = |meta: &kube::core::ObjectMeta| meta.namespace.as_deref() == Some(ns);
    let others: Vec<SetFacts> = sources
        .sets
        .iter()
        .filter(|s| in_ns(s.meta()) && s.name_any() != facts.name)
        .map(|s| set_facts(s))
        .collect();
    let pods: Vec<&Pod> = sources
        .pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| in_ns(p.meta()))
        .collect();
    let users = claim_users(&pods);

    let mut ordinals: BTreeMap<u32, OrdinalFacts> = BTreeMap::new();
    for claim in sources.claims.iter().filter(|c| in_ns(c.meta())) {
        for (ordinal, facts) in claim_facts(claim, &facts, &others, &users) {
            ordinals.entry(ordinal).or_default().claims.push(facts);
        }
    }
    for entry in ordinals.values_mut() {
        entry
            .claims
            .sort_by_key(|c| facts.claim_templates.iter().position(|t| *t == c.template));
    }

    let full: BTreeMap<&str, &Pod> = sources
        .cleanup_pods
        .iter()
        .filter(|p| in_ns(p.meta()))
        .filter_map(|p| Some((p.metadata.name.as_deref()?, p.as_ref())))
        .collect();
    for pod in pods {
        let name = pod.name_any();
        let Some(ordinal) = naming::pod_ordinal(&name, &facts.name) else {
            continue;
        };
        let detailed = full.get(name.as_str()).copied().unwrap_or(pod);
        let role = pod_role(detailed, ordinal, &facts);
        if let PodRole::Cleanup(_) = role {
            // The cleanup pod itself does not keep its claims from being deleted.
            for claim in ordinals.entry(ordinal).or_default().claims.iter_mut() {
                claim.used_by.retain(|p| *p != name);
            }
        }
        let entry = ordinals.entry(ordinal).or_default();
        entry.terminating_since = pod.meta().deletion_timestamp.as_ref().map(|t| t.0);
        entry.pod = Some(PodFacts {
            uid: pod.uid().unwrap_or_default(),
            deleting: pod.meta().deletion_timestamp.is_some(),
            name,
            role,
        });
    }

    Observed {
        set: facts,
        ordinals,
        cleanups_in_flight: sources.cleanups_in_flight,
        rejections: sources.rejections.clone(),
        read: sources.read,
        now: sources.now,
    }
}

impl Observed {
    /// `name: role` of every pod named after an ordinal, for logs.
    pub fn pod_roles(&self) -> Vec<String> {
        self.ordinals
            .values()
            .filter_map(|o| o.pod.as_ref())
            .map(|p| {
                let role = match &p.role {
                    PodRole::Stateful => "stateful",
                    PodRole::Cleanup(_) => "cleanup",
                    PodRole::Unproven { .. } => "unproven",
                    PodRole::Foreign => "foreign",
                };
                format!("{}({}): {role}", p.name, p.uid)
            })
            .collect()
    }
}

/// Claim name -> pods that mount it and have not finished.
fn claim_users<'a>(pods: &[&'a Pod]) -> BTreeMap<&'a str, Vec<String>> {
    let mut users: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !finished(p)) {
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            if let Some(claim) = &volume.persistent_volume_claim {
                users
                    .entry(claim.claim_name.as_str())
                    .or_default()
                    .push(pod.name_any());
            }
        }
    }
    users
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The facts of one claim for every claim template of `set` whose name it fits.
fn claim_facts(
    claim: &PartialObjectMeta<PersistentVolumeClaim>,
    set: &SetFacts,
    others: &[SetFacts],
    users: &BTreeMap<&str, Vec<String>>,
) -> Vec<(u32, ClaimFacts)> {
    let name = claim.name_any();
    let not_ours = claim_ownership(claim, set, others);
    set.claim_templates
        .iter()
        .filter_map(|template| {
            let ordinal = naming::claim_ordinal(&name, template, &set.name)?;
            Some((
                ordinal,
                ClaimFacts {
                    template: template.clone(),
                    name: name.clone(),
                    uid: claim.uid().unwrap_or_default(),
                    deleting: claim.meta().deletion_timestamp.is_some(),
                    next_attempt: claim
                        .annotations()
                        .get(naming::NEXT_ATTEMPT_ANNOTATION)
                        .and_then(|v| v.parse().ok()),
                    not_ours: not_ours.clone(),
                    used_by: users.get(name.as_str()).cloned().unwrap_or_default(),
                },
            ))
        })
        .collect()
}

/// Whether a claim whose name fits `set` is proven `set`'s, and if not, why (docs/usage.md,
/// *Whose claim it is*). A name proves nothing on its own: the StatefulSet controller puts the set's
/// `selector.matchLabels` on every claim it creates, so a claim is `set`'s when
/// - no ownerReference names another object than `set`, and
/// - no other set of the namespace still wants the ordinal its name gives for that set, and
/// - it carries `set`'s matchLabels and no other set that could own it by name has its matchLabels
///   on it too, or it carries no labels at all (made by hand) and no other set could own it by
///   name. Labels that are not `set`'s prove it another set's, even of a set deleted since.
///
/// `others` are the other sets of the namespace that could own the claim by name or whose
/// matchLabels it carries (`scaledown::watch::Stores::slice` gathers them).
pub fn claim_ownership(
    claim: &PartialObjectMeta<PersistentVolumeClaim>,
    set: &SetFacts,
    others: &[SetFacts],
) -> Option<String> {
    let name = claim.name_any();
    if let Some(owner) = claim.owner_references().iter().find(|o| o.uid != set.uid) {
        return Some(format!("it is owned by {} {}", owner.kind, owner.name));
    }
    let by_name: Vec<&SetFacts> = others
        .iter()
        .filter(|o| o.name != set.name && o.makes_claim(&name))
        .collect();
    if let Some(other) = by_name
        .iter()
        .find(|o| o.claim_ordinal(&name).is_some_and(|n| o.wants(n)))
    {
        return Some(format!(
            "it is also a claim of StatefulSet {}, which still uses that ordinal",
            other.name
        ));
    }
    let labels = claim.labels();
    let carries = |s: &SetFacts| {
        !s.match_labels.is_empty()
            && s.match_labels
                .iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    };
    if carries(set) {
        return by_name.iter().find(|o| carries(o)).map(|o| {
            format!(
                "it carries the selector labels of this set and of StatefulSet {}, whose claims have the same name",
                o.name
            )
        });
    }
    if let Some(other) = others.iter().find(|o| o.name != set.name && carries(o)) {
        return Some(format!(
            "it carries the selector labels of StatefulSet {}, not this set's",
            other.name
        ));
    }
    // Every claim a StatefulSet made carries that set's labels; one deleted since is no longer
    // among `others`, so labels that are not this set's prove the claim someone else's.
    if !labels.is_empty() {
        return Some(format!(
            "it carries labels ({}) but not this set's selector labels ({}): another StatefulSet's claim, maybe of one deleted since (add this set's labels to it if it is this set's)",
            pairs(labels.iter()),
            pairs(set.match_labels.iter())
        ));
    }
    by_name.first().map(|o| {
        format!(
            "StatefulSet {} makes a claim of the same name and the claim carries neither set's selector labels",
            o.name
        )
    })
}

/// `k=v` pairs, comma separated.
fn pairs<'a>(labels: impl Iterator<Item = (&'a String, &'a String)>) -> String {
    labels
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The facts of a StatefulSet object on its own.
pub fn set_facts(set: &StatefulSet) -> SetFacts {
    let meta = set.meta();
    let spec = set.spec.as_ref();
    let retention = spec.and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let non_negative = |v: Option<i32>, default: u32| v.map_or(default, |v| v.max(0) as u32);
    let record_raw = set.annotations().get(naming::RECORD_ANNOTATION).cloned();
    SetFacts {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        uid: set.uid().unwrap_or_default(),
        resource_version: set.resource_version().unwrap_or_default(),
        generation: meta.generation.unwrap_or_default(),
        records: parse_records(record_raw.as_deref()),
        record_raw,
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        deletion_mark: set.annotations().get(naming::DELETION_ANNOTATION).cloned(),
        template: set
            .annotations()
            .get(naming::TEMPLATE_ANNOTATION)
            .filter(|t| !t.trim().is_empty())
            .cloned(),
        claim_templates: spec
            .and_then(|s| s.volume_claim_templates.as_ref())
            .map(|ts| ts.iter().filter_map(|t| t.metadata.name.clone()).collect())
            .unwrap_or_default(),
        match_labels: spec
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default(),
        selector: spec.map(|s| s.selector.clone()),
        replicas: non_negative(spec.and_then(|s| s.replicas), 1),
        start: non_negative(spec.and_then(|s| s.ordinals.as_ref()?.start), 0),
        parallel: spec.and_then(|s| s.pod_management_policy.as_deref()) == Some("Parallel"),
        when_scaled_delete: retention.and_then(|r| r.when_scaled.as_deref()) == Some("Delete"),
        when_deleted_delete: retention.and_then(|r| r.when_deleted.as_deref()) == Some("Delete"),
        observed_generation: set
            .status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .unwrap_or_default(),
        status_replicas: non_negative(set.status.as_ref().map(|s| s.replicas), 0),
        paused: set
            .annotations()
            .get(naming::PAUSED_ANNOTATION)
            .is_some_and(|v| v == "true"),
        status: set.annotations().get(naming::STATUS_ANNOTATION).cloned(),
        status_reason: set
            .annotations()
            .get(naming::STATUS_REASON_ANNOTATION)
            .cloned(),
        inherit: set.annotations().get(naming::INHERIT_ANNOTATION).cloned(),
        scheduling: spec
            .and_then(|s| s.template.spec.as_ref())
            .map(crate::template::inherit::scheduling_of)
            .unwrap_or_default(),
    }
}

/// What a pod named after `ordinal` of `set` is. Only the record on the set makes a cleanup pod.
fn pod_role(pod: &Pod, ordinal: u32, set: &SetFacts) -> PodRole {
    let uid = pod.uid().unwrap_or_default();
    if let Some(record) = set
        .records
        .get(&ordinal)
        .filter(|r| !uid.is_empty() && r.pod == uid)
    {
        return PodRole::Cleanup(cleanup_facts(pod, record));
    }
    if looks_like_cleanup(pod) {
        return PodRole::Unproven {
            gated: has_confirm_gate(pod),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        };
    }
    let owned = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "StatefulSet" && o.uid == set.uid);
    if owned {
        PodRole::Stateful
    } else {
        PodRole::Foreign
    }
}

/// Our label or our owner annotation: what a cleanup pod looks like (and anyone can copy).
pub fn looks_like_cleanup(pod: &Pod) -> bool {
    pod.labels().contains_key(naming::CLEANUP_LABEL)
        || pod
            .annotations()
            .get(naming::OWNER_ANNOTATION)
            .is_some_and(|v| !v.is_empty())
}

/// Whether `pod` still carries our confirm gate ([`naming::CONFIRM_GATE`]).
pub fn has_confirm_gate(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.scheduling_gates.iter().flatten())
        .any(|g| g.name == naming::CONFIRM_GATE)
}

/// The cleanup facts of a recorded cleanup pod.
pub fn cleanup_facts(pod: &Pod, record: &Record) -> CleanupFacts {
    let status = pod.status.as_ref();
    let phase = phase_of(pod);
    let failure = (phase == Phase::Failed).then(|| failure_of(pod));
    CleanupFacts {
        phase,
        attempt: pod
            .annotations()
            .get(naming::ATTEMPT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .filter(|a| *a >= 1)
            .unwrap_or(1),
        claims: record.claims.clone(),
        gated: has_confirm_gate(pod),
        failure,
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        scheduled: pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
            || status.is_some_and(|s| s.start_time.is_some()),
        restarts: restarts_of(pod),
    }
}

/// The restarts of `pod`'s containers, if one of them was restarted after a non-zero exit.
pub fn restarts_of(pod: &Pod) -> Option<Restarts> {
    let status = pod.status.as_ref()?;
    let containers: Vec<_> = status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
        .collect();
    let count = containers
        .iter()
        .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
        .sum::<u32>();
    let (container, last) = containers.iter().find_map(|c| {
        let t = c.last_state.as_ref()?.terminated.as_ref()?;
        (c.restart_count > 0 && t.exit_code != 0).then_some((c.name.clone(), t))
    })?;
    Some(Restarts {
        count,
        container,
        reason: last.reason.clone().unwrap_or_else(|| "Error".into()),
        exit_code: last.exit_code,
    })
}

fn phase_of(pod: &Pod) -> Phase {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => Phase::Pending,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some(_) => Phase::Unknown,
    }
}

fn failure_of(pod: &Pod) -> Failure {
    let status = pod.status.as_ref();
    let terminated: Vec<_> = status
        .into_iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .collect();
    let failed = terminated.iter().find(|t| t.exit_code != 0);
    let reason = status
        .and_then(|s| s.reason.clone())
        .or_else(|| failed.and_then(|t| t.reason.clone()))
        .unwrap_or_else(|| "Failed".into());
    let finished_at = terminated
        .iter()
        .filter_map(|t| t.finished_at.as_ref().map(|t| t.0))
        .chain(
            status
                .into_iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0)),
        )
        .max()
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0));
    Failure {
        reason,
        exit_code: failed.map(|t| t.exit_code),
        finished_at,
        message: failed.and_then(|t| t.message.as_deref()).and_then(said),
    }
}

/// Whether a pod that looks like a cleanup pod counts against `--max-concurrent-cleanups`.
pub fn in_flight(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && looks_like_cleanup(pod)
        && matches!(
            phase_of(pod),
            Phase::Pending | Phase::Running | Phase::Unknown
        )
}

/// Time left until `deadline`, zero when it has passed.
pub fn until(now: Timestamp, deadline: Timestamp) -> Duration {
    deadline
        .duration_since(now)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Per namespace, the claims of StatefulSets *without* the cleanup annotation whose ordinal the set
/// no longer wants: data left behind that nobody opted in to clean.
pub fn unmanaged_orphans(
    sets: &[std::sync::Arc<StatefulSet>],
    claims: &[std::sync::Arc<PartialObjectMeta<PersistentVolumeClaim>>],
) -> BTreeMap<String, usize> {
    let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for claim in claims
        .iter()
        .filter(|c| c.meta().deletion_timestamp.is_none())
    {
        if let (Some(ns), Some(name)) = (
            claim.meta().namespace.as_deref(),
            claim.meta().name.as_deref(),
        ) {
            by_namespace.entry(ns).or_default().push(name);
        }
    }
    let mut counts = BTreeMap::new();
    for set in sets
        .iter()
        .map(|s| set_facts(s))
        .filter(|s| s.template.is_none())
    {
        let names = by_namespace
            .get(set.namespace.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let orphans = names
            .iter()
            .filter(|name| {
                set.claim_templates.iter().any(|t| {
                    naming::claim_ordinal(name, t, &set.name).is_some_and(|n| !set.wants(n))
                })
            })
            .count();
        if orphans > 0 {
            *counts.entry(set.namespace.clone()).or_insert(0) += orphans;
        }
    }
    counts
}

#[cfg(test)]
mod tests;
