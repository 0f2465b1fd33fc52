//! WATCH: the caches we decide from and the mapping of every change to the StatefulSet it concerns.
//!
//! Four watches: StatefulSets (full objects: spec and annotations are read), claims as metadata
//! only, every pod pruned to what observe reads (`prune_pod`), and cleanup pods (label
//! `scaledown-pod`) in full, for their failure details. Claims and pods live in [`Index`]es, so
//! that one pass gathers what its set has ([`Stores::slice`]) without copying whole caches.
//!
//! Every watch runs under [`crate::resuming`]: after an error it waits a short, capped backoff and
//! goes on from its last resourceVersion (lists again only after 410 Gone, then at once), so the
//! controller is back within seconds of the API server, and the changes it missed arrive as events.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::core::PartialObjectMeta;
use std::collections::BTreeMap;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::index::{Index, Keys};
use crate::naming;

mod pods;
pub use pods::{PodCache, needs_spec};

/// The caches, shared by the controller and the HTTP readiness probe.
#[derive(Clone)]
pub struct Stores {
    pub sets: Store<StatefulSet>,
    pub claims: Index<PartialObjectMeta<PersistentVolumeClaim>>,
    /// Every pod: pruned by `prune_pod` where observe reads more than its name, else by name only.
    pub pods: PodCache,
    pub cleanup_pods: Index<Pod>,
}

/// A pod is also found by the names of the claims it mounts (their users).
impl Keys for Pod {
    fn keys(&self) -> Vec<String> {
        self.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
            .collect()
    }
}

impl Keys for PartialObjectMeta<PersistentVolumeClaim> {}

/// What one pass over a set looks at, gathered from the caches: see [`Stores::slice`].
#[derive(Default)]
pub struct Slice {
    pub sets: Vec<Arc<StatefulSet>>,
    pub claims: Vec<Arc<PartialObjectMeta<PersistentVolumeClaim>>>,
    pub pods: Vec<Arc<Pod>>,
    pub cleanup_pods: Vec<Arc<Pod>>,
}

impl Stores {
    /// Waits until every cache has its first full list.
    ///
    /// A store's readiness wakes only the last task that waited on it (kube-runtime keeps a single
    /// oneshot receiver for all waiters), and the Controller waits on the StatefulSet store too. So
    /// readiness is polled again on a short tick instead of trusting one wake-up.
    pub async fn ready(&self) -> Result<(), crate::error::Error> {
        loop {
            match tokio::time::timeout(READY_POLL, self.sets.wait_until_ready()).await {
                Ok(result) => {
                    result.map_err(|_| crate::error::Error::CacheNotReady("statefulset"))?;
                    break;
                }
                Err(_elapsed) => continue,
            }
        }
        self.claims.wait_ready().await;
        self.pods.wait_ready().await;
        self.cleanup_pods.wait_ready().await;
        Ok(())
    }

    /// The objects a pass over `set` looks at: its claims (by name prefix per claim template),
    /// the pods named after it and the pods that mount its claims, its cleanup pods, and the other
    /// StatefulSets whose claims could carry the same names. O(what the set has), not O(cluster).
    pub fn slice(&self, set: &StatefulSet) -> Slice {
        let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
        let mut claims = BTreeMap::new();
        for template in claim_templates(set) {
            let prefix = format!("{template}-{name}-");
            for claim in self.claims.prefixed(&ns, &prefix) {
                claims.insert(claim.name_any(), claim);
            }
        }
        let pod_prefix = format!("{name}-");
        let mut pods: BTreeMap<String, Arc<Pod>> = self
            .pods
            .prefixed(&ns, &pod_prefix)
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        let mut sets = BTreeMap::new();
        for claim in claims.keys() {
            for user in self.pods.users(&ns, claim) {
                pods.insert(user.name_any(), user);
            }
            for other in sets_of_claim_name(&ns, claim, &self.sets) {
                if other.name_any() != name {
                    sets.insert(other.name_any(), other);
                }
            }
        }
        Slice {
            sets: sets.into_values().collect(),
            claims: claims.into_values().collect(),
            pods: pods.into_values().collect(),
            cleanup_pods: self.cleanup_pods.prefixed(&ns, &pod_prefix),
        }
    }
}

fn claim_templates(set: &StatefulSet) -> impl Iterator<Item = &str> {
    set.spec
        .iter()
        .flat_map(|spec| spec.volume_claim_templates.iter().flatten())
        .filter_map(|t| t.metadata.name.as_deref())
}

