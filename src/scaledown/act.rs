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

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use serde_json::json;
use tracing::{debug, info};

use crate::apijson;
use crate::error::{Error, Result, code, is_status, status_code};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::naming;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};
use crate::scaledown::decide::status::{Change, Write};
use crate::scaledown::decide::{Event, Plan, PodDeletion, Propagation, Step, Verdict, mark_value};
use crate::scaledown::expect::{Gone, Mark};
use crate::scaledown::observe::{Record, SetFacts, format_records};

/// Field manager of every write we make.
pub const FIELD_MANAGER: &str = "statefulset-scaledown-controller";

/// The scale-down controller's writer: the steps of a plan, the record and release of new cleanup pods, the status annotations, and the reports.
pub struct Actor {
    client: Client,
    reporter: Arc<Reporter>,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
}

pub use crate::scaledown::observe::Created;

/// The API server refused to create the cleanup pod of `ordinal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The ordinal whose cleanup pod was refused.
    pub ordinal: u32,
    /// The HTTP status code of the refusal.
    pub code: u16,
    /// The API server's message.
    pub message: String,
}

/// What carrying out a plan did, beyond the writes themselves.
#[derive(Debug, Default)]
pub struct Done {
    /// The cleanup pods created (gated), waiting for their verdict.
    pub created: Vec<Created>,
    /// The creations the API server refused.
    pub refused: Vec<Refusal>,
    /// The plan's status change rode in its finalizer patch: `Some(true)` written, `Some(false)`
    /// the patch raced a change (the next pass decides again); `None` no finalizer patch was sent.
    pub status: Option<bool>,
    /// The objects this plan deleted (or found deleted already): the caches may still show them.
    pub deleted: Vec<Gone>,
    /// A guard found the set changed since the read the plan was decided on: the steps after it
    /// were not carried out, and the next pass decides again on a newer read.
    pub stale: bool,
    /// The next-attempt marks this plan wrote: the claim cache may not show them yet.
    pub marked: Vec<Mark>,
}

enum Deleted {
    Now,
    /// Already gone, or the name belongs to a newer object (404, or 409 on the UID precondition).
    Before,
}

/// A cleanup pod to create, as its step gives it.
struct NewPod<'a> {
    ordinal: u32,
    attempt: u32,
    pod: &'a serde_json::Value,
    claims: &'a BTreeMap<String, String>,
}

