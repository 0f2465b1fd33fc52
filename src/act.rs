//! ACT: the only code that writes to the API server. It carries out a `Plan` step by step and is
//! idempotent: a create that meets 409 AlreadyExists and a delete that meets 404 NotFound are done;
//! deletes carry the UID they were decided on, so a newer object with the same name is never hit.

use std::collections::HashSet;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::decide::{Event, Plan, PodDeletion, Step};
use crate::error::{Error, Result, status_code};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::naming;
use crate::observe::SetFacts;

/// Field manager of every write we make.
pub const FIELD_MANAGER: &str = "statefulset-scaledown-controller";

/// Reasons of the Events `act` itself publishes, after a write went through.
pub mod reason {
    pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
    pub const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
    pub const CLEANUP_RETRY: &str = "CleanupRetry";
    pub const CLEANUP_POD_REJECTED: &str = "CleanupPodRejected";
    pub const DRY_RUN: &str = "DryRun";
}

/// How many published event keys we remember before starting over.
const EVENT_MEMORY: usize = 10_000;

pub struct Actor {
    client: Client,
    recorder: Recorder,
    dry_run: bool,
    metrics: std::sync::Arc<Metrics>,
    leadership: std::sync::Arc<Leadership>,
    /// (set UID, reason, key) of events already published by this process.
    published: Mutex<HashSet<(String, &'static str, String)>>,
}

enum Outcome {
    Done,
    /// The object was already in the wanted state (409 on create, 404 or UID mismatch on delete).
    AlreadyDone,
}

impl Actor {
    pub fn new(
        client: Client,
        reporter: Reporter,
        dry_run: bool,
        metrics: std::sync::Arc<Metrics>,
        leadership: std::sync::Arc<Leadership>,
    ) -> Self {
        Actor {
            leadership,
            recorder: Recorder::new(client.clone(), reporter),
            client,
            dry_run,
            metrics,
            published: Mutex::new(HashSet::new()),
        }
    }

    /// Carries out `plan` for `set`, stopping at the first failed write.
    pub async fn execute(&self, set: &SetFacts, plan: &Plan) -> Result<()> {
        for step in &plan.steps {
            // Checked right before every write: a leader past its renew deadline stops mid-plan.
            if !self.leadership.may_write() {
                return Err(Error::NotLeader);
            }
            if let Step::Event(event) = step {
                let new = self
                    .publish(
                        set,
                        event.warning,
                        event.reason,
                        &event.key,
                        event.note.clone(),
                        None,
                    )
                    .await;
                match event.reason {
                    crate::decide::reason::CLEANUP_FAILED if new => self.metrics.cleanup_failed(),
                    crate::decide::reason::CLEANUP_GAVE_UP if new => {
                        self.metrics.cleanup_given_up()
                    }
                    _ => {}
                }
                continue;
            }
            if self.dry_run {
                let what = describe(step);
                info!(set = %set.name, namespace = %set.namespace, "dry-run: would {what}");
                self.publish(
                    set,
                    false,
                    reason::DRY_RUN,
                    &what,
                    format!("dry-run: would {what}"),
                    None,
                )
                .await;
                continue;
            }
            self.write(set, step).await?;
        }
        Ok(())
    }

