//! From watch recordings to per-ordinal timelines and latency summaries. Pure functions over
//! plain records, so `--self-test` can check them on synthetic recordings without a cluster.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::audit::{CONTROLLER, PodDelete};

/// One recorded change, reduced to what the timelines need. `at_ms` counts from the scale-down.
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub at_ms: f64,
    pub name: String,
    pub uid: String,
    pub gone: bool,
    pub deleting: bool,
    /// Pods: carries the `scaledown-pod` label (a cleanup pod).
    pub cleanup: bool,
    /// Pods: the phase ("Succeeded", ...).
    pub phase: String,
    /// Pods: still carries the controller's scheduling gate (`naming::CONFIRM_GATE`).
    pub gated: bool,
    /// Pods: bound to a node (`spec.nodeName` set).
    pub scheduled: bool,
    /// Pods: the first container's state as the kubelet (or KWOK) reported it (see [`Container`]).
    pub container: Container,
}

/// The state of a pod's first container in `status.containerStatuses`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Container {
    /// No status for it yet: no kubelet has reported on the pod.
    #[default]
    Unreported,
    /// Reported, not started (`waiting`: ContainerCreating, ...).
    Waiting,
    Running,
    /// `terminated` (exited, whatever the code).
    Terminated,
}

impl Change {
    /// The pod started: a phase past Pending.
    fn started(&self) -> bool {
        matches!(self.phase.as_str(), "Running" | "Succeeded" | "Failed")
    }

    /// The pod's container has exited, or the pod is done (`Succeeded`, `Failed`).
    fn exited(&self) -> bool {
        self.container == Container::Terminated
            || matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// A recorded change of a StatefulSet: whether its status showed the StatefulSet controller done
/// with the scale-down (`observedGeneration` at `generation`, `status.replicas` at most
/// `spec.replicas`, and `spec.replicas` the round's target): the controller's release rule.
#[derive(Clone, Debug)]
pub struct SetChange {
    pub at_ms: f64,
    pub name: String,
    pub caught_up: bool,
}

/// An ordinal the scale-down orphaned: its stateful pod and claim as they were before.
#[derive(Clone, Debug)]
pub struct Orphan {
    pub round: usize,
    pub namespace: String,
    pub set: String,
    pub ordinal: i32,
    pub pod: String,
    pub pod_uid: String,
    pub claim: String,
    pub claim_uid: String,
}

/// When things happened to one orphaned ordinal, in ms since the scale-down (None: not seen).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub pod_gone: Option<f64>,
    pub cleanup_created: Option<f64>,
    pub cleanup_succeeded: Option<f64>,
    pub claim_deleting: Option<f64>,
    pub claim_gone: Option<f64>,
    /// Distinct cleanup pods (UIDs) seen under the ordinal's name.
    pub cleanup_pods: usize,
    /// The first cleanup pod seen without the confirm gate: when it was first seen (created), and
    /// when first without the gate (released).
    pub released_pod_created: Option<f64>,
    pub cleanup_released: Option<f64>,
    /// The set's status first showed the scale-down done (see [`SetChange`]).
    pub set_caught_up: Option<f64>,
    /// Cleanup pods that went away (deletionTimestamp or gone) before they started.
    pub deleted_before_start: Vec<PodEnd>,
    /// Cleanup pods that someone other than the controller deleted after they started.
    pub deleted_by_others_after_start: Vec<PodEnd>,
    /// The cleanup pod whose container started first (see [`container_times`]): first seen bound
    /// to a node, first seen with a container status (the kubelet's first report), first seen with
    /// its container running (or already terminated: `running_missed`), first seen exited.
    pub cleanup_scheduled: Option<f64>,
    pub cleanup_reported: Option<f64>,
    pub cleanup_running: Option<f64>,
    pub running_missed: bool,
    pub cleanup_exited: Option<f64>,
}

/// A cleanup pod that went away: when the watch saw it go, whether it still had its gate then,
/// and who sent the DELETE (None: not found in the audit log).
#[derive(Clone, Debug, PartialEq)]
pub struct PodEnd {
    pub uid: String,
    pub at_ms: f64,
    pub gated: bool,
    pub by: Option<String>,
}

impl PodEnd {
    /// Deleted by someone else than the controller (or by no one the audit log names).
    pub fn by_others(&self) -> bool {
        self.by.as_deref() != Some(CONTROLLER)
    }
}

/// Slack for the two clocks behind one comparison: a watch event's arrival (bench) and the audit
/// log's timestamps (API server), both read on this machine.
const CLOCK_SLACK_MS: f64 = 2.0;

/// The DELETE that made the pod `name` (first seen at `created`) go away at `ended`: the last
/// successful DELETE of that name received before the watch saw it go, if that one was not
/// answered long before the pod existed.
fn deleter<'a>(
    deletes: &'a [PodDelete],
    name: &str,
    created: f64,
    ended: f64,
) -> Option<&'a PodDelete> {
    deletes
        .iter()
        .filter(|d| d.name == name && d.received_ms <= ended + CLOCK_SLACK_MS)
        .max_by(|a, b| a.received_ms.total_cmp(&b.received_ms))
        .filter(|d| d.done_ms >= created - 1000.0)
}

