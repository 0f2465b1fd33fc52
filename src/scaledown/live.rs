//! Live reads, straight from the API server: the set a confirmed pass decides on and the rest of
//! its namespace (`reconcile`), and what `kubectl scaledown status` shows.

use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::time::Instant;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::coalesce::Coalesce;
use crate::error::{Error, Result};
use crate::index::Keys;
use crate::metrics::Metrics;
use crate::naming::{self, Ordinals};
use crate::scaledown::observe::SetFacts;
use crate::scaledown::watch::{Slice, labelled_by, lacks_own_labels, ordinals};

/// Live lists of namespaces, each shared by the passes that asked for it before it was sent
/// (`crate::coalesce`): the claim deletes of many cleanups that end together in one namespace wait
/// for one list instead of sending one each.
/// Each list is timed into `metrics`, with the passes it served and how long each waited for it.
pub struct NamespaceLists {
    client: Client,
    metrics: Arc<Metrics>,
    prune_set: fn(&mut StatefulSet),
    reads: Coalesce<String, Listed, Error>,
}

impl NamespaceLists {
    /// Lists read through `client`, timed into `metrics`; their StatefulSets are pruned as the
    /// set cache prunes them with `--inherit-scheduling` at `inherit_scheduling`, so that a set
    /// taken from a list gives the facts its cached copy gives.
    pub fn new(client: Client, metrics: Arc<Metrics>, inherit_scheduling: bool) -> Self {
        NamespaceLists {
            client,
            metrics,
            prune_set: crate::caches::set_pruner(inherit_scheduling),
            reads: Coalesce::default(),
        }
    }

    /// The claims, pods and StatefulSets of `ns`, listed after this call began.
    pub async fn list(&self, ns: &str) -> Result<Arc<Listed>> {
        let asked = Instant::now();
        let client = self.client.clone();
        let metrics = self.metrics.clone();
        let owned = ns.to_string();
        let prune_set = self.prune_set;
        let answer = self
            .reads
            .get_counted(ns.to_string(), move |callers| async move {
                metrics.namespace_list_shared(callers);
                list_namespace_timed(&client, &owned, prune_set, Some(&metrics)).await
            })
            .await
            .map_err(Error::Shared);
        self.metrics
            .namespace_list_waited(asked.elapsed().as_secs_f64());
        answer
    }
}

/// The claims, pods, cleanup pods and StatefulSets of a namespace, read from the API server just
/// now.
pub struct Listed {
    /// The claims of the namespace (metadata).
    pub claims: Vec<Arc<kube::core::PartialObjectMeta<PersistentVolumeClaim>>>,
    /// Pruned as the pod cache is (`caches::prune_pod`).
    pub pods: Vec<Arc<Pod>>,
    /// Whole, as the cleanup-pod cache keeps them.
    pub cleanup_pods: Vec<Arc<Pod>>,
    /// The StatefulSets of the namespace, pruned as the cache prunes them: whether another set
    /// still wants a claim's ordinal is a fact a claim delete depends on, so it is read live too.
    pub sets: Vec<Arc<StatefulSet>>,
}

impl Listed {
    /// The StatefulSet `name` of this read if it is still the object `uid`.
    pub fn set(&self, name: &str, uid: &str) -> Option<Arc<StatefulSet>> {
        self.sets
            .iter()
            .find(|s| s.name_any() == name && s.uid().as_deref() == Some(uid))
            .cloned()
    }

    /// The other sets `set`'s claims could belong to: those whose claim templates give one of
    /// its claims' names, and those whose selector labels one of them carries (what the cache's
    /// slice holds, from this read).
    pub fn rival_sets(&self, set: &StatefulSet) -> Vec<Arc<StatefulSet>> {
        let name = set.name_any();
        let own: Vec<_> = self
            .claims
            .iter()
            .filter(|c| crate::caches::makes_claim(set, &c.name_any()))
            .map(|c| &**c)
            .collect();
        // As in the cache's slice: sets by label only when a claim lacks this set's labels.
        let by_labels = lacks_own_labels(set, own.iter().copied());
        self.sets
            .iter()
            .filter(|other| other.name_any() != name)
            .filter(|other| {
                own.iter()
                    .any(|c| crate::caches::makes_claim(other, &c.name_any()))
                    || (by_labels && labelled_by(other, own.iter().copied()))
            })
            .cloned()
            .collect()
    }

