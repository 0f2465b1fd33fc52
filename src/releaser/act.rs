//! ACT: the releaser's writes, each the plan `decide` made. `spec.claimRef` is removed (or handed
//! to a scrub's temporary claim) by a JSON patch whose first operation tests the claim's UID, so a
//! PV bound to another claim meanwhile fails the test and is left alone; the scrub record moves by
//! a patch that tests the state it moves from; deletions carry the object's UID as a precondition.
//! A scrub that cannot run is reported (a Warning Event and a log line) once per PV and cause.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PatchParams, PostParams, Preconditions,
};
use tracing::{debug, info, warn};

use super::decide::{Blocked, Existing, Plan, existing};
use super::observe::PvFacts;
use super::scrub;
use super::scrub::Scrub;
use crate::apijson;
use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};

/// The releaser's writer: the guarded patches of the plan, the scrub's claim and pod, and the reports.
pub struct Actor {
    client: Client,
    reporter: Arc<Reporter>,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
    /// PV name → UID of the temporary claim this process created for it and has not handed the
    /// PV to yet (the hand-over failed): the only claim of that name it adopts. An entry goes with
    /// the hand-over, or the claim's deletion.
    created: Mutex<HashMap<String, String>>,
}

impl Actor {
    /// A writer through `client`, reporting through `reporter`, that writes only while `leadership` allows.
    pub fn new(
        client: Client,
        reporter: Arc<Reporter>,
        metrics: Arc<Metrics>,
        leadership: Arc<Leadership>,
    ) -> Self {
        Actor {
            client,
            reporter,
            metrics,
            leadership,
            created: Mutex::new(HashMap::new()),
        }
    }

    /// Carries out `plan` for `pv` (whose facts are `facts`).
    pub async fn act(&self, pv: &PersistentVolume, facts: &PvFacts, plan: Plan) -> Result<()> {
        match plan {
            Plan::Skip(_) | Plan::ReadClaim => Ok(()),
            Plan::ScrubBlocked(cause) => self.report_blocked(facts, cause).await,
            Plan::Release { claim_uid } => self.release(facts, &claim_uid).await,
            Plan::StartScrub {
                claim_uid,
                namespace,
            } => self.start_scrub(pv, facts, &claim_uid, &namespace).await,
            Plan::CreateScrubPod {
                temp_uid,
                namespace,
                pod,
            } => {
                self.create_scrub_pod(facts, &temp_uid, &namespace, pod)
                    .await
            }
            Plan::FinishScrub {
                temp_uid,
                failed,
                namespace,
                pod_uid,
            } => {
                let pod_uid = pod_uid.as_deref();
                self.finish_scrub(facts, &temp_uid, failed, &namespace, pod_uid)
                    .await
            }
            Plan::DeleteTemp {
                temp_uid,
                namespace,
            } => self.delete_temp(facts, &temp_uid, &namespace).await,
        }
    }

