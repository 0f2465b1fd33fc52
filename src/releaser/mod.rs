//! The PV pool releaser (opt-in with `--pv-releaser-id ID`): a PersistentVolume whose StorageClass
//! carries `reclaimable-pv-releaser.kubernetes.io/controller-id: ID` (plumber-cd's annotation), whose
//! reclaim policy is Retain and which is `Released` because its claim is really gone, gets its
//! `spec.claimRef` removed, so it is `Available` again, with its data, for the next claim.
//!
//! Same shape as the scale-down controller: watch (PVs and StorageClasses) → observe → decide (pure)
//! → confirm (a live read of the claim) → act (the guarded writes of the plan) → report.

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;
pub mod scrub;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::cli::Args;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::naming::{CONTROLLER_ID_ANNOTATION, SCRUB_PV_LABEL};
use crate::pass;
use crate::resuming::{WatchBackoff, resuming};
use reconcile::{Context, error_policy, reconcile};

/// The releaser's caches (PVs, StorageClasses, both cluster-wide) and their change streams.
pub struct Watches {
    pub pvs: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    /// Scrub pods of the scrub namespace (empty without one).
    pub scrub_pods: Store<Pod>,
    scrub_changes: BoxStream<'static, watcher::Result<Pod>>,
    pv_changes: BoxStream<'static, watcher::Result<PersistentVolume>>,
    class_changes: BoxStream<'static, watcher::Result<StorageClass>>,
}

impl Watches {
    pub fn new(client: &Client, scrub_ns: Option<&str>) -> Watches {
        let (scrub_pods, scrub_writer) = reflector::store();
        let scrub_changes = match scrub_ns {
            Some(ns) => {
                let api: Api<Pod> = Api::namespaced(client.clone(), ns);
                let selector = watcher::Config::default().labels(&format!("{SCRUB_PV_LABEL}=true"));
                let stream = resuming("scrub pods", move || {
                    watcher(api.clone(), selector.clone())
                        .modify(|p: &mut Pod| p.managed_fields_mut().clear())
                });
                reflector::reflector(scrub_writer, stream)
                    .touched_objects()
                    .boxed()
            }
            None => futures::stream::pending().boxed(),
        };
        let (pvs, pv_writer) = reflector::store();
        let (classes, class_writer) = reflector::store();
        let pv_api: Api<PersistentVolume> = Api::all(client.clone());
        let class_api: Api<StorageClass> = Api::all(client.clone());
        let pv_stream = resuming("persistentvolumes", move || {
            watcher(pv_api.clone(), watcher::Config::default())
                .modify(|pv: &mut PersistentVolume| pv.managed_fields_mut().clear())
        });
        let class_stream = resuming("storageclasses", move || {
            watcher(class_api.clone(), watcher::Config::default())
                .modify(|c: &mut StorageClass| c.managed_fields_mut().clear())
        });
        Watches {
            pvs,
            classes,
            scrub_pods,
            scrub_changes,
            pv_changes: reflector::reflector(pv_writer, pv_stream)
                .applied_objects()
                .boxed(),
            class_changes: reflector::reflector(class_writer, class_stream)
                .touched_objects()
                .boxed(),
        }
    }

    pub fn pool(&self, id: &str) -> Pool {
        Pool {
            pvs: self.pvs.clone(),
            classes: self.classes.clone(),
            id: id.to_string(),
        }
    }
}

/// What `/metrics` (the pool gauge) and `/readyz` read of the releaser.
#[derive(Clone)]
pub struct Pool {
    pub pvs: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    pub id: String,
}

impl Pool {
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

/// The PV releaser's pass context: its writer, the StorageClass cache and the scrub pods.
pub fn context(
    args: &Args,
    client: &Client,
    pool: &Pool,
    (scrub_pods, scrub_ns): (Store<Pod>, Option<String>),
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<Context> {
    let (reporter, runner) =
        pass::from_args(crate::naming::Controller::Releaser, args, client, metrics);
    let writer = act::Releaser::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    Arc::new(Context::new(
        client.clone(),
        pool.classes.clone(),
        scrub_pods,
        scrub_ns,
        pool.id.clone(),
        writer,
        leadership.clone(),
        runner,
    ))
}

/// kube's Controller over PVs, woken also by a change of their StorageClass, as one future that
/// ends after `stop` once the running passes have.
pub fn controller(
    watches: Watches,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let Watches {
        pvs,
        pv_changes,
        class_changes,
        scrub_changes,
        ..
    } = watches;
    let cached = pvs.clone();
    Controller::for_stream(pv_changes, pvs)
        .trigger_backoff(WatchBackoff::default())
        // A class change is rare; it wakes the PVs of that class (a scan of the PV cache).
        .watches_stream(class_changes, move |class: StorageClass| {
            let name = class.name_any();
            cached
                .state()
                .iter()
                .filter(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.storage_class_name.as_deref())
                        == Some(name.as_str())
                })
                .map(|pv| ObjectRef::from_obj(pv.as_ref()))
                .collect::<Vec<_>>()
        })
        // A scrub pod names its PV in an annotation (PV names may be longer than a label value).
        .watches_stream(scrub_changes, |pod: Pod| {
            pod.annotations()
                .get(SCRUB_PV_LABEL)
                .map(|pv| ObjectRef::<PersistentVolume>::new(pv))
        })
        .reconcile_all_on(became_leader)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((pv, _)) => debug!(pv = %pv.name, "released or left alone"),
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(pv)) => {
                    debug!(pv = %pv.name, "gone before its pass")
                }
                Err(e) => warn!(error = %e, "PV watch or queue error"),
            }
        })
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

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
