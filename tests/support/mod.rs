//! Shared helpers for the e2e tests (`tests/e2e_*.rs`, each with `mod support;`).
//!
//! The tests run against the local control plane of `hack/cluster.sh` (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and KWOK with three fake nodes). Start it with
//! `make cluster-up`, or let `make e2e` / `hack/with-cluster.sh cargo test ...` start and stop it.
//!
//! Every test works in its own namespace ([`Cluster::namespace`]), so tests run in parallel. Pods
//! never run containers: KWOK moves them through their phases, see docs/development/test-cluster.md ("Pod simulation contract") for the
//! labels and annotations that make a pod succeed, fail or keep running.

// Each e2e test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod deploy;
pub mod fixtures;
pub mod hotloop;
pub mod pool;
pub mod realnode;
pub mod recorder;
pub mod rng;
pub mod sieve;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ResourceQuota, ServiceAccount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;

/// Annotation on the fake nodes that KWOK manages.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Label on pods that KWOK completes (the label the controller puts on cleanup pods).
pub const SCALEDOWN_POD_LABEL: &str = "scaledown-pod";
/// Label that picks the simulated outcome of a `scaledown-pod`: `Failed` or `Running`
/// (absent or anything else: `Succeeded`).
pub const OUTCOME_LABEL: &str = "sim.scaledown.io/outcome";
/// Annotation with a Go duration ("10s", "1m30s") that replaces the default 3 s until a
/// `scaledown-pod` finishes, counted from the pod's `status.startTime`.
pub const AFTER_ANNOTATION: &str = "sim.scaledown.io/after";
/// Label put on every object the helpers create outside a test namespace.
pub const CLASS_LABEL: &str = "scaledown.e2e/static-pv-class";

const POLL: Duration = Duration::from_millis(250);

/// The real node of `hack/real-node.sh` (started by `hack/cluster.sh up` unless
/// `SCALEDOWN_REAL_NODE=0`): a kubelet with containerd, in a network namespace of its own.
pub const REAL_NODE: &str = "real-0";
/// Label and taint (`NoSchedule`) of the real node: only pods that tolerate it land there.
pub const REAL_NODE_KEY: &str = "scaledown.test/node";

/// The toleration of the real node's taint, for a pod spec's `tolerations`.
pub fn real_node_toleration() -> serde_json::Value {
    json!({"key": REAL_NODE_KEY, "operator": "Equal", "value": "real", "effect": "NoSchedule"})
}

/// The nodeSelector that places a pod on the real node.
pub fn real_node_selector() -> serde_json::Value {
    json!({REAL_NODE_KEY: "real"})
}

/// Whether the real node is registered and Ready. Tests on it skip (with a message) only if
/// `SCALEDOWN_REAL_NODE=0` or the cluster's `up` skipped it because another cluster on this machine
/// runs the only real node (`target/cluster/real-node-skipped`); otherwise a missing node fails them.
pub async fn real_node_ready(client: &Client) -> bool {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    match nodes.get_opt(REAL_NODE).await {
        Ok(Some(n)) => n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        _ => false,
    }
}

