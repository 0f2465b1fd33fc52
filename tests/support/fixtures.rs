//! Fixtures of the controller e2e tests: the controller as a child process, StatefulSets with a
//! cleanup template, and a test environment (namespace, PVs, controller) with the usual waits.
#![allow(dead_code)] // each test file uses a different part

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use kube::runtime::watcher;

use super::recorder::Recorder;
use super::{
    Cluster, Reclaim, TestNamespace, from_json, wait_for, wait_for_gone, wait_for_pod_phase,
};

pub const OWNER: &str = "statefulsets.kubernetes.io/scaledown-pod-owner";
pub const ATTEMPT: &str = statefulset_scaledown_controller::naming::ATTEMPT_ANNOTATION;
pub const FINALIZER: &str = "statefulsets.kubernetes.io/scaledown";
pub const CONFIRM_GATE: &str = "statefulsets.kubernetes.io/scaledown-confirm";
pub const HOLD: &str = "e2e.scaledown.io/hold";
pub const LONG: Duration = Duration::from_secs(90);

// === the controller under test ===

/// A controller process limited to one namespace; killed when dropped, its log printed on failure.
pub struct Controller {
    pub child: tokio::process::Child,
    pub log: PathBuf,
    pub started: std::time::Instant,
}

impl Controller {
    pub async fn start(cluster: &Cluster, namespace: &str, extra: &[&str]) -> Controller {
        Controller::start_with_env(cluster, namespace, extra, &[]).await
    }

