//! The cache of every pod, in two forms, so that a cluster of many pods costs little.
//!
//! Observe reads three kinds of pod: the pods that mount a claim (a claim in use is never
//! deleted), the pods of StatefulSets and the pods that look like cleanup pods (their roles), and
//! any other pod named after an ordinal (it holds the name: `crate::scaledown::observe` calls it
//! foreign). Only the first two need more than a name. Most pods of a cluster are of the third kind
//! (Deployments, Jobs, DaemonSets without claims), so those are kept as a name, a UID and a
//! deletion mark under their namespace ([`Named`]: about 0.12 KiB each, where a
//! `PartialObjectMeta` took about 0.55 KiB and a pruned `Pod` 3 KiB or more), and rebuilt as a bare
//! `Pod` only when a pass asks for the pods named after its set. The pods of the first two kinds
//! are held as a [`HeldPod`] (the metadata and the few values `prune_pod` keeps, without
//! k8s-openapi's inline `PodSpec`, `PodStatus` and 3.2 KiB `Volume`s; a StatefulSet pod with one
//! claim took 6.5 KiB as a pruned `Pod`), and rebuilt as that `Pod` when a pass reads them.
//!
//! Pod-bound claims (`crate::podbound`) read no more: the pod a claim names (its UID, and whether a
//! StatefulSet owns it: such a pod is kept in full) and the pods that mount the claim (kept in full,
//! with their phase).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use tokio::sync::watch;

use super::held::HeldPod;
use crate::index::Index;
use crate::naming;

/// Every pod: in full (pruned by `prune_pod`, held compact) when observe reads more than its name,
/// else by name.
#[derive(Clone, Default)]
pub struct PodCache {
    full: Index<HeldPod>,
    named: Named,
}

/// A pod known by its name only: its UID and whether it is being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NamedPod {
    uid: Box<str>,
    deleting: bool,
}

impl NamedPod {
    /// The pod as a `Pod` with only that metadata (its deletion mark as the epoch).
    fn bare(&self, ns: &str, name: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(ns.to_string()),
                uid: Some(self.uid.to_string()),
                deletion_timestamp: self.deleting.then(|| Time(Default::default())),
                ..Default::default()
            },
            ..Default::default()
        })
    }
}

/// namespace → name → pod.
type ByNamespace = HashMap<Box<str>, BTreeMap<Box<str>, NamedPod>>;

#[derive(Default)]
struct NamedInner {
    pods: ByNamespace,
    /// The pods of a relist, swapped in at its end (lookups never see half a relist).
    relist: Option<ByNamespace>,
}

/// The pods kept by name: the same events and lookups as an [`Index`], without an `ObjectMeta` per
/// pod.
#[derive(Clone)]
struct Named {
    inner: Arc<RwLock<NamedInner>>,
    ready: watch::Sender<bool>,
}

impl Default for Named {
    fn default() -> Self {
        Named {
            inner: Arc::default(),
            ready: watch::Sender::new(false),
        }
    }
}

fn insert(pods: &mut ByNamespace, pod: &Pod) {
    let meta = pod.meta();
    let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return;
    };
    let named = NamedPod {
        uid: meta.uid.as_deref().unwrap_or_default().into(),
        deleting: meta.deletion_timestamp.is_some(),
    };
    match pods.get_mut(ns) {
        Some(names) => names.insert(name.into(), named),
        None => pods
            .entry(ns.into())
            .or_default()
            .insert(name.into(), named),
    };
}

impl Named {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NamedInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, NamedInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn apply(&self, event: &Event<Pod>) {
        let mut inner = self.write();
        match event {
            Event::Init => inner.relist = Some(HashMap::new()),
            Event::InitApply(pod) => {
                if let Some(relist) = inner.relist.as_mut() {
                    insert(relist, pod);
                }
            }
            Event::InitDone => {
                inner.pods = inner.relist.take().unwrap_or_default();
                drop(inner);
                self.ready.send_replace(true);
            }
            Event::Apply(pod) => insert(&mut inner.pods, pod),
            Event::Delete(pod) => {
                drop(inner);
                self.remove(pod);
            }
        }
    }

