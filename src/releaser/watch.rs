//! WATCH: the releaser's own caches (PVs and StorageClasses, cluster-wide; scrub pods of the scrub
//! namespace) and the mapping of a class or scrub pod change to the PVs it concerns.

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::gauges::Pool;
use crate::naming::SCRUB_PV_LABEL;
use crate::resuming::resuming;

/// The releaser's caches (PVs, StorageClasses, both cluster-wide) and their change streams.
pub struct Watches {
    /// The PV cache.
    pub pvs: Store<PersistentVolume>,
    /// The StorageClass cache.
    pub classes: Store<StorageClass>,
    /// Scrub pods of the scrub namespace (empty without one).
    pub scrub_pods: Store<Pod>,
    pub(super) scrub_changes: BoxStream<'static, watcher::Result<Pod>>,
    pub(super) pv_changes: BoxStream<'static, watcher::Result<PersistentVolume>>,
    pub(super) class_changes: BoxStream<'static, watcher::Result<StorageClass>>,
}

impl Watches {
    /// The watches through `client`; scrub pods only with a scrub namespace.
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

    /// What the pool gauge and `/readyz` read, for the releaser with this `id`.
    pub fn pool(&self, id: &str) -> Pool {
        Pool {
            pvs: self.pvs.clone(),
            classes: self.classes.clone(),
            id: id.to_string(),
        }
    }
}

/// The PVs of `class` in the PV cache: a class change is rare, and wakes them (a scan of the
/// cache).
pub fn pvs_of_class(
    class: &StorageClass,
    pvs: &Store<PersistentVolume>,
) -> Vec<ObjectRef<PersistentVolume>> {
    let name = class.name_any();
    pvs.state()
        .iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
                == Some(name.as_str())
        })
        .map(|pv| ObjectRef::from_obj(pv.as_ref()))
        .collect()
}

/// The PV a scrub pod names in its annotation (PV names may be longer than a label value).
pub fn pv_of_scrub_pod(pod: &Pod) -> Option<ObjectRef<PersistentVolume>> {
    pod.annotations()
        .get(SCRUB_PV_LABEL)
        .map(|pv| ObjectRef::<PersistentVolume>::new(pv))
}
