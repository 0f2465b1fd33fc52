//! Helpers of the install tests (`tests/e2e_deploy.rs`, `tests/e2e_chart.rs`, `tests/e2e_image.rs`):
//! kubectl, manifests, ServiceAccount token kubeconfigs, the controller binary run with such a
//! token, and the scale-down scenarios that prove an install's RBAC is enough.
#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};

use super::fixtures::Controller;
use super::{Cluster, Reclaim, TestNamespace, from_json, repo_dir, wait_for, wait_for_gone};

pub const INSTALL_NS: &str = "statefulset-scaledown-controller";
pub const SERVICE_ACCOUNT: &str = "statefulset-scaledown-controller";
pub const LEASE: &str = "statefulset-scaledown-controller";
pub const APP_LABEL: &str = "app.kubernetes.io/name=statefulset-scaledown-controller";
pub const FINALIZER: &str = "statefulsets.kubernetes.io/scaledown";
pub const OWNER: &str = "statefulsets.kubernetes.io/scaledown-pod-owner";
pub const ATTEMPT: &str = "statefulsets.kubernetes.io/scaledown-attempt";
pub const LONG: Duration = Duration::from_secs(90);

/// Held by every test that runs a controller. The cluster-wide one would otherwise also act on the
/// StatefulSet of the per-namespace test, and that test could no longer tell who did the work.
pub static CONTROLLER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn manifest(name: &str) -> PathBuf {
    repo_dir().join("artifacts").join(name)
}

pub fn manifest_str(name: &str) -> String {
    manifest(name).to_string_lossy().into_owned()
}

// === kubectl ===

/// Runs kubectl with `kubeconfig`; returns the output whatever the status.
pub async fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(super::kubectl_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run kubectl {args:?}: {e}"))
}

/// Writes `content` to `target/e2e-tmp/<name>` (for `kubectl -f`) and returns the path.
pub fn scratch_file(name: &str, content: &str) -> String {
    let dir = repo_dir().join("target/e2e-tmp");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write scratch file");
    path.to_string_lossy().into_owned()
}

/// Like [`kubectl_with`], but the command must succeed and print no warning; returns stdout.
pub async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl_with(kubeconfig, args).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("Warning"),
        "kubectl {args:?} printed warnings:\n{stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs kubectl with `kubeconfig` and expects it to be refused with "forbidden".
pub async fn expect_forbidden(kubeconfig: &Path, args: &[&str]) {
    let out = kubectl_with(kubeconfig, args).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("forbidden"),
        "kubectl {args:?} should be forbidden, got {}:\nstdout: {}\nstderr: {stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

// === manifests ===

/// The objects of a multi-document YAML file.
pub fn yaml_objects(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("manifest is valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn read_manifest(name: &str) -> Vec<Value> {
    let path = manifest(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    yaml_objects(&text)
}

pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifest"))
}

/// Every `image` value anywhere in `value`.
pub fn images(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("image", Value::String(s)) => out.push(s.clone()),
                    _ => images(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| images(v, out)),
        _ => {}
    }
}

/// A pod that the `restricted` profile refuses (no securityContext at all).
pub fn non_compliant_pod(namespace: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "psa-probe", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    })
    .to_string()
}

/// The restricted profile really is enforced in `namespace`: a non-compliant pod is refused.
pub async fn assert_restricted_enforced(cluster: &Cluster, namespace: &str) {
    let pod = scratch_file(
        &format!("psa-probe-{namespace}.json"),
        &non_compliant_pod(namespace),
    );
    let out = kubectl_with(
        &cluster.kubeconfig,
        &["apply", "--dry-run=server", "-f", &pod],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("violates PodSecurity \"restricted"),
        "a non-compliant pod should be refused in {namespace}, got {}: {stderr}",
        out.status
    );
}

/// Waits until the manifest's Deployment in `namespace` has two pods, admitted and ready.
pub async fn wait_deployment_ready(cluster: &Cluster, namespace: &str) {
    wait_deployment_ready_named(cluster, namespace, SERVICE_ACCOUNT).await;
}

/// Waits until Deployment `name` in `namespace` has two pods, admitted and ready.
pub async fn wait_deployment_ready_named(cluster: &Cluster, namespace: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    wait_for(
        &format!("2 pods of the Deployment in {namespace} (PodSecurity admission)"),
        LONG,
        || async {
            pods.list(&ListParams::default().labels(APP_LABEL))
                .await
                .map(|l| l.items.len() == 2)
                .unwrap_or(false)
        },
    )
    .await;
    wait_for(
        &format!("the Deployment in {namespace} to have 2 ready replicas"),
        LONG,
        || async {
            deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|d| d.status)
                .and_then(|s| s.ready_replicas)
                == Some(2)
        },
    )
    .await;
}

