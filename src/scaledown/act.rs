//! ACT: the only code that writes to the API server. It carries out a `Plan` step by step and is
//! idempotent: a create that meets 409 AlreadyExists and a delete that meets 404 NotFound are done;
//! deletes carry the UID they were decided on, so a newer object with the same name is never hit.
//!
//! A cleanup pod is created with our scheduling gate, so it holds the name `<set>-<ordinal>` but
//! cannot run. `settle` then carries out the verdict of a read made after the create: record the
//! pod's UID on the set (a compare-and-swap on the set's generation) and remove the gate, or delete
//! the pod again.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::debug;

use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::naming;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};
use crate::scaledown::decide::status::{Change, Write};
use crate::scaledown::decide::{Event, Plan, PodDeletion, Step, Verdict};
use crate::scaledown::expect::{Gone, Mark};
use crate::scaledown::observe::{Record, SetFacts};

/// The scale-down controller's writer: the steps of a plan, the record and release of new cleanup pods, the status annotations, and the reports.
pub struct Actor {
    client: Client,
    reporter: Arc<Reporter>,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
}

pub use crate::scaledown::observe::Created;

impl Actor {
    /// A writer through `client`, reporting through `reporter`, that writes only while `leadership` allows.
    pub fn new(
        client: Client,
        reporter: Arc<Reporter>,
        metrics: Arc<Metrics>,
        leadership: Arc<Leadership>,
    ) -> Self {
        Actor {
            leadership,
            reporter,
            client,
            metrics,
        }
    }

    /// Carries out `plan` for `set`, stopping at the first failed write. What was done before a
    /// failure (cleanup pods created, creations refused) is in `done` either way, so the pass can
    /// still settle the pods it created. What is to be reported goes into `done.reports`, for the
    /// pass's report stage ([`Actor::report`]); under `--dry-run` each write is described there
    /// instead of made.
    pub async fn execute(&self, set: &SetFacts, plan: &Plan, done: &mut Done) -> Result<()> {
        for step in &plan.steps {
            // Checked right before every write: a leader past its renew deadline stops mid-plan.
            if !self.leadership.may_write() {
                return Err(Error::NotLeader);
            }
            if !self.reporter.writes() && !matches!(step, Step::Event(_)) {
                done.reports.push(Report::DryRun(describe(step)));
            } else {
                self.carry_out(set, step, plan.status.as_ref(), done)
                    .await?;
            }
            if done.stale {
                break;
            }
        }
        Ok(())
    }

    async fn carry_out(
        &self,
        set: &SetFacts,
        step: &Step,
        status: Option<&Change>,
        done: &mut Done,
    ) -> Result<()> {
        let ns = set.namespace.as_str();
        match step {
            Step::Event(event) => done.reports.push(Report::Event(event.clone(), None)),
            Step::SetFinalizers { .. } => self.set_finalizers(set, step, status, done).await?,
            Step::MarkDeletion { propagation } => {
                done.stale |= !patches::mark_deletion(&self.client, set, *propagation).await?;
            }
            Step::DeleteStatefulPod { name, uid } => {
                self.delete_stateful_pod(set, name, uid, done).await?;
                done.deleted.push(Gone::pod(name, uid));
            }
            Step::CreateCleanupPod {
                ordinal,
                attempt,
                pod,
                claims,
            } => {
                let created = NewPod {
                    ordinal: *ordinal,
                    attempt: *attempt,
                    pod,
                    claims,
                };
                self.create_cleanup_pod(set, created, done).await?;
            }
            Step::Release { name, uid } => {
                done.stale |= !self.guarded_release(set, name, uid).await?
            }
            Step::DeleteClaim { name, uid } => {
                self.delete_claim(set, name, uid, done).await?;
                done.deleted.push(Gone::claim(name, uid));
            }
            Step::DeleteCleanupPod {
                name,
                uid,
                why,
                ran_for,
            } => {
                self.delete_cleanup_pod(set, name, uid, *why, *ran_for, done)
                    .await?;
                done.deleted.push(Gone::pod(name, uid));
            }
            Step::MarkNextAttempt {
                claim,
                uid,
                attempt,
            } => {
                if self.mark_next_attempt(ns, claim, uid, *attempt).await? {
                    done.marked.push(Mark {
                        claim: claim.clone(),
                        uid: uid.clone(),
                        attempt: *attempt,
                    });
                }
            }
        }
        Ok(())
    }

