//! The idle scenario: `pods` background pods spread over `pod_namespaces` namespaces (bound
//! straight to the fake nodes, shapes drawn from the seed) plus `sets` annotated StatefulSets of
//! one pod each; then the controller starts. Measured: start to ready, start until every set
//! carries the finalizer, RSS and CPU, and the requests it sends while nothing changes.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::probe::{self, round3};
use crate::support::fixtures::SetSpec;
use crate::support::recorder::Recorder;
use crate::support::{Cluster, TestNamespace, from_json};
use crate::under_test::UnderTest;
use crate::world::{self, Latest, Rng, bound, running};

#[derive(Clone, Debug)]
pub struct Params {
    pub pods: usize,
    pub pod_namespaces: usize,
    pub sets: usize,
    pub set_namespaces: usize,
    pub idle_seconds: u64,
    pub timeout: Duration,
}

pub const BACKGROUND: &str = "bench.scaledown.io/background";

pub async fn run(p: &Params, seed: u64, controller_args: &[String]) -> Value {
    let cluster = Cluster::connect().await;
    println!(
        "bench: idle: {} background pods in {} namespaces, {} annotated sets in {} namespaces",
        p.pods, p.pod_namespaces, p.sets, p.set_namespaces
    );
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let (bg, sets) = populate(&cluster, p, &mut rng).await;
    let populated = wait_populated(&cluster, p).await;
    let setup_s = t0.elapsed().as_secs_f64();
    println!("bench:   populated in {setup_s:.1} s (ok: {populated})");

    let (cp_before, cpu_before, load_before) = (
        probe::component_metrics().await,
        probe::component_cpu(),
        probe::loadavg(),
    );
    let controller = UnderTest::start(&cluster, "bench-idle", controller_args).await;
    let finalized_after = wait_finalized(&sets, p.sets, controller.started, p.timeout).await;
    println!(
        "bench:   every set finalized after {}",
        finalized_after.map_or("(timeout)".into(), |d| format!("{} ms", d.as_millis()))
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = controller.snapshot().await;
    tokio::time::sleep(Duration::from_secs(p.idle_seconds)).await;
    let after = controller.snapshot().await;
    let cpu = probe::delta(&probe::component_cpu(), &cpu_before);
    let control_plane =
        probe::control_plane_json(&probe::component_metrics().await, &cp_before, &cpu);
    let controller_json = controller.json(&before, &after);
    let load_after = probe::loadavg();
    println!(
        "bench:   idle {} s: {} requests besides watches, RSS {:.1} MiB",
        p.idle_seconds, controller_json["requests_in_window"]["non_watch_total"], after.rss_mib
    );

    let teardown_started = Instant::now();
    controller.stop().await;
    for ns in &sets {
        world::strip_finalizers(&ns.api()).await;
    }
    let gone = world::delete_namespaces(
        bg.into_iter().chain(sets).collect(),
        Duration::from_secs(300),
    )
    .await;
    json!({
        "mode": "controller",
        "setup_ok": populated,
        "wall_s": {"setup": round3(setup_s), "teardown": gone.map(|_| round3(teardown_started.elapsed().as_secs_f64()))},
        "loadavg": {"before": load_before, "after": load_after},
        "startup_to_all_finalized_ms": finalized_after.map(|d| d.as_millis() as u64),
        "controller": controller_json,
        "control_plane": control_plane,
    })
}

/// Creates `n` background pods ([`background_pod`]), spread over `namespaces`.
pub async fn create_background_pods(
    cluster: &Cluster,
    namespaces: &[TestNamespace],
    n: usize,
    rng: &mut Rng,
) {
    let pods: Vec<Pod> = (0..n)
        .map(|i| background_pod(i, &namespaces[i % namespaces.len().max(1)].name, rng))
        .collect();
    let client = cluster.client.clone();
    world::create_all(
        |pod: &Pod| {
            Api::namespaced(
                client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            )
        },
        pods,
    )
    .await;
}

/// Creates the namespaces, the background pods and the sets (with their PVs).
async fn populate(
    cluster: &Cluster,
    p: &Params,
    rng: &mut Rng,
) -> (Vec<TestNamespace>, Vec<TestNamespace>) {
    let mut bg = Vec::new();
    for i in 0..p.pod_namespaces {
        bg.push(cluster.namespace(&format!("bench-bg-{i}")).await);
    }
    create_background_pods(cluster, &bg, p.pods, rng).await;
    let mut sets = Vec::new();
    let per_ns = p.sets.div_ceil(p.set_namespaces.max(1));
    for i in 0..p.set_namespaces {
        let ns = cluster.namespace(&format!("bench-idle-sets-{i}")).await;
        let n = per_ns.min(p.sets.saturating_sub(i * per_ns));
        let pvs = world::static_pvs(&ns, n).await;
        let objects: Vec<StatefulSet> = (0..n)
            .map(|j| SetSpec::new(&format!("s-{j:04}"), 1, &pvs.class).build())
            .collect();
        let api: Api<StatefulSet> = ns.api();
        world::create_all(|_| api.clone(), objects).await;
        sets.push(ns);
    }
    (bg, sets)
}

/// A background pod bound to a fake node, of a seeded shape (labels, annotations, env,
/// containers): something like the pods of a real cluster, which the controller must watch.
pub fn background_pod(i: usize, namespace: &str, rng: &mut Rng) -> Pod {
    let labels: serde_json::Map<String, Value> = (0..2 + rng.index(5))
        .map(|k| {
            (
                format!("label-{k}"),
                json!(format!("value-{}", rng.index(1000))),
            )
        })
        .chain([
            (BACKGROUND.to_string(), json!("true")),
            ("app".into(), json!(format!("app-{}", i % 97))),
        ])
        .collect();
    let annotations: serde_json::Map<String, Value> = (0..rng.index(4))
        .map(|k| {
            (
                format!("example.com/note-{k}"),
                json!("x".repeat(32 + rng.index(224))),
            )
        })
        .collect();
    let containers: Vec<Value> = (0..1 + rng.index(2))
        .map(|c| {
            let env: Vec<Value> = (0..rng.index(9))
                .map(|e| json!({"name": format!("VAR_{e}"), "value": format!("{}", rng.next_u64())}))
                .collect();
            json!({
                "name": format!("c{c}"), "image": format!("registry.example.com/app:{}", rng.index(50)),
                "env": env, "ports": [{"containerPort": 8080 + c}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            })
        })
        .collect();
    from_json(json!({
        "metadata": {"name": format!("bg-{i:05}"), "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {"nodeName": format!("kwok-node-{}", i % 3), "containers": containers, "terminationGracePeriodSeconds": 0},
    }))
}

/// Waits until every background pod and set pod runs and every claim is bound; the watches end
/// before the controller starts.
async fn wait_populated(cluster: &Cluster, p: &Params) -> bool {
    let pods: Recorder<Pod> =
        Recorder::start(Api::all(cluster.client.clone()), watcher::Config::default()).await;
    let claims: Recorder<PersistentVolumeClaim> =
        Recorder::start(Api::all(cluster.client.clone()), watcher::Config::default()).await;
    let (mut lp, mut lc) = (Latest::new(), Latest::new());
    let deadline = Instant::now() + p.timeout;
    let mut last_report = Instant::now();
    loop {
        lp.refresh(&pods);
        lc.refresh(&claims);
        let running_pods = lp.objects.values().filter(|s| running(s)).count();
        let bound_claims = lc.objects.values().filter(|s| bound(s)).count();
        if running_pods >= p.pods + p.sets && bound_claims >= p.sets {
            return true;
        }
        if Instant::now() >= deadline {
            println!("bench:   TIMEOUT: {running_pods} pods running, {bound_claims} claims bound");
            return false;
        }
        if last_report.elapsed() >= Duration::from_secs(30) {
            println!("bench:   ... {running_pods} pods running, {bound_claims} claims bound");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The time from `started` until all `n` sets carry the controller's finalizer.
async fn wait_finalized(
    sets: &[TestNamespace],
    n: usize,
    started: Instant,
    timeout: Duration,
) -> Option<Duration> {
    let apis: Vec<Api<StatefulSet>> = sets.iter().map(TestNamespace::api).collect();
    while started.elapsed() < timeout {
        let mut done = 0;
        for api in &apis {
            done += world::with_finalizer(api).await;
        }
        if done >= n {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}