/// Why the real node is absent on purpose (`SCALEDOWN_REAL_NODE=0`, or another cluster on this
/// machine runs the only real node), if it is.
pub fn real_node_skipped() -> Option<String> {
    if std::env::var("SCALEDOWN_REAL_NODE").is_ok_and(|v| v == "0") {
        return Some("SCALEDOWN_REAL_NODE=0".into());
    }
    std::fs::read_to_string(cluster_state_dir().join("real-node-skipped"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The checkout whose scripts and cluster the tests use: `SCALEDOWN_CHECKOUT` if set, else the one
/// they were built in. The override lets prebuilt test binaries (a long `make chaos` run) use the
/// cluster of another checkout, so this one's cluster and target stay free meanwhile.
pub fn repo_dir() -> PathBuf {
    match std::env::var_os("SCALEDOWN_CHECKOUT") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// The controller binary: `SCALEDOWN_CONTROLLER_BIN` if set (with `SCALEDOWN_CHECKOUT`), else the
/// one cargo built with the tests.
pub fn controller_bin() -> PathBuf {
    match std::env::var_os("SCALEDOWN_CONTROLLER_BIN") {
        Some(bin) if !bin.is_empty() => PathBuf::from(bin),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_statefulset-scaledown-controller")),
    }
}

/// The Makefile's `IMAGE` (`IMAGE ?= ...`): the image `make image` builds and the chart and the
/// manifests name.
pub fn makefile_image() -> String {
    let makefile = std::fs::read_to_string(repo_dir().join("Makefile")).expect("read Makefile");
    makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE ?= "))
        .map(|s| s.trim().to_string())
        .expect("the Makefile has a line `IMAGE ?= <image>`")
}

/// Directory of the local cluster's state (`target/cluster`).
pub fn cluster_state_dir() -> PathBuf {
    repo_dir().join("target").join("cluster")
}

fn kubeconfig_path() -> PathBuf {
    match std::env::var_os("KUBECONFIG") {
        // KUBECONFIG may be a list; the first entry is the one written by hack/cluster.sh.
        Some(v) if !v.is_empty() => std::env::split_paths(&v)
            .next()
            .unwrap_or_else(|| cluster_state_dir().join("kubeconfig")),
        _ => cluster_state_dir().join("kubeconfig"),
    }
}

/// kubectl of the local cluster (target/cluster/bin/kubectl), or `kubectl` from PATH.
pub fn kubectl_binary() -> PathBuf {
    let local = cluster_state_dir().join("bin").join("kubectl");
    if local.exists() {
        local
    } else {
        PathBuf::from("kubectl")
    }
}

/// Root directory under which static hostPath PVs point (kcm's hostPath deleter removes them for
/// `Delete` PVs; it only accepts paths under /tmp).
fn hostpath_root(kubeconfig: &Path) -> PathBuf {
    kubeconfig
        .parent()
        .map(|d| d.join("hostpath-root"))
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|s| PathBuf::from(s.trim()))
        .filter(|p| p.starts_with("/tmp/scaledown-e2e/"))
        .unwrap_or_else(|| PathBuf::from("/tmp/scaledown-e2e/external"))
}

/// Components of the local cluster (hack/cluster.sh) whose recorded process is gone, each with the
/// last line of its log: a test that restarts parts of the control plane checks it survived.
pub fn dead_components() -> Vec<String> {
    let state = cluster_state_dir();
    let Ok(entries) = std::fs::read_dir(state.join("pids")) else {
        return vec!["no target/cluster/pids".into()];
    };
    let mut dead = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        let pid = std::fs::read_to_string(&path).unwrap_or_default();
        if !Path::new("/proc").join(pid.trim()).exists() || pid.trim().is_empty() {
            let log = std::fs::read_to_string(state.join("logs").join(format!("{name}.log")))
                .unwrap_or_default();
            let last = log.lines().last().unwrap_or("").to_string();
            dead.push(format!("{name} (last log line: {last})"));
        }
    }
    dead.sort();
    dead
}

/// A connection to the e2e cluster.
pub struct Cluster {
    pub client: Client,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Connects to the cluster named by `KUBECONFIG`, or else `target/cluster/kubeconfig`.
    ///
    /// Panics (no silent skip) if there is no kubeconfig, the apiserver does not answer, or the
    /// cluster has no KWOK nodes (so a stray `KUBECONFIG` never points the tests at a real cluster).
    pub async fn connect() -> Cluster {
        let path = kubeconfig_path();
        let hint = "start the local control plane with `make cluster-up` (or run the e2e tests through `make e2e`)";
        if !path.exists() {
            panic!("e2e: no kubeconfig at {}: {hint}", path.display());
        }
        let kubeconfig = Kubeconfig::read_from(&path)
            .unwrap_or_else(|e| panic!("e2e: cannot read {}: {e}; {hint}", path.display()));
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("e2e: bad kubeconfig {}: {e}; {hint}", path.display()));
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .unwrap_or_else(|e| panic!("e2e: cannot build a client for {server}: {e}"));
        match tokio::time::timeout(Duration::from_secs(15), client.apiserver_version()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("e2e: the apiserver at {server} does not answer ({e}); {hint}"),
            Err(_) => panic!("e2e: the apiserver at {server} did not answer within 15 s; {hint}"),
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let fake = nodes
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("e2e: cannot list nodes at {server}: {e}"))
            .items
            .into_iter()
            .filter(|n| {
                n.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(KWOK_NODE_ANNOTATION))
                    .is_some_and(|v| v == "fake")
            })
            .count();
        assert!(
            fake > 0,
            "e2e: the cluster at {server} ({}) has no KWOK nodes; refusing to run e2e tests on it. {hint}",
            path.display()
        );
        Cluster {
            client,
            kubeconfig: path,
        }
    }

    /// Creates a namespace for one test, named after `test_name` plus a unique suffix, and waits
    /// until its `default` ServiceAccount exists (pods are rejected before that). The namespace
    /// and the cluster-scoped objects created through it are deleted when it is dropped.
    ///
    /// It also starts the namespace's hot-loop detector ([`hotloop`]): when the namespace is
    /// dropped at the end of a test that did not panic, the test fails if the controller created
    /// more cleanup pods for one ordinal (in one generation of its set) than its attempts allow.
    pub async fn namespace(&self, test_name: &str) -> TestNamespace {
        let name = unique_name(test_name);
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = from_json(json!({
            "metadata": {"name": name, "labels": {"scaledown.e2e/test": "true"}}
        }));
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("e2e: cannot create namespace {name}: {e}"));
        let hot_loop = hotloop::HotLoopCheck::start(&self.client, &name).await;
        let namespace = TestNamespace {
            name: name.clone(),
            client: self.client.clone(),
            kubeconfig: self.kubeconfig.clone(),
            classes: Mutex::new(Vec::new()),
            hot_loop,
        };
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &name);
        wait_for(
            &format!("ServiceAccount {name}/default"),
            Duration::from_secs(60),
            || async { matches!(sas.get_opt("default").await, Ok(Some(_))) },
        )
        .await;
        namespace
    }

    /// Runs kubectl against the cluster and returns its stdout; panics if it fails.
    pub async fn kubectl(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .await
            .unwrap_or_else(|e| panic!("e2e: cannot run {}: {e}", kubectl_binary().display()));
        assert!(
            out.status.success(),
            "e2e: kubectl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// `<test name, sanitised>-<unique suffix>`, a valid DNS label of at most 63 characters.
pub fn unique_name(test_name: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut base: String = test_name
        .rsplit("::")
        .next()
        .unwrap_or(test_name)
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    base.truncate(48);
    let base = base.trim_matches('-');
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mix = (nanos as u64)
        ^ (u64::from(std::process::id()) << 32)
        ^ u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let suffix: String = (0..6)
        .map(|i| {
            let d = ((mix >> (i * 5)) & 31) as u32;
            char::from_digit(d, 32).unwrap_or('x')
        })
        .collect();
    if base.is_empty() {
        format!("e2e-{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}

/// A namespace owned by one test. Dropping it deletes the namespace and the StorageClasses and
/// PersistentVolumes created with [`TestNamespace::create_static_pvs`] (without waiting for them
/// to be gone). If the test panicked, the namespace's objects and events are printed first; set
/// `SCALEDOWN_E2E_KEEP=1` to keep everything for a look with kubectl.
///
/// Dropping it also runs the hot-loop check ([`hotloop`]): it panics (failing a test that has not
/// failed yet) if one ordinal got more cleanup pods from the controller than its attempts allow.
pub struct TestNamespace {
    pub name: String,
    client: Client,
    kubeconfig: PathBuf,
    classes: Mutex<Vec<String>>,
    hot_loop: Option<hotloop::HotLoopCheck>,
}

/// Reclaim policy of static PVs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    Retain,
    Delete,
}

impl Reclaim {
    fn as_str(self) -> &'static str {
        match self {
            Reclaim::Retain => "Retain",
            Reclaim::Delete => "Delete",
        }
    }
}

/// A per-test StorageClass and the static PVs in it.
#[derive(Clone, Debug)]
pub struct StaticPvs {
    pub class: String,
    pub names: Vec<String>,
}

impl TestNamespace {
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A namespaced API in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates the StorageClass `<namespace>-<suffix>` (no provisioner, Immediate binding) with
    /// `n` static 1Gi RWO PVs in it, all deleted when this namespace is dropped.
    pub async fn create_static_pvs(&self, suffix: &str, n: usize, reclaim: Reclaim) -> StaticPvs {
        let mut class = format!("{}-{suffix}", self.name);
        class.truncate(200);
        self.classes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(class.clone());
        let names = create_static_pvs(&self.client, &class, n, reclaim).await;
        StaticPvs { class, names }
    }

    /// Creates the StorageClass `<namespace>-<suffix>` (no provisioner, `WaitForFirstConsumer`) with
    /// `n` static hostPath PVs on the real node ([`REAL_NODE`], required node affinity), all
    /// deleted when this namespace is dropped. Each PV's directory is on this host,
    /// `<hostpath root>/<class>/<pv>`: what the pods write there, the test reads from the host.
    /// Returns the class and the PV names; [`TestNamespace::pv_dir`] gives a PV's directory.
    pub async fn create_real_pvs(&self, suffix: &str, n: usize) -> StaticPvs {
        let mut class = format!("{}-{suffix}", self.name);
        class.truncate(200);
        self.classes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(class.clone());
        let names = create_real_pvs(&self.client, &class, n).await;
        StaticPvs { class, names }
    }

    /// The host directory of a PV made by [`TestNamespace::create_real_pvs`] (or
    /// [`TestNamespace::create_static_pvs`]) in `class`.
    pub fn pv_dir(&self, class: &str, pv: &str) -> PathBuf {
        hostpath_root(&self.kubeconfig).join(class).join(pv)
    }

    /// The directory `<hostpath root>/<namespace>-<name>` on this host, for a plain `hostPath`
    /// volume that pods on the real node share with the test (created, mode 0777; removed when
    /// this namespace is dropped).
    pub fn shared_host_dir(&self, name: &str) -> PathBuf {
        let class = format!("{}-{name}", self.name);
        self.classes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(class.clone());
        let dir = hostpath_root(&self.kubeconfig).join(class);
        std::fs::create_dir_all(&dir).expect("create the shared host dir");
        dir
    }

    /// Opt-out of the hot-loop check for one set, visible in the test: its ordinals may get up to
    /// `per_ordinal` cleanup pods from the controller per generation of the set, because of `why`
    /// (e.g. the test refuses the set's record on purpose, and every backoff step creates a pod).
    pub fn allow_cleanup_creates(&self, set: &str, per_ordinal: usize, why: &str) {
        if let Some(check) = &self.hot_loop {
            check.allow(set, per_ordinal, why);
        }
    }

    /// Raises the hot-loop bound of `set` by `more` creates per ordinal, visibly, because of `why`
    /// (the test itself deleted the controller's cleanup pods `more` times).
    pub fn allow_more_cleanup_creates(&self, set: &str, more: usize, why: &str) {
        if let Some(check) = &self.hot_loop {
            check.allow_more(set, more, why);
        }
    }

    /// Opt-out of the hot-loop check for the whole namespace, visible in the test, because of `why`.
    pub fn skip_hot_loop_check(&self, why: &str) {
        if let Some(check) = &self.hot_loop {
            check.off(why);
        }
    }

    /// The controller's cleanup pod creates recorded so far, per ordinal and generation of its set
    /// (see [`hotloop::HotLoopCheck::creates`]); empty when the detector is off for the run.
    pub fn cleanup_creates(&self) -> Vec<hotloop::OrdinalCreates> {
        self.hot_loop
            .as_ref()
            .map(|c| c.creates().0)
            .unwrap_or_default()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Judged before anything is deleted; reported after the namespace is cleaned up.
        let hot_loop = self.hot_loop.take().map(|check| check.verdict());
        self.clean_up();
        match hot_loop {
            Some(Ok(summary)) if !summary.is_empty() => eprintln!("e2e: {summary}"),
            Some(Err(report)) if std::thread::panicking() => eprintln!("e2e: {report}"),
            Some(Err(report)) => panic!("e2e: {report}"),
            _ => {}
        }
    }
}

impl TestNamespace {
    /// Creates a ResourceQuota named `name` with `spec` and waits until kube-controller-manager
    /// has filled in its status (admission reads it).
    pub async fn create_quota(&self, name: &str, spec: serde_json::Value) {
        let quota: ResourceQuota = from_json(json!({"metadata": {"name": name}, "spec": spec}));
        let quotas: Api<ResourceQuota> = self.api();
        quotas
            .create(&PostParams::default(), &quota)
            .await
            .unwrap_or_else(|e| panic!("e2e: create quota {name}: {e}"));
        wait_for_some("the quota's status", Duration::from_secs(120), || async {
            quotas.get(name).await.ok().and_then(|q| q.status?.hard)
        })
        .await;
    }

    fn clean_up(&mut self) {
        // Synchronous kubectl calls: Drop cannot await, and the test's runtime may be shutting down.
        let kubectl = |args: &[&str]| {
            std::process::Command::new(kubectl_binary())
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["--request-timeout", "20s"])
                .args(args)
                .output()
        };
        if std::thread::panicking() {
            if let Ok(out) = kubectl(&[
                "-n",
                &self.name,
                "get",
                "statefulsets,pods,pvc,events",
                "-o",
                "wide",
            ]) {
                eprintln!(
                    "--- e2e: objects in namespace {} at failure ---\n{}{}",
                    self.name,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if let Ok(out) = kubectl(&["get", "pv", "-o", "wide"]) {
                eprintln!("--- e2e: PVs ---\n{}", String::from_utf8_lossy(&out.stdout));
            }
        }
        if std::env::var_os("SCALEDOWN_E2E_KEEP").is_some_and(|v| v == "1") {
            eprintln!("e2e: SCALEDOWN_E2E_KEEP=1, keeping namespace {}", self.name);
            return;
        }
        let _ = kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=false",
            "--ignore-not-found",
        ]);
        let classes = std::mem::take(&mut *self.classes.lock().unwrap_or_else(|e| e.into_inner()));
        let root = hostpath_root(&self.kubeconfig);
        for class in classes {
            let selector = format!("{CLASS_LABEL}={class}");
            let _ = kubectl(&["delete", "pv,storageclass", "-l", &selector, "--wait=false"]);
            let _ = std::fs::remove_dir_all(root.join(&class));
        }
    }
}

/// Creates StorageClass `class` (provisioner kubernetes.io/no-provisioner, volumeBindingMode
/// Immediate) unless it exists, and `n` static PVs `<class>-<i>` for it: 1Gi, ReadWriteOnce,
/// hostPath under /tmp/scaledown-e2e/... so that kcm's hostPath deleter can remove them when the
/// policy is `Delete`. Both carry the label `scaledown.e2e/static-pv-class=<class>`. Returns the PV
/// names. Prefer [`TestNamespace::create_static_pvs`], which also deletes them at the end.
pub async fn create_static_pvs(
    client: &Client,
    class: &str,
    n: usize,
    reclaim: Reclaim,
) -> Vec<String> {
    create_static_pvs_from(client, class, 0, n, reclaim).await
}

/// Like [`create_static_pvs`], but numbers the PVs `<class>-<first>` .. `<class>-<first + n - 1>`,
/// so a test can add PVs to a class it created before (e.g. to replace the PVs its claims used up).
pub async fn create_static_pvs_from(
    client: &Client,
    class: &str,
    first: usize,
    n: usize,
    reclaim: Reclaim,
) -> Vec<String> {
    // The hostPath only has to look real; nothing reads it. It lives where kcm runs (here).
    create_pvs(client, class, None, first..first + n, reclaim).await
}

/// Creates StorageClass `class` (no provisioner, `WaitForFirstConsumer`) unless it exists, and `n`
/// static 1Gi RWO hostPath PVs `<class>-<i>` (reclaim policy Retain) with a required node affinity to
/// the real node ([`REAL_NODE`]); the directories `<hostpath root>/<class>/<pv>` are created here
/// and mounted by the real node's kubelet. Both carry the label `scaledown.e2e/static-pv-class=<class>`.
/// Returns the PV names. Prefer [`TestNamespace::create_real_pvs`], which also deletes them.
pub async fn create_real_pvs(client: &Client, class: &str, n: usize) -> Vec<String> {
    create_pvs(client, class, Some(REAL_NODE), 0..n, Reclaim::Retain).await
}

/// StorageClass `class` (unless it exists) and the hostPath PVs `<class>-<i>` for `numbers`, in
/// `<hostpath root>/<class>/<pv>`. With `node`, the PVs are for that node's kubelet: their directories
/// must exist, they carry a required node affinity, and the class binds on first consumer (where the
/// pod was scheduled); without, only the binder sees them and the class binds at once.
async fn create_pvs(
    client: &Client,
    class: &str,
    node: Option<&str>,
    numbers: std::ops::Range<usize>,
    reclaim: Reclaim,
) -> Vec<String> {
    let (binding, class_reclaim) = match node {
        Some(_) => ("WaitForFirstConsumer", "Retain"),
        None => ("Immediate", "Delete"),
    };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc: StorageClass = from_json(json!({
        "metadata": {"name": class, "labels": {CLASS_LABEL: class}},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": binding,
        "reclaimPolicy": class_reclaim,
    }));
    match classes.create(&PostParams::default(), &sc).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("e2e: cannot create StorageClass {class}: {e}"),
    }
    let dir = hostpath_root(&kubeconfig_path()).join(class);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut names = Vec::with_capacity(numbers.len());
    for i in numbers {
        let name = format!("{class}-{i}");
        let path = dir.join(&name);
        let made = std::fs::create_dir_all(&path);
        let mut spec = json!({
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": reclaim.as_str(),
            "volumeMode": "Filesystem",
            "hostPath": {"path": path.to_string_lossy(), "type": ""},
        });
        if let Some(node) = node {
            made.unwrap_or_else(|e| panic!("e2e: cannot create {}: {e}", path.display()));
            spec["hostPath"]["type"] = json!("Directory");
            spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}});
        }
        let pv: PersistentVolume = from_json(
            json!({"metadata": {"name": name, "labels": {CLASS_LABEL: class}}, "spec": spec}),
        );
        pvs.create(&PostParams::default(), &pv)
            .await
            .unwrap_or_else(|e| panic!("e2e: cannot create PersistentVolume {name}: {e}"));
        names.push(name);
    }
    names
}

