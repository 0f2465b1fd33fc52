//! Shutdown: signals, the wait for the end, and the bounded wind-down.
//!
//! The first SIGTERM or SIGINT stops new work. Running passes, the release of the Lease and the
//! HTTP servers get [`SHUTDOWN_GRACE`] to finish; whatever still runs then is dropped. Cutting a
//! pass short is safe: every write is idempotent and checked again on the next pass, as after a
//! crash. A second signal exits at once with 128 + the signal's number.

use std::pin::Pin;
use std::time::Duration;

use futures::future::Fuse;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Error, Result};

/// How long shutdown waits for running passes, the release of the Lease and the HTTP servers.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Listens for SIGTERM and SIGINT: the first cancels the returned token (a graceful stop), a second
/// one exits the process at once with 128 + its number.
pub fn on_signals() -> CancellationToken {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let token = CancellationToken::new();
    let (term, int) = (SignalKind::terminate(), SignalKind::interrupt());
    let (Ok(mut on_term), Ok(mut on_int)) = (signal(term), signal(int)) else {
        warn!("cannot listen for signals; running until killed");
        return token;
    };
    async fn next(on_term: &mut Signal, on_int: &mut Signal) -> (&'static str, SignalKind) {
        tokio::select! {
            _ = on_term.recv() => ("SIGTERM", SignalKind::terminate()),
            _ = on_int.recv() => ("SIGINT", SignalKind::interrupt()),
        }
    }
    tokio::spawn({
        let token = token.clone();
        async move {
            let (name, _) = next(&mut on_term, &mut on_int).await;
            info!("{name} received, shutting down");
            token.cancel();
            let (name, kind) = next(&mut on_term, &mut on_int).await;
            warn!("{name} received again; exiting at once");
            std::process::exit(128 + kind.as_raw_value());
        }
    });
    token
}

/// A token cancelled when `shutdown` resolves (or by whoever holds a clone).
pub fn stop_on(shutdown: impl Future<Output = ()> + Send + 'static) -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = shutdown => stop.cancel(),
                _ = stop.cancelled() => {}
            }
        }
    });
    stop
}

/// The result of a joined task: its own, or a [`Error::Joined`] when it panicked or was cancelled.
pub fn joined(result: std::result::Result<Result<()>, tokio::task::JoinError>) -> Result<()> {
    result.unwrap_or_else(|source| {
        Err(Error::Joined {
            task: "election task",
            source,
        })
    })
}