enum Creation {
    Created(String),
    Exists,
    Refused { code: u16, message: String },
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
            leadership,
            reporter,
            client,
            metrics,
        }
    }

    /// Carries out `plan` for `set`, stopping at the first failed write. What was done before a
    /// failure (cleanup pods created, creations refused) is in `done` either way, so the pass can
    /// still settle the pods it created.
    pub async fn execute(&self, set: &SetFacts, plan: &Plan, done: &mut Done) -> Result<()> {
        for step in &plan.steps {
            // Checked right before every write: a leader past its renew deadline stops mid-plan.
            if !self.leadership.may_write() {
                return Err(Error::NotLeader);
            }
            let skipped = match step {
                Step::Event(_) => false,
                _ => self.reporter.skipped(&set_ref(set), &describe(step)).await,
            };
            if !skipped {
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
            Step::Event(event) => self.publish(set, event, None).await,
            Step::SetFinalizers {
                finalizers,
                resource_version,
                adding,
            } => {
                let status = plan_status(done, status);
                let written = self
                    .set_finalizers(set, finalizers, resource_version, *adding, status)
                    .await?;
                if status.is_some() {
                    done.status = Some(written);
                }
            }
            Step::MarkDeletion { propagation } => {
                done.stale |= !self.mark_deletion(set, *propagation).await?;
            }
            Step::DeleteStatefulPod { name, uid } => {
                self.delete_stateful_pod(set, name, uid).await?;
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
                self.delete_claim(set, name, uid).await?;
                done.deleted.push(Gone::claim(name, uid));
            }
            Step::DeleteCleanupPod {
                name,
                uid,
                why,
                ran_for,
            } => {
                self.delete_cleanup_pod(set, name, uid, *why, *ran_for)
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

    /// Deletes a stateful pod of a set deleted in the background (UID-guarded).
    async fn delete_stateful_pod(&self, set: &SetFacts, name: &str, uid: &str) -> Result<()> {
        let ns = set.namespace.as_str();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if let Deleted::Now = delete(&pods, name, uid, "delete pod").await? {
            let note = format!(
                "deleted pod {name} of the deleted StatefulSet so its claims can be cleaned"
            );
            let pod = pod_ref(ns, name, uid);
            self.report(set, Reason::SuccessfulDelete, uid, note, pod)
                .await;
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
                self.report_refusal(set, new.ordinal, code, &message).await;
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
        if !self.guard(set).await? {
            return Ok(false);
        }
        if self.release(&set.namespace, name, uid).await? {
            self.metrics.release_window(sent.elapsed().as_secs_f64());
        }
        Ok(true)
    }

    async fn set_finalizers(
        &self,
        set: &SetFacts,
        finalizers: &[String],
        resource_version: &str,
        adding: bool,
        status: Option<&Write>,
    ) -> Result<bool> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &set.namespace);
        // The resourceVersion makes this a compare-and-swap: a concurrent change is a 409.
        let mut patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
        if let Some(write) = status {
            patch["metadata"]["annotations"] = status_merge(write);
        }
        match api
            .patch(&set.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Our cache was behind; the newer set is on its way through the watch and brings
            // another pass, which decides again. Not a failure worth an error backoff.
            Err(e) if is_status(&e, &[code::CONFLICT]) => {
                debug!(set = %set.name, namespace = %set.namespace, "finalizer patch raced a change; the next pass retries");
                return Ok(false);
            }
            Err(e) => return Err(Error::kube("patch finalizers of statefulset", &set.name)(e)),
        }
        let verb = if adding { "added" } else { "removed" };
        info!(set = %set.name, namespace = %set.namespace, "{verb} finalizer {}", naming::FINALIZER);
        Ok(true)
    }

    /// Leaves the deletion mark on the set (merge patch guarded by its UID: a set of that name
    /// created since gets none). `Ok(false)`: the set is gone or replaced, the plan is stale.
    async fn mark_deletion(&self, set: &SetFacts, propagation: Propagation) -> Result<bool> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &set.namespace);
        let value = mark_value(propagation, &set.uid);
        let patch = json!({"metadata": {
            "uid": set.uid,
            "annotations": {naming::DELETION_ANNOTATION: value},
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch(&set.name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                info!(set = %set.name, namespace = %set.namespace, mark = %value, "marked the deletion's propagation");
                Ok(true)
            }
            Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT, code::INVALID]) => {
                debug!(set = %set.name, error = %e, "set gone or replaced before its deletion mark");
                Ok(false)
            }
            Err(e) => Err(Error::kube("mark the deletion of statefulset", &set.name)(
                e,
            )),
        }
    }

    /// Writes the status annotations in a patch of their own, guarded by test ops on the set's UID
    /// and on the status it carried when decided: a set whose status someone else changed
    /// meanwhile is left alone (`Ok(false)`; that change wakes another pass). Under `--dry-run`,
    /// a `DryRun` record instead.
    pub async fn write_status(&self, set: &SetFacts, change: &Change) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        if self
            .reporter
            .skipped(&set_ref(set), &describe_status(&change.write))
            .await
        {
            return Ok(true);
        }
        let status_path = annotation_path(naming::STATUS_ANNOTATION);
        let carried = set.status.as_ref().map_or(json!(null), |s| json!(s));
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/uid", "value": set.uid}),
            json!({"op": "test", "path": status_path, "value": carried}),
        ];
        ops.extend(status_ops(&change.write));
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let request =
            apijson::patch_request::<StatefulSet>(Some(&set.namespace), &set.name, &ops, &params)?;
        match self.client.request::<StatefulSet>(request).await {
            Ok(_) => {
                debug!(set = %set.name, namespace = %set.namespace, status = %describe_status(&change.write), "wrote status");
                Ok(true)
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(set = %set.name, error = %e, "status write lost a race; the next pass decides again");
                Ok(false)
            }
            Err(e) => Err(Error::kube(
                "patch status annotations of statefulset",
                &set.name,
            )(e)),
        }
    }

    /// Publishes the Event of a status change (pause, resume) once its write went through.
    pub async fn status_event(&self, set: &SetFacts, change: &Change) {
        if let Some(event) = &change.event {
            self.publish(set, event, None).await;
        }
    }

    async fn delete_claim(&self, set: &SetFacts, name: &str, uid: &str) -> Result<()> {
        let ns = set.namespace.as_str();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        if let Deleted::Now = delete(&claims, name, uid, "delete claim").await? {
            self.metrics.claim_deleted();
            let note = format!("delete claim {name} in StatefulSet {}", set.name);
            let related = core_ref("PersistentVolumeClaim", ns, name, uid);
            self.report(set, Reason::SuccessfulDelete, uid, note, related)
                .await;
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
        self.report(set, reason, uid, note, pod_ref(ns, name, uid))
            .await;
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
                self.report(
                    live,
                    Reason::CleanupCancelled,
                    &pod.uid,
                    note,
                    pod_ref(ns, &pod.name, &pod.uid),
                )
                .await;
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
        self.record(live, records, status).await?;
        for pod in runs {
            if release && self.release(ns, &pod.name, &pod.uid).await? {
                self.metrics.release_window(sent.elapsed().as_secs_f64());
            }
            self.metrics.cleanup_started();
            let note = format!(
                "create cleanup pod {} (attempt {}) for ordinal {}",
                pod.name, pod.attempt, pod.ordinal
            );
            self.report(
                live,
                Reason::SuccessfulCreate,
                &pod.uid,
                note,
                pod_ref(ns, &pod.name, &pod.uid),
            )
            .await;
        }
        Ok(true)
    }

    /// Writes `records` on the set, only if its identity, spec (generation), template annotation
    /// and our previous record are still those of `live`: a compare-and-swap, so a successful write
    /// confirms every fact the verdicts were judged on.
    async fn record(
        &self,
        live: &SetFacts,
        records: &BTreeMap<u32, Record>,
        status: Option<&Write>,
    ) -> Result<()> {
        let mut ops = record_ops(live, records);
        // The status rides along: its ops test nothing, so they never fail the record's swap.
        ops.extend(status.map(status_ops).unwrap_or_default());
        match self.swap(live, &ops).await? {
            Ok(_) => Ok(()),
            // A failed test op (the set changed since the read) or a conflict: read again.
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(set = %live.name, error = %e, "record lost a race");
                Err(Error::Contended {
                    set: live.name.clone(),
                    answer: e.to_string(),
                })
            }
            Err(source) => Err(Error::Unrecorded {
                set: live.name.clone(),
                source,
            }),
        }
    }

    /// Whether the set is still as `live` shows it (UID, generation, template annotation, our
    /// record): a JSON patch of test ops only, which the API server applies without a change or
    /// refuses. What it confirms can change again only in the round trip to the next write.
    async fn guard(&self, live: &SetFacts) -> Result<bool> {
        match self.swap(live, &guard_ops(live)).await? {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(set = %live.name, error = %e, "the set changed since its read; no release");
                Ok(false)
            }
            Err(e) => Err(Error::kube("confirm the read of statefulset", &live.name)(
                e,
            )),
        }
    }

    /// Sends a JSON patch to the set, encoded as the API server encodes the set, so a test of the
    /// template compares like with like. The outer error: the patch could not be encoded.
    async fn swap(
        &self,
        live: &SetFacts,
        ops: &[serde_json::Value],
    ) -> Result<std::result::Result<StatefulSet, kube::Error>> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let request = apijson::patch_request::<StatefulSet>(
            Some(&live.namespace),
            &live.name,
            &ops,
            &params,
        )?;
        Ok(self.client.request::<StatefulSet>(request).await)
    }

    /// Removes our scheduling gate from a recorded cleanup pod (UID-guarded), so it may run.
    /// `Ok(false)`: the pod was gone or replaced, nothing was released.
    async fn release(&self, ns: &str, name: &str, uid: &str) -> Result<bool> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let patch = json!({
            "metadata": {"uid": uid},
            "spec": {"schedulingGates": [{"$patch": "delete", "name": naming::CONFIRM_GATE}]}
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match pods.patch(name, &params, &Patch::Strategic(&patch)).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {
                debug!(pod = %name, "cleanup pod gone or replaced before its release");
                Ok(false)
            }
            Err(e) => Err(Error::kube("release cleanup pod", name)(e)),
        }
    }

    async fn report_refusal(&self, set: &SetFacts, ordinal: u32, code: u16, message: &str) {
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
        self.publish(set, &event, None).await;
    }

    /// Publishes a Warning on `set` (once per `key` in this process), counted and logged.
    pub async fn warn(&self, set: &SetFacts, reason: Reason, key: String, note: String) {
        let event = Event { reason, note, key };
        self.publish(set, &event, None).await;
    }

    /// Publishes an Event about a write that went through, related to the object written.
    async fn report(
        &self,
        set: &SetFacts,
        reason: Reason,
        key: &str,
        note: String,
        related: ObjectReference,
    ) {
        let event = Event {
            reason,
            note,
            key: key.to_string(),
        };
        self.publish(set, &event, Some(related)).await;
    }

    /// Reports `event` on the set, with the object written as its related object.
    async fn publish(&self, set: &SetFacts, event: &Event, related: Option<ObjectReference>) {
        let mut outcome =
            Outcome::new(event.reason, set_ref(set), event.note.clone()).key(event.key.clone());
        outcome.related = related;
        self.reporter.report(outcome).await;
    }
}

