//! What the bench measures outside the Kubernetes API: `/proc` of the controller and of the
//! control-plane components, the controller's `/metrics` and `/readyz`, the components' own
//! `/metrics` (client-side rate limiting, work-queue waits), and the machine.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{self, proc_status_kb};

/// Clock ticks per second of /proc/PID/stat (`getconf CLK_TCK`; 100 on Linux if that fails).
pub fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User plus system CPU seconds of a process so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start with field 3, the state.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

pub fn rss_mib(pid: u32) -> Option<f64> {
    proc_status_kb(pid, "VmRSS").map(|kb| kb as f64 / 1024.0)
}

/// The RSS in its two parts: anonymous (heap, stacks) and file-backed (the binary's code, mapped
/// from the file), in MiB.
pub fn rss_parts_mib(pid: u32) -> Option<(f64, f64)> {
    let anonymous = proc_status_kb(pid, "RssAnon")?;
    let file = proc_status_kb(pid, "RssFile")?;
    Some((anonymous as f64 / 1024.0, file as f64 / 1024.0))
}

/// The peak resident set size (VmHWM) so far.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    proc_status_kb(pid, "VmHWM").map(|kb| kb as f64 / 1024.0)
}

/// Samples a process's RSS every `every` into a series of (seconds since `origin`, MiB).
pub struct RssSampler {
    series: Arc<Mutex<Vec<(f64, f64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub fn start(pid: u32, origin: Instant, every: Duration) -> RssSampler {
        let series = Arc::new(Mutex::new(Vec::new()));
        let sink = series.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(mib) = rss_mib(pid) else { return };
                let t = origin.elapsed().as_secs_f64();
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((t, mib));
            }
        });
        RssSampler { series, task }
    }

    pub fn series(&self) -> Vec<(f64, f64)> {
        self.series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The largest sample at or after `from` seconds.
    pub fn max_since(&self, from: f64) -> f64 {
        self.series()
            .iter()
            .filter(|(t, _)| *t >= from)
            .map(|(_, m)| *m)
            .fold(0.0, f64::max)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// GET http://127.0.0.1:<port><path> over plain HTTP/1.0: (status, body), or None if nothing
/// answered within 5 s.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let timeout = Duration::from_secs(5);
        let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, body.to_string()))
    })
    .await
    .ok()
    .flatten()
}

/// Polls `/readyz` every 10 ms until it answers 200; the time since `started`, or None after
/// `timeout`.
pub async fn wait_ready(port: u16, started: Instant, timeout: Duration) -> Option<Duration> {
    while started.elapsed() < timeout {
        if matches!(http_get(port, "/readyz").await, Some((200, _))) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The samples of a Prometheus text exposition: `name{labels}` → value.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `scaledown_api_requests_total` by "verb resource code", from the controller's /metrics.
pub fn api_requests(metrics: &str) -> BTreeMap<String, f64> {
    samples(metrics)
        .into_iter()
        .filter_map(|(key, v)| {
            let labels = key.strip_prefix("scaledown_api_requests_total{")?;
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                let len = labels[start..].find('"')?;
                Some(labels[start..start + len].to_string())
            };
            Some((
                format!(
                    "{} {} {}",
                    label("verb")?,
                    label("resource")?,
                    label("code")?
                ),
                v,
            ))
        })
        .collect()
}

/// `after - before` per key, without zero entries.
pub fn delta(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| d.abs() > 1e-9)
        .collect()
}

/// Requests by "verb resource code" summed by verb.
pub fn by_verb(requests: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (key, n) in requests {
        let verb = key.split(' ').next().unwrap_or("").to_string();
        *out.entry(verb).or_insert(0.0) += n;
    }
    out
}

/// `scaledown_reconcile_errors_total` by category, over all controllers (`contended`: a record refused every time it
/// was tried), from the controller's /metrics.
pub fn reconcile_errors(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    // Summed over the `controller` label.
    for (key, v) in samples(metrics) {
        let Some(labels) = key.strip_prefix("scaledown_reconcile_errors_total{") else {
            continue;
        };
        let Some(start) = labels.find("category=\"").map(|i| i + "category=\"".len()) else {
            continue;
        };
        let Some(len) = labels[start..].find('"') else {
            continue;
        };
        *out.entry(labels[start..start + len].to_string())
            .or_insert(0.0) += v;
    }
    out
}

