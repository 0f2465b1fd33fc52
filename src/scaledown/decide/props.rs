//! Property tests over `decide`: random observed states and random histories, with the safety
//! contract checked on every plan.
//!
//! A case is driven by a tape of random bytes (proptest shrinks it towards zeros, so a failure
//! comes back as a small, plain case). Two kinds of cases:
//! - states: one random `Observed` (pods of every role, records that fit or not, claims in use or
//!   being deleted, cached or live reads, caps and refusals) and a random policy;
//! - histories: a world that starts healthy, then a random sequence of scale changes, cleanup pods
//!   finishing, stateful pods going, forged pods appearing and disappearing, each followed by a
//!   decision on a live read whose plan is carried out on the world.
//!
//! Every plan must satisfy [`check`]: claims are deleted only for an ordinal the set does not want,
//! on a live read, after a Succeeded cleanup pod whose UID and claims are in our record, never
//! while in use or already being deleted; look-alike and foreign pods never lead to a deletion;
//! plans are deterministic; and a plan carried out and decided again repeats none of its writes.
//!
//! `PROPS_CASES` sets the number of cases (default [`DEFAULT_CASES`], split 4:1 between states and
//! histories, in two tests that run side by side); the counts are printed. `make props` runs ten
//! times as many. `PROPTEST_RNG_SEED` replays a run.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::tests::{claim, stateful, summary, t0, web};
use super::*;
use crate::scaledown::observe::{
    CleanupFacts, Observed, Phase, PodFacts, PodRole, Record, SetFacts, SetRead,
};

const DEFAULT_CASES: u32 = 100_000;

/// Random choices read off a byte tape; past its end every choice is 0.
struct Tape<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Tape<'_> {
    fn pick(&mut self, n: u32) -> u32 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        u32::from(b) % n.max(1)
    }
    /// True with probability about 1 in `n`.
    fn one_in(&mut self, n: u32) -> bool {
        self.pick(n) == n - 1
    }
}

// === generating ===

fn phase(tape: &mut Tape<'_>) -> Phase {
    [
        Phase::Pending,
        Phase::Running,
        Phase::Succeeded,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Unknown,
    ][tape.pick(6) as usize]
}

fn cleanup_pod(ordinal: u32, phase: Phase, attempt: u32, gated: bool) -> PodFacts {
    PodFacts {
        name: format!("web-{ordinal}"),
        uid: format!("uid-cleanup-{ordinal}-{attempt}"),
        deleting: false,
        role: PodRole::Cleanup(CleanupFacts {
            phase,
            attempt,
            claims: BTreeMap::new(),
            gated,
            scheduled: phase != Phase::Pending,
            restarts: None,
            failure: None,
            created: Some(t0()),
        }),
    }
}

/// A random pod at `ordinal`; a cleanup pod may or may not be in the record (if not, it is a
/// look-alike), and the record may name claims that are not the ordinal's.
fn random_pod(o: &mut Observed, ordinal: u32, tape: &mut Tape<'_>) {
    let pod = match tape.pick(6) {
        0 | 1 => return,
        2 => stateful(ordinal),
        3 | 4 => {
            let mut pod = cleanup_pod(ordinal, phase(tape), 1 + tape.pick(3), tape.one_in(4));
            let claims: BTreeMap<String, String> = o
                .ordinals
                .get(&ordinal)
                .map(|f| f.claims.iter())
                .into_iter()
                .flatten()
                .filter(|_| !tape.one_in(6))
                .map(|c| (c.name.clone(), c.uid.clone()))
                .collect();
            if tape.one_in(5) {
                // Not in the record: what a forger makes, or ours before a crash.
                pod.role = PodRole::Unproven {
                    gated: tape.one_in(2),
                    created: [None, Some(t0()), Some(t0() - Duration::from_secs(60))]
                        [tape.pick(3) as usize],
                };
            } else {
                if let PodRole::Cleanup(c) = &mut pod.role {
                    c.claims = claims.clone();
                }
                o.set.records.insert(
                    ordinal,
                    Record {
                        pod: pod.uid.clone(),
                        claims,
                    },
                );
            }
            pod
        }
        _ => PodFacts {
            role: PodRole::Foreign,
            ..stateful(ordinal)
        },
    };
    let deleting = tape.one_in(8);
    o.ordinals.entry(ordinal).or_default().pod = Some(PodFacts { deleting, ..pod });
}