/// The timeline of `orphan` from the pod and claim changes recorded since its round began, and the
/// successful pod DELETEs of the audit log in the same time frame (empty without one).
pub fn timeline(
    orphan: &Orphan,
    pods: &[Change],
    claims: &[Change],
    sets: &[SetChange],
    deletes: &[PodDelete],
) -> Timeline {
    let pod_gone = pods
        .iter()
        .find(|c| c.uid == orphan.pod_uid && c.gone)
        .map(|c| c.at_ms);
    let cleanups: Vec<&Change> = pods
        .iter()
        .filter(|c| c.name == orphan.pod && c.cleanup && c.uid != orphan.pod_uid)
        .collect();
    let uids: BTreeSet<&str> = cleanups.iter().map(|c| c.uid.as_str()).collect();
    // In the order they appeared.
    let mut order: Vec<&str> = Vec::new();
    for c in &cleanups {
        if !order.contains(&c.uid.as_str()) {
            order.push(&c.uid);
        }
    }
    let mut t = Timeline {
        pod_gone,
        cleanup_created: cleanups.first().map(|c| c.at_ms),
        cleanup_succeeded: cleanups
            .iter()
            .find(|c| c.phase == "Succeeded")
            .map(|c| c.at_ms),
        claim_deleting: claims
            .iter()
            .find(|c| c.uid == orphan.claim_uid && (c.deleting || c.gone))
            .map(|c| c.at_ms),
        claim_gone: claims
            .iter()
            .find(|c| c.uid == orphan.claim_uid && c.gone)
            .map(|c| c.at_ms),
        cleanup_pods: uids.len(),
        set_caught_up: sets
            .iter()
            .find(|c| c.name == orphan.set && c.caught_up && c.at_ms >= 0.0)
            .map(|c| c.at_ms),
        ..Timeline::default()
    };
    for uid in order {
        let changes: Vec<&Change> = cleanups.iter().copied().filter(|c| c.uid == uid).collect();
        let created = changes[0].at_ms;
        let end = changes.iter().position(|c| c.deleting || c.gone);
        let alive = &changes[..end.unwrap_or(changes.len())];
        let released = alive.iter().find(|c| !c.gated).map(|c| c.at_ms);
        if t.cleanup_released.is_none() && released.is_some() {
            t.released_pod_created = Some(created);
            t.cleanup_released = released;
        }
        let Some(end) = end.map(|i| changes[i]) else {
            continue;
        };
        let started = alive.iter().any(|c| c.started());
        let pod_end = PodEnd {
            uid: uid.to_string(),
            at_ms: end.at_ms,
            gated: released.is_none(),
            by: deleter(deletes, &orphan.pod, created, end.at_ms).map(|d| d.actor.clone()),
        };
        if !started {
            t.deleted_before_start.push(pod_end);
        } else if pod_end.by.as_deref().is_some_and(|by| by != CONTROLLER) {
            t.deleted_by_others_after_start.push(pod_end);
        }
    }
    container_times(&mut t, &cleanups);
    t
}

