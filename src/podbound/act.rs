//! ACT: the writes for pod-bound claims. OwnerReferences are added by a JSON patch whose test ops
//! check the claim's UID and resourceVersion (a change in between fails the test, and the next pass
//! decides again on the new state); the deletion carries both as preconditions.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, PatchParams, Preconditions};
use serde_json::json;
use tracing::{debug, info};

use super::decide::names;
use super::observe::{ClaimFacts, PodRef, Waiting};
use crate::apijson;
use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::naming::WAITING_SINCE_ANNOTATION;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};

/// The pod-bound claims' writer: the owner patch, the waiting record, the deletion, and the reports.
pub struct Actor {
    client: Client,
    reporter: Arc<Reporter>,
    leadership: Arc<Leadership>,
}

impl Actor {
    /// A writer through `client`, reporting through `reporter`, that writes only while `leadership` allows.
    pub fn new(client: Client, reporter: Arc<Reporter>, leadership: Arc<Leadership>) -> Self {
        Actor {
            client,
            reporter,
            leadership,
        }
    }

    fn api(&self, claim: &ClaimFacts) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &claim.namespace)
    }

    /// Whether the write `what` may be made now: an error when this replica may no longer write;
    /// false under `--dry-run` (reported as a `DryRun` outcome instead).
    async fn may_write(&self, claim: &ClaimFacts, what: &str) -> Result<bool> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        Ok(!self.reporter.skipped(&claim_ref(claim), what).await)
    }

    /// Adds `pods` as owners of `claim` (a JSON patch whose test ops pin the claim's UID and resourceVersion).
    pub async fn attach(&self, claim: &ClaimFacts, pods: &[PodRef]) -> Result<()> {
        let who = names(pods);
        let what = format!("bind claim {} to pods {who}", claim.name);
        if !self.may_write(claim, &what).await? {
            return Ok(());
        }
        match self
            .patch(claim, owner_patch(claim, pods), "owner patch")
            .await?
        {
            Ok(()) => {
                let uids: Vec<String> = pods
                    .iter()
                    .map(|p| format!("{} (uid {})", p.name, p.uid))
                    .collect();
                let note = format!(
                    "claim {} is deleted once every pod that owns it is gone; owners added: {}",
                    claim.name,
                    uids.join(", ")
                );
                let outcome = Outcome::new(Reason::BoundToPod, claim_ref(claim), note);
                self.reporter.report(outcome.key(who)).await;
                Ok(())
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(claim = %claim.name, "claim changed before the binding; next pass");
                Ok(())
            }
            Err(e) => Err(Error::kube("bind claim to pod", &claim.name)(e)),
        }
    }

    /// Sends one JSON patch (its test ops guard the claim) to the claim, Go-encoded. The outer
    /// error is an encoding failure; the inner one the API server's answer.
    async fn patch(
        &self,
        claim: &ClaimFacts,
        patch: std::result::Result<json_patch::Patch, serde_json::Error>,
        what: &'static str,
    ) -> Result<std::result::Result<(), kube::Error>> {
        let patch = patch.map_err(|source| Error::Encode { what, source })?;
        let request = apijson::patch_request::<PersistentVolumeClaim>(
            Some(&claim.namespace),
            &claim.name,
            &patch,
            &PatchParams::default(),
        )?;
        Ok(self
            .client
            .request::<PersistentVolumeClaim>(request)
            .await
            .map(|_| ()))
    }

    /// Records on the claim since when it waits for its pod (`waiting`), by one JSON patch that
    /// tests the claim's UID and resourceVersion: the grace before its deletion starts then.
    pub async fn record(&self, claim: &ClaimFacts, waiting: &Waiting) -> Result<()> {
        let pod = &waiting.pod;
        let what = format!("record that claim {} waits for pod {pod}", claim.name);
        if !self.may_write(claim, &what).await? {
            return Ok(());
        }
        match self
            .patch(claim, waiting_patch(claim, waiting), "waiting patch")
            .await?
        {
            Ok(()) => {
                info!(namespace = %claim.namespace, claim = %claim.name, %pod, since = %waiting.since, "claim waits for its pod; the grace starts");
                Ok(())
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
                debug!(claim = %claim.name, "claim changed before the record; next pass");
                Ok(())
            }
            Err(e) => Err(Error::kube("record waiting claim", &claim.name)(e)),
        }
    }

    /// Deletes the claim (UID precondition): its pod is gone and it was never bound.
    pub async fn delete(&self, claim: &ClaimFacts) -> Result<()> {
        let pod = claim.pod.clone().unwrap_or_default();
        if !self
            .may_write(
                claim,
                &format!("delete claim {} (pod {pod} is gone)", claim.name),
            )
            .await?
        {
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
                let note = format!("deleted claim {}: its pod {pod} is gone", claim.name);
                let outcome = Outcome::new(Reason::DeletedWithPod, claim_ref(claim), note);
                self.reporter.report(outcome).await;
                Ok(())
            }
            Err(e) if is_status(&e, &[code::CONFLICT, code::NOT_FOUND]) => Ok(()),
            Err(e) => Err(Error::kube("delete claim", &claim.name)(e)),
        }
    }

    /// A Warning on the claim, without a write.
    /// Reports a claim left alone, once per claim and note.
    pub async fn refuse(&self, claim: &ClaimFacts, reason: Reason, note: String) {
        let outcome = Outcome::new(reason, claim_ref(claim), note.clone());
        self.reporter.report(outcome.key(note)).await;
    }
}

/// The claim, as the object of its Events.
fn claim_ref(claim: &ClaimFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some(claim.name.clone()),
        namespace: Some(claim.namespace.clone()),
        uid: Some(claim.uid.clone()),
        ..Default::default()
    }
}

/// The JSON patch that records `waiting` on the claim, on the state it was decided on.
pub fn waiting_patch(
    claim: &ClaimFacts,
    waiting: &Waiting,
) -> std::result::Result<json_patch::Patch, serde_json::Error> {
    let key = WAITING_SINCE_ANNOTATION
        .replace('~', "~0")
        .replace('/', "~1");
    serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": claim.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version},
        // An opted-in claim has annotations (the binding); `add` replaces an older record.
        {"op": "add", "path": format!("/metadata/annotations/{key}"), "value": waiting.format()},
    ]))
}

/// The JSON patch that adds `pods` as owners of `claim`, tested against the state it was decided on.
pub fn owner_patch(
    claim: &ClaimFacts,
    pods: &[PodRef],
) -> std::result::Result<json_patch::Patch, serde_json::Error> {
    let reference = |p: &PodRef| {
        json!({"apiVersion": "v1", "kind": "Pod", "name": p.name, "uid": p.uid,
               "blockOwnerDeletion": false})
    };
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": claim.uid}),
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version}),
    ];
    if claim.owners.is_empty() {
        let all: Vec<_> = pods.iter().map(reference).collect();
        ops.push(json!({"op": "add", "path": "/metadata/ownerReferences", "value": all}));
    } else {
        for p in pods {
            ops.push(
                json!({"op": "add", "path": "/metadata/ownerReferences/-", "value": reference(p)}),
            );
        }
    }
    serde_json::from_value(serde_json::Value::Array(ops))
}

#[cfg(test)]
mod tests;
