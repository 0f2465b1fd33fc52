//! Inherited scheduling on the local control plane: a StatefulSet on a dedicated node pool (a
//! KWOK node of the test's own, with a label and a `NoSchedule` taint) is scaled down, and the
//! real scheduler places its cleanup pod. With inheritance (the annotation, or the flag) the pod
//! lands on the pool; without it, it lands on another node. Each test creates its pool node and
//! deletes it at the end, also when it fails.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::fixtures::*;
use support::recorder::{Recorder, Seen};
use support::{Cluster, KWOK_NODE_ANNOTATION, from_json, unique_name, wait_for};

const INHERIT: &str = "statefulsets.kubernetes.io/scaledown-pod-inherit";
/// Label and taint key of the test pools; the value is the pool node's name.
const POOL_KEY: &str = "scaledown.e2e/pool";

/// A KWOK node of one test, labelled and tainted `scaledown.e2e/pool=<name>`; deleted when dropped.
struct Pool {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl Pool {
    async fn create(cluster: &Cluster, test: &str) -> Pool {
        let name = unique_name(&format!("pool-{test}"));
        let node: Node = from_json(json!({
            "metadata": {
                "name": name,
                "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", POOL_KEY: name}
            },
            "spec": {"taints": [{"key": POOL_KEY, "value": name, "effect": "NoSchedule"}]}
        }));
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("e2e: create node {name}: {e}"));
        let pool = Pool {
            name: name.clone(),
            kubeconfig: cluster.kubeconfig.clone(),
        };
        wait_for(
            &format!("node {name} Ready, without the not-ready taint"),
            Duration::from_secs(60),
            || async {
                nodes
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| ready(&n))
            },
        )
        .await;
        pool
    }

    fn toleration(&self) -> Value {
        json!({"key": POOL_KEY, "operator": "Equal", "value": self.name, "effect": "NoSchedule"})
    }
}

fn ready(node: &Node) -> bool {
    let conditions = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten());
    let taints = node.spec.iter().flat_map(|s| s.taints.iter().flatten());
    conditions
        .into_iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        && taints
            .into_iter()
            .all(|t| t.key != "node.kubernetes.io/not-ready")
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Synchronous: Drop cannot await, and the runtime may be going away on a failure.
        let _ = std::process::Command::new(support::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "20s", "delete", "node", &self.name])
            .args(["--wait=false", "--ignore-not-found"])
            .output();
    }
}

/// A Parallel set of two on `pool`: its pods tolerate the pool's taint, select it (nodeSelector
/// and required node affinity), prefer to keep apart (pod anti-affinity, not inherited), and carry
/// a pod security context and an image pull secret. `inherit`: its inherit annotation.
fn pool_set(env: &Env, name: &'static str, pool: &Pool, inherit: Option<&str>) -> Value {
    let node_affinity = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_KEY, "operator": "In", "values": [pool.name]}]}]}});
    let template = json!({
        "metadata": {"labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "tolerations": [pool.toleration()],
            "nodeSelector": {POOL_KEY: pool.name},
            "affinity": {
                "nodeAffinity": node_affinity,
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10,
                    "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": name}},
                                        "topologyKey": "kubernetes.io/hostname"}}]}
            },
            "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
            "imagePullSecrets": [{"name": "pool-registry"}]
        }
    });
    let mut spec = SetSpec::new(name, 2, &env.class);
    spec.parallel = true;
    spec.extra_spec = json!({"template": template});
    let mut set = serde_json::to_value(spec.build()).expect("set as JSON");
    if let Some(value) = inherit {
        set["metadata"]["annotations"][INHERIT] = json!(value);
    }
    set
}

async fn create(env: &Env, set: &Value) {
    env.sets()
        .create(&PostParams::default(), &from_json(set.clone()))
        .await
        .expect("create statefulset");
}