    /// A Warning Event and a log line saying why the scrub the class asks for cannot run, the
    /// first time `facts`' PV is blocked by `cause`; nothing is written to the PV.
    pub async fn report_blocked(&self, facts: &PvFacts, cause: Blocked) -> Result<()> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        let note = format!(
            "PV {}: StorageClass {} asks for a scrub before release, but {cause}; the PV stays Released and untouched until that is fixed",
            facts.name, facts.class
        );
        // Once per PV and cause: the reporter remembers what it reported.
        let outcome = Outcome::new(Reason::ScrubBlocked, pv_ref(facts), note);
        self.reporter.report(outcome.key(cause.to_string())).await;
        Ok(())
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
        let temp_uid = self.temp_claim(pv, facts, &claims, ns).await?;
        let name = scrub::name(&facts.name);
        let ops = scrub::hand_over(pv, old_uid, ns, &temp_uid);
        let handed = self.json_patch(facts, ops, "hand-over patch").await?;
        self.created_claims().remove(&facts.name);
        if !handed {
            // The PV changed meanwhile: it is not ours to scrub; the claim goes again.
            delete_claim(&claims, &name, &temp_uid).await?;
            return Ok(());
        }
        info!(pv = %facts.name, claim = %name, namespace = ns, "PV handed to its scrub");
        Ok(())
    }

    /// The UID of the temporary claim of `facts`' PV: created now, or the one this process
    /// created before and could not hand the PV to. Any other claim of that name is left alone:
    /// a Warning (once per PV and claim) and an error (409), so the PV is backed off.
    async fn temp_claim(
        &self,
        pv: &PersistentVolume,
        facts: &PvFacts,
        claims: &Api<PersistentVolumeClaim>,
        ns: &str,
    ) -> Result<String> {
        let claim: PersistentVolumeClaim = serde_json::from_value(scrub::temp_claim(pv, ns))
            .map_err(|source| Error::Encode {
                what: "temporary claim",
                source,
            })?;
        let name = scrub::name(&facts.name);
        let taken = match claims.create(&PostParams::default(), &claim).await {
            Ok(c) => {
                let uid = c.metadata.uid.unwrap_or_default();
                self.created_claims()
                    .insert(facts.name.clone(), uid.clone());
                return Ok(uid);
            }
            Err(e) if is_status(&e, &[code::CONFLICT]) => e,
            Err(e) => return Err(Error::kube("create temporary claim", &name)(e)),
        };
        let found = claims
            .get_metadata(&name)
            .await
            .map_err(Error::kube("get temporary claim", &name))?;
        let uid = found.metadata.uid.unwrap_or_default();
        let deleting = found.metadata.deletion_timestamp.is_some();
        let created = self.created_claims().get(&facts.name).cloned();
        match existing(&uid, deleting, created.as_deref()) {
            Existing::Adopt(uid) => Ok(uid),
            Existing::Deleting => {
                debug!(pv = %facts.name, claim = %name, "a former temporary claim is being deleted; later");
                Err(Error::kube("create temporary claim", &name)(taken))
            }
            Existing::Foreign(uid) => {
                warn!(pv = %facts.name, namespace = ns, claim = %name, %uid, "a claim this releaser did not create has the temporary claim's name; the PV is left alone");
                let cause = Blocked::ClaimTaken {
                    namespace: ns.to_string(),
                    name: name.clone(),
                    uid,
                };
                self.report_blocked(facts, cause).await?;
                Err(Error::kube("create temporary claim", &name)(taken))
            }
        }
    }

    fn created_claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.created.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the scrub pod `pod` in `ns`; a pod the API server refuses fails the scrub.
    pub async fn create_scrub_pod(
        &self,
        facts: &PvFacts,
        temp_uid: &str,
        ns: &str,
        pod: serde_json::Value,
    ) -> Result<()> {
        if !self.may_write(facts, "create the scrub pod").await? {
            return Ok(());
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<Pod>(&()));
        let object: DynamicObject =
            serde_json::from_value(pod).map_err(|source| Error::Encode {
                what: "scrub pod",
                source,
            })?;
        let refusal = match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(e) if is_status(&e, &[code::CONFLICT]) => return Ok(()),
            Err(kube::Error::Api(s)) if code::refuses_create(s.code) => format!(
                "the API server refused the scrub pod ({}): {}",
                s.code, s.message
            ),
            Err(e) => return Err(Error::kube("create scrub pod", &facts.name)(e)),
        };
        self.finish_scrub(facts, temp_uid, Some(refusal), ns, None)
            .await
    }

    /// Records the scrub's outcome on the PV, then deletes the scrub pod (by `pod_uid`; none to
    /// delete without one) and the temporary claim.
    pub async fn finish_scrub(
        &self,
        facts: &PvFacts,
        temp_uid: &str,
        failed: Option<String>,
        ns: &str,
        pod_uid: Option<&str>,
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
        if let Some(uid) = pod_uid {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match pods.delete(&name, &by_uid(uid)).await {
                Ok(_) => {}
                // Gone, or replaced by another pod of that name (not ours to delete).
                Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {}
                Err(e) => return Err(Error::kube("delete scrub pod", &name)(e)),
            }
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

#[cfg(test)]
mod tests;

/// A deletion of the object with `uid` only.
fn by_uid(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// Deletes claim `name` if it still has `uid`; gone or replaced means done.
async fn delete_claim(api: &Api<PersistentVolumeClaim>, name: &str, uid: &str) -> Result<()> {
    match api.delete(name, &by_uid(uid)).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => Ok(()),
        Err(e) => Err(Error::kube("delete temporary claim", name)(e)),
    }
}
