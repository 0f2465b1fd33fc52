//! The HTTP endpoints: `/metrics` on the metrics address; `/healthz` (alive) and `/readyz` (caches
//! synced, not shutting down) on the probe address. Readiness does not depend on leadership, so a
//! standby replica is ready and rolling updates of a two-replica Deployment proceed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tracing::info;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::observe;
use crate::watch::Stores;

/// What the endpoints read.
#[derive(Clone)]
pub struct Probe {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub stores: Stores,
}

/// Parses a bind address flag; `"0"` (or empty) means "do not serve".
pub fn bind_address(flag: &str) -> Result<Option<SocketAddr>> {
    match flag.trim() {
        "" | "0" => Ok(None),
        addr => addr
            .parse()
            .map(Some)
            .map_err(|e| Error::Config(format!("bind address {addr:?}: {e}"))),
    }
}

/// Binds `addr` now, so that a busy port fails the start instead of a background task.
pub async fn bind(what: &'static str, addr: SocketAddr) -> Result<(&'static str, TcpListener)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot serve {what} on {addr}: {e}")))?;
    info!(address = %listener.local_addr().unwrap_or(addr), "serving {what}");
    Ok((what, listener))
}

pub fn metrics_router(probe: Probe) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(probe)
}

pub fn probes_router(probe: Probe) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(probe)
}

pub async fn serve(
    (what, listener): (&'static str, TcpListener),
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Error::Config(format!("{what} server: {e}")))
}

async fn readyz(State(probe): State<Probe>) -> impl IntoResponse {
    if probe.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced yet, or shutting down",
        )
    }
}

async fn metrics(State(probe): State<Probe>) -> impl IntoResponse {
    // Computed at scrape time from the caches: claims left behind by sets that did not opt in.
    if probe.ready.load(Ordering::SeqCst) {
        let counts =
            observe::unmanaged_orphans(&probe.stores.sets.state(), &probe.stores.claims.all());
        probe.metrics.set_orphaned_claims(&counts);
        let running = probe.stores.cleanup_pods.all();
        probe
            .metrics
            .set_cleanups_running(running.iter().filter(|p| observe::in_flight(p)).count());
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        probe.metrics.encode(),
    )
}
