//! The controller's own image (`make image`), started in the cluster by what users run: `helm
//! install` of the chart, `kubectl apply -f artifacts/per-namespace.yaml` and `kubectl apply -f
//! artifacts/cluster-scoped.yaml`. The pods run on the real node (`hack/real-node.sh`: kubelet and
//! containerd); the test adds only what placing them there needs (a toleration of the node's taint
//! and its nodeSelector, as chart values or an edit of the manifest's Deployment), after pushing
//! the image to the node's registry (`hack/real-node.sh push-image`).
//!
//! Each test checks that the pods are admitted in a namespace that enforces the `restricted` Pod
//! Security profile, run the pushed image on the real node under containerd and become Ready
//! through their probes (the kubelet's Ready condition); that one of them takes the Lease; and
//! that the controller serves a scale-down 3 -> 2 of a StatefulSet whose pods and cleanup pod also
//! run on the real node, in a `restricted` namespace too (cleanup pod Succeeded, claim deleted),
//! with Events only from Lease holders. Failover: the leading pod is deleted; the Lease moves (to
//! the standby or, usually first, to the Deployment's replacement pod) and the next scale-down
//! (2 -> 1) is served by another pod. With Helm also a drain of the leader's node (cordoned, the
//! leader evicted): the standby alone must take over, and serves 1 -> 0. Uninstall as docs/operations.md
//! says (the template annotation off, the controller releases its finalizer, then `helm
//! uninstall` or `kubectl delete -f`) leaves no finalizer, cleanup pod or controller pod behind,
//! and no Lease (the install brings it and takes it away). A controller container that restarts is reported (its previous log
//! saved), not failed.
//!
//! Measured, printed and recorded (target/e2e-measurements.txt): controller pod created -> Ready,
//! and each failover (leading pod gone -> another pod holds the Lease -> next scale-down served).
//! Controller logs: target/e2e-logs/incluster-<pod>.log.
//!
//! An in-cluster controller with cluster scope acts on every namespace: run this file alone, after
//! the other e2e tests, one test at a time (`--test-threads=1`; the tests also take turns on a
//! lock of their own). Fixed names (the Helm release's namespace, the cluster-scoped manifest's
//! objects) are swept at the start of every test, in case an interrupted run left them, and at its
//! end (a guard's `Drop`).
//!
//! `hack/with-cluster.sh cargo test --test e2e_incluster -- --nocapture --test-threads=1`, after
//! `make image`.

mod support;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::deploy::{
    FINALIZER, OWNER, assert_restricted_enforced, kubectl_ok, manifest_str, read_manifest, scale,
    scratch_file,
};
use support::fixtures::record;
use support::recorder::{self, Recorder};
use support::{
    Cluster, REAL_NODE, TestNamespace, from_json, real_node_ready, real_node_selector,
    real_node_skipped, real_node_toleration, repo_dir, wait_for, wait_for_gone, wait_for_pod_phase,
};

const CHART: &str = "charts/statefulset-scaledown-controller";
/// The Helm release and its namespace (created by the test, labelled `restricted`).
const RELEASE: &str = "incluster";
const HELM_NS: &str = "incluster-helm";
/// The chart's full name for [`RELEASE`]: Deployment, ServiceAccount, Lease.
const HELM_NAME: &str = "incluster-statefulset-scaledown-controller";
/// Name of the objects of artifacts/*.yaml, the cluster-scoped one's namespace and their Lease.
const MANIFEST_NAME: &str = "statefulset-scaledown-controller";
/// Label on every namespace these tests create, so a later run finds what an interrupted one left.
const MARK: &str = "scaledown.e2e/incluster";
const SET: &str = "web";
const SLOW: Duration = Duration::from_secs(180);

/// The tests take turns even if the harness runs them in parallel: each installs a controller.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// === the image on the real node ===

/// Pushes target/image/oci (`make image`) to the real node's registry under [`image`], once per
/// run; returns the image's manifest digest (target/image/digest).
fn push_image() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        let layout = repo_dir().join("target/image/oci");
        assert!(
            layout.join("index.json").exists(),
            "no image layout at {}: run `make image` first",
            layout.display()
        );
        let started = Instant::now();
        let out = std::process::Command::new(repo_dir().join("hack/real-node.sh"))
            .arg("push-image")
            .arg(&layout)
            .arg(support::makefile_image())
            .output()
            .expect("run hack/real-node.sh push-image");
        assert!(
            out.status.success(),
            "hack/real-node.sh push-image failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let digest = std::fs::read_to_string(repo_dir().join("target/image/digest"))
            .expect("target/image/digest (make image writes it)")
            .trim()
            .to_string();
        eprintln!(
            "e2e_incluster: pushed {} ({digest}) to the node's registry in {} ms",
            support::makefile_image(),
            started.elapsed().as_millis()
        );
        digest
    })
}

