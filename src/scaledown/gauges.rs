//! The scale-down controller's gauges, computed from its caches at each scrape of `/metrics`:
//! claims left behind by sets that did not opt in, the cleanup pods in flight, and the opted-in
//! sets by the status annotation they carry.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use super::decide::status::Status;
use super::observe;
use super::watch::Stores;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// Opted-in sets in the cache by the status annotation they carry (sets without a valid one yet
/// are not counted), every status present with its count (0 included).
pub fn count_statuses(
    sets: &[std::sync::Arc<k8s_openapi::api::apps::v1::StatefulSet>],
) -> BTreeMap<Status, usize> {
    let mut counts: BTreeMap<Status, usize> = Status::ALL.into_iter().map(|s| (s, 0)).collect();
    for facts in sets.iter().map(|s| observe::set_facts(s)) {
        let opted_in = facts.template.is_some() && !facts.claim_templates.is_empty();
        if let Some(status) = facts
            .status
            .as_deref()
            .and_then(Status::parse)
            .filter(|_| opted_in)
        {
            *counts.entry(status).or_insert(0) += 1;
        }
    }
    counts
}

/// Registered by the wiring when the scale-down controller runs.
pub struct Gauges(pub Stores);

impl std::fmt::Debug for Gauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scaledown::Gauges")
    }
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let stores = &self.0;
        // Caches hold their last complete list, so a relist never shows a half-empty count.
        let orphans = observe::unmanaged_orphans(&stores.sets.state(), &stores.claims.all());
        let running = stores.cleanup_pods.all();
        let running = running.iter().filter(|p| observe::in_flight(p)).count();
        let statuses = count_statuses(&stores.sets.state());
        encode(&mut encoder, running, &orphans, &statuses)
    }
}

/// Writes the families: `cleanups_running`, `statefulsets` per status, then `orphaned_claims` per
/// namespace (left out while no namespace has one, as an empty family is).
pub fn encode(
    encoder: &mut DescriptorEncoder,
    running: usize,
    orphans: &BTreeMap<String, usize>,
    statuses: &BTreeMap<Status, usize>,
) -> std::fmt::Result {
    let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    let running = gauge(running);
    let metric = encoder.encode_descriptor(
        "cleanups_running",
        "Cleanup pods in flight now.",
        None,
        running.metric_type(),
    )?;
    running.encode(metric)?;
    let mut family = encoder.encode_descriptor(
        "statefulsets",
        "Opted-in StatefulSets by the status annotation they carry (Idle, CleaningUp, Stalled, Paused).",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (status, n) in statuses {
        let labels = StatusLabels {
            status: status.as_str(),
        };
        gauge(*n).encode(family.encode_family(&labels)?)?;
    }
    if orphans.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "orphaned_claims",
        "Claims of StatefulSets without the cleanup annotation whose ordinal is no longer wanted.",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (namespace, n) in orphans {
        let labels = NamespaceLabels {
            namespace: namespace.clone(),
        };
        gauge(*n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
