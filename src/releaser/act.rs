//! ACT: the releaser's one write. `spec.claimRef` is removed by a JSON patch whose first operation
//! tests the claim's UID, so a PV bound to another claim meanwhile fails the test and is left alone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PatchParams, PostParams, Preconditions,
};
use tracing::{debug, info};

use super::observe::{PvFacts, Scrub};
use super::scrub;
use crate::apijson;
use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};

pub struct Releaser {
    client: Client,
    reporter: Arc<Reporter>,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
}

impl Releaser {
    pub fn new(
        client: Client,
        reporter: Arc<Reporter>,
        metrics: Arc<Metrics>,
        leadership: Arc<Leadership>,
    ) -> Self {
        Releaser {
            client,
            reporter,
            metrics,
            leadership,
        }
    }

    /// Removes `pv`'s claimRef (and our scrub record) if it still names the claim with
    /// `claim_uid`.
    pub async fn release(&self, pv: &PvFacts, claim_uid: &str) -> Result<()> {
        if !self.may_write(pv, "release").await? {
            return Ok(());
        }
        let claim = pv
            .claim_ref
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let ops = scrub::release(claim_uid, pv.scrub.is_some());
        match self.json_patch(pv, ops, "release patch").await {
            Ok(true) => {
                self.metrics.pv_released();
                let how = if pv.scrub.is_some() { "scrubbed; " } else { "" };
                let note = format!(
                    "released: {how}claim {claim} is gone; the volume is Available again with its data"
                );
                let outcome = Outcome::new(Reason::Released, pv_ref(pv), note);
                self.reporter.report(outcome.key(claim_uid.into())).await;
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => {
                let note = format!("could not release PV {}: {e}", pv.name);
                let outcome = Outcome::new(Reason::ReleaseFailed, pv_ref(pv), note);
                let key = format!("{} {e}", e.category().as_str());
                self.reporter.report(outcome.key(key)).await;
                Err(e)
            }
        }
    }

    /// Creates the temporary claim and hands the PV (whose claimRef names `old_uid`) to it.
    pub async fn start_scrub(
        &self,
        pv: &PersistentVolume,
        facts: &PvFacts,
        old_uid: &str,
        ns: &str,
    ) -> Result<()> {
        if !self.may_write(facts, "start a scrub").await? {
            return Ok(());
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let claim: PersistentVolumeClaim = serde_json::from_value(scrub::temp_claim(pv, ns))
            .map_err(|source| Error::Encode {
                what: "temporary claim",
                source,
            })?;
        let name = scrub::name(&facts.name);
        let created = match claims.create(&PostParams::default(), &claim).await {
            Ok(c) => c,
            Err(e) if is_status(&e, &[code::CONFLICT]) => claims
                .get(&name)
                .await
                .map_err(Error::kube("get temporary claim", &name))?,
            Err(e) => return Err(Error::kube("create temporary claim", &name)(e)),
        };
        let temp_uid = created.metadata.uid.unwrap_or_default();
        let ops = scrub::hand_over(pv, old_uid, ns, &temp_uid);
        if !self.json_patch(facts, ops, "hand-over patch").await? {
            // The PV changed meanwhile: it is not ours to scrub; the claim goes again.
            delete_claim(&claims, &name, &temp_uid).await?;
            return Ok(());
        }
        info!(pv = %facts.name, claim = %name, namespace = ns, "PV handed to its scrub");
        Ok(())
    }

    /// Creates the scrub pod; a template or a pod the API server refuses fails the scrub.
    pub async fn create_scrub_pod(&self, facts: &PvFacts, temp_uid: &str, ns: &str) -> Result<()> {
        if !self.may_write(facts, "create the scrub pod").await? {
            return Ok(());
        }
        let template = facts.scrub_template.clone().unwrap_or_default();
        let refusal = match scrub::pod(&template, &facts.name, ns) {
            Err(why) => Some(format!("scrub template: {why}")),
            Ok(pod) => {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<Pod>(&()));
                let object: DynamicObject =
                    serde_json::from_value(pod).map_err(|source| Error::Encode {
                        what: "scrub pod",
                        source,
                    })?;
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => None,
                    Err(e) if is_status(&e, &[code::CONFLICT]) => None,
                    Err(kube::Error::Api(s)) if code::refuses_create(s.code) => Some(format!(
                        "the API server refused the scrub pod ({}): {}",
                        s.code, s.message
                    )),
                    Err(e) => return Err(Error::kube("create scrub pod", &facts.name)(e)),
                }
            }
        };
        match refusal {
            None => Ok(()),
            Some(why) => self.finish_scrub(facts, temp_uid, Some(why), ns).await,
        }
    }

