//! Cluster chores of the bench: PVs and sets in bulk, the latest state of watched objects, and
//! tearing a namespace down so the next phase starts on a quiet control plane.

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
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

/// Sets `spec.replicas` of every given set (its namespace's API and name), [`IN_FLIGHT`]
/// requests in flight at once, in the given order. Returns how long issuing them took.
pub async fn scale_all(targets: &[(Api<StatefulSet>, String)], replicas: i32) -> Duration {
    let started = Instant::now();
    let patch = json!({"spec": {"replicas": replicas}});
    let results: Vec<Result<StatefulSet, kube::Error>> = futures::stream::iter(targets)
        .map(|(api, name)| {
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

/// Objects of `K` listed per page of [`PAGE`] (a namespace of thousands is not one response).
pub const PAGE: u32 = 500;

/// Every object of `api`, listed page by page; an error ends the list (the caller retries).
pub async fn list_paged<K>(api: &Api<K>) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// The latest state of every object one or more recorders saw, by namespace and name; pulls only
/// what is new.
pub struct Latest<K> {
    marks: Vec<usize>,
    pub objects: HashMap<(String, String), Seen<K>>,
}

impl<K> Latest<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    pub fn new() -> Latest<K> {
        Latest {
            marks: Vec::new(),
            objects: HashMap::new(),
        }
    }

    pub fn refresh(&mut self, recorder: &Recorder<K>) -> &Self {
        self.refresh_all(std::slice::from_ref(recorder))
    }

    /// Pulls what is new from every recorder (always given in the same order): the recorders of
    /// different namespaces never see the same object.
    pub fn refresh_all(&mut self, recorders: &[Recorder<K>]) -> &Self {
        self.marks.resize(recorders.len(), 0);
        for (recorder, mark) in recorders.iter().zip(self.marks.iter_mut()) {
            let new = recorder.since(*mark);
            *mark += new.len();
            for s in new {
                let key = (s.object.namespace().unwrap_or_default(), s.name.clone());
                if s.gone() {
                    self.objects.remove(&key);
                } else {
                    self.objects.insert(key, s);
                }
            }
        }
        self
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Seen<K>> {
        self.objects.get(&(namespace.to_string(), name.to_string()))
    }
}

/// One recorder per namespace of a phase, read as one watch.
pub struct Watches<K> {
    pub recorders: Vec<Recorder<K>>,
}

impl<K> Watches<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    /// Starts a watch of `K` in each namespace, at most [`IN_FLIGHT`] / 4 listing at once, and
    /// returns once each has listed.
    pub async fn start(client: &kube::Client, namespaces: &[String]) -> Watches<K> {
        let recorders = futures::stream::iter(namespaces)
            .map(|ns| {
                Recorder::start(
                    Api::namespaced(client.clone(), ns),
                    watcher::Config::default(),
                )
            })
            .buffered(IN_FLIGHT / 4)
            .collect()
            .await;
        Watches { recorders }
    }

    /// Where each recorder stands now (for [`Watches::since`]).
    pub fn mark(&self) -> Vec<usize> {
        self.recorders.iter().map(Recorder::mark).collect()
    }

    /// Every change after `marks`, in the order of arrival (a watch's own changes keep their
    /// order: the sort is stable and a watch's arrival times never decrease).
    pub fn since(&self, marks: &[usize]) -> Vec<Seen<K>> {
        let mut all: Vec<Seen<K>> = self
            .recorders
            .iter()
            .zip(marks)
            .flat_map(|(r, m)| r.since(*m))
            .collect();
        all.sort_by_key(|s| s.at);
        all
    }
}

/// A pod that runs and is not being deleted.
pub fn running(s: &Seen<Pod>) -> bool {
    !s.deleting && phase(&s.object) == "Running"
}

pub fn bound(s: &Seen<PersistentVolumeClaim>) -> bool {
    !s.deleting && s.object.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound")
}

/// How many of the sets of `api` carry the controller's finalizer now (0 if the list fails).
pub async fn with_finalizer(api: &Api<StatefulSet>) -> usize {
    list_paged(api)
        .await
        .map(|items| {
            items
                .iter()
                .filter(|s| s.finalizers().iter().any(|f| f == FINALIZER))
                .count()
        })
        .unwrap_or(0)
}

/// Removes every finalizer from the sets of `api` (the controller is stopped by then).
pub async fn strip_finalizers(api: &Api<StatefulSet>) {
    let names: Vec<String> = list_paged(api)
        .await
        .map(|items| items.iter().map(|s| s.name_any()).collect())
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
pub async fn other_namespaces(client: &kube::Client, own: &[String]) -> Vec<String> {
    const SYSTEM: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
    let api: Api<Namespace> = Api::all(client.clone());
    api.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|n| n.name_any())
                .filter(|n| !own.contains(n) && !SYSTEM.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default()
}
