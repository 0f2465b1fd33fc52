//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! kube-lease-manager acquires, renews and releases the Lease. It keeps reporting "leader" while the
//! API server cannot be reached, so this module adds the renew deadline: the leader may write only
//! until `renewTime + renew deadline` (by the local clock) of the last renewal it saw on the Lease.
//! The deadline is shorter than the lease duration, so a leader that cannot renew stops writing
//! before any other replica can take over; it then exits non-zero (fail-stop) and restarts as a
//! candidate. Standbys keep their caches warm and write nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
// Tokio's clock: the same as std's in production, and one a test can pause and advance.
use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Whether this process may write now. Shared by the election task and `act`.
pub struct Leadership {
    elected: bool,
    /// Writes are allowed until this instant (only with election).
    until: Mutex<Option<Instant>>,
    leading: AtomicBool,
    changes: watch::Sender<bool>,
}

impl Leadership {
    /// No election: this process always leads.
    pub fn always() -> Self {
        Leadership {
            elected: false,
            until: Mutex::new(None),
            leading: AtomicBool::new(true),
            changes: watch::Sender::new(true),
        }
    }

    /// With election: standby until the Lease is ours.
    pub fn elected() -> Self {
        Leadership {
            elected: true,
            until: Mutex::new(None),
            leading: AtomicBool::new(false),
            changes: watch::Sender::new(false),
        }
    }

    /// Whether a write may be made right now.
    pub fn may_write(&self) -> bool {
        if !self.elected {
            return true;
        }
        self.leading.load(Ordering::SeqCst)
            && self
                .until
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|until| Instant::now() < until)
    }

    /// Notified with `true` whenever this process becomes the leader.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn set(&self, leading: bool, until: Option<Instant>) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        let was = self.leading.swap(leading, Ordering::SeqCst);
        if was != leading {
            self.changes.send_replace(leading);
        }
    }
}

/// How long one read of the Lease may take before it counts as failed (not confirmed).
const LEASE_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the release of the Lease may take at shutdown (within the process's shutdown grace).
const RELEASE_TIMEOUT: Duration = Duration::from_millis(400);

/// Election settings, from the flags.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Takes part in the election until `shutdown` resolves (then releases the Lease and returns Ok)
/// or leadership is lost (then returns `Err`, and the process should exit non-zero).
pub async fn run(
    client: Client,
    config: ElectionConfig,
    leadership: &Leadership,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let lease_secs = config.lease_duration.as_secs().max(2);
    let deadline_secs = config.renew_deadline.as_secs().clamp(1, lease_secs - 1);
    let build = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(lease_secs)
        // Renew halfway to the deadline (grace is counted back from expiry), so a renewal always
        // lands well before writes would stop.
        .with_grace(lease_secs - (deadline_secs / 2).max(1))
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .build();
    // Building reads (or creates) the Lease: an API call that may never answer.
    let manager = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        built = build => built.map_err(|source| Error::Election {
            lease: format!("{}/{}", config.namespace, config.lease_name),
            source,
        })?,
    };
    let (mut manager_says, task) = manager.watch().await;
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    let deadline = Duration::from_secs(deadline_secs);
    let mut tick = tokio::time::interval(config.retry_period.max(Duration::from_millis(200)));
    info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "waiting for leadership");

    let outcome = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            changed = manager_says.changed() => {
                if changed.is_err() {
                    break Err(Error::Stopped("the lease manager"));
                }
            }
            _ = tick.tick() => {}
        }
        let holds = *manager_says.borrow_and_update();
        let until = if holds {
            confirmed_until(&leases, &config, deadline).await
        } else {
            None
        };
        let leading = until.is_some_and(|u| Instant::now() < u);
        let was_leading = leadership.leading.load(Ordering::SeqCst);
        if leading && !was_leading {
            info!(identity = %config.identity, "became the leader");
            metrics.set_leader(true);
        }
        if was_leading && !leading {
            leadership.set(false, None);
            metrics.set_leader(false);
            warn!(identity = %config.identity, "lost leadership (not renewed within the deadline, or taken over); exiting");
            break Err(Error::LeadershipLost);
        }
        leadership.set(leading, until);
    };

    // Stop writing first, then let the manager release the Lease (dropping the receiver does it).
    leadership.set(false, None);
    metrics.set_leader(false);
    drop(manager_says);
    match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
        Ok(Ok(Ok(_))) => info!("released the leader Lease"),
        Ok(Ok(Err(e))) => warn!(error = %e, "could not release the leader Lease"),
        Ok(Err(e)) => warn!(error = %e, "lease task failed"),
        Err(_) => warn!("releasing the leader Lease timed out"),
    }
    outcome
}

/// Until when our last renewal seen on the Lease lets us write: `renewTime + deadline` mapped to a
/// local instant. `None` if the Lease is not ours or cannot be read.
async fn confirmed_until(
    leases: &Api<Lease>,
    config: &ElectionConfig,
    deadline: Duration,
) -> Option<Instant> {
    let read = tokio::time::timeout(LEASE_READ_TIMEOUT, leases.get(&config.lease_name));
    let lease = match read.await {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the leader Lease");
            return None;
        }
        Err(_) => {
            // A read that hangs (a connection that died while the process was frozen) must not
            // keep a leader that cannot confirm itself.
            warn!(timeout = ?LEASE_READ_TIMEOUT, "reading the leader Lease timed out");
            return None;
        }
    };
    let spec = lease.spec?;
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time?.0.into();
    let age = SystemTime::now()
        .duration_since(renewed)
        .unwrap_or(Duration::ZERO);
    deadline.checked_sub(age).map(|left| Instant::now() + left)
}

/// Runs the election ([`run`]) as a task of its own, until `stop`.
pub fn spawn(
    client: Client,
    config: ElectionConfig,
    leadership: &Arc<Leadership>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> JoinHandle<Result<()>> {
    let (leadership, metrics, stop) = (leadership.clone(), metrics.clone(), stop.clone());
    tokio::spawn(async move {
        let stopped = stop.cancelled_owned();
        run(client, config, &leadership, &metrics, stopped).await
    })
}

/// Yields once every time `leading` turns true.
pub fn became_leader(
    leading: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(leading, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deadline is read on the paused clock: writes stop exactly at it, not some time later.
    #[tokio::test(start_paused = true)]
    async fn writes_stop_at_the_renew_deadline_by_the_local_clock() {
        assert!(
            Leadership::always().may_write(),
            "without election this process always writes"
        );
        let l = Leadership::elected();
        assert!(!l.may_write(), "a candidate does not write");
        l.set(true, Some(Instant::now() + Duration::from_millis(50)));
        tokio::time::advance(Duration::from_millis(49)).await;
        assert!(l.may_write(), "1 ms before the deadline");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !l.may_write(),
            "at the deadline, even before the election task notices"
        );
        l.set(true, Some(Instant::now() + Duration::from_secs(10)));
        assert!(l.may_write(), "a renewal moves the deadline");
        l.set(false, None);
        assert!(!l.may_write(), "not leading");
    }

    #[test]
    fn becoming_leader_is_announced() {
        let l = Leadership::elected();
        let mut rx = l.subscribe();
        l.set(true, Some(Instant::now() + Duration::from_secs(1)));
        assert!(rx.has_changed().unwrap_or(false) && *rx.borrow_and_update());
        l.set(true, Some(Instant::now() + Duration::from_secs(2)));
        assert!(
            !rx.has_changed().unwrap_or(true),
            "a renewal is not a change"
        );
    }
}
