//! Prometheus metrics. Every family lives here, registered under one prefix; labels are bounded
//! (error categories, results), never object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Prefix of every metric name.
pub const PREFIX: &str = "scaledown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub category: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    cleanups_started: Counter,
    cleanups_succeeded: Counter,
    cleanups_failed: Counter,
    cleanups_given_up: Counter,
    claims_deleted: Counter,
    cleanups_running: Gauge,
    reconciles: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let m = Metrics {
            cleanups_started: Counter::default(),
            cleanups_succeeded: Counter::default(),
            cleanups_failed: Counter::default(),
            cleanups_given_up: Counter::default(),
            claims_deleted: Counter::default(),
            cleanups_running: Gauge::default(),
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            registry: Registry::default(),
        };
        registry.register(
            "cleanups_started",
            "Cleanup pods created",
            m.cleanups_started.clone(),
        );
        registry.register(
            "cleanups_succeeded",
            "Cleanups completed: claims and pod deleted",
            m.cleanups_succeeded.clone(),
        );
        registry.register(
            "cleanups_failed",
            "Cleanup pods seen in phase Failed",
            m.cleanups_failed.clone(),
        );
        registry.register(
            "cleanups_given_up",
            "Cleanup series that used up their attempts",
            m.cleanups_given_up.clone(),
        );
        registry.register(
            "claims_deleted",
            "PersistentVolumeClaims deleted after a successful cleanup",
            m.claims_deleted.clone(),
        );
        registry.register(
            "cleanups_running",
            "Cleanup pods in flight now",
            m.cleanups_running.clone(),
        );
        registry.register("reconciles", "StatefulSet reconciles", m.reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error category",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            m.reconcile_duration.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn cleanup_started(&self) {
        self.cleanups_started.inc();
    }
    pub fn cleanup_succeeded(&self) {
        self.cleanups_succeeded.inc();
    }
    pub fn cleanup_failed(&self) {
        self.cleanups_failed.inc();
    }
    pub fn cleanup_given_up(&self) {
        self.cleanups_given_up.inc();
    }
    pub fn claim_deleted(&self) {
        self.claims_deleted.inc();
    }
    pub fn set_cleanups_running(&self, n: usize) {
        self.cleanups_running
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    pub fn reconciled(&self, seconds: f64, error: Option<&'static str>) {
        self.reconciles.inc();
        self.reconcile_duration.observe(seconds);
        if let Some(category) = error {
            self.reconcile_errors
                .get_or_create(&ErrorLabels { category })
                .inc();
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