    /// Starts the controller with `extra` flags and environment; metrics and probes stay off unless
    /// `extra` asks for them, so parallel tests never compete for a port.
    pub async fn start_with_env(
        cluster: &Cluster,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        let mut args: Vec<String> = vec!["--namespace".into(), namespace.into()];
        // Defaults of the e2e tests, unless `extra` sets them (a flag may be given only once).
        for (flag, value) in [("--cleanup-backoff", "1s"), ("--resync-period", "10s")] {
            if !extra.iter().any(|a| a.starts_with(flag)) {
                args.extend([flag.to_string(), value.to_string()]);
            }
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        for flag in ["--metrics-bind-address", "--health-probe-bind-address"] {
            if !extra.iter().any(|a| a.starts_with(flag)) {
                args.push(format!("{flag}=0"));
            }
        }
        // One log per controller: the namespace, plus POD_NAME when a test runs several.
        let instance = env
            .iter()
            .find(|(k, _)| *k == "POD_NAME")
            .map(|(_, v)| format!("-{v}"));
        let log_name = format!("{namespace}{}", instance.unwrap_or_default());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Controller::spawn(&cluster.kubeconfig, &log_name, &args, env)
    }

    /// Runs the controller binary with `kubeconfig`, these flags and environment; its log goes to
    /// target/e2e-logs/<log_name>.log. Its `--cleanup-attempts` sets the hot-loop bound of the
    /// namespace of its `--namespace` (see `support::hotloop`).
    pub fn spawn(
        kubeconfig: &std::path::Path,
        log_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        super::hotloop::note_controller_args(args);
        let dir = super::repo_dir().join("target/e2e-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{log_name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = tokio::process::Command::new(super::controller_bin())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .envs(env.iter().copied())
            // SCALEDOWN_E2E_RUST_LOG replaces the filter, e.g. to add `kube_runtime=debug`.
            .env(
                "RUST_LOG",
                std::env::var("SCALEDOWN_E2E_RUST_LOG")
                    .unwrap_or("info,statefulset_scaledown_controller=debug".into()),
            )
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("start the controller binary");
        Controller {
            child,
            log,
            started: std::time::Instant::now(),
        }
    }

    /// Runs `command` (any program that behaves as the controller, e.g. the image under an OCI
    /// runtime) with stdout and stderr in target/e2e-logs/<log_name>.log; killed when dropped.
    pub fn spawn_command(mut command: tokio::process::Command, log_name: &str) -> Controller {
        let dir = super::repo_dir().join("target/e2e-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{log_name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let err = file.try_clone().expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .expect("start the command");
        Controller {
            child,
            log,
            started: std::time::Instant::now(),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics if the process has exited.
    pub fn assert_alive(&mut self) {
        match self.child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => panic!(
                "the controller exited ({status}) after {:?}",
                self.started.elapsed()
            ),
            Err(e) => panic!("cannot check the controller process: {e}"),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log_text();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The log without terminal colour codes.
    pub fn plain_log(&self) -> String {
        strip_ansi(&self.log_text())
    }

    /// How many reconciles of set `set` in `namespace` the log shows so far (the reconciler's
    /// debug line `reconciled set=<set> namespace=Some("<namespace>")`).
    pub fn reconciles(&self, namespace: &str, set: &str) -> usize {
        // The pass runner's line: `pass done controller="scaledown" namespace="ns" name=web ok=true`.
        let name = format!(" name={set} ");
        let ns = format!("namespace=\"{namespace}\"");
        self.plain_log()
            .lines()
            .filter(|l| l.contains("pass done") && l.contains("controller=\"scaledown\""))
            .filter(|l| l.contains(&name) && l.contains(&ns))
            .count()
    }

    /// Waits for `n` more reconciles of `set` than the log shows now: a positive event that
    /// closes a "nothing may happen" window only after the controller has looked again.
    pub async fn wait_reconciles(&self, namespace: &str, set: &str, n: usize) {
        let from = self.reconciles(namespace, set);
        super::wait_for(
            &format!(
                "{n} more reconciles of {set} in the controller log {}",
                self.log.display()
            ),
            LONG,
            || async { self.reconciles(namespace, set) >= from + n },
        )
        .await;
    }

    /// Like [`Controller::wait_reconciles`], but gives up after `max` instead of panicking, for
    /// windows whose later assertions say more than a timeout would. Returns whether `n` came.
    pub async fn settle(&self, namespace: &str, set: &str, n: usize, max: Duration) -> bool {
        let from = self.reconciles(namespace, set);
        let deadline = std::time::Instant::now() + max;
        while std::time::Instant::now() < deadline {
            if self.reconciles(namespace, set) >= from + n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill controller");
    }

    /// SIGTERM (a graceful stop: a leader releases its Lease), then waits up to `grace` for the
    /// exit; SIGKILL after that. Returns the exit status, or `None` if it had to be killed.
    pub async fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                self.kill().await;
                None
            }
        }
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- controller log {} (last 60 lines) ---",
                self.log.display()
            );
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

// === fixtures ===

/// A cleanup template mounting `data` (and `logs` when asked); `labels`/`annotations` add to it.
pub fn template(labels: Value, annotations: Value, restart_policy: &str) -> String {
    json!({
        "metadata": {"labels": merge(json!({"app": "cleanup"}), labels), "annotations": annotations},
        "spec": {
            "restartPolicy": restart_policy,
            "containers": [{"name": "main", "image": "busybox",
                            "volumeMounts": [{"name": "data", "mountPath": "/var/data"}]}]
        }
    })
    .to_string()
}

/// A cleanup template whose pod succeeds `after` (a Go duration) after it starts, under KWOK.
pub fn template_running_for(after: &str) -> String {
    template(json!({}), json!({"sim.scaledown.io/after": after}), "")
}

pub fn ok_template() -> String {
    template(json!({}), json!({}), "")
}

/// A cleanup template whose pod fails (exit 1) under KWOK, with `restartPolicy: Never` so the
/// controller's attempts and backoff apply.
pub fn failing_template() -> String {
    template(
        json!({"sim.scaledown.io/outcome": "Failed"}),
        json!({}),
        "Never",
    )
}

pub fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

pub struct SetSpec<'a> {
    pub name: &'a str,
    pub replicas: i32,
    pub class: &'a str,
    pub template: Option<String>,
    pub claim_templates: &'a [&'a str],
    pub parallel: bool,
    pub start: Option<i32>,
    pub extra_spec: Value,
}

impl<'a> SetSpec<'a> {
    pub fn new(name: &'a str, replicas: i32, class: &'a str) -> Self {
        SetSpec {
            name,
            replicas,
            class,
            template: Some(ok_template()),
            claim_templates: &["data"],
            parallel: false,
            start: None,
            extra_spec: json!({}),
        }
    }

    pub fn build(&self) -> StatefulSet {
        let claims: Vec<Value> = self
            .claim_templates
            .iter()
            .map(|t| {
                json!({"metadata": {"name": t}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": self.class,
                        "resources": {"requests": {"storage": "1Gi"}}}})
            })
            .collect();
        let mounts: Vec<Value> = self
            .claim_templates
            .iter()
            .map(|t| json!({"name": t, "mountPath": format!("/{t}")}))
            .collect();
        let mut annotations = json!({});
        if let Some(t) = &self.template {
            annotations["statefulsets.kubernetes.io/scaledown-pod-template"] = json!(t);
        }
        let mut spec = json!({
            "replicas": self.replicas,
            "serviceName": self.name,
            "podManagementPolicy": if self.parallel { "Parallel" } else { "OrderedReady" },
            "selector": {"matchLabels": {"app": self.name}},
            "template": {
                "metadata": {"labels": {"app": self.name}},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "main", "image": "busybox", "volumeMounts": mounts}]}
            },
            "volumeClaimTemplates": claims,
        });
        if let Some(start) = self.start {
            spec["ordinals"] = json!({"start": start});
        }
        spec = merge(spec, self.extra_spec.clone());
        from_json(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                         "metadata": {"name": self.name, "annotations": annotations}, "spec": spec}))
    }
}