    /// Replaces the set's finalizers (a `SetFinalizers` step), with the plan's status change
    /// unless a patch of this plan carried it already.
    async fn set_finalizers(
        &self,
        set: &SetFacts,
        step: &Step,
        status: Option<&Change>,
        done: &mut Done,
    ) -> Result<()> {
        let Step::SetFinalizers {
            finalizers,
            resource_version,
            adding,
        } = step
        else {
            return Ok(());
        };
        let status = plan_status(done, status);
        let client = &self.client;
        let written =
            patches::set_finalizers(client, set, finalizers, resource_version, *adding, status)
                .await?;
        if status.is_some() {
            done.status = Some(written);
        }
        if *adding && written {
            done.finalizer_added = Some(status.map(status_annotations).unwrap_or_default());
        }
        Ok(())
    }

    /// Deletes a stateful pod of a set deleted in the background (UID-guarded).
    async fn delete_stateful_pod(
        &self,
        set: &SetFacts,
        name: &str,
        uid: &str,
        done: &mut Done,
    ) -> Result<()> {
        let ns = set.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if let Deleted::Now = delete(&pods, name, uid, "delete pod").await? {
            let note = format!(
                "deleted pod {name} of the deleted StatefulSet so its claims can be cleaned"
            );
            done.report(Reason::SuccessfulDelete, uid, note, pod_ref(ns, name, uid));
        }
        Ok(())
    }

    /// Creates one gated cleanup pod; what came of it goes into `done` (created, or refused).
    async fn create_cleanup_pod(
        &self,
        set: &SetFacts,
        new: NewPod<'_>,
        done: &mut Done,
    ) -> Result<()> {
        let ns = set.namespace.as_str();
        let name = naming::pod_name(&set.name, new.ordinal);
        match self.create_pod(ns, &name, new.pod).await? {
            Creation::Created(uid) => done.created.push(Created {
                ordinal: new.ordinal,
                name,
                uid,
                attempt: new.attempt,
                claims: new.claims.clone(),
            }),
            Creation::Exists => debug!(pod = %name, namespace = ns, "cleanup pod already exists"),
            Creation::Refused { code, message } => {
                done.reports
                    .push(refusal_event(set, new.ordinal, code, &message));
                done.refused.push(Refusal {
                    ordinal: new.ordinal,
                    code,
                    message,
                });
            }
        }
        Ok(())
    }

    /// Releases a recorded cleanup pod once the API server confirmed the read of the set that
    /// judged its ordinal orphaned, so a scale-up saved since that read wins over the release.
    /// `Ok(false)`: the set changed; nothing was released.
    async fn guarded_release(&self, set: &SetFacts, name: &str, uid: &str) -> Result<bool> {
        let sent = std::time::Instant::now();
        if !patches::guard(&self.client, set).await? {
            return Ok(false);
        }
        if patches::release(&self.client, &set.namespace, name, uid).await? {
            self.metrics.release_window(sent.elapsed().as_secs_f64());
        }
        Ok(true)
    }

