//! WATCH: the caches a pass decides from, and the mapping of every change to the StatefulSet it
//! concerns.
//!
//! Three of the four watches are shared with the other controllers (`crate::caches`):
//! StatefulSets (full objects: spec and annotations are read), claims as metadata only and every
//! pod pruned to what observe reads. The fourth is the scale-down controller's own: cleanup pods
//! (label `scaledown-pod`) in full, for their failure details. Claims and pods live in [`Index`]es,
//! so that one pass gathers what its set has ([`Stores::slice`]) without copying whole caches.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::caches::{self, Caches, Claim, LIST_PAGE_SIZE, PodCache, claim_templates};
use crate::index::Index;
use crate::naming::{self, Ordinals};

/// The caches a pass reads, shared by the controller and its readiness and metrics.
#[derive(Clone)]
pub struct Stores {
    /// Every StatefulSet (the shared cache).
    pub sets: Store<StatefulSet>,
    /// Every claim (metadata), indexed per namespace.
    pub claims: Index<Claim>,
    /// Every pod: pruned by `prune_pod` where observe reads more than its name, else by name only.
    pub pods: PodCache,
    /// Cleanup pods in full (label `scaledown-pod`), for their failure details.
    pub cleanup_pods: Index<Pod>,
}

/// The caches, and the change stream of the one watch the scale-down controller has to itself.
pub struct Watches {
    /// The caches.
    pub stores: Stores,
    /// Cleanup pods as they change (the watch restores itself: it never yields an error).
    pub cleanup_pods: BoxStream<'static, watcher::Result<Pod>>,
}

impl Watches {
    /// The shared `caches`, and a watch of the cleanup pods of `ns` (or all).
    pub fn new(client: &Client, ns: Option<&str>, caches: &Caches) -> Watches {
        let config = watcher::Config::default()
            .page_size(LIST_PAGE_SIZE)
            .labels(naming::CLEANUP_LABEL);
        let cleanup_pods = Index::default();
        let stream = caches::resuming(
            "cleanup pods",
            caches::api(client, ns),
            config,
            |p: &mut Pod| p.managed_fields_mut().clear(),
        );
        let changes = stream
            .map_ok({
                let index = cleanup_pods.clone();
                move |event| {
                    index.apply(&event);
                    event
                }
            })
            .touched_objects()
            .boxed();
        Watches {
            stores: Stores {
                sets: caches.sets.clone(),
                claims: caches.claims.clone(),
                pods: caches.pods.clone(),
                cleanup_pods,
            },
            cleanup_pods: changes,
        }
    }
}

/// What one pass over a set looks at, gathered from the caches: see [`Stores::slice`].
#[derive(Default)]
pub struct Slice {
    /// The StatefulSets of the namespace whose names a claim name allows.
    pub sets: Vec<Arc<StatefulSet>>,
    /// The set's claims.
    pub claims: Vec<Arc<Claim>>,
    /// The set's pods, and the pods that mount its claims.
    pub pods: Vec<Arc<Pod>>,
    /// The set's cleanup pods.
    pub cleanup_pods: Vec<Arc<Pod>>,
    /// The ordinals the names of its claims and pods give (see [`ordinals`]).
    pub ordinals: Ordinals,
}

impl Stores {
    /// The set named like `woken` as the cache holds it now (a pass may start long after the
    /// watch event that woke it); `None` once the cache has seen it deleted.
    pub fn newest(&self, woken: &StatefulSet) -> Option<Arc<StatefulSet>> {
        self.sets.get(&ObjectRef::from_obj(woken))
    }

    /// Waits until every cache has its first full list.
    pub async fn ready(&self) -> Result<(), crate::error::Error> {
        caches::sets_ready(&self.sets).await?;
        self.claims.wait_ready().await;
        self.pods.wait_ready().await;
        self.cleanup_pods.wait_ready().await;
        Ok(())
    }
    /// The objects a pass over `set` looks at: its claims (by name prefix per claim template),
    /// the pods named after it and the pods that mount its claims, its cleanup pods, the other
    /// StatefulSets whose claims could carry the same names, and the ordinals the names give.
    /// O(what the set has), not O(cluster).
    pub fn slice(&self, set: &StatefulSet) -> Slice {
        let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
        let mut claims = BTreeMap::new();
        for template in claim_templates(set) {
            let prefix = naming::claim_prefix(template, &name);
            for claim in self.claims.prefixed(&ns, &prefix) {
                claims.insert(claim.name_any(), claim);
            }
        }
        let pod_prefix = naming::pod_prefix(&name);
        let mut pods: BTreeMap<String, Arc<Pod>> = self
            .pods
            .prefixed(&ns, &pod_prefix)
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        let mut sets = BTreeMap::new();
        for claim_name in claims.keys() {
            for user in self.pods.users(&ns, claim_name) {
                pods.insert(user.name_any(), user);
            }
            for other in caches::sets_of_claim_name(&ns, claim_name, &self.sets) {
                if other.name_any() != name {
                    sets.insert(other.name_any(), other);
                }
            }
        }
        // A claim without this set's selector labels is its own only if it carries no other
        // set's: those sets are looked up among the namespace's (rare: made by hand, or foreign).
        if lacks_own_labels(set, claims.values().map(|c| &**c)) {
            for other in self.sets.state() {
                if other.namespace().as_deref() == Some(ns.as_str())
                    && other.name_any() != name
                    && labelled_by(&other, claims.values().map(|c| &**c))
                {
                    sets.insert(other.name_any(), other);
                }
            }
        }
        let claims: Vec<Arc<Claim>> = claims.into_values().collect();
        let pods: Vec<Arc<Pod>> = pods.into_values().collect();
        Slice {
            sets: sets.into_values().collect(),
            ordinals: ordinals(set, &claims, &pods),
            claims,
            pods,
            cleanup_pods: self.cleanup_pods.prefixed(&ns, &pod_prefix),
        }
    }
}