/// A kubeconfig for the manifest's ServiceAccount in `namespace`, with a TokenRequest token and
/// the server and CA of the admin kubeconfig.
pub async fn token_kubeconfig(cluster: &Cluster, namespace: &str) -> PathBuf {
    token_kubeconfig_for(cluster, namespace, SERVICE_ACCOUNT).await
}

/// A kubeconfig for ServiceAccount `account` in `namespace` (see [`token_kubeconfig`]).
pub async fn token_kubeconfig_for(cluster: &Cluster, namespace: &str, account: &str) -> PathBuf {
    super::service_account_kubeconfig(cluster, namespace, account).await
}

// === the controller binary, run with the manifest's token ===

/// Starts the binary with `kubeconfig`; `identity` becomes POD_NAME (Lease holder, Event reporting
/// instance), `pod_namespace` POD_NAMESPACE.
pub fn start_controller(
    kubeconfig: &Path,
    identity: &str,
    pod_namespace: &str,
    extra: &[&str],
) -> Controller {
    let mut args = vec![
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
        "--resync-period",
        "10s",
        "--cleanup-backoff",
        "1s",
        "--cleanup-attempts",
        "2",
    ];
    args.extend_from_slice(extra);
    let env = [
        ("POD_NAME", identity),
        ("POD_NAMESPACE", pod_namespace),
        ("NO_COLOR", "1"),
    ];
    Controller::spawn(kubeconfig, identity, &args, &env)
}

/// Log lines that report a refusal by the API server (RBAC). Writes refused because a namespace of
/// some other test is being deleted are not RBAC and do not count.
pub fn forbidden_lines(controller: &Controller) -> Vec<String> {
    controller
        .log_text()
        .lines()
        .filter(|l| {
            let l = l.replace("ForbiddenField", "");
            (l.contains("forbidden") || l.contains("Forbidden"))
                && !l.contains("because it is being terminated")
        })
        .map(String::from)
        .collect()
}

/// Never returns: panics as soon as the log shows a refusal, so a missing rule fails the test at
/// once instead of at the end of some wait. Race it against the scenario.
pub async fn fail_on_refusal(controller: &Controller) {
    loop {
        let forbidden = forbidden_lines(controller);
        assert!(
            forbidden.is_empty(),
            "the controller was refused by the API server:\n{}",
            forbidden.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When dropped (after the controller is gone): removes our finalizer from the StatefulSets of a
/// namespace and deletes them, so that a failed test never leaves a namespace stuck in Terminating,
/// and no StatefulSet is left for the next test's cluster-wide controller to act on.
pub struct SetSweep {
    pub kubeconfig: PathBuf,
    pub namespace: String,
}

impl Drop for SetSweep {
    fn drop(&mut self) {
        let kubectl = |args: &[&str]| {
            std::process::Command::new(super::kubectl_binary())
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["-n", &self.namespace, "--request-timeout", "20s"])
                .args(args)
                .output()
        };
        // `kubectl patch` has no `--all`: patch the sets one by one.
        let names = kubectl(&["get", "statefulsets", "-o", "name"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for name in names.lines().filter(|n| !n.is_empty()) {
            let _ = kubectl(&[
                "patch",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
        }
        let _ = kubectl(&[
            "delete",
            "statefulsets",
            "--all",
            "--wait=true",
            "--timeout=30s",
        ]);
    }
}

/// Deletes the objects of cluster-scoped.yaml when dropped.
pub struct ClusterScopedInstall {
    pub kubeconfig: PathBuf,
}

impl Drop for ClusterScopedInstall {
    fn drop(&mut self) {
        if std::env::var_os("SCALEDOWN_E2E_KEEP").is_some_and(|v| v == "1") {
            eprintln!("e2e: SCALEDOWN_E2E_KEEP=1, keeping the cluster-scoped install");
            return;
        }
        let _ = std::process::Command::new(super::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "-f",
                &manifest_str("cluster-scoped.yaml"),
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
    }
}

// === the scale-down the controller must manage with the manifest's RBAC ===

/// StatefulSet `name` with claim template `data` in `class` and a cleanup template that adds
/// `cleanup_labels` (e.g. the simulated outcome) to `app: cleanup`.
pub fn stateful_set(name: &str, replicas: i32, class: &str, cleanup_labels: Value) -> StatefulSet {
    let mut labels = json!({"app": "cleanup"});
    if let (Some(l), Value::Object(extra)) = (labels.as_object_mut(), cleanup_labels) {
        l.extend(extra);
    }
    let cleanup = json!({
        "metadata": {"labels": labels},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox",
                                 "volumeMounts": [{"name": "data", "mountPath": "/var/data"}]}]}
    });
    from_json(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": cleanup.to_string()}},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "main", "image": "busybox",
                                         "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                         "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }))
}

/// Creates `name` with `replicas` and waits until its pods run and our finalizer is on it
/// (statefulsets patch).
pub async fn create_running(ns: &TestNamespace, set: StatefulSet) {
    let sets: Api<StatefulSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    let name = set.name_any();
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    sets.create(&PostParams::default(), &set)
        .await
        .unwrap_or_else(|e| panic!("create statefulset {name}: {e}"));
    for n in 0..replicas {
        super::wait_for_pod_phase(&pods, &format!("{name}-{n}"), "Running", LONG).await;
    }
    wait_for(
        &format!("our finalizer on {name} (statefulsets patch)"),
        LONG,
        || async {
            sets.get_opt(&name)
                .await
                .ok()
                .flatten()
                .is_some_and(|s| s.finalizers().iter().any(|f| f == FINALIZER))
        },
    )
    .await;
}

pub async fn scale(ns: &TestNamespace, name: &str, replicas: i32) {
    let sets: Api<StatefulSet> = ns.api();
    let patch = json!({"spec": {"replicas": replicas}});
    sets.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("scale {name} to {replicas}: {e}"));
}

/// The Events on StatefulSet `set` that the controller (any of its instances) published.
pub async fn set_events(ns: &TestNamespace, set: &str) -> Vec<Event> {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(set))
        .filter(|e| e.reporting_controller.as_deref() == Some("statefulset-scaledown-controller"))
        .collect()
}