/// Deletes `name` if it still has `uid`.
async fn delete<K>(api: &Api<K>, name: &str, uid: &str, action: &'static str) -> Result<Deleted>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(Deleted::Now),
        // 404: already gone. 409: the name now belongs to a newer object, which is not ours to delete.
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {
            debug!(name, code = ?status_code(&e), "already deleted or replaced");
            Ok(Deleted::Before)
        }
        Err(e) => Err(Error::kube(action, name)(e)),
    }
}

fn set_ref(set: &SetFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("StatefulSet".into()),
        name: Some(set.name.clone()),
        namespace: Some(set.namespace.clone()),
        uid: Some(set.uid.clone()),
        ..Default::default()
    }
}

fn pod_ref(ns: &str, name: &str, uid: &str) -> ObjectReference {
    core_ref("Pod", ns, name, uid)
}

/// A reference to a core/v1 object, for an Event's related object.
fn core_ref(kind: &str, ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        namespace: Some(ns.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// One line saying what a write step would do (for dry-run logs and Events).
pub fn describe(step: &Step) -> String {
    match step {
        Step::SetFinalizers { adding: true, .. } => format!("add finalizer {}", naming::FINALIZER),
        Step::SetFinalizers { adding: false, .. } => {
            format!("remove finalizer {}", naming::FINALIZER)
        }
        Step::MarkDeletion { propagation } => format!("mark deletion {propagation:?}"),
        Step::DeleteStatefulPod { name, .. } => format!("delete pod {name}"),
        Step::CreateCleanupPod {
            ordinal, attempt, ..
        } => format!("create cleanup pod for ordinal {ordinal} (attempt {attempt})"),
        Step::Release { name, .. } => format!("release cleanup pod {name}"),
        Step::DeleteClaim { name, .. } => format!("delete claim {name}"),
        Step::DeleteCleanupPod { name, .. } => format!("delete cleanup pod {name}"),
        Step::MarkNextAttempt { claim, attempt, .. } => {
            format!("mark claim {claim} with next attempt {attempt:?}")
        }
        Step::Event(Event { reason, .. }) => format!("publish event {reason}"),
    }
}

#[cfg(test)]
mod tests;

/// The JSON pointer of an annotation (RFC 6901 escapes).
/// The JSON patch of a record: `test` ops on the set's UID, generation, template annotation and
/// our previous record (or its absence) as `live` shows them, then the new record. Sent encoded by
/// [`apijson::to_vec`], so the template compares equal exactly when it is unchanged.
pub fn record_ops(live: &SetFacts, records: &BTreeMap<u32, Record>) -> Vec<serde_json::Value> {
    let path = annotation_path(naming::RECORD_ANNOTATION);
    let mut ops = guard_ops(live);
    ops.push(json!({"op": "add", "path": path, "value": format_records(records)}));
    ops
}

/// The `test` ops of a record: the set's UID, generation, template annotation and our record (or
/// its absence) as `live` shows them.
pub fn guard_ops(live: &SetFacts) -> Vec<serde_json::Value> {
    let path = annotation_path(naming::RECORD_ANNOTATION);
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": live.uid}),
        json!({"op": "test", "path": "/metadata/generation", "value": live.generation}),
    ];
    if let Some(template) = &live.template {
        let template_path = annotation_path(naming::TEMPLATE_ANNOTATION);
        ops.push(json!({"op": "test", "path": template_path, "value": template}));
    }
    // No record in the read: the API server takes a null test value as "absent", so a record
    // written meanwhile by another pass or writer is never overwritten from a stale read.
    let old = live.record_raw.as_ref().map_or(json!(null), |r| json!(r));
    ops.push(json!({"op": "test", "path": path, "value": old}));
    ops
}

fn annotation_path(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// The status change of the plan for a finalizer patch, unless one already carried it.
fn plan_status<'a>(done: &Done, status: Option<&'a Change>) -> Option<&'a Write> {
    status.filter(|_| done.status.is_none()).map(|c| &c.write)
}

