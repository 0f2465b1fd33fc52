//! Smoke tests of the e2e harness: they prove that the local control plane behaves like a real
//! cluster where our controller depends on it (StatefulSet controller, PV binder, pvc-protection,
//! reclaim policies) and that KWOK follows the pod simulation contract. No controller of this
//! crate runs here.
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_smoke` (or `make e2e`).

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ContainerStateTerminated, PersistentVolume, PersistentVolumeClaim, Pod,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::recorder::{self, Recorder};
use support::{
    AFTER_ANNOTATION, Cluster, OUTCOME_LABEL, Reclaim, SCALEDOWN_POD_LABEL, from_json, pod_phase,
    wait_for, wait_for_gone, wait_for_pod_phase, wait_for_pv_phase, wait_for_pvc_phase,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn statefulset(name: &str, replicas: i32, class: &str) -> StatefulSet {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "main",
                        "image": "registry.invalid/never-pulled:1",
                        "volumeMounts": [{"name": "data", "mountPath": "/var/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }],
        },
    }))
}

/// A bare pod; `labels`/`annotations` are merged into its metadata.
fn pod(name: &str, labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
    from_json(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "registry.invalid/never-pulled:1"}],
        },
    }))
}

fn terminated(pod: &Pod) -> ContainerStateTerminated {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .unwrap_or_else(|| panic!("pod has no container status: {:?}", pod.status));
    let state = status.state.as_ref().expect("container status has a state");
    assert!(
        state.running.is_none(),
        "a finished container must not still be running: {state:?}"
    );
    state
        .terminated
        .clone()
        .unwrap_or_else(|| panic!("container is not terminated: {state:?}"))
}

fn claim_phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref()?.phase.as_deref()
}

/// (a) + (b): a StatefulSet with a claim template runs on the fake nodes with its claims bound by
/// the real PV binder; scaled down, the real StatefulSet controller deletes the highest pod and
/// leaves its claim bound.
#[tokio::test]
async fn statefulset_runs_on_fake_nodes_and_scale_down_keeps_claim() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("sts-scale-down").await;
    let pvs = ns.create_static_pvs("data", 3, Reclaim::Retain).await;
    let sts_api: Api<StatefulSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();

    sts_api
        .create(&PostParams::default(), &statefulset("web", 3, &pvs.class))
        .await
        .expect("create StatefulSet");

    for i in 0..3 {
        let pod = wait_for_pod_phase(&pods, &format!("web-{i}"), "Running", TIMEOUT).await;
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(
            node.starts_with("kwok-node-"),
            "web-{i} runs on {node:?}, not on a fake node"
        );
        let claim = wait_for_pvc_phase(&claims, &format!("data-web-{i}"), "Bound", TIMEOUT).await;
        let volume = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        assert!(
            pvs.names.contains(&volume),
            "data-web-{i} bound to {volume:?}, not one of {:?}",
            pvs.names
        );
    }
    wait_for(
        "StatefulSet web to report 3 ready replicas",
        TIMEOUT,
        || async {
            sts_api
                .get("web")
                .await
                .ok()
                .and_then(|s| s.status)
                .and_then(|s| s.ready_replicas)
                == Some(3)
        },
    )
    .await;

    sts_api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale StatefulSet to 2");
    wait_for_gone(&pods, "web-2", TIMEOUT).await;
    wait_for("StatefulSet web to report 2 replicas", TIMEOUT, || async {
        sts_api
            .get("web")
            .await
            .ok()
            .and_then(|s| s.status)
            .map(|s| s.replicas)
            == Some(2)
    })
    .await;

    let kept = claims
        .get("data-web-2")
        .await
        .expect("claim data-web-2 still exists");
    assert_eq!(
        claim_phase(&kept),
        Some("Bound"),
        "data-web-2 after scale-down"
    );
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "data-web-2 must not be deleted"
    );
    for i in 0..2 {
        let pod = pods.get(&format!("web-{i}")).await.expect("remaining pod");
        assert_eq!(pod_phase(&pod), Some("Running"), "web-{i} after scale-down");
    }
}

/// (c): the pod simulation contract of hack/kwok/scaledown-pod-stages.yaml.
#[tokio::test]
async fn scaledown_pods_succeed_fail_or_keep_running_on_cue() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("kwok-stages").await;
    let pods: Api<Pod> = ns.api();
    let pp = PostParams::default();
    let seen = Recorder::start(pods.clone(), watcher::Config::default()).await;

    let cases = [
        pod("ok", json!({SCALEDOWN_POD_LABEL: "ok"}), json!({})),
        pod(
            "bad",
            json!({SCALEDOWN_POD_LABEL: "bad", OUTCOME_LABEL: "Failed"}),
            json!({}),
        ),
        pod(
            "stay",
            json!({SCALEDOWN_POD_LABEL: "stay", OUTCOME_LABEL: "Running"}),
            json!({}),
        ),
        pod(
            "slow",
            json!({SCALEDOWN_POD_LABEL: "slow"}),
            json!({AFTER_ANNOTATION: "12s"}),
        ),
        pod("plain", json!({"app": "plain"}), json!({})),
    ];
    for p in &cases {
        pods.create(&pp, p).await.expect("create pod");
    }
    for name in ["ok", "bad", "stay", "slow", "plain"] {
        // Each one passes Running (pod-ready); "ok" and "bad" may already be past it.
        wait_for(
            &format!("pod {name} to be scheduled and started"),
            TIMEOUT,
            || async {
                pods.get(name)
                    .await
                    .ok()
                    .and_then(|p| p.status)
                    .and_then(|s| s.start_time)
                    .is_some()
            },
        )
        .await;
    }

    let ok = wait_for_pod_phase(&pods, "ok", "Succeeded", TIMEOUT).await;
    let t = terminated(&ok);
    assert_eq!(
        (t.exit_code, t.reason.as_deref()),
        (0, Some("Completed")),
        "ok: {t:?}"
    );

    let bad = wait_for_pod_phase(&pods, "bad", "Failed", TIMEOUT).await;
    let t = terminated(&bad);
    assert_ne!(t.exit_code, 0, "bad: exit code");
    assert_eq!(t.reason.as_deref(), Some("Error"), "bad: {t:?}");

    // The annotation postpones completion: "slow" (12 s) still runs when "ok" (3 s) is done.
    let slow = pods.get("slow").await.expect("get slow");
    assert_eq!(
        pod_phase(&slow),
        Some("Running"),
        "slow finished before its 12 s"
    );

    // "stay" and a pod without the label keep running for (at least) 10 s after they started.
    let started = pods
        .get("stay")
        .await
        .expect("get stay")
        .status
        .and_then(|s| s.start_time)
        .expect("startTime");
    let ten_s_after = started.0.as_second() + 11;
    while k8s_openapi::jiff::Timestamp::now().as_second() < ten_s_after {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Everything the watch saw of them until a marker set after those 10 s came back through it:
    // once Running (KWOK took the pod up), never anything else, never deleted.
    for name in ["stay", "plain"] {
        let marker = seen.close_window(&pods, name).await;
        let window: Vec<_> = seen
            .of(name)
            .into_iter()
            .filter(|s| s.resource_version < marker.resource_version)
            .collect();
        let phases: Vec<&str> = window
            .iter()
            .map(|s| recorder::phase(&s.object))
            .skip_while(|p| *p != "Running")
            .collect();
        assert!(
            !phases.is_empty() && phases.iter().all(|p| *p == "Running"),
            "{name} in its first 10 s: {phases:?}"
        );
        assert!(window.iter().all(|s| !s.deleting), "{name} was deleted");
    }

    let slow = wait_for_pod_phase(&pods, "slow", "Succeeded", TIMEOUT).await;
    let start = slow
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .expect("startTime");
    let finished = terminated(&slow).finished_at.expect("finishedAt");
    let took = finished.0.as_second() - start.0.as_second();
    assert!(
        (11..=20).contains(&took),
        "slow finished {took} s after it started, expected about 12 s"
    );
}

/// (d): a claim deleted while a running pod mounts it stays Terminating (pvc-protection) until the
/// pod is gone; then it disappears and its Retain PV goes Released.
#[tokio::test]
async fn claim_in_use_stays_terminating_until_pod_is_deleted() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("pvc-protection").await;
    let pvs = ns.create_static_pvs("data", 1, Reclaim::Retain).await;
    let pods: Api<Pod> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let volumes: Api<PersistentVolume> = Api::all(ns.client());
    let pp = PostParams::default();

    let claim: PersistentVolumeClaim = from_json(json!({
        "metadata": {"name": "claim"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": pvs.class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }));
    claims.create(&pp, &claim).await.expect("create claim");
    wait_for_pvc_phase(&claims, "claim", "Bound", TIMEOUT).await;

    let mut user = pod("user", json!({"app": "user"}), json!({}));
    let spec = user.spec.as_mut().expect("spec");
    spec.volumes = Some(vec![from_json(
        json!({"name": "data", "persistentVolumeClaim": {"claimName": "claim"}}),
    )]);
    spec.containers[0].volume_mounts = Some(vec![from_json(
        json!({"name": "data", "mountPath": "/data"}),
    )]);
    pods.create(&pp, &user).await.expect("create pod");
    wait_for_pod_phase(&pods, "user", "Running", TIMEOUT).await;

    let seen = Recorder::start(claims.clone(), watcher::Config::default()).await;
    claims
        .delete("claim", &DeleteParams::default())
        .await
        .expect("delete claim");
    seen.wait_for("claim to be Terminating", TIMEOUT, |s| {
        s.name == "claim" && s.deleting
    })
    .await;
    // A window of 5 s in which pvc-protection must hold it: the watch never sees it go.
    let window = seen.wait_until(Duration::from_secs(5), |s| s.gone()).await;
    assert!(
        window.is_none(),
        "pvc-protection let the claim go while the pod ran: {window:?}"
    );
    let held = claims
        .get("claim")
        .await
        .expect("claim must still exist while the pod runs");
    let finalizers = held.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers
            .iter()
            .any(|f| f == "kubernetes.io/pvc-protection"),
        "claim finalizers: {finalizers:?}"
    );
    assert_eq!(claim_phase(&held), Some("Bound"));

    pods.delete("user", &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for_gone(&pods, "user", TIMEOUT).await;
    wait_for_gone(&claims, "claim", TIMEOUT).await;
    wait_for_pv_phase(&volumes, &pvs.names[0], "Released", TIMEOUT).await;
}

/// A claim on a static hostPath PV with reclaim policy Delete: once the claim is gone, kcm's
/// hostPath deleter removes the directory and the PV (the harness's stand-in for a real
/// provisioner).
#[tokio::test]
async fn delete_policy_pv_is_removed_with_its_claim() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("pv-delete").await;
    let pvs = ns.create_static_pvs("data", 1, Reclaim::Delete).await;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let volumes: Api<PersistentVolume> = Api::all(ns.client());

    let claim: PersistentVolumeClaim = from_json(json!({
        "metadata": {"name": "claim"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": pvs.class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }));
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    wait_for_pvc_phase(&claims, "claim", "Bound", TIMEOUT).await;
    let pv = volumes.get(&pvs.names[0]).await.expect("get PV");
    let path = pv
        .spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
        .map(|h| h.path.clone())
        .expect("hostPath");
    assert!(
        std::path::Path::new(&path).is_dir(),
        "hostPath {path} should exist"
    );

    claims
        .delete("claim", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_for_gone(&claims, "claim", TIMEOUT).await;
    wait_for_gone(&volumes, &pvs.names[0], TIMEOUT).await;
    assert!(
        !std::path::Path::new(&path).exists(),
        "hostPath {path} should be removed"
    );
}

/// (e): kubectl from the harness talks to an apiserver of the pinned version (hack/versions.env),
/// or of `SCALEDOWN_K8S_VERSION` when the suite runs on another one (`make e2e-oldest`).
#[tokio::test]
async fn kubectl_reports_the_server_version_of_the_cluster() {
    let pinned = include_str!("../hack/versions.env")
        .lines()
        .find_map(|l| l.strip_prefix("K8S_VERSION="))
        .expect("K8S_VERSION in hack/versions.env")
        .to_string();
    let version = std::env::var("SCALEDOWN_K8S_VERSION").unwrap_or(pinned);
    let cluster = Cluster::connect().await;
    let out = cluster.kubectl(&["version", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).expect("kubectl version -o json");
    let server = v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(server, version, "server version in {out}");
    let client = v["clientVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(client, version, "client version");
}