/// Reasons of the Events on StatefulSet `set` that the controller with `identity` published.
pub async fn event_reasons(ns: &TestNamespace, set: &str, identity: &str) -> Vec<String> {
    set_events(ns, set)
        .await
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(identity))
        .filter_map(|e| e.reason)
        .collect()
}

pub async fn wait_events(ns: &TestNamespace, set: &str, identity: &str, reasons: &[&str]) {
    wait_for(
        &format!("Events {reasons:?} on {set} from {identity}"),
        LONG,
        || async {
            let seen = event_reasons(ns, set, identity).await;
            reasons.iter().all(|r| seen.iter().any(|x| x == r))
        },
    )
    .await;
}

/// The two scenarios that prove an install's RBAC is enough, at once, on 5 static PVs of `ns`:
/// [`scale_down_and_delete`] and [`failed_cleanup_is_retried`] by `controller` (running as
/// `identity`); fails as soon as the controller logs a refusal.
pub async fn rbac_scenarios(ns: &TestNamespace, identity: &str, controller: &Controller) {
    let class = ns.create_static_pvs("pv", 5, Reclaim::Retain).await.class;
    tokio::select! {
        _ = async {
            tokio::join!(
                scale_down_and_delete(ns, &class, identity),
                failed_cleanup_is_retried(ns, &class, identity),
            )
        } => {}
        _ = fail_on_refusal(controller) => {}
    }
}

/// The namespace-scoped token `kubeconfig` works in `home` (so a refusal below is RBAC, not a bad
/// token) and nowhere else: pods, StatefulSets and claims of `other` and of every namespace are
/// forbidden.
pub async fn assert_scoped_to(kubeconfig: &Path, home: &str, other: &str) {
    kubectl_ok(kubeconfig, &["get", "pods", "-n", home]).await;
    for resource in ["pods", "statefulsets", "pvc"] {
        expect_forbidden(kubeconfig, &["get", resource, "-n", other]).await;
        expect_forbidden(kubeconfig, &["get", resource, "--all-namespaces"]).await;
    }
}

