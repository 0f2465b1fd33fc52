//! A test on the real node (`e2e_realnode`, `e2e_redis`): its namespace, PVs on the real node, a
//! controller, and recordings of its pods, claims and Events. Skipped when the real node is absent
//! on purpose, a failure when it should run. Dropping it stops the controller and takes the
//! finalizer off the test's StatefulSet, so its namespace can go.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use kube::runtime::watcher;

use super::fixtures::Controller;
use super::recorder::Recorder;
use super::{
    Cluster, REAL_NODE, StaticPvs, TestNamespace, kubectl_binary, real_node_ready,
    real_node_skipped,
};

/// What a real-node test works with (see the module's doc).
pub struct RealEnv {
    pub cluster: Cluster,
    pub ns: TestNamespace,
    pub pvs: StaticPvs,
    pub controller: Option<Controller>,
    pub pods: Recorder<Pod>,
    pub claims: Recorder<PersistentVolumeClaim>,
    pub events: Recorder<Event>,
    /// The StatefulSet whose finalizer goes on drop.
    set: &'static str,
}

/// Which suite and test, and what it asks for: `pvs` real-node PVs of class prefix `class`, a
/// controller with `flags`, and the StatefulSet `set` it makes.
pub struct RealTest<'a> {
    pub suite: &'a str,
    pub test: &'a str,
    pub class: &'a str,
    pub pvs: usize,
    pub flags: &'a [&'a str],
    pub set: &'static str,
}

impl RealEnv {
    /// `None` (the test skips) when the real node is absent on purpose; panics when it should run.
    pub async fn new(t: RealTest<'_>) -> Option<RealEnv> {
        let cluster = Cluster::connect().await;
        if !real_node_ready(&cluster.client).await {
            if let Some(why) = real_node_skipped() {
                eprintln!(
                    "{}: {} SKIPPED, no real node in this cluster: {why}",
                    t.suite, t.test
                );
                return None;
            }
            panic!(
                "e2e: node {REAL_NODE} is not Ready; hack/cluster.sh up starts it (see hack/real-node.sh status)"
            );
        }
        let ns = cluster.namespace(t.test).await;
        let pvs = ns.create_real_pvs(t.class, t.pvs).await;
        let controller = Some(Controller::start(&cluster, &ns.name, t.flags).await);
        let pods = Recorder::start(ns.api(), watcher::Config::default()).await;
        let claims = Recorder::start(ns.api(), watcher::Config::default()).await;
        let events = Recorder::start(ns.api(), watcher::Config::default()).await;
        Some(RealEnv {
            cluster,
            ns,
            pvs,
            controller,
            pods,
            claims,
            events,
            set: t.set,
        })
    }

    pub fn sets(&self) -> Api<StatefulSet> {
        self.ns.api()
    }

    pub fn claims_api(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }
}

impl Drop for RealEnv {
    fn drop(&mut self) {
        // Without the controller, its finalizer would keep the set, and so the namespace.
        self.controller.take();
        let _ = std::process::Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.cluster.kubeconfig)
            .args(["-n", &self.ns.name, "--request-timeout", "20s"])
            .args(["patch", "statefulset", self.set, "--type=merge"])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
            .output();
    }
}
