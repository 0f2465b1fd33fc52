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
use crate::scaledown::observe;
use crate::scaledown::watch::Stores;

/// What the endpoints read.
#[derive(Clone)]
pub struct Probe {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    /// The scale-down controller's caches, when it runs.
    pub stores: Option<Stores>,
    /// The PV releaser's caches, when it runs.
    pub pool: Option<crate::releaser::Pool>,
}

/// Parses a bind address flag as controller-runtime does: `"0"` (or empty) means "do not serve",
/// `":PORT"` every IPv4 interface, else `IP:PORT` (`[::1]:PORT` for IPv6).
pub fn bind_address(flag: &str) -> Result<Option<SocketAddr>> {
    let addr = flag.trim();
    let parsed = match addr {
        "" | "0" => return Ok(None),
        _ if addr.starts_with(':') => format!("0.0.0.0{addr}").parse(),
        _ => addr.parse(),
    };
    parsed.map(Some).map_err(|e| {
        Error::Config(format!(
            "bind address {addr:?} (want HOST:PORT, :PORT or 0): {e}"
        ))
    })
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
        .map_err(|source| Error::Serve { what, source })
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
    // Until the caches have synced, the gauges keep their last values.
    if probe.ready.load(Ordering::SeqCst) {
        scrape_time_gauges(&probe);
    }
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        exposition(&probe.metrics),
    )
}

fn scrape_time_gauges(probe: &Probe) {
    if let Some(stores) = &probe.stores {
        let counts = observe::unmanaged_orphans(&stores.sets.state(), &stores.claims.all());
        probe.metrics.set_orphaned_claims(&counts);
        let running = stores.cleanup_pods.all();
        probe
            .metrics
            .set_cleanups_running(running.iter().filter(|p| observe::in_flight(p)).count());
    }
    if let Some(pool) = &probe.pool {
        probe.metrics.set_pv_pool(&pool.counts());
    }
}

/// What `/metrics` sends: prometheus-client writes OpenMetrics text (`# EOF` at the end, counters
/// with `_total`), so it is labelled as that, not as the older Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The controller's families, then the process families (no prefix), then `# EOF`.
pub fn exposition(metrics: &Metrics) -> String {
    use prometheus_client::encoding::text;
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = text::encode_registry(&mut out, &metrics.registry);
    let _ = text::encode_registry(&mut out, &crate::process::registry());
    let _ = text::encode_eof(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_as_controller_runtime() {
        let addr = |s: &str| bind_address(s).expect(s).map(|a| a.to_string());
        assert_eq!(addr("0"), None);
        assert_eq!(addr(""), None);
        assert_eq!(addr(":8080").as_deref(), Some("0.0.0.0:8080"));
        assert_eq!(addr("127.0.0.1:9090").as_deref(), Some("127.0.0.1:9090"));
        assert_eq!(addr("[::1]:8081").as_deref(), Some("[::1]:8081"));
        assert!(bind_address(":http").is_err());
        assert!(bind_address("8080").is_err());
    }

    /// The body is OpenMetrics (what the Content-Type says): one `# EOF`, last; the controller's
    /// families and the process families are both in it.
    #[test]
    fn exposition_is_openmetrics() {
        let text = exposition(&Metrics::default());
        assert!(METRICS_CONTENT_TYPE.starts_with("application/openmetrics-text"));
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(
            text.contains("# TYPE scaledown_reconciles counter"),
            "{text}"
        );
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }
}
