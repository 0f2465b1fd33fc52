//! End-to-end tests of docs/usage.md's "No hot loop" and "One writer at a time, even with two"
//! (section "Safety contract").
//!
//! 1. A persistent record failure: a ValidatingAdmissionPolicy refuses every update of one
//!    StatefulSet that changes its record annotation
//!    (`statefulsets.kubernetes.io/scaledown-cleanups`), so the controller can create a cleanup
//!    pod for it but never record it. For 60 s, the refused set's cleanup pod creates must follow
//!    the per-set error backoff (not the watch event rate), one Warning `ReconcileFailed` per
//!    distinct answer must appear, and two other sets of the namespace must be cleaned up
//!    meanwhile. Run once with the policy answering 422 (`Invalid`, the answer of a failed
//!    compare-and-swap) and once with 403 (`Forbidden`, as a webhook or RBAC).
//! 2. Two writers: two controller instances without leader election on one namespace. A scale-down
//!    4→1 gets one cleanup pod per ordinal; a failing cleanup gets exactly one pod per attempt
//!    (attempt annotations 1, 2, 3) and then `CleanupGaveUp`.
//!
//! Everything is asserted over watch recordings ([`support::recorder::Recorder`]) of the whole
//! window. Besides, every test namespace runs the hot-loop detector of `tests/support/hotloop.rs`.
//!
//! Run with `KUBECONFIG=target/cluster/kubeconfig cargo test --test e2e_hotloop -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use statefulset_scaledown_controller::naming::{ATTEMPT_ANNOTATION, RECORD_ANNOTATION};
use support::fixtures::*;
use support::hotloop::created_by_controller;
use support::recorder::{self, Recorder, Seen, event_note};
use support::{AFTER_ANNOTATION, OUTCOME_LABEL, from_json, wait_for};

/// The window of the persistent record failure.
const WINDOW: Duration = Duration::from_secs(60);

/// The refused set's cleanup pod creates expected in [`WINDOW`]. Every failed pass creates one pod
/// (its record is refused, and the pass deletes it), and the set then waits out the error backoff
/// of `src/scaledown/reconcile.rs`: 1 s doubling (1, 2, 4, 8, 16, 32 s; capped at 5 min), whatever
/// watch events arrive. Passes therefore start about 0, 1, 3, 7, 15 and 31 s after the first one;
/// the seventh would start at 63 s, after the window: six creates.
const EXPECTED_CREATES: usize = 6;
/// What the test allows: the six, plus two for passes started a little early or late (the time a
/// failed pass itself takes is not part of the backoff). A hot loop creates a pod per watch event
/// (several per second) and crosses this within the first seconds.
const CREATES_BOUND: usize = EXPECTED_CREATES + 2;

/// How long a cleanup pod whose record was refused may hold its name: its failed pass deletes it
/// (three record tries, two reads of the set and a delete take well under a second here).
const UNRECORDED_LIFE: Duration = Duration::from_secs(5);

/// The message of the test's admission policy (part of every refusal's answer).
const REFUSAL: &str = "the scale-down record of this StatefulSet is refused by the test's policy";

// === shared ===

/// The first recorded state of every cleanup pod `name` that the controller created (one per
/// UID, in order of creation).
fn created(pods: &Recorder<Pod>, name: &str) -> Vec<Seen<Pod>> {
    let mut firsts: Vec<Seen<Pod>> = Vec::new();
    for s in pods.of(name) {
        if !firsts.iter().any(|f| f.uid == s.uid) && created_by_controller(&s.object) {
            firsts.push(s);
        }
    }
    firsts
}

/// The attempt annotation of a recorded pod ("?" when it has none).
fn attempt_of(s: &Seen<Pod>) -> String {
    s.annotations
        .get(ATTEMPT_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| "?".into())
}

/// Panics unless claim `name` was deleted (or marked for deletion) within `timeout`.
async fn wait_claim_deleted(
    claims: &Recorder<PersistentVolumeClaim>,
    name: &str,
    timeout: Duration,
) {
    claims
        .wait_for(&format!("claim {name} to be deleted"), timeout, |s| {
            s.name == name && s.deleting
        })
        .await;
}

/// How many Events (summed over series) of ours about `regarding` with `reason`.
fn event_count(events: &Recorder<Event>, regarding: &str, reason: &str) -> i32 {
    events
        .events(regarding, reason)
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

// === 1. a persistent record failure ===

/// A ValidatingAdmissionPolicy (and its binding to one namespace) that refuses every update of
/// StatefulSet `set` that changes its record annotation, answering with `reason` ("Invalid": 422,
/// "Forbidden": 403). Cluster-scoped; deleted when dropped.
struct RecordRefusal {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl Drop for RecordRefusal {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = std::process::Command::new(support::kubectl_binary())
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args([
                    "delete",
                    kind,
                    &self.name,
                    "--ignore-not-found",
                    "--wait=false",
                ])
                .output();
        }
    }
}

