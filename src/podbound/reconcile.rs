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

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::act::Actor;
use super::decide::{Plan, decide};
use super::observe::{ClaimFacts, Fresh, PodRead, observe, read_pods};
use crate::caches::{Caches, Claim, candidate_sets, makes_claim};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::pass::Runner;

/// While a claim waits for its pod to appear, it is looked at again this often.
const WAIT_POLL: Duration = Duration::from_secs(5);
/// A refused or in-use claim is looked at again after this long.
const REFUSED_RECHECK: Duration = Duration::from_secs(60);

/// What every pass over a claim shares.
pub struct Context {
    /// The client of the live reads.
    pub client: Client,
    /// The shared caches: pods and StatefulSets are read from them.
    pub caches: Caches,
    /// The claims (the shared ones, in the kube store the Controller reads from).
    pub claims: Store<Claim>,
    /// The writer.
    pub actor: Actor,
    /// How long a claim waits for its pod to appear (`--pod-bound-grace`).
    pub grace: Duration,
    /// Whether this process leads.
    pub leadership: Arc<Leadership>,
    /// Times, backs off and reports every pass.
    pub runner: Runner<Claim>,
}

impl Context {
    /// The context from its parts.
    pub fn new(
        client: Client,
        (caches, claims): (Caches, Store<Claim>),
        actor: Actor,
        grace: Duration,
        leadership: Arc<Leadership>,
        runner: Runner<Claim>,
    ) -> Self {
        Context {
            client,
            caches,
            claims,
            actor,
            grace,
            leadership,
            runner,
        }
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
                self.actor.attach(&facts, &pods).await?;
                Ok(Action::await_change())
            }
            Plan::Delete => {
                self.actor.delete(&facts).await?;
                Ok(Action::await_change())
            }
            Plan::Record(waiting) => {
                // The record's own change wakes the claim again; the poll is the fallback.
                self.actor.record(&facts, &waiting).await?;
                Ok(Action::requeue(WAIT_POLL))
            }
            Plan::Wait(left) => Ok(Action::requeue(left.min(WAIT_POLL))),
            Plan::Refuse(reason, note) => {
                // Reported once per claim and note (the reporter remembers it, until the claim goes).
                self.actor.refuse(&facts, reason, note).await;
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

/// The reconciler handed to kube's Controller.
pub async fn reconcile(claim: Arc<Claim>, ctx: Arc<Context>) -> Result<Action> {
    ctx.runner.run(&claim, || ctx.pass(&claim)).await
}

/// The error policy handed to kube's Controller: look again when the backoff is over.
pub fn error_policy(claim: Arc<Claim>, _err: &Error, ctx: Arc<Context>) -> Action {
    ctx.runner.error_policy(&claim)
}

#[cfg(test)]
mod tests;
