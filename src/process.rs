//! Process metrics with the names every Prometheus client library uses (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, ...), read from `/proc/self` at scrape time. A few lines of
//! parsing instead of a crate: the `prometheus` crate's collector brings its own registry type and
//! `procfs`; nothing maintained exists for `prometheus-client`. Off Linux the family is empty.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Clock ticks per second of the times in /proc/<pid>/stat (USER_HZ): 100 on every Linux
/// architecture this controller is built for (x86_64, aarch64).
const USER_HZ: f64 = 100.0;

/// One reading of /proc/self.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// User and system CPU time.
    pub cpu_seconds: f64,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Virtual memory size.
    pub virtual_memory_bytes: f64,
    /// Resident set size.
    pub resident_memory_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The limit of open file descriptors, if there is one.
    pub max_fds: Option<f64>,
}

impl Sample {
    /// Reads /proc/self; `None` where it is missing or unreadable.
    pub fn read() -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        parse(&stat, &status, &boot, open_fds, &limits)
    }
}

/// The sample from the text of /proc/self/stat, /proc/self/status, /proc/stat, the number of
/// entries in /proc/self/fd and /proc/self/limits.
pub fn parse(stat: &str, status: &str, boot: &str, fds: usize, limits: &str) -> Option<Sample> {
    // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    let btime = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<f64>()
        .ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    let max_fds = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    Some(Sample {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        start_time_seconds: btime + field(22)? / USER_HZ,
        virtual_memory_bytes: field(23)?,
        resident_memory_bytes: rss_kib * 1024.0,
        open_fds: fds as f64,
        max_fds,
    })
}

/// Encodes a fresh [`Sample`] on every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = Sample::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        let help = "Total user and system CPU time spent in seconds";
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            help,
            None,
            cpu.metric_type(),
        )?)?;
        let mut gauges = vec![
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                s.start_time_seconds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_memory_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
        ];
        if let Some(max) = s.max_fds {
            gauges.push((
                "process_max_fds",
                "Maximum number of open file descriptors",
                max,
            ));
        }
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// A registry without prefix that holds only the process collector.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";

    #[test]
    fn parses_proc_text() {
        let status = "Name:\tx\nVmRSS:\t   10240 kB\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\n";
        let limits = "Limit Soft Limit Hard Limit Units\nMax open files            1048576              1048576              files\n";
        let s = parse(STAT, status, boot, 7, limits).expect("parses");
        assert!(
            (s.start_time_seconds - 1_700_000_123.45).abs() < 1e-3,
            "{s:?}"
        );
        assert_eq!(
            s,
            Sample {
                cpu_seconds: 3.0,
                start_time_seconds: s.start_time_seconds,
                virtual_memory_bytes: 104_857_600.0,
                resident_memory_bytes: 10_485_760.0,
                open_fds: 7.0,
                max_fds: Some(1_048_576.0),
            }
        );
        assert_eq!(parse("garbage", status, boot, 1, limits), None);
        assert_eq!(parse(STAT, status, "no btime", 1, limits), None);
    }

    /// On Linux the live process yields every family, with plausible values.
    #[test]
    fn live_families() {
        let s = Sample::read().expect("/proc/self is readable");
        assert!(s.resident_memory_bytes > 0.0 && s.open_fds >= 3.0, "{s:?}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry()).expect("encodes");
        for family in [
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{family} "))),
                "{family} missing:\n{text}"
            );
        }
        let reference = include_str!("../docs/reference.md");
        let documented: Vec<&str> = reference
            .lines()
            .filter(|l| l.starts_with("| `process_"))
            .filter_map(|l| l.split('`').nth(1))
            .collect();
        let exported: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let exported: Vec<String> = exported
            .iter()
            .map(|n| {
                if text.contains(&format!("# TYPE {n} counter")) {
                    format!("{n}_total")
                } else {
                    n.to_string()
                }
            })
            .collect();
        assert_eq!(
            documented, exported,
            "docs/reference.md process metrics vs /metrics"
        );
    }
}
