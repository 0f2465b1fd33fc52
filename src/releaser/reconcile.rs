//! One pass over one PV, in a straight line: observe (caches) → decide → confirm (a live read of
//! the claim it names, decide again) → act (the guarded release).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

use super::act::Releaser;
use super::decide::{Plan, decide};
use super::observe::{ClaimRead, ClaimRef, PvFacts, ScrubPod, observe};
use super::scrub;
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::pass::Runner;

/// Every PV is looked at again after this long even without a change.
const RESYNC: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub classes: Store<StorageClass>,
    /// Scrub pods (label `reclaimable-pv-releaser.kubernetes.io/scrub-pv`) of `scrub_ns`.
    pub scrub_pods: Store<Pod>,
    /// Where scrub pods and temporary claims live (`--pv-scrub-namespace`).
    pub scrub_ns: Option<String>,
    /// This releaser's id (`--pv-releaser-id`).
    pub id: String,
    pub releaser: Releaser,
    pub leadership: Arc<Leadership>,
    /// Times, backs off and reports every pass.
    pub runner: Runner<PersistentVolume>,
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        classes: Store<StorageClass>,
        scrub_pods: Store<Pod>,
        scrub_ns: Option<String>,
        id: String,
        releaser: Releaser,
        leadership: Arc<Leadership>,
        runner: Runner<PersistentVolume>,
    ) -> Self {
        Context {
            client,
            classes,
            scrub_pods,
            scrub_ns,
            id,
            releaser,
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
        let mut facts = observe(pv, class.as_deref(), ClaimRead::NotRead, pod.clone());
        let mut plan = decide(&facts, &self.id);
        if plan == Plan::ReadClaim {
            let read = match facts.claim_ref.as_ref() {
                Some(claim) => self.read_claim(claim).await?,
                None => ClaimRead::NotRead,
            };
            facts = observe(pv, class.as_deref(), read, pod);
            plan = decide(&facts, &self.id);
        }
        debug!(pv = %facts.name, ?plan, "decided");
        self.act(pv, &facts, plan).await?;
        Ok(Action::requeue(RESYNC))
    }

    async fn act(&self, pv: &PersistentVolume, facts: &PvFacts, plan: Plan) -> Result<()> {
        let needs_ns = !matches!(plan, Plan::Skip(_) | Plan::ReadClaim | Plan::Release { .. });
        let ns = self.scrub_ns.as_deref().unwrap_or_default();
        if needs_ns && ns.is_empty() {
            warn!(pv = %facts.name, "the StorageClass asks for a scrub, but no --pv-scrub-namespace is known (POD_NAMESPACE); left alone");
            return Ok(());
        }
        let writer = &self.releaser;
        match plan {
            Plan::Skip(_) | Plan::ReadClaim => Ok(()),
            Plan::Release { claim_uid } => writer.release(facts, &claim_uid).await,
            Plan::StartScrub { claim_uid } => writer.start_scrub(pv, facts, &claim_uid, ns).await,
            Plan::CreateScrubPod { temp_uid } => {
                writer.create_scrub_pod(facts, &temp_uid, ns).await
            }
            Plan::FinishScrub { temp_uid, failed } => {
                writer.finish_scrub(facts, &temp_uid, failed, ns).await
            }
            Plan::DeleteTemp { temp_uid } => writer.delete_temp(facts, &temp_uid, ns).await,
        }
    }

    /// The scrub pod of `pv`, as the scrub-pod cache shows it.
    fn scrub_pod(&self, pv: &str) -> ScrubPod {
        let Some(ns) = self.scrub_ns.as_deref() else {
            return ScrubPod::Missing;
        };
        let Some(pod) = self
            .scrub_pods
            .get(&ObjectRef::new(&scrub::name(pv)).within(ns))
        else {
            return ScrubPod::Missing;
        };
        let status = pod.status.as_ref();
        match status.and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => ScrubPod::Succeeded,
            Some("Failed") => ScrubPod::Failed(
                status
                    .and_then(|s| s.reason.clone())
                    .unwrap_or_else(|| "Failed".into()),
            ),
            _ if pod.metadata.deletion_timestamp.is_some() => ScrubPod::Missing,
            _ => ScrubPod::Busy,
        }
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
    ctx.runner.run(&pv, ctx.pass(&pv)).await
}

pub fn error_policy(pv: Arc<PersistentVolume>, _err: &Error, ctx: Arc<Context>) -> Action {
    ctx.runner.error_policy(&pv)
}
