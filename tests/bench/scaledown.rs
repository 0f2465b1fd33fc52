//! A scale-down phase: `sets` StatefulSets of `replicas` pods in one namespace, all scaled to `to`
//! at once, `rounds` times (scaled back up in between). Either the controller cleans the orphaned
//! claims (mode `controller`), or Kubernetes deletes them itself (`native`:
//! `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`, no controller running).
//! Every pod and claim change is recorded by a watch; the timelines come from those records.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use statefulset_scaledown_controller::naming;

use crate::audit;
use crate::probe::{self, round3};
use crate::support::Cluster;
use crate::support::fixtures::{SetSpec, template_running_for};
use crate::support::recorder::{Recorder, Seen};
use crate::timeline::{self, Change, Container, Orphan, SetChange, Timeline};
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
    /// Every set gets its own cleanup template from [`crate::corpus`] (shell operators, here-docs,
    /// non-ASCII, U+2028, CRLF, YAML) instead of the plain JSON one.
    pub corpus: bool,
    /// Pods and cleanup pods run as real containers on the real node ([`crate::realnode`]).
    pub real_node: bool,
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
    sets: Recorder<StatefulSet>,
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
    let pv_count = p.sets * p.replicas as usize + spare;
    let pvs = if p.real_node {
        crate::realnode::pvs(&ns, pv_count).await
    } else {
        world::static_pvs(&ns, pv_count).await
    };
    let pods = Recorder::start(ns.api(), watcher::Config::default()).await;
    let claims = Recorder::start(ns.api(), watcher::Config::default()).await;
    let set_recorder = Recorder::start(ns.api(), watcher::Config::default()).await;
    let others_at_start = world::other_namespaces(&cluster.client, &ns.name).await;
    // On a cluster other runs use too, a controller watching every namespace would act on their
    // sets (and they would see its pods): it watches only the phase's namespace then.
    let scoped = !others_at_start.is_empty()
        && !controller_args
            .iter()
            .any(|a| a.starts_with("--namespace") || a.starts_with("--localOnly"));
    let mut args = controller_args.to_vec();
    if scoped {
        args.push(format!("--namespace={}", ns.name));
    }
    if !others_at_start.is_empty() {
        println!(
            "bench:   shared cluster: {} other namespaces{}",
            others_at_start.len(),
            if scoped && mode == Mode::Controller {
                format!("; the controller watches only {}", ns.name)
            } else {
                String::new()
            }
        );
    }
    let controller = match mode {
        Mode::Controller => {
            Some(UnderTest::start(&cluster, &format!("bench-{scenario}"), &args).await)
        }
        Mode::Native => None,
    };
    let names: Vec<String> = (0..p.sets).map(|i| format!("s-{i:04}")).collect();
    let after = format!("{}ms", (p.cleanup_seconds * 1000.0) as u64);
    let templates: Vec<String> = if p.corpus {
        crate::corpus::templates(p.sets, &after, seed)
    } else if p.real_node {
        vec![crate::realnode::cleanup_template(p.cleanup_seconds); p.sets]
    } else {
        vec![template_running_for(&after); p.sets]
    };
    let mut preflight = Vec::new();
    if p.corpus && mode == Mode::Controller {
        preflight = crate::corpus::preflight(&ns.api(), &templates).await;
        for refusal in &preflight {
            println!("bench:   corpus: the API server refuses a pod of {refusal}");
        }
    }
    let sets = names
        .iter()
        .zip(&templates)
        .map(|(n, t)| set(n, t, &pvs.class, p, mode))
        .collect();
    let api: Api<StatefulSet> = ns.api();
    world::create_all(|_| api.clone(), sets).await;
    let mut phase = Phase {
        cluster,
        ns,
        names,
        pods,
        claims,
        sets: set_recorder,
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
    let audit_mark = audit::mark();
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
    // Let the controller go quiet before "after": what it keeps is what it holds at rest (and the
    // API server write the last audit entries of the rounds).
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
    // Read after the snapshots, so the parsing is not in the controller's window.
    let audit_read = audit_mark.map(|m| audit::read_since(&m, &phase.ns.name));
    let identity = audit_read
        .as_ref()
        .and_then(|r| audit::identity(&r.entries));
    let rounds: Vec<Value> = rounds
        .iter()
        .map(|r| r.json(audit_read.as_ref(), identity.as_ref()))
        .collect();
    let audit_json = audit::phase_json(audit_read.as_ref(), &phase.ns.name);
    let placement = if p.real_node {
        crate::realnode::placement(&phase.cluster, &phase.pods).await
    } else {
        Value::Null
    };
    let others_at_end = world::other_namespaces(&phase.cluster.client, &phase.ns.name).await;
    let teardown = phase.teardown(controller).await;
    json!({
        "mode": mode.as_str(),
        "setup_ok": setup_ok,
        "wall_s": {"setup": round3(setup_s), "rounds": round3(scale_s), "teardown": teardown},
        "loadavg": {"before": load_before, "after": load_after},
        "rounds": rounds,
        "controller": controller_json,
        "control_plane": control_plane,
        "audit": audit_json,
        "corpus_preflight_refused": preflight,
        "real_node": placement,
        "cluster": {
            "shared": !others_at_start.is_empty() || !others_at_end.is_empty(),
            "other_namespaces_at_start": others_at_start.len(),
            "other_namespaces_at_end": others_at_end.len(),
            "controller_scope": match mode {
                Mode::Native => Value::Null,
                Mode::Controller if scoped => json!("namespace"),
                Mode::Controller => json!("cluster"),
            },
        },
    })
}

