//! The HTTP endpoints: `/metrics` on the metrics address; `/healthz` (making progress, see
//! [`Liveness`]) and `/readyz` (caches synced, not shutting down) on the probe address. Neither
//! depends on leadership, so a standby replica is live and ready, and rolling updates of a
//! two-replica Deployment proceed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::info;

use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A watch with no new WATCH request for this long is stuck. A live watch sends one at least every
/// 290 s (the `timeoutSeconds` after which the API server ends it), and every ≤ 2 s while the API
/// server fails; twice that and more is never reached by a quiet cluster or an outage.
pub const WATCH_SILENCE_MAX: Duration = Duration::from_secs(600);

/// A pass running this long is stuck: every API call of a pass ends within kube's read timeout
/// (295 s), and a pass makes few of them in a row.
pub const PASS_MAX: Duration = Duration::from_secs(600);

/// How long a controller's longest running pass has been running (its runner's `longest_pass`).
type LongestPass = Arc<dyn Fn() -> Option<Duration> + Send + Sync>;

/// What `/healthz` checks: the process is making progress. It fails (503, the body naming what is
/// stuck) when a watch has sent no WATCH request for [`WATCH_SILENCE_MAX`] (it is no longer
/// polled: events would never arrive), or a pass has been running for [`PASS_MAX`] (it holds its
/// object, and its slot of the controller's concurrency, forever). An idle cluster, an API server
/// that is down, and a standby replica fail neither: a restart would not help them.
#[derive(Clone, Default)]
pub struct Liveness {
    /// How long each controller's longest running pass has been running.
    passes: Vec<(&'static str, LongestPass)>,
}

impl Liveness {
    /// Checks the passes of `controller`; `longest` is its runner's `longest_pass`.
    pub fn pass(
        &mut self,
        controller: &'static str,
        longest: impl Fn() -> Option<Duration> + Send + Sync + 'static,
    ) {
        self.passes.push((controller, Arc::new(longest)));
    }

    /// What is stuck now; empty when the process makes progress.
    pub fn stuck(&self) -> Vec<String> {
        let watched = crate::api_metrics::watched()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut stuck = silent_watches(&watched, Instant::now(), WATCH_SILENCE_MAX);
        for (controller, longest) in &self.passes {
            if let Some(running) = longest().filter(|d| *d >= PASS_MAX) {
                stuck.push(format!(
                    "a {controller} pass has been running for {} s",
                    running.as_secs()
                ));
            }
        }
        stuck
    }
}

/// The watches (by resource) whose last WATCH request was sent `bound` or longer before `now`.
pub fn silent_watches(
    watched: &HashMap<String, Instant>,
    now: Instant,
    bound: Duration,
) -> Vec<String> {
    let mut silent: Vec<String> = watched
        .iter()
        .map(|(resource, at)| (resource, now.saturating_duration_since(*at)))
        .filter(|(_, silence)| *silence >= bound)
        .map(|(resource, silence)| {
            format!(
                "the watch of {resource} has sent no request for {} s",
                silence.as_secs()
            )
        })
        .collect();
    silent.sort();
    silent
}

/// What the endpoints read.
#[derive(Clone)]
pub struct Probe {
    /// See [`readiness`].
    pub ready: Arc<AtomicBool>,
    /// See [`Liveness`].
    pub live: Arc<Liveness>,
    /// The metrics `/metrics` encodes first.
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
/// `":PORT"` every interface of every address family (`[::]:PORT`, bound dual-stack by [`bind`]),
/// else `IP:PORT` (`[::1]:PORT` for IPv6).
pub fn bind_address(flag: &str) -> Result<Option<SocketAddr>> {
    let addr = flag.trim();
    let parsed = match addr {
        "" | "0" => return Ok(None),
        _ if addr.starts_with(':') => format!("[::]{addr}").parse(),
        _ => addr.parse(),
    };
    parsed.map(Some).map_err(|e| {
        Error::Config(format!(
            "bind address {addr:?} (want HOST:PORT, :PORT or 0): {e}"
        ))
    })
}

/// Binds `addr` now, so that a busy port fails the start instead of a background task. The IPv6
/// wildcard `[::]` is bound dual-stack, as Go's `net.Listen` binds it: see [`listen`].
pub async fn bind(what: &'static str, addr: SocketAddr) -> Result<(&'static str, TcpListener)> {
    let listener = listen(addr)
        .and_then(TcpListener::from_std)
        .map_err(|e| Error::Config(format!("cannot serve {what} on {addr}: {e}")))?;
    info!(address = %listener.local_addr().unwrap_or(addr), "serving {what}");
    Ok((what, listener))
}

/// A listening, non-blocking socket on `addr`. `[::]:PORT` accepts IPv4 and IPv6 connections
/// (IPV6_V6ONLY off, whatever `net.ipv6.bindv6only` says); where the host has no IPv6 (the
/// family is not supported, or `[::]` cannot be assigned), it falls back to `0.0.0.0:PORT`.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let addr = if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        match socket(addr, false) {
            Err(e) if ipv6_unavailable(&e) => {
                info!(error = %e, "no IPv6 on this host: binding 0.0.0.0 only");
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))
            }
            bound => return bound,
        }
    } else {
        addr
    };
    socket(addr, true)
}

/// A TCP socket bound to `addr` and listening, IPV6_V6ONLY set to `v6_only` for an IPv6 address.
fn socket(addr: SocketAddr, v6_only: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(v6_only)?;
    }
    // As the standard library and Go do: a restarted process may bind while old connections linger.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The error says the host has no IPv6: the address family or protocol is not supported