/// Connects, checks the real node is Ready (or returns `None` where it is absent on purpose) and
/// pushes the image.
async fn prepare() -> Option<(Cluster, &'static str)> {
    let cluster = Cluster::connect().await;
    if !real_node_ready(&cluster.client).await {
        if let Some(why) = real_node_skipped() {
            eprintln!("e2e_incluster: SKIPPED, no real node in this cluster: {why}");
            return None;
        }
        panic!("e2e: node {REAL_NODE} is not Ready (hack/real-node.sh status)");
    }
    let digest = tokio::task::spawn_blocking(push_image)
        .await
        .expect("push the image");
    Some((cluster, digest))
}

// === installs ===

/// One install of the controller: its namespace, Deployment pods and Lease.
struct Install {
    mode: &'static str,
    namespace: String,
    lease: String,
    /// Label selector of its pods.
    selector: String,
}

/// What a test sees of an install from before it starts: its pods and its Lease.
struct Watches {
    pods: Recorder<Pod>,
    leases: Recorder<Lease>,
}

impl Install {
    fn pods(&self, cluster: &Cluster) -> Api<Pod> {
        Api::namespaced(cluster.client.clone(), &self.namespace)
    }

    /// Watches its pods and Leases (start them before the install: they time created -> Ready,
    /// and know every holder of the Lease).
    async fn watch(&self, cluster: &Cluster) -> Watches {
        let config = watcher::Config::default().labels(&self.selector);
        let leases = Api::namespaced(cluster.client.clone(), &self.namespace);
        Watches {
            pods: Recorder::start(self.pods(cluster), config).await,
            leases: Recorder::start(leases, watcher::Config::default()).await,
        }
    }
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

impl Watches {
    /// Every identity seen holding the install's Lease so far.
    fn holders(&self, install: &Install) -> BTreeSet<String> {
        self.leases
            .of(&install.lease)
            .iter()
            .filter_map(|s| holder(&s.object))
            .collect()
    }
}

fn selector(instance: &str) -> String {
    format!("app.kubernetes.io/name={MANIFEST_NAME},app.kubernetes.io/instance={instance}")
}

/// The Helm values the real node needs, nothing else.
fn real_node_values() -> Value {
    json!({"tolerations": [real_node_toleration()], "nodeSelector": real_node_selector()})
}

/// A manifest of artifacts/ with its Deployment's pods placed on the real node (the toleration and
/// nodeSelector added, nothing else changed), as a kubectl List in target/e2e-tmp/.
fn manifest_on_real_node(name: &str) -> String {
    let mut objects = read_manifest(name);
    let deployment = objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment in the manifest");
    let pod = deployment["spec"]["template"]["spec"]
        .as_object_mut()
        .expect("pod spec");
    assert!(
        !pod.contains_key("tolerations") && !pod.contains_key("nodeSelector"),
        "{name}: the Deployment already places its pods"
    );
    pod.insert("tolerations".into(), json!([real_node_toleration()]));
    pod.insert("nodeSelector".into(), real_node_selector());
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    scratch_file(&format!("incluster-{name}.json"), &list.to_string())
}

/// Runs helm (the pinned one, target/cluster/bin/helm) against the cluster; panics unless it
/// succeeds; returns its stdout.
async fn helm_ok(cluster: &Cluster, args: &[&str]) -> String {
    let helm = support::cluster_state_dir().join("bin/helm");
    assert!(
        helm.exists(),
        "no {}: `hack/cluster.sh up` links the pinned Helm there (hack/build-tools.sh helm)",
        helm.display()
    );
    let out = tokio::process::Command::new(helm)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(args)
        .output()
        .await
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace for the Helm release, enforcing the `restricted` profile.
async fn create_restricted_namespace(cluster: &Cluster, name: &str) {
    let file = scratch_file(
        &format!("incluster-ns-{name}.json"),
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
            MARK: "true",
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/warn": "restricted"}}})
        .to_string(),
    );
    kubectl_ok(&cluster.kubeconfig, &["apply", "-f", &file]).await;
}

/// Labels a test namespace so that a later run's sweep finds it, and makes it enforce the
/// `restricted` profile.
async fn mark_restricted(cluster: &Cluster, ns: &TestNamespace) {
    let mark = format!("{MARK}=true");
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &ns.name,
            &mark,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ])
        .await;
}

// === sweeping ===