/// A set of the phase: Parallel pod management, one claim template; the cleanup `template` (whose
/// pods run `cleanup_seconds`) or the retention policy.
fn set(name: &str, template: &str, class: &str, p: &Params, mode: Mode) -> StatefulSet {
    let mut spec = SetSpec::new(name, p.replicas, class);
    spec.parallel = true;
    match mode {
        Mode::Controller => spec.template = Some(template.to_string()),
        Mode::Native => {
            spec.template = None;
            spec.extra_spec = json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"}});
        }
    }
    if p.real_node {
        crate::realnode::on_real_node(spec.build())
    } else {
        spec.build()
    }
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
    /// no cleanup pod is left). Returns what the watches recorded; [`RoundData::json`] turns it
    /// into the round's JSON once the audit log of the phase is read.
    async fn round(&mut self, round: usize, p: &Params, mode: Mode, rng: &mut Rng) -> RoundData {
        self.latest_pods.refresh(&self.pods);
        self.latest_claims.refresh(&self.claims);
        let orphans = self.orphans(round, p);
        let (pod_mark, claim_mark, set_mark) =
            (self.pods.mark(), self.claims.mark(), self.sets.mark());
        let mut order = self.names.clone();
        rng.shuffle(&mut order);
        let scale_start = Instant::now();
        let origin_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
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
        let sets: Vec<SetChange> = self
            .sets
            .since(set_mark)
            .iter()
            .map(|s| set_change(s, scale_start, p.to))
            .collect();
        println!(
            "bench:   round {round}: {} orphans, done {done} after {:.1} s (patches issued in {} ms)",
            orphans.len(),
            elapsed.as_secs_f64(),
            issued.as_millis()
        );
        RoundData {
            round,
            orphans,
            done,
            issued,
            elapsed,
            origin_unix_ms,
            pods,
            claims,
            sets,
        }
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
        drop((self.pods, self.claims, self.sets));
        let gone = world::delete_namespaces(vec![self.ns], Duration::from_secs(300)).await;
        let _ = self.cluster;
        json!(gone.map(|_| round3(started.elapsed().as_secs_f64())))
    }
}

/// What one round recorded.
struct RoundData {
    round: usize,
    orphans: Vec<Orphan>,
    done: bool,
    issued: Duration,
    elapsed: Duration,
    /// The scale-down's start on the wall clock (ms since the Unix epoch), for the audit log.
    origin_unix_ms: f64,
    pods: Vec<Change>,
    claims: Vec<Change>,
    sets: Vec<SetChange>,
}

