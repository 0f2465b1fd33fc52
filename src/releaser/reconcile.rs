//! One pass over one PV, in a straight line: observe (caches) → decide → confirm (a live read of
//! the claim it names, decide again) → act (the plan's guarded writes, or its report).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::debug;

use super::act::Actor;
use super::decide::{Plan, decide};
use super::observe::{ClaimRead, ClaimRef, observe};
use super::scrub;
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::pass::Runner;

/// Every PV is looked at again after this long even without a change.
const RESYNC: Duration = Duration::from_secs(300);

/// What every pass over a PV shares.
pub struct Context {
    /// The client of the live reads.
    pub client: Client,
    /// The StorageClass cache.
    pub classes: Store<StorageClass>,
    /// Scrub pods (label `reclaimable-pv-releaser.kubernetes.io/scrub-pv`) of `scrub_ns`.
    pub scrub_pods: Store<Pod>,
    /// Where scrub pods and temporary claims live (`--pv-scrub-namespace`).
    pub scrub_ns: Option<String>,
    /// This releaser's id (`--pv-releaser-id`).
    pub id: String,
    /// The writer.
    pub actor: Actor,
    /// Whether this process leads.
    pub leadership: Arc<Leadership>,
    /// Times, backs off and reports every pass.
    pub runner: Runner<PersistentVolume>,
}

impl Context {
    /// The context from its parts.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        classes: Store<StorageClass>,
        scrub_pods: Store<Pod>,
        scrub_ns: Option<String>,
        id: String,
        actor: Actor,
        leadership: Arc<Leadership>,
        runner: Runner<PersistentVolume>,
    ) -> Self {
        Context {
            client,
            classes,
            scrub_pods,
            scrub_ns,
            id,
            actor,
            leadership,
            runner,
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
        let pod = self.scrub_pod(&pv.name_any());
        let ns = self.scrub_ns.as_deref();
        let mut facts = observe(pv, class.as_deref(), ClaimRead::NotRead, pod.as_deref(), ns);
        let mut plan = decide(&facts, &self.id);
        if plan == Plan::ReadClaim {
            if let Some(claim) = facts.claim_ref.as_ref() {
                facts.claim = self.read_claim(claim).await?;
            }
            plan = decide(&facts, &self.id);
        }
        debug!(pv = %facts.name, ?plan, "decided");
        self.actor.act(pv, &facts, plan).await?;
        Ok(Action::requeue(RESYNC))
    }

    /// The scrub pod of `pv` in the scrub-pod cache.
    fn scrub_pod(&self, pv: &str) -> Option<Arc<Pod>> {
        let ns = self.scrub_ns.as_deref()?;
        self.scrub_pods
            .get(&ObjectRef::new(&scrub::name(pv)).within(ns))
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

/// The reconciler handed to kube's Controller.
pub async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action> {
    ctx.runner.run(&pv, || ctx.pass(&pv)).await
}

/// The error policy handed to kube's Controller: look again when the backoff is over.
pub fn error_policy(pv: Arc<PersistentVolume>, _err: &Error, ctx: Arc<Context>) -> Action {
    ctx.runner.error_policy(&pv)
}