/// The controller's request counters, reconcile errors and latency histograms now (empty if
/// /metrics did not answer).
pub async fn controller_counters(port: u16) -> Counters {
    match http_get(port, "/metrics").await {
        Some((200, body)) => (
            api_requests(&body),
            reconcile_errors(&body),
            latency_histograms(&body),
        ),
        _ => Default::default(),
    }
}

/// Request counters, reconcile errors, and histogram samples (see [`controller_counters`]).
pub type Counters = (
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
);

/// The histograms that say where a pass waits: for a slot, for a shared list of its namespace,
/// how long each list took and how many passes shared one.
pub const LATENCY_HISTOGRAMS: [&str; 4] = [
    "scaledown_pass_start_wait_seconds",
    "scaledown_namespace_list_wait_seconds",
    "scaledown_namespace_list_duration_seconds",
    "scaledown_namespace_list_callers",
];

/// The samples (`_bucket`, `_sum`, `_count`) of [`LATENCY_HISTOGRAMS`].
pub fn latency_histograms(metrics: &str) -> BTreeMap<String, f64> {
    samples(metrics)
        .into_iter()
        .filter(|(key, _)| LATENCY_HISTOGRAMS.iter().any(|h| key.starts_with(h)))
        .collect()
}

/// `after - before` for every key of `after`, zeros kept (a histogram needs each of its buckets).
pub fn delta_all(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// Checks of [`histograms_json`] and [`quantile`] on a made-up exposition.
pub fn self_test() -> Result<usize, String> {
    let text = "# TYPE scaledown_pass_start_wait_seconds histogram\n\
        scaledown_pass_start_wait_seconds_sum 2.6\n\
        scaledown_pass_start_wait_seconds_count 10\n\
        scaledown_pass_start_wait_seconds_bucket{le=\"0.001\"} 0\n\
        scaledown_pass_start_wait_seconds_bucket{le=\"0.002\"} 5\n\
        scaledown_pass_start_wait_seconds_bucket{le=\"1.0\"} 9\n\
        scaledown_pass_start_wait_seconds_bucket{le=\"+Inf\"} 10\n\
        scaledown_namespace_list_callers_count{kind=\"pods\"} 0\n\
        scaledown_reconciles_total{controller=\"scaledown\"} 3\n";
    let json = histograms_json(&latency_histograms(text));
    let wait = &json["scaledown_pass_start_wait_seconds"];
    let checks: [(bool, &str); 8] = [
        (wait["count"] == 10.0, "count read"),
        (wait["mean"] == 260.0, "mean in ms"),
        (
            wait["p50"] == 2.0,
            "p50 at the top of the bucket that reaches half",
        ),
        (wait["p90"] == 1000.0, "p90 interpolated up to le=1.0"),
        (
            wait["p99"] == 1000.0,
            "a quantile in +Inf is the last finite bound",
        ),
        (
            wait["last_bound"] == 1000.0,
            "the last finite bound is recorded, in ms",
        ),
        (
            json.get("scaledown_reconciles_total").is_none(),
            "other families left out",
        ),
        (
            json["scaledown_namespace_list_callers{kind=\"pods\"}"]["p50"].is_null(),
            "no quantile without observations",
        ),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(format!("histograms: {what}: {json}"));
        }
    }
    Ok(checks.len())
}