/// Removes every install these tests make and releases the StatefulSets of their namespaces:
/// `helm uninstall`, `kubectl delete -f artifacts/cluster-scoped.yaml`, then in every namespace
/// labelled [`MARK`] the sets lose the template annotation and our finalizer (so neither a
/// controller still stopping nor a missing one keeps them), and the namespaces are deleted. Blocking
/// (for `Drop`); with `wait`, waits until the fixed namespaces are gone.
fn sweep(kubeconfig: &std::path::Path, wait: bool) {
    let kubectl = |args: &[&str]| {
        std::process::Command::new(support::kubectl_binary())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout", "30s"])
            .args(args)
            .output()
    };
    let stdout = |out: std::io::Result<std::process::Output>| {
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let _ = std::process::Command::new(support::cluster_state_dir().join("bin/helm"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["uninstall", RELEASE, "-n", HELM_NS, "--ignore-not-found"])
        .output();
    uncordon(kubeconfig);
    let wait_flag = format!("--wait={wait}");
    let manifest = manifest_str("cluster-scoped.yaml");
    let _ = kubectl(&["delete", "-f", &manifest, "--ignore-not-found", &wait_flag]);
    let namespaces = stdout(kubectl(&["get", "namespaces", "-l", MARK, "-o", "name"]));
    let release = r#"{"metadata":{"finalizers":null,"annotations":{"statefulsets.kubernetes.io/scaledown-pod-template":null}}}"#;
    for namespace in namespaces
        .lines()
        .filter_map(|n| n.strip_prefix("namespace/"))
    {
        let sets = stdout(kubectl(&[
            "get",
            "statefulsets",
            "-n",
            namespace,
            "-o",
            "name",
        ]));
        for set in sets.lines().filter(|s| !s.is_empty()) {
            let _ = kubectl(&["patch", "-n", namespace, set, "--type=merge", "-p", release]);
        }
        let _ = kubectl(&["delete", "namespace", namespace, "--wait=false"]);
    }
    let _ = kubectl(&[
        "delete",
        "namespace",
        HELM_NS,
        MANIFEST_NAME,
        "--ignore-not-found",
        &wait_flag,
        "--timeout=180s",
    ]);
}

/// Sweeps when dropped (end of a test, passed or failed), before the test's namespace is deleted.
struct Sweep(PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        if std::env::var_os("SCALEDOWN_E2E_KEEP").is_some_and(|v| v == "1") {
            eprintln!("e2e_incluster: SCALEDOWN_E2E_KEEP=1, keeping the installs");
            return;
        }
        sweep(&self.0, false);
    }
}

/// Sweeps what an interrupted run left, and returns the guard that sweeps at the end.
async fn sweep_now(cluster: &Cluster) -> Sweep {
    let kubeconfig = cluster.kubeconfig.clone();
    let again = kubeconfig.clone();
    tokio::task::spawn_blocking(move || sweep(&again, true))
        .await
        .expect("sweep");
    Sweep(kubeconfig)
}

// === the controller's pods ===

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the install has `n` pods, none terminating, all Ready; returns them.
async fn wait_ready(cluster: &Cluster, install: &Install, n: usize) -> Vec<Pod> {
    let pods = install.pods(cluster);
    let ready = support::wait_for_some(
        &format!("{n} Ready controller pods in {}", install.namespace),
        SLOW,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&install.selector))
                .await
                .ok()?
                .items;
            let live: Vec<Pod> = list
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (live.len() == n && live.iter().all(is_ready)).then_some(live)
        },
    )
    .await;
    for pod in &ready {
        follow_logs(cluster, &install.namespace, &pod.name_any());
        note_restarts(cluster, &install.namespace, pod).await;
    }
    ready
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

/// Prints and records how often the install's controller containers restarted in the test.
fn report_restarts(install: &Install, seen: &Watches) {
    let mut most = std::collections::BTreeMap::new();
    for s in seen.pods.seen() {
        let n = most.entry(s.name.clone()).or_insert(0);
        *n = restarts(&s.object).max(*n);
    }
    let total: i32 = most.values().sum();
    eprintln!(
        "e2e_incluster: {}: controller container restarts: {total} {most:?}",
        install.mode
    );
    record(
        &format!("in-cluster {}: controller container restarts", install.mode),
        total.to_string(),
    );
}

/// A controller container that restarted: its previous log is saved to
/// target/e2e-logs/incluster-<pod>-previous-<n>.log and its last lines printed (a restart is not
/// a failure of the install, but it must be visible).
async fn note_restarts(cluster: &Cluster, namespace: &str, pod: &Pod) {
    static NOTED: std::sync::Mutex<BTreeSet<(String, i32)>> =
        std::sync::Mutex::new(BTreeSet::new());
    let (name, n) = (pod.name_any(), restarts(pod));
    let new = NOTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((name.clone(), n));
    if n == 0 || !new {
        return;
    }
    let out = support::deploy::kubectl_with(
        &cluster.kubeconfig,
        &["logs", "--previous", "-n", namespace, &name],
    )
    .await;
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let file = repo_dir().join(format!("target/e2e-logs/incluster-{name}-previous-{n}.log"));
    let _ = std::fs::write(&file, &log);
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains("\"DEBUG\"")).collect();
    eprintln!(
        "e2e_incluster: NOTE: controller container of {name} restarted ({n}x); previous log {}, its last lines:\n{}",
        file.display(),
        lines[lines.len().saturating_sub(4)..].join("\n")
    );
}

