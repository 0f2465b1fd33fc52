//! The shared watches: StatefulSets, claims (metadata only) and pods, each watched and cached once
//! however many controllers read them (the scale-down controller and pod-bound claims), and each
//! change fanned out to every controller that subscribed to that kind.
//!
//! What is kept of each object is what its readers read, no more: a StatefulSet without its pod
//! template (but the scheduling fields a cleanup pod inherits, for the sets that inherit them),
//! labels, managed fields, claim templates but their names and status but two fields
//! ([`prune_set`]); a claim's metadata without managed fields and with only our
//! annotations ([`prune_claim`]); a pod pruned to what observe reads ([`prune_pod`]) and held
//! compact, most pods by name only ([`PodCache`]). Claims and pods live in [`Index`]es, so that a
//! pass finds what it needs by name, name prefix or mounted claim without copying whole caches.
//!
//! Every watch runs under [`crate::resuming`]: after an error it waits a short, capped backoff and
//! goes on from its last resourceVersion (lists again only after 410 Gone, then at once), so the
//! controllers are back within seconds of the API server, and the changes they missed arrive as
//! events. [`Caches::new`] returns the caches and their [`Feeds`], the watches that fill them:
//! every subscription is made before the feeds run, so that no subscriber misses the first list.

mod feed;
mod held;
mod pods;
use held::HeldPod;

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::index::{Index, Keys};
use crate::naming;
pub use feed::Topic;
use feed::feed;
pub use pods::{PodCache, needs_spec};

/// A claim as cached: its metadata.
pub type Claim = PartialObjectMeta<PersistentVolumeClaim>;

/// Objects per page of the watches' lists (kube's default is 500). A page is held twice while it
/// is decoded (the body and the objects), so the page bounds the peak at start more than the
/// caches do; 100 costs a few more requests at start.
pub const LIST_PAGE_SIZE: u32 = 100;

/// How often a wait for cache readiness looks again.
const READY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// The shared caches, and the change streams controllers subscribe to.
#[derive(Clone)]
pub struct Caches {
    /// Every StatefulSet (full objects: spec and annotations are read).
    pub sets: Store<StatefulSet>,
    /// Every claim, as metadata, indexed per namespace.
    pub claims: Index<Claim>,
    /// Every pod: pruned by [`prune_pod`] where a reader needs more than its name, else by name.
    pub pods: PodCache,
    set_changes: Topic<StatefulSet>,
    claim_changes: Topic<Claim>,
    pod_changes: Topic<Pod>,
}

/// The watches that fill [`Caches`], until [`Feeds::run`] drives them.
pub struct Feeds {
    sets: BoxStream<'static, watcher::Result<watcher::Event<StatefulSet>>>,
    sets_writer: reflector::store::Writer<StatefulSet>,
    claims: BoxStream<'static, watcher::Result<watcher::Event<Claim>>>,
    claim_store: Option<reflector::store::Writer<Claim>>,
    pods: BoxStream<'static, watcher::Result<watcher::Event<Pod>>>,
    caches: Caches,
}

impl Caches {
    /// The caches of namespace `ns` (or all). With `claim_store`, the claims are also kept in that
    /// kube store (a Controller over claims reads its objects from one), as the same objects the
    /// index holds. `inherit_scheduling`: `--inherit-scheduling` (see [`prune_set_for`]).
    pub fn new(
        client: &Client,
        ns: Option<&str>,
        claim_store: Option<reflector::store::Writer<Claim>>,
        inherit_scheduling: bool,
    ) -> (Caches, Feeds) {
        let all = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        let (sets, sets_writer) = reflector::store();
        let caches = Caches {
            sets,
            claims: Index::default(),
            pods: PodCache::default(),
            set_changes: Topic::default(),
            claim_changes: Topic::default(),
            pod_changes: Topic::default(),
        };
        let feeds = Feeds {
            sets: resuming(
                "statefulsets",
                api(client, ns),
                all.clone(),
                set_pruner(inherit_scheduling),
            )
            .boxed(),
            sets_writer,
            claims: resuming("claims", api(client, ns), all.clone(), prune_claim).boxed(),
            claim_store,
            pods: resuming("pods", api(client, ns), all, prune_pod).boxed(),
            caches: caches.clone(),
        };
        (caches, feeds)
    }

    /// Waits until every cache has its first full list.
    pub async fn ready(&self) -> Result<()> {
        sets_ready(&self.sets).await?;
        self.claims.wait_ready().await;
        self.pods.wait_ready().await;
        Ok(())
    }