/// One histogram from the samples of [`latency_histograms`] (a window: the delta of two), per
/// series (`family` or `family{label="x"}` without `le`): count, mean, and p50/p90/p99 by linear
/// interpolation in the bucket that holds them (bounded by the last finite bucket, `last_bound`:
/// a quantile there is only known to be above it). Waits and durations in ms, counts as they are.
pub fn histograms_json(samples: &BTreeMap<String, f64>) -> Value {
    // series -> (buckets (le, cumulative count), sum, count)
    type Series = (Vec<(f64, f64)>, f64, f64);
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for (key, v) in samples {
        let (name, labels) = key.split_once('{').unwrap_or((key.as_str(), ""));
        let labels = labels.trim_end_matches('}');
        let mut le = None;
        let rest: Vec<&str> = labels
            .split(',')
            .filter(|kv| !kv.is_empty())
            .filter(|kv| match kv.strip_prefix("le=") {
                Some(v) => {
                    le = v.trim_matches('"').parse::<f64>().ok();
                    false
                }
                None => true,
            })
            .collect();
        let (family, part) = if let Some(f) = name.strip_suffix("_bucket") {
            (f, "bucket")
        } else if let Some(f) = name.strip_suffix("_sum") {
            (f, "sum")
        } else if let Some(f) = name.strip_suffix("_count") {
            (f, "count")
        } else {
            continue;
        };
        let id = if rest.is_empty() {
            family.to_string()
        } else {
            format!("{family}{{{}}}", rest.join(","))
        };
        let entry = series.entry(id).or_default();
        match (part, le) {
            ("bucket", Some(le)) => entry.0.push((le, *v)),
            ("sum", _) => entry.1 = *v,
            ("count", _) => entry.2 = *v,
            _ => {}
        }
    }
    let mut out = serde_json::Map::new();
    for (id, (mut buckets, sum, count)) in series {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let scale = if id.contains("_seconds") { 1000.0 } else { 1.0 };
        let q = |q: f64| quantile(&buckets, count, q).map(|x| round3(x * scale));
        let last_bound = buckets
            .iter()
            .rev()
            .find(|(le, _)| le.is_finite())
            .map(|(le, _)| round3(le * scale));
        out.insert(
            id,
            json!({
                "count": count,
                "mean": (count > 0.0).then(|| round3(sum / count * scale)),
                "p50": q(0.5),
                "p90": q(0.9),
                "p99": q(0.99),
                // A quantile at this bound lies in the open top bucket: only known to be above.
                "last_bound": last_bound,
                "unit": if scale > 1.0 { "ms" } else { "count" },
            }),
        );
    }
    Value::Object(out)
}

/// The `q` quantile of cumulative `buckets` holding `count` observations, interpolated linearly
/// within its bucket; the last finite bound if it falls in `+Inf`; None without observations.
pub fn quantile(buckets: &[(f64, f64)], count: f64, q: f64) -> Option<f64> {
    if count <= 0.0 {
        return None;
    }
    let rank = q * count;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, cumulative) in buckets {
        if cumulative >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = cumulative - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        if le.is_finite() {
            lower = le;
        }
        below = cumulative;
    }
    Some(lower)
}

/// What a request count looks like in the JSON: by key, by verb, and the non-watch total.
pub fn requests_json(requests: &BTreeMap<String, f64>) -> Value {
    let verbs = by_verb(requests);
    let non_watch: f64 = verbs
        .iter()
        .filter(|(v, _)| v.as_str() != "watch")
        .map(|(_, n)| n)
        .sum::<f64>()
        + 0.0; // an empty sum is -0.0
    json!({"by_verb": verbs, "by_verb_resource_code": requests, "non_watch_total": non_watch})
}

// === the control plane ===

/// Pids of the control-plane components (target/cluster/pids/<component>.pid).
pub fn component_pids() -> BTreeMap<String, u32> {
    let dir = support::cluster_state_dir().join("pids");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.path().file_stem()?.to_string_lossy().into_owned();
            let pid = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((name, pid))
        })
        .collect()
}

/// CPU seconds of every component so far.
pub fn component_cpu() -> BTreeMap<String, f64> {
    component_pids()
        .into_iter()
        .filter_map(|(name, pid)| Some((name, cpu_seconds(pid)?)))
        .collect()
}

fn endpoint(name: &str) -> Option<String> {
    let text = std::fs::read_to_string(support::cluster_state_dir().join("endpoints")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .map(str::to_string)
}

/// The /metrics samples of kube-controller-manager and kube-scheduler that tell whether they
/// were the bottleneck: time spent in their client-side rate limiter, and work-queue waits.
pub async fn component_metrics() -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for component in ["kube-controller-manager", "kube-scheduler"] {
        let Some(url) = endpoint(component) else {
            continue;
        };
        let body = tokio::process::Command::new("curl")
            .args(["-ksS", "--max-time", "10", &format!("{url}/metrics")])
            .output()
            .await
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for (key, v) in samples(&body) {
            let wanted = key.starts_with("rest_client_rate_limiter_duration_seconds_sum")
                || key.starts_with("rest_client_rate_limiter_duration_seconds_count")
                || key.starts_with("workqueue_queue_duration_seconds_sum")
                || key.starts_with("workqueue_queue_duration_seconds_count")
                || key.starts_with("workqueue_adds_total");
            if wanted {
                out.insert(format!("{component} {key}"), v);
            }
        }
    }
    out
}