async fn refuse_record(env: &Env, set: &str, reason: &str) -> RecordRefusal {
    let name = format!("refuse-record-{}", env.ns.name);
    let annotation = |o: &str| {
        format!(
            "(has({o}.metadata.annotations) && '{RECORD_ANNOTATION}' in {o}.metadata.annotations ? {o}.metadata.annotations['{RECORD_ANNOTATION}'] : '')"
        )
    };
    let policy: ValidatingAdmissionPolicy = from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["statefulsets"]}]},
            "matchConditions": [{"name": "the-refused-set",
                "expression": format!("object.metadata.name == '{set}'")}],
            "validations": [{
                "expression": format!("{} == {}", annotation("object"), annotation("oldObject")),
                "message": REFUSAL,
                "reason": reason,
            }]
        }
    }));
    let binding = support::deny_in_namespace(&name, &env.ns.name);
    let client = env.ns.client();
    let post = PostParams::default();
    let guard = RecordRefusal {
        name: name.clone(),
        kubeconfig: env.cluster.kubeconfig.clone(),
    };
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&post, &policy)
        .await
        .expect("create the admission policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client)
        .create(&post, &binding)
        .await
        .expect("bind the admission policy");
    // The API server loads policies from its own informer: wait until a dry-run record is refused,
    // and check that a change of anything else still goes through.
    let code = if reason == "Forbidden" { 403 } else { 422 };
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let sets = env.sets();
    let record = json!({"metadata": {"annotations": {RECORD_ANNOTATION: "{\"probe\":1}"}}});
    wait_for("the admission policy to refuse records", LONG, || async {
        matches!(
            sets.patch(set, &dry_run, &Patch::Merge(&record)).await,
            Err(kube::Error::Api(s)) if s.code == code
        )
    })
    .await;
    let other = json!({"metadata": {"annotations": {"e2e.scaledown.io/probe": "1"}}});
    sets.patch(set, &dry_run, &Patch::Merge(&other))
        .await
        .expect("the policy lets other changes of the set through");
    guard
}

