//! A pod kept in full, in a compact form: what `prune_pod` keeps (it keeps of spec and status what
//! a [`HeldPod`] holds), without the k8s-openapi structs that hold every field inline.
//!
//! A pruned `Pod` still costs its full shape: `PodSpec` is about 1.5 KiB and `PodStatus` several
//! hundred bytes even when nearly empty, and each mounted claim is a whole `Volume` of about
//! 3.2 KiB (every volume source is an inline field). A [`HeldPod`] keeps the metadata as it is and
//! the rest as the few values observe reads, and gives readers back the same pruned `Pod` it was
//! made from ([`HeldPod::pod`]), so observe's inputs do not change.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimVolumeSource, Pod, PodSchedulingGate, PodSpec, PodStatus, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::ObjectMeta;

use crate::index::Keys;

/// A pod as the cache holds it in full: see the module.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldPod {
    meta: ObjectMeta,
    spec: Option<HeldSpec>,
    status: Option<HeldStatus>,
}

/// What is kept of a pod's spec: the claims it mounts (volume name and source), its
/// node and its scheduling gates.
#[derive(Clone, Debug, PartialEq)]
struct HeldSpec {
    claims: Option<Box<[(String, PersistentVolumeClaimVolumeSource)]>>,
    node_name: Option<String>,
    scheduling_gates: Option<Box<[String]>>,
}

/// What is kept of a pod's status.
#[derive(Clone, Debug, PartialEq)]
struct HeldStatus {
    phase: Option<String>,
    reason: Option<String>,
    start_time: Option<Time>,
}

impl HeldPod {
    /// The pod as held: its metadata as it is (`prune_pod` prunes that first), and of its spec and
    /// status only what `HeldSpec` and `HeldStatus` name.
    pub fn new(pod: &Pod) -> HeldPod {
        let spec = pod.spec.as_ref().map(|spec| HeldSpec {
            claims: spec.volumes.as_ref().map(|volumes| {
                volumes
                    .iter()
                    .filter_map(|v| Some((v.name.clone(), v.persistent_volume_claim.clone()?)))
                    .collect()
            }),
            node_name: spec.node_name.clone(),
            scheduling_gates: spec
                .scheduling_gates
                .as_ref()
                .map(|gates| gates.iter().map(|g| g.name.clone()).collect()),
        });
        let status = pod.status.as_ref().map(|status| HeldStatus {
            phase: status.phase.clone(),
            reason: status.reason.clone(),
            start_time: status.start_time.clone(),
        });
        HeldPod {
            meta: pod.metadata.clone(),
            spec,
            status,
        }
    }

    /// The pruned pod this was made from.
    pub fn pod(&self) -> Pod {
        let spec = self.spec.as_ref().map(|spec| PodSpec {
            volumes: spec.claims.as_ref().map(|claims| {
                claims
                    .iter()
                    .map(|(name, claim)| Volume {
                        name: name.clone(),
                        persistent_volume_claim: Some(claim.clone()),
                        ..Default::default()
                    })
                    .collect()
            }),
            node_name: spec.node_name.clone(),
            scheduling_gates: spec.scheduling_gates.as_ref().map(|gates| {
                gates
                    .iter()
                    .map(|name| PodSchedulingGate { name: name.clone() })
                    .collect()
            }),
            ..Default::default()
        });
        let status = self.status.as_ref().map(|status| PodStatus {
            phase: status.phase.clone(),
            reason: status.reason.clone(),
            start_time: status.start_time.clone(),
            ..Default::default()
        });
        Pod {
            metadata: self.meta.clone(),
            spec,
            status,
        }
    }
}

/// A held pod is found by the names of the claims it mounts, as a `Pod` is.
impl Keys for HeldPod {
    fn keys(&self) -> Vec<String> {
        self.spec
            .iter()
            .flat_map(|spec| spec.claims.iter().flatten())
            .map(|(_, claim)| claim.claim_name.clone())
            .collect()
    }
}

/// A held pod is a view of a pod: it names the pod's API so that an [`crate::index::Index`] can
/// hold it.
impl Resource for HeldPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caches::prune_pod;
    use serde_json::json;

    fn pruned(value: serde_json::Value) -> Pod {
        let mut pod: Pod = serde_json::from_value(value).expect("pod");
        prune_pod(&mut pod);
        pod
    }

    #[test]
    fn a_held_pod_gives_back_the_pruned_pod() {
        let full = pruned(json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "u0", "resourceVersion": "7",
                "labels": {"app": "web"}, "annotations": {"x": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "web", "uid": "s", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": "n1",
                "schedulingGates": [{"name": "g"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "logs", "persistentVolumeClaim": {"claimName": "logs-web-0",
                        "readOnly": true}}]},
            "status": {"phase": "Running", "reason": "r", "startTime": "2024-01-01T00:00:00Z",
                "podIP": "10.0.0.1"}
        }));
        let held = HeldPod::new(&full);
        assert_eq!(held.pod(), full);
        assert_eq!(held.keys(), ["data-web-0", "logs-web-0"]);
        assert_eq!(held.keys(), full.keys());
    }

    #[test]
    fn absent_and_empty_parts_stay_as_they_were() {
        for value in [
            json!({"metadata": {"name": "a", "namespace": "ns"}}),
            json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": {"containers": []},
                "status": {}}),
            json!({"metadata": {"name": "c", "namespace": "ns"},
                "spec": {"containers": [], "volumes": [], "schedulingGates": []}}),
        ] {
            let pod = pruned(value);
            let held = HeldPod::new(&pod);
            assert_eq!(held.pod(), pod);
            assert!(held.keys().is_empty());
        }
    }
}
