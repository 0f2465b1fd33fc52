//! One pass over one PV, in a straight line: observe (caches) → decide → confirm (a live read of
//! the claim it names, decide again) → act (the guarded release).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

use super::act::Releaser;
use super::decide::{Plan, decide};
use super::observe::{ClaimRead, ClaimRef, observe};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// Every PV is looked at again after this long even without a change.
const RESYNC: Duration = Duration::from_secs(300);
/// Wait after a failed pass (the error is logged and counted; no tight retry).
const RETRY: Duration = Duration::from_secs(10);

pub struct Context {
    pub client: Client,
    pub classes: Store<StorageClass>,
    /// This releaser's id (`--pv-releaser-id`).
    pub id: String,
    pub releaser: Releaser,
    pub leadership: Arc<Leadership>,
    pub metrics: Arc<Metrics>,
    running: AtomicUsize,
}

impl Context {
    pub fn new(
        client: Client,
        classes: Store<StorageClass>,
        id: String,
        releaser: Releaser,
        leadership: Arc<Leadership>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Context {
            client,
            classes,
            id,
            releaser,
            leadership,
            metrics,
            running: AtomicUsize::new(0),
        }
    }

    /// Resolves once no pass is running.
    pub async fn idle(&self) {
        while self.running.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn pass(&self, pv: &PersistentVolume) -> Result<Action> {
        if !self.leadership.may_write() {
            return Ok(Action::await_change());
        }
        let class = pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .and_then(|name| self.classes.get(&ObjectRef::new(name)));
        let mut facts = observe(pv, class.as_deref(), ClaimRead::NotRead);
        let mut plan = decide(&facts, &self.id);
        if plan == Plan::ReadClaim {
            let read = match facts.claim_ref.as_ref() {
                Some(claim) => self.read_claim(claim).await?,
                None => ClaimRead::NotRead,
            };
            facts = observe(pv, class.as_deref(), read);
            plan = decide(&facts, &self.id);
        }
        debug!(pv = %facts.name, ?plan, "decided");
        if let Plan::Release { claim_uid } = plan {
            self.releaser.release(&facts, &claim_uid).await?;
        }
        Ok(Action::requeue(RESYNC))
    }

    async fn read_claim(&self, claim: &ClaimRef) -> Result<ClaimRead> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let found = api
            .get_metadata_opt(&claim.name)
            .await
            .map_err(Error::kube("get claim", &claim.name))?;
        Ok(match found {
            Some(meta) => ClaimRead::Exists {
                uid: meta.uid().unwrap_or_default(),
            },
            None => ClaimRead::Gone,
        })
    }
}

/// Counts one running pass for as long as it lives.
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The reconciler handed to kube's Controller.
pub async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action> {
    ctx.running.fetch_add(1, Ordering::SeqCst);
    let _running = Running(&ctx.running);
    let started = std::time::Instant::now();
    let result = ctx.pass(&pv).await;
    ctx.metrics.reconciled(
        started.elapsed().as_secs_f64(),
        result.as_ref().err().map(Error::category),
    );
    result
}

pub fn error_policy(pv: Arc<PersistentVolume>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(pv = %pv.name_any(), category = err.category().as_str(), retry_in = ?RETRY, "PV release failed: {err}");
    Action::requeue(RETRY)
}
