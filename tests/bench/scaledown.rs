//! A scale-down phase: `sets` StatefulSets of `replicas` pods in one namespace, all scaled to `to`
//! at once, `rounds` times (scaled back up in between). Either the controller cleans the orphaned
//! claims (mode `controller`), or Kubernetes deletes them itself (`native`:
//! `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`, no controller running).
//! Every pod and claim change is recorded by a watch; the timelines come from those records.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::probe::{self, round3};
use crate::support::Cluster;
use crate::support::fixtures::{SetSpec, template_running_for};
use crate::support::recorder::{Recorder, Seen};
use crate::timeline::{self, Change, Orphan, Timeline};
use crate::under_test::UnderTest;
use crate::world::{self, Latest, Rng, bound, running};

#[derive(Clone, Debug)]
pub struct Params {
    pub sets: usize,
    pub replicas: i32,
    pub to: i32,
    pub rounds: usize,
    /// How long a cleanup pod runs under KWOK (`sim.scaledown.io/after`).
    pub cleanup_seconds: f64,
    /// Per wait: sets up, one round done.
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Controller,
    Native,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Controller => "controller",
            Mode::Native => "native",
        }
    }
}

struct Phase {
    cluster: Cluster,
    ns: crate::support::TestNamespace,
    names: Vec<String>,
    pods: Recorder<Pod>,
    claims: Recorder<PersistentVolumeClaim>,
    latest_pods: Latest<Pod>,
    latest_claims: Latest<PersistentVolumeClaim>,
}

/// Runs one phase and returns its JSON (timelines, latency summaries, controller and control
/// plane numbers). Never panics on a slow cluster: a wait that times out is reported.
pub async fn run(
    scenario: &str,
    p: &Params,
    mode: Mode,
    seed: u64,
    controller_args: &[String],
) -> Value {
    let cluster = Cluster::connect().await;
    println!(
        "bench: {scenario}/{}: {} sets of {} -> {}, {} round(s)",
        mode.as_str(),
        p.sets,
        p.replicas,
        p.to,
        p.rounds
    );
    let t0 = Instant::now();
    let ns = cluster
        .namespace(&format!("bench-{scenario}-{}", mode.as_str()))
        .await;
    let spare = p.sets * (p.replicas - p.to) as usize * p.rounds.saturating_sub(1);
    let pvs = world::static_pvs(&ns, p.sets * p.replicas as usize + spare).await;
    let pods = Recorder::start(ns.api(), watcher::Config::default()).await;
    let claims = Recorder::start(ns.api(), watcher::Config::default()).await;
    let controller = match mode {
        Mode::Controller => {
            Some(UnderTest::start(&cluster, &format!("bench-{scenario}"), controller_args).await)
        }
        Mode::Native => None,
    };
    let names: Vec<String> = (0..p.sets).map(|i| format!("s-{i:04}")).collect();
    let sets = names.iter().map(|n| set(n, &pvs.class, p, mode)).collect();
    let api: Api<StatefulSet> = ns.api();
    world::create_all(|_| api.clone(), sets).await;
    let mut phase = Phase {
        cluster,
        ns,
        names,
        pods,
        claims,
        latest_pods: Latest::new(),
        latest_claims: Latest::new(),
    };
    let setup_ok = phase.wait_up(p, mode).await;
    let setup_s = t0.elapsed().as_secs_f64();
    println!("bench:   set up in {setup_s:.1} s (ok: {setup_ok})");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = match &controller {
        Some(c) => Some(c.snapshot().await),
        None => None,
    };
    let (cp_before, cpu_before, load_before) = (
        probe::component_metrics().await,
        probe::component_cpu(),
        probe::loadavg(),
    );
    let mut rng = Rng::new(seed);
    let mut rounds = Vec::new();
    let started = Instant::now();
    for round in 0..p.rounds {
        if !setup_ok {
            break;
        }
        rounds.push(phase.round(round, p, mode, &mut rng).await);
        if round + 1 < p.rounds {
            world::scale_all(&phase.ns.api(), &phase.names, p.replicas).await;
            if !phase.wait_up(p, mode).await {
                break;
            }
        }
    }
    let scale_s = started.elapsed().as_secs_f64();
    // Let the controller go quiet before "after": what it keeps is what it holds at rest.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu_after = probe::component_cpu();
    let cpu: std::collections::BTreeMap<String, f64> = probe::delta(&cpu_after, &cpu_before);
    let control_plane =
        probe::control_plane_json(&probe::component_metrics().await, &cp_before, &cpu);
    let controller_json = match (&controller, &before) {
        (Some(c), Some(b)) => c.json(b, &c.snapshot().await),
        _ => Value::Null,
    };
    let load_after = probe::loadavg();
    let teardown = phase.teardown(controller).await;
    json!({
        "mode": mode.as_str(),
        "setup_ok": setup_ok,
        "wall_s": {"setup": round3(setup_s), "rounds": round3(scale_s), "teardown": teardown},
        "loadavg": {"before": load_before, "after": load_after},
        "rounds": rounds,
        "controller": controller_json,
        "control_plane": control_plane,
    })
}

