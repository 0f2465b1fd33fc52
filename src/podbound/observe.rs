//! OBSERVE: plain facts about one opted-in claim and the pod it names.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;

/// Claim annotation naming the pod (same namespace) whose life the claim shares.
pub const BOUND_TO_POD_ANNOTATION: &str = "statefulsets.kubernetes.io/bound-to-pod";

/// Facts about one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The pod named by the annotation (`None`: not opted in; empty: opted in without a name).
    pub pod: Option<String>,
    pub created: Option<Timestamp>,
    pub deleting: bool,
    /// Its ownerReferences as (kind, name, uid).
    pub owners: Vec<(String, String, String)>,
}

impl ClaimFacts {
    /// Whether the claim already belongs to the pod `name` with `uid`.
    pub fn owned_by_pod(&self, name: &str) -> Option<&str> {
        self.owners
            .iter()
            .find(|(kind, n, _)| kind == "Pod" && n == name)
            .map(|(_, _, uid)| uid.as_str())
    }
}

/// What a live read of the named pod, and of the pods mounting the claim, showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodRead {
    NotRead,
    /// The named pod exists.
    Exists {
        uid: String,
        /// Owned by a StatefulSet: its claims are the scale-down controller's business.
        stateful: bool,
    },
    /// No pod of that name; `users`: other pods that mount the claim and have not finished.
    Gone {
        users: Vec<String>,
    },
}

pub fn observe(claim: &PartialObjectMeta<PersistentVolumeClaim>) -> ClaimFacts {
    ClaimFacts {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        uid: claim.uid().unwrap_or_default(),
        resource_version: claim.resource_version().unwrap_or_default(),
        pod: claim
            .annotations()
            .get(BOUND_TO_POD_ANNOTATION)
            .map(|p| p.trim().to_string()),
        created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        owners: claim
            .owner_references()
            .iter()
            .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
            .collect(),
    }
}

/// The read of pod `name` (if found) and of the pods of its namespace that mount `claim`.
pub fn read_pods(name: &str, claim: &str, pods: &[Pod]) -> PodRead {
    if let Some(pod) = pods.iter().find(|p| p.name_any() == name) {
        let stateful = pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "StatefulSet" && o.controller == Some(true));
        return PodRead::Exists {
            uid: pod.uid().unwrap_or_default(),
            stateful,
        };
    }
    let finished = |p: &Pod| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Succeeded" | "Failed"))
    };
    let users = pods
        .iter()
        .filter(|p| !finished(p))
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .map(|p| p.name_any())
        .collect();
    PodRead::Gone { users }
}
