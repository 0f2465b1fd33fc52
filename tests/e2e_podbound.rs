//! Claims bound to a plain pod's life (`--pod-bound-claims`) on the local control plane: the real
//! garbage collector and pvc-protection do the deletion once the controller attached the pod's
//! UID, also while the controller is down; a claim whose pod was never seen goes after the grace;
//! StatefulSet pods are refused.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::fixtures::*;
use support::recorder::Recorder;
use support::{Cluster, Reclaim, TestNamespace, from_json, wait_for_gone, wait_for_pod_phase};

const BOUND: &str = "statefulsets.kubernetes.io/bound-to-pod";

async fn create_claim(
    ns: &TestNamespace,
    name: &str,
    class: &str,
    pod: &str,
) -> PersistentVolumeClaim {
    let claim: PersistentVolumeClaim = from_json(json!({
        "metadata": {"name": name, "annotations": {BOUND: pod}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }));
    ns.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim")
}

async fn create_pod(ns: &TestNamespace, name: &str, claim: &str) -> Pod {
    let pod: Pod = from_json(json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox",
                                 "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                 "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}]}
    }));
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    wait_for_pod_phase(&pods, name, "Running", LONG).await
}

async fn start(cluster: &Cluster, ns: &TestNamespace, grace: &str) -> Controller {
    let args = ["--pod-bound-claims", "--pod-bound-grace", grace];
    Controller::start(cluster, &ns.name, &args).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_claim_goes_with_its_pod_even_while_the_controller_is_down() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    create_claim(&ns, "cache", &class, "runner").await;
    let pod = create_pod(&ns, "runner", "cache").await;
    let mut controller = start(&cluster, &ns, "10m").await;

    let uid = pod.uid().expect("pod uid");
    recorded
        .wait_for("the claim owned by the pod's UID", LONG, |s| {
            s.name == "cache"
                && s.object
                    .owner_references()
                    .iter()
                    .any(|o| o.kind == "Pod" && o.name == "runner" && o.uid == uid)
        })
        .await;
    // The binding is durable: with the controller gone, the garbage collector does the rest.
    controller.terminate(Duration::from_secs(5)).await;
    ns.api::<Pod>()
        .delete("runner", &DeleteParams::default())
        .await
        .expect("delete the pod");
    wait_for_gone(&claims, "cache", LONG).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_pod_never_showed_goes_after_the_grace() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound-ghost").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    let created = create_claim(&ns, "orphan", &class, "ghost").await;
    let _controller = start(&cluster, &ns, "4s").await;
    let deleted = recorded
        .wait_for("the claim deleted", LONG, |s| {
            s.name == "orphan" && s.deleting
        })
        .await;
    let born = created.metadata.creation_timestamp.expect("created").0;
    let marked = deleted
        .object
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .expect("deletionTimestamp");
    let waited = marked.duration_since(born).as_secs_f64();
    assert!(
        waited >= 3.0,
        "deleted {waited} s after creation, before the 4 s grace"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_statefulset_pod_is_refused_and_its_claim_kept() {
    let env = Env::new(
        "podbound-sts",
        1,
        &["--pod-bound-claims", "--pod-bound-grace", "1s"],
    )
    .await;
    let mut spec = SetSpec::new("web", 1, &env.class);
    spec.template = None;
    env.create_pods_running(&spec).await;
    let class = env
        .ns
        .create_static_pvs("extra", 1, Reclaim::Retain)
        .await
        .class;
    let events = env.record_events().await;
    let claims = env.record_claims().await;
    create_claim(&env.ns, "borrowed", &class, "web-0").await;
    events
        .wait_event("borrowed", "PodBindingRefused", LONG)
        .await;
    let touched = claims
        .of("borrowed")
        .iter()
        .any(|s| s.deleting || !s.object.owner_references().is_empty());
    assert!(
        !touched,
        "a claim naming a StatefulSet pod was bound or deleted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bound_claim_another_pod_still_mounts_waits_for_it() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound-shared").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    create_claim(&ns, "cache", &class, "runner").await;
    let runner = create_pod(&ns, "runner", "cache").await;
    create_pod(&ns, "reader", "cache").await;
    let _controller = start(&cluster, &ns, "10m").await;
    let uid = runner.uid().expect("uid");
    recorded
        .wait_for("the claim owned by the runner", LONG, |s| {
            s.name == "cache" && s.object.owner_references().iter().any(|o| o.uid == uid)
        })
        .await;
    let pods = ns.api::<Pod>();
    pods.delete("runner", &DeleteParams::default())
        .await
        .expect("delete runner");
    // The garbage collector asks for the deletion; pvc-protection keeps the claim for the reader.
    recorded
        .wait_for("the claim marked for deletion", LONG, |s| {
            s.name == "cache" && s.deleting
        })
        .await;
    let kept = claims.get("cache").await.expect("the claim is still there");
    assert!(kept.metadata.deletion_timestamp.is_some());
    wait_for_pod_phase(&pods, "reader", "Running", LONG).await;
    assert!(
        !recorded.of("cache").iter().any(|s| s.gone()),
        "removed while the reader mounts it"
    );
    pods.delete("reader", &DeleteParams::default())
        .await
        .expect("delete reader");
    wait_for_gone(&claims, "cache", LONG).await;
}
