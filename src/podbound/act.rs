//! ACT: the writes for pod-bound claims. The ownerReference is added by a merge patch guarded by
//! the claim's resourceVersion (a change in between is a 409, and the next pass decides again); the
//! deletion carries the claim's UID as a precondition.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tracing::{debug, info, warn};

use super::observe::ClaimFacts;
use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::reason::Reason;

pub struct Binder {
    client: Client,
    recorder: Recorder,
    dry_run: bool,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
}

impl Binder {
    pub fn new(
        client: Client,
        reporter: Reporter,
        dry_run: bool,
        metrics: Arc<Metrics>,
        leadership: Arc<Leadership>,
    ) -> Self {
        Binder {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            dry_run,
            metrics,
            leadership,
        }
    }

    fn api(&self, claim: &ClaimFacts) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &claim.namespace)
    }

    fn may_write(&self, claim: &ClaimFacts, what: &str) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        if self.dry_run {
            info!(claim = %claim.name, namespace = %claim.namespace, reason = %Reason::DryRun, "dry-run: would {what}");
        }
        Ok(!self.dry_run)
    }

    /// Adds an ownerReference to pod `pod` (`uid`) to the claim.
    pub async fn attach(&self, claim: &ClaimFacts, pod: &str, uid: &str) -> Result<()> {
        if !self.may_write(claim, &format!("bind claim {} to pod {pod}", claim.name))? {
            return Ok(());
        }
        let reference = json!({"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid});
        // Guarded by the claim's UID and resourceVersion (a failed test is a 422); the claim's other
        // ownerReferences stay as they are.
        let add = if claim.owners.is_empty() {
            json!({"op": "add", "path": "/metadata/ownerReferences", "value": [reference]})
        } else {
            json!({"op": "add", "path": "/metadata/ownerReferences/-", "value": reference})
        };
        let ops = json!([
            {"op": "test", "path": "/metadata/uid", "value": claim.uid},
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version},
            add,
        ]);
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(|source| Error::Encode {
                what: "owner patch",
                source,
            })?;
        match self
            .api(claim)
            .patch(
                &claim.name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => {
                self.metrics.event(Reason::BoundToPod);
                let note = format!("claim {} is deleted with pod {pod} (uid {uid})", claim.name);
                info!(claim = %claim.name, namespace = %claim.namespace, "{note}");
                self.publish(claim, Reason::BoundToPod, note).await;
                Ok(())
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(claim = %claim.name, "claim changed before the binding; next pass");
                Ok(())
            }
            Err(e) => Err(Error::kube("bind claim to pod", &claim.name)(e)),
        }
    }

    /// Deletes the claim (UID precondition): its pod is gone and it was never bound.
    pub async fn delete(&self, claim: &ClaimFacts) -> Result<()> {
        let pod = claim.pod.clone().unwrap_or_default();
        if !self.may_write(
            claim,
            &format!("delete claim {} (pod {pod} is gone)", claim.name),
        )? {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(claim.uid.clone()),
                resource_version: Some(claim.resource_version.clone()),
            }),
            ..Default::default()
        };
        match self.api(claim).delete(&claim.name, &params).await {
            Ok(_) => {
                self.metrics.event(Reason::DeletedWithPod);
                let note = format!("deleted claim {}: its pod {pod} is gone", claim.name);
                info!(claim = %claim.name, namespace = %claim.namespace, "{note}");
                self.publish(claim, Reason::DeletedWithPod, note).await;
                Ok(())
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::NOT_FOUND]) => Ok(()),
            Err(e) => Err(Error::kube("delete claim", &claim.name)(e)),
        }
    }

    /// A Warning on the claim, without a write.
    pub async fn refuse(&self, claim: &ClaimFacts, reason: Reason, note: String) {
        self.metrics.event(reason);
        warn!(claim = %claim.name, namespace = %claim.namespace, reason = %reason, "{note}");
        self.publish(claim, reason, note).await;
    }

    async fn publish(&self, claim: &ClaimFacts, reason: Reason, note: String) {
        let event = KubeEvent {
            type_: if reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: "BindToPod".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(claim.name.clone()),
            namespace: Some(claim.namespace.clone()),
            uid: Some(claim.uid.clone()),
            ..Default::default()
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            warn!(claim = %claim.name, reason = %reason, error = %e, "could not publish event");
        }
    }
}
