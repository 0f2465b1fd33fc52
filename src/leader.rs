//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! As client-go's leader election: every retry period each replica reads the Lease and, if it is
//! ours, free or expired, writes it with the resourceVersion it read ([`lease`]), so two candidates
//! cannot both take it over. The leader may write only until the instant its last successful
//! renewal was sent plus the renew deadline, by its own clock ([`Leadership::may_write`], checked
//! for every write by [`crate::fence`]). A renewal that fails or is slow is retried every retry
//! period until then; only a deadline that passes without a renewal ends leadership. The deadline is
//! shorter than the lease duration, and another replica counts the lease duration from when it saw
//! that renewal (no later than it was sent), so a leader that cannot renew stops writing before
//! anyone can take over; it then exits non-zero (fail-stop) and restarts as a candidate. Standbys
//! keep their caches warm and write nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio::time::error::Elapsed;
use tokio_util::sync::CancellationToken;
// Tokio's clock: the same as std's in production, and one a test can pause and advance.
use tokio::time::Instant;
use tracing::{debug, info, warn};

mod lease;

pub use lease::ElectionConfig;
use lease::{Attempt, Elector};

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

    /// Until when this process leads, if it does (with election).
    fn term(&self) -> Option<Instant> {
        if !self.leading.load(Ordering::SeqCst) {
            return None;
        }
        *self.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set(&self, leading: bool, until: Option<Instant>) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        let was = self.leading.swap(leading, Ordering::SeqCst);
        if was != leading {
            self.changes.send_replace(leading);
        }
    }
}

/// How long the release of the Lease may take at shutdown (within the process's shutdown grace).
const RELEASE_TIMEOUT: Duration = Duration::from_millis(400);

/// Takes part in the election until `shutdown` resolves (then releases the Lease and returns Ok)
/// or leadership is lost (then returns `Err`, and the process should exit non-zero).
///
/// Every retry period it tries to acquire or renew the Lease ([`Elector`]). A leader's attempt may
/// take until its renew deadline: a slow or failed attempt is retried at the next tick, and only a
/// deadline that passes without a renewal (or a Lease someone else holds) ends leadership.
pub async fn run(
    client: Client,
    config: ElectionConfig,
    leadership: &Leadership,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(shutdown);
    let mut elector = Elector::new(Api::namespaced(client, &config.namespace), &config);
    let deadline = config.renew_deadline;
    let mut tick = tokio::time::interval(config.retry_period.max(Duration::from_millis(200)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "waiting for leadership");

    let outcome = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            _ = tick.tick() => {}
        }
        let term = leadership.term();
        // A candidate's attempt may take one renew deadline; a leader's, what is left of its term.
        let limit = term.map_or(deadline, |until| {
            until.saturating_duration_since(Instant::now())
        });
        let attempt = tokio::select! {
            _ = &mut shutdown => break Ok(()),
            attempt = tokio::time::timeout(limit, elector.try_acquire_or_renew()) => attempt,
        };
        match judge(term, attempt, deadline) {
            Step::Lead(until) => {
                if term.is_none() {
                    info!(identity = %config.identity, "became the leader");
                    metrics.set_leader(true);
                }
                leadership.set(true, Some(until));
            }
            Step::Wait => {}
            Step::Lost(why) => {
                leadership.set(false, None);
                metrics.set_leader(false);
                warn!(identity = %config.identity, why, "lost leadership; exiting");
                break Err(Error::LeadershipLost);
            }
        }
    };

    // Stop writing first, then give the Lease up, so that a standby need not wait for it to expire.
    let leading = leadership.term().is_some();
    leadership.set(false, None);
    metrics.set_leader(false);
    if leading {
        match tokio::time::timeout(RELEASE_TIMEOUT, elector.release()).await {
            Ok(Ok(())) => info!("released the leader Lease"),
            Ok(Err(e)) => warn!(error = %e, "could not release the leader Lease"),
            Err(_) => warn!("releasing the leader Lease timed out"),
        }
    }
    outcome
}

/// What one attempt means for this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Lead (go on leading), writing until this instant.
    Lead(Instant),
    /// Stay a candidate.
    Wait,
    /// Leadership is lost: the process must stop.
    Lost(&'static str),
}

/// The next step after an attempt (`Err(Elapsed)`: it did not answer in time), for a process that
/// leads until `term` (`None`: a candidate). A failed or slow attempt costs a leader nothing while
/// its term lasts; it is tried again at the next tick.
fn judge(
    term: Option<Instant>,
    attempt: std::result::Result<kube::Result<Attempt>, Elapsed>,
    deadline: Duration,
) -> Step {
    let now = Instant::now();
    match (attempt, term) {
        (Ok(Ok(Attempt::Ours { sent })), _) if now < sent + deadline => Step::Lead(sent + deadline),
        (Ok(Ok(Attempt::Held(_))), Some(_)) => Step::Lost("the Lease is held by another replica"),
        (Ok(Ok(Attempt::Held(holder))), None) => {
            debug!(%holder, "the Lease is held by another replica");
            Step::Wait
        }
        (failed, Some(until)) if now < until => {
            warn!(outcome = %describe(&failed), left = ?until - now, "renewing the leader Lease failed; retrying until the renew deadline");
            Step::Lead(until)
        }
        (_, Some(_)) => Step::Lost("not renewed within the renew deadline"),
        (failed, None) => {
            debug!(outcome = %describe(&failed), "could not acquire the Lease");
            Step::Wait
        }
    }
}

fn describe(attempt: &std::result::Result<kube::Result<Attempt>, Elapsed>) -> String {
    match attempt {
        Ok(Ok(_)) => "acquired too late".to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer in time".to_string(),
    }
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
mod tests;
