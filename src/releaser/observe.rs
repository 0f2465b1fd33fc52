//! OBSERVE: plain facts about one PersistentVolume, its StorageClass, the claim it names and its
//! scrub pod. Pure: the StorageClass's scrub template is parsed and checked here, the scrub pod's
//! phase classified; what follows from them is `decide`'s.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::Value;

use super::scrub::Scrub;
use crate::naming::{CONTROLLER_ID_ANNOTATION, SCRUB_STATE_ANNOTATION, SCRUB_TEMPLATE_ANNOTATION};

/// The scrub pod of a PV, as the scrub-pod cache shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScrubPod {
    /// None, or one being deleted before it finished.
    Missing,
    /// Pending or Running.
    Busy,
    /// Succeeded; the pod's UID (its deletion's precondition).
    Succeeded {
        /// The pod's UID.
        uid: String,
    },
    /// Failed, with the reason to report.
    Failed {
        /// The pod's UID.
        uid: String,
        /// Why it failed.
        reason: String,
    },
}

/// The scrub its StorageClass asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScrubTemplate {
    /// No scrub template (or an empty one): the PV is released without a scrub.
    Absent,
    /// A template that makes a scrub pod ([`crate::template::scrub::check`]ed, not yet rendered for the PV).
    Pod(Value),
    /// A template that cannot make a scrub pod: why.
    Invalid(String),
}

/// Facts about one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvFacts {
    /// The PV's name.
    pub name: String,
    /// The PV's UID.
    pub uid: String,
    /// `status.phase` (empty when not reported yet).
    pub phase: String,
    /// `spec.persistentVolumeReclaimPolicy` is `Retain`.
    pub retain: bool,
    /// `spec.storageClassName` (empty when none).
    pub class: String,
    /// The controller id on its StorageClass (`None`: no class, the class is gone, or no annotation).
    pub class_id: Option<String>,
    /// `spec.claimRef`, if set.
    pub claim_ref: Option<ClaimRef>,
    /// The PV is being deleted.
    pub deleting: bool,
    /// What a live read of the claim in `claim_ref` showed.
    pub claim: ClaimRead,
    /// The scrub pod template of its StorageClass.
    pub scrub_template: ScrubTemplate,
    /// Where scrub pods and temporary claims live (`--pv-scrub-namespace`; `None`: not known).
    pub scrub_ns: Option<String>,
    /// The scrub recorded on the PV.
    pub scrub: Option<Scrub>,
    /// Its scrub pod, as the scrub-pod cache shows it.
    pub scrub_pod: ScrubPod,
}

/// The claim a PV names in `spec.claimRef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Empty when the PV is only pre-bound by name.
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// A live read of the claim named by the PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimRead {
    /// Not read (facts from the caches only).
    NotRead,
    /// A claim of that name exists, with this UID.
    Exists {
        /// The claim's UID.
        uid: String,
    },
    /// No claim of that name.
    Gone,
}

/// The facts of `pv`, with its StorageClass (if it exists), the claim read, its scrub pod from the
/// cache and the scrub namespace.
pub fn observe(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
    claim: ClaimRead,
    scrub_pod: Option<&Pod>,
    scrub_ns: Option<&str>,
) -> PvFacts {
    let spec = pv.spec.as_ref();
    let claim_ref = spec.and_then(|s| s.claim_ref.as_ref()).map(|r| ClaimRef {
        namespace: r.namespace.clone().unwrap_or_default(),
        name: r.name.clone().unwrap_or_default(),
        uid: r.uid.clone().unwrap_or_default(),
    });
    let class_name = spec
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let class = class.filter(|c| !class_name.is_empty() && c.name_any() == class_name);
    PvFacts {
        name: pv.name_any(),
        uid: pv.uid().unwrap_or_default(),
        phase: pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        retain: spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Retain"),
        class_id: class.and_then(|c| c.annotations().get(CONTROLLER_ID_ANNOTATION).cloned()),
        scrub_template: scrub_template(class),
        scrub_ns: scrub_ns.filter(|ns| !ns.is_empty()).map(str::to_string),
        scrub: pv
            .annotations()
            .get(SCRUB_STATE_ANNOTATION)
            .and_then(|s| Scrub::parse(s)),
        scrub_pod: scrub_pod_state(scrub_pod),
        class: class_name,
        claim_ref,
        deleting: pv.metadata.deletion_timestamp.is_some(),
        claim,
    }
}

/// The scrub template of `class`, parsed and checked.
pub fn scrub_template(class: Option<&StorageClass>) -> ScrubTemplate {
    let raw = class.and_then(|c| c.annotations().get(SCRUB_TEMPLATE_ANNOTATION));
    match raw.filter(|t| !t.trim().is_empty()) {
        None => ScrubTemplate::Absent,
        Some(raw) => match crate::template::scrub::check(raw) {
            Ok(pod) => ScrubTemplate::Pod(pod),
            Err(why) => ScrubTemplate::Invalid(why),
        },
    }
}

/// Where the scrub pod stands, from its phase: a pod that finished is Succeeded or Failed even
/// while it is deleted; one deleted before it finished counts as missing.
pub fn scrub_pod_state(pod: Option<&Pod>) -> ScrubPod {
    let Some(pod) = pod else {
        return ScrubPod::Missing;
    };
    let uid = pod.uid().unwrap_or_default();
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => ScrubPod::Succeeded { uid },
        Some("Failed") => ScrubPod::Failed {
            uid,
            reason: status
                .and_then(|s| s.reason.clone())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "Failed".into()),
        },
        _ if pod.metadata.deletion_timestamp.is_some() => ScrubPod::Missing,
        _ => ScrubPod::Busy,
    }
}

#[cfg(test)]
mod tests;