    /// StatefulSets as they are added or changed (also those of every list).
    pub fn set_changes(&self) -> impl Stream<Item = Arc<StatefulSet>> + Send + 'static {
        self.set_changes.subscribe(false)
    }

    /// Claims as they are added, changed and (with `deletes`) deleted.
    pub fn claim_changes(&self, deletes: bool) -> impl Stream<Item = Arc<Claim>> + Send + 'static {
        self.claim_changes.subscribe(deletes)
    }

    /// Claims as they are deleted.
    pub fn claim_deletes(&self) -> impl Stream<Item = Arc<Claim>> + Send + 'static {
        self.claim_changes.subscribe_deletes()
    }

    /// Pods as they are added, changed and deleted, pruned as cached.
    pub fn pod_changes(&self) -> impl Stream<Item = Arc<Pod>> + Send + 'static {
        self.pod_changes.subscribe(true)
    }

    /// The StatefulSets of `ns` whose claim templates give a claim the name `claim`: a handful of
    /// lookups by name, whatever the number of sets.
    pub fn sets_of_claim(&self, ns: &str, claim: &str) -> Vec<Arc<StatefulSet>> {
        sets_of_claim_name(ns, claim, &self.sets)
    }
}

impl Feeds {
    /// Drives the watches until `stop`: each event updates its cache, then goes to the subscribers.
    pub async fn run(self, stop: CancellationToken) {
        let Feeds {
            sets,
            mut sets_writer,
            claims,
            claim_store,
            pods,
            caches,
        } = self;
        let claim_index = caches.claims.clone();
        let apply_claim = claim_applier(claim_index, claim_store);
        let cached_pods = caches.pods.clone();
        let all = futures::future::join3(
            feed(
                sets,
                move |e| sets_writer.apply_watcher_event(e),
                caches.set_changes,
            ),
            feed(claims, apply_claim, caches.claim_changes),
            feed(pods, move |e| cached_pods.apply(e), caches.pod_changes),
        );
        tokio::select! {
            _ = all => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// Applies a claim event to the index, and to the kube store if there is one: then the index holds
/// the store's objects (one copy of each claim).
fn claim_applier(
    index: Index<Claim>,
    store: Option<reflector::store::Writer<Claim>>,
) -> impl FnMut(&watcher::Event<Claim>) + Send + 'static {
    let mut store = store.map(|writer| (writer.as_reader(), writer));
    move |event| {
        use watcher::Event;
        let Some((reader, writer)) = store.as_mut() else {
            return index.apply(event);
        };
        writer.apply_watcher_event(event);
        match event {
            Event::Apply(claim) => {
                if let Some(held) = reader.get(&ObjectRef::from_obj(claim)) {
                    index.insert(held);
                }
            }
            Event::Delete(claim) => index.remove(claim),
            Event::InitDone => index.replace(reader.state()),
            Event::Init | Event::InitApply(_) => {}
        }
    }
}

/// Waits until `sets` has its first full list.
///
/// A store's readiness wakes only the last task that waited on it (kube-runtime keeps a single
/// oneshot receiver for all waiters), and the Controller waits on the StatefulSet store too. So
/// readiness is polled again on a short tick instead of trusting one wake-up.
pub async fn sets_ready(sets: &Store<StatefulSet>) -> Result<()> {
    loop {
        match tokio::time::timeout(READY_POLL, sets.wait_until_ready()).await {
            Ok(result) => return result.map_err(|_| Error::CacheNotReady("statefulset")),
            Err(_elapsed) => continue,
        }
    }
}

/// An API of `K` in `namespace`, or in all namespaces.
pub fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A watch of `api` that restores itself, its objects pruned by `prune` before they are cached.
pub fn resuming<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    prune: fn(&mut K),
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    crate::resuming::resuming(what, move || {
        watcher(api.clone(), config.clone()).modify(prune)
    })
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

impl Keys for Claim {}

/// The names of the claim templates of `set`.
pub fn claim_templates(set: &StatefulSet) -> impl Iterator<Item = &str> {
    set.spec
        .iter()
        .flat_map(|spec| spec.volume_claim_templates.iter().flatten())
        .filter_map(|t| t.metadata.name.as_deref())
}

/// Whether one of the claim templates of `set` gives a claim the name `claim` (any ordinal).
pub fn makes_claim(set: &StatefulSet, claim: &str) -> bool {
    let name = set.name_any();
    claim_templates(set).any(|t| naming::claim_ordinal(claim, t, &name).is_some())
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
pub fn sets_of_claim_name(
    ns: &str,
    claim: &str,
    sets: &Store<StatefulSet>,
) -> Vec<Arc<StatefulSet>> {
    candidate_sets(claim)
        .into_iter()
        .filter_map(|name| sets.get(&ObjectRef::new(name).within(ns)))
        .filter(|set| makes_claim(set, claim))
        .collect()
}

/// Prunes a pod to what its readers read: identity, owners, our annotations and label, and of its
/// spec and status what a [`HeldPod`] holds (the claims it mounts, its node, its gates, its phase,
/// reason and start), so the pods read live and those the cache holds have one shape. The rest
/// (containers, env, status details) is dropped so the cache of every pod in the cluster stays
/// small.
pub fn prune_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k == naming::OWNER_ANNOTATION || k == naming::ATTEMPT_ANNOTATION);
    }
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k == naming::CLEANUP_LABEL);
    }
    *pod = HeldPod::new(pod).pod();
}

