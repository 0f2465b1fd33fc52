//! One pass over one opted-in claim: observe → decide → confirm (a live list of the namespace's
//! pods and StatefulSets, decide again) → act.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tracing::warn;

use super::act::Binder;
use super::decide::{Plan, decide};
use super::observe::{PodRead, observe, read_pods};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// While a claim waits for its pod to appear, it is looked at again this often.
const WAIT_POLL: Duration = Duration::from_secs(5);
/// A refused or in-use claim is looked at again after this long.
const REFUSED_RECHECK: Duration = Duration::from_secs(60);
const RETRY: Duration = Duration::from_secs(10);

pub struct Context {
    pub client: Client,
    pub binder: Binder,
    pub grace: Duration,
    pub leadership: Arc<Leadership>,
    pub metrics: Arc<Metrics>,
    /// (claim UID, note) of Warnings already published, so a refusal is reported once.
    refused: Mutex<HashSet<(String, String)>>,
    running: AtomicUsize,
}

impl Context {
    pub fn new(
        client: Client,
        binder: Binder,
        grace: Duration,
        leadership: Arc<Leadership>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Context {
            client,
            binder,
            grace,
            leadership,
            metrics,
            refused: Mutex::new(HashSet::new()),
            running: AtomicUsize::new(0),
        }
    }

    pub async fn idle(&self) {
        while self.running.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
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
                let first = self
                    .refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((facts.uid.clone(), note.clone()));
                if first {
                    self.binder.refuse(&facts, reason, note).await;
                }
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
