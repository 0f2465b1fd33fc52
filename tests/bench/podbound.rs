//! The pod-bound scenario (`--pod-bound-claims`): `pods` pods in `namespaces` namespaces, of which
//! `claims` are bound pods, each mounting its own claim annotated
//! `statefulsets.kubernetes.io/bound-to-pod: <pod>`; the rest are background pods of the idle
//! scenario's shapes, in the same namespaces (what a pass that reads a namespace pays for).
//!
//! The controller (default flags plus `--pod-bound-claims`) starts on the background pods. Then two
//! rounds, each a measured window:
//! - `bind`: every claim and its pod are created (claim, then pod, `IN_FLIGHT` pairs at a time);
//!   per claim, pod first seen → the claim first seen with that pod's UID among its owners. Done
//!   when every claim has its owner;
//! - `delete`: every bound pod is deleted; per claim, pod gone → claim gone (the garbage
//!   collector's work once the owner is attached; the controller should send nothing). Done when
//!   every claim is gone.
//!
//! Per round: the controller's requests by verb and resource, its passes
//! (`scaledown_reconciles_total`: nothing else changes meanwhile, so these are the pod-bound
//! passes), requests per pass and per claim, CPU; RSS over the whole run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::idle;
use crate::probe::{self, round3};
use crate::support::recorder::{Recorder, Seen};
use crate::support::{Cluster, TestNamespace, from_json};
use crate::timeline::summary;
use crate::under_test::{Snapshot, UnderTest};
use crate::world::{self, IN_FLIGHT, Latest, Rng, running};

#[derive(Clone, Debug)]
pub struct Params {
    pub claims: usize,
    pub pods: usize,
    pub namespaces: usize,
    pub timeout: Duration,
}

const BOUND_TO_POD: &str = "statefulsets.kubernetes.io/bound-to-pod";
/// The label of the bench's bound pods and their claims (the recorders watch only these).
const BOUND_LABEL: &str = "bench.scaledown.io/pod-bound";
/// How long a round's window stays open after its last expected change (trailing requests).
const TAIL: Duration = Duration::from_secs(5);

pub async fn run(p: &Params, seed: u64, controller_args: &[String]) -> Value {
    let cluster = Cluster::connect().await;
    println!(
        "bench: podbound: {} bound claims and {} pods in all in {} namespaces",
        p.claims, p.pods, p.namespaces
    );
    let t0 = Instant::now();
    let mut namespaces = Vec::new();
    for i in 0..p.namespaces.max(1) {
        namespaces.push(cluster.namespace(&format!("bench-podbound-{i}")).await);
    }
    let background = p.pods.saturating_sub(p.claims);
    let populated = populate(&cluster, &namespaces, background, seed, p.timeout).await;
    let setup_s = t0.elapsed().as_secs_f64();
    println!("bench:   {background} background pods running in {setup_s:.1} s (ok: {populated})");

    let mut args = vec!["--pod-bound-claims".to_string()];
    args.extend(controller_args.iter().cloned());
    let controller = UnderTest::start(&cluster, "bench-podbound", &args).await;
    let selected = watcher::Config::default().labels(BOUND_LABEL);
    let pods: Recorder<Pod> =
        Recorder::start(Api::all(cluster.client.clone()), selected.clone()).await;
    let claims: Recorder<PersistentVolumeClaim> =
        Recorder::start(Api::all(cluster.client.clone()), selected).await;
    tokio::time::sleep(TAIL).await;

    let start = counters(&controller).await;
    let pairs: Vec<(String, String)> = (0..p.claims)
        .map(|j| {
            let ns = &namespaces[j % namespaces.len()].name;
            (ns.clone(), format!("pb-{j:05}"))
        })
        .collect();
    let bind = bind_round(
        &cluster,
        &pairs,
        &pods,
        &claims,
        &controller,
        &start,
        p.timeout,
    )
    .await;
    let between = counters(&controller).await;
    let delete = delete_round(
        &cluster,
        &pairs,
        &pods,
        &claims,
        &controller,
        &between,
        p.timeout,
    )
    .await;
    let end = counters(&controller).await;
    let controller_json = controller.json(&start.snapshot, &end.snapshot);
    println!(
        "bench:   bind: {} requests besides watches, {} passes; delete: {} requests; RSS {:.1} MiB",
        bind["requests"]["non_watch_total"],
        bind["passes"],
        delete["requests"]["non_watch_total"],
        end.snapshot.rss_mib
    );

    let teardown_started = Instant::now();
    controller.stop().await;
    drop((pods, claims));
    let gone = world::delete_namespaces(namespaces, Duration::from_secs(300)).await;
    json!({
        "mode": "controller",
        "setup_ok": populated,
        "wall_s": {"setup": round3(setup_s), "teardown": gone.map(|_| round3(teardown_started.elapsed().as_secs_f64()))},
        "rounds": [bind, delete],
        "controller": controller_json,
    })
}