async fn create_running(env: &Env, sets: &[Value]) {
    for set in sets {
        create(env, set).await;
    }
    for set in sets {
        let name = set["metadata"]["name"].as_str().expect("name");
        for n in 0..2 {
            support::wait_for_pod_phase(&env.pods(), &format!("{name}-{n}"), "Running", LONG).await;
        }
        env.wait_finalizer(name, true).await;
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The first recorded state of cleanup pod `name` that the scheduler bound to a node.
async fn bound_cleanup_pod(pods: &Recorder<Pod>, name: &str) -> Seen<Pod> {
    pods.wait_for(&format!("cleanup pod {name} bound to a node"), LONG, |s| {
        s.name == name && is_cleanup(&s.object) && node_of(&s.object).is_some()
    })
    .await
}

/// Every node a cleanup pod of `name` was ever bound to, over the whole recording.
fn nodes_of_cleanup_pods(pods: &Recorder<Pod>, name: &str) -> Vec<String> {
    let mut nodes: Vec<String> = pods
        .of(name)
        .iter()
        .filter(|s| is_cleanup(&s.object))
        .filter_map(|s| node_of(&s.object).map(String::from))
        .collect();
    nodes.dedup();
    nodes
}

fn spec_json(pod: &Pod) -> Value {
    serde_json::to_value(pod.spec.as_ref().expect("spec")).expect("spec as JSON")
}

/// Asserts that the cleanup pod carries the set's scheduling fields, but not its pod anti-affinity.
fn assert_inherited(pod: &Pod, pool: &Pool) {
    let spec = spec_json(pod);
    assert_eq!(spec["nodeSelector"], json!({POOL_KEY: pool.name}), "{spec}");
    assert!(
        spec["tolerations"]
            .as_array()
            .is_some_and(|t| t.contains(&pool.toleration())),
        "{spec}"
    );
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!([pool.name]),
        "{spec}"
    );
    assert!(
        spec["affinity"].get("podAntiAffinity").is_none(),
        "pod anti-affinity is not inherited: {spec}"
    );
    assert_eq!(
        spec["securityContext"],
        json!({"runAsUser": 1000, "fsGroup": 2000})
    );
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "pool-registry"}]));
}

/// Asserts that the cleanup pod has none of the set's scheduling fields.
fn assert_not_inherited(pod: &Pod, pool: &Pool) {
    let spec = spec_json(pod);
    let text = spec.to_string();
    assert!(!text.contains(&pool.name), "nothing of the pool: {spec}");
    for field in ["nodeSelector", "affinity", "imagePullSecrets"] {
        assert!(spec.get(field).is_none(), "no {field}: {spec}");
    }
}

/// Scales `sets` from 2 to 1 at once; returns when the patches were sent.
async fn scale_down(env: &Env, sets: &[&str]) -> Instant {
    let at = Instant::now();
    for set in sets {
        env.scale(set, 1).await;
    }
    at
}

