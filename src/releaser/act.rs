//! ACT: the releaser's one write. `spec.claimRef` is removed by a JSON patch whose first operation
//! tests the claim's UID, so a PV bound to another claim meanwhile fails the test and is left alone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tracing::{debug, info, warn};

use super::observe::PvFacts;
use crate::error::{Error, Result, code, is_status};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::reason::Reason;

pub struct Releaser {
    client: Client,
    recorder: Recorder,
    dry_run: bool,
    metrics: Arc<Metrics>,
    leadership: Arc<Leadership>,
}

impl Releaser {
    pub fn new(
        client: Client,
        reporter: Reporter,
        dry_run: bool,
        metrics: Arc<Metrics>,
        leadership: Arc<Leadership>,
    ) -> Self {
        Releaser {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            dry_run,
            metrics,
            leadership,
        }
    }

    /// Removes `pv`'s claimRef if it still names the claim with `claim_uid`.
    pub async fn release(&self, pv: &PvFacts, claim_uid: &str) -> Result<()> {
        if !self.leadership.may_write() {
            return Err(Error::NotLeader);
        }
        let claim = pv
            .claim_ref
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        if self.dry_run {
            let note = format!(
                "dry-run: would release PV {} (claim {claim} is gone)",
                pv.name
            );
            info!(pv = %pv.name, reason = %Reason::DryRun, "{note}");
            return Ok(());
        }
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/spec/claimRef/uid", "value": claim_uid},
            {"op": "remove", "path": "/spec/claimRef"},
        ]))
        .map_err(|source| Error::Encode {
            what: "release patch",
            source,
        })?;
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api
            .patch(&pv.name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => {
                self.metrics.pv_released();
                let note = format!(
                    "released: claim {claim} is gone; the volume is Available again with its data"
                );
                info!(pv = %pv.name, reason = %Reason::Released, "{note}");
                self.publish(pv, Reason::Released, note).await;
                Ok(())
            }
            // The test op failed (bound to another claim meanwhile), or the PV is gone.
            Err(e) if is_status(&e, &[code::INVALID, code::CONFLICT, code::NOT_FOUND]) => {
                debug!(pv = %pv.name, error = %e, "PV changed before its release; left alone");
                Ok(())
            }
            Err(e) => {
                let note = format!("could not release PV {}: {e}", pv.name);
                self.publish(pv, Reason::ReleaseFailed, note).await;
                Err(Error::kube("release persistentvolume", &pv.name)(e))
            }
        }
    }

    async fn publish(&self, pv: &PvFacts, reason: Reason, note: String) {
        self.metrics.event(reason);
        let event = KubeEvent {
            type_: if reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: "Release".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolume".into()),
            name: Some(pv.name.clone()),
            uid: Some(pv.uid.clone()),
            ..Default::default()
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            warn!(pv = %pv.name, reason = %reason, error = %e, "could not publish event");
        }
    }
}