/// A test's namespace, PVs and controller.
pub struct Env {
    pub cluster: Cluster,
    pub ns: TestNamespace,
    pub class: String,
    pub controller: Option<Controller>,
}

impl Env {
    pub async fn new(test: &str, pvs: usize, controller_args: &[&str]) -> Env {
        let cluster = Cluster::connect().await;
        let ns = cluster.namespace(test).await;
        let class = ns.create_static_pvs("pv", pvs, Reclaim::Retain).await.class;
        let controller = Some(Controller::start(&cluster, &ns.name, controller_args).await);
        Env {
            cluster,
            ns,
            class,
            controller,
        }
    }

    pub fn sets(&self) -> Api<StatefulSet> {
        self.ns.api()
    }
    pub fn pods(&self) -> Api<Pod> {
        self.ns.api()
    }
    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }

    pub async fn create(&self, spec: &SetSpec<'_>) {
        self.sets()
            .create(&PostParams::default(), &spec.build())
            .await
            .expect("create statefulset");
    }

    /// Creates the set and waits until all its pods run and its claims are bound.
    pub async fn create_running(&self, spec: &SetSpec<'_>) {
        self.create(spec).await;
        let start = spec.start.unwrap_or(0);
        for n in start..start + spec.replicas {
            wait_for_pod_phase(&self.pods(), &format!("{}-{n}", spec.name), "Running", LONG).await;
        }
        self.wait_finalizer(spec.name, spec.template.is_some())
            .await;
    }

    /// Creates the set and waits until all its pods run; does not wait for the finalizer.
    pub async fn create_pods_running(&self, spec: &SetSpec<'_>) {
        self.create(spec).await;
        let start = spec.start.unwrap_or(0);
        for n in start..start + spec.replicas {
            wait_for_pod_phase(&self.pods(), &format!("{}-{n}", spec.name), "Running", LONG).await;
        }
    }

    /// A recorder of this namespace's pods.
    pub async fn record_pods(&self) -> Recorder<Pod> {
        Recorder::start(self.pods(), watcher::Config::default()).await
    }

    /// A recorder of this namespace's claims.
    pub async fn record_claims(&self) -> Recorder<PersistentVolumeClaim> {
        Recorder::start(self.claims(), watcher::Config::default()).await
    }

    /// A recorder of this namespace's StatefulSets.
    pub async fn record_sets(&self) -> Recorder<StatefulSet> {
        Recorder::start(self.sets(), watcher::Config::default()).await
    }

    /// A recorder of this namespace's events.k8s.io/v1 Events (its helpers look at ours only).
    pub async fn record_events(&self) -> Recorder<Event> {
        Recorder::start(self.ns.api(), watcher::Config::default()).await
    }

    pub async fn wait_finalizer(&self, set: &str, present: bool) {
        let sets = self.sets();
        wait_for(
            &format!("finalizer on {set} present={present}"),
            LONG,
            || async {
                match sets.get_opt(set).await {
                    Ok(Some(s)) => s.finalizers().iter().any(|f| f == FINALIZER) == present,
                    _ => false,
                }
            },
        )
        .await;
    }

    pub async fn scale(&self, set: &str, replicas: i32) {
        let patch = json!({"spec": {"replicas": replicas}});
        self.sets()
            .patch(set, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("scale");
    }

    pub async fn claim_uid(&self, name: &str) -> Option<String> {
        self.claims()
            .get_opt(name)
            .await
            .expect("get claim")
            .and_then(|c| c.uid())
    }

    pub async fn wait_claim_gone(&self, name: &str) {
        wait_for_gone(&self.claims(), name, LONG).await;
    }

    /// Waits for the cleanup pod `pod_name` to be confirmed: recorded and released from the
    /// controller's scheduling gate (a pod still gated has not been confirmed and never ran).
    pub async fn wait_cleanup_pod(&self, pod_name: &str) -> Pod {
        let pods = self.pods();
        super::wait_for_some(
            &format!("released cleanup pod {pod_name}"),
            LONG,
            || async {
                pods.get_opt(pod_name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|p| is_cleanup(p) && !is_gated(p))
            },
        )
        .await
    }

    /// Reasons of the Events our controller published on `set`.
    /// Our Events (the StatefulSet controller reports `SuccessfulCreate` too) on `set`.
    async fn our_events(&self, set: &str) -> Vec<Event> {
        let events: Api<Event> = self.ns.api();
        let list = events
            .list(&ListParams::default())
            .await
            .expect("list events");
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(set))
            .filter(|e| {
                e.reporting_controller.as_deref() == Some("statefulset-scaledown-controller")
            })
            .collect()
    }

    pub async fn event_reasons(&self, set: &str) -> Vec<String> {
        let events = self.our_events(set).await;
        events.into_iter().filter_map(|e| e.reason).collect()
    }

    /// The notes of our Events with `reason` on `set`.
    pub async fn event_notes(&self, set: &str, reason: &str) -> Vec<String> {
        let events = self.our_events(set).await;
        events
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }

    pub async fn wait_event(&self, set: &str, reason: &str) {
        wait_for(&format!("event {reason} on {set}"), LONG, || async {
            self.event_reasons(set).await.iter().any(|r| r == reason)
        })
        .await;
    }

    pub async fn hold_pod(&self, name: &str, hold: bool) {
        let finalizers: Vec<&str> = if hold { vec![HOLD] } else { vec![] };
        let patch = json!({"metadata": {"finalizers": finalizers}});
        self.pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch pod finalizers");
    }

    pub fn controller(&mut self) -> &mut Controller {
        self.controller.as_mut().expect("controller running")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Without the controller, our finalizer would keep the namespace from being deleted.
        self.controller.take();
        let kubectl = |args: &[&str]| {
            std::process::Command::new(super::kubectl_binary())
                .arg("--kubeconfig")
                .arg(&self.cluster.kubeconfig)
                .args(["-n", &self.ns.name])
                .args(args)
                .output()
        };
        let Ok(listed) = kubectl(&["get", "statefulsets", "-o", "name"]) else {
            return;
        };
        for set in String::from_utf8_lossy(&listed.stdout).lines() {
            let patch = r#"{"metadata":{"finalizers":null}}"#;
            let _ = kubectl(&["patch", set, "--type=merge", "-p", patch]);
        }
    }
}

/// Whether the pod still carries the controller's confirm gate.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.scheduling_gates.iter().flatten())
        .any(|g| g.name == CONFIRM_GATE)
}

pub fn is_cleanup(pod: &Pod) -> bool {
    pod.annotations().contains_key(OWNER)
}

pub async fn cleanup_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("scaledown-pod"))
        .await
        .expect("list cleanup pods")
        .items
}

/// Appends a measured number to target/e2e-measurements.txt (printed by .ci/run).
pub fn record(what: &str, value: String) {
    use std::io::Write;
    let path = super::repo_dir().join("target/e2e-measurements.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "[measure] {what}: {value}");
    }
}

/// `text` without ANSI escape sequences (CSI ... final byte).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