/// Without the flag, a set annotated `scheduling` gets its cleanup pod on its pool; an unannotated
/// set with the same pods gets its cleanup pod on another node.
#[tokio::test(flavor = "multi_thread")]
async fn the_annotation_puts_the_cleanup_pod_on_the_sets_pool() {
    let cluster = Cluster::connect().await;
    let pool = Pool::create(&cluster, "annotation").await;
    let env = Env::new("inherit-annotation", 4, &[]).await;
    let sets = [
        pool_set(&env, "pooled", &pool, Some("scheduling")),
        pool_set(&env, "plain", &pool, None),
    ];
    create_running(&env, &sets).await;
    for name in ["pooled-0", "pooled-1", "plain-0", "plain-1"] {
        let pod = env.pods().get(name).await.expect("stateful pod");
        assert_eq!(
            node_of(&pod),
            Some(pool.name.as_str()),
            "{name} runs on the pool"
        );
    }
    let pods = env.record_pods().await;

    let scaled = scale_down(&env, &["pooled", "plain"]).await;
    let pooled = bound_cleanup_pod(&pods, "pooled-1").await;
    let on_pool = pooled.at.duration_since(scaled);
    assert_eq!(node_of(&pooled.object), Some(pool.name.as_str()));
    assert_inherited(&pooled.object, &pool);
    let plain = bound_cleanup_pod(&pods, "plain-1").await;
    let elsewhere = plain.at.duration_since(scaled);
    assert_not_inherited(&plain.object, &pool);

    // The end marker: both cleanups succeeded and their claims are gone.
    env.wait_claim_gone("data-pooled-1").await;
    env.wait_claim_gone("data-plain-1").await;
    let nodes = nodes_of_cleanup_pods(&pods, "plain-1");
    assert!(
        !nodes.is_empty() && nodes.iter().all(|n| *n != pool.name),
        "the cleanup pod without inheritance never ran on the pool: {nodes:?}"
    );
    assert_eq!(
        nodes_of_cleanup_pods(&pods, "pooled-1"),
        std::slice::from_ref(&pool.name)
    );
    assert!(env.claim_uid("data-pooled-0").await.is_some(), "kept");
    record(
        "inherit (annotation): scale-down -> cleanup pod bound to the pool node",
        format!("{} ms", on_pool.as_millis()),
    );
    record(
        "inherit: scale-down -> cleanup pod without inheritance bound (another node)",
        format!("{} ms", elsewhere.as_millis()),
    );
}

/// With `--inherit-scheduling`, an unannotated set inherits; `none` opts a set out; an unknown
/// value inherits nothing and is one Warning `CleanupInheritInvalid`.
#[tokio::test(flavor = "multi_thread")]
async fn the_flag_makes_sets_inherit_unless_they_opt_out() {
    let cluster = Cluster::connect().await;
    let pool = Pool::create(&cluster, "flag").await;
    let env = Env::new("inherit-flag", 6, &["--inherit-scheduling"]).await;
    let sets = [
        pool_set(&env, "flagged", &pool, None),
        pool_set(&env, "optout", &pool, Some("none")),
        pool_set(&env, "bogus", &pool, Some("everything")),
    ];
    create_running(&env, &sets).await;
    let pods = env.record_pods().await;

    let scaled = scale_down(&env, &["flagged", "optout", "bogus"]).await;
    let flagged = bound_cleanup_pod(&pods, "flagged-1").await;
    let on_pool = flagged.at.duration_since(scaled);
    assert_eq!(node_of(&flagged.object), Some(pool.name.as_str()));
    assert_inherited(&flagged.object, &pool);
    for name in ["optout-1", "bogus-1"] {
        let pod = bound_cleanup_pod(&pods, name).await;
        assert_not_inherited(&pod.object, &pool);
    }
    env.wait_event("bogus", "CleanupInheritInvalid").await;

    for claim in ["data-flagged-1", "data-optout-1", "data-bogus-1"] {
        env.wait_claim_gone(claim).await;
    }
    for name in ["optout-1", "bogus-1"] {
        let nodes = nodes_of_cleanup_pods(&pods, name);
        assert!(
            !nodes.is_empty() && nodes.iter().all(|n| *n != pool.name),
            "{name} never ran on the pool: {nodes:?}"
        );
    }
    let warnings: Vec<Event> = env
        .ns
        .api::<Event>()
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CleanupInheritInvalid"))
        .collect();
    assert_eq!(warnings.len(), 1, "one Warning: {warnings:?}");
    let warning = &warnings[0];
    assert_eq!(
        warning.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("bogus")
    );
    assert!(warning.series.is_none(), "reported once: {warning:?}");
    assert!(
        warning
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("everything"),
        "{warning:?}"
    );
    record(
        "inherit (--inherit-scheduling): scale-down -> cleanup pod bound to the pool node",
        format!("{} ms", on_pool.as_millis()),
    );
}