/// Creates the background pods, spread over `namespaces`, and waits until they run.
async fn populate(
    cluster: &Cluster,
    namespaces: &[TestNamespace],
    n: usize,
    seed: u64,
    timeout: Duration,
) -> bool {
    let mut rng = Rng::new(seed);
    idle::create_background_pods(cluster, namespaces, n, &mut rng).await;
    let recorder: Recorder<Pod> = Recorder::start(
        Api::all(cluster.client.clone()),
        watcher::Config::default().labels(idle::BACKGROUND),
    )
    .await;
    let mut latest = Latest::new();
    let deadline = Instant::now() + timeout;
    loop {
        let ready = latest
            .refresh(&recorder)
            .objects
            .values()
            .filter(|s| running(s))
            .count();
        if ready >= n {
            return true;
        }
        if Instant::now() >= deadline {
            println!("bench:   TIMEOUT: {ready} of {n} background pods running");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The controller's snapshot and its pass count at one moment.
struct Counters {
    snapshot: Snapshot,
    passes: f64,
}

async fn counters(controller: &UnderTest) -> Counters {
    let passes = match probe::http_get(controller.metrics_port, "/metrics").await {
        // Pod-bound's passes: the counter is labelled by controller.
        Some((200, body)) => probe::samples(&body)
            .get(r#"scaledown_reconciles_total{controller="pod-bound"}"#)
            .copied()
            .unwrap_or(f64::NAN),
        _ => f64::NAN,
    };
    Counters {
        snapshot: controller.snapshot().await,
        passes,
    }
}

/// A claim annotated to be bound to pod `name`, of a class nothing provisions (it stays Pending;
/// the controller does not read its phase).
fn claim(ns: &str, name: &str) -> PersistentVolumeClaim {
    from_json(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {BOUND_LABEL: "true"},
                     "annotations": {BOUND_TO_POD: name}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "bench-pod-bound-none",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
}

/// Pod `name` mounting claim `name`, bound straight to a fake node.
fn pod(ns: &str, name: &str, i: usize) -> Pod {
    from_json(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {BOUND_LABEL: "true"}},
        "spec": {"nodeName": format!("kwok-node-{}", i % 3), "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]}
    }))
}

/// Creates every (namespace, name) claim and then its pod, and waits until every claim has its
/// pod among its owners.
async fn bind_round(
    cluster: &Cluster,
    pairs: &[(String, String)],
    pods: &Recorder<Pod>,
    claims: &Recorder<PersistentVolumeClaim>,
    controller: &UnderTest,
    before: &Counters,
    timeout: Duration,
) -> Value {
    let started = Instant::now();
    let client = cluster.client.clone();
    let failed = futures::stream::iter(pairs.iter().enumerate())
        .map(|(i, (ns, name))| {
            let (claims, pods): (Api<PersistentVolumeClaim>, Api<Pod>) = (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            );
            async move {
                let pp = PostParams::default();
                claims.create(&pp, &claim(ns, name)).await.is_err()
                    || pods.create(&pp, &pod(ns, name, i)).await.is_err()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let created_ms = started.elapsed().as_secs_f64() * 1000.0;
    let complete = failed == 0
        && wait_until(started + timeout, || {
            owners_attached(pods, claims) >= pairs.len()
        })
        .await;
    tokio::time::sleep(TAIL).await;
    let after = counters(controller).await;
    let latencies = pair_latencies(pairs, pods, claims, |pod, claim_states| {
        let uid = &pod.first()?.uid;
        let attached = claim_states
            .iter()
            .find(|c| c.object.owner_references().iter().any(|o| &o.uid == uid))?;
        Some(ms_between(pod.first()?.at, attached.at))
    });
    round_json(
        "bind",
        complete,
        failed,
        created_ms,
        &latencies,
        "pod_created_to_owner_added",
        before,
        &after,
        pairs.len(),
    )
}

/// Deletes every bound pod and waits until every claim is gone.
async fn delete_round(
    cluster: &Cluster,
    pairs: &[(String, String)],
    pods: &Recorder<Pod>,
    claims: &Recorder<PersistentVolumeClaim>,
    controller: &UnderTest,
    before: &Counters,
    timeout: Duration,
) -> Value {
    let started = Instant::now();
    let mark = claims.mark();
    let client = cluster.client.clone();
    let failed = futures::stream::iter(pairs)
        .map(|(ns, name)| {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            async move { api.delete(name, &DeleteParams::default()).await.is_err() }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    let deleted_ms = started.elapsed().as_secs_f64() * 1000.0;
    let complete = failed == 0
        && wait_until(started + timeout, || {
            claims.since(mark).iter().filter(|c| c.gone()).count() >= pairs.len()
        })
        .await;
    tokio::time::sleep(TAIL).await;
    let after = counters(controller).await;
    let latencies = pair_latencies(pairs, pods, claims, |pod, claim_states| {
        let gone = pod.iter().find(|s| s.gone())?;
        let claim_gone = claim_states.iter().find(|c| c.gone())?;
        Some(ms_between(gone.at, claim_gone.at))
    });
    round_json(
        "delete",
        complete,
        failed,
        deleted_ms,
        &latencies,
        "pod_gone_to_claim_gone",
        before,
        &after,
        pairs.len(),
    )
}

/// Polls `done` every 250 ms until it holds (true) or `deadline` passes (false).
async fn wait_until(deadline: Instant, done: impl Fn() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How many bound claims have, in their latest state, their pod's UID among their owners.
fn owners_attached(pods: &Recorder<Pod>, claims: &Recorder<PersistentVolumeClaim>) -> usize {
    let (mut lp, mut lc) = (Latest::new(), Latest::new());
    lp.refresh(pods);
    lc.refresh(claims);
    lc.objects
        .values()
        .filter(|c| {
            let ns = c.object.namespace().unwrap_or_default();
            lp.get(&ns, &c.name)
                .is_some_and(|p| c.object.owner_references().iter().any(|o| o.uid == p.uid))
        })
        .count()
}

/// Per pair, `latency(states of its pod, states of its claim)`, the states in the order seen.
fn pair_latencies(
    pairs: &[(String, String)],
    pods: &Recorder<Pod>,
    claims: &Recorder<PersistentVolumeClaim>,
    latency: impl Fn(&[Seen<Pod>], &[Seen<PersistentVolumeClaim>]) -> Option<f64>,
) -> Vec<f64> {
    let (pod_states, claim_states) = (by_pair(pods.seen()), by_pair(claims.seen()));
    pairs
        .iter()
        .filter_map(|pair| latency(pod_states.get(pair)?, claim_states.get(pair)?))
        .collect()
}

/// Recorded states by (namespace, name), in the order seen.
fn by_pair<K: kube::Resource>(seen: Vec<Seen<K>>) -> BTreeMap<(String, String), Vec<Seen<K>>> {
    let mut map: BTreeMap<(String, String), Vec<Seen<K>>> = BTreeMap::new();
    for s in seen {
        let ns = s.object.meta().namespace.clone().unwrap_or_default();
        map.entry((ns, s.name.clone())).or_default().push(s);
    }
    map
}

fn ms_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1000.0
    } else {
        -(from.duration_since(to).as_secs_f64() * 1000.0)
    }
}

#[allow(clippy::too_many_arguments)]
fn round_json(
    name: &str,
    complete: bool,
    failed: usize,
    issued_ms: f64,
    latencies: &[f64],
    latency_name: &str,
    before: &Counters,
    after: &Counters,
    claims: usize,
) -> Value {
    let requests = probe::delta(&after.snapshot.requests, &before.snapshot.requests);
    let requests = probe::requests_json(&requests);
    let non_watch = requests["non_watch_total"].as_f64().unwrap_or(0.0);
    let passes = after.passes - before.passes;
    let per = |n: f64| (n > 0.0).then(|| round3(non_watch / n));
    json!({
        "name": name,
        "complete": complete,
        "claims": claims,
        "failed_requests": failed,
        "issued_ms": round3(issued_ms),
        "window_s": round3(after.snapshot.at_s - before.snapshot.at_s),
        "latency_ms": {latency_name: summary(latencies)},
        "requests": requests,
        "passes": passes,
        "requests_per_pass": per(passes),
        "requests_per_claim": per(claims as f64),
        "cpu_s": round3(after.snapshot.cpu_s - before.snapshot.cpu_s),
        "rss_mib_after": round3(after.snapshot.rss_mib),
    })
}