/// Prunes a StatefulSet to what observe reads: its managed fields, labels, the `kubectl apply` copy
/// of itself, its pod template, all of its claim templates but their names and all of its status
/// but `observedGeneration` and `replicas` are dropped. With a thousand sets these are most of the
/// cache. As [`prune_set_for`] without
/// `--inherit-scheduling`.
pub fn prune_set(set: &mut StatefulSet) {
    prune_set_for(set, false);
}

/// [`prune_set`] with `--inherit-scheduling`.
fn prune_set_inheriting(set: &mut StatefulSet) {
    prune_set_for(set, true);
}

/// The pruning of the StatefulSet watch for `--inherit-scheduling` on or off.
pub fn set_pruner(inherit_scheduling: bool) -> fn(&mut StatefulSet) {
    if inherit_scheduling {
        prune_set_inheriting
    } else {
        prune_set
    }
}

/// Prunes a StatefulSet as [`prune_set`] does, but keeps the scheduling fields of its pod template
/// (`template::inherit::keep_scheduling`) when its cleanup pods inherit them: the set takes part
/// (non-blank template annotation) and its inherit annotation says `scheduling`, or it has none and
/// `inherit_scheduling` is on. Sets that do not inherit cost nothing more. The live read of a set
/// before acting is pruned the same way, so both give the same facts.
pub fn prune_set_for(set: &mut StatefulSet, inherit_scheduling: bool) {
    let keep = inherits_scheduling(set, inherit_scheduling);
    let meta = &mut set.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if let Some(spec) = set.spec.as_mut() {
        let template = std::mem::take(&mut spec.template);
        if keep {
            spec.template.spec = template
                .spec
                .map(crate::template::inherit::keep_scheduling)
                .filter(|kept| *kept != Default::default());
        }
        for claim in spec.volume_claim_templates.iter_mut().flatten() {
            *claim = named_only(claim);
        }
    }
    if let Some(status) = set.status.as_mut() {
        *status = StatefulSetStatus {
            observed_generation: status.observed_generation,
            replicas: status.replicas,
            ..Default::default()
        };
    }
}

/// A claim template as the cache keeps it: its name, the only part anyone reads (every small map
/// of a template, its labels and requests, would take a 544-byte node of its own).
fn named_only(claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Whether the cleanup pods of `set` inherit its scheduling fields (see [`prune_set_for`]).
fn inherits_scheduling(set: &StatefulSet, inherit_scheduling: bool) -> bool {
    use crate::template::inherit::{Inherit, inherit};
    let annotations = set.annotations();
    let takes_part = annotations
        .get(naming::TEMPLATE_ANNOTATION)
        .is_some_and(|t| !t.trim().is_empty());
    let asked = annotations
        .get(naming::INHERIT_ANNOTATION)
        .map(String::as_str);
    takes_part && inherit(asked, inherit_scheduling) == Inherit::Scheduling
}

/// Prunes a claim's metadata to what is read: the scale-down controller's next-attempt annotation
/// and pod-bound's opt-in annotation and record of a wait are the only annotations kept.
pub fn prune_claim(claim: &mut Claim) {
    let keep = [
        naming::NEXT_ATTEMPT_ANNOTATION,
        crate::naming::BOUND_TO_POD_ANNOTATION,
        crate::naming::WAITING_SINCE_ANNOTATION,
    ];
    prune_meta(claim, &keep);
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
mod tests;
