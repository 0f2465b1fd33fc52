//! A scale-down phase: `sets` StatefulSets of `replicas` pods in `set_namespaces` namespaces (in
//! blocks: the first namespace holds the first `sets / set_namespaces` sets), all scaled to `to`
//! at once, `rounds` times (scaled back up in between). Either the controller cleans the orphaned
//! claims (mode `controller`), or Kubernetes deletes them itself (`native`:
//! `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`, no controller running).
//! Every pod and claim change is recorded by a watch per namespace; the timelines come from those
//! records. Set names (`s-0000`, ...) are unique over all the phase's namespaces, so a pod or
//! claim name names one ordinal.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};
use statefulset_scaledown_controller::naming;

use crate::audit;
use crate::probe::{self, round3};
use crate::support::fixtures::{FINALIZER, SetSpec, template_running_for};
use crate::support::recorder::Seen;
use crate::support::{Cluster, TestNamespace};
use crate::timeline::{self, Change, Container, Orphan, SetChange, Timeline};
use crate::under_test::UnderTest;
use crate::world::{self, Latest, Rng, Watches, bound, running};

#[derive(Clone, Debug)]
pub struct Params {
    pub sets: usize,
    pub replicas: i32,
    pub to: i32,
    pub rounds: usize,
    /// How many namespaces the sets are spread over (at least 1).
    pub set_namespaces: usize,
    /// The controller starts once every pod runs and every claim is bound (its start → ready then
    /// lists them all), not before the sets are created.
    pub start_after_setup: bool,
    /// How long a cleanup pod runs under KWOK (`sim.scaledown.io/after`).
    pub cleanup_seconds: f64,
    /// Per wait: sets up, one round done, the namespaces gone.
    pub timeout: Duration,
    /// Every set gets its own cleanup template from [`crate::corpus`] (shell operators, here-docs,
    /// non-ASCII, U+2028, CRLF, YAML) instead of the plain JSON one.
    pub corpus: bool,
    /// Pods and cleanup pods run as real containers on the real node ([`crate::realnode`]).
    pub real_node: bool,
}

