//! Prometheus metrics. Every family lives here, registered under one prefix; labels are bounded
//! (error categories, results), never object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::naming::Controller;

/// Prefix of every metric name.
pub const PREFIX: &str = "scaledown";

/// Buckets of the pass duration histogram: 1 ms doubling to 8 s.
fn pass_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The controller a pass belongs to (`naming::Controller`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller's label value.
    pub controller: &'static str,
}

/// The labels of a failed pass: the controller and the error's category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller's label value.
    pub controller: &'static str,
    /// The error's category ([`crate::error::Category`]).
    pub category: &'static str,
}

/// The Event reason of an outcome (see `reason::Reason`): a bounded set. Its type (Normal or
/// Warning) follows from the reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The Event reason.
    pub reason: &'static str,
}

/// The kind of a namespace's live list: `claims`, `pods`, `statefulsets`, or `all` (the whole
/// read of the namespace, from the send of its first list to the answer of its last).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListLabels {
    /// What was listed.
    pub kind: &'static str,
}

/// The kinds of [`ListLabels`].
pub const LIST_KINDS: [&str; 4] = ["claims", "pods", "statefulsets", "all"];

/// Buckets of the waits before a pass or for a shared read: 1 ms doubling to 524 s (at 5,000
/// sets scaled down at once, the slowest waits passed a minute).
fn wait_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// The outcome of a scrub: `succeeded` or `failed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `succeeded` or `failed`.
    pub outcome: &'static str,
}

/// What the binary is: the crate version and the commit it was built from (build.rs:
/// `SCALEDOWN_GIT_COMMIT` from the build tooling, else git, else "unknown").
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
    /// The commit built.
    pub commit: &'static str,
}

impl BuildLabels {
    /// This binary's.
    pub const THIS: BuildLabels = BuildLabels {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("SCALEDOWN_GIT_COMMIT"),
    };
}