    async fn write(&self, set: &SetFacts, step: &Step) -> Result<()> {
        let ns = set.namespace.as_str();
        match step {
            Step::SetFinalizers {
                finalizers,
                resource_version,
                adding,
            } => {
                let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
                // The resourceVersion makes this a compare-and-swap: a concurrent change is a 409.
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
                api.patch(&set.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube("patch finalizers of statefulset", &set.name))?;
                info!(set = %set.name, namespace = ns, "{} finalizer {}", if *adding { "added" } else { "removed" }, naming::FINALIZER);
            }
            Step::DeleteStatefulPod { name, uid } => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                if let Outcome::Done = delete(&pods, name, uid, "pod").await? {
                    let note = format!(
                        "deleted pod {name} of the deleted StatefulSet so its claims can be cleaned"
                    );
                    self.publish(
                        set,
                        false,
                        reason::SUCCESSFUL_DELETE,
                        uid,
                        note,
                        Some(pod_ref(ns, name, uid)),
                    )
                    .await;
                }
            }
            Step::CreateCleanupPod {
                ordinal,
                attempt,
                pod,
            } => {
                let name = naming::pod_name(&set.name, *ordinal);
                match self.create_pod(ns, &name, pod).await? {
                    Some(uid) => {
                        self.metrics.cleanup_started();
                        info!(set = %set.name, namespace = ns, pod = %name, attempt, "created cleanup pod");
                        let note = format!(
                            "create cleanup pod {name} (attempt {attempt}) for ordinal {ordinal}"
                        );
                        self.publish(
                            set,
                            false,
                            reason::SUCCESSFUL_CREATE,
                            &uid,
                            note,
                            Some(pod_ref(ns, &name, &uid)),
                        )
                        .await;
                    }
                    None => debug!(pod = %name, namespace = ns, "cleanup pod already exists"),
                }
            }
            Step::DeleteClaim { name, uid } => {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                if let Outcome::Done = delete(&claims, name, uid, "claim").await? {
                    self.metrics.claim_deleted();
                    info!(set = %set.name, namespace = ns, claim = %name, "deleted claim");
                    let note = format!("delete claim {name} in StatefulSet {}", set.name);
                    let related = core_ref("PersistentVolumeClaim", ns, name, uid);
                    self.publish(
                        set,
                        false,
                        reason::SUCCESSFUL_DELETE,
                        uid,
                        note,
                        Some(related),
                    )
                    .await;
                }
            }
            Step::DeleteCleanupPod {
                name,
                uid,
                why,
                ran_for,
            } => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                if let Outcome::Done = delete(&pods, name, uid, "pod").await? {
                    let (reason, note) = match why {
                        PodDeletion::Completed => {
                            self.metrics.cleanup_succeeded();
                            if let Some(took) = ran_for {
                                self.metrics.cleanup_took(took.as_secs_f64());
                            }
                            (
                                reason::SUCCESSFUL_DELETE,
                                format!("delete cleanup pod {name} in StatefulSet {}", set.name),
                            )
                        }
                        PodDeletion::Retry => (
                            reason::CLEANUP_RETRY,
                            format!("deleted failed cleanup pod {name} to start the next attempt"),
                        ),
                    };
                    info!(set = %set.name, namespace = ns, pod = %name, ?why, "deleted cleanup pod");
                    self.publish(set, false, reason, uid, note, Some(pod_ref(ns, name, uid)))
                        .await;
                }
            }
            Step::MarkNextAttempt {
                claim,
                uid,
                attempt,
            } => {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                let value = attempt.map(|a| a.to_string());
                // metadata.uid in the body is checked by the API server: a different claim is a 409.
                let patch = json!({"metadata": {"uid": uid, "annotations": {naming::NEXT_ATTEMPT_ANNOTATION: value}}});
                match claims
                    .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => debug!(claim = %claim, ?attempt, "marked next attempt"),
                    Err(e) if matches!(status_code(&e), Some(404 | 409)) => {
                        debug!(claim = %claim, "claim changed; mark skipped")
                    }
                    Err(e) => return Err(Error::kube("annotate claim", claim)(e)),
                }
            }
            Step::Event(_) => {}
        }
        Ok(())
    }

    /// Creates the cleanup pod from its JSON, unchanged. `None` when it already exists.
    async fn create_pod(
        &self,
        ns: &str,
        name: &str,
        pod: &serde_json::Value,
    ) -> Result<Option<String>> {
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
            Ok(created) => Ok(Some(created.metadata.uid.unwrap_or_default())),
            Err(e) if status_code(&e) == Some(409) => Ok(None),
            Err(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => {
                Err(Error::PodRejected {
                    pod: name.into(),
                    message: status.message.clone(),
                })
            }
            Err(e) => Err(Error::kube("create cleanup pod", name)(e)),
        }
    }

    /// Publishes the Warning for a pod the API server refused, once per distinct message.
    pub async fn report_rejection(&self, set: &SetFacts, err: &Error) {
        if let Error::PodRejected { .. } = err {
            let note = format!("{err}; fix the cleanup pod template");
            self.publish(
                set,
                true,
                reason::CLEANUP_POD_REJECTED,
                &note.clone(),
                note,
                None,
            )
            .await;
        }
    }

    /// Publishes an Event on the set unless this process already published it (same reason, key).
    /// Returns whether it was new.
    async fn publish(
        &self,
        set: &SetFacts,
        warning: bool,
        reason: &'static str,
        key: &str,
        note: String,
        related: Option<ObjectReference>,
    ) -> bool {
        {
            let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
            if published.len() >= EVENT_MEMORY {
                published.clear();
            }
            if !published.insert((set.uid.clone(), reason, key.to_string())) {
                return false;
            }
        }
        if warning {
            warn!(set = %set.name, namespace = %set.namespace, reason, "{note}");
        }
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(truncate(note, 1000)),
            action: reason.into(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&event, &set_ref(set)).await {
            warn!(set = %set.name, namespace = %set.namespace, reason, error = %e, "could not publish event");
        }
        true
    }
}

/// Deletes `name` if it still has `uid`.
async fn delete<K>(api: &Api<K>, name: &str, uid: &str, what: &'static str) -> Result<Outcome>
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
        Ok(_) => Ok(Outcome::Done),
        // 404: already gone. 409: the name now belongs to a newer object, which is not ours to delete.
        Err(e) if matches!(status_code(&e), Some(404 | 409)) => {
            debug!(name, what, "already deleted or replaced");
            Ok(Outcome::AlreadyDone)
        }
        Err(e) => Err(Error::kube(
            if what == "pod" {
                "delete pod"
            } else {
                "delete claim"
            },
            name,
        )(e)),
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

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// One line saying what a write step would do (for dry-run logs and Events).
pub fn describe(step: &Step) -> String {
    match step {
        Step::SetFinalizers { adding: true, .. } => format!("add finalizer {}", naming::FINALIZER),
        Step::SetFinalizers { adding: false, .. } => {
            format!("remove finalizer {}", naming::FINALIZER)
        }
        Step::DeleteStatefulPod { name, .. } => format!("delete pod {name}"),
        Step::CreateCleanupPod {
            ordinal, attempt, ..
        } => {
            format!("create cleanup pod for ordinal {ordinal} (attempt {attempt})")
        }
        Step::DeleteClaim { name, .. } => format!("delete claim {name}"),
        Step::DeleteCleanupPod { name, .. } => format!("delete cleanup pod {name}"),
        Step::MarkNextAttempt { claim, attempt, .. } => {
            format!("mark claim {claim} with next attempt {attempt:?}")
        }
        Step::Event(Event { reason, .. }) => format!("publish event {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }
}
