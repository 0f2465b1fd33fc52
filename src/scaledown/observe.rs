//! OBSERVE: plain facts about one StatefulSet, its claims and the pods named after its ordinals.
//!
//! The facts are built from whatever objects the caller has (the watch caches, or a live read from
//! the API server before a dangerous step), so `decide` never sees a Kubernetes client and tests can
//! write facts down directly. No IO here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::{Resource, ResourceExt};

use crate::naming;

mod facts;
mod ownership;
pub use facts::*;
pub use ownership::claim_ownership;

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
    /// The ordinals the names of `claims` and `pods` give as the set's, worked out where they
    /// were gathered (`watch::ordinals`): a name not in it is no claim or pod of an ordinal.
    pub ordinals: &'a naming::Ordinals,
    /// Cleanup pods in flight across everything watched.
    pub cleanups_in_flight: usize,
    /// Refused creations per ordinal (this process's memory).
    pub rejections: BTreeMap<u32, Rejection>,
    /// Ordinals a live read of the namespace found disputed (this process's memory).
    pub disputed: BTreeSet<u32>,
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
        let Some(fits) = sources.ordinals.claims.get(claim.name_any().as_str()) else {
            continue;
        };
        for (ordinal, facts) in claim_facts(claim, fits, &facts, &others, &users) {
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
        let Some(&ordinal) = sources.ordinals.pods.get(&name) else {
            continue;
        };
        // The cleanup-pod cache and the pod cache lag differently: its whole copy describes this
        // pod only if it is the same object (a pod of the set may hold the name by now).
        let detailed = full
            .get(name.as_str())
            .copied()
            .filter(|d| d.uid() == pod.uid())
            .unwrap_or(pod);
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
        disputed: sources.disputed.clone(),
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

/// The facts of one claim for every claim template of `set` whose name it fits (`fits`: the
/// template and the ordinal of each).
fn claim_facts(
    claim: &PartialObjectMeta<PersistentVolumeClaim>,
    fits: &[(String, u32)],
    set: &SetFacts,
    others: &[SetFacts],
    users: &BTreeMap<&str, Vec<String>>,
) -> Vec<(u32, ClaimFacts)> {
    let name = claim.name_any();
    let not_ours = claim_ownership(claim, set, others);
    fits.iter()
        .map(|(template, ordinal)| {
            (
                *ordinal,
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
            )
        })
        .collect()
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