/// StatefulSet `web` 3 -> 2 in `ns`: the finalizer lands, cleanup pod web-2 runs, claim data-web-2
/// and the pod go, claims 0 and 1 stay; the Events name `identity`. Then the set is deleted with
/// background propagation: the controller deletes the stateful pods, cleans both ordinals and
/// releases its finalizer.
pub async fn scale_down_and_delete(ns: &TestNamespace, class: &str, identity: &str) {
    let sets: Api<StatefulSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    create_running(ns, stateful_set("web", 3, class, json!({}))).await;
    let uid = |name: &'static str| {
        let claims = claims.clone();
        async move { claims.get(name).await.expect("claim").uid() }
    };
    let kept = [uid("data-web-0").await, uid("data-web-1").await];

    scale(ns, "web", 2).await;
    let cleanup = super::wait_for_some("cleanup pod web-2 (pods create)", LONG, || async {
        pods.get_opt("web-2")
            .await
            .ok()
            .flatten()
            .filter(|p| p.annotations().contains_key(OWNER))
    })
    .await;
    assert_eq!(
        cleanup.labels().get("scaledown-pod").map(String::as_str),
        Some("web-2")
    );
    wait_for_gone(&claims, "data-web-2", LONG).await;
    wait_for_gone(&pods, "web-2", LONG).await;
    assert_eq!(
        [uid("data-web-0").await, uid("data-web-1").await],
        kept,
        "claims 0 and 1 are kept"
    );
    wait_events(
        ns,
        "web",
        identity,
        &["SuccessfulCreate", "CleanupSuccess", "SuccessfulDelete"],
    )
    .await;

    // Background deletion: the set stays (our finalizer) until the controller has deleted web-1
    // and web-0 itself, cleaned both ordinals and released the finalizer.
    let mut stateful_uids = Vec::new();
    for name in ["web-0", "web-1"] {
        stateful_uids.push(pods.get(name).await.expect("stateful pod").uid());
    }
    sets.delete("web", &DeleteParams::background())
        .await
        .expect("delete web");
    wait_for_gone(&sets, "web", LONG).await;
    for name in ["data-web-0", "data-web-1"] {
        wait_for_gone(&claims, name, LONG).await;
    }
    let left = pods.list(&ListParams::default()).await.expect("list pods");
    assert!(
        left.items
            .iter()
            .all(|p| !p.name_any().starts_with("web-") || p.metadata.deletion_timestamp.is_some()),
        "pods of web left: {:?}",
        left.items.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    // The stateful pods were deleted by this controller (pods delete), as its Events say.
    let events: Api<Event> = ns.api();
    let deleted_by_us: Vec<Option<String>> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(identity))
        .filter(|e| e.reason.as_deref() == Some("SuccessfulDelete"))
        .filter_map(|e| e.related.map(|r| r.uid))
        .collect();
    for uid in stateful_uids {
        assert!(
            deleted_by_us.contains(&uid),
            "no SuccessfulDelete Event from {identity} for stateful pod {uid:?}: {deleted_by_us:?}"
        );
    }
}

/// StatefulSet `flaky` 2 -> 1 with a cleanup that always fails: the controller deletes the failed
/// pod, marks the claim with the next attempt (persistentvolumeclaims patch), runs attempt 2
/// (`--cleanup-attempts 2`), gives up and keeps the claim and the failed pod.
pub async fn failed_cleanup_is_retried(ns: &TestNamespace, class: &str, identity: &str) {
    let pods: Api<Pod> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let failing = json!({"sim.scaledown.io/outcome": "Failed"});
    create_running(ns, stateful_set("flaky", 2, class, failing)).await;
    scale(ns, "flaky", 1).await;
    wait_events(
        ns,
        "flaky",
        identity,
        &["CleanupFailed", "CleanupRetry", "CleanupGaveUp"],
    )
    .await;
    let pod = pods.get("flaky-1").await.expect("failed cleanup pod kept");
    assert_eq!(
        pod.annotations().get(ATTEMPT).map(String::as_str),
        Some("2"),
        "the pod kept after giving up is attempt 2"
    );
    assert!(
        claims
            .get_opt("data-flaky-1")
            .await
            .expect("get claim")
            .is_some(),
        "the claim of a failed cleanup is kept"
    );
}

/// The Lease in `namespace` is held by `identity`.
pub async fn assert_lease_held(cluster: &Cluster, namespace: &str, identity: &str) {
    assert_lease_held_named(cluster, namespace, LEASE, identity).await;
}

/// Lease `lease` in `namespace` is held by `identity`.
pub async fn assert_lease_held_named(
    cluster: &Cluster,
    namespace: &str,
    lease: &str,
    identity: &str,
) {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), namespace);
    let holder = leases
        .get_opt(lease)
        .await
        .expect("get lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity);
    assert_eq!(
        holder.as_deref(),
        Some(identity),
        "Lease {namespace}/{lease} should be held by the controller started with --leader-elect"
    );
}

/// A second `kubectl apply -n namespace -f file` changes nothing. kubectl always sends the
/// PodDisruptionBudget's selector (its patch strategy is "replace") and so reports it
/// "configured"; for it, the object's generation must stay the same instead.
pub async fn assert_reapply_changes_nothing(kubeconfig: &Path, namespace: &str, file: &str) {
    let generations = || async {
        kubectl_ok(
            kubeconfig,
            &[
                "get",
                "pdb",
                "-n",
                namespace,
                "-o",
                "jsonpath={.items[*].metadata.generation}",
            ],
        )
        .await
    };
    let before = generations().await;
    let again = kubectl_ok(kubeconfig, &["apply", "-n", namespace, "-f", file]).await;
    assert!(
        again.lines().all(|l| l.ends_with(" unchanged")
            || (l.starts_with("poddisruptionbudget.policy/") && l.ends_with(" configured"))),
        "a second apply changes nothing:\n{again}"
    );
    assert_eq!(
        generations().await,
        before,
        "the PodDisruptionBudget changed on re-apply"
    );
}