/// `kubectl logs -f` of a controller pod into target/e2e-logs/incluster-<pod>.log, once per pod;
/// it ends with the pod's container.
fn follow_logs(cluster: &Cluster, namespace: &str, pod: &str) {
    static FOLLOWED: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    if !FOLLOWED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pod.to_string())
    {
        return;
    }
    let dir = repo_dir().join("target/e2e-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    let log = std::fs::File::create(dir.join(format!("incluster-{pod}.log"))).expect("log file");
    let spawned = std::process::Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["logs", "-f", "-n", namespace, pod])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn();
    if let Err(e) = spawned {
        eprintln!("e2e_incluster: cannot follow the log of {pod}: {e}");
    }
}

/// The pod was admitted and runs the pushed image on the real node, under containerd, with the
/// chart's probes, and the kubelet found it Ready.
fn assert_runs_on_real_node(pod: &Pod, digest: &str) {
    let name = pod.name_any();
    assert_eq!(
        recorder::node(pod),
        Some(REAL_NODE),
        "{name} runs on the real node"
    );
    assert_eq!(recorder::phase(pod), "Running", "{name}");
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| h.path.clone().unwrap_or_default())
    };
    assert_eq!(
        probe(&container.readiness_probe).as_deref(),
        Some("/readyz")
    );
    assert_eq!(
        probe(&container.liveness_probe).as_deref(),
        Some("/healthz")
    );
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .unwrap_or_else(|| panic!("{name} has no container status"));
    assert!(status.ready, "{name}: container not ready");
    assert!(
        status
            .container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{name} runs under containerd (the real kubelet), not KWOK: {:?}",
        status.container_id
    );
    assert!(
        status.image_id.ends_with(&format!("@{digest}")),
        "{name} runs image {}, not the pushed {digest} (an older image of the tag cached on the node?)",
        status.image_id
    );
}

/// How long each of `pods` took from created (first seen by the watch) to Ready (first seen Ready),
/// printed and recorded.
fn report_ready(install: &Install, seen: &Watches, pods: &[String]) {
    for name in pods {
        let changes = seen.pods.of(name);
        let created = changes.first().expect("pod seen").at;
        let ready = changes
            .iter()
            .find(|s| is_ready(&s.object))
            .unwrap_or_else(|| panic!("{name} never seen Ready"))
            .at;
        let ms = ready.saturating_duration_since(created).as_millis();
        eprintln!(
            "e2e_incluster: {}: pod {name} created -> Ready: {ms} ms",
            install.mode
        );
        record(
            &format!(
                "in-cluster {}: controller pod created -> Ready",
                install.mode
            ),
            format!("{ms} ms"),
        );
    }
}

async fn lease_holder(cluster: &Cluster, install: &Install) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &install.namespace);
    let lease = leases.get_opt(&install.lease).await.ok().flatten()?;
    holder(&lease)
}

/// Waits until one of `candidates` holds the Lease; returns it.
async fn wait_leader(cluster: &Cluster, install: &Install, candidates: &[String]) -> String {
    support::wait_for_some(
        &format!("one of {candidates:?} to hold Lease {}", install.lease),
        Duration::from_secs(60),
        || async {
            lease_holder(cluster, install)
                .await
                .filter(|h| candidates.contains(h))
        },
    )
    .await
}

// === the walk-through ===

/// A pod spec for the real node that the `restricted` profile admits.
fn restricted_pod_spec(command: &str) -> Value {
    json!({
        "tolerations": [real_node_toleration()],
        "nodeSelector": real_node_selector(),
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "main", "image": "busybox", "command": ["sh", "-c", command],
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
        }]
    })
}

/// StatefulSet [`SET`] of 3 on the real node (claims on hostPath PVs of `class`), whose cleanup
/// pod also runs there and exits 0.
fn app_set(class: &str) -> StatefulSet {
    let mut cleanup =
        restricted_pod_spec("ls -la /data && echo cleaned ordinal $SCALEDOWN_ORDINAL");
    cleanup["restartPolicy"] = json!("Never");
    let template = json!({"metadata": {"labels": {"app": "web-cleanup"}}, "spec": cleanup});
    from_json(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": SET, "annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": template.to_string()}},
        "spec": {
            "replicas": 3, "serviceName": SET, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": SET}},
            "template": {"metadata": {"labels": {"app": SET}},
                         "spec": restricted_pod_spec("trap 'exit 0' TERM; sleep 100000 & wait")},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }))
}

