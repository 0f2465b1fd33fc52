//! Claims bound to a plain pod's life (`--pod-bound-claims`) on the local control plane: the real
//! garbage collector and pvc-protection do the deletion once the controller attached the pod's
//! UID, also while the controller is down; a claim another pod mounts has that pod as an owner too
//! and is never marked for deletion while it runs; a claim whose pod was never seen goes after the
//! grace, also when the pod came and went while the controller was down; StatefulSet pods and
//! StatefulSets' own claims are refused.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::fixtures::*;
use support::recorder::{Recorder, Seen};
use support::{Cluster, Reclaim, TestNamespace, from_json, wait_for_gone, wait_for_pod_phase};

const BOUND: &str = "statefulsets.kubernetes.io/bound-to-pod";
const WAITING: &str = "statefulsets.kubernetes.io/bound-to-pod-waiting-since";

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

/// A running pod `name` that mounts `claim` (or no claim).
async fn create_pod_with(ns: &TestNamespace, name: &str, claim: Option<&str>) -> Pod {
    let mut spec = json!({"terminationGracePeriodSeconds": 0,
                          "containers": [{"name": "main", "image": "busybox"}]});
    if let Some(claim) = claim {
        spec["containers"][0]["volumeMounts"] = json!([{"name": "cache", "mountPath": "/cache"}]);
        spec["volumes"] = json!([{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}]);
    }
    let pod: Pod = from_json(json!({"metadata": {"name": name}, "spec": spec}));
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    wait_for_pod_phase(&pods, name, "Running", LONG).await
}

async fn create_pod(ns: &TestNamespace, name: &str, claim: &str) -> Pod {
    create_pod_with(ns, name, Some(claim)).await
}

async fn start(cluster: &Cluster, ns: &TestNamespace, grace: &str) -> Controller {
    let args = ["--pod-bound-claims", "--pod-bound-grace", grace];
    Controller::start(cluster, &ns.name, &args).await
}

/// The UIDs of the pods that own the claim in this recorded state.
fn pod_owners(s: &Seen<PersistentVolumeClaim>) -> Vec<String> {
    s.object
        .owner_references()
        .iter()
        .filter(|o| o.kind == "Pod")
        .map(|o| o.uid.clone())
        .collect()
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

/// Seconds from the claim's creation to its deletion mark, both by the API server's clock.
fn created_to_marked(created: &PersistentVolumeClaim, deleting: &PersistentVolumeClaim) -> f64 {
    let born = created.creation_timestamp().expect("created").0;
    let marked = deleting
        .metadata
        .deletion_timestamp
        .as_ref()
        .expect("deletionTimestamp")
        .0;
    marked.duration_since(born).as_secs_f64()
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
    let waited = created_to_marked(&created, &deleted.object);
    assert!(
        waited >= 3.0,
        "deleted {waited} s after creation, before the 4 s grace"
    );
}

/// An old claim (older than the grace, not opted in) annotated now for a pod that does not exist
/// (yet, or a typo): the grace counts from when the controller first saw it wait for that pod, which
/// it records on the claim, not from the claim's creation. No deletion mark within the grace after
/// the annotation (over every change the watch saw), then, the pod never showing, deleted. (The
/// claim was deleted at once: it was older than the grace.)
#[tokio::test(flavor = "multi_thread")]
async fn an_old_claim_annotated_later_waits_the_whole_grace_from_then() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound-late").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    let plain: PersistentVolumeClaim = from_json(json!({
        "metadata": {"name": "late"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }));
    claims
        .create(&PostParams::default(), &plain)
        .await
        .expect("create claim");
    let _controller = start(&cluster, &ns, "5s").await;
    // Older than the grace before it opts in.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mark = recorded.mark();
    let annotate = json!({"metadata": {"annotations": {BOUND: "ghost"}}});
    claims
        .patch("late", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .expect("annotate the claim");
    let annotated = recorded
        .wait_for_since(mark, "the claim annotated", LONG, |s| {
            s.name == "late" && s.annotations.contains_key(BOUND)
        })
        .await;
    let deleted = recorded
        .wait_for_since(mark, "the claim marked for deletion", LONG, |s| {
            s.name == "late" && s.deleting
        })
        .await;
    let waited = (deleted.at - annotated.at).as_secs_f64();
    assert!(
        waited >= 3.5,
        "marked for deletion {waited} s after the annotation, within the 5 s grace"
    );
    let record = recorded
        .since(mark)
        .iter()
        .find_map(|s| s.annotations.get(WAITING).cloned());
    assert!(
        record.as_deref().is_some_and(|r| r.starts_with("ghost@")),
        "the wait recorded on the claim: {record:?}"
    );
}

/// The controller is down while the claim and its pod are created and the pod is deleted: it never
/// saw the pod, so no ownerReference was attached. Started later, it finds the claim's pod gone and
/// deletes the claim once the grace is over.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_pod_went_while_the_controller_was_down_goes_when_it_starts() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound-down").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    let created = create_claim(&ns, "cache", &class, "runner").await;
    create_pod(&ns, "runner", "cache").await;
    let pods = ns.api::<Pod>();
    pods.delete("runner", &DeleteParams::default())
        .await
        .expect("delete the pod");
    wait_for_gone(&pods, "runner", LONG).await;
    let before_start = recorded.mark();
    let controller = start(&cluster, &ns, "3s").await;

    let deleted = recorded
        .wait_for("the claim marked for deletion", LONG, |s| {
            s.name == "cache" && s.deleting
        })
        .await;
    assert!(
        recorded.seen()[..before_start]
            .iter()
            .all(|s| !s.deleting && pod_owners(s).is_empty()),
        "the claim was bound or deleted before the controller started"
    );
    assert!(
        deleted.at >= controller.started,
        "deleted before the controller started"
    );
    let waited = created_to_marked(&created, &deleted.object);
    assert!(
        waited >= 2.0,
        "deleted {waited} s after creation, before the 3 s grace"
    );
    wait_for_gone(&claims, "cache", LONG).await;
    record(
        "pod-bound: claim of a pod gone while the controller was down, deleted after start",
        format!("{} ms", (deleted.at - controller.started).as_millis()),
    );
}

