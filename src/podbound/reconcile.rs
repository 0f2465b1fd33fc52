//! One pass over one opted-in claim: observe → decide → confirm (a live list of the namespace's
//! pods and StatefulSets, decide again) → act.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;

use super::act::Binder;
use super::decide::{Plan, decide};
use super::observe::{PodRead, observe, read_pods};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::pass::Runner;

/// While a claim waits for its pod to appear, it is looked at again this often.
const WAIT_POLL: Duration = Duration::from_secs(5);
/// A refused or in-use claim is looked at again after this long.
const REFUSED_RECHECK: Duration = Duration::from_secs(60);

pub struct Context {
    pub client: Client,
    pub binder: Binder,
    pub grace: Duration,
    pub leadership: Arc<Leadership>,
    /// Times, backs off and reports every pass.
    pub runner: Runner<Claim>,
}

type Claim = PartialObjectMeta<PersistentVolumeClaim>;

impl Context {
    pub fn new(
        client: Client,
        binder: Binder,
        grace: Duration,
        leadership: Arc<Leadership>,
        runner: Runner<Claim>,
    ) -> Self {
        Context {
            client,
            binder,
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
        if plan == Plan::ReadPods {
            let pods = self.list::<Pod>(&facts.namespace, "list pods").await?;
            let sets = self
                .list::<StatefulSet>(&facts.namespace, "list statefulsets")
                .await?;
            let pod = facts.pod.clone().unwrap_or_default();
            let read = read_pods(&pod, &facts.name, &pods, &sets);
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
                // Reported once per claim and note (the reporter remembers it).
                self.binder.refuse(&facts, reason, note).await;
                Ok(Action::requeue(REFUSED_RECHECK))
            }
        }
    }

    async fn list<K>(&self, ns: &str, what: &'static str) -> Result<Vec<K>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        Ok(api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(what, ns))?
            .items)
    }
}

/// The reconciler handed to kube's Controller.
pub async fn reconcile(claim: Arc<Claim>, ctx: Arc<Context>) -> Result<Action> {
    ctx.runner.run(&claim, ctx.pass(&claim)).await
}

pub fn error_policy(claim: Arc<Claim>, _err: &Error, ctx: Arc<Context>) -> Action {
    ctx.runner.error_policy(&claim)
}
