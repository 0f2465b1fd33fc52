//! Upgrades with a cleanup in flight, on the local control plane:
//! - from the previous version of this controller (built from `PREVIOUS_COMMIT` in
//!   hack/previous.env by hack/build-previous.sh, which `make e2e` runs): the old process creates and
//!   releases a cleanup pod and is stopped while it runs; the new one finishes it, with no second
//!   cleanup pod and no other claim touched;
//! - from the Go original, whose module the Go proxy refuses to serve (403), so the state it leaves
//!   is made by hand as its source makes it: its finalizer on the set and a running cleanup pod with
//!   its label and owner annotation and no record. The new controller reports that pod, never
//!   deletes a claim because of it, and cleans the ordinal with its own pod once the old one is
//!   deleted, as docs/operations.md's upgrade section says.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::fixtures::*;
use support::recorder::{Recorder, ran};
use support::{AFTER_ANNOTATION, Cluster, Reclaim, from_json, wait_for_gone, wait_for_pod_phase};

/// The previous controller binary (hack/build-previous.sh builds it).
fn previous_binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let env = std::fs::read_to_string(root.join("hack/previous.env")).expect("hack/previous.env");
    let commit = env
        .lines()
        .find_map(|l| l.strip_prefix("PREVIOUS_COMMIT="))
        .expect("PREVIOUS_COMMIT in hack/previous.env");
    let bin = root.join(format!(
        "target/previous/{commit}/statefulset-scaledown-controller"
    ));
    assert!(
        bin.exists(),
        "{} is missing: run hack/build-previous.sh (make e2e does)",
        bin.display()
    );
    bin
}

/// The previous controller for `namespace`, with the flags the e2e tests give the current one.
fn start_previous(cluster: &Cluster, namespace: &str) -> Controller {
    let mut command = tokio::process::Command::new(previous_binary());
    command
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["--namespace", namespace, "--cleanup-backoff", "1s"])
        .args(["--resync-period", "10s", "--metrics-bind-address=0"])
        .args(["--health-probe-bind-address=0"])
        .env("RUST_LOG", "info,statefulset_scaledown_controller=debug")
        .kill_on_drop(true);
    Controller::spawn_command(command, &format!("{namespace}-previous"))
}

/// A namespace with `pvs` static PVs and no controller yet.
async fn env_without_controller(test: &str, pvs: usize) -> Env {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace(test).await;
    let class = ns.create_static_pvs("pv", pvs, Reclaim::Retain).await.class;
    Env {
        cluster,
        ns,
        class,
        controller: None,
    }
}

fn claim_deleted(claims: &Recorder<PersistentVolumeClaim>, name: &str) -> bool {
    claims.of(name).iter().any(|s| s.deleting)
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_from_the_previous_version_with_a_cleanup_in_flight() {
    let mut env = env_without_controller("upgrade-previous", 3).await;
    env.controller = Some(start_previous(&env.cluster, &env.ns.name));
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("8s"));
    env.create_running(&spec).await;
    let (pods, claims) = (env.record_pods().await, env.record_claims().await);

    env.scale("web", 2).await;
    let old_pod = env.wait_cleanup_pod("web-2").await;
    // The upgrade: the old process stops while its cleanup runs, the new one starts.
    env.controller().terminate(Duration::from_secs(10)).await;
    let ns = env.ns.name.clone();
    env.controller = Some(Controller::start(&env.cluster, &ns, &[]).await);
    let started = std::time::Instant::now();
    env.wait_claim_gone("data-web-2").await;
    record(
        "upgrade from the previous version: new controller started -> claim of the in-flight cleanup gone",
        format!("{} ms", started.elapsed().as_millis()),
    );
    wait_for_gone(&env.pods(), "web-2", LONG).await;

    let cleanups_that_ran: Vec<String> = pods
        .of("web-2")
        .iter()
        .filter(|s| s.labels.contains_key("scaledown-pod") && ran(&s.object))
        .map(|s| s.uid.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        cleanups_that_ran,
        [old_pod.uid().expect("uid")],
        "the old controller's cleanup pod was the only one that ran"
    );
    for kept in ["data-web-0", "data-web-1"] {
        assert!(!claim_deleted(&claims, kept), "{kept} was deleted");
    }
    let reasons = env.event_reasons("web").await;
    assert!(
        !reasons.iter().any(|r| r == "UnprovenCleanupPod"),
        "the new version reads the old version's record: {reasons:?}"
    );
    env.wait_finalizer("web", true).await;
}