/// The container's side of an ordinal's cleanup, from the changes of its cleanup pods (in the
/// order seen): the pod whose container was first seen started (running, or already terminated
/// when one status update carried both the start and the exit), and when that pod was first seen
/// scheduled, reported on by a kubelet, started and exited (container terminated, or the pod
/// Succeeded or Failed). Without a started container (KWOK may report none), only the first
/// exit of any of them.
fn container_times(t: &mut Timeline, cleanups: &[&Change]) {
    let started = |c: &&&Change| matches!(c.container, Container::Running | Container::Terminated);
    let Some(ran) = cleanups.iter().find(started) else {
        t.cleanup_exited = cleanups.iter().find(|c| c.exited()).map(|c| c.at_ms);
        return;
    };
    let own: Vec<&Change> = cleanups
        .iter()
        .copied()
        .filter(|c| c.uid == ran.uid)
        .collect();
    let first = |f: &dyn Fn(&Change) -> bool| own.iter().find(|c| f(c)).map(|c| c.at_ms);
    t.cleanup_scheduled = first(&|c| c.scheduled);
    t.cleanup_reported = first(&|c| c.container != Container::Unreported);
    t.cleanup_running = Some(ran.at_ms);
    t.running_missed = ran.container == Container::Terminated;
    t.cleanup_exited = first(&|c| c.exited());
}

/// The latencies the bench reports, each from one event of an ordinal to a later one. The last
/// six follow the cleanup pod's container (the `realnode` scenario's; KWOK reports containers too).
pub const LATENCIES: [(&str, &str, &str); 12] = [
    ("pod_gone_to_cleanup_created", "pod_gone", "cleanup_created"),
    (
        "cleanup_succeeded_to_claim_deleting",
        "cleanup_succeeded",
        "claim_deleting",
    ),
    ("pod_gone_to_claim_deleting", "pod_gone", "claim_deleting"),
    ("pod_gone_to_claim_gone", "pod_gone", "claim_gone"),
    (
        "cleanup_created_to_released",
        "released_pod_created",
        "cleanup_released",
    ),
    (
        "release_allowed_to_released",
        "release_allowed",
        "cleanup_released",
    ),
    ("pod_gone_to_cleanup_running", "pod_gone", "cleanup_running"),
    (
        "cleanup_exited_to_claim_deleting",
        "cleanup_exited",
        "claim_deleting",
    ),
    (
        "cleanup_released_to_scheduled",
        "cleanup_released",
        "cleanup_scheduled",
    ),
    (
        "cleanup_scheduled_to_reported",
        "cleanup_scheduled",
        "cleanup_reported",
    ),
    (
        "cleanup_reported_to_running",
        "cleanup_reported",
        "cleanup_running",
    ),
    (
        "cleanup_running_to_exited",
        "cleanup_running",
        "cleanup_exited",
    ),
];

impl Timeline {
    pub fn get(&self, event: &str) -> Option<f64> {
        match event {
            "pod_gone" => self.pod_gone,
            "cleanup_created" => self.cleanup_created,
            "cleanup_succeeded" => self.cleanup_succeeded,
            "claim_deleting" => self.claim_deleting,
            "claim_gone" => self.claim_gone,
            "released_pod_created" => self.released_pod_created,
            "cleanup_released" => self.cleanup_released,
            "set_caught_up" => self.set_caught_up,
            "cleanup_scheduled" => self.cleanup_scheduled,
            "cleanup_reported" => self.cleanup_reported,
            "cleanup_running" => self.cleanup_running,
            "cleanup_exited" => self.cleanup_exited,
            // The release rule holds from here on: the released pod exists and the set's status
            // shows the StatefulSet controller done.
            "release_allowed" => Some(self.released_pod_created?.max(self.set_caught_up?)),
            _ => None,
        }
    }
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// n, p50, p90, p99, max and mean of `values` (ms, rounded to 0.1 ms).
pub fn summary(values: &[f64]) -> Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let r = |v: Option<f64>| v.map(|x| (x * 10.0).round() / 10.0);
    let mean = (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64);
    json!({
        "n": sorted.len(),
        "p50": r(quantile(&sorted, 0.5)),
        "p90": r(quantile(&sorted, 0.9)),
        "p99": r(quantile(&sorted, 0.99)),
        "max": r(sorted.last().copied()),
        "mean": r(mean),
    })
}