/// Creates [`SET`] in `apps` and waits until its 3 pods run and the controller's finalizer is on it.
async fn create_app_set(apps: &TestNamespace) {
    let class = apps.create_real_pvs("real", 3).await.class;
    let sets: Api<StatefulSet> = apps.api();
    sets.create(&PostParams::default(), &app_set(&class))
        .await
        .expect("create the StatefulSet");
    for n in 0..3 {
        wait_for_pod_phase(&apps.api(), &format!("{SET}-{n}"), "Running", SLOW).await;
    }
    wait_for(&format!("our finalizer on {SET}"), SLOW, || async {
        sets.get_opt(SET)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.finalizers().iter().any(|f| f == FINALIZER))
    })
    .await;
}

/// Scales [`SET`] to `replicas`; waits until the controller ran the cleanup pod of ordinal
/// `replicas` on the real node (seen Succeeded) and deleted its claim and the pod. Returns the time
/// from the scale to the claim's deletion, and the controller pods that reported the cleanup's
/// creation and success (Events).
async fn scale_down_served(
    apps: &TestNamespace,
    pods: &Recorder<Pod>,
    replicas: i32,
) -> (Duration, BTreeSet<String>) {
    let claims: Api<PersistentVolumeClaim> = apps.api();
    let name = format!("{SET}-{replicas}");
    let started = Instant::now();
    scale(apps, SET, replicas).await;
    wait_for_gone(&claims, &format!("data-{name}"), SLOW).await;
    let served = started.elapsed();
    let succeeded = pods
        .first(|s| {
            s.name == name
                && s.annotations.contains_key(OWNER)
                && recorder::phase(&s.object) == "Succeeded"
        })
        .unwrap_or_else(|| panic!("cleanup pod {name} never seen Succeeded"));
    assert_eq!(
        recorder::node(&succeeded.object),
        Some(REAL_NODE),
        "cleanup pod {name} ran on the real node"
    );
    wait_for_gone(&apps.api::<Pod>(), &name, SLOW).await;
    let by = support::wait_for_some(
        &format!("our Events SuccessfulCreate and CleanupSuccess of {name}"),
        SLOW,
        || async {
            let events = our_events(apps).await;
            let of = |reason: &str| {
                events
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some(reason))
                    .filter(|e| {
                        e.note
                            .as_deref()
                            .is_some_and(|n| n.contains(&format!("cleanup pod {name} ")))
                    })
                    .filter_map(|e| e.reporting_instance.clone())
                    .collect::<BTreeSet<String>>()
            };
            let (created, succeeded) = (of("SuccessfulCreate"), of("CleanupSuccess"));
            (!created.is_empty() && !succeeded.is_empty())
                .then(|| created.union(&succeeded).cloned().collect())
        },
    )
    .await;
    (served, by)
}

/// Our controller's Events on [`SET`].
async fn our_events(apps: &TestNamespace) -> Vec<Event> {
    support::deploy::set_events(apps, SET).await
}

/// Only holders of the Lease wrote: every Event on [`SET`] came from an identity seen holding it.
async fn assert_only_holders_wrote(install: &Install, seen: &Watches, apps: &TestNamespace) {
    let holders = seen.holders(install);
    let writers: BTreeSet<String> = our_events(apps)
        .await
        .into_iter()
        .filter_map(|e| e.reporting_instance)
        .collect();
    assert!(
        !writers.is_empty() && writers.is_subset(&holders),
        "{}: Events from {writers:?}, Lease holders {holders:?}",
        install.mode
    );
}

// === scenario, failover, uninstall ===

/// After the install command: both pods Ready on the real node with the pushed image, one holds
/// the Lease and a Lease holder serves a scale-down 3 -> 2; then the leading pod is deleted, the
/// Lease moves to another pod, which serves 2 -> 1; the replacement pod becomes Ready. Returns the
/// leader at the end.
async fn exercise(
    cluster: &Cluster,
    install: &Install,
    apps: &TestNamespace,
    seen: &Watches,
    digest: &str,
) -> String {
    let ready = wait_ready(cluster, install, 2).await;
    for pod in &ready {
        assert_runs_on_real_node(pod, digest);
    }
    let names: Vec<String> = ready.iter().map(|p| p.name_any()).collect();
    report_ready(install, seen, &names);
    let leader = wait_leader(cluster, install, &names).await;
    eprintln!("e2e_incluster: {}: {leader} leads", install.mode);

    let app_pods = Recorder::start(apps.api::<Pod>(), watcher::Config::default()).await;
    create_app_set(apps).await;
    let (served, by) = scale_down_served(apps, &app_pods, 2).await;
    eprintln!(
        "e2e_incluster: {}: scale 3 -> 2 served by {by:?} (claim deleted) after {} ms",
        install.mode,
        served.as_millis()
    );
    assert_only_holders_wrote(install, seen, apps).await;

    // The leader now (a restart may have moved the Lease).
    let leader = wait_leader(cluster, install, &names).await;
    let pods = install.pods(cluster);
    let remove = async {
        pods.delete(&leader, &DeleteParams::default())
            .await
            .expect("delete the leading pod");
    };
    let takeover = take_over(cluster, install, seen, &leader, remove).await;
    let role = if names.contains(&takeover.holder) {
        "the standby"
    } else {
        "the replacement pod"
    };
    takeover.report(install, "leading pod deleted", role);
    let (served, by) = scale_down_served(apps, &app_pods, 1).await;
    assert!(!by.contains(&leader), "the deleted leader served 2 -> 1");
    takeover.report_served(install, "leading pod deleted", served, &by);
    assert_only_holders_wrote(install, seen, apps).await;

    let again = wait_ready(cluster, install, 2).await;
    for pod in &again {
        assert_runs_on_real_node(pod, digest);
    }
    let replacement: Vec<String> = again
        .iter()
        .map(|p| p.name_any())
        .filter(|n| !names.contains(n))
        .collect();
    report_ready(install, seen, &replacement);
    let names: Vec<String> = again.iter().map(|p| p.name_any()).collect();
    wait_leader(cluster, install, &names).await
}