/// `refused` (2 replicas) has its record refused with `reason`; `a` and `b` (3 replicas each) do
/// not. All three scale to 1 at once, and the window runs for [`WINDOW`].
async fn persistent_record_failure(test: &str, reason: &str) {
    let env = Env::new(test, 8, &[]).await;
    for (name, replicas) in [("refused", 2), ("a", 3), ("b", 3)] {
        env.create_running(&SetSpec::new(name, replicas, &env.class))
            .await;
    }
    let _policy = refuse_record(&env, "refused", reason).await;
    // The opt-out of the hot-loop detector, with this test's own bound: every backoff step of the
    // refused set creates one pod in the same generation of the set.
    env.ns.allow_cleanup_creates(
        "refused",
        CREATES_BOUND,
        "its record is refused for the whole test; one create per error backoff step",
    );
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let events = env.record_events().await;

    let start = Instant::now();
    for set in ["refused", "a", "b"] {
        env.scale(set, 1).await;
    }
    // The other sets complete meanwhile (OrderedReady: ordinal 2, then 1).
    for claim in ["data-a-2", "data-a-1", "data-b-2", "data-b-1"] {
        wait_claim_deleted(&claims, claim, WINDOW.saturating_sub(start.elapsed())).await;
    }
    let others_done = start.elapsed();
    // The window is a recording: what happened in it is judged at its end.
    tokio::time::sleep_until((start + WINDOW).into()).await;
    let end = start + WINDOW;

    let creates: Vec<Seen<Pod>> = created(&pods, "refused-1")
        .into_iter()
        .filter(|s| s.at <= end)
        .collect();
    // How long each unrecorded pod held the name: the failed pass is to delete it at once.
    let lives: Vec<Option<Duration>> = creates
        .iter()
        .map(|s| pods.deletion_of(&s.uid).map(|d| d.at.duration_since(s.at)))
        .collect();
    let times: Vec<String> = creates
        .iter()
        .zip(&lives)
        .map(|(s, life)| {
            format!(
                "+{:.1}s (attempt {}, deleted after {})",
                s.at.duration_since(start).as_secs_f64(),
                attempt_of(s),
                life.map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()))
            )
        })
        .collect();
    let failed = events.events("refused", "ReconcileFailed");
    let report = format!(
        "record refused ({reason}): {} cleanup pod creates of refused-1 in {WINDOW:?} (expected {EXPECTED_CREATES}, bound {CREATES_BOUND}) at {times:?}; {} ReconcileFailed Event(s), {} in all; {} UnprovenCleanupPod Warning(s) about its own pods; other sets cleaned after {:.1}s",
        creates.len(),
        failed.len(),
        event_count(&events, "refused", "ReconcileFailed"),
        event_count(&events, "refused", "UnprovenCleanupPod"),
        others_done.as_secs_f64()
    );
    eprintln!("{report}");
    record(&format!("hot loop: {test}"), report.clone());
    assert!(
        !creates.is_empty(),
        "the controller never created a cleanup pod for refused-1: {report}"
    );

    // The contract (docs/usage.md, "No hot loop"), every part checked and reported together.
    let mut broken: Vec<String> = Vec::new();
    if creates.len() > CREATES_BOUND {
        broken.push(format!(
            "hot loop: {} creates > bound {CREATES_BOUND}",
            creates.len()
        ));
    }
    // None of them ran: a pod that was never recorded keeps its gate.
    for s in &creates {
        if let Some(ran) = pods.first(|p| p.uid == s.uid && recorder::ran(&p.object)) {
            broken.push(format!(
                "unrecorded cleanup pod {} ran (phase {:?}, node {:?})",
                s.uid,
                recorder::phase(&ran.object),
                recorder::node(&ran.object)
            ));
        }
    }
    if claims
        .first(|s| s.name == "data-refused-1" && s.deleting)
        .is_some()
    {
        broken.push("the refused set's claim data-refused-1 was deleted".into());
    }
    // "A pass that fails ... deletes the cleanup pods it created and could not record": within
    // the pass, so well before the next backoff step. The last pod may still be in its pass.
    for (s, life) in creates.iter().zip(&lives) {
        let created_at = s.at.duration_since(start);
        match life {
            Some(d) if *d > UNRECORDED_LIFE => broken.push(format!(
                "the pod created at +{:.1}s was deleted only after {:.1}s, not by its failed pass",
                created_at.as_secs_f64(),
                d.as_secs_f64()
            )),
            None if end.duration_since(s.at) > UNRECORDED_LIFE => broken.push(format!(
                "the pod created at +{:.1}s was never deleted by its failed pass",
                created_at.as_secs_f64()
            )),
            _ => {}
        }
    }
    // One Warning per distinct answer (the answer never changes here), published once, naming it.
    let total = event_count(&events, "refused", "ReconcileFailed");
    if total != 1 {
        broken.push(format!(
            "{total} Warning(s) ReconcileFailed on the refused set, not exactly one"
        ));
    }
    for e in &failed {
        if e.type_.as_deref() != Some("Warning") || !event_note(e).contains(REFUSAL) {
            broken.push(format!(
                "ReconcileFailed is not a Warning naming the API's answer ({REFUSAL:?}): {:?} {}",
                e.type_,
                event_note(e)
            ));
        }
    }
    for set in ["a", "b"] {
        let n = event_count(&events, set, "ReconcileFailed");
        if n > 0 {
            broken.push(format!(
                "set {set} had nothing refused, but {n} ReconcileFailed"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "the no-hot-loop contract does not hold for a record refused with {reason}:\n- {}\n{report}\nEvents:\n{}",
        broken.join("\n- "),
        events.describe()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn record_refused_as_invalid_backs_off() {
    persistent_record_failure("hotloop-record-422", "Invalid").await;
}

/// Fails at c2222a3: a record refused with 403 (not 409/422/404) makes the pass fail without
/// deleting the pod it created, so the next pass holds that gated pod for `RECORD_GRACE` (30 s) and
/// succeeds. The failures are never "in a row", no `ReconcileFailed` is published, and each pod is
/// deleted only as an `UnprovenCleanupPod` leftover 30 s later; then a new one is created.
#[tokio::test(flavor = "multi_thread")]
async fn record_refused_as_forbidden_backs_off() {
    persistent_record_failure("hotloop-record-403", "Forbidden").await;
}

// === 2. two writers ===

/// A second controller instance on `env`'s namespace, without leader election (like the first).
async fn second_writer(env: &Env) -> Controller {
    Controller::start_with_env(&env.cluster, &env.ns.name, &[], &[("POD_NAME", "writer-b")]).await
}

/// How many cleanup pods each controller log says it created and recorded.
fn created_per_writer(writers: &[&Controller]) -> Vec<usize> {
    // The reporter's line of the Event `SuccessfulCreate` (written once the pod is recorded).
    log_lines(writers, |l| {
        l.contains("SuccessfulCreate") && l.contains("create cleanup pod ")
    })
}

/// Per writer: its creates answered 409 (the other writer held the name), and its passes that saw
/// the other's pod before it was recorded (an unproven, gated pod: held for `RECORD_GRACE`). Shows
/// that the two really met.
fn collisions(writers: &[&Controller]) -> String {
    let conflicts = log_lines(writers, |l| l.contains("cleanup pod already exists"));
    let held = log_lines(writers, |l| {
        l.contains(" decided ") && l.contains("): unproven")
    });
    format!(
        "creates answered 409 per writer {conflicts:?}, passes that saw the other's unrecorded pod {held:?}"
    )
}

/// Lines of each writer's log that match `pred`.
fn log_lines(writers: &[&Controller], pred: impl Fn(&str) -> bool) -> Vec<usize> {
    writers
        .iter()
        .map(|c| c.plain_log().lines().filter(|l| pred(l)).count())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_writers_create_one_cleanup_pod_per_ordinal() {
    let env = Env::new("two-writers-scale", 4, &[]).await;
    let b = second_writer(&env).await;
    env.create_running(&SetSpec::new("web", 4, &env.class))
        .await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let events = env.record_events().await;
    let start = Instant::now();
    env.scale("web", 1).await;
    for n in [3, 2, 1] {
        wait_claim_deleted(&claims, &format!("data-web-{n}"), LONG).await;
    }
    let done = start.elapsed();
    let a = env.controller.as_ref().expect("controller a");
    let split = created_per_writer(&[a, &b]);
    let mut lines = Vec::new();
    let mut total = 0;
    for n in [3, 2, 1] {
        let name = format!("web-{n}");
        let made = created(&pods, &name);
        total += made.len();
        lines.push(format!(
            "{name}: {} cleanup pods {:?}",
            made.len(),
            made.iter().map(|s| s.uid.clone()).collect::<Vec<_>>()
        ));
        // One pod, never one per writer.
        assert!(
            made.len() == 1,
            "one cleanup pod for {name} with two writers; {lines:?}\nEvents:\n{}",
            events.describe()
        );
    }
    let report = format!(
        "two writers, web 4->1: {} in {:.1}s; created (per log) by a/b: {split:?}; {}",
        lines.join("; "),
        done.as_secs_f64(),
        collisions(&[a, &b])
    );
    eprintln!("{report}");
    record("two writers: scale-down 4->1", report);
    for reason in ["UnprovenCleanupPod", "CleanupCancelled"] {
        assert_eq!(
            event_count(&events, "web", reason),
            0,
            "no writer took the other's pod for a leftover:\n{}",
            events.describe()
        );
    }
    assert_eq!(
        split.iter().sum::<usize>(),
        total,
        "every cleanup pod was recorded by the writer that created it: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_writers_create_one_pod_per_attempt() {
    let env = Env::new("two-writers-attempts", 2, &[]).await;
    let b = second_writer(&env).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(template(
        json!({OUTCOME_LABEL: "Failed"}),
        json!({AFTER_ANNOTATION: "500ms"}),
        "Never",
    ));
    env.create_running(&spec).await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let events = env.record_events().await;
    let start = Instant::now();
    env.scale("web", 1).await;
    events.wait_event("web", "CleanupGaveUp", LONG).await;
    let gave_up = start.elapsed();
    // Both writers look again after the give-up: nothing new may come of it.
    let a = env.controller.as_ref().expect("controller a");
    a.wait_reconciles(&env.ns.name, "web", 2).await;
    b.wait_reconciles(&env.ns.name, "web", 2).await;

    let made = created(&pods, "web-1");
    let attempts: Vec<String> = made.iter().map(attempt_of).collect();
    let times: Vec<String> = made
        .iter()
        .map(|s| format!("+{:.1}s", s.at.duration_since(start).as_secs_f64()))
        .collect();
    let split = created_per_writer(&[a, &b]);
    let report = format!(
        "two writers, failing cleanup: attempts {attempts:?} at {times:?}, CleanupGaveUp after {:.1}s ({} Event(s)); created (per log) by a/b: {split:?}; {}",
        gave_up.as_secs_f64(),
        event_count(&events, "web", "CleanupGaveUp"),
        collisions(&[a, &b])
    );
    eprintln!("{report}");
    record("two writers: failing cleanup", report.clone());
    assert_eq!(
        attempts,
        ["1", "2", "3"],
        "exactly one pod per attempt: {report}\nEvents:\n{}",
        events.describe()
    );
    for reason in ["UnprovenCleanupPod", "CleanupCancelled"] {
        assert_eq!(
            event_count(&events, "web", reason),
            0,
            "no writer took the other's pod for a leftover:\n{}",
            events.describe()
        );
    }
    assert!(
        claims
            .first(|s| s.name == "data-web-1" && s.deleting)
            .is_none(),
        "a failed cleanup keeps its claim"
    );
    // The last failed pod stays for inspection.
    let last = made.last().expect("a cleanup pod");
    let gone = pods.deletion_of(&last.uid);
    assert!(gone.is_none(), "the last attempt's pod stays: {gone:?}");
    let sets: Api<StatefulSet> = env.sets();
    assert!(sets.get_opt("web").await.expect("get set").is_some());
}