    /// The ordinals that the names of the listed claims and pods give as `set`'s.
    pub fn ordinals(&self, set: &StatefulSet) -> Ordinals {
        ordinals(set, &self.claims, &self.pods)
    }

    /// What a pass over `set` looks at, from this read, chosen as the cache's slice chooses it
    /// (`Stores::slice`): the claims named by its claim templates, its pods and the pods that
    /// mount those claims, its cleanup pods, the sets its claims could belong to
    /// ([`Listed::rival_sets`]), and the ordinals. Only that is kept: the namespace's list is
    /// freed as soon as the passes it served have taken their slices.
    pub fn slice(&self, set: &StatefulSet) -> Slice {
        let name = set.name_any();
        let prefixes: Vec<String> = crate::caches::claim_templates(set)
            .map(|t| naming::claim_prefix(t, &name))
            .collect();
        let claims: Vec<_> = self
            .claims
            .iter()
            .filter(|c| prefixes.iter().any(|p| name_of(&c.metadata).starts_with(p)))
            .cloned()
            .collect();
        let names: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
        let pod_prefix = naming::pod_prefix(&name);
        let pods: Vec<_> = self
            .pods
            .iter()
            .filter(|p| {
                name_of(&p.metadata).starts_with(&pod_prefix)
                    || p.keys().iter().any(|k| names.contains(k))
            })
            .cloned()
            .collect();
        let cleanup_pods = (self.cleanup_pods.iter())
            .filter(|p| name_of(&p.metadata).starts_with(&pod_prefix))
            .cloned()
            .collect();
        Slice {
            sets: self.rival_sets(set),
            ordinals: ordinals(set, &claims, &pods),
            claims,
            pods,
            cleanup_pods,
        }
    }
}

/// The StatefulSet `set` describes, read just now and pruned as the cache prunes it (with
/// `--inherit-scheduling`: `inherit_scheduling`), so that a live read gives the facts a cached one
/// gives; `None` if it is gone or was replaced by a new one (another UID).
pub async fn read_set(
    client: &Client,
    set: &SetFacts,
    inherit_scheduling: bool,
) -> Result<Option<StatefulSet>> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &set.namespace);
    // The set of the pass: the pass runner names it when the pass fails.
    let live = sets
        .get_opt(&set.name)
        .await
        .map_err(Error::kube_own("get statefulset"))?;
    Ok(live
        .filter(|l| l.uid().as_deref() == Some(set.uid.as_str()))
        .map(|mut l| {
            crate::caches::prune_set_for(&mut l, inherit_scheduling);
            l
        }))
}

/// The read of a set made before its namespace is listed ([`first_read`]).
pub enum First {
    /// The set is alive in the caches: it is taken from the namespace's list.
    FromList,
    /// The set, read on its own.
    Read(Arc<StatefulSet>),
    /// The set is gone or was replaced.
    Gone,
}

/// The live read of `set`, made before its namespace is listed, if the caches show it being
/// deleted. How its deletion propagates is judged from its finalizers and its pods' owners, and
/// the garbage collector takes the owners off the pods before it removes the `orphan` finalizer:
/// only pods listed after the set show an orphan deletion for what it is. A set the caches show
/// alive is taken from the namespace's list (`FromList`); if that list shows it being deleted, the
/// caches and the live read disagree and the pass does nothing (`reconcile`'s `confirm`).
pub async fn first_read(
    client: &Client,
    set: &StatefulSet,
    facts: &SetFacts,
    inherit_scheduling: bool,
) -> Result<First> {
    if set.metadata.deletion_timestamp.is_none() {
        return Ok(First::FromList);
    }
    Ok(match read_set(client, facts, inherit_scheduling).await? {
        Some(live) => First::Read(Arc::new(live)),
        None => First::Gone,
    })
}