/// A leadership change, timed from the removal of the leading pod.
struct Takeover {
    holder: String,
    started: Instant,
    released: Duration,
    taken: Duration,
}

impl Takeover {
    /// `what` happened to the leader; `role` (the standby, the replacement pod) took over.
    fn report(&self, install: &Install, what: &str, role: &str) {
        eprintln!(
            "e2e_incluster: {}: {what}, {role} took over ({}): Lease released after {} ms, held by it after {} ms",
            install.mode,
            self.holder,
            self.released.as_millis(),
            self.taken.as_millis()
        );
        record(
            &format!(
                "in-cluster {}: failover, {what} -> another pod holds the Lease",
                install.mode
            ),
            format!("{} ms ({role})", self.taken.as_millis()),
        );
    }

    fn report_served(
        &self,
        install: &Install,
        what: &str,
        scaled: Duration,
        by: &BTreeSet<String>,
    ) {
        let total = self.started.elapsed().as_millis();
        eprintln!(
            "e2e_incluster: {}: {what} -> next scale-down served by {by:?} (claim deleted) after {total} ms (scale -> claim deleted {} ms)",
            install.mode,
            scaled.as_millis()
        );
        record(
            &format!(
                "in-cluster {}: failover, {what} -> next scale-down served",
                install.mode
            ),
            format!("{total} ms"),
        );
    }
}

/// Runs `remove` (which makes the leading pod go) and waits until another pod holds the Lease and
/// the old one is gone. The old leader must have exited 0 if its end was seen (SIGTERM: release,
/// then exit).
async fn take_over(
    cluster: &Cluster,
    install: &Install,
    seen: &Watches,
    leader: &str,
    remove: impl Future<Output = ()>,
) -> Takeover {
    let mark = seen.leases.mark();
    let started = Instant::now();
    remove.await;
    let lease = |s: &recorder::Seen<Lease>| s.name == install.lease;
    let released = seen
        .leases
        .wait_for_since(mark, "the Lease to leave the leader", SLOW, |s| {
            lease(s) && holder(&s.object).as_deref() != Some(leader)
        })
        .await;
    let taken = seen
        .leases
        .wait_for_since(mark, "another pod to hold the Lease", SLOW, |s| {
            lease(s) && holder(&s.object).is_some_and(|h| h != leader)
        })
        .await;
    wait_for_gone(&install.pods(cluster), leader, SLOW).await;
    let exit = seen.pods.of(leader).iter().rev().find_map(|s| {
        let status = s.object.status.as_ref()?.container_statuses.as_ref()?;
        status
            .first()?
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    });
    eprintln!(
        "e2e_incluster: {}: the old leader {leader} exited with {exit:?}",
        install.mode
    );
    assert!(
        matches!(exit, None | Some(0)),
        "the old leader exited with {exit:?}"
    );
    Takeover {
        holder: holder(&taken.object).expect("holder"),
        started,
        released: released.at.saturating_duration_since(started),
        taken: taken.at.saturating_duration_since(started),
    }
}

/// A drain of the leader's node, the real node: cordoned (so no replacement pod can start), and
/// the leading pod evicted (the PodDisruptionBudget allows one). The standby must take over on its
/// own; once it holds the Lease the node is uncordoned (the cleanup pod needs it) and it serves
/// the next scale-down (1 -> 0).
async fn drain_leader(
    cluster: &Cluster,
    install: &Install,
    apps: &TestNamespace,
    seen: &Watches,
    leader: &str,
) {
    let app_pods = Recorder::start(apps.api::<Pod>(), watcher::Config::default()).await;
    let standby = wait_ready(cluster, install, 2)
        .await
        .into_iter()
        .map(|p| p.name_any())
        .find(|n| n != leader)
        .expect("a standby");
    let cordon = Cordon::new(cluster).await;
    let pods = install.pods(cluster);
    let remove = async {
        pods.evict(leader, &EvictParams::default())
            .await
            .expect("evict the leading pod");
    };
    let takeover = take_over(cluster, install, seen, leader, remove).await;
    drop(cordon);
    assert_eq!(takeover.holder, standby, "the standby took over");
    takeover.report(install, "leader's node drained", "the standby");
    let (served, by) = scale_down_served(apps, &app_pods, 0).await;
    assert!(!by.contains(leader), "the evicted leader served 1 -> 0");
    takeover.report_served(install, "leader's node drained", served, &by);
    assert_only_holders_wrote(install, seen, apps).await;
    wait_ready(cluster, install, 2).await;
}