/// The names a StatefulSet must have for `claim` to be one of its claims: `claim` is
/// `<template>-<set>-<ordinal>` and both template and set may contain dashes, so every dash before
/// the ordinal may end the template.
pub fn candidate_sets(claim: &str) -> Vec<&str> {
    let Some(last) = claim.rfind('-') else {
        return Vec::new();
    };
    if naming::parse_ordinal(&claim[last + 1..]).is_none() {
        return Vec::new();
    }
    claim[..last]
        .match_indices('-')
        .map(|(i, _)| &claim[i + 1..last])
        .filter(|set| !set.is_empty())
        .collect()
}

/// The StatefulSets of `ns` whose claim templates give a claim the name `claim`.
fn sets_of_claim_name(ns: &str, claim: &str, sets: &Store<StatefulSet>) -> Vec<Arc<StatefulSet>> {
    candidate_sets(claim)
        .into_iter()
        .filter_map(|name| sets.get(&ObjectRef::new(name).within(ns)))
        .filter(|set| {
            let name = set.name_any();
            claim_templates(set).any(|t| naming::claim_ordinal(claim, t, &name).is_some())
        })
        .collect()
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

/// The StatefulSets whose claim templates give a claim this name, in the claim's namespace: a
/// handful of lookups by name, whatever the number of sets.
pub fn sets_of_claim<K: Resource>(
    claim: &K,
    sets: &Store<StatefulSet>,
) -> Vec<ObjectRef<StatefulSet>> {
    let (Some(ns), Some(name)) = (
        claim.meta().namespace.as_deref(),
        claim.meta().name.as_deref(),
    ) else {
        return Vec::new();
    };
    sets_of_claim_name(ns, name, sets)
        .iter()
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

/// Prunes a StatefulSet to what observe reads: its managed fields, the `kubectl apply` copy of
/// itself and its pod template (only the claim templates and the annotations are read) are dropped.
/// With a thousand sets these are most of the cache.
pub fn prune_set(set: &mut StatefulSet) {
    let meta = &mut set.metadata;
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if let Some(spec) = set.spec.as_mut() {
        spec.template = Default::default();
    }
}

/// The annotation `kubectl apply` keeps a copy of the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

    fn store(sets: Vec<Arc<StatefulSet>>) -> Store<StatefulSet> {
        let (reader, mut writer) = kube::runtime::reflector::store();
        for set in sets {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(set.as_ref().clone()));
        }
        reader
    }

    #[test]
    fn candidates_are_every_split_before_the_ordinal() {
        assert_eq!(candidate_sets("data-web-2-0"), ["web-2", "2"]);
        assert_eq!(candidate_sets("b-c-a-1"), ["c-a", "a"]);
        assert!(candidate_sets("data-web-01").is_empty());
        assert!(candidate_sets("data--0").is_empty());
        assert!(candidate_sets("plain").is_empty());
    }

    #[test]
    fn claims_map_to_every_set_they_fit() {
        let sets = store(vec![
            set("ns", "web", &["data"]),
            set("ns", "web-2", &["data"]),
            set("other", "web", &["data"]),
            set("ns", "c-a", &["b"]),
            set("ns", "a", &["b-c"]),
        ]);
        let names = |claim_name: &str| {
            let mut names: Vec<String> = sets_of_claim(&claim("ns", claim_name), &sets)
                .into_iter()
                .map(|r| r.name)
                .collect();
            names.sort();
            names
        };
        assert_eq!(names("data-web-2"), ["web"]);
        assert_eq!(names("data-web-2-0"), ["web-2"]);
        assert_eq!(names("b-c-a-1"), ["a", "c-a"]);
        assert!(names("data-web-02").is_empty());
        assert!(names("unrelated").is_empty());
    }

    #[test]
    fn a_pruned_set_keeps_what_observe_reads() {
        let mut full: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "generation": 2,
                "annotations": {LAST_APPLIED: "{}", naming::TEMPLATE_ANNOTATION: "{\"spec\":{}}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"replicas": 2, "serviceName": "web", "selector": {},
                "template": {"spec": {"containers": [{"name": "app", "image": "app"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
            "status": {"replicas": 2}
        }))
        .expect("a set");
        let before = observe_facts(&full);
        prune_set(&mut full);
        assert!(full.metadata.managed_fields.is_none());
        assert!(!full.annotations().contains_key(LAST_APPLIED));
        assert_eq!(
            full.spec.as_ref().map(|s| &s.template),
            Some(&Default::default())
        );
        assert_eq!(observe_facts(&full), before, "observe sees the same set");
    }

    fn observe_facts(set: &StatefulSet) -> String {
        format!("{:?}", crate::scaledown::observe::set_facts(set))
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
