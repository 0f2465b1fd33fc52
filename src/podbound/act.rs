//! ACT: the writes for pod-bound claims. OwnerReferences are added by a JSON patch whose test ops
//! check the claim's UID and resourceVersion (a change in between fails the test, and the next pass
//! decides again on the new state); the deletion carries both as preconditions.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, PatchParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tracing::{debug, info, warn};

use super::decide::names;
use super::observe::{ClaimFacts, PodRef};
use crate::apijson;
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

    /// Adds ownerReferences to `pods` to the claim (never controller ones, blockOwnerDeletion
    /// false), so the garbage collector deletes it only once all of them are gone.
    pub async fn attach(&self, claim: &ClaimFacts, pods: &[PodRef]) -> Result<()> {
        let who = names(pods);
        if !self.may_write(claim, &format!("bind claim {} to pods {who}", claim.name))? {
            return Ok(());
        }
        let patch = owner_patch(claim, pods).map_err(|source| Error::Encode {
            what: "owner patch",
            source,
        })?;
        let request = apijson::patch_request::<PersistentVolumeClaim>(
            Some(&claim.namespace),
            &claim.name,
            &patch,
            &PatchParams::default(),
        )?;
        match self.client.request::<PersistentVolumeClaim>(request).await {
            Ok(_) => {
                self.metrics.event(Reason::BoundToPod);
                let uids: Vec<String> = pods
                    .iter()
                    .map(|p| format!("{} (uid {})", p.name, p.uid))
                    .collect();
                let note = format!(
                    "claim {} is deleted once every pod that owns it is gone; owners added: {}",
                    claim.name,
                    uids.join(", ")
                );
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

/// The JSON patch that adds ownerReferences to `pods`: it first tests the claim's UID and
/// resourceVersion, so it applies only to the state the decision was made on; the claim's other
/// ownerReferences stay as they are.
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
mod requests;

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owners: Vec<(String, String, String)>) -> ClaimFacts {
        ClaimFacts {
            namespace: "ns".into(),
            name: "cache".into(),
            uid: "uid-claim".into(),
            resource_version: "5".into(),
            pod: Some("runner".into()),
            created: None,
            deleting: false,
            owners,
        }
    }

    fn pods(names: &[&str]) -> Vec<PodRef> {
        names
            .iter()
            .map(|n| PodRef {
                name: n.to_string(),
                uid: format!("uid-{n}"),
            })
            .collect()
    }

    fn live(owners: serde_json::Value, rv: &str) -> serde_json::Value {
        let mut meta = json!({"name": "cache", "uid": "uid-claim", "resourceVersion": rv});
        if !owners.is_null() {
            meta["ownerReferences"] = owners;
        }
        json!({"metadata": meta})
    }

    fn owner_uids(doc: &serde_json::Value) -> Vec<String> {
        doc["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o["uid"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn the_owner_patch_adds_every_pod_to_the_state_it_was_decided_on() {
        let patch = owner_patch(&claim(Vec::new()), &pods(&["runner", "reader"])).expect("patch");
        let mut doc = live(serde_json::Value::Null, "5");
        json_patch::patch(&mut doc, &patch).expect("applies");
        assert_eq!(owner_uids(&doc), ["uid-runner", "uid-reader"]);
        let reader = &doc["metadata"]["ownerReferences"][1];
        assert_eq!(reader["blockOwnerDeletion"], json!(false));
        assert!(reader.get("controller").is_none(), "never a controller");

        // Added to the owners there are, which stay.
        let owners = vec![("Pod".into(), "runner".into(), "uid-runner".into())];
        let patch = owner_patch(&claim(owners), &pods(&["late"])).expect("patch");
        let mut doc = live(
            json!([{"kind": "Pod", "name": "runner", "uid": "uid-runner"}]),
            "5",
        );
        json_patch::patch(&mut doc, &patch).expect("applies");
        assert_eq!(owner_uids(&doc), ["uid-runner", "uid-late"]);
    }

    #[test]
    fn the_owner_patch_fails_on_a_changed_or_replaced_claim() {
        let patch = owner_patch(&claim(Vec::new()), &pods(&["runner"])).expect("patch");
        let mut changed = live(serde_json::Value::Null, "6");
        assert!(
            json_patch::patch(&mut changed, &patch).is_err(),
            "resourceVersion"
        );
        let mut replaced = live(serde_json::Value::Null, "5");
        replaced["metadata"]["uid"] = json!("uid-new");
        assert!(json_patch::patch(&mut replaced, &patch).is_err(), "uid");
        assert_eq!(owner_uids(&replaced), Vec::<String>::new());
    }
}