/// The process's Prometheus metrics: the registry `/metrics` encodes and the handles that count.
pub struct Metrics {
    /// The registry of every family below.
    pub registry: Registry,
    build_info: Family<BuildLabels, Gauge>,
    pv_released: Counter,
    pv_scrubs: Family<OutcomeLabels, Counter>,
    cleanups_started: Counter,
    cleanups_succeeded: Counter,
    cleanups_failed: Counter,
    cleanups_given_up: Counter,
    claims_deleted: Counter,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    cleanup_duration: Histogram,
    release_window: Histogram,
    leader: Gauge,
    events: Family<EventLabels, Counter>,
    namespace_list_duration: Family<ListLabels, Histogram, fn() -> Histogram>,
    namespace_list_callers: Histogram,
    namespace_list_wait: Histogram,
    pass_start_wait: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let m = Metrics {
            build_info: Family::default(),
            pv_released: Counter::default(),
            pv_scrubs: Family::default(),
            cleanups_started: Counter::default(),
            cleanups_succeeded: Counter::default(),
            cleanups_failed: Counter::default(),
            cleanups_given_up: Counter::default(),
            claims_deleted: Counter::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(pass_buckets),
            cleanup_duration: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            release_window: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            leader: Gauge::default(),
            events: Family::default(),
            namespace_list_duration: Family::new_with_constructor(wait_buckets),
            namespace_list_callers: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            namespace_list_wait: wait_buckets(),
            pass_start_wait: wait_buckets(),
            registry: Registry::default(),
        };
        m.register(&mut registry);
        m.build_info.get_or_create(&BuildLabels::THIS).set(1);
        // Every label value of the bounded families exists from the start at 0: the families
        // render before their first sample, and `rate()` sees the first increment.
        for controller in Controller::ALL.map(Controller::as_str) {
            let labels = ControllerLabels { controller };
            m.reconciles.get_or_create(&labels).inc_by(0);
            drop(m.reconcile_duration.get_or_create(&labels));
            for category in crate::error::Category::ALL {
                let category = category.as_str();
                let labels = ErrorLabels {
                    controller,
                    category,
                };
                m.reconcile_errors.get_or_create(&labels).inc_by(0);
            }
        }
        for kind in LIST_KINDS {
            drop(
                m.namespace_list_duration
                    .get_or_create(&ListLabels { kind }),
            );
        }
        for outcome in ["succeeded", "failed"] {
            m.pv_scrubs
                .get_or_create(&OutcomeLabels { outcome })
                .inc_by(0);
        }
        for reason in crate::reason::Reason::ALL {
            m.events
                .get_or_create(&EventLabels {
                    reason: reason.as_str(),
                })
                .inc_by(0);
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Registers every family under the prefix.
    fn register(&self, registry: &mut Registry) {
        self.register_cleanups(registry);
        self.register_controller(registry);
        self.register_companions(registry);
    }

    /// The scale-down controller's cleanups and claims.
    fn register_cleanups(&self, registry: &mut Registry) {
        registry.register(
            "cleanups_started",
            "Cleanup pods created",
            self.cleanups_started.clone(),
        );
        registry.register(
            "cleanups_succeeded",
            "Cleanups completed: claims and pod deleted",
            self.cleanups_succeeded.clone(),
        );
        registry.register(
            "release_window_seconds",
            "From the send of the compare-and-swap that confirmed a set unchanged to the answer to the release of its cleanup pod",
            self.release_window.clone(),
        );
        registry.register(
            "cleanups_failed",
            "Cleanup pods seen in phase Failed",
            self.cleanups_failed.clone(),
        );
        registry.register(
            "cleanups_given_up",
            "Cleanup series that used up their attempts",
            self.cleanups_given_up.clone(),
        );
        registry.register(
            "claims_deleted",
            "PersistentVolumeClaims deleted after a successful cleanup",
            self.claims_deleted.clone(),
        );
        registry.register(
            "cleanup_duration_seconds",
            "Time from a cleanup pod's creation to the completion of its cleanup",
            self.cleanup_duration.clone(),
        );
        self.register_latency(registry);
    }

    /// Where a pass of the scale-down controller waits: for a slot, and for a live namespace list.
    fn register_latency(&self, registry: &mut Registry) {
        registry.register(
            "pass_start_wait_seconds",
            "Scale-down controller: from the first watch event that woke a StatefulSet (or the end of its pass running then) to the start of its next pass: the wait for one of --concurrency slots",
            self.pass_start_wait.clone(),
        );
        registry.register(
            "namespace_list_wait_seconds",
            "Scale-down controller: from a pass asking for a live list of its namespace to the answer (the list on its way, if any, then the one the pass shares)",
            self.namespace_list_wait.clone(),
        );
        registry.register(
            "namespace_list_duration_seconds",
            "One live list of a namespace shared by passes, by kind (claims, pods, statefulsets; all: the whole read)",
            self.namespace_list_duration.clone(),
        );
        registry.register(
            "namespace_list_callers",
            "Passes served by one live list of a namespace",
            self.namespace_list_callers.clone(),
        );
    }

    /// Reconciles, leadership, Events and API requests, shared by every controller.
    fn register_controller(&self, registry: &mut Registry) {
        registry.register(
            "build_info",
            "1, labelled with the version and the commit the binary was built from",
            self.build_info.clone(),
        );
        registry.register(
            "reconciles",
            "Passes over one object, by controller (scaledown: StatefulSets; pv-releaser: PersistentVolumes; pod-bound: claims)",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed passes by controller and error category",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one pass, by controller",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica may write (leader, or no election)",
            self.leader.clone(),
        );
        registry.register(
            "events",
            "Outcomes reported as Events, by Event reason",
            self.events.clone(),
        );
        registry.register(
            "api_requests",
            "Kubernetes API requests sent, by verb, resource and HTTP status code",
            crate::api_metrics::requests().clone(),
        );
    }

    /// The companions: the PV releaser.
    fn register_companions(&self, registry: &mut Registry) {
        registry.register(
            "pv_released",
            "PersistentVolumes the PV releaser made Available again (--pv-releaser-id)",
            self.pv_released.clone(),
        );
        registry.register(
            "pv_scrubs",
            "Scrubs of Released PVs finished, by outcome (succeeded, failed)",
            self.pv_scrubs.clone(),
        );
    }

    /// The window in which a scale-up could still meet a released cleanup pod: from the send of
    /// the request that confirmed the set unchanged (the record, or the guard) to the answer to
    /// the release.
    pub fn release_window(&self, seconds: f64) {
        self.release_window.observe(seconds);
    }
    /// A cleanup pod was created.
    pub fn cleanup_started(&self) {
        self.cleanups_started.inc();
    }
    /// A cleanup pod succeeded.
    pub fn cleanup_succeeded(&self) {
        self.cleanups_succeeded.inc();
    }
    /// A cleanup pod failed.
    pub fn cleanup_failed(&self) {
        self.cleanups_failed.inc();
    }
    /// A woken pass waited `seconds` before it started.
    pub fn pass_start_waited(&self, seconds: f64) {
        self.pass_start_wait.observe(seconds);
    }
    /// A pass waited `seconds` for a live list of its namespace.
    pub fn namespace_list_waited(&self, seconds: f64) {
        self.namespace_list_wait.observe(seconds);
    }
    /// One list of `kind` (see [`ListLabels`]) of a namespace took `seconds`.
    pub fn namespace_listed(&self, kind: &'static str, seconds: f64) {
        self.namespace_list_duration
            .get_or_create(&ListLabels { kind })
            .observe(seconds);
    }
    /// One live read of a namespace served `callers` passes.
    pub fn namespace_list_shared(&self, callers: usize) {
        self.namespace_list_callers.observe(callers as f64);
    }
    /// An ordinal's cleanup was given up (every attempt failed).
    pub fn cleanup_given_up(&self) {
        self.cleanups_given_up.inc();
    }
    /// Counts an outcome; failed and given-up cleanups also count in their own families.
    pub fn event(&self, reason: crate::reason::Reason) {
        use crate::reason::Reason;
        self.events
            .get_or_create(&EventLabels {
                reason: reason.as_str(),
            })
            .inc();
        match reason {
            Reason::CleanupFailed => self.cleanup_failed(),
            Reason::CleanupGaveUp => self.cleanup_given_up(),
            _ => {}
        }
    }
    /// A PV was released.
    pub fn pv_released(&self) {
        self.pv_released.inc();
    }
    /// A scrub ended, successfully or not.
    pub fn pv_scrubbed(&self, succeeded: bool) {
        let outcome = if succeeded { "succeeded" } else { "failed" };
        self.pv_scrubs
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
    /// An orphaned claim was deleted.
    pub fn claim_deleted(&self) {
        self.claims_deleted.inc();
    }
    /// A cleanup took `seconds`, from its pod's create to its claims' deletion.
    pub fn cleanup_took(&self, seconds: f64) {
        self.cleanup_duration.observe(seconds);
    }
    /// This process leads (or no longer does).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
    /// One pass of `controller` took `seconds`, and failed with `error` if it did.
    pub fn reconciled(
        &self,
        controller: Controller,
        seconds: f64,
        error: Option<crate::error::Category>,
    ) {
        let controller = controller.as_str();
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(seconds);
        if let Some(category) = error {
            let category = category.as_str();
            let labels = ErrorLabels {
                controller,
                category,
            };
            self.reconcile_errors.get_or_create(&labels).inc();
        }
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collectors' gauges with a sample each.
    #[derive(Debug)]
    struct Fixed;

    impl prometheus_client::collector::Collector for Fixed {
        fn encode(
            &self,
            mut encoder: prometheus_client::encoding::DescriptorEncoder,
        ) -> std::fmt::Result {
            let orphans = [("ns".to_string(), 1)].into();
            let statuses = [(crate::scaledown::decide::status::Status::Idle, 1)].into();
            crate::scaledown::gauges::encode(&mut encoder, 1, &orphans, &statuses)?;
            crate::releaser::gauges::encode_pool(
                &mut encoder,
                &[(("pool".into(), "Available".into()), 2)].into(),
            )
        }
    }

    /// Every family served on `/metrics` (this registry and the process collector, as `http`
    /// encodes them): name, type, label names and HELP text, one table row each, in order. The
    /// metrics table of docs/reference.md is exactly this.
    fn metrics_table() -> String {
        let m = Metrics::default();
        m.cleanup_took(3.0);
        // The gauges computed at scrape time, as the scale-down controller's and the PV releaser's
        // collectors write them (the pool's once a class carries the releaser's id).
        let mut gauges = Registry::with_prefix(PREFIX);
        gauges.register_collector(Box::new(Fixed));
        // Renders once the client sent its first request (at start, the watches).
        crate::api_metrics::requests()
            .get_or_create(&crate::api_metrics::RequestLabels {
                verb: "watch",
                resource: "pods".into(),
                code: "200".into(),
            })
            .inc_by(0);
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &m.registry);
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &gauges);
        let _ = prometheus_client::encoding::text::encode_registry(
            &mut text,
            &crate::process::registry(),
        );
        let mut table = String::from("| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n");
        let mut help = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                help = rest.split_once(' ').map_or("", |(_, h)| h);
            }
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (family, kind) = rest.split_once(' ').expect("# TYPE name type");
            let name = if kind == "counter" {
                format!("{family}_total")
            } else {
                family.to_string()
            };
            // Label names of the family's samples (a histogram's `le` is not one of its labels).
            let mut labels: Vec<&str> = Vec::new();
            let of_family = |l: &&str| {
                let sample = l.split(['{', ' ']).next().unwrap_or_default();
                ["", "_total", "_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .any(|suffix| sample.strip_suffix(suffix) == Some(family))
            };
            for sample in text.lines().filter(of_family) {
                let inner = sample
                    .split_once('{')
                    .and_then(|(_, r)| r.split_once('}'))
                    .map_or("", |(inner, _)| inner);
                for key in inner
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|kv| kv.0)
                {
                    if key != "le" && !labels.contains(&key) {
                        labels.push(key);
                    }
                }
            }
            let labels: Vec<String> = labels.iter().map(|l| format!("`{l}`")).collect();
            let labels = if labels.is_empty() {
                "–".to_string()
            } else {
                labels.join(", ")
            };
            let help = crate::docs::cell(help);
            table.push_str(&format!("| `{name}` | {kind} | {labels} | {help} |\n"));
        }
        table
    }

    /// The metrics table of docs/reference.md is generated from the registry.
    #[test]
    fn the_metrics_table_is_generated_from_the_registry() {
        let table = metrics_table();
        assert!(table.lines().count() > 20, "{table}");
        crate::docs::check_generated("metrics", &table);
    }

    /// `scaledown_build_info` is 1 with this build's version and commit (the commit `--version`
    /// prints, from build.rs).
    #[test]
    fn build_info_names_the_version_and_commit() {
        let text = Metrics::default().encode();
        let line = format!(
            "scaledown_build_info{{version=\"{}\",commit=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            env!("SCALEDOWN_GIT_COMMIT")
        );
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        assert!(crate::cli::VERSION.contains(env!("SCALEDOWN_GIT_COMMIT")));
        assert!(text.contains("# TYPE scaledown_build_info gauge"), "{text}");
    }

    /// Error categories and Event reasons are declared at 0 before anything happened.
    #[test]
    fn bounded_label_values_start_at_zero() {
        let text = Metrics::default().encode();
        for controller in Controller::ALL.map(Controller::as_str) {
            let line = format!("scaledown_reconciles_total{{controller=\"{controller}\"}} 0");
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
            for category in crate::error::Category::ALL {
                let line = format!(
                    "scaledown_reconcile_errors_total{{controller=\"{controller}\",category=\"{}\"}} 0",
                    category.as_str()
                );
                assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
            }
        }
        for reason in crate::reason::Reason::ALL {
            let line = format!("scaledown_events_total{{reason=\"{}\"}} 0", reason.as_str());
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