/// Deserialises a `json!` literal into a typed object; panics with the error if it does not fit.
/// The sum of the samples of metric `name` in a `/metrics` body whose labels include every pair of
/// `labels` (with no labels: every sample of `name`, labelled or not).
pub fn metric_sum(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn from_json<T: DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("e2e: bad object literal: {e}"))
}

/// Polls `condition` every 250 ms until it returns true; panics with `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for_some(what, timeout, || {
        let fut = condition();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Polls `probe` every 250 ms until it returns `Some`, and returns that value; panics with `what`
/// after `timeout`.
pub async fn wait_for_some<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() >= timeout {
            panic!("e2e: timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The phase of a pod ("Pending", "Running", "Succeeded", "Failed"), if it has one.
pub fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Waits until pod `name` has `phase` and returns it; the panic message names the last phase seen.
pub async fn wait_for_pod_phase(api: &Api<Pod>, name: &str, phase: &str, timeout: Duration) -> Pod {
    let last = Mutex::new(String::from("<not found>"));
    let found = tokio::time::timeout(timeout, async {
        loop {
            match api.get_opt(name).await {
                Ok(Some(pod)) => {
                    let seen = pod_phase(&pod).unwrap_or("<none>").to_string();
                    if seen == phase {
                        return pod;
                    }
                    *last.lock().unwrap_or_else(|e| e.into_inner()) = seen;
                }
                Ok(None) => {}
                Err(e) => *last.lock().unwrap_or_else(|e| e.into_inner()) = format!("error: {e}"),
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "e2e: timed out after {timeout:?} waiting for pod {name} to be {phase} (last seen: {})",
            last.lock().unwrap_or_else(|e| e.into_inner())
        )
    })
}

/// Waits until claim `name` has `phase` ("Pending", "Bound", "Lost") and returns it.
pub async fn wait_for_pvc_phase(
    api: &Api<PersistentVolumeClaim>,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> PersistentVolumeClaim {
    wait_for_some(
        &format!("PersistentVolumeClaim {name} to be {phase}"),
        timeout,
        || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
        },
    )
    .await
}

/// Waits until PV `name` has `phase` ("Available", "Bound", "Released", "Failed") and returns it.
pub async fn wait_for_pv_phase(
    api: &Api<PersistentVolume>,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> PersistentVolume {
    wait_for_some(
        &format!("PersistentVolume {name} to be {phase}"),
        timeout,
        || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
        },
    )
    .await
}

/// Waits until object `name` no longer exists (NotFound).
pub async fn wait_for_gone<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    wait_for(&format!("{kind} {name} to be gone"), timeout, || async {
        matches!(api.get_opt(name).await, Ok(None))
    })
    .await
}

/// A kubeconfig for ServiceAccount `account` of `namespace`, with a TokenRequest token (1 h) and the
/// server and CA of `cluster`'s admin kubeconfig, written to target/e2e-tokens/.
pub async fn service_account_kubeconfig(
    cluster: &Cluster,
    namespace: &str,
    account: &str,
) -> PathBuf {
    let token = cluster
        .kubectl(&["create", "token", account, "-n", namespace, "--duration=1h"])
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
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": account, "namespace": namespace}}],
        "current-context": "sa",
    });
    let dir = repo_dir().join("target/e2e-tokens");
    std::fs::create_dir_all(&dir).expect("token dir");
    let path = dir.join(format!("{namespace}-{account}.kubeconfig"));
    std::fs::write(&path, config.to_string()).expect("write the token kubeconfig");
    path
}

/// A binding named `name` of the admission policy of that name: what the policy refuses is denied,
/// in namespace `namespace` only.
pub fn deny_in_namespace(
    name: &str,
    namespace: &str,
) -> k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding {
    from_json(json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels":
                {"kubernetes.io/metadata.name": namespace}}}}
    }))
}

/// Who holds Lease `name` (its `holderIdentity`), if anyone does; `None` also when it cannot be
/// read.
pub async fn lease_holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// A client from a kubeconfig file (e.g. one of [`service_account_kubeconfig`]).
pub async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A number of kB from /proc/<pid>/status (`VmRSS`, `VmHWM`, ...), if the process is there.
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `GET http://127.0.0.1:<port><path>` with curl: the status (0 when nothing answered) and body.
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            &format!("http://127.0.0.1:{port}{path}"),
        ])
        .output()
        .await
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A finished command's exit code, stdout and stderr, for an assertion's message.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