impl Params {
    /// The namespaces the sets are spread over: `set_namespaces`, at least 1, at most one per set.
    pub fn namespaces(&self) -> usize {
        self.set_namespaces.clamp(1, self.sets.max(1))
    }
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

/// One set of the phase: the index of its namespace in [`Phase::namespaces`], and its name.
type SetRef = (usize, String);

struct Phase {
    cluster: Cluster,
    namespaces: Vec<TestNamespace>,
    sets: Vec<SetRef>,
    pods: Watches<Pod>,
    claims: Watches<PersistentVolumeClaim>,
    set_watches: Watches<StatefulSet>,
    latest_pods: Latest<Pod>,
    latest_claims: Latest<PersistentVolumeClaim>,
    latest_sets: Latest<StatefulSet>,
}

/// How the controller is limited to the phase's namespaces: the scope the result records
/// (`cluster`, or `namespace`: the bench adds `--namespace`); Err: it cannot be, and the phase
/// does not run. The controller watches one namespace (`--namespace`) or all of them: on a cluster other
/// runs use (`others`), a phase of one namespace gets `--namespace`; a phase of several namespaces
/// runs only on a cluster of its own, where watching all of them is watching its own.
fn scope(
    mode: Mode,
    namespaces: usize,
    others: &[String],
    controller_args: &[String],
) -> Result<Option<&'static str>, String> {
    if mode == Mode::Native {
        return Ok(None);
    }
    let given = controller_args
        .iter()
        .any(|a| a.starts_with("--namespace") || a.starts_with("--localOnly"));
    if others.is_empty() || given {
        return Ok(Some("cluster"));
    }
    if namespaces > 1 {
        return Err(format!(
            "the cluster is shared ({} other namespaces: {}) and the controller can be limited to \
             one namespace only (--namespace); a phase of {namespaces} namespaces needs a cluster \
             of its own (hack/cluster.sh down, then run it again)",
            others.len(),
            others.join(", ")
        ));
    }
    Ok(Some("namespace"))
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
        "bench: {scenario}/{}: {} sets of {} -> {} in {} namespace(s), {} round(s)",
        mode.as_str(),
        p.sets,
        p.replicas,
        p.to,
        p.namespaces(),
        p.rounds
    );
    let t0 = Instant::now();
    let others_at_start = world::other_namespaces(&cluster.client, &[]).await;
    let scope = match scope(mode, p.namespaces(), &others_at_start, controller_args) {
        Ok(s) => s,
        Err(reason) => {
            println!("bench:   REFUSED: {reason}");
            return json!({"mode": mode.as_str(), "setup_ok": false, "setup_refused": reason,
                "set_namespaces": p.namespaces(), "rounds": [],
                "cluster": {"shared": true, "other_namespaces_at_start": others_at_start.len(),
                    "other_namespaces_at_end": others_at_start.len(), "controller_scope": null}});
        }
    };
    let (mut phase, mut controller, preflight) =
        Phase::create(cluster, scenario, p, mode, seed, controller_args, scope).await;
    if mode == Mode::Controller && p.start_after_setup {
        // Every pod running and claim bound first (the native wait has no finalizers to see),
        // so the controller starts with them all to list: start → ready with a full cache.
        let up = phase.wait_up(p, Mode::Native).await;
        println!("bench:   pods up before the controller starts (ok: {up})");
        let own = phase.own();
        let c = start(&phase.cluster, scenario, &own, controller_args, scope).await;
        controller = Some(c);
    }
    if !others_at_start.is_empty() {
        println!(
            "bench:   shared cluster: {} other namespaces{}",
            others_at_start.len(),
            if scope == Some("namespace") {
                format!("; the controller watches only {}", phase.namespaces[0].name)
            } else {
                String::new()
            }
        );
    }
    let setup_ok = phase.wait_up(p, mode).await;
    let setup_s = t0.elapsed().as_secs_f64();
    println!("bench:   set up in {setup_s:.1} s (ok: {setup_ok})");
    let measured = phase
        .measure(p, mode, seed, setup_ok, controller.as_ref())
        .await;
    // The real node's scenario has one namespace (its preset): one pod watch.
    let placement = match phase.pods.recorders.first() {
        Some(pods) if p.real_node => crate::realnode::placement(&phase.cluster, pods).await,
        _ => Value::Null,
    };
    let others_at_end = world::other_namespaces(&phase.cluster.client, &phase.own()).await;
    let teardown = phase.teardown(controller, p.timeout).await;
    json!({
        "mode": mode.as_str(),
        "setup_ok": setup_ok,
        "set_namespaces": p.namespaces(),
        "wall_s": {"setup": round3(setup_s), "rounds": measured["scale_s"], "teardown": teardown},
        "loadavg": measured["loadavg"],
        "rounds": measured["rounds"],
        "controller": measured["controller"],
        "control_plane": measured["control_plane"],
        "apiserver_queues": measured["apiserver_queues"],
        "audit": measured["audit"],
        "corpus_preflight_refused": preflight,
        "real_node": placement,
        "cluster": {
            "shared": !others_at_start.is_empty() || !others_at_end.is_empty(),
            "other_namespaces_at_start": others_at_start.len(),
            "other_namespaces_at_end": others_at_end.len(),
            "controller_scope": scope,
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

/// The cleanup template of each set (its pods run `cleanup_seconds`), and with `corpus` the
/// templates whose pods the API server refuses in a dry run in `ns`.
async fn templates(
    p: &Params,
    mode: Mode,
    seed: u64,
    ns: &TestNamespace,
) -> (Vec<String>, Vec<String>) {
    let after = format!("{}ms", (p.cleanup_seconds * 1000.0) as u64);
    if p.real_node && !p.corpus {
        let template = crate::realnode::cleanup_template(p.cleanup_seconds);
        return (vec![template; p.sets], Vec::new());
    }
    if !p.corpus {
        return (vec![template_running_for(&after); p.sets], Vec::new());
    }
    let templates = crate::corpus::templates(p.sets, &after, seed);
    let mut preflight = Vec::new();
    if mode == Mode::Controller {
        preflight = crate::corpus::preflight(&ns.api(), &templates).await;
        for refusal in &preflight {
            println!("bench:   corpus: the API server refuses a pod of {refusal}");
        }
    }
    (templates, preflight)
}

/// Starts the controller under test, with `--namespace` if `scope` says so.
async fn start(
    cluster: &Cluster,
    scenario: &str,
    own: &[String],
    controller_args: &[String],
    scope: Option<&str>,
) -> UnderTest {
    let mut args = controller_args.to_vec();
    if scope == Some("namespace") {
        args.push(format!("--namespace={}", own[0]));
    }
    UnderTest::start(cluster, &format!("bench-{scenario}"), &args).await
}

/// The phase's sets: `s-0000`, ... in blocks of `sets / namespaces` (rounded up) per namespace.
fn placement(sets: usize, namespaces: usize) -> Vec<SetRef> {
    let per_namespace = sets.div_ceil(namespaces.max(1)).max(1);
    (0..sets)
        .map(|i| (i / per_namespace, format!("s-{i:04}")))
        .collect()
}

impl Phase {
    /// The namespaces, their PVs, the watches, the controller (unless it starts after the setup)
    /// and the sets; returns the phase, the controller and the corpus preflight's refusals.
    async fn create(
        cluster: Cluster,
        scenario: &str,
        p: &Params,
        mode: Mode,
        seed: u64,
        controller_args: &[String],
        scope: Option<&str>,
    ) -> (Phase, Option<UnderTest>, Vec<String>) {
        let k = p.namespaces();
        let mut namespaces = Vec::with_capacity(k);
        for j in 0..k {
            let label = match k {
                1 => format!("bench-{scenario}-{}", mode.as_str()),
                _ => format!("bench-{scenario}-{}-{j}", mode.as_str()),
            };
            namespaces.push(cluster.namespace(&label).await);
        }
        let sets = placement(p.sets, k);
        let per_set =
            p.replicas as usize + (p.replicas - p.to) as usize * p.rounds.saturating_sub(1);
        let mut classes = Vec::with_capacity(k);
        for (j, ns) in namespaces.iter().enumerate() {
            let n = sets.iter().filter(|(i, _)| *i == j).count();
            let pvs = if p.real_node {
                crate::realnode::pvs(ns, n * per_set).await
            } else {
                world::static_pvs(ns, n * per_set).await
            };
            classes.push(pvs.class);
        }
        let own: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
        let client = cluster.client.clone();
        let (pods, claims, set_watches) = tokio::join!(
            Watches::start(&client, &own),
            Watches::start(&client, &own),
            Watches::start(&client, &own),
        );
        let mut controller = None;
        if mode == Mode::Controller && !p.start_after_setup {
            controller = Some(start(&cluster, scenario, &own, controller_args, scope).await);
        }
        let (templates, preflight) = templates(p, mode, seed, &namespaces[0]).await;
        let objects: Vec<StatefulSet> = sets
            .iter()
            .zip(&templates)
            .map(|((j, name), t)| {
                let mut object = set(name, t, &classes[*j], p, mode);
                object.metadata.namespace = Some(own[*j].clone());
                object
            })
            .collect();
        world::create_all(
            |s: &StatefulSet| {
                Api::namespaced(
                    client.clone(),
                    s.metadata.namespace.as_deref().unwrap_or_default(),
                )
            },
            objects,
        )
        .await;
        let phase = Phase {
            cluster,
            namespaces,
            sets,
            pods,
            claims,
            set_watches,
            latest_pods: Latest::new(),
            latest_claims: Latest::new(),
            latest_sets: Latest::new(),
        };
        (phase, controller, preflight)
    }

    /// The names of the phase's namespaces.
    fn own(&self) -> Vec<String> {
        self.namespaces.iter().map(|n| n.name.clone()).collect()
    }

    fn namespace_of(&self, set: &SetRef) -> &str {
        &self.namespaces[set.0].name
    }

    /// The API and name of each of `sets`, for [`world::scale_all`].
    fn targets(&self, sets: &[SetRef]) -> Vec<(Api<StatefulSet>, String)> {
        sets.iter()
            .map(|s| (self.namespaces[s.0].api(), s.1.clone()))
            .collect()
    }

    fn refresh(&mut self) {
        self.latest_pods.refresh_all(&self.pods.recorders);
        self.latest_claims.refresh_all(&self.claims.recorders);
    }

    /// Waits until every pod of every set runs and its claim is bound (and, with the controller,
    /// every set carries its finalizer).
    async fn wait_up(&mut self, p: &Params, mode: Mode) -> bool {
        let deadline = Instant::now() + p.timeout;
        let mut last_report = Instant::now();
        loop {
            self.refresh();
            let missing = self
                .sets
                .iter()
                .flat_map(|s| (0..p.replicas).map(move |n| (s, n)))
                .filter(|(s, n)| {
                    let ns = self.namespace_of(s);
                    let pod = self.latest_pods.get(ns, &format!("{}-{n}", s.1));
                    let claim = self.latest_claims.get(ns, &format!("data-{}-{n}", s.1));
                    !(pod.is_some_and(running) && claim.is_some_and(bound))
                })
                .count();
            let finalized = mode == Mode::Native || missing > 0 || self.finalized();
            if missing == 0 && finalized {
                return true;
            }
            if Instant::now() >= deadline {
                println!("bench:   TIMEOUT: {missing} pods not running or claims not bound");
                return false;
            }
            if last_report.elapsed() >= Duration::from_secs(30) {
                println!("bench:   ... {missing} pods not running or claims not bound");
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every set of the phase carries the controller's finalizer (as the set watches last saw
    /// them: no list of thousands of sets every 200 ms).
    fn finalized(&mut self) -> bool {
        self.latest_sets.refresh_all(&self.set_watches.recorders);
        let n = self
            .latest_sets
            .objects
            .values()
            .filter(|s| s.object.finalizers().iter().any(|f| f == FINALIZER))
            .count();
        n == self.sets.len()
    }

    /// The rounds and what they cost: the controller's numbers between a snapshot before the
    /// first round and one 5 s after the last, the control plane's (the API server's queues
    /// too), and the audit log's. Returns `{rounds, scale_s, loadavg, controller, control_plane,
    /// apiserver_queues, audit}`.
    async fn measure(
        &mut self,
        p: &Params,
        mode: Mode,
        seed: u64,
        setup_ok: bool,
        controller: Option<&UnderTest>,
    ) -> Value {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = match controller {
            Some(c) => Some(c.snapshot().await),
            None => None,
        };
        let (cp_before, cpu_before, load_before) = (
            probe::component_metrics().await,
            probe::component_cpu(),
            probe::loadavg(),
        );
        let api_before = probe::apiserver_metrics(&self.cluster.client).await;
        let mut rng = Rng::new(seed);
        let mut rounds = Vec::new();
        let audit_mark = audit::mark();
        let started = Instant::now();
        for round in 0..p.rounds {
            if !setup_ok {
                break;
            }
            rounds.push(self.round(round, p, mode, &mut rng).await);
            if round + 1 < p.rounds {
                world::scale_all(&self.targets(&self.sets), p.replicas).await;
                if !self.wait_up(p, mode).await {
                    break;
                }
            }
        }
        let scale_s = started.elapsed().as_secs_f64();
        // Let the controller go quiet before "after": what it keeps is what it holds at rest (and
        // the API server write the last audit entries of the rounds).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let cpu = probe::delta(&probe::component_cpu(), &cpu_before);
        let control_plane =
            probe::control_plane_json(&probe::component_metrics().await, &cp_before, &cpu);
        let controller_json = match (controller, &before) {
            (Some(c), Some(b)) => c.json(b, &c.snapshot().await),
            _ => Value::Null,
        };
        let apiserver = probe::apiserver_json(
            &probe::apiserver_metrics(&self.cluster.client).await,
            &api_before,
        );
        let load_after = probe::loadavg();
        // Read after the snapshots, so the parsing is not in the controller's window.
        let own = self.own();
        let audit_read = audit_mark.map(|m| audit::read_since(&m, &own));
        let identity = audit_read
            .as_ref()
            .and_then(|r| audit::identity(&r.entries));
        let rounds: Vec<Value> = rounds
            .iter()
            .map(|r| r.json(audit_read.as_ref(), identity.as_ref()))
            .collect();
        json!({
            "rounds": rounds,
            "scale_s": round3(scale_s),
            "loadavg": {"before": load_before, "after": load_after},
            "controller": controller_json,
            "control_plane": control_plane,
            "apiserver_queues": apiserver,
            "audit": audit::phase_json(audit_read.as_ref(), &own),
        })
    }

    /// One scale-down of every set, in a seeded order, until every orphaned claim is gone (and
    /// no cleanup pod is left). Returns what the watches recorded; [`RoundData::json`] turns it
    /// into the round's JSON once the audit log of the phase is read.
    async fn round(&mut self, round: usize, p: &Params, mode: Mode, rng: &mut Rng) -> RoundData {
        self.refresh();
        let orphans = self.orphans(round, p);
        let (pod_mark, claim_mark, set_mark) = (
            self.pods.mark(),
            self.claims.mark(),
            self.set_watches.mark(),
        );
        let mut order = self.sets.clone();
        rng.shuffle(&mut order);
        let targets = self.targets(&order);
        let scale_start = Instant::now();
        let origin_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let issued = world::scale_all(&targets, p.to).await;
        let done = self.wait_round_done(&orphans, mode, p.timeout).await;
        let elapsed = scale_start.elapsed();
        let pods: Vec<Change> = self
            .pods
            .since(&pod_mark)
            .iter()
            .map(|s| change(s, scale_start))
            .collect();
        let claims: Vec<Change> = self
            .claims
            .since(&claim_mark)
            .iter()
            .map(|s| change(s, scale_start))
            .collect();
        let sets: Vec<SetChange> = self
            .set_watches
            .since(&set_mark)
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
        self.sets
            .iter()
            .flat_map(|set| (p.to..p.replicas).map(move |n| (set, n)))
            .map(|(set, n)| {
                let ns = self.namespace_of(set);
                let (pod, claim) = (format!("{}-{n}", set.1), format!("data-{}-{n}", set.1));
                Orphan {
                    round,
                    namespace: ns.to_string(),
                    set: set.1.clone(),
                    ordinal: n,
                    pod_uid: uid(self.latest_pods.get(ns, &pod)),
                    claim_uid: claim_uid(self.latest_claims.get(ns, &claim)),
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
            self.refresh();
            let left = orphans
                .iter()
                .filter(|o| {
                    let claim_left = self
                        .latest_claims
                        .get(&o.namespace, &o.claim)
                        .is_some_and(|c| c.uid == o.claim_uid);
                    let pod = self.latest_pods.get(&o.namespace, &o.pod);
                    let pod_left = match mode {
                        Mode::Controller => pod.is_some(),
                        Mode::Native => pod.is_some_and(|s| s.uid == o.pod_uid),
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

    /// Stops the controller, frees the sets of its finalizer, deletes the namespaces and their
    /// PVs and waits (at most `timeout`) until the namespaces are gone. Returns the seconds it
    /// took (null on timeout).
    async fn teardown(self, controller: Option<UnderTest>, timeout: Duration) -> Value {
        let started = Instant::now();
        if let Some(c) = controller {
            c.stop().await;
        }
        for ns in &self.namespaces {
            world::strip_finalizers(&ns.api()).await;
        }
        drop((self.pods, self.claims, self.set_watches));
        let gone = world::delete_namespaces(self.namespaces, timeout).await;
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
        // By name: an ordinal's changes are those of its pod, claim and set names (unique over
        // the phase's namespaces), so each timeline reads only its own.
        let pods = by_name(&self.pods, |c| &c.name);
        let claims = by_name(&self.claims, |c| &c.name);
        let sets = by_name(&self.sets, |c| &c.name);
        let deletes = by_name(&deletes, |d| &d.name);
        let timelines: Vec<Timeline> = self
            .orphans
            .iter()
            .map(|o| {
                timeline::timeline(
                    o,
                    group(&pods, &o.pod),
                    group(&claims, &o.claim),
                    group(&sets, &o.set),
                    group(&deletes, &o.pod),
                )
            })
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

/// `items` grouped by the name `name_of` gives, each group in the order of `items`.
fn by_name<'a, T: Clone>(
    items: &'a [T],
    name_of: impl Fn(&'a T) -> &'a String,
) -> HashMap<&'a str, Vec<T>> {
    let mut out: HashMap<&str, Vec<T>> = HashMap::new();
    for item in items {
        out.entry(name_of(item).as_str())
            .or_default()
            .push(item.clone());
    }
    out
}

/// The group of `name` (empty if none).
fn group<'m, T>(groups: &'m HashMap<&str, Vec<T>>, name: &str) -> &'m [T] {
    groups.get(name).map_or(&[], Vec::as_slice)
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

/// Checks of the placement of sets over namespaces and of the controller's scope; the number of
/// checks, or what failed.
pub fn self_test() -> Result<usize, String> {
    let mut checks = 0;
    let mut expect = |ok: bool, what: &str| -> Result<(), String> {
        checks += 1;
        if ok {
            Ok(())
        } else {
            Err(format!("scaledown: {what}"))
        }
    };
    let sets = placement(300, 3);
    let per: Vec<usize> = (0..3)
        .map(|j| sets.iter().filter(|(i, _)| *i == j).count())
        .collect();
    expect(
        per == [100, 100, 100],
        &format!("300 sets in 3 blocks: {per:?}"),
    )?;
    expect(
        sets[99] == (0, "s-0099".into()) && sets[100] == (1, "s-0100".into()),
        "blocks in order, names unique over the namespaces",
    )?;
    let names: std::collections::HashSet<String> =
        placement(5000, 10).into_iter().map(|s| s.1).collect();
    expect(names.len() == 5000, "5,000 distinct names")?;
    expect(
        placement(5, 10).iter().all(|(i, _)| *i < 5),
        "never more namespaces than sets",
    )?;
    let others = ["other".to_string()];
    expect(
        scope(Mode::Controller, 1, &[], &[]) == Ok(Some("cluster")),
        "a cluster of its own: cluster scope",
    )?;
    expect(
        scope(Mode::Controller, 1, &others, &[]) == Ok(Some("namespace")),
        "shared, one namespace: --namespace",
    )?;
    expect(
        scope(Mode::Controller, 3, &others, &[]).is_err(),
        "shared, three namespaces: refused",
    )?;
    expect(
        scope(Mode::Native, 3, &others, &[]) == Ok(None),
        "no controller, no scope",
    )?;
    Ok(checks)
}
