//! The Lease record, read and written as client-go's `LeaseLock` does. Every write carries the
//! resourceVersion of the read it is based on (a JSON merge patch with `metadata.resourceVersion`,
//! which the API server checks), so of two candidates taking over the same expired Lease only one
//! succeeds; the other gets `409 Conflict`. Expiry is judged by the local clock only: a Lease held
//! by another is free once it has not changed for its lease duration since this process first saw
//! it in that state (its `renewTime`, written by another clock, is never compared with ours).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use crate::naming::CONTROLLER_NAME;

/// Election settings, from the flags.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// The namespace of the Lease.
    pub namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity, the Lease's holder while it leads.
    pub identity: String,
    /// How long a Lease holds without a renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops writing.
    pub renew_deadline: Duration,
    /// How often a candidate tries to take the Lease, and the leader renews it.
    pub retry_period: Duration,
}

/// What one attempt to acquire or renew found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The Lease is ours: the write that made it so was sent at `sent` (by the local clock).
    Ours { sent: Instant },
    /// Another holder's term has not run out yet.
    Held(String),
}

/// The last state of the Lease this process saw, and since when (local clock).
#[derive(Clone, Debug)]
struct Observed {
    resource_version: String,
    since: Instant,
    /// Whether we held the Lease in that state.
    ours: bool,
}

/// One candidate's view of the Lease.
pub struct Elector {
    leases: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observed: Option<Observed>,
}

impl Elector {
    pub fn new(leases: Api<Lease>, config: &ElectionConfig) -> Self {
        Elector {
            leases,
            name: config.lease_name.clone(),
            identity: config.identity.clone(),
            duration: config.lease_duration,
            observed: None,
        }
    }

    /// Reads the Lease and makes it ours if it is ours already (a renewal), free, or expired: one
    /// read and one conditional write (or a create, if there is no Lease).
    pub async fn try_acquire_or_renew(&mut self) -> kube::Result<Attempt> {
        let Some(lease) = self.leases.get_opt(&self.name).await? else {
            return self.create().await;
        };
        let resource_version = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        let since = match &self.observed {
            Some(seen) if seen.resource_version == resource_version => seen.since,
            _ => now,
        };
        let spec = lease.spec.unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        self.observed = Some(Observed {
            resource_version: resource_version.clone(),
            since,
            ours,
        });
        if let Some(other) = holder.filter(|_| !ours) {
            let term = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.duration, Duration::from_secs);
            if now < since + term {
                return Ok(Attempt::Held(other));
            }
        }
        let taken = Timestamp::now();
        let (acquired, transitions) = if ours {
            (
                spec.acquire_time.map(|t| t.0).unwrap_or(taken),
                spec.lease_transitions.unwrap_or(0),
            )
        } else {
            (taken, spec.lease_transitions.unwrap_or(0) + 1)
        };
        let patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration_seconds(),
                "acquireTime": MicroTime(acquired),
                "renewTime": MicroTime(taken),
                "leaseTransitions": transitions,
            },
        });
        self.write(patch).await
    }

    /// Gives the Lease up (at shutdown), if it is still ours as last written: the same
    /// resourceVersion precondition, so a Lease someone else took meanwhile is left alone.
    pub async fn release(&mut self) -> kube::Result<()> {
        let Some(seen) = self.observed.take().filter(|seen| seen.ours) else {
            return Ok(());
        };
        let patch = json!({
            "metadata": {"resourceVersion": seen.resource_version},
            "spec": {
                "holderIdentity": null,
                "acquireTime": null,
                "renewTime": MicroTime(Timestamp::now()),
                "leaseDurationSeconds": 1,
            },
        });
        self.leases
            .patch(&self.name, &params(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    async fn write(&mut self, patch: serde_json::Value) -> kube::Result<Attempt> {
        let sent = Instant::now();
        let lease = self
            .leases
            .patch(&self.name, &params(), &Patch::Merge(&patch))
            .await?;
        self.saw_own(&lease, sent);
        Ok(Attempt::Ours { sent })
    }

    async fn create(&mut self) -> kube::Result<Attempt> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        let sent = Instant::now();
        let params = PostParams {
            field_manager: Some(CONTROLLER_NAME.to_string()),
            ..PostParams::default()
        };
        let lease = self.leases.create(&params, &lease).await?;
        self.saw_own(&lease, sent);
        Ok(Attempt::Ours { sent })
    }

    /// Our own write is the state we last saw: the next renewal is based on it.
    fn saw_own(&mut self, lease: &Lease, sent: Instant) {
        self.observed = lease
            .metadata
            .resource_version
            .clone()
            .map(|resource_version| Observed {
                resource_version,
                since: sent,
                ours: true,
            });
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(CONTROLLER_NAME.to_string()),
        ..PatchParams::default()
    }
}
