//! OBSERVE: plain facts about one StatefulSet, its claims and the pods named after its ordinals.
//!
//! The facts are built from whatever objects the caller has (the watch caches, or a live read from
//! the API server before a dangerous step), so `decide` never sees a Kubernetes client and tests can
//! write facts down directly. No IO here.

use std::collections::BTreeMap;
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
    pub set: SetFacts,
    /// Every ordinal that has a claim of this set, a pod named after it, or a cleanup pod of it.
    pub ordinals: BTreeMap<u32, OrdinalFacts>,
    /// Cleanup pods in flight (not finished, not being deleted) across everything we watch.
    pub cleanups_in_flight: usize,
    pub now: Timestamp,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// The template annotation, when present and not blank.
    pub template: Option<String>,
    pub claim_templates: Vec<String>,
    pub selector: Option<LabelSelector>,
    pub replicas: u32,
    /// `spec.ordinals.start`.
    pub start: u32,
    /// `podManagementPolicy: Parallel`.
    pub parallel: bool,
    /// `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`.
    pub when_scaled_delete: bool,
    /// `persistentVolumeClaimRetentionPolicy.whenDeleted: Delete`.
    pub when_deleted_delete: bool,
}

impl SetFacts {
    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == naming::FINALIZER)
    }

    /// Whether the set still runs a pod at `ordinal`.
    pub fn wants(&self, ordinal: u32) -> bool {
        !self.deleting
            && ordinal >= self.start
            && u64::from(ordinal) < u64::from(self.start) + u64::from(self.replicas)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrdinalFacts {
    /// The claims of this ordinal that exist, in claim-template order.
    pub claims: Vec<ClaimFacts>,
    /// The pod named `<set>-<ordinal>`, if any.
    pub pod: Option<PodFacts>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClaimFacts {
    pub template: String,
    pub name: String,
    pub uid: String,
    pub deleting: bool,
    /// Our retry bookkeeping: the attempt to create next, set before a failed pod is deleted.
    pub next_attempt: Option<u32>,
    /// Another StatefulSet in the namespace whose own claim this name also is, and which still
    /// wants that ordinal.
    pub wanted_by_other: Option<String>,
}

impl ClaimFacts {
    /// A claim a new pod can mount and we may start a cleanup on.
    pub fn live(&self) -> bool {
        !self.deleting
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodFacts {
    pub name: String,
    pub uid: String,
    pub deleting: bool,
    pub role: PodRole,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PodRole {
    /// A pod of the StatefulSet (its controller ownerReference is this set).
    Stateful,
    /// A cleanup pod (it carries the owner annotation).
    Cleanup(CleanupFacts),
    /// Neither: somebody else's pod, or a stateful pod orphaned by `--cascade=orphan`.
    Foreign,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CleanupFacts {
    pub phase: Phase,
    pub attempt: u32,
    /// The claims the pod was created for: name -> UID. The UID is `None` for pods created by the
    /// Go original, which did not record it; the claim seen now is used then.
    pub claims: BTreeMap<String, Option<String>>,
    pub failure: Option<Failure>,
    /// When the pod was created (for the cleanup duration metric).
    pub created: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The pod's or the failed container's reason, e.g. `Error`, `DeadlineExceeded`.
    pub reason: String,
    pub exit_code: Option<i32>,
    pub finished_at: Option<Timestamp>,
}

/// Objects to observe one StatefulSet from: the caches, or lists read live from the API server.
pub struct Sources<'a> {
    /// StatefulSets of the namespace (for claim names that fit two sets).
    pub sets: &'a [std::sync::Arc<StatefulSet>],
    pub claims: &'a [std::sync::Arc<PartialObjectMeta<PersistentVolumeClaim>>],
    pub pods: &'a [std::sync::Arc<PartialObjectMeta<Pod>>],
    /// Full cleanup pods (label `scaledown-pod`), for their phase and volumes.
    pub cleanup_pods: &'a [std::sync::Arc<Pod>],
    pub cleanups_in_flight: usize,
    pub now: Timestamp,
}

/// Facts about `set` from `sources`. Objects of other namespaces in `sources` are ignored.
pub fn observe(set: &StatefulSet, sources: &Sources<'_>) -> Observed {
    let facts = set_facts(set);
    let ns = facts.namespace.as_str();
    let mut ordinals: BTreeMap<u32, OrdinalFacts> = BTreeMap::new();

    let others: Vec<SetFacts> = sources
        .sets
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns) && s.name_any() != facts.name)
        .map(|s| set_facts(s))
        .collect();
    for claim in sources
        .claims
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns))
    {
        let name = claim.name_any();
        for template in &facts.claim_templates {
            let Some(ordinal) = naming::claim_ordinal(&name, template, &facts.name) else {
                continue;
            };
            let wanted_by_other = others
                .iter()
                .find(|o| {
                    o.claim_templates.iter().any(|t| {
                        naming::claim_ordinal(&name, t, &o.name).is_some_and(|n| o.wants(n))
                    })
                })
                .map(|o| o.name.clone());
            ordinals
                .entry(ordinal)
                .or_default()
                .claims
                .push(ClaimFacts {
                    template: template.clone(),
                    name: name.clone(),
                    uid: claim.uid().unwrap_or_default(),
                    deleting: claim.meta().deletion_timestamp.is_some(),
                    next_attempt: claim
                        .annotations()
                        .get(naming::NEXT_ATTEMPT_ANNOTATION)
                        .and_then(|v| v.parse().ok()),
                    wanted_by_other,
                });
        }
    }
    for entry in ordinals.values_mut() {
        entry
            .claims
            .sort_by_key(|c| facts.claim_templates.iter().position(|t| *t == c.template));
    }

    let cleanup_pods: BTreeMap<&str, &Pod> = sources
        .cleanup_pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .filter_map(|p| Some((p.metadata.name.as_deref()?, p.as_ref())))
        .collect();
    for pod in sources
        .pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
    {
        let name = pod.name_any();
        let Some(ordinal) = naming::pod_ordinal(&name, &facts.name) else {
            continue;
        };
        let role = pod_role(pod, &facts.uid, cleanup_pods.get(name.as_str()).copied());
        ordinals.entry(ordinal).or_default().pod = Some(PodFacts {
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
        now: sources.now,
    }
}

/// The facts of a StatefulSet object on its own.
pub fn set_facts(set: &StatefulSet) -> SetFacts {
    let meta = set.meta();
    let spec = set.spec.as_ref();
    let retention = spec.and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let non_negative = |v: Option<i32>, default: u32| v.map_or(default, |v| v.max(0) as u32);
    SetFacts {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        uid: set.uid().unwrap_or_default(),
        resource_version: set.resource_version().unwrap_or_default(),
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        template: set
            .annotations()
            .get(naming::TEMPLATE_ANNOTATION)
            .filter(|t| !t.trim().is_empty())
            .cloned(),
        claim_templates: spec
            .and_then(|s| s.volume_claim_templates.as_ref())
            .map(|ts| ts.iter().filter_map(|t| t.metadata.name.clone()).collect())
            .unwrap_or_default(),
        selector: spec.map(|s| s.selector.clone()),
        replicas: non_negative(spec.and_then(|s| s.replicas), 1),
        start: non_negative(spec.and_then(|s| s.ordinals.as_ref()?.start), 0),
        parallel: spec.and_then(|s| s.pod_management_policy.as_deref()) == Some("Parallel"),
        when_scaled_delete: retention.and_then(|r| r.when_scaled.as_deref()) == Some("Delete"),
        when_deleted_delete: retention.and_then(|r| r.when_deleted.as_deref()) == Some("Delete"),
    }
}

fn pod_role(pod: &PartialObjectMeta<Pod>, set_uid: &str, full: Option<&Pod>) -> PodRole {
    let is_cleanup = pod
        .annotations()
        .get(naming::OWNER_ANNOTATION)
        .is_some_and(|v| !v.is_empty());
    if is_cleanup {
        return PodRole::Cleanup(match full {
            Some(full) => cleanup_facts(full),
            // Our label was removed, so the cleanup watch does not see it: wait, touch nothing.
            None => CleanupFacts {
                phase: Phase::Unknown,
                attempt: 1,
                claims: BTreeMap::new(),
                failure: None,
                created: None,
            },
        });
    }
    let owned = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "StatefulSet" && o.uid == set_uid);
    if owned {
        PodRole::Stateful
    } else {
        PodRole::Foreign
    }
}

/// The cleanup facts of a full cleanup pod.
pub fn cleanup_facts(pod: &Pod) -> CleanupFacts {
    let annotations = pod.annotations();
    let status = pod.status.as_ref();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => Phase::Pending,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some(_) => Phase::Unknown,
    };
    let claims = match annotations
        .get(naming::CLAIMS_ANNOTATION)
        .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v).ok())
    {
        Some(recorded) => recorded.into_iter().map(|(n, u)| (n, Some(u))).collect(),
        // Pods of the Go original: the claims are the pod's claim volumes.
        None => pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| Some((v.persistent_volume_claim.as_ref()?.claim_name.clone(), None)))
            .collect(),
    };
    let failure = (phase == Phase::Failed).then(|| {
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
        }
    });
    CleanupFacts {
        phase,
        attempt: annotations
            .get(naming::ATTEMPT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
        claims,
        failure,
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
    }
}

