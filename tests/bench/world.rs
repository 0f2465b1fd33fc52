//! Cluster chores of the bench: PVs and sets in bulk, the latest state of watched objects, and
//! tearing a namespace down so the next phase starts on a quiet control plane.

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::support::fixtures::FINALIZER;
use crate::support::recorder::{Recorder, Seen, phase};
use crate::support::{Reclaim, StaticPvs, TestNamespace, create_static_pvs_from};

/// Requests the bench keeps in flight at once when it creates or patches in bulk.
pub const IN_FLIGHT: usize = 32;

/// The seed alone decides the order of scale-downs and the shape of background pods.
pub use crate::support::rng::Rng;

/// `n` static PVs (Retain) in a class of `ns`, created [`IN_FLIGHT`] at a time.
pub async fn static_pvs(ns: &TestNamespace, n: usize) -> StaticPvs {
    let pvs = ns.create_static_pvs("pv", 0, Reclaim::Retain).await;
    let chunk = 25;
    let client = ns.client();
    let names: Vec<Vec<String>> = futures::stream::iter((0..n).step_by(chunk))
        .map(|first| {
            let (client, class) = (client.clone(), pvs.class.clone());
            async move {
                create_static_pvs_from(
                    &client,
                    &class,
                    first,
                    chunk.min(n - first),
                    Reclaim::Retain,
                )
                .await
            }
        })
        .buffer_unordered(IN_FLIGHT / 4)
        .collect()
        .await;
    StaticPvs {
        class: pvs.class,
        names: names.into_iter().flatten().collect(),
    }
}

/// Creates `objects` in their namespaces, [`IN_FLIGHT`] at a time; panics on the first failure.
pub async fn create_all<K>(api_of: impl Fn(&K) -> Api<K>, objects: Vec<K>)
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + Debug,
{
    let results: Vec<Result<K, kube::Error>> = futures::stream::iter(objects)
        .map(|o| {
            let api = api_of(&o);
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for r in results {
        r.unwrap_or_else(|e| panic!("bench: create failed: {e}"));
    }
}

/// Sets `spec.replicas` of every named set of `api`, all requests in flight at once (up to
/// [`IN_FLIGHT`]), in the given order. Returns how long issuing them took.
pub async fn scale_all(api: &Api<StatefulSet>, names: &[String], replicas: i32) -> Duration {
    let started = Instant::now();
    let patch = json!({"spec": {"replicas": replicas}});
    let results: Vec<Result<StatefulSet, kube::Error>> = futures::stream::iter(names)
        .map(|name| {
            let patch = &patch;
            async move {
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            }
        })
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    for r in results {
        r.unwrap_or_else(|e| panic!("bench: scale failed: {e}"));
    }
    started.elapsed()
}

/// The latest state of every object a recorder saw, by namespace and name; pulls only what is
/// new.
pub struct Latest<K> {
    mark: usize,
    pub objects: HashMap<(String, String), Seen<K>>,
}

impl<K> Latest<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    pub fn new() -> Latest<K> {
        Latest {
            mark: 0,
            objects: HashMap::new(),
        }
    }

    pub fn refresh(&mut self, recorder: &Recorder<K>) -> &Self {
        let new = recorder.since(self.mark);
        self.mark += new.len();
        for s in new {
            let key = (s.object.namespace().unwrap_or_default(), s.name.clone());
            if s.gone() {
                self.objects.remove(&key);
            } else {
                self.objects.insert(key, s);
            }
        }
        self
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Seen<K>> {
        self.objects.get(&(namespace.to_string(), name.to_string()))
    }
}

/// A pod that runs and is not being deleted.
pub fn running(s: &Seen<Pod>) -> bool {
    !s.deleting && phase(&s.object) == "Running"
}

pub fn bound(s: &Seen<PersistentVolumeClaim>) -> bool {
    !s.deleting && s.object.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound")
}

/// How many of the named sets carry the controller's finalizer now.
pub async fn with_finalizer(api: &Api<StatefulSet>) -> usize {
    api.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|s| s.finalizers().iter().any(|f| f == FINALIZER))
                .count()
        })
        .unwrap_or(0)
}

/// Removes every finalizer from the sets of `api` (the controller is stopped by then).
pub async fn strip_finalizers(api: &Api<StatefulSet>) {
    let names: Vec<String> = api
        .list(&Default::default())
        .await
        .map(|l| l.items.iter().map(|s| s.name_any()).collect())
        .unwrap_or_default();
    let patch = json!({"metadata": {"finalizers": null}});
    futures::stream::iter(names)
        .map(|name| {
            let patch = &patch;
            async move {
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await;
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// Deletes the namespaces (dropping them deletes their PVs too) and waits until they are gone,
/// at most `timeout`; returns how long that took, or None on timeout.
pub async fn delete_namespaces(
    namespaces: Vec<TestNamespace>,
    timeout: Duration,
) -> Option<Duration> {
    let Some(client) = namespaces.first().map(TestNamespace::client) else {
        return Some(Duration::ZERO);
    };
    let names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
    let started = Instant::now();
    drop(namespaces);
    let api: Api<Namespace> = Api::all(client);
    while started.elapsed() < timeout {
        let mut left = 0;
        for name in &names {
            if !matches!(api.get_opt(name).await, Ok(None)) {
                left += 1;
            }
        }
        if left == 0 {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

/// Namespaces besides the system ones and `own`: other runs on the same cluster (a fresh cluster
/// has none).
pub async fn other_namespaces(client: &kube::Client, own: &str) -> Vec<String> {
    const SYSTEM: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
    let api: Api<Namespace> = Api::all(client.clone());
    api.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|n| n.name_any())
                .filter(|n| n != own && !SYSTEM.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default()
}