    /// Writes the status annotations in a patch of their own, guarded by test ops on the set's UID
    /// and on the status it carried when decided: a set whose status someone else changed
    /// meanwhile is left alone (`Ok(false)`; that change wakes another pass). Under `--dry-run`,
    /// described in `done.reports` instead (and taken as written).
    pub async fn write_status(
        &self,
        set: &SetFacts,
        change: &Change,
        done: &mut Done,
    ) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        if !self.reporter.writes() {
            done.reports
                .push(Report::DryRun(describe_status(&change.write)));
            return Ok(true);
        }
        patches::status(&self.client, set, &change.write).await
    }

    /// The report stage of a pass: what act did (`done.reports`), in order, each an Event, or
    /// under `--dry-run` a `DryRun` record of a write not made. Also after a failed step.
    pub async fn report(&self, set: &SetFacts, done: &Done) {
        for report in &done.reports {
            match report {
                Report::Event(event, related) => self.publish(set, event, related.clone()).await,
                Report::DryRun(what) => self.reporter.would(&set_ref(set), what).await,
            }
        }
    }

    /// Publishes the Event of a status change (pause, resume) once its write went through.
    pub async fn status_event(&self, set: &SetFacts, change: &Change) {
        if let Some(event) = &change.event {
            self.publish(set, event, None).await;
        }
    }

    async fn delete_claim(
        &self,
        set: &SetFacts,
        name: &str,
        uid: &str,
        done: &mut Done,
    ) -> Result<()> {
        let ns = set.namespace.as_str();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        if let Deleted::Now = delete(&claims, name, uid, "delete claim").await? {
            self.metrics.claim_deleted();
            let note = format!("delete claim {name} in StatefulSet {}", set.name);
            let related = core_ref("PersistentVolumeClaim", ns, name, uid);
            done.report(Reason::SuccessfulDelete, uid, note, related);
        }
        Ok(())
    }

    async fn delete_cleanup_pod(
        &self,
        set: &SetFacts,
        name: &str,
        uid: &str,
        why: PodDeletion,
        ran_for: Option<std::time::Duration>,
        done: &mut Done,
    ) -> Result<()> {
        let ns = set.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if let Deleted::Before = delete(&pods, name, uid, "delete pod").await? {
            return Ok(());
        }
        let (reason, note) = match why {
            PodDeletion::Completed => {
                self.metrics.cleanup_succeeded();
                if let Some(took) = ran_for {
                    self.metrics.cleanup_took(took.as_secs_f64());
                }
                let note = format!("delete cleanup pod {name} in StatefulSet {}", set.name);
                (Reason::SuccessfulDelete, note)
            }
            PodDeletion::ScaledUp => (
                Reason::SuccessfulDelete,
                format!(
                    "deleted cleanup pod {name}; its claims are kept for the scaled-up ordinal"
                ),
            ),
            PodDeletion::Retry => (
                Reason::CleanupRetry,
                format!("deleted failed cleanup pod {name} to start the next attempt"),
            ),
            PodDeletion::NeverRan => (
                Reason::SuccessfulDelete,
                format!("deleted pod {name}, which never ran"),
            ),
        };
        done.report(reason, uid, note, pod_ref(ns, name, uid));
        Ok(())
    }

    async fn mark_next_attempt(
        &self,
        ns: &str,
        claim: &str,
        uid: &str,
        attempt: Option<u32>,
    ) -> Result<bool> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let value = attempt.map(|a| a.to_string());
        // metadata.uid in the body is checked by the API server: a different claim is a 409.
        let patch = json!({"metadata": {"uid": uid, "annotations": {naming::NEXT_ATTEMPT_ANNOTATION: value}}});
        match claims
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                debug!(claim = %claim, ?attempt, "marked next attempt");
                Ok(true)
            }
            Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {
                debug!(claim = %claim, "claim changed; mark skipped");
                Ok(false)
            }
            Err(e) => Err(Error::kube("annotate claim", claim)(e)),
        }
    }

    /// Creates the cleanup pod from its JSON, unchanged.
    async fn create_pod(&self, ns: &str, name: &str, pod: &serde_json::Value) -> Result<Creation> {
        let object: DynamicObject =
            serde_json::from_value(pod.clone()).map_err(|source| Error::Encode {
                what: "cleanup pod",
                source,
            })?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<Pod>(&()));
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, &object).await {
            Ok(created) => Ok(Creation::Created(created.metadata.uid.unwrap_or_default())),
            Err(e) if is_status(&e, &[code::CONFLICT]) => Ok(Creation::Exists),
            Err(kube::Error::Api(status)) if code::refuses_create(status.code) => {
                Ok(Creation::Refused {
                    code: status.code,
                    message: status.message.clone(),
                })
            }
            Err(e) => Err(Error::kube("create cleanup pod", name)(e)),
        }
    }

    /// Carries out the verdicts on the pods created in this pass, given the read of the set they
    /// were made on: the ones to run are recorded on the set in one compare-and-swap, then
    /// released if `release` (else a later pass releases them); the others are deleted.
    /// `Err(Contended)` if the set changed after the read.
    pub async fn settle(
        &self,
        live: &SetFacts,
        records: &BTreeMap<u32, Record>,
        verdicts: &[(Created, Verdict)],
        release: bool,
        status: Option<&Write>,
        done: &mut Done,
    ) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        let ns = live.namespace.as_str();
        for (pod, verdict) in verdicts {
            if let Verdict::Cancel(why) = verdict {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                delete(&pods, &pod.name, &pod.uid, "delete pod").await?;
                let note = format!("cleanup pod {} never ran and is deleted: {why}", pod.name);
                let related = pod_ref(ns, &pod.name, &pod.uid);
                done.report(Reason::CleanupCancelled, &pod.uid, note, related);
            }
        }
        let runs: Vec<&Created> = verdicts
            .iter()
            .filter(|(_, v)| *v == Verdict::Run)
            .map(|(c, _)| c)
            .collect();
        if runs.is_empty() {
            return Ok(false);
        }
        let sent = std::time::Instant::now();
        patches::record(&self.client, live, records, status).await?;
        for pod in runs {
            if release && patches::release(&self.client, ns, &pod.name, &pod.uid).await? {
                self.metrics.release_window(sent.elapsed().as_secs_f64());
            }
            self.metrics.cleanup_started();
            let note = format!(
                "create cleanup pod {} (attempt {}) for ordinal {}",
                pod.name, pod.attempt, pod.ordinal
            );
            let related = pod_ref(ns, &pod.name, &pod.uid);
            done.report(Reason::SuccessfulCreate, &pod.uid, note, related);
        }
        Ok(true)
    }

    /// Reports `event` on the set, with the object written as its related object.
    async fn publish(&self, set: &SetFacts, event: &Event, related: Option<ObjectReference>) {
        let mut outcome =
            Outcome::new(event.reason, set_ref(set), event.note.clone()).key(event.key.clone());
        outcome.related = related;
        self.reporter.report(outcome).await;
    }
}

