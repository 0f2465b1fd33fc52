//! The deployment manifests (`artifacts/*.yaml`) on the real API server: they pass a server-side dry
//! run and apply cleanly, their pods are admitted under the `restricted` Pod Security profile, and
//! their RBAC is enough for the controller binary, run on the host with nothing but a TokenRequest
//! token of the manifest's ServiceAccount, to do its work: a scale-down, a failed cleanup that is
//! retried, a deletion with background propagation, and holding the leader Lease. Any refusal in
//! the controller's log fails the test at once. Per namespace, the token must also be refused
//! everywhere else.
//!
//! Only `cluster_scoped_manifest_installs_and_its_rbac_suffices` touches the fixed namespace
//! `statefulset-scaledown-controller` and the cluster-scoped objects; it deletes them at the end.
//! Its controller watches all namespaces, so the tests that run a controller take turns.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde::Deserialize;
use serde_json::{Value, json};
use support::fixtures::Controller;
use support::{Cluster, Reclaim, TestNamespace, from_json, wait_for, wait_for_gone};

const INSTALL_NS: &str = "statefulset-scaledown-controller";
const SERVICE_ACCOUNT: &str = "statefulset-scaledown-controller";
const LEASE: &str = "statefulset-scaledown-controller";
const APP_LABEL: &str = "app.kubernetes.io/name=statefulset-scaledown-controller";
const FINALIZER: &str = "statefulsets.kubernetes.io/scaledown";
const OWNER: &str = "statefulsets.kubernetes.io/scaledown-pod-owner";
const ATTEMPT: &str = "statefulsets.kubernetes.io/scaledown-attempt";
const LONG: Duration = Duration::from_secs(90);

/// Held by every test that runs a controller. The cluster-wide one would otherwise also act on the
/// StatefulSet of the per-namespace test, and that test could no longer tell who did the work.
static CONTROLLER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifest(name: &str) -> PathBuf {
    repo().join("artifacts").join(name)
}

fn manifest_str(name: &str) -> String {
    manifest(name).to_string_lossy().into_owned()
}

// === kubectl ===

/// Runs kubectl with `kubeconfig`; returns the output whatever the status.
async fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run kubectl {args:?}: {e}"))
}

/// Writes `content` to `target/e2e-tmp/<name>` (for `kubectl -f`) and returns the path.
fn scratch_file(name: &str, content: &str) -> String {
    let dir = repo().join("target/e2e-tmp");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write scratch file");
    path.to_string_lossy().into_owned()
}

/// Like [`kubectl_with`], but the command must succeed and print no warning; returns stdout.
async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
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
async fn expect_forbidden(kubeconfig: &Path, args: &[&str]) {
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
fn yaml_objects(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("manifest is valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn read_manifest(name: &str) -> Vec<Value> {
    let path = manifest(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    yaml_objects(&text)
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifest"))
}

/// Every `image` value anywhere in `value`.
fn images(value: &Value, out: &mut Vec<String>) {
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
fn non_compliant_pod(namespace: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "psa-probe", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    })
    .to_string()
}

/// The restricted profile really is enforced in `namespace`: a non-compliant pod is refused.
async fn assert_restricted_enforced(cluster: &Cluster, namespace: &str) {
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
async fn wait_deployment_ready(cluster: &Cluster, namespace: &str) {
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
                .get_opt(SERVICE_ACCOUNT)
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
async fn token_kubeconfig(cluster: &Cluster, namespace: &str) -> PathBuf {
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            namespace,
            "--duration=1h",
        ])
        .await;
    let token = token.trim();
    assert!(!token.is_empty(), "kubectl create token printed nothing");
    let admin = Kubeconfig::read_from(&cluster.kubeconfig).expect("read the admin kubeconfig");
    let context = admin
        .current_context
        .as_deref()
        .and_then(|c| admin.contexts.iter().find(|n| n.name == c))
        .and_then(|n| n.context.as_ref())
        .map(|c| c.cluster.clone());
    let entry = admin
        .clusters
        .iter()
        .find(|c| context.as_deref().is_none_or(|name| c.name == name))
        .and_then(|c| c.cluster.as_ref())
        .expect("a cluster in the admin kubeconfig");
    let mut cluster_json = json!({"server": entry.server.as_deref().expect("server")});
    if let Some(ca) = &entry.certificate_authority {
        cluster_json["certificate-authority"] = json!(ca);
    }
    if let Some(ca) = &entry.certificate_authority_data {
        cluster_json["certificate-authority-data"] = json!(ca);
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster_json}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": SERVICE_ACCOUNT, "namespace": namespace}}],
        "current-context": "sa",
    });
    let dir = repo().join("target/e2e-tokens");
    std::fs::create_dir_all(&dir).expect("token dir");
    let path = dir.join(format!("{namespace}.kubeconfig"));
    std::fs::write(&path, config.to_string()).expect("write the token kubeconfig");
    path
}