/// The throttling and queueing of the control plane between two [`component_metrics`]:
/// per component, seconds its clients waited in their rate limiter (and for how many requests),
/// and per work queue of kcm the items added and their mean wait.
pub fn control_plane_json(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
    cpu: &BTreeMap<String, f64>,
) -> Value {
    let d = delta(after, before);
    let sum_where = |component: &str, prefix: &str| -> f64 {
        d.iter()
            .filter(|(k, _)| k.starts_with(&format!("{component} {prefix}")))
            .map(|(_, v)| v)
            .sum::<f64>()
            + 0.0 // an empty sum is -0.0
    };
    let mut throttling = serde_json::Map::new();
    for component in ["kube-controller-manager", "kube-scheduler"] {
        throttling.insert(
            component.into(),
            json!({
                "rate_limiter_wait_s": round3(sum_where(component, "rest_client_rate_limiter_duration_seconds_sum")),
                "requests": sum_where(component, "rest_client_rate_limiter_duration_seconds_count"),
            }),
        );
    }
    let mut queues = serde_json::Map::new();
    for (key, adds) in &d {
        let Some(name) = key
            .strip_prefix("kube-controller-manager workqueue_adds_total{name=\"")
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let label = format!("{{name=\"{name}\"}}");
        let q = |metric: &str| {
            d.get(&format!("kube-controller-manager {metric}{label}"))
                .copied()
                .unwrap_or(0.0)
        };
        let count = q("workqueue_queue_duration_seconds_count");
        let mean_ms = if count > 0.0 {
            q("workqueue_queue_duration_seconds_sum") / count * 1000.0
        } else {
            0.0
        };
        queues.insert(
            name.to_string(),
            json!({"adds": adds, "mean_wait_ms": round3(mean_ms)}),
        );
    }
    let cpu: BTreeMap<&String, f64> = cpu.iter().map(|(k, v)| (k, round3(*v))).collect();
    json!({"cpu_s": cpu, "client_throttling": throttling, "kcm_work_queues": queues})
}

/// The API server's own queues (API Priority and Fairness) from its /metrics, read with the
/// bench's admin client: seconds requests waited there and how many, by labels.
pub async fn apiserver_metrics(client: &kube::Client) -> BTreeMap<String, f64> {
    let Ok(request) = http::Request::get("/metrics").body(Vec::new()) else {
        return BTreeMap::new();
    };
    let body = client.request_text(request).await.unwrap_or_default();
    samples(&body)
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_sum")
                || k.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_count")
        })
        .collect()
}

/// Per APF priority level, between two [`apiserver_metrics`]: requests, seconds they waited in
/// the API server's queues in all, and the mean wait (ms).
pub fn apiserver_json(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> Value {
    let d = delta(after, before);
    let mut levels: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (key, v) in &d {
        let Some(level) = key
            .split("priority_level=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let entry = levels.entry(level.to_string()).or_default();
        if key.contains("_sum{") {
            entry.0 += v;
        } else {
            entry.1 += v;
        }
    }
    let levels: serde_json::Map<String, Value> = levels
        .into_iter()
        .filter(|(_, (_, n))| *n > 0.0)
        .map(|(level, (wait, n))| {
            (
                level,
                json!({"requests": n, "wait_s": round3(wait), "mean_wait_ms": round3(wait / n * 1000.0)}),
            )
        })
        .collect();
    json!({"apf_queue_wait_by_priority_level": levels, "available": !after.is_empty()})
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// === the machine ===

pub fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn command_out(program: &str, args: &[&str], dir: &Path) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("", |(_, m)| m.trim());
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    json!({
        "hostname": read_trim("/proc/sys/kernel/hostname"),
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "cpu_model": model,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "memory_gib": round3(mem_kib as f64 / 1024.0 / 1024.0),
    })
}

/// Versions: the controller's commit, rustc, and the control plane's (hack/versions.env).
pub fn versions() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = command_out("git", &["rev-parse", "--short=12", "HEAD"], root);
    let dirty = !command_out(
        "git",
        &[
            "status",
            "--porcelain",
            "--",
            "src",
            "Cargo.toml",
            "Cargo.lock",
        ],
        root,
    )
    .is_empty();
    let env = std::fs::read_to_string(root.join("hack/versions.env")).unwrap_or_default();
    let mut control_plane = serde_json::Map::new();
    for line in env.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = line.split_once('=')
            && k.ends_with("_VERSION")
        {
            let key = k.trim_end_matches("_VERSION").to_lowercase();
            control_plane.insert(key, json!(v.trim_matches('"')));
        }
    }
    json!({
        "controller_commit": commit,
        "controller_dirty": dirty,
        "controller_profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "rustc": command_out("rustc", &["--version"], root),
        "control_plane": control_plane,
    })
}