/// The real node cordoned while it lives.
struct Cordon(PathBuf);

impl Cordon {
    async fn new(cluster: &Cluster) -> Cordon {
        cluster.kubectl(&["cordon", REAL_NODE]).await;
        Cordon(cluster.kubeconfig.clone())
    }
}

impl Drop for Cordon {
    fn drop(&mut self) {
        uncordon(&self.0);
    }
}

fn uncordon(kubeconfig: &std::path::Path) {
    let _ = std::process::Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["uncordon", REAL_NODE])
        .output();
}

/// docs/operations.md "Uninstall", first step: the template annotation off [`SET`]; the running controller
/// then releases its finalizer.
async fn release_set(apps: &TestNamespace) {
    let sets: Api<StatefulSet> = apps.api();
    let patch = json!({"metadata": {"annotations": {
        "statefulsets.kubernetes.io/scaledown-pod-template": null}}});
    sets.patch(SET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("take the template annotation off");
    wait_for("the controller to release its finalizer", SLOW, || async {
        sets.get_opt(SET)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| !s.finalizers().iter().any(|f| f == FINALIZER))
    })
    .await;
}

/// After the uninstall: no controller pod, no Lease, no cleanup pod, no finalizer on [`SET`]. The
/// Lease is one of the install's objects (its Role has no `create`), so it goes with the uninstall
/// in every mode, also where the install's namespace outlives it.
async fn assert_nothing_left(cluster: &Cluster, install: &Install, apps: &TestNamespace) {
    let pods = install.pods(cluster);
    wait_for("the controller pods to be gone", SLOW, || async {
        pods.list(&ListParams::default().labels(&install.selector))
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &install.namespace);
    wait_for(
        &format!("Lease {}/{} to be gone", install.namespace, install.lease),
        SLOW,
        || async { matches!(leases.get_opt(&install.lease).await, Ok(None)) },
    )
    .await;
    let cleanup = apps
        .api::<Pod>()
        .list(&ListParams::default().labels("scaledown-pod"))
        .await
        .expect("list cleanup pods");
    assert!(
        cleanup.items.is_empty(),
        "cleanup pods left: {:?}",
        cleanup
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    let set = apps
        .api::<StatefulSet>()
        .get(SET)
        .await
        .expect("get the set");
    assert!(
        !set.finalizers().iter().any(|f| f == FINALIZER),
        "our finalizer left on {SET}"
    );
}

/// A namespace for the StatefulSet, marked for the sweep and enforcing `restricted` (the set's
/// pods and its cleanup pods comply).
async fn apps_namespace(cluster: &Cluster, name: &str) -> TestNamespace {
    let apps = cluster.namespace(name).await;
    mark_restricted(cluster, &apps).await;
    assert_restricted_enforced(cluster, &apps.name).await;
    apps
}

// === tests ===

/// `helm install` (cluster scope, 2 replicas, leader election: the chart's defaults) into a
/// namespace enforcing `restricted`, with only the real node's toleration and nodeSelector as
/// values; after the walk-through and the failover also a drain of the leader's node; then `helm
/// uninstall` and the namespace deleted.
#[tokio::test(flavor = "multi_thread")]
async fn helm_install_runs_on_the_real_node_and_fails_over() {
    let _turn = SERIAL.lock().await;
    let Some((cluster, digest)) = prepare().await else {
        return;
    };
    sweep_now(&cluster).await;
    let apps = apps_namespace(&cluster, "incluster-helm-apps").await;
    let _sweep = Sweep(cluster.kubeconfig.clone());
    let install = Install {
        mode: "helm",
        namespace: HELM_NS.into(),
        lease: HELM_NAME.into(),
        selector: selector(RELEASE),
    };
    create_restricted_namespace(&cluster, HELM_NS).await;
    assert_restricted_enforced(&cluster, HELM_NS).await;
    let seen = install.watch(&cluster).await;
    let values = scratch_file("incluster-values.json", &real_node_values().to_string());
    let chart = repo_dir().join(CHART).to_string_lossy().into_owned();
    let started = Instant::now();
    let out = helm_ok(
        &cluster,
        &[
            "install",
            RELEASE,
            &chart,
            "-n",
            HELM_NS,
            "-f",
            &values,
            "--wait",
            "--timeout",
            "180s",
        ],
    )
    .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    eprintln!(
        "e2e_incluster: helm install --wait took {} ms",
        started.elapsed().as_millis()
    );
    let leader = exercise(&cluster, &install, &apps, &seen, digest).await;
    drain_leader(&cluster, &install, &apps, &seen, &leader).await;

    report_restarts(&install, &seen);
    release_set(&apps).await;
    helm_ok(&cluster, &["uninstall", RELEASE, "-n", HELM_NS, "--wait"]).await;
    // The Lease is not the release's: `helm uninstall` leaves it.
    let lease = Api::<Lease>::namespaced(cluster.client.clone(), HELM_NS)
        .get_opt(HELM_NAME)
        .await
        .expect("get the Lease");
    eprintln!(
        "e2e_incluster: helm: after helm uninstall, Lease {HELM_NS}/{HELM_NAME}: {:?}",
        lease.map(|l| (holder(&l), l.spec.and_then(|s| s.renew_time)))
    );
    // The rest of the usual cleanup: the namespace made for the release (with the Lease in it).
    cluster
        .kubectl(&[
            "delete",
            "namespace",
            HELM_NS,
            "--wait=true",
            "--timeout=180s",
        ])
        .await;
    assert_nothing_left(&cluster, &install, &apps).await;
}

/// `kubectl apply -n NS -f artifacts/per-namespace.yaml` (its Deployment placed on the real node)
/// in a namespace enforcing `restricted`, which also holds the StatefulSet; then `kubectl delete
/// -n NS -f artifacts/per-namespace.yaml`.
#[tokio::test(flavor = "multi_thread")]
async fn per_namespace_manifest_runs_on_the_real_node_and_fails_over() {
    let _turn = SERIAL.lock().await;
    let Some((cluster, digest)) = prepare().await else {
        return;
    };
    sweep_now(&cluster).await;
    let apps = apps_namespace(&cluster, "incluster-per-namespace").await;
    let _sweep = Sweep(cluster.kubeconfig.clone());
    let install = Install {
        mode: "per-namespace.yaml",
        namespace: apps.name.clone(),
        lease: MANIFEST_NAME.into(),
        selector: selector(MANIFEST_NAME),
    };
    let seen = install.watch(&cluster).await;
    let kc = &cluster.kubeconfig;
    let file = manifest_on_real_node("per-namespace.yaml");
    kubectl_ok(kc, &["apply", "-n", &apps.name, "-f", &file]).await;
    exercise(&cluster, &install, &apps, &seen, digest).await;

    report_restarts(&install, &seen);
    release_set(&apps).await;
    let manifest = manifest_str("per-namespace.yaml");
    kubectl_ok(
        kc,
        &[
            "delete",
            "-n",
            &apps.name,
            "-f",
            &manifest,
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    // Known leftover: the namespace stays, and with it the Lease. Nothing deletes it (the chart
    // does not own it; a stopping leader only releases it), and `kubectl delete -f` removes the
    // Lease's Role with the Deployment, so the stopping leader cannot even release it (its log:
    // "could not release the leader Lease ... forbidden").
    assert_nothing_left(&cluster, &install, &apps).await;
}

/// `kubectl apply -f artifacts/cluster-scoped.yaml` (its Deployment placed on the real node; the
/// manifest's namespace enforces `restricted`), the StatefulSet in another namespace; then
/// `kubectl delete -f artifacts/cluster-scoped.yaml`.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_manifest_runs_on_the_real_node_and_fails_over() {
    let _turn = SERIAL.lock().await;
    let Some((cluster, digest)) = prepare().await else {
        return;
    };
    sweep_now(&cluster).await;
    let apps = apps_namespace(&cluster, "incluster-cluster-apps").await;
    let _sweep = Sweep(cluster.kubeconfig.clone());
    let install = Install {
        mode: "cluster-scoped.yaml",
        namespace: MANIFEST_NAME.into(),
        lease: MANIFEST_NAME.into(),
        selector: selector(MANIFEST_NAME),
    };
    let seen = install.watch(&cluster).await;
    let kc = &cluster.kubeconfig;
    kubectl_ok(
        kc,
        &["apply", "-f", &manifest_on_real_node("cluster-scoped.yaml")],
    )
    .await;
    assert_restricted_enforced(&cluster, MANIFEST_NAME).await;
    exercise(&cluster, &install, &apps, &seen, digest).await;

    report_restarts(&install, &seen);
    release_set(&apps).await;
    let manifest = manifest_str("cluster-scoped.yaml");
    kubectl_ok(
        kc,
        &["delete", "-f", &manifest, "--wait=true", "--timeout=180s"],
    )
    .await;
    assert_nothing_left(&cluster, &install, &apps).await;
}