/// The Warning of a cleanup pod the API server refused to create.
fn refusal_event(set: &SetFacts, ordinal: u32, code: u16, message: &str) -> Report {
    let pod = naming::pod_name(&set.name, ordinal);
    let hint = match code {
        code::FORBIDDEN => {
            "admission (Pod Security, a webhook), a ResourceQuota or RBAC refused it"
        }
        code::TOO_LARGE | code::INTERNAL => "the pod may be too large to store",
        _ => "the template may be invalid for this cluster",
    };
    let event = Event {
        reason: Reason::CleanupPodRejected,
        note: format!("the API server refused cleanup pod {pod} ({code}): {message}; {hint}"),
        key: format!("{ordinal} {code} {message}"),
    };
    Report::Event(event, None)
}

mod ops;
mod patches;
#[cfg(test)]
mod tests;

use ops::{Creation, Deleted, NewPod, core_ref, delete, pod_ref, set_ref, status_annotations};
pub use ops::{
    Done, FIELD_MANAGER, Refusal, Report, annotation_path, describe, describe_status, guard_ops,
    record_ops, status_ops,
};

/// The status change of the plan for a finalizer patch, unless one already carried it.
fn plan_status<'a>(done: &Done, status: Option<&'a Change>) -> Option<&'a Write> {
    status.filter(|_| done.status.is_none()).map(|c| &c.write)
}