/// Per latency name, the summary over every timeline that has both of its events.
pub fn latency_summaries(timelines: &[Timeline]) -> BTreeMap<&'static str, Value> {
    LATENCIES
        .iter()
        .map(|(name, from, to)| {
            let values: Vec<f64> = timelines
                .iter()
                .filter_map(|t| Some(t.get(to)? - t.get(from)?))
                .collect();
            (*name, summary(&values))
        })
        .collect()
}

pub fn timeline_json(orphan: &Orphan, t: &Timeline) -> Value {
    json!({
        "round": orphan.round,
        "set": orphan.set,
        "ordinal": orphan.ordinal,
        "pod_gone_ms": t.pod_gone,
        "cleanup_created_ms": t.cleanup_created,
        "cleanup_succeeded_ms": t.cleanup_succeeded,
        "claim_deleting_ms": t.claim_deleting,
        "claim_gone_ms": t.claim_gone,
        "cleanup_pods": t.cleanup_pods,
        "released_pod_created_ms": t.released_pod_created,
        "cleanup_released_ms": t.cleanup_released,
        "set_caught_up_ms": t.set_caught_up,
        "cleanup_scheduled_ms": t.cleanup_scheduled,
        "cleanup_reported_ms": t.cleanup_reported,
        "cleanup_running_ms": t.cleanup_running,
        "running_missed": t.running_missed,
        "cleanup_exited_ms": t.cleanup_exited,
        "deleted_before_start": t.deleted_before_start.iter().map(pod_end_json).collect::<Vec<_>>(),
        "deleted_by_others_after_start": t.deleted_by_others_after_start.iter().map(pod_end_json).collect::<Vec<_>>(),
    })
}

fn pod_end_json(e: &PodEnd) -> Value {
    json!({"uid": e.uid, "at_ms": e.at_ms, "gated": e.gated, "by": e.by})
}

/// A round's cleanup pods over all its ordinals: creates (distinct UIDs seen), and the pods that
/// went away before they started, by whom.
pub fn cleanup_summary(timelines: &[Timeline], audit: bool) -> Value {
    let ordinals = timelines.len();
    let total: usize = timelines.iter().map(|t| t.cleanup_pods).sum();
    let early: Vec<&PodEnd> = timelines
        .iter()
        .flat_map(|t| &t.deleted_before_start)
        .collect();
    let late: Vec<&&PodEnd> = early.iter().filter(|e| e.by_others()).collect();
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for e in &late {
        *by.entry(e.by.clone().unwrap_or_else(|| "unknown".into()))
            .or_insert(0) += 1;
    }
    let after: usize = timelines
        .iter()
        .map(|t| t.deleted_by_others_after_start.len())
        .sum();
    json!({
        "ordinals": ordinals,
        "creates_total": total,
        "creates_per_ordinal": (ordinals > 0).then(|| total as f64 / ordinals as f64),
        "creates_max_per_ordinal": timelines.iter().map(|t| t.cleanup_pods).max(),
        "ordinals_with_more_than_one": timelines.iter().filter(|t| t.cleanup_pods > 1).count(),
        "audit": audit,
        "deleted_before_start": early.len(),
        "late_deletes": audit.then_some(late.len()),
        "late_deletes_gated": audit.then(|| late.iter().filter(|e| e.gated).count()),
        "late_deletes_by": audit.then_some(by),
        "deleted_by_controller_before_start": audit.then(|| early.len() - late.len()),
        "deleted_by_others_after_start": audit.then_some(after),
    })
}

