//! One pass over one opted-in claim: observe → decide on the shared caches → confirm → act.
//!
//! Confirm: a write is carried out only if decided again on a read as fresh as it needs
//! ([`Plan::needs`]). Skipping, waiting and refusing need only the caches, so the passes that
//! repeat (a claim waiting for its pod every 5 s, a refused one every 60 s, every claim when this
//! replica becomes leader) send no request. A binding first lists the named pod by name (field
//! selector) and gets the StatefulSets that could make the claim: the binding is to that pod's UID,
//! and a cache that lags could still hold a pod since replaced by one of the same name. A deletion
//! first lists the namespace's pods, as every pass did before the caches were shared: that no pod
//! of the name exists and none that has not finished mounts the claim is read live, once, right
//! before the delete (which carries the claim's UID and resourceVersion).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::warn;

use super::act::Binder;
use super::decide::{Plan, decide};
use super::observe::{ClaimFacts, Fresh, PodRead, observe, read_pods};
use crate::caches::{Caches, Claim, candidate_sets, makes_claim};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// While a claim waits for its pod to appear, it is looked at again this often.
const WAIT_POLL: Duration = Duration::from_secs(5);
/// A refused or in-use claim is looked at again after this long.
const REFUSED_RECHECK: Duration = Duration::from_secs(60);
const RETRY: Duration = Duration::from_secs(10);

/// Per claim: its UID, and the notes of the Warnings published about it.
type Refused = HashMap<ObjectRef<Claim>, (String, BTreeSet<String>)>;

pub struct Context {
    pub client: Client,
    /// The shared caches: pods and StatefulSets are read from them.
    pub caches: Caches,
    /// The claims (the shared ones, in the kube store the Controller reads from).
    pub claims: Store<Claim>,
    pub binder: Binder,
    pub grace: Duration,
    pub leadership: Arc<Leadership>,
    pub metrics: Arc<Metrics>,
    /// Per claim, its UID and the notes of the Warnings already published about it, so a refusal
    /// is reported once. Forgotten when the claim goes (see [`Context::forget`]).
    refused: Mutex<Refused>,
    running: AtomicUsize,
}

impl Context {
    pub fn new(
        client: Client,
        (caches, claims): (Caches, Store<Claim>),
        binder: Binder,
        grace: Duration,
        leadership: Arc<Leadership>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Context {
            client,
            caches,
            claims,
            binder,
            grace,
            leadership,
            metrics,
            refused: Mutex::new(HashMap::new()),
            running: AtomicUsize::new(0),
        }
    }

