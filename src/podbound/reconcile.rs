//! One pass over one opted-in claim: observe → decide → confirm (a live list of the namespace's
//! pods, decide again) → act.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        if plan == Plan::ReadPod {
            let pods = self.list_pods(&facts.namespace).await?;
            let pod = facts.pod.clone().unwrap_or_default();
            let read = read_pods(&pod, &facts.name, &pods);
            plan = decide(&facts, &read, Timestamp::now(), self.grace);
        }
        match plan {
            Plan::Skip | Plan::ReadPod => Ok(Action::await_change()),
            Plan::Attach { pod, uid } => {
                self.binder.attach(&facts, &pod, &uid).await?;
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

    async fn list_pods(&self, ns: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        Ok(api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list pods", ns))?
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