    fn remove(&self, pod: &Pod) {
        let (Some(ns), Some(name)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
        ) else {
            return;
        };
        let mut inner = self.write();
        if let Some(names) = inner.pods.get_mut(ns) {
            names.remove(name);
            if names.is_empty() {
                inner.pods.remove(ns);
            }
        }
    }

    /// The pods of `ns` whose names start with `prefix`, by name, as bare pods.
    fn prefixed(&self, ns: &str, prefix: &str) -> Vec<Arc<Pod>> {
        let inner = self.read();
        let Some(names) = inner.pods.get(ns) else {
            return Vec::new();
        };
        names
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, pod)| pod.bare(ns, name))
            .collect()
    }

    /// The pod `name` of `ns`, as a bare pod.
    fn get(&self, ns: &str, name: &str) -> Option<Arc<Pod>> {
        let inner = self.read();
        Some(inner.pods.get(ns)?.get(name)?.bare(ns, name))
    }

    fn len(&self) -> usize {
        self.read().pods.values().map(BTreeMap::len).sum()
    }

    async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in self, so this only ends with the value set.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// Whether observe reads more of `pod` than its name: it mounts a claim, belongs to a
/// StatefulSet, or looks like a cleanup pod. These marks can change on a running pod (owners and
/// labels can be edited), so every change of a pod is sorted again.
pub fn needs_spec(pod: &Pod) -> bool {
    let mounts_claim = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.persistent_volume_claim.is_some());
    let of_a_set = pod
        .owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet");
    mounts_claim
        || of_a_set
        || pod.labels().contains_key(naming::CLEANUP_LABEL)
        || pod.annotations().contains_key(naming::OWNER_ANNOTATION)
}

impl PodCache {
    /// Applies one event of the pod watcher, sorting each pod into its form.
    pub fn apply(&self, event: &Event<Pod>) {
        match event {
            Event::Init => {
                self.full.apply(&Event::Init);
                self.named.apply(&Event::Init);
            }
            Event::InitDone => {
                self.full.apply(&Event::InitDone);
                self.named.apply(&Event::InitDone);
            }
            Event::InitApply(pod) if needs_spec(pod) => {
                self.full.apply(&Event::InitApply(HeldPod::new(pod)))
            }
            Event::InitApply(_) => self.named.apply(event),
            Event::Apply(pod) if needs_spec(pod) => {
                self.named.remove(pod);
                self.full.insert(Arc::new(HeldPod::new(pod)));
            }
            Event::Apply(pod) => {
                self.full.remove(pod);
                self.named.apply(event);
            }
            Event::Delete(pod) => {
                self.full.remove(pod);
                self.named.remove(pod);
            }
        }
    }

    /// The pods of `ns` whose names start with `prefix`: the named ones as bare pods (name, UID,
    /// deletion mark).
    pub fn prefixed(&self, ns: &str, prefix: &str) -> Vec<Arc<Pod>> {
        let mut pods = whole(self.full.prefixed(ns, prefix));
        pods.extend(self.named.prefixed(ns, prefix));
        pods
    }

    /// The pod `name` of `ns`: in full, or bare (name, UID, deletion mark) if it is kept by name.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<Pod>> {
        let full = self.full.get(ns, name).map(|held| Arc::new(held.pod()));
        full.or_else(|| self.named.get(ns, name))
    }

    /// The pods of `ns` that mount the claim `claim`.
    pub fn users(&self, ns: &str, claim: &str) -> Vec<Arc<Pod>> {
        whole(self.full.keyed(ns, claim))
    }

    /// How many pods are held in each form: (full, named).
    pub fn counts(&self) -> (usize, usize) {
        (self.full.len(), self.named.len())
    }

    /// Waits until the pod cache has its first full list.
    pub async fn wait_ready(&self) {
        self.full.wait_ready().await;
        self.named.wait_ready().await;
    }
}

