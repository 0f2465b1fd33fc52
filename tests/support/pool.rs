//! Helpers of the PV releaser tests: StorageClass ids, claims bound by name, and waiting for a PV
//! to be released.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::fixtures::LONG;
use super::recorder::Recorder;
use super::{Cluster, TestNamespace, from_json, wait_for_pvc_phase};

pub const ID_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";

pub async fn annotate_class(cluster: &Cluster, class: &str, id: &str) {
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    let patch = json!({"metadata": {"annotations": {ID_ANNOTATION: id}}});
    classes
        .patch(class, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate the StorageClass");
}

/// Creates claim `name` bound to PV `pv` (by volumeName) and waits until it is Bound.
pub async fn bind(ns: &TestNamespace, name: &str, pv: &str, class: &str) {
    let claim: PersistentVolumeClaim = from_json(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }));
    let claims: Api<PersistentVolumeClaim> = ns.api();
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    wait_for_pvc_phase(&claims, name, "Bound", LONG).await;
}

pub async fn delete_claim(ns: &TestNamespace, name: &str) {
    let claims: Api<PersistentVolumeClaim> = ns.api();
    claims
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete claim");
}

pub fn phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Whether `pv` is Available with no claimRef: released back into the pool.
pub fn is_free(pv: &PersistentVolume) -> bool {
    phase(pv) == "Available" && pv.spec.as_ref().is_some_and(|sp| sp.claim_ref.is_none())
}

/// Waits until the recorder saw `pv` Released and then Available without a claimRef; returns the
/// time between the two.
pub async fn wait_released(pvs: &Recorder<PersistentVolume>, pv: &str) -> Duration {
    let released = pvs
        .wait_for(&format!("PV {pv} Released"), LONG, |s| {
            s.name == pv && phase(&s.object) == "Released"
        })
        .await;
    let available = pvs
        .wait_for(
            &format!("PV {pv} Available without a claimRef"),
            LONG,
            |s| s.name == pv && s.at > released.at && is_free(&s.object),
        )
        .await;
    available.at - released.at
}