/// A cleanup pod `web-2` as the Go original creates it: the template plus label
/// `scaledown-pod=web-2` and annotation `…/scaledown-pod-owner=web`, restartPolicy OnFailure, the
/// ordinal's claim mounted; it runs for `after` under KWOK.
fn go_original_cleanup_pod(after: &str) -> Pod {
    from_json(json!({
        "metadata": {"name": "web-2",
                     "labels": {"app": "cleanup", "scaledown-pod": "web-2"},
                     "annotations": {OWNER: "web", AFTER_ANNOTATION: after}},
        "spec": {"restartPolicy": "OnFailure",
                 "containers": [{"name": "main", "image": "busybox",
                                 "volumeMounts": [{"name": "data", "mountPath": "/var/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}}]}
    }))
}

/// Creates the Go original's cleanup pod and waits until it runs. A terminating pod's late
/// delete by name (KWOK sends no UID precondition) can remove a pod just created with that name;
/// it is created again then.
async fn create_running_go_pod(env: &Env) -> Pod {
    for _ in 0..5 {
        let pods = env.pods();
        let created = pods
            .create(&PostParams::default(), &go_original_cleanup_pod("6s"))
            .await
            .expect("create the Go original's cleanup pod");
        let running = wait_for_pod_phase(&pods, "web-2", "Running", LONG).await;
        if running.uid() == created.uid() {
            return running;
        }
        wait_for_gone(&pods, "web-2", LONG).await;
    }
    panic!("the Go original's cleanup pod never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_from_the_go_original_with_a_cleanup_in_flight() {
    let mut env = env_without_controller("upgrade-go", 3).await;
    env.create_pods_running(&SetSpec::new("web", 3, &env.class))
        .await;
    let finalizer = json!({"metadata": {"finalizers": [FINALIZER]}});
    env.sets()
        .patch("web", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .expect("the Go original's finalizer");
    env.scale("web", 2).await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    let go_pod = create_running_go_pod(&env).await;
    let (claims, events) = (env.record_claims().await, env.record_events().await);

    let ns = env.ns.name.clone();
    env.controller = Some(Controller::start(&env.cluster, &ns, &[]).await);
    events.wait_event("web", "UnprovenCleanupPod", LONG).await;
    wait_for_pod_phase(&env.pods(), "web-2", "Succeeded", LONG).await;
    // Window: until the new controller has looked at the set twice after the pod succeeded.
    env.controller().wait_reconciles(&ns, "web", 2).await;
    assert!(
        !claim_deleted(&claims, "data-web-2"),
        "a claim was deleted because of a pod this controller cannot prove it created"
    );
    assert!(
        env.pods()
            .get_opt("web-2")
            .await
            .expect("get")
            .is_some_and(|p| p.uid() == go_pod.uid())
    );

    // As docs/operations.md says: delete the old pod; the new controller cleans the ordinal itself.
    env.pods()
        .delete("web-2", &DeleteParams::default())
        .await
        .expect("delete the Go original's pod");
    let own = env.wait_cleanup_pod("web-2").await;
    assert_ne!(own.uid(), go_pod.uid());
    env.wait_claim_gone("data-web-2").await;
    for kept in ["data-web-0", "data-web-1"] {
        assert!(!claim_deleted(&claims, kept), "{kept} was deleted");
    }
}