/// The held pods as the pruned pods they were made from.
fn whole(held: Vec<Arc<HeldPod>>) -> Vec<Arc<Pod>> {
    held.iter().map(|h| Arc::new(h.pod())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    fn plain(name: &str) -> Pod {
        pod(
            json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
            "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
    }

    fn mounting(name: &str, claim: &str) -> Pod {
        pod(
            json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")},
            "spec": {"containers": [], "volumes": [
                {"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}}),
        )
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    fn listed(pods: Vec<Pod>) -> PodCache {
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        for p in pods {
            cache.apply(&Event::InitApply(p));
        }
        cache.apply(&Event::InitDone);
        cache
    }

    #[test]
    fn only_pods_observe_reads_are_kept_whole() {
        let mut cleanup = plain("web-3");
        cleanup
            .labels_mut()
            .insert(naming::CLEANUP_LABEL.into(), "web-3".into());
        let owned = pod(
            json!({"metadata": {"name": "web-0", "namespace": "ns", "uid": "s0",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
            "uid": "set", "controller": true}]}}),
        );
        let cache = listed(vec![
            plain("web-2"),
            plain("web-frontend-7d9f-abcde"),
            mounting("reader", "data-web-1"),
            cleanup,
            owned,
        ]);
        assert_eq!(cache.counts(), (3, 2));
        assert_eq!(names(&cache.users("ns", "data-web-1")), ["reader"]);
        let pods = cache.prefixed("ns", "web-");
        assert_eq!(
            names(&pods),
            ["web-0", "web-3", "web-2", "web-frontend-7d9f-abcde"]
        );
        let bare = &pods[2];
        assert_eq!(bare.uid().as_deref(), Some("u-web-2"));
        assert!(bare.spec.is_none() && bare.labels().is_empty());
        let got = |name: &str| {
            let pod = cache.get("ns", name)?;
            Some((pod.uid(), !pod.owner_references().is_empty()))
        };
        assert_eq!(
            got("web-0"),
            Some((Some("s0".into()), true)),
            "kept in full"
        );
        assert_eq!(
            got("web-2"),
            Some((Some("u-web-2".into()), false)),
            "kept by name"
        );
        assert_eq!(got("web-9"), None);
    }

    #[test]
    fn a_pod_moves_between_forms_when_its_marks_change() {
        let cache = listed(vec![plain("web-2")]);
        let mut marked = plain("web-2");
        marked
            .annotations_mut()
            .insert(naming::OWNER_ANNOTATION.into(), "web".into());
        cache.apply(&Event::Apply(marked.clone()));
        assert_eq!(cache.counts(), (1, 0));
        assert!(cache.prefixed("ns", "web-")[0].spec.is_some());
        cache.apply(&Event::Apply(plain("web-2")));
        assert_eq!(cache.counts(), (0, 1));
        cache.apply(&Event::Delete(plain("web-2")));
        assert_eq!(cache.counts(), (0, 0));
        assert!(cache.prefixed("ns", "web-").is_empty());
    }

    #[test]
    fn a_relist_replaces_the_named_pods_at_its_end() {
        let cache = listed(vec![plain("web-2")]);
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(plain("web-3")));
        // Mid-relist, lookups still see the last complete list.
        assert_eq!(names(&cache.prefixed("ns", "web-")), ["web-2"]);
        cache.apply(&Event::InitDone);
        assert_eq!(names(&cache.prefixed("ns", "web-")), ["web-3"]);
        assert_eq!(cache.counts(), (0, 1));
    }

    #[test]
    fn a_deleting_named_pod_keeps_its_mark() {
        let mut going = plain("web-2");
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        let cache = listed(vec![going]);
        assert!(
            cache.prefixed("ns", "web-")[0]
                .metadata
                .deletion_timestamp
                .is_some()
        );
    }
}