/// Lists the claims (metadata), pods and StatefulSets of `ns`: what a live observation of a set
/// needs, the set included. Used before a release, a claim delete and the finalizer's release, and
/// by `kubectl scaledown status`.
pub async fn list_namespace(client: &Client, ns: &str) -> Result<Listed> {
    list_namespace_timed(client, ns, crate::caches::prune_set, None).await
}

/// [`list_namespace`], each list and the whole read timed into `metrics` if given.
///
/// The claims are listed first, alone; the pods and the StatefulSets then at once. Every claim is
/// judged against the pods that mount it, its set and the other sets that could own it, so both
/// lists must be at least as new as the claim list: a pod mounting a listed claim, or a set (or a
/// scale-up) wanting it, that existed when the claims were read is always seen. The order of the
/// pods and the sets does not matter: this controller's own creates and records were all made
/// before the pass that reads began (passes over one set never overlap), so both lists show them;
/// what others change in between (a scale-up, a new stateful pod) can only make an ordinal look
/// wanted or in use, never orphaned. Sending them together takes the longer of the two instead of
/// their sum.
async fn list_namespace_timed(
    client: &Client,
    ns: &str,
    prune_set: fn(&mut StatefulSet),
    metrics: Option<&Metrics>,
) -> Result<Listed> {
    let all = ListParams::default();
    let started = Instant::now();
    let timed = |kind: &'static str, since: Instant| {
        if let Some(m) = metrics {
            m.namespace_listed(kind, since.elapsed().as_secs_f64());
        }
    };
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claims = claims_api
        .list_metadata(&all)
        .await
        .map_err(Error::kube("list claims", ns))?
        .items;
    timed("claims", started);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sets_api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods = async {
        let at = Instant::now();
        let listed = list_pods_pruned(&pods_api).await;
        timed("pods", at);
        listed.map_err(Error::kube("list pods", ns))
    };
    let sets = async {
        let at = Instant::now();
        let listed = sets_api.list(&all).await;
        timed("statefulsets", at);
        listed.map_err(Error::kube("list statefulsets", ns))
    };
    let ((pods, cleanup), sets) = futures::future::try_join(pods, sets).await?;
    let mut sets = sets.items;
    sets.iter_mut().for_each(prune_set);
    timed("all", started);
    Ok(Listed {
        claims: arcs(claims),
        pods: arcs(pods),
        cleanup_pods: arcs(cleanup),
        sets: arcs(sets),
    })
}

/// Pods per page of a live namespace list (kube's default page size). Unpaged, a list held its
/// whole body and every pod unpruned at once, for each namespace being listed (ten at once in
/// `sets5000`); a page of 500 costs one request per 500 pods, shared by every pass the list
/// serves.
const LIVE_PAGE_SIZE: u32 = 500;

/// The pods of `api`'s namespace, pruned as the pod cache prunes them, and its cleanup pods whole,
/// read in pages of [`LIVE_PAGE_SIZE`]: a page is pruned as it arrives, so one page's JSON and
/// unpruned pods are the most a list holds beyond what it keeps. The pages are one snapshot (the
/// continue token carries the first page's resourceVersion), the first sent after the call.
async fn list_pods_pruned(api: &Api<Pod>) -> kube::Result<(Vec<Pod>, Vec<Pod>)> {
    let mut params = ListParams::default().limit(LIVE_PAGE_SIZE);
    let (mut pods, mut cleanup) = (Vec::new(), Vec::new());
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.filter(|token| !token.is_empty());
        for mut pod in page.items {
            if pod.labels().contains_key(naming::CLEANUP_LABEL) {
                cleanup.push(pod.clone());
            }
            crate::caches::prune_pod(&mut pod);
            pods.push(pod);
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((pods, cleanup)),
        }
    }
}

fn name_of(meta: &kube::api::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn arcs<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}

#[cfg(test)]
mod tests;