/// Whether a cleanup pod counts against `--max-concurrent-cleanups`.
pub fn in_flight(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .annotations()
            .get(naming::OWNER_ANNOTATION)
            .is_some_and(|v| !v.is_empty())
        && matches!(
            cleanup_facts(pod).phase,
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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::sync::Arc;

    fn set(ns: &str, name: &str, replicas: i32, annotated: bool) -> Arc<StatefulSet> {
        let mut value = serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {}, "template": {},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
        });
        if annotated {
            value["metadata"]["annotations"] =
                serde_json::json!({naming::TEMPLATE_ANNOTATION: "{}"});
        }
        Arc::new(serde_json::from_value(value).expect("statefulset"))
    }

    fn claim(ns: &str, name: &str) -> Arc<PartialObjectMeta<PersistentVolumeClaim>> {
        Arc::new(PartialObjectMeta {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[test]
    fn orphans_of_sets_that_did_not_opt_in_are_counted_per_namespace() {
        let sets = [
            set("a", "web", 1, false),
            set("a", "db", 0, true),
            set("b", "web", 2, false),
        ];
        let claims = [
            claim("a", "data-web-0"),
            claim("a", "data-web-1"),
            claim("a", "data-web-5"),
            claim("a", "data-db-0"),
            claim("b", "data-web-1"),
            claim("b", "data-web-2"),
            claim("c", "data-web-9"),
        ];
        let counts = unmanaged_orphans(&sets, &claims);
        assert_eq!(counts, [("a".to_string(), 2), ("b".to_string(), 1)].into());
    }
}
