//! The `realnode` scenario's parts (`--real-node 1`, any scale-down scenario): the sets' pods and
//! the cleanup pods run as real containers on the real node of `hack/real-node.sh` (`real-0`: a
//! kubelet with containerd beside the KWOK nodes), on hostPath PVs there, instead of on KWOK's
//! simulated nodes. The busybox image is imported into the node's containerd when it starts; the
//! pods ask for it with `imagePullPolicy: IfNotPresent`, so no container waits for a registry.
//!
//! The stateful pods sleep and stop at once on SIGTERM (grace period 1 s); the cleanup pods sleep
//! `cleanup-seconds` (whole seconds, at least 1) and exit 0.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::{Value, json};

use crate::support::recorder::{Recorder, node};
use crate::support::{
    Cluster, REAL_NODE, StaticPvs, TestNamespace, from_json, real_node_ready, real_node_selector,
    real_node_skipped, real_node_toleration,
};

/// What the stateful pods run: wait, and exit 0 at once on SIGTERM.
const MEMBER: &str = "trap 'exit 0' TERM; sleep 100000 & wait";

/// Ok if the real node is registered and Ready; else what the user must do, for a clear failure
/// before anything is created or written.
pub async fn require() -> Result<(), String> {
    let cluster = Cluster::connect().await;
    if real_node_ready(&cluster.client).await {
        return Ok(());
    }
    let why = real_node_skipped().map_or_else(
        || "it is not Ready (hack/real-node.sh status; its logs: target/cluster/real-node/)".into(),
        |why| format!("the cluster was started without it ({why})"),
    );
    Err(format!(
        "the real node {REAL_NODE} is needed and absent: {why}. `make bench SCENARIO=realnode` starts \
         the cluster with it; a cluster already running without it must be stopped first \
         (hack/cluster.sh down), and only one real node can run per machine"
    ))
}

/// `n` hostPath PVs on the real node, in a class that binds on first consumer.
pub async fn pvs(ns: &TestNamespace, n: usize) -> StaticPvs {
    ns.create_real_pvs("real", n).await
}

/// Puts a pod spec on the real node: its toleration and nodeSelector, the local busybox image,
/// and `script` as the first container's command.
fn place(spec: &mut Value, script: &str) {
    spec["tolerations"] = json!([real_node_toleration()]);
    spec["nodeSelector"] = real_node_selector();
    spec["terminationGracePeriodSeconds"] = json!(1);
    let container = &mut spec["containers"][0];
    container["image"] = json!("busybox");
    container["imagePullPolicy"] = json!("IfNotPresent");
    container["command"] = json!(["sh", "-c", script]);
}

/// `set` (built for KWOK) with its pods on the real node.
pub fn on_real_node(set: StatefulSet) -> StatefulSet {
    let mut v = serde_json::to_value(set).expect("a StatefulSet serialises");
    place(&mut v["spec"]["template"]["spec"], MEMBER);
    from_json(v)
}

/// The cleanup template: on the real node, the claim at /data, sleep `seconds` then exit 0.
pub fn cleanup_template(seconds: f64) -> String {
    let mut spec = json!({
        "containers": [{"name": "main", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
    });
    let seconds = seconds.ceil().max(1.0) as u64;
    place(&mut spec, &format!("ls /data >/dev/null; sleep {seconds}"));
    json!({"metadata": {"labels": {"app": "cleanup"}}, "spec": spec}).to_string()
}

/// Where the phase's pods ran, from every recorded change: pods seen bound to another node than
/// the real one (must be 0), and the real node's kubelet and runtime versions.
pub async fn placement(cluster: &Cluster, pods: &Recorder<Pod>) -> Value {
    let seen = pods.seen();
    let mut on_real = std::collections::BTreeSet::new();
    let mut elsewhere = std::collections::BTreeSet::new();
    for s in &seen {
        match node(&s.object) {
            Some(REAL_NODE) => on_real.insert(s.uid.clone()),
            Some(_) => elsewhere.insert(s.uid.clone()),
            None => false,
        };
    }
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let info = nodes
        .get_opt(REAL_NODE)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.status?.node_info);
    json!({
        "node": REAL_NODE,
        "pods_on_real_node": on_real.len(),
        "pods_elsewhere": elsewhere.len(),
        "kubelet": info.as_ref().map(|i| i.kubelet_version.clone()),
        "container_runtime": info.as_ref().map(|i| i.container_runtime_version.clone()),
    })
}