impl RoundData {
    /// The round's JSON: per ordinal timelines, latency summaries, and the cleanup pods (creates,
    /// and those deleted before they started, by whom: from the audit log's DELETEs).
    fn json(&self, read: Option<&audit::Slice>, identity: Option<&audit::Identity>) -> Value {
        let deletes = read.map_or_else(Vec::new, |r| {
            audit::pod_deletes(&r.entries, identity, self.origin_unix_ms)
        });
        let timelines: Vec<Timeline> = self
            .orphans
            .iter()
            .map(|o| timeline::timeline(o, &self.pods, &self.claims, &self.sets, &deletes))
            .collect();
        let cleanup = timeline::cleanup_summary(&timelines, read.is_some());
        if read.is_some() && cleanup["late_deletes"].as_u64().unwrap_or(0) > 0 {
            println!(
                "bench:   round {}: {} cleanup pods deleted by others before they ran: {}",
                self.round, cleanup["late_deletes"], cleanup["late_deletes_by"]
            );
        }
        json!({
            "round": self.round,
            "orphans": self.orphans.len(),
            "complete": self.done,
            "patches_issued_ms": self.issued.as_millis() as u64,
            "origin_unix_ms": round3(self.origin_unix_ms),
            "all_done_ms": self.elapsed.as_millis() as u64,
            "max_cleanup_pods_per_ordinal": timelines.iter().map(|t| t.cleanup_pods).max(),
            "cleanup_pods": cleanup,
            "latency_ms": timeline::latency_summaries(&timelines),
            "ordinals": self.orphans.iter().zip(&timelines).map(|(o, t)| timeline::timeline_json(o, t)).collect::<Vec<_>>(),
        })
    }
}

/// A recorded change of a set, relative to `origin`: did its status show the scale-down to `to`
/// done (the controller's release rule, `decide::may_release`)?
fn set_change(s: &Seen<StatefulSet>, origin: Instant, to: i32) -> SetChange {
    let set = &s.object;
    let spec_replicas = set.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
    let status = set.status.as_ref();
    let caught_up = !s.gone()
        && spec_replicas == to
        && status.is_some_and(|st| {
            st.observed_generation.unwrap_or(0) >= set.metadata.generation.unwrap_or(0)
                && st.replicas <= spec_replicas
        });
    SetChange {
        at_ms: millis_since(s.at, origin),
        name: s.name.clone(),
        caught_up,
    }
}

fn millis_since(at: Instant, origin: Instant) -> f64 {
    if at >= origin {
        at.duration_since(origin).as_secs_f64() * 1000.0
    } else {
        -(origin.duration_since(at).as_secs_f64() * 1000.0)
    }
}

/// A recorded change, with its time relative to `origin` in ms (negative if before).
pub fn change<K: kube::Resource + 'static>(s: &Seen<K>, origin: Instant) -> Change {
    let at_ms = millis_since(s.at, origin);
    let object: &dyn std::any::Any = s.object.as_ref();
    let pod = object.downcast_ref::<Pod>();
    let phase = pod
        .map(|p| crate::support::recorder::phase(p).to_string())
        .unwrap_or_default();
    let gated = pod.is_some_and(|p| {
        crate::support::recorder::gates(p)
            .iter()
            .any(|g| g == naming::CONFIRM_GATE)
    });
    Change {
        at_ms,
        name: s.name.clone(),
        uid: s.uid.clone(),
        gone: s.gone(),
        deleting: s.deleting,
        cleanup: s.labels.contains_key(naming::CLEANUP_LABEL),
        phase,
        gated,
        scheduled: pod.is_some_and(|p| crate::support::recorder::node(p).is_some()),
        container: pod.map_or(Container::Unreported, container),
    }
}

/// The state of the pod's first container, as its node last reported it.
fn container(pod: &Pod) -> Container {
    let state = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.state.clone().unwrap_or_default());
    match state {
        None => Container::Unreported,
        Some(s) if s.terminated.is_some() => Container::Terminated,
        Some(s) if s.running.is_some() => Container::Running,
        Some(_) => Container::Waiting,
    }
}
