//! WATCH: the caches we decide from and the mapping of every change to the StatefulSet it concerns.
//!
//! Four watches: StatefulSets (full objects: spec and annotations are read), claims and pods as
//! metadata only (names, UIDs, owners, deletion marks are all we need of them), and a full watch of
//! cleanup pods only (label `scaledown-pod`), whose phase and volumes we read.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::naming;

/// The caches, shared by the controller and the HTTP readiness probe.
#[derive(Clone)]
pub struct Stores {
    pub sets: Store<StatefulSet>,
    pub claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    /// Every pod, pruned by `prune_pod` to what observe reads.
    pub pods: Store<Pod>,
    pub cleanup_pods: Store<Pod>,
}

impl Stores {
    /// Waits until every cache has its first full list.
    ///
    /// A store's readiness wakes only the last task that waited on it (kube-runtime keeps a single
    /// oneshot receiver for all waiters), and the Controller waits on the StatefulSet store too. So
    /// readiness is polled again on a short tick instead of trusting one wake-up.
    pub async fn ready(&self) -> Result<(), crate::error::Error> {
        use crate::error::Error::CacheNotReady;
        async fn one<K>(store: &Store<K>, what: &'static str) -> Result<(), crate::error::Error>
        where
            K: kube::Resource + Clone + 'static,
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            loop {
                match tokio::time::timeout(READY_POLL, store.wait_until_ready()).await {
                    Ok(result) => return result.map_err(|_| CacheNotReady(what)),
                    Err(_elapsed) => continue,
                }
            }
        }
        one(&self.sets, "statefulset").await?;
        one(&self.claims, "claim").await?;
        one(&self.pods, "pod").await?;
        one(&self.cleanup_pods, "cleanup pod").await
    }
}

/// How often a wait for cache readiness looks again.
const READY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// The StatefulSet a pod concerns: the owner annotation of a cleanup pod, else its StatefulSet
/// controller.
pub fn set_of_pod<K: Resource>(pod: &K) -> Option<ObjectRef<StatefulSet>> {
    let ns = pod.meta().namespace.as_deref()?;
    let owner = pod
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(naming::OWNER_ANNOTATION));
    match owner.filter(|o| !o.is_empty()) {
        Some(set) => Some(ObjectRef::new(set).within(ns)),
        None => pod
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")
            .map(|o| ObjectRef::new(&o.name).within(ns)),
    }
}

/// The StatefulSets whose claim templates give a claim this name, in the claim's namespace.
pub fn sets_of_claim<K: Resource>(
    claim: &K,
    sets: &[Arc<StatefulSet>],
) -> Vec<ObjectRef<StatefulSet>> {
    let (Some(ns), Some(name)) = (
        claim.meta().namespace.as_deref(),
        claim.meta().name.as_deref(),
    ) else {
        return Vec::new();
    };
    sets.iter()
        .filter(|s| s.namespace().as_deref() == Some(ns))
        .filter(|s| {
            let set = s.name_any();
            s.spec
                .iter()
                .flat_map(|spec| spec.volume_claim_templates.iter().flatten())
                .filter_map(|t| t.metadata.name.as_deref())
                .any(|t| naming::claim_ordinal(name, t, &set).is_some())
        })
        .map(|s| ObjectRef::from(s.as_ref()))
        .collect()
}

/// Prunes a pod to what observe reads: identity, owners, our annotations and label, the claims it
/// mounts, its node, our gate and its phase. The rest (containers, env, status details) is dropped
/// so the cache of every pod in the cluster stays small.
pub fn prune_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus, Volume};
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == naming::OWNER_ANNOTATION || k == naming::ATTEMPT_ANNOTATION);
    }
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k == naming::CLEANUP_LABEL);
    }
    let spec = pod.spec.take().map(|spec| PodSpec {
        volumes: spec.volumes.map(|vs| {
            vs.into_iter()
                .filter(|v| v.persistent_volume_claim.is_some())
                .map(|v| Volume {
                    name: v.name,
                    persistent_volume_claim: v.persistent_volume_claim,
                    ..Default::default()
                })
                .collect()
        }),
        node_name: spec.node_name,
        scheduling_gates: spec.scheduling_gates,
        ..Default::default()
    });
    pod.spec = spec;
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        reason: status.reason,
        start_time: status.start_time,
        ..Default::default()
    });
}

/// Drops what we never read, so the caches stay small.
pub fn prune_meta<K: Resource>(obj: &mut K, keep_annotations: &[&str]) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| keep_annotations.contains(&k.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn set(ns: &str, name: &str, templates: &[&str]) -> Arc<StatefulSet> {
        Arc::new(StatefulSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                volume_claim_templates: Some(
                    templates
                        .iter()
                        .map(|t| PersistentVolumeClaim {
                            metadata: ObjectMeta {
                                name: Some(t.to_string()),
                                ..Default::default()
                            },
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn claim(ns: &str, name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn claims_map_to_every_set_they_fit() {
        let sets = vec![
            set("ns", "web", &["data"]),
            set("ns", "web-2", &["data"]),
            set("other", "web", &["data"]),
            set("ns", "c-a", &["b"]),
            set("ns", "a", &["b-c"]),
        ];
        let names = |claim_name: &str| {
            sets_of_claim(&claim("ns", claim_name), &sets)
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("data-web-2"), ["web"]);
        assert_eq!(names("data-web-2-0"), ["web-2"]);
        assert_eq!(names("b-c-a-1"), ["c-a", "a"]);
        assert!(names("data-web-02").is_empty());
        assert!(names("unrelated").is_empty());
    }

    #[test]
    fn pods_map_by_owner_annotation_then_controller() {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("web-2".into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "StatefulSet".into(),
                    name: "web".into(),
                    uid: "u".into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(set_of_pod(&pod).map(|r| r.name), Some("web".to_string()));
        pod.metadata.owner_references = None;
        assert_eq!(set_of_pod(&pod), None);
        pod.metadata.annotations =
            Some([(naming::OWNER_ANNOTATION.to_string(), "db".to_string())].into());
        assert_eq!(
            set_of_pod(&pod).map(|r| (r.name, r.namespace)),
            Some(("db".to_string(), Some("ns".to_string())))
        );
    }
}