fn random_claims(o: &mut Observed, ordinal: u32, tape: &mut Tape<'_>) {
    for template in o.set.claim_templates.clone() {
        if tape.one_in(4) {
            continue;
        }
        let mut c = claim(&template, ordinal);
        c.deleting = tape.one_in(8);
        if tape.one_in(6) {
            c.used_by = vec!["reader".into()];
        }
        if tape.one_in(10) {
            c.not_ours = Some("web-2".into());
        }
        if tape.one_in(6) {
            c.next_attempt = Some(1 + tape.pick(4));
        }
        o.ordinals.entry(ordinal).or_default().claims.push(c);
    }
}

/// The evidence of how a set is being deleted: the API server's finalizer, and our mark (for this
/// set, or copied from another one).
fn random_deletion(s: &mut SetFacts, tape: &mut Tape<'_>) {
    match tape.pick(3) {
        1 => s.finalizers.push(naming::ORPHAN_FINALIZER.into()),
        2 => s.finalizers.push(naming::FOREGROUND_FINALIZER.into()),
        _ => {}
    }
    s.deletion_mark = match tape.pick(4) {
        1 => Some(mark_value(Propagation::Background, &s.uid)),
        2 => Some(mark_value(Propagation::Foreground, &s.uid)),
        3 => Some(mark_value(Propagation::Background, "uid-old")),
        _ => None,
    };
}

fn random_state(tape: &mut Tape<'_>) -> (Observed, Policy) {
    let mut o = web(tape.pick(5));
    let s = &mut o.set;
    s.start = tape.pick(2);
    s.parallel = tape.one_in(2);
    s.deleting = tape.one_in(6);
    s.when_scaled_delete = tape.one_in(10);
    if tape.one_in(8) {
        s.template = None;
    }
    if tape.one_in(5) {
        s.finalizers.clear();
    }
    if s.deleting {
        random_deletion(s, tape);
    }
    if tape.one_in(3) {
        s.claim_templates.push("logs".into());
    }
    for ordinal in 0..6 {
        random_claims(&mut o, ordinal, tape);
        random_pod(&mut o, ordinal, tape);
    }
    if tape.one_in(4) {
        // A stale record: the ordinal's pod (if any) is not the one recorded, so observe would
        // not call it a cleanup pod.
        let ordinal = tape.pick(6);
        o.set.records.insert(
            ordinal,
            Record {
                pod: "uid-gone".into(),
                claims: [("data-web-1".into(), "uid-data-1".into())].into(),
            },
        );
        if let Some(pod) = o.ordinals.get_mut(&ordinal).and_then(|f| f.pod.as_mut())
            && let PodRole::Cleanup(c) = &pod.role
        {
            pod.role = PodRole::Unproven {
                gated: c.gated,
                created: c.created,
            };
        }
    }
    o.read = [SetRead::Cached, SetRead::LiveSet, SetRead::LiveAll][tape.pick(3) as usize];
    o.cleanups_in_flight = tape.pick(3) as usize;
    o.now = t0() + Duration::from_secs(u64::from(tape.pick(4)) * 400);
    let policy = Policy {
        max_attempts: 1 + tape.pick(3),
        max_in_flight: tape.one_in(3).then(|| 1 + tape.pick(2) as usize),
        ..Policy::default()
    };
    (o, policy)
}

// === checking ===

fn ordinal_of_claim(o: &Observed, name: &str) -> Option<u32> {
    o.ordinals
        .iter()
        .find(|(_, f)| f.claims.iter().any(|c| c.name == name))
        .map(|(n, _)| *n)
}

fn ordinal_of_pod(o: &Observed, name: &str) -> Option<u32> {
    o.ordinals
        .iter()
        .find(|(_, f)| f.pod.as_ref().is_some_and(|p| p.name == name))
        .map(|(n, _)| *n)
}