/// Refused, never bound, never deleted: a claim naming a StatefulSet's pod, and the real claims a
/// StatefulSet made from its volumeClaimTemplate (no ownerReference with the default Retain
/// policy), annotated to name a plain running pod or a pod that never existed.
#[tokio::test(flavor = "multi_thread")]
async fn statefulset_pods_and_claims_are_refused_and_kept() {
    let env = Env::new(
        "podbound-sts",
        2,
        &["--pod-bound-claims", "--pod-bound-grace", "1s"],
    )
    .await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = None;
    env.create_pods_running(&spec).await;
    let class = env
        .ns
        .create_static_pvs("extra", 1, Reclaim::Retain)
        .await
        .class;
    create_pod_with(&env.ns, "plain", None).await;
    let events = env.record_events().await;
    let claims = env.record_claims().await;
    for name in ["data-web-0", "data-web-1"] {
        let real = env.claims().get(name).await.expect("the set's claim");
        assert!(
            real.owner_references().is_empty(),
            "{name}: a Retain set's claim has no ownerReference, so only its name tells"
        );
        record(
            "pod-bound: labels and owners Kubernetes gives a StatefulSet's claim",
            format!("{name}: labels {:?}, ownerReferences none", real.labels()),
        );
    }
    create_claim(&env.ns, "borrowed", &class, "web-0").await;
    for (claim, pod) in [("data-web-0", "plain"), ("data-web-1", "ghost")] {
        let patch = json!({"metadata": {"annotations": {BOUND: pod}}});
        env.claims()
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate the set's claim");
    }
    for claim in ["borrowed", "data-web-0", "data-web-1"] {
        events.wait_event(claim, "PodBindingRefused", LONG).await;
    }
    let note = events
        .events("data-web-1", "PodBindingRefused")
        .first()
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert!(note.contains("StatefulSet web"), "{note}");
    for claim in ["borrowed", "data-web-0", "data-web-1"] {
        let touched = claims
            .of(claim)
            .iter()
            .any(|s| s.deleting || !pod_owners(s).is_empty());
        assert!(!touched, "{claim} was bound or deleted");
    }
}

/// A claim mounted by another live pod is never marked for deletion while that pod runs: every pod
/// that mounts it becomes an owner (also one that starts after the binding), so the garbage
/// collector only drops the owners that are gone; the claim goes after the last of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_bound_claim_another_pod_still_mounts_waits_for_it() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("podbound-shared").await;
    let class = ns.create_static_pvs("pv", 1, Reclaim::Retain).await.class;
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let recorded = Recorder::start(claims.clone(), kube::runtime::watcher::Config::default()).await;
    create_claim(&ns, "cache", &class, "runner").await;
    let runner = create_pod(&ns, "runner", "cache").await;
    let reader = create_pod(&ns, "reader", "cache").await;
    let _controller = start(&cluster, &ns, "10m").await;
    let uid = |p: &Pod| p.uid().expect("uid");
    let (runner_uid, reader_uid) = (uid(&runner), uid(&reader));
    recorded
        .wait_for("the claim owned by the runner and the reader", LONG, |s| {
            let owners = pod_owners(s);
            s.name == "cache" && owners.contains(&runner_uid) && owners.contains(&reader_uid)
        })
        .await;
    // A pod that starts to mount the bound claim later is added by the pod watch.
    let asked = std::time::Instant::now();
    let late = create_pod(&ns, "late", "cache").await;
    let late_uid = uid(&late);
    let added = recorded
        .wait_for("the late pod an owner too", LONG, |s| {
            s.name == "cache" && pod_owners(s).contains(&late_uid)
        })
        .await;
    record(
        "pod-bound: a pod that mounts a bound claim made an owner",
        format!(
            "{} ms after its create request",
            (added.at - asked).as_millis()
        ),
    );

    let pods = ns.api::<Pod>();
    for (gone, gone_uid) in [("runner", &runner_uid), ("reader", &reader_uid)] {
        pods.delete(gone, &DeleteParams::default())
            .await
            .expect("delete a pod");
        wait_for_gone(&pods, gone, LONG).await;
        // The garbage collector looked at the claim: it dropped the gone owner and kept the claim.
        recorded
            .wait_for(&format!("the GC drops {gone} from the owners"), LONG, |s| {
                s.name == "cache"
                    && !s.deleting
                    && !pod_owners(s).contains(gone_uid)
                    && pod_owners(s).contains(&late_uid)
            })
            .await;
        let marked = recorded.of("cache").iter().any(|s| s.deleting);
        assert!(
            !marked,
            "marked for deletion while {late_uid} (late) mounts it, after {gone} went"
        );
    }
    let still = pods.get("late").await.expect("late still there");
    assert_eq!(support::pod_phase(&still), Some("Running"));
    let mark = recorded.mark();
    pods.delete("late", &DeleteParams::default())
        .await
        .expect("delete the last pod");
    wait_for_gone(&claims, "cache", LONG).await;
    assert!(
        recorded.since(mark).iter().any(|s| s.deleting),
        "the claim went after its last owner"
    );
}