    pub async fn idle(&self) {
        while self.running.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Forgets what the passes remember of `claim` (it was deleted).
    pub fn forget(&self, claim: &Claim) {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        let key = ObjectRef::from_obj(claim);
        if refused.get(&key).map(|(uid, _)| uid) == claim.uid().as_ref() {
            refused.remove(&key);
        }
    }

    /// Whether the Warning `note` about `claim` is new. Entries of claims the cache no longer has
    /// (a deletion a relist replaced) are dropped here.
    fn first_refusal(&self, claim: &ClaimFacts, note: &str) -> bool {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        let key = ObjectRef::new(&claim.name).within(&claim.namespace);
        if !refused.contains_key(&key) {
            let held = |r: &ObjectRef<Claim>, uid: &str| {
                self.claims.get(r).and_then(|c| c.uid()).as_deref() == Some(uid)
            };
            refused.retain(|r, (uid, _)| held(r, uid));
        }
        let entry = refused.entry(key).or_default();
        if entry.0 != claim.uid {
            *entry = (claim.uid.clone(), BTreeSet::new());
        }
        entry.1.insert(note.to_string())
    }

    async fn pass(&self, claim: &PartialObjectMeta<PersistentVolumeClaim>) -> Result<Action> {
        if !self.leadership.may_write() {
            return Ok(Action::await_change());
        }
        let facts = observe(claim);
        let mut plan = decide(&facts, &PodRead::NotRead, Timestamp::now(), self.grace);
        // Decided again on a fresher read for as long as the plan needs one (at most three reads:
        // the caches, the named pod, the namespace).
        let mut fresh = None;
        while plan.needs() > fresh {
            fresh = plan.needs();
            let read = self.read(&facts, fresh.unwrap_or(Fresh::Cached)).await?;
            plan = decide(&facts, &read, Timestamp::now(), self.grace);
        }
        match plan {
            Plan::Skip | Plan::ReadPods => Ok(Action::await_change()),
            Plan::Attach(pods) => {
                self.binder.attach(&facts, &pods).await?;
                Ok(Action::await_change())
            }
            Plan::Delete => {
                self.binder.delete(&facts).await?;
                Ok(Action::await_change())
            }
            Plan::Wait(left) => Ok(Action::requeue(left.min(WAIT_POLL))),
            Plan::Refuse(reason, note) => {
                if self.first_refusal(&facts, &note) {
                    self.binder.refuse(&facts, reason, note).await;
                }
                Ok(Action::requeue(REFUSED_RECHECK))
            }
        }
    }

    /// The pod the claim names, the pods that mount it and the StatefulSets that could make it:
    /// from the caches, or read live as `fresh` says.
    async fn read(&self, facts: &ClaimFacts, fresh: Fresh) -> Result<PodRead> {
        let (ns, claim) = (facts.namespace.as_str(), facts.name.as_str());
        let name = facts.pod.as_deref().unwrap_or_default();
        let pods = &self.caches.pods;
        let (named, users, sets) = match fresh {
            Fresh::Cached => (
                pods.get(ns, name),
                pods.users(ns, claim),
                self.caches.sets_of_claim(ns, claim),
            ),
            Fresh::Named => {
                let named = self.list_pods(ns, Some(name)).await?.into_iter().next();
                let sets = self.live_sets(ns, claim).await?;
                (named, pods.users(ns, claim), sets)
            }
            Fresh::Namespace => {
                let all = self.list_pods(ns, None).await?;
                let named = all.iter().find(|p| p.name_any() == name).cloned();
                (named, all, self.live_sets(ns, claim).await?)
            }
        };
        Ok(read_pods(name, claim, named.as_deref(), &users, &sets))
    }

    /// The pods of `ns` (only the one of that name with `name`, by field selector: a list, for
    /// which the controller has the right, rather than a get).
    async fn list_pods(&self, ns: &str, name: Option<&str>) -> Result<Vec<Arc<Pod>>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let params = match name {
            Some(name) => ListParams::default().fields(&format!("metadata.name={name}")),
            None => ListParams::default(),
        };
        let list = api
            .list(&params)
            .await
            .map_err(Error::kube("list pods", ns))?;
        Ok(list.items.into_iter().map(Arc::new).collect())
    }

    /// The StatefulSets of `ns` that make a claim of this name, read by name (a handful of gets,
    /// none for a claim not named `<template>-<set>-<ordinal>`).
    async fn live_sets(&self, ns: &str, claim: &str) -> Result<Vec<Arc<StatefulSet>>> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
        let mut sets = Vec::new();
        for name in candidate_sets(claim) {
            let set = api
                .get_opt(name)
                .await
                .map_err(Error::kube("get statefulset", name))?;
            sets.extend(set.filter(|s| makes_claim(s, claim)).map(Arc::new));
        }
        Ok(sets)
    }
}

struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub async fn reconcile(
    claim: Arc<PartialObjectMeta<PersistentVolumeClaim>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    ctx.running.fetch_add(1, Ordering::SeqCst);
    let _running = Running(&ctx.running);
    let started = std::time::Instant::now();
    let result = ctx.pass(&claim).await;
    ctx.metrics.reconciled(
        started.elapsed().as_secs_f64(),
        result.as_ref().err().map(Error::category),
    );
    result
}

pub fn error_policy(
    claim: Arc<PartialObjectMeta<PersistentVolumeClaim>>,
    err: &Error,
    _ctx: Arc<Context>,
) -> Action {
    warn!(claim = %claim.name_any(), namespace = ?claim.namespace(), category = err.category().as_str(), retry_in = ?RETRY, "pod-bound claim pass failed: {err}");
    Action::requeue(RETRY)
}