/// (EAFNOSUPPORT, EPROTONOSUPPORT: a kernel without IPv6, `ipv6.disable=1`) or `[::]` cannot be
/// assigned (EADDRNOTAVAIL). A busy port or a refused one is not, and fails the start.
fn ipv6_unavailable(e: &std::io::Error) -> bool {
    const EPROTONOSUPPORT: i32 = 93;
    const EAFNOSUPPORT: i32 = 97;
    e.kind() == std::io::ErrorKind::AddrNotAvailable
        || matches!(e.raw_os_error(), Some(EAFNOSUPPORT | EPROTONOSUPPORT))
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

/// The router of `/metrics`.
pub fn metrics_router(probe: Probe) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(probe)
}

/// The router of `/healthz` and `/readyz`.
pub fn probes_router(probe: Probe) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(probe)
}

/// Serves `app` on `listener` (`what` names the server in errors) until `shutdown` resolves.
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

async fn healthz(State(probe): State<Probe>) -> impl IntoResponse {
    let stuck = probe.live.stuck();
    if stuck.is_empty() {
        (StatusCode::OK, "ok".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, stuck.join("\n") + "\n")
    }
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

    /// A watch is stuck only once its last request is as old as the bound; a quiet watch that the
    /// API server ended and the watcher restarted 290 s ago is not.
    #[test]
    fn a_watch_is_stuck_once_it_has_sent_nothing_for_the_bound() {
        let now = Instant::now() + Duration::from_secs(3600);
        let watched = HashMap::from([
            ("pods".to_string(), now - Duration::from_secs(290)),
            ("statefulsets".to_string(), now - WATCH_SILENCE_MAX),
            (
                "persistentvolumeclaims".to_string(),
                now - Duration::from_secs(2),
            ),
        ]);
        assert_eq!(
            silent_watches(&watched, now, WATCH_SILENCE_MAX),
            ["the watch of statefulsets has sent no request for 600 s"]
        );
    }

    /// `/healthz` answers 503 naming the stuck pass, and `ok` when no pass runs too long.
    #[tokio::test]
    async fn healthz_fails_while_a_pass_is_stuck() {
        use std::sync::Mutex;
        let longest = Arc::new(Mutex::new(None));
        let mut live = Liveness::default();
        let read = longest.clone();
        live.pass("scaledown", move || *read.lock().expect("lock"));
        let probe = Probe {
            ready: Arc::new(AtomicBool::new(true)),
            live: Arc::new(live),
            metrics: Arc::new(Metrics::default()),
            gauges: Arc::new(Registry::default()),
        };
        let answer = |probe: Probe| async move {
            let response = healthz(State(probe)).await.into_response();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .expect("body");
            (status, String::from_utf8_lossy(&body).into_owned())
        };
        *longest.lock().expect("lock") = Some(PASS_MAX - Duration::from_secs(1));
        assert_eq!(answer(probe.clone()).await, (StatusCode::OK, "ok".into()));
        *longest.lock().expect("lock") = Some(PASS_MAX);
        let (status, body) = answer(probe).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "a scaledown pass has been running for 600 s\n");
    }

    #[test]
    fn bind_addresses_as_controller_runtime() {
        let addr = |s: &str| bind_address(s).expect(s).map(|a| a.to_string());
        assert_eq!(addr("0"), None);
        assert_eq!(addr(""), None);
        assert_eq!(addr(":8080").as_deref(), Some("[::]:8080"));
        assert_eq!(addr("127.0.0.1:9090").as_deref(), Some("127.0.0.1:9090"));
        assert_eq!(addr("[::1]:8081").as_deref(), Some("[::1]:8081"));
        assert!(bind_address(":http").is_err());
        assert!(bind_address("8080").is_err());
    }

    /// `:PORT` serves every address family: one listener answers on 127.0.0.1 and on [::1]
    /// (dual-stack, as controller-runtime); an explicit IPv4 address stays IPv4-only.
    #[tokio::test]
    async fn any_interface_is_dual_stack() {
        let wildcard = bind_address(":0").expect(":0").expect("an address");
        let (_, listener) = bind("test", wildcard).await.expect("bind [::]:0");
        let port = listener.local_addr().expect("local address").port();
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            let connected = tokio::net::TcpStream::connect((ip, port)).await;
            assert!(connected.is_ok(), "connect {ip}:{port}: {connected:?}");
        }
        let v4 = bind_address("127.0.0.1:0")
            .expect("v4")
            .expect("an address");
        let (_, listener) = bind("test", v4).await.expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let v6 = tokio::net::TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await;
        assert!(v6.is_err(), "127.0.0.1 answered on [::1]");
    }

    /// Only a missing address family falls back to 0.0.0.0; a busy port fails the start.
    #[test]
    fn only_a_missing_ipv6_falls_back_to_ipv4() {
        use std::io::{Error as IoError, ErrorKind};
        assert!(ipv6_unavailable(&IoError::from_raw_os_error(97)));
        assert!(ipv6_unavailable(&IoError::from_raw_os_error(93)));
        assert!(ipv6_unavailable(&IoError::from(
            ErrorKind::AddrNotAvailable
        )));
        assert!(!ipv6_unavailable(&IoError::from(ErrorKind::AddrInUse)));
        assert!(!ipv6_unavailable(&IoError::from(
            ErrorKind::PermissionDenied
        )));
    }

    /// A busy port is a start-up error, not a silent fall back to IPv4.
    #[tokio::test]
    async fn a_busy_port_fails_the_start() {
        let (_, held) = bind("test", bind_address(":0").expect(":0").expect("addr"))
            .await
            .expect("bind");
        let port = held.local_addr().expect("local address").port();
        let again = bind_address(&format!(":{port}"))
            .expect("flag")
            .expect("addr");
        let err = bind("metrics", again).await.expect_err("the port is taken");
        assert!(err.to_string().contains("cannot serve metrics"), "{err}");
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