/// JSON-patch ops writing the status annotations: they test nothing, and removing the reason is
/// an add then a remove, so they apply whether or not the reason is there.
pub fn status_ops(write: &Write) -> Vec<serde_json::Value> {
    let status = annotation_path(naming::STATUS_ANNOTATION);
    let reason = annotation_path(naming::STATUS_REASON_ANNOTATION);
    let gone = |path: &str| {
        [
            json!({"op": "add", "path": path, "value": ""}),
            json!({"op": "remove", "path": path}),
        ]
    };
    match write {
        Write::Set(line) => {
            let mut ops = vec![json!({"op": "add", "path": status, "value": line.status.as_str()})];
            match &line.reason {
                Some(text) => ops.push(json!({"op": "add", "path": reason, "value": text})),
                None => ops.extend(gone(&reason)),
            }
            ops
        }
        Write::Remove => gone(&status).into_iter().chain(gone(&reason)).collect(),
    }
}

/// The status annotations as a merge patch's `metadata.annotations` (null removes).
fn status_merge(write: &Write) -> serde_json::Value {
    let (status, reason) = match write {
        Write::Set(line) => (json!(line.status.as_str()), json!(line.reason)),
        Write::Remove => (json!(null), json!(null)),
    };
    json!({naming::STATUS_ANNOTATION: status, naming::STATUS_REASON_ANNOTATION: reason})
}

/// One line saying what a status write does (for dry-run records and logs).
pub fn describe_status(write: &Write) -> String {
    match write {
        Write::Set(line) => match &line.reason {
            Some(reason) => format!("set status {} ({reason})", line.status),
            None => format!("set status {}", line.status),
        },
        Write::Remove => "remove the status annotations".into(),
    }
}