/// Checks the functions above on synthetic recordings; the number of checks, or what failed.
pub fn self_test() -> Result<usize, String> {
    let mut checks = 0;
    let mut expect = |ok: bool, what: &str| -> Result<(), String> {
        checks += 1;
        if ok { Ok(()) } else { Err(what.to_string()) }
    };
    let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
    expect(quantile(&sorted, 0.5) == Some(50.0), "p50 of 1..=100 is 50")?;
    expect(
        quantile(&sorted, 0.99) == Some(99.0),
        "p99 of 1..=100 is 99",
    )?;
    expect(quantile(&sorted, 1.0) == Some(100.0), "p100 is the max")?;
    expect(
        quantile(&[7.0], 0.01) == Some(7.0),
        "any quantile of one value is it",
    )?;
    expect(quantile(&[], 0.5).is_none(), "no quantile of nothing")?;

    let change = |at_ms: f64,
                  name: &str,
                  uid: &str,
                  gone: bool,
                  deleting: bool,
                  cleanup: bool,
                  phase: &str,
                  gated: bool| Change {
        at_ms,
        name: name.into(),
        uid: uid.into(),
        gone,
        deleting,
        cleanup,
        phase: phase.into(),
        gated,
        ..Change::default()
    };
    let orphan = |pod: &str, pod_uid: &str, claim_uid: &str| Orphan {
        round: 0,
        namespace: "ns".into(),
        set: "s".into(),
        ordinal: 1,
        pod: pod.into(),
        pod_uid: pod_uid.into(),
        claim: format!("data-{pod}"),
        claim_uid: claim_uid.into(),
    };
    let pods = vec![
        change(5.0, "s-1", "p1", false, true, false, "Running", false),
        change(10.0, "s-1", "p1", true, true, false, "Running", false),
        // A look-alike of another ordinal and a cleanup pod of another set do not count.
        change(11.0, "s-2", "x", false, false, true, "Pending", true),
        // The first cleanup pod is hit by a late delete while gated.
        change(20.0, "s-1", "k0", false, false, true, "Pending", true),
        change(25.0, "s-1", "k0", true, true, true, "Pending", true),
        // The second one is released, runs and succeeds; the controller deletes it.
        change(40.0, "s-1", "k1", false, false, true, "Pending", true),
        change(50.0, "s-1", "k1", false, false, true, "Pending", false),
        change(60.0, "s-1", "k1", false, false, true, "Running", false),
        change(90.0, "s-1", "k1", false, false, true, "Succeeded", false),
        change(95.0, "s-1", "k1", false, true, true, "Succeeded", false),
        change(96.0, "s-1", "k1", true, true, true, "Succeeded", false),
        // A third create, deleted by the controller before it ran.
        change(97.0, "s-1", "k2", false, false, true, "Pending", true),
        change(99.0, "s-1", "k2", true, true, true, "Pending", true),
        // s-3: a cleanup pod deleted by someone else while it ran.
        change(30.0, "s-3", "k9", false, false, true, "Pending", true),
        change(31.0, "s-3", "k9", false, false, true, "Running", false),
        change(36.0, "s-3", "k9", false, true, true, "Running", false),
        // s-4: gone while gated, and no DELETE in the log that could have done it.
        change(2000.0, "s-4", "k7", false, false, true, "Pending", true),
        change(2100.0, "s-4", "k7", true, true, true, "Pending", true),
    ];
    let claims = vec![
        change(1.0, "data-s-1", "c1", false, false, false, "", false),
        change(120.0, "data-s-1", "c1", false, true, false, "", false),
        change(130.0, "data-s-1", "c1", true, true, false, "", false),
    ];
    let kcm = "kube-controller-manager (statefulset-controller)";
    let delete = |name: &str, received_ms: f64, actor: &str| PodDelete {
        name: name.into(),
        received_ms,
        done_ms: received_ms + 0.5,
        actor: actor.into(),
    };
    let deletes = vec![
        delete("s-1", 4.0, kcm),
        delete("s-1", 9.0, "kwok"),
        delete("s-1", 23.0, kcm),
        delete("s-2", 24.5, CONTROLLER),
        delete("s-1", 94.0, CONTROLLER),
        delete("s-1", 98.0, CONTROLLER),
        delete("s-3", 35.5, kcm),
        delete("s-4", 5.0, "kwok"),
    ];
    let end = |uid: &str, at_ms: f64, gated: bool, by: Option<&str>| PodEnd {
        uid: uid.into(),
        at_ms,
        gated,
        by: by.map(str::to_string),
    };
    let sets = vec![
        SetChange {
            at_ms: -50.0,
            name: "s".into(),
            caught_up: true,
        },
        SetChange {
            at_ms: 1.0,
            name: "s".into(),
            caught_up: false,
        },
        SetChange {
            at_ms: 45.0,
            name: "s".into(),
            caught_up: true,
        },
    ];
    let t = timeline(&orphan("s-1", "p1", "c1"), &pods, &claims, &sets, &deletes);
    let want = Timeline {
        pod_gone: Some(10.0),
        cleanup_created: Some(20.0),
        cleanup_succeeded: Some(90.0),
        claim_deleting: Some(120.0),
        claim_gone: Some(130.0),
        cleanup_pods: 3,
        released_pod_created: Some(40.0),
        cleanup_released: Some(50.0),
        set_caught_up: Some(45.0),
        deleted_before_start: vec![
            end("k0", 25.0, true, Some(kcm)),
            end("k2", 99.0, true, Some(CONTROLLER)),
        ],
        deleted_by_others_after_start: vec![],
        // No container statuses here: the exit is the pod's Succeeded.
        cleanup_exited: Some(90.0),
        ..Timeline::default()
    };
    expect(t == want, &format!("timeline: got {t:?}, want {want:?}"))?;
    let s = latency_summaries(std::slice::from_ref(&t));
    expect(
        s["pod_gone_to_cleanup_created"]["p50"] == json!(10.0),
        "created - gone = 10",
    )?;
    expect(
        s["cleanup_succeeded_to_claim_deleting"]["max"] == json!(30.0),
        "deleting - succeeded = 30",
    )?;
    expect(
        s["cleanup_created_to_released"]["p99"] == json!(10.0),
        "released - created of the released pod = 10",
    )?;
    expect(
        s["release_allowed_to_released"]["p50"] == json!(5.0),
        "released - max(created, set caught up) = 5",
    )?;
    expect(s["pod_gone_to_claim_gone"]["n"] == json!(1), "one sample")?;
    let ran = timeline(&orphan("s-3", "p3", "c3"), &pods, &claims, &[], &deletes);
    expect(
        ran.deleted_before_start.is_empty()
            && ran.deleted_by_others_after_start == vec![end("k9", 36.0, false, Some(kcm))],
        &format!("a running cleanup pod deleted by kcm: {ran:?}"),
    )?;
    let unknown = timeline(&orphan("s-4", "p4", "c4"), &pods, &claims, &[], &deletes);
    expect(
        unknown.deleted_before_start == vec![end("k7", 2100.0, true, None)],
        "a DELETE answered before the pod existed did not delete it",
    )?;
    let summary = cleanup_summary(&[t.clone(), unknown], true);
    expect(
        summary["creates_total"] == json!(4)
            && summary["creates_max_per_ordinal"] == json!(3)
            && summary["late_deletes"] == json!(2)
            && summary["late_deletes_gated"] == json!(2)
            && summary["late_deletes_by"][kcm] == json!(1)
            && summary["late_deletes_by"]["unknown"] == json!(1)
            && summary["deleted_by_controller_before_start"] == json!(1),
        &format!("cleanup summary {summary}"),
    )?;
    expect(
        cleanup_summary(std::slice::from_ref(&t), false)["late_deletes"].is_null(),
        "no audit log, no late deletes claimed",
    )?;
    // Native: no cleanup pod, the claim deleted by the garbage collector.
    let native = timeline(&orphan("s-1", "p1", "c1"), &pods[..2], &claims, &[], &[]);
    expect(
        native.cleanup_created.is_none() && native.cleanup_pods == 0,
        "no cleanup pod in a native run",
    )?;
    let s = latency_summaries(&[native]);
    expect(
        s["pod_gone_to_cleanup_created"]["n"] == json!(0)
            && s["pod_gone_to_claim_gone"]["p99"] == json!(120.0),
        "native latencies",
    )?;
    Ok(checks + container_self_test()?)
}

