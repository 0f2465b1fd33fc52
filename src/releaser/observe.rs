//! OBSERVE: plain facts about one PersistentVolume, its StorageClass and the claim it names.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

/// StorageClass annotation naming the releaser that may release its PVs (plumber-cd's key).
pub const CONTROLLER_ID_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";

/// Facts about one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvFacts {
    pub name: String,
    pub uid: String,
    /// `status.phase` (empty when not reported yet).
    pub phase: String,
    /// `spec.persistentVolumeReclaimPolicy` is `Retain`.
    pub retain: bool,
    /// `spec.storageClassName` (empty when none).
    pub class: String,
    /// The controller id on its StorageClass (`None`: no class, the class is gone, or no annotation).
    pub class_id: Option<String>,
    pub claim_ref: Option<ClaimRef>,
    pub deleting: bool,
    /// What a live read of the claim in `claim_ref` showed.
    pub claim: ClaimRead,
}

/// The claim a PV names in `spec.claimRef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
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
    Exists { uid: String },
    /// No claim of that name.
    Gone,
}

/// The facts of `pv`, with its StorageClass (if it exists) and the claim read.
pub fn observe(pv: &PersistentVolume, class: Option<&StorageClass>, claim: ClaimRead) -> PvFacts {
    let spec = pv.spec.as_ref();
    let claim_ref = spec.and_then(|s| s.claim_ref.as_ref()).map(|r| ClaimRef {
        namespace: r.namespace.clone().unwrap_or_default(),
        name: r.name.clone().unwrap_or_default(),
        uid: r.uid.clone().unwrap_or_default(),
    });
    let class_name = spec
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    PvFacts {
        name: pv.name_any(),
        uid: pv.uid().unwrap_or_default(),
        phase: pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        retain: spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Retain"),
        class_id: class
            .filter(|c| !class_name.is_empty() && c.name_any() == class_name)
            .and_then(|c| c.annotations().get(CONTROLLER_ID_ANNOTATION).cloned()),
        class: class_name,
        claim_ref,
        deleting: pv.metadata.deletion_timestamp.is_some(),
        claim,
    }
}