/// A claim deletion is allowed only as the safety contract says.
fn check_claim_deletion(o: &Observed, name: &str, uid: &str) -> Result<(), TestCaseError> {
    let n = ordinal_of_claim(o, name).ok_or_else(|| TestCaseError::fail("unknown claim"))?;
    let facts = &o.ordinals[&n];
    let claim = facts.claims.iter().find(|c| c.name == name).expect("found");
    prop_assert_eq!(&claim.uid, uid, "deletes carry the observed UID");
    prop_assert!(!o.set.wants(n), "claim {} of wanted ordinal {}", name, n);
    prop_assert!(
        o.read != SetRead::Cached,
        "claim deletion from a cached read"
    );
    prop_assert!(!claim.deleting, "claim {} already being deleted", name);
    prop_assert!(claim.used_by.is_empty(), "claim {} in use", name);
    let pod = facts.pod.as_ref();
    let cleanup = match pod.map(|p| &p.role) {
        Some(PodRole::Cleanup(c)) => c,
        other => return Err(TestCaseError::fail(format!("no cleanup pod: {other:?}"))),
    };
    let pod = pod.expect("pod");
    prop_assert_eq!(cleanup.phase, Phase::Succeeded);
    let record = o.set.records.get(&n);
    prop_assert!(
        record.is_some_and(|r| r.pod == pod.uid && r.claims.get(name) == Some(&claim.uid)),
        "deletion of {} without our record of pod {} and the claim",
        name,
        pod.uid
    );
    Ok(())
}

fn check_pod_deletion(o: &Observed, name: &str, uid: &str) -> Result<(), TestCaseError> {
    let n = ordinal_of_pod(o, name).ok_or_else(|| TestCaseError::fail("unknown pod"))?;
    let pod = o.ordinals[&n].pod.as_ref().expect("pod");
    prop_assert_eq!(&pod.uid, uid, "deletes carry the observed UID");
    match &pod.role {
        PodRole::Cleanup(_) => Ok(()),
        PodRole::Unproven { gated, created } => {
            prop_assert!(*gated, "an unproven pod that may have run is deleted");
            prop_assert!(o.read != SetRead::Cached);
            prop_assert!(
                created.is_none_or(|c| o.now >= c + RECORD_GRACE),
                "a gated pod is deleted within its writer's grace"
            );
            Ok(())
        }
        other => Err(TestCaseError::fail(format!(
            "deletes a {other:?} pod as a cleanup pod"
        ))),
    }
}

fn check_step(o: &Observed, policy: &Policy, step: &Step) -> Result<(), TestCaseError> {
    match step {
        Step::DeleteClaim { name, uid } => check_claim_deletion(o, name, uid),
        Step::DeleteCleanupPod { name, uid, .. } => check_pod_deletion(o, name, uid),
        Step::Release { name, uid } => {
            let n = ordinal_of_pod(o, name).ok_or_else(|| TestCaseError::fail("unknown pod"))?;
            prop_assert!(o.read != SetRead::Cached);
            prop_assert!(!o.set.wants(n), "releases a pod of wanted ordinal {}", n);
            prop_assert_eq!(
                o.set.records.get(&n).map(|r| r.pod.as_str()),
                Some(uid.as_str())
            );
            Ok(())
        }
        Step::CreateCleanupPod { ordinal, pod, .. } => {
            prop_assert!(
                !o.set.wants(*ordinal),
                "creates for wanted ordinal {}",
                ordinal
            );
            prop_assert!(
                !o.set.deleting
                    || matches!(
                        propagation(o),
                        Some(Propagation::Foreground | Propagation::Background)
                    ),
                "cleans a set deleted as {:?}",
                propagation(o)
            );
            let holder = o.ordinals.get(ordinal).and_then(|f| f.pod.as_ref());
            prop_assert!(holder.is_none(), "creates over a pod: {:?}", holder);
            let gates = pod["spec"]["schedulingGates"].to_string();
            prop_assert!(
                gates.contains(naming::CONFIRM_GATE),
                "created without the gate"
            );
            prop_assert!(
                policy
                    .max_in_flight
                    .is_none_or(|cap| o.cleanups_in_flight < cap)
            );
            Ok(())
        }
        Step::DeleteStatefulPod { .. } => {
            prop_assert!(o.set.deleting);
            Ok(())
        }
        Step::SetFinalizers { adding, .. } => {
            prop_assert!(
                *adding || o.read == SetRead::LiveAll,
                "finalizer released unconfirmed"
            );
            Ok(())
        }
        Step::MarkNextAttempt { .. } | Step::Event(_) => Ok(()),
        Step::MarkDeletion {
            propagation: marked,
        } => {
            prop_assert!(
                *marked == Propagation::Foreground || o.read == SetRead::LiveAll,
                "background deletion marked from the cache"
            );
            prop_assert_eq!(propagation(o), Some(*marked));
            Ok(())
        }
    }
}