    /// Records the scrub's outcome on the PV, then deletes the scrub pod and the temporary claim.
    pub async fn finish_scrub(
        &self,
        facts: &PvFacts,
        temp_uid: &str,
        failed: Option<String>,
        ns: &str,
    ) -> Result<()> {
        if !self.may_write(facts, "finish the scrub").await? {
            return Ok(());
        }
        let running = Scrub::Running(temp_uid.into());
        let outcome = match failed {
            None => Scrub::Scrubbed(temp_uid.into()),
            Some(_) => Scrub::Failed(temp_uid.into()),
        };
        if !self
            .json_patch(facts, scrub::record(&running, &outcome), "scrub record")
            .await?
        {
            return Ok(());
        }
        self.metrics.pv_scrubbed(failed.is_none());
        let (reason, note) = match &failed {
            None => (
                Reason::Scrubbed,
                format!("scrub of PV {} succeeded", facts.name),
            ),
            Some(why) => (
                Reason::ScrubFailed,
                format!(
                    "scrub of PV {} failed ({why}); the PV stays Released and is not handed out",
                    facts.name
                ),
            ),
        };
        let outcome = Outcome::new(reason, pv_ref(facts), note);
        self.reporter.report(outcome.key(temp_uid.into())).await;
        let name = scrub::name(&facts.name);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, &[code::NOT_FOUND]) => {}
            Err(e) => return Err(Error::kube("delete scrub pod", &name)(e)),
        }
        self.delete_temp(facts, temp_uid, ns).await
    }

    /// Deletes the temporary claim (UID precondition).
    pub async fn delete_temp(&self, facts: &PvFacts, temp_uid: &str, ns: &str) -> Result<()> {
        if !self.may_write(facts, "delete the temporary claim").await? {
            return Ok(());
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        delete_claim(&claims, &scrub::name(&facts.name), temp_uid).await
    }

    /// Whether the write `what` may be made now: an error when this replica may no longer write;
    /// false under `--dry-run` (reported as a `DryRun` outcome instead).
    async fn may_write(&self, pv: &PvFacts, what: &str) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        let what = format!("{what} (PV {})", pv.name);
        Ok(!self.reporter.skipped(&pv_ref(pv), &what).await)
    }

    /// Applies a JSON patch to the PV: `Ok(false)` if a test op failed or the PV is gone (it
    /// changed meanwhile, and is left alone).
    async fn json_patch(
        &self,
        pv: &PvFacts,
        ops: serde_json::Value,
        what: &'static str,
    ) -> Result<bool> {
        let request = apijson::patch_request::<PersistentVolume>(
            None,
            &pv.name,
            &ops,
            &PatchParams::default(),
        )?;
        match self.client.request::<PersistentVolume>(request).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[code::INVALID, code::CONFLICT, code::NOT_FOUND]) => {
                debug!(pv = %pv.name, error = %e, "PV changed before the {what}; left alone");
                Ok(false)
            }
            Err(e) => Err(Error::kube("patch persistentvolume", &pv.name)(e)),
        }
    }
}

/// The PV, as the object of its Events.
fn pv_ref(pv: &PvFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolume".into()),
        name: Some(pv.name.clone()),
        uid: Some(pv.uid.clone()),
        ..Default::default()
    }
}

/// Deletes claim `name` if it still has `uid`; gone or replaced means done.
async fn delete_claim(api: &Api<PersistentVolumeClaim>, name: &str, uid: &str) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => Ok(()),
        Err(e) => Err(Error::kube("delete temporary claim", name)(e)),
    }
}