/// A set of the phase: Parallel pod management, one claim template; the cleanup template (which
/// runs `cleanup_seconds`) or the retention policy.
fn set(name: &str, class: &str, p: &Params, mode: Mode) -> StatefulSet {
    let mut spec = SetSpec::new(name, p.replicas, class);
    spec.parallel = true;
    match mode {
        Mode::Controller => {
            spec.template = Some(template_running_for(&format!(
                "{}ms",
                (p.cleanup_seconds * 1000.0) as u64
            )))
        }
        Mode::Native => {
            spec.template = None;
            spec.extra_spec = json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"}});
        }
    }
    spec.build()
}

impl Phase {
    /// Waits until every pod of every set runs and its claim is bound (and, with the controller,
    /// every set carries its finalizer).
    async fn wait_up(&mut self, p: &Params, mode: Mode) -> bool {
        let deadline = Instant::now() + p.timeout;
        let api: Api<StatefulSet> = self.ns.api();
        loop {
            self.latest_pods.refresh(&self.pods);
            self.latest_claims.refresh(&self.claims);
            let missing = self
                .names
                .iter()
                .flat_map(|s| (0..p.replicas).map(move |n| (s, n)))
                .filter(|(s, n)| {
                    let pod = self.latest_pods.get(&self.ns.name, &format!("{s}-{n}"));
                    let claim = self
                        .latest_claims
                        .get(&self.ns.name, &format!("data-{s}-{n}"));
                    !(pod.is_some_and(running) && claim.is_some_and(bound))
                })
                .count();
            let finalized = mode == Mode::Native
                || missing > 0
                || world::with_finalizer(&api).await == self.names.len();
            if missing == 0 && finalized {
                return true;
            }
            if Instant::now() >= deadline {
                println!("bench:   TIMEOUT: {missing} pods not running or claims not bound");
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One scale-down of every set, in a seeded order, until every orphaned claim is gone (and
    /// no cleanup pod is left). Returns the round's JSON.
    async fn round(&mut self, round: usize, p: &Params, mode: Mode, rng: &mut Rng) -> Value {
        self.latest_pods.refresh(&self.pods);
        self.latest_claims.refresh(&self.claims);
        let orphans = self.orphans(round, p);
        let (pod_mark, claim_mark) = (self.pods.mark(), self.claims.mark());
        let mut order = self.names.clone();
        rng.shuffle(&mut order);
        let scale_start = Instant::now();
        let issued = world::scale_all(&self.ns.api(), &order, p.to).await;
        let done = self.wait_round_done(&orphans, mode, p.timeout).await;
        let elapsed = scale_start.elapsed();
        let pods: Vec<Change> = self
            .pods
            .since(pod_mark)
            .iter()
            .map(|s| change(s, scale_start))
            .collect();
        let claims: Vec<Change> = self
            .claims
            .since(claim_mark)
            .iter()
            .map(|s| change(s, scale_start))
            .collect();
        let timelines: Vec<Timeline> = orphans
            .iter()
            .map(|o| timeline::timeline(o, &pods, &claims))
            .collect();
        let create_counts: Vec<usize> = timelines.iter().map(|t| t.cleanup_pods).collect();
        println!(
            "bench:   round {round}: {} orphans, done {done} after {:.1} s (patches issued in {} ms)",
            orphans.len(),
            elapsed.as_secs_f64(),
            issued.as_millis()
        );
        json!({
            "round": round,
            "orphans": orphans.len(),
            "complete": done,
            "patches_issued_ms": issued.as_millis() as u64,
            "all_done_ms": elapsed.as_millis() as u64,
            "max_cleanup_pods_per_ordinal": create_counts.iter().max(),
            "latency_ms": timeline::latency_summaries(&timelines),
            "ordinals": orphans.iter().zip(&timelines).map(|(o, t)| timeline::timeline_json(o, t)).collect::<Vec<_>>(),
        })
    }

    /// The ordinals `to..replicas` of every set, with the UIDs of their pod and claim now.
    fn orphans(&self, round: usize, p: &Params) -> Vec<Orphan> {
        let uid = |s: Option<&Seen<Pod>>| s.map(|s| s.uid.clone()).unwrap_or_default();
        let claim_uid =
            |s: Option<&Seen<PersistentVolumeClaim>>| s.map(|s| s.uid.clone()).unwrap_or_default();
        self.names
            .iter()
            .flat_map(|set| (p.to..p.replicas).map(move |n| (set, n)))
            .map(|(set, n)| {
                let (pod, claim) = (format!("{set}-{n}"), format!("data-{set}-{n}"));
                Orphan {
                    round,
                    set: set.clone(),
                    ordinal: n,
                    pod_uid: uid(self.latest_pods.get(&self.ns.name, &pod)),
                    claim_uid: claim_uid(self.latest_claims.get(&self.ns.name, &claim)),
                    pod,
                    claim,
                }
            })
            .collect()
    }

    /// Every orphaned claim is gone, and no pod (stateful or cleanup) holds its name any more.
    async fn wait_round_done(&mut self, orphans: &[Orphan], mode: Mode, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut last_report = Instant::now();
        loop {
            self.latest_pods.refresh(&self.pods);
            self.latest_claims.refresh(&self.claims);
            let left = orphans
                .iter()
                .filter(|o| {
                    let claim_left = self
                        .latest_claims
                        .get(&self.ns.name, &o.claim)
                        .is_some_and(|c| c.uid == o.claim_uid);
                    let pod_left = match mode {
                        Mode::Controller => self.latest_pods.get(&self.ns.name, &o.pod).is_some(),
                        Mode::Native => self
                            .latest_pods
                            .get(&self.ns.name, &o.pod)
                            .is_some_and(|s| s.uid == o.pod_uid),
                    };
                    claim_left || pod_left
                })
                .count();
            if left == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                println!(
                    "bench:   TIMEOUT: {left} of {} ordinals not cleaned",
                    orphans.len()
                );
                return false;
            }
            if last_report.elapsed() >= Duration::from_secs(30) {
                println!("bench:   ... {left} of {} ordinals left", orphans.len());
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the controller, frees the sets of its finalizer, deletes the namespace and its PVs
    /// and waits (at most 5 minutes) until the namespace is gone. Returns the seconds it took.
    async fn teardown(self, controller: Option<UnderTest>) -> Value {
        let started = Instant::now();
        if let Some(c) = controller {
            c.stop().await;
        }
        world::strip_finalizers(&self.ns.api()).await;
        drop((self.pods, self.claims));
        let gone = world::delete_namespaces(vec![self.ns], Duration::from_secs(300)).await;
        let _ = self.cluster;
        json!(gone.map(|_| round3(started.elapsed().as_secs_f64())))
    }
}

/// A recorded change, with its time relative to `origin` in ms (negative if before).
pub fn change<K: kube::Resource + 'static>(s: &Seen<K>, origin: Instant) -> Change {
    let at_ms = if s.at >= origin {
        s.at.duration_since(origin).as_secs_f64() * 1000.0
    } else {
        -(origin.duration_since(s.at).as_secs_f64() * 1000.0)
    };
    let object: &dyn std::any::Any = s.object.as_ref();
    let phase = object
        .downcast_ref::<Pod>()
        .map(|p| crate::support::recorder::phase(p).to_string())
        .unwrap_or_default();
    Change {
        at_ms,
        name: s.name.clone(),
        uid: s.uid.clone(),
        gone: s.gone(),
        deleting: s.deleting,
        cleanup: s.labels.contains_key("scaledown-pod"),
        phase,
    }
}