/// The safety contract and determinism, for one plan.
fn check(o: &Observed, policy: &Policy, plan: &Plan) -> Result<(), TestCaseError> {
    prop_assert_eq!(plan, &decide(o, policy), "not deterministic");
    for step in &plan.steps {
        check_step(o, policy, step)?;
    }
    let creates = plan
        .steps
        .iter()
        .filter(|s| matches!(s, Step::CreateCleanupPod { .. }))
        .count();
    if let Some(cap) = policy.max_in_flight {
        prop_assert!(
            creates == 0 || o.cleanups_in_flight + creates <= cap,
            "over the cap {}: {} in flight, plan {:?}, read {:?}",
            cap,
            o.cleanups_in_flight,
            summary(plan),
            o.read
        );
    }
    Ok(())
}

// === carrying a plan out ===

/// What the plan's writes do to the world, as the API server and `act`/`settle` would leave it
/// (creations that `confirm_created` lets run are recorded and released; the others are deleted).
fn carry_out(o: &mut Observed, plan: &Plan) {
    for step in &plan.steps {
        match step {
            Step::DeleteClaim { name, .. } => {
                for f in o.ordinals.values_mut() {
                    f.claims.retain(|c| c.name != *name);
                }
            }
            Step::DeleteCleanupPod { name, .. } | Step::DeleteStatefulPod { name, .. } => {
                for f in o.ordinals.values_mut() {
                    f.pod.take_if(|p| p.name == *name);
                }
            }
            Step::CreateCleanupPod {
                ordinal,
                attempt,
                claims,
                ..
            } => {
                if confirm_created(&o.set, *ordinal) == Verdict::Run {
                    let mut pod = cleanup_pod(*ordinal, Phase::Pending, *attempt, false);
                    if let PodRole::Cleanup(c) = &mut pod.role {
                        c.claims = claims.clone();
                    }
                    let record = Record {
                        pod: pod.uid.clone(),
                        claims: claims.clone(),
                    };
                    o.set.records.insert(*ordinal, record);
                    o.ordinals.entry(*ordinal).or_default().pod = Some(pod);
                }
            }
            Step::Release { name, .. } => {
                for f in o.ordinals.values_mut() {
                    if let Some(PodRole::Cleanup(c)) = f
                        .pod
                        .as_mut()
                        .filter(|p| p.name == *name)
                        .map(|p| &mut p.role)
                    {
                        c.gated = false;
                    }
                }
            }
            Step::MarkNextAttempt { claim, attempt, .. } => {
                for c in o.ordinals.values_mut().flat_map(|f| f.claims.iter_mut()) {
                    if c.name == *claim {
                        c.next_attempt = *attempt;
                    }
                }
            }
            Step::SetFinalizers { finalizers, .. } => o.set.finalizers = finalizers.clone(),
            Step::MarkDeletion { propagation } => {
                o.set.deletion_mark = Some(mark_value(*propagation, &o.set.uid));
            }
            Step::Event(_) => {}
        }
    }
}

/// Writes of `plan` that `again` repeats: a plan carried out must not need doing twice.
fn repeated(plan: &Plan, again: &Plan) -> Vec<String> {
    let writes = |p: &Plan| -> BTreeSet<String> {
        summary(p)
            .into_iter()
            .filter(|s| s.starts_with("create") || s.starts_with("delete"))
            .collect()
    };
    writes(plan).intersection(&writes(again)).cloned().collect()
}

fn check_idempotent(o: &Observed, policy: &Policy, plan: &Plan) -> Result<(), TestCaseError> {
    if o.read == SetRead::Cached {
        return Ok(());
    }
    let mut after = o.clone();
    carry_out(&mut after, plan);
    let again = decide(&after, policy);
    check(&after, policy, &again)?;
    let twice = repeated(plan, &again);
    prop_assert!(twice.is_empty(), "repeated after carrying out: {:?}", twice);
    Ok(())
}