/// Checks [`container_times`] on a synthetic real-node recording: a cleanup pod deleted while
/// gated, then one scheduled, reported, running, exited; and one whose first report is the exit.
fn container_self_test() -> Result<usize, String> {
    let c = |at_ms: f64, uid: &str, scheduled: bool, container: Container, phase: &str| Change {
        at_ms,
        name: "s-1".into(),
        uid: uid.into(),
        cleanup: true,
        phase: phase.into(),
        gated: !scheduled,
        scheduled,
        container,
        gone: phase == "gone",
        deleting: phase == "gone",
    };
    use Container::*;
    let pods = vec![
        Change {
            at_ms: 10.0,
            name: "s-1".into(),
            uid: "p1".into(),
            gone: true,
            deleting: true,
            phase: "Running".into(),
            container: Running,
            scheduled: true,
            ..Change::default()
        },
        c(20.0, "k0", false, Unreported, "Pending"),
        c(25.0, "k0", false, Unreported, "gone"),
        c(40.0, "k1", false, Unreported, "Pending"),
        c(50.0, "k1", true, Unreported, "Pending"),
        c(300.0, "k1", true, Waiting, "Pending"),
        c(1300.0, "k1", true, Running, "Running"),
        c(3300.0, "k1", true, Terminated, "Running"),
        c(3400.0, "k1", true, Terminated, "Succeeded"),
    ];
    let claims = vec![Change {
        at_ms: 3500.0,
        name: "data-s-1".into(),
        uid: "c1".into(),
        deleting: true,
        ..Change::default()
    }];
    let orphan = Orphan {
        round: 0,
        namespace: "ns".into(),
        set: "s".into(),
        ordinal: 1,
        pod: "s-1".into(),
        pod_uid: "p1".into(),
        claim: "data-s-1".into(),
        claim_uid: "c1".into(),
    };
    let t = timeline(&orphan, &pods, &claims, &[], &[]);
    let mut checks = 0;
    let mut expect = |ok: bool, what: String| -> Result<(), String> {
        checks += 1;
        if ok { Ok(()) } else { Err(what) }
    };
    expect(
        t.cleanup_scheduled == Some(50.0)
            && t.cleanup_reported == Some(300.0)
            && t.cleanup_running == Some(1300.0)
            && !t.running_missed
            && t.cleanup_exited == Some(3300.0),
        format!("the container times of the pod that ran, not of the one deleted before: {t:?}"),
    )?;
    let s = latency_summaries(std::slice::from_ref(&t));
    expect(
        s["pod_gone_to_cleanup_running"]["p50"] == json!(1290.0)
            && s["cleanup_exited_to_claim_deleting"]["p50"] == json!(200.0)
            && s["cleanup_scheduled_to_reported"]["p50"] == json!(250.0),
        format!(
            "gone -> running 1290, exited -> claim deleting 200, scheduled -> reported 250: {s:?}"
        ),
    )?;
    // One status update with the start and the exit: running is that update, flagged as missed.
    let short = [&pods[..5], &[c(900.0, "k1", true, Terminated, "Succeeded")]].concat();
    let t = timeline(&orphan, &short, &claims, &[], &[]);
    expect(
        t.cleanup_running == Some(900.0)
            && t.running_missed
            && t.cleanup_exited == Some(900.0)
            && t.cleanup_reported == Some(900.0),
        format!("a container first reported terminated: {t:?}"),
    )?;
    Ok(checks)
}