/// The ordinals that the names of `claims` and `pods` give as names of `set`'s claims and pods
/// (`naming`'s grammar, applied here where a pass's objects are gathered, from the caches or from a
/// live list, so that `observe` looks names up instead of parsing them).
pub fn ordinals(set: &StatefulSet, claims: &[Arc<Claim>], pods: &[Arc<Pod>]) -> Ordinals {
    let templates: Vec<&str> = claim_templates(set).collect();
    Ordinals::of(
        &set.name_any(),
        &templates,
        claims.iter().filter_map(|c| c.metadata.name.as_deref()),
        pods.iter().filter_map(|p| p.metadata.name.as_deref()),
    )
}

/// A set's `selector.matchLabels`.
fn selector_labels(set: &StatefulSet) -> Option<&BTreeMap<String, String>> {
    set.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
}

/// Whether one of `claims` lacks `set`'s selector labels: then the other sets whose labels it
/// carries could own it too (the rule of [`Stores::slice`] and of `live::Listed::rival_sets`).
pub fn lacks_own_labels<'a>(
    set: &StatefulSet,
    mut claims: impl Iterator<Item = &'a Claim>,
) -> bool {
    claims.any(|c| !carries_labels(c.labels(), selector_labels(set)))
}

/// Whether one of `claims` carries `other`'s selector labels.
pub fn labelled_by<'a>(other: &StatefulSet, mut claims: impl Iterator<Item = &'a Claim>) -> bool {
    claims.any(|c| carries_labels(c.labels(), selector_labels(other)))
}

/// Whether `labels` carry every one of a set's non-empty `matchLabels`.
fn carries_labels(
    labels: &BTreeMap<String, String>,
    match_labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match_labels.is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

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

/// The StatefulSets a pod's change concerns: the one [`set_of_pod`] names, and those whose claims
/// it mounts. A claim of a finished cleanup that another pod mounts is deleted once that pod is
/// gone (`ClaimInUse`): the pod's deletion wakes the set, whatever the pod is named.
pub fn sets_of_pod(pod: &Pod, sets: &Store<StatefulSet>) -> Vec<ObjectRef<StatefulSet>> {
    let mut found: Vec<ObjectRef<StatefulSet>> = set_of_pod(pod).into_iter().collect();
    let Some(ns) = pod.meta().namespace.as_deref() else {
        return found;
    };
    for claim in crate::index::Keys::keys(pod) {
        for set in caches::sets_of_claim_name(ns, &claim, sets) {
            let set = ObjectRef::from(set.as_ref());
            if !found.contains(&set) {
                found.push(set);
            }
        }
    }
    found
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
    caches::sets_of_claim_name(ns, name, sets)
        .iter()
        .map(|s| ObjectRef::from(s.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
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

    #[test]
    fn a_pod_also_wakes_the_sets_whose_claims_it_mounts() {
        let sets = store(vec![
            set("ns", "web", &["data"]),
            set("ns", "db", &["data"]),
            set("other", "web", &["data"]),
        ]);
        let volume = |claim: &str| -> k8s_openapi::api::core::v1::Volume {
            serde_json::from_value(serde_json::json!({
                "name": claim, "persistentVolumeClaim": {"claimName": claim}
            }))
            .expect("volume")
        };
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("backup".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                volumes: Some(vec![
                    volume("data-web-2"),
                    volume("data-web-1"),
                    volume("unrelated"),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let names = |pod: &Pod| -> Vec<String> {
            sets_of_pod(pod, &sets)
                .into_iter()
                .map(|r| r.name)
                .collect()
        };
        assert_eq!(
            names(&pod),
            ["web"],
            "named after no set, it mounts web's claims"
        );
        pod.metadata.annotations =
            Some([(naming::OWNER_ANNOTATION.to_string(), "db".to_string())].into());
        assert_eq!(
            names(&pod),
            ["db", "web"],
            "its own set first, each set once"
        );
    }
}