// === the controller binary, run with the manifest's token ===

/// Starts the binary with `kubeconfig`; `identity` becomes POD_NAME (Lease holder, Event reporting
/// instance), `pod_namespace` POD_NAMESPACE.
fn start_controller(
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
fn forbidden_lines(controller: &Controller) -> Vec<String> {
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
async fn fail_on_refusal(controller: &Controller) {
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
struct SetSweep {
    kubeconfig: PathBuf,
    namespace: String,
}

impl Drop for SetSweep {
    fn drop(&mut self) {
        let kubectl = |args: &[&str]| {
            std::process::Command::new(support::kubectl_binary())
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
struct ClusterScopedInstall {
    kubeconfig: PathBuf,
}

impl Drop for ClusterScopedInstall {
    fn drop(&mut self) {
        if std::env::var_os("SCALEDOWN_E2E_KEEP").is_some_and(|v| v == "1") {
            eprintln!("e2e: SCALEDOWN_E2E_KEEP=1, keeping the cluster-scoped install");
            return;
        }
        let _ = std::process::Command::new(support::kubectl_binary())
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
fn stateful_set(name: &str, replicas: i32, class: &str, cleanup_labels: Value) -> StatefulSet {
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
async fn create_running(ns: &TestNamespace, set: StatefulSet) {
    let sets: Api<StatefulSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    let name = set.name_any();
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    sets.create(&PostParams::default(), &set)
        .await
        .unwrap_or_else(|e| panic!("create statefulset {name}: {e}"));
    for n in 0..replicas {
        support::wait_for_pod_phase(&pods, &format!("{name}-{n}"), "Running", LONG).await;
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

async fn scale(ns: &TestNamespace, name: &str, replicas: i32) {
    let sets: Api<StatefulSet> = ns.api();
    let patch = json!({"spec": {"replicas": replicas}});
    sets.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("scale {name} to {replicas}: {e}"));
}

/// Reasons of the Events on StatefulSet `set` that the controller with `identity` published.
async fn event_reasons(ns: &TestNamespace, set: &str, identity: &str) -> Vec<String> {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(set))
        .filter(|e| e.reporting_controller.as_deref() == Some("statefulset-scaledown-controller"))
        .filter(|e| e.reporting_instance.as_deref() == Some(identity))
        .filter_map(|e| e.reason)
        .collect()
}

async fn wait_events(ns: &TestNamespace, set: &str, identity: &str, reasons: &[&str]) {
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

/// StatefulSet `web` 3 -> 2 in `ns`: the finalizer lands, cleanup pod web-2 runs, claim data-web-2
/// and the pod go, claims 0 and 1 stay; the Events name `identity`. Then the set is deleted with
/// background propagation: the controller deletes the stateful pods, cleans both ordinals and
/// releases its finalizer.
async fn scale_down_and_delete(ns: &TestNamespace, class: &str, identity: &str) {
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
    let cleanup = support::wait_for_some("cleanup pod web-2 (pods create)", LONG, || async {
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
async fn failed_cleanup_is_retried(ns: &TestNamespace, class: &str, identity: &str) {
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
async fn assert_lease_held(cluster: &Cluster, namespace: &str, identity: &str) {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), namespace);
    let holder = leases
        .get_opt(LEASE)
        .await
        .expect("get lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity);
    assert_eq!(
        holder.as_deref(),
        Some(identity),
        "Lease {namespace}/{LEASE} should be held by the controller started with --leader-elect"
    );
}

// === tests ===

/// Static checks: both files parse, use rbac/v1, grant the same rules, and differ only where the
/// mode needs it.
#[test]
fn manifests_grant_the_same_rules_in_both_modes() {
    let cluster = read_manifest("cluster-scoped.yaml");
    let local = read_manifest("per-namespace.yaml");
    for o in cluster.iter().chain(&local) {
        let api = o["apiVersion"].as_str().unwrap_or_default();
        if api.starts_with("rbac.authorization.k8s.io") {
            assert_eq!(api, "rbac.authorization.k8s.io/v1", "{}", o["kind"]);
        }
    }
    assert_eq!(
        object(&cluster, "ClusterRole", SERVICE_ACCOUNT)["rules"],
        object(&local, "Role", SERVICE_ACCOUNT)["rules"],
        "the per-namespace Role grants what the ClusterRole grants"
    );
    let lease_role = "statefulset-scaledown-controller-leader-election";
    assert_eq!(
        object(&cluster, "Role", lease_role)["rules"],
        object(&local, "Role", lease_role)["rules"]
    );
    for o in &local {
        assert!(
            o["metadata"].get("namespace").is_none(),
            "per-namespace.yaml: {} {} names a namespace",
            o["kind"],
            o["metadata"]["name"]
        );
        assert!(
            !matches!(
                o["kind"].as_str(),
                Some("Namespace" | "ClusterRole" | "ClusterRoleBinding")
            ),
            "per-namespace.yaml holds a cluster-scoped {}",
            o["kind"]
        );
        for s in o["subjects"].as_array().into_iter().flatten() {
            assert!(
                s.get("namespace").is_none(),
                "subject with a namespace: {s}"
            );
        }
    }
    let args = |objects: &[Value]| -> Vec<String> {
        object(objects, "Deployment", SERVICE_ACCOUNT)["spec"]["template"]["spec"]["containers"][0]
            ["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect()
    };
    assert_eq!(
        args(&cluster),
        ["--leader-elect", "--log-format=json"],
        "cluster-scoped args"
    );
    assert_eq!(
        args(&local),
        ["--localOnly", "--leader-elect", "--log-format=json"],
        "per-namespace args"
    );
}

/// Every image in artifacts/*.yaml is the Makefile's `IMAGE`.
#[test]
fn manifest_images_match_the_makefile() {
    let makefile = std::fs::read_to_string(repo().join("Makefile")).expect("read Makefile");
    let image = makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE ?= "))
        .map(str::trim)
        .expect("the Makefile has a line `IMAGE ?= <image>`");
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("artifacts"))
        .expect("artifacts/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "manifests in artifacts/: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let mut found = Vec::new();
        for o in yaml_objects(&text) {
            images(&o, &mut found);
        }
        assert!(!found.is_empty(), "{}: no image", file.display());
        for i in found {
            assert_eq!(
                i,
                image,
                "{}: image differs from the Makefile",
                file.display()
            );
        }
    }
}

/// per-namespace.yaml: server-side dry run, apply, re-apply unchanged, pods admitted under the
/// restricted profile (the test labels its namespace as a cautious user would).
#[tokio::test(flavor = "multi_thread")]
async fn per_namespace_manifest_applies_and_is_admitted() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("deploy-per-namespace").await;
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &ns.name,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ])
        .await;
    assert_restricted_enforced(&cluster, &ns.name).await;
    let file = manifest_str("per-namespace.yaml");
    let kc = &cluster.kubeconfig;
    kubectl_ok(
        kc,
        &["apply", "--dry-run=server", "-n", &ns.name, "-f", &file],
    )
    .await;
    let applied = kubectl_ok(kc, &["apply", "-n", &ns.name, "-f", &file]).await;
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        7,
        "7 objects created:\n{applied}"
    );
    wait_deployment_ready(&cluster, &ns.name).await;
    let again = kubectl_ok(kc, &["apply", "-n", &ns.name, "-f", &file]).await;
    assert!(
        again.lines().all(|l| l.ends_with(" unchanged")),
        "a second apply changes nothing:\n{again}"
    );
}

/// cluster-scoped.yaml: dry run, apply, pods admitted in the restricted namespace; then the
/// controller binary, with only the ServiceAccount's token, manages a scale-down and a deletion
/// in another namespace (cluster-wide watches) and holds its Lease. The install is deleted at
/// the end.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_manifest_installs_and_its_rbac_suffices() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let file = manifest_str("cluster-scoped.yaml");
    // A previous run that was interrupted may have left the install (or its namespace Terminating).
    kubectl_ok(
        &kc,
        &[
            "delete",
            "-f",
            &file,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    let _install = ClusterScopedInstall {
        kubeconfig: kc.clone(),
    };

    // A server-side dry run of namespaced objects needs their namespace to exist: apply the
    // manifest's own Namespace first, then dry-run everything, then apply everything.
    let objects = read_manifest("cluster-scoped.yaml");
    let namespace = scratch_file(
        "install-namespace.json",
        &object(&objects, "Namespace", INSTALL_NS).to_string(),
    );
    kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &namespace]).await;
    kubectl_ok(&kc, &["apply", "-f", &namespace]).await;
    kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &file]).await;
    let applied = kubectl_ok(&kc, &["apply", "-f", &file]).await;
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        7,
        "7 objects created besides the namespace:\n{applied}"
    );
    assert_restricted_enforced(&cluster, INSTALL_NS).await;
    wait_deployment_ready(&cluster, INSTALL_NS).await;

    let token = token_kubeconfig(&cluster, INSTALL_NS).await;
    let ns = cluster.namespace("deploy-cluster-rbac").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: ns.name.clone(),
    };
    let identity = format!("e2e-{}", ns.name);
    let mut controller = start_controller(
        &token,
        &identity,
        INSTALL_NS,
        &["--leader-elect", "--leader-election-namespace", INSTALL_NS],
    );
    let class = ns.create_static_pvs("pv", 5, Reclaim::Retain).await.class;
    tokio::select! {
        _ = async {
            tokio::join!(
                scale_down_and_delete(&ns, &class, &identity),
                failed_cleanup_is_retried(&ns, &class, &identity),
            )
        } => {}
        _ = fail_on_refusal(&controller) => {}
    }
    controller.assert_alive();
    let forbidden = forbidden_lines(&controller);
    assert!(
        forbidden.is_empty(),
        "the controller was refused with the ClusterRole's rights:\n{}",
        forbidden.join("\n")
    );
    assert_lease_held(&cluster, INSTALL_NS, &identity).await;
}

/// per-namespace.yaml in namespace A: the binary with `--localOnly` and only the ServiceAccount's
/// token manages a scale-down and a deletion in A, keeps running without cluster-wide rights, and
/// the token is refused in namespace B and at the cluster scope.
#[tokio::test(flavor = "multi_thread")]
async fn per_namespace_rbac_suffices_and_stays_in_its_namespace() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let a = cluster.namespace("deploy-ns-a").await;
    let b = cluster.namespace("deploy-ns-b").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: a.name.clone(),
    };
    kubectl_ok(
        &kc,
        &[
            "apply",
            "-n",
            &a.name,
            "-f",
            &manifest_str("per-namespace.yaml"),
        ],
    )
    .await;
    let token = token_kubeconfig(&cluster, &a.name).await;
    let identity = format!("e2e-{}", a.name);
    let mut controller = start_controller(
        &token,
        &identity,
        &a.name,
        &[
            "--localOnly",
            "--leader-elect",
            "--leader-election-namespace",
            &a.name,
        ],
    );

    // The token works in A (so a refusal below is RBAC, not a bad token) ...
    kubectl_ok(&token, &["get", "pods", "-n", &a.name]).await;
    // ... and nowhere else.
    for resource in ["pods", "statefulsets", "pvc"] {
        expect_forbidden(&token, &["get", resource, "-n", &b.name]).await;
        expect_forbidden(&token, &["get", resource, "--all-namespaces"]).await;
    }

    let class = a.create_static_pvs("pv", 5, Reclaim::Retain).await.class;
    tokio::select! {
        _ = async {
            tokio::join!(
                scale_down_and_delete(&a, &class, &identity),
                failed_cleanup_is_retried(&a, &class, &identity),
            )
        } => {}
        _ = fail_on_refusal(&controller) => {}
    }

    // No crash loop for lack of cluster-wide rights: still alive after 10 s, no refusal logged.
    let settle = Duration::from_secs(10).saturating_sub(controller.started.elapsed());
    tokio::time::sleep(settle).await;
    controller.assert_alive();
    let forbidden = forbidden_lines(&controller);
    assert!(
        forbidden.is_empty(),
        "the --localOnly controller was refused (cluster-scope request?):\n{}",
        forbidden.join("\n")
    );
    let log = controller.log_text();
    assert!(
        !log.contains("cluster scope"),
        "cluster-scope requests in the log:\n{log}"
    );
    assert_lease_held(&cluster, &a.name, &identity).await;
}