// === histories ===

/// One thing that happens in the world between two decisions.
fn happen(o: &mut Observed, tape: &mut Tape<'_>) {
    let ordinal = tape.pick(6);
    match tape.pick(6) {
        0 => o.set.replicas = tape.pick(6),
        1 => {
            // A cleanup pod finishes.
            if let Some(PodRole::Cleanup(c)) = o
                .ordinals
                .get_mut(&ordinal)
                .and_then(|f| f.pod.as_mut())
                .map(|p| &mut p.role)
            {
                c.phase = if tape.one_in(3) {
                    Phase::Failed
                } else {
                    Phase::Succeeded
                };
            }
        }
        2 => {
            // The StatefulSet controller removes the pod of an ordinal it no longer wants.
            let f = o.ordinals.entry(ordinal).or_default();
            if !o.set.wants(ordinal) {
                f.pod.take_if(|p| p.role == PodRole::Stateful);
            }
        }
        3 => {
            // A forger takes a free name.
            let f = o.ordinals.entry(ordinal).or_default();
            if f.pod.is_none() {
                f.pod = Some(PodFacts {
                    uid: format!("uid-forged-{ordinal}"),
                    role: PodRole::Unproven {
                        gated: false,
                        created: None,
                    },
                    ..stateful(ordinal)
                });
            }
        }
        4 => {
            let f = o.ordinals.entry(ordinal).or_default();
            f.pod
                .take_if(|p| matches!(p.role, PodRole::Unproven { .. }));
        }
        _ => {
            // The StatefulSet controller creates the pods (and claims) of wanted ordinals.
            for n in 0..6 {
                if o.set.wants(n) {
                    let f = o.ordinals.entry(n).or_default();
                    if f.claims.is_empty() {
                        f.claims.push(claim("data", n));
                    }
                    if f.pod.is_none() {
                        f.pod = Some(stateful(n));
                    }
                }
            }
        }
    }
}

fn history(tape: &mut Tape<'_>, decisions: &AtomicU64) -> Result<(), TestCaseError> {
    let replicas = 1 + tape.pick(5);
    let mut o = web(replicas);
    for n in 0..replicas {
        let f = o.ordinals.entry(n).or_default();
        f.claims.push(claim("data", n));
        f.pod = Some(stateful(n));
    }
    o.set.parallel = tape.one_in(2);
    let policy = Policy::default();
    for _ in 0..(5 + tape.pick(20)) {
        happen(&mut o, tape);
        let plan = decide(&o, &policy);
        decisions.fetch_add(1, Ordering::Relaxed);
        check(&o, &policy, &plan)?;
        carry_out(&mut o, &plan);
    }
    Ok(())
}

// === the runs ===

fn cases() -> u32 {
    std::env::var("PROPS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn run(cases: u32, tape_len: usize, test: impl Fn(&mut Tape<'_>) -> Result<(), TestCaseError>) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(any::<u8>(), tape_len), |bytes| {
        test(&mut Tape {
            bytes: &bytes,
            at: 0,
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn report(what: &str, cases: u32, decisions: &AtomicU64, started: Instant) {
    let line = format!(
        "decide properties: {cases} {what}, {} decisions checked, {:.1} s\n",
        decisions.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    // Straight to stderr, past the test harness's capture: the count shows in every run.
    std::io::stderr()
        .write_all(line.as_bytes())
        .expect("writes to stderr");
}

/// Four in five cases are random states (the two tests run side by side).
#[test]
fn random_states_keep_the_safety_contract() {
    let cases = cases() - cases() / 5;
    let (decisions, started) = (AtomicU64::new(0), Instant::now());
    run(cases, 96, |tape| {
        let (o, policy) = random_state(tape);
        let plan = decide(&o, &policy);
        decisions.fetch_add(1, Ordering::Relaxed);
        check(&o, &policy, &plan)?;
        check_idempotent(&o, &policy, &plan)
    });
    report("random states", cases, &decisions, started);
}

/// One in five cases is a random history.
#[test]
fn random_histories_keep_the_safety_contract() {
    let cases = cases() / 5;
    let (decisions, started) = (AtomicU64::new(0), Instant::now());
    run(cases, 128, |tape| history(tape, &decisions));
    report("random histories", cases, &decisions, started);
}
