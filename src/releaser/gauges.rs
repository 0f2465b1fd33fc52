//! The releaser's gauge, computed from its caches at each scrape of `/metrics`:
//! `scaledown_pv_pool_volumes`, the PVs of the StorageClasses with this releaser's id by class and
//! phase. [`Pool`] is also what `/readyz` waits on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::naming::CONTROLLER_ID_ANNOTATION;

/// What `/metrics` (the pool gauge) and `/readyz` read of the releaser.
#[derive(Clone)]
pub struct Pool {
    /// The PV cache.
    pub pvs: Store<PersistentVolume>,
    /// The StorageClass cache.
    pub classes: Store<StorageClass>,
    /// This releaser's id (`--pv-releaser-id`).
    pub id: String,
}

impl Pool {
    /// PVs of this releaser's classes by (class, phase).
    pub fn counts(&self) -> BTreeMap<(String, String), usize> {
        pool(&self.pvs, &self.classes, &self.id)
    }

    /// Waits until both caches have their first full list.
    pub async fn ready(&self) {
        let _ = self.pvs.wait_until_ready().await;
        let _ = self.classes.wait_until_ready().await;
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("id", &self.id).finish()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct PoolLabels {
    class: String,
    phase: String,
}

/// `scaledown_pv_pool_volumes`, computed from the caches at each scrape (left out while no class
/// carries the id, as an empty family is). Registered by the wiring when the releaser runs.
impl prometheus_client::collector::Collector for Pool {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        encode_pool(&mut encoder, &self.counts())
    }
}

/// Writes `pv_pool_volumes` from these counts per (class, phase).
pub fn encode_pool(
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
    counts: &BTreeMap<(String, String), usize>,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::gauge::ConstGauge;
    if counts.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "pv_pool_volumes",
        "PersistentVolumes of StorageClasses with this releaser's id, by class and phase.",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for ((class, phase), n) in counts {
        let labels = PoolLabels {
            class: class.clone(),
            phase: phase.clone(),
        };
        let gauge = ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX));
        gauge.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// PVs of the StorageClasses with `id`, counted by class and phase (for `scaledown_pv_pool_volumes`,
/// at scrape time).
pub fn pool(
    pvs: &Store<PersistentVolume>,
    classes: &Store<StorageClass>,
    id: &str,
) -> BTreeMap<(String, String), usize> {
    let ours: Vec<String> = classes
        .state()
        .iter()
        .filter(|c| {
            c.annotations()
                .get(CONTROLLER_ID_ANNOTATION)
                .map(String::as_str)
                == Some(id)
        })
        .map(|c| c.name_any())
        .collect();
    let mut counts = BTreeMap::new();
    for class in &ours {
        for phase in ["Available", "Bound", "Released"] {
            counts.insert((class.clone(), phase.to_string()), 0);
        }
    }
    for pv in pvs.state() {
        let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        let Some(class) = class.filter(|c| ours.contains(c)) else {
            continue;
        };
        let phase = pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        *counts.entry((class, phase)).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use kube::runtime::reflector;

    use super::*;

    fn store<K>(objects: Vec<serde_json::Value>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + 'static,
    {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&Event::Init);
        for o in objects {
            let object: K = serde_json::from_value(o).expect("object");
            writer.apply_watcher_event(&Event::InitApply(object));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    #[test]
    fn the_pool_counts_pvs_of_our_classes_by_phase() {
        let class = |name: &str, id: Option<&str>| {
            let annotations = id.map(|i| json!({CONTROLLER_ID_ANNOTATION: i}));
            json!({"metadata": {"name": name, "annotations": annotations}, "provisioner": "x"})
        };
        let pv = |name: &str, class: &str, phase: &str| {
            json!({"metadata": {"name": name}, "spec": {"storageClassName": class},
                   "status": {"phase": phase}})
        };
        let classes = store::<StorageClass>(vec![
            class("pool", Some("ci")),
            class("other", Some("someone-else")),
            class("plain", None),
        ]);
        let pvs = store::<PersistentVolume>(vec![
            pv("a", "pool", "Available"),
            pv("b", "pool", "Released"),
            pv("c", "pool", "Released"),
            pv("d", "other", "Released"),
            pv("e", "plain", "Available"),
        ]);
        let counts = pool(&pvs, &classes, "ci");
        let at = |phase: &str| counts[&("pool".to_string(), phase.to_string())];
        assert_eq!((at("Available"), at("Bound"), at("Released")), (1, 0, 2));
        assert_eq!(counts.len(), 3, "only our class: {counts:?}");
    }
}
