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
use tokio::task::JoinHandle;
use tracing::info;

use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct Probe {
    /// See [`readiness`].
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    /// Collectors of gauges computed at scrape time from the caches of the controllers that run
    /// (each controller's folder has its own), encoded after the families of `metrics`.
    pub gauges: Arc<Registry>,
}

/// The readiness `/readyz` reports: true once every wait of `synced` (one per cache, built by the
/// wiring) has ended with true, false again from `stop` on.
pub fn readiness(
    synced: Vec<BoxFuture<'static, bool>>,
    stop: &CancellationToken,
) -> Arc<AtomicBool> {
    let ready = Arc::new(AtomicBool::new(false));
    let (flag, stop) = (ready.clone(), stop.clone());
    tokio::spawn(async move {
        let all_synced = futures::future::join_all(synced);
        tokio::select! {
            synced = all_synced => if synced.iter().all(|s| *s) {
                flag.store(true, Ordering::SeqCst);
                info!("caches synced");
            },
            _ = stop.cancelled() => {}
        }
        stop.cancelled().await;
        flag.store(false, Ordering::SeqCst);
    });
    ready
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

/// Starts the metrics server on `metrics` and the probe server on `probes`, those that are not
/// turned off (`None`); both stop at `stop`.
pub async fn start(
    [metrics, probes]: [Option<SocketAddr>; 2],
    probe: Probe,
    stop: &CancellationToken,
) -> Result<Vec<JoinHandle<Result<()>>>> {
    let endpoints = [
        (metrics, "metrics", metrics_router(probe.clone())),
        (probes, "health probes", probes_router(probe)),
    ];
    let mut servers = Vec::new();
    for (addr, what, router) in endpoints {
        let Some(addr) = addr else { continue };
        let listener = bind(what, addr).await?;
        let stopped = stop.clone().cancelled_owned();
        servers.push(tokio::spawn(serve(listener, router, stopped)));
    }
    Ok(servers)
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
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        exposition(&probe.metrics, &probe.gauges),
    )
}

/// What `/metrics` sends: prometheus-client writes OpenMetrics text (`# EOF` at the end, counters
/// with `_total`), so it is labelled as that, not as the older Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The controller's families, the gauges computed at scrape time, then the process families (no
/// prefix), then `# EOF`.
pub fn exposition(metrics: &Metrics, gauges: &Registry) -> String {
    use prometheus_client::encoding::text;
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = text::encode_registry(&mut out, &metrics.registry);
    let _ = text::encode_registry(&mut out, gauges);
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
        let text = exposition(&Metrics::default(), &Registry::default());
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
