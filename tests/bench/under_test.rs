//! The controller under test: the binary of this build (release with `cargo test --release`),
//! watching the whole cluster with its defaults, metrics and probes on free local ports, its RSS
//! sampled from the moment it starts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::probe::{self, RssSampler, round3};
use crate::support::Cluster;
use crate::support::fixtures::Controller;

const RSS_EVERY: Duration = Duration::from_millis(200);

pub struct UnderTest {
    pub controller: Controller,
    pub pid: u32,
    pub metrics_port: u16,
    pub started: Instant,
    /// Spawn to the first 200 from /readyz (None: not within 5 minutes).
    pub ready_after: Option<Duration>,
    pub sampler: RssSampler,
}

/// What the controller had used up at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at_s: f64,
    pub requests: BTreeMap<String, f64>,
    /// `scaledown_reconcile_errors_total` by category.
    pub errors: BTreeMap<String, f64>,
    /// The samples of `probe::LATENCY_HISTOGRAMS`.
    pub histograms: BTreeMap<String, f64>,
    pub cpu_s: f64,
    pub rss_mib: f64,
    /// The RSS's anonymous and file-backed parts, MiB.
    pub rss_parts_mib: Option<(f64, f64)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl UnderTest {
    /// Starts the controller (log in target/e2e-logs/<log_name>.log, replaced) and waits for
    /// /readyz. `extra` flags come last, so they override.
    pub async fn start(cluster: &Cluster, log_name: &str, extra: &[String]) -> UnderTest {
        let (metrics_port, probe_port) = (free_port(), free_port());
        let mut args = vec![
            format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
            format!("--health-probe-bind-address=127.0.0.1:{probe_port}"),
            "--log-level=info".to_string(),
        ];
        args.extend(extra.iter().cloned());
        let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/e2e-logs")
            .join(format!("{log_name}.log"));
        let _ = std::fs::remove_file(log);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let controller = Controller::spawn(&cluster.kubeconfig, log_name, &args, &[]);
        let started = controller.started;
        let pid = controller.pid().expect("the controller's pid");
        let sampler = RssSampler::start(pid, started, RSS_EVERY);
        let ready_after = probe::wait_ready(probe_port, started, Duration::from_secs(300)).await;
        println!(
            "bench:   controller pid {pid} ready after {}",
            ready_after.map_or("(never)".to_string(), |d| format!("{} ms", d.as_millis()))
        );
        UnderTest {
            controller,
            pid,
            metrics_port,
            started,
            ready_after,
            sampler,
        }
    }

    pub async fn snapshot(&self) -> Snapshot {
        let (requests, errors, histograms) = probe::controller_counters(self.metrics_port).await;
        Snapshot {
            at_s: self.started.elapsed().as_secs_f64(),
            requests,
            errors,
            histograms,
            cpu_s: probe::cpu_seconds(self.pid).unwrap_or(f64::NAN),
            rss_mib: probe::rss_mib(self.pid).unwrap_or(f64::NAN),
            rss_parts_mib: probe::rss_parts_mib(self.pid),
        }
    }

    /// The controller's numbers: start to ready, RSS (at `before`, peak, at `after`) and the
    /// series, CPU and requests since start and between the snapshots.
    pub fn json(&self, before: &Snapshot, after: &Snapshot) -> Value {
        let since_start = probe::requests_json(&after.requests);
        let window = probe::requests_json(&probe::delta(&after.requests, &before.requests));
        let series: Vec<[f64; 2]> = self
            .sampler
            .series()
            .iter()
            .map(|(t, m)| [round3(*t), round3(*m)])
            .collect();
        json!({
            "start_to_ready_ms": self.ready_after.map(|d| d.as_millis() as u64),
            "rss_mib": {
                "at_window_start": round3(before.rss_mib),
                "peak_in_window": round3(self.sampler.max_since(before.at_s).max(after.rss_mib)),
                "peak_since_start": probe::peak_rss_mib(self.pid).map(round3),
                "after": round3(after.rss_mib),
                "after_anonymous": after.rss_parts_mib.map(|(a, _)| round3(a)),
                "after_file": after.rss_parts_mib.map(|(_, f)| round3(f)),
            },
            "cpu_s": {
                "since_start": round3(after.cpu_s),
                "window": round3(after.cpu_s - before.cpu_s),
            },
            "window_start_s": round3(before.at_s),
            "window_s": round3(after.at_s - before.at_s),
            "requests_since_start": since_start,
            "requests_in_window": window,
            "reconcile_errors_since_start": after.errors,
            "reconcile_errors_in_window": probe::delta(&after.errors, &before.errors),
            "latency_histograms_in_window": probe::histograms_json(&probe::delta_all(&after.histograms, &before.histograms)),
            "rss_series": series,
        })
    }

    /// SIGTERM, and SIGKILL after 20 s.
    pub async fn stop(mut self) {
        self.controller.terminate(Duration::from_secs(20)).await;
    }
}