/// Runs until `stop`, or until the election ends first (leadership lost): then its result.
pub async fn until_stopped(
    controller: Pin<&mut Fuse<impl Future<Output = ()>>>,
    election: &mut Option<JoinHandle<Result<()>>>,
    stop: &CancellationToken,
) -> Option<Result<()>> {
    let election_ended = async {
        match election.as_mut() {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let lost = tokio::select! {
        _ = stop.cancelled() => None,
        // The controller ends only after `stop`.
        _ = controller => None,
        ended = election_ended => Some(joined(ended)),
    };
    if lost.is_some() {
        *election = None;
    }
    lost
}

/// After `stop`: lets running reconciles finish and the election release the Lease until
/// `deadline`, then drops whatever still runs. The outcome is the election's.
pub async fn wind_down(
    controller: Pin<&mut Fuse<impl Future<Output = ()>>>,
    election: Option<JoinHandle<Result<()>>>,
    lost: Option<Result<()>>,
    idle: impl Future<Output = ()>,
    deadline: Instant,
) -> Result<()> {
    let drained = tokio::time::timeout_at(deadline, async {
        tokio::select! {
            _ = controller => {},
            _ = idle => {},
        }
    })
    .await;
    if drained.is_err() {
        warn!(grace = ?SHUTDOWN_GRACE, "reconciles still running at the end of the shutdown grace; stopping them");
    }
    match (lost, election) {
        (Some(result), _) => result,
        (None, None) => Ok(()),
        (None, Some(mut task)) => match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(result) => joined(result),
            Err(_) => {
                task.abort();
                warn!(
                    "the Lease was not released within the shutdown grace; it expires on its own"
                );
                Ok(())
            }
        },
    }
}

/// Waits for the HTTP servers until `deadline`, then drops them.
pub async fn stop_servers(servers: Vec<JoinHandle<Result<()>>>, deadline: Instant) {
    for mut server in servers {
        match tokio::time::timeout_at(deadline, &mut server).await {
            Ok(Ok(Err(e))) => warn!(error = %e, "http server failed"),
            Ok(_) => {}
            Err(_) => server.abort(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::FutureExt;

    use super::*;

    /// A controller future as `run` builds it (a `Map`, which panics if polled after its end),
    /// fused, that sets `ended` when it ends.
    fn controllers(ended: &Arc<AtomicBool>) -> Fuse<impl Future<Output = ()> + use<>> {
        let ended = ended.clone();
        futures::future::ready(())
            .map(move |_| ended.store(true, Ordering::SeqCst))
            .fuse()
    }

    /// The controllers end before `stop` (graceful shutdown finished at once): `until_stopped`
    /// returns for them, and `wind_down` polls them again without panicking (the chaos run caught
    /// a `Map` polled after its end at a SIGTERM) and returns as soon as the reconciles are idle.
    #[tokio::test(start_paused = true)]
    async fn controllers_that_already_ended_are_polled_again_safely() {
        let ended = Arc::new(AtomicBool::new(false));
        let work = controllers(&ended);
        tokio::pin!(work);
        let (stop, mut election) = (CancellationToken::new(), None);
        let lost = until_stopped(work.as_mut(), &mut election, &stop).await;
        assert!(lost.is_none(), "no election, nothing lost");
        assert!(
            ended.load(Ordering::SeqCst),
            "returned because the controllers ended"
        );
        let start = Instant::now();
        let deadline = start + SHUTDOWN_GRACE;
        let outcome = wind_down(work, election, lost, async {}, deadline).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "idle at once: no wait for the grace"
        );
    }

    /// `stop` before the controllers were polled: `wind_down` drives them to their end.
    #[tokio::test(start_paused = true)]
    async fn wind_down_lets_the_controllers_finish() {
        let ended = Arc::new(AtomicBool::new(false));
        let work = controllers(&ended);
        tokio::pin!(work);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let idle = std::future::pending::<()>();
        let outcome = wind_down(work, None, None, idle, deadline).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(
            ended.load(Ordering::SeqCst),
            "the controllers ran to their end"
        );
    }

    /// Controllers and reconciles that never finish are dropped at the deadline, not before and
    /// not later.
    #[tokio::test(start_paused = true)]
    async fn wind_down_stops_waiting_at_the_deadline() {
        let work = std::future::pending::<()>().fuse();
        tokio::pin!(work);
        let start = Instant::now();
        let idle = std::future::pending::<()>();
        let wound = wind_down(work, None, None, idle, start + SHUTDOWN_GRACE);
        let outcome = tokio::time::timeout(SHUTDOWN_GRACE * 10, wound).await;
        assert!(matches!(outcome, Ok(Ok(()))), "{outcome:?}");
        assert_eq!(start.elapsed(), SHUTDOWN_GRACE);
    }

    /// An election that ends first is leadership lost: its error is the outcome of the shutdown.
    #[tokio::test(start_paused = true)]
    async fn a_lost_election_is_the_outcome() {
        let work = std::future::pending::<()>().fuse();
        tokio::pin!(work);
        let stop = CancellationToken::new();
        let mut election = Some(tokio::spawn(async { Err(Error::LeadershipLost) }));
        let lost = until_stopped(work.as_mut(), &mut election, &stop).await;
        assert!(matches!(lost, Some(Err(Error::LeadershipLost))), "{lost:?}");
        assert!(
            election.is_none(),
            "the ended election is not awaited again"
        );
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let outcome = wind_down(work, election, lost, async {}, deadline).await;
        assert!(matches!(outcome, Err(Error::LeadershipLost)), "{outcome:?}");
    }
}
