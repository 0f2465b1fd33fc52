//! Table tests of the status: each cause of `Stalled`, `Paused`, and when a change is written.

use std::collections::BTreeSet;

use super::*;
use crate::naming;
use crate::scaledown::decide::tests::{
    claim, cleanup, set_pod, stateful, summary, t0, web, with_claims,
};
use crate::scaledown::decide::{Policy, decide};
use crate::scaledown::observe::{Phase, PodFacts, Rejection};

fn status_of(o: &Observed, contended: &[u32]) -> (String, Option<String>) {
    let plan = decide(o, &Policy::default());
    let contended: BTreeSet<u32> = contended.iter().copied().collect();
    let line = line(o, &plan, &contended).expect("an opted-in set has a status");
    (line.status.to_string(), line.reason)
}

fn failed_last_attempt(ordinals: &[u32]) -> Observed {
    let mut o = with_claims(web(2), 0..4, 0..2);
    o.set.parallel = true;
    for n in ordinals {
        set_pod(&mut o, *n, cleanup(*n, Phase::Failed, 3));
    }
    o
}

fn refused(count: u32) -> Observed {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.rejections.insert(
        2,
        Rejection {
            count,
            last: t0(),
            code: 403,
            message: "exceeded quota".into(),
        },
    );
    o
}

fn stuck() -> Observed {
    let mut o = with_claims(web(2), 0..3, 0..2);
    let mut pod = cleanup(2, Phase::Pending, 1);
    if let PodRole::Cleanup(c) = &mut pod.role {
        c.created = Some(t0());
    }
    set_pod(&mut o, 2, pod);
    o.now = t0() + std::time::Duration::from_secs(601);
    o
}

fn claim_in_use() -> Observed {
    let mut o = with_claims(web(2), 0..3, 0..2);
    set_pod(&mut o, 2, cleanup(2, Phase::Succeeded, 1));
    if let Some(f) = o.ordinals.get_mut(&2) {
        f.claims[0].used_by = vec!["debug".into()];
    }
    o
}

fn invalid_template(replicas: u32) -> Observed {
    let mut o = with_claims(web(replicas), 0..3, 0..replicas.min(3));
    o.set.template = Some("{not json".into());
    o
}

fn foreign(ordinal: u32) -> PodFacts {
    PodFacts {
        name: format!("web-{ordinal}"),
        uid: format!("uid-foreign-{ordinal}"),
        deleting: false,
        role: PodRole::Foreign,
    }
}

/// What, the facts, the contended ordinals, the status and its reason.
type Case = (
    &'static str,
    Observed,
    &'static [u32],
    &'static str,
    Option<&'static str>,
);

#[test]
fn the_status_of_each_state() {
    let mut finishing = with_claims(web(2), 0..2, 0..2);
    let mut deleting = claim("data", 2);
    deleting.deleting = true;
    finishing
        .ordinals
        .entry(2)
        .or_default()
        .claims
        .push(deleting);
    let mut foreign_held = with_claims(web(2), 0..3, 0..2);
    foreign_held.ordinals.entry(2).or_default().pod = Some(foreign(2));
    let mut other_set = with_claims(web(2), 0..3, 0..2);
    if let Some(f) = other_set.ordinals.get_mut(&2) {
        f.claims[0].not_ours = Some("web-x".into());
    }
    let mut retained = with_claims(web(2), 0..3, 0..2);
    retained.set.when_scaled_delete = true;
    let mut waits_for_old_pod = with_claims(web(2), 0..3, 0..2);
    waits_for_old_pod.ordinals.entry(2).or_default().pod = Some(stateful(2));
    let cases: Vec<Case> = vec![
        (
            "every ordinal wanted",
            with_claims(web(3), 0..3, 0..3),
            &[],
            "Idle",
            None,
        ),
        (
            "an orphaned claim: its cleanup is created",
            with_claims(web(2), 0..3, 0..2),
            &[],
            "CleaningUp",
            None,
        ),
        (
            "the old pod of the ordinal is still there",
            waits_for_old_pod,
            &[],
            "CleaningUp",
            None,
        ),
        (
            "a claim deleted, not gone yet",
            finishing,
            &[],
            "CleaningUp",
            None,
        ),
        (
            "whenScaled: Delete: Kubernetes deletes the claims",
            retained,
            &[],
            "Idle",
            None,
        ),
        (
            "a claim not proven the set's is left alone, and the status says so",
            other_set,
            &[],
            "Stalled",
            Some(
                "ClaimOwnershipConflict: ordinal 2 with a claim not proven this set's (left alone)",
            ),
        ),
        (
            "the last attempts failed",
            failed_last_attempt(&[3, 2]),
            &[],
            "Stalled",
            Some("CleanupFailed: ordinals 2,3 gave up after 3 attempts"),
        ),
        (
            "a refused creation backs off",
            refused(1),
            &[],
            "Stalled",
            Some("CleanupPodRejected: ordinal 2 refused by the API server (403), retrying"),
        ),
        (
            "refused every attempt",
            refused(3),
            &[],
            "Stalled",
            Some("CleanupPodRejected: ordinal 2 refused by the API server (403), given up"),
        ),
        (
            "an invalid template with an orphan",
            invalid_template(2),
            &[],
            "Stalled",
            Some(
                "CleanupTemplateInvalid: ordinal 2 waits for a template that can make a cleanup pod",
            ),
        ),
        (
            "an invalid template, nothing orphaned",
            invalid_template(3),
            &[],
            "Stalled",
            Some("CleanupTemplateInvalid: the template annotation cannot make a cleanup pod"),
        ),
        (
            "a cleanup pod Pending past the timeout",
            stuck(),
            &[],
            "Stalled",
            Some("CleanupPodStuck: ordinal 2 Pending past --cleanup-pending-timeout"),
        ),
        (
            "a finished cleanup's claim mounted by another pod",
            claim_in_use(),
            &[],
            "Stalled",
            Some("ClaimInUse: ordinal 2 with a claim mounted by another pod"),
        ),
        (
            "a record that lost every race",
            with_claims(web(2), 0..3, 0..2),
            &[2],
            "Stalled",
            Some(
                "RecordContended: ordinal 2 could not be recorded on the StatefulSet (it kept changing)",
            ),
        ),
        (
            "a contended ordinal wanted again is no stall",
            with_claims(web(3), 0..3, 0..3),
            &[2],
            "Idle",
            None,
        ),
        (
            "a foreign pod holds the ordinal",
            foreign_held,
            &[],
            "Stalled",
            Some("ForeignPod: ordinal 2 held by a pod neither the set's nor a cleanup pod"),
        ),
    ];
    for (what, o, contended, status, reason) in cases {
        assert_eq!(
            status_of(&o, contended),
            (status.to_string(), reason.map(str::to_string)),
            "{what}"
        );
    }
}

#[test]
fn several_causes_are_listed_in_a_fixed_order() {
    let mut o = failed_last_attempt(&[3]);
    o.rejections.insert(
        2,
        Rejection {
            count: 1,
            last: t0(),
            code: 422,
            message: "invalid".into(),
        },
    );
    let (status, reason) = status_of(&o, &[]);
    assert_eq!(status, "Stalled");
    assert_eq!(
        reason.as_deref(),
        Some(
            "CleanupFailed: ordinal 3 gave up after 3 attempts; CleanupPodRejected: ordinal 2 refused by the API server (422), retrying"
        )
    );
}

#[test]
fn a_paused_set_creates_nothing_and_lists_the_ordinals_waiting() {
    let mut o = with_claims(web(1), 0..3, 0..1);
    o.set.parallel = true;
    o.set.paused = true;
    let plan = decide(&o, &Policy::default());
    assert_eq!(
        summary(&plan),
        Vec::<String>::new(),
        "no cleanup pod while paused"
    );
    assert_eq!(
        status_of(&o, &[]),
        (
            "Paused".into(),
            Some("Paused: ordinals 1,2 wait for a cleanup".into())
        )
    );
    o.set.paused = false;
    assert_eq!(
        summary(&decide(&o, &Policy::default())),
        ["create web-2#1", "create web-1#1"],
        "resumed: whatever is orphaned then"
    );
    let mut idle = with_claims(web(3), 0..3, 0..3);
    idle.set.paused = true;
    assert_eq!(
        status_of(&idle, &[]).1.as_deref(),
        Some("Paused: no ordinal waits for a cleanup")
    );
}

#[test]
fn paused_beats_stalled() {
    let mut o = failed_last_attempt(&[2]);
    o.set.paused = true;
    assert_eq!(status_of(&o, &[]).0, "Paused");
}

/// The facts after the change was written, as the next pass reads them.
fn written(mut o: Observed, change: &Change) -> Observed {
    match &change.write {
        Write::Set(line) => {
            o.set.status = Some(line.status.to_string());
            o.set.status_reason = line.reason.clone();
        }
        Write::Remove => (o.set.status, o.set.status_reason) = (None, None),
    }
    o
}

fn change_of(o: &Observed) -> Option<Change> {
    change(o, &decide(o, &Policy::default()), &BTreeSet::new())
}

#[test]
fn a_change_is_written_only_on_a_transition_and_once() {
    let cases = [
        ("new set", with_claims(web(3), 0..3, 0..3), "Idle"),
        ("scaled down", with_claims(web(2), 0..3, 0..2), "CleaningUp"),
        ("gave up", failed_last_attempt(&[2]), "Stalled"),
    ];
    for (what, o, status) in cases {
        let change = change_of(&o).unwrap_or_else(|| panic!("{what}: a first write"));
        match &change.write {
            Write::Set(line) => assert_eq!(line.status.as_str(), status, "{what}"),
            Write::Remove => panic!("{what}: not a removal"),
        }
        assert_eq!(
            change.event, None,
            "{what}: no Event besides pause and resume"
        );
        assert_eq!(
            change_of(&written(o, &change)),
            None,
            "{what}: after the write the next pass writes nothing"
        );
    }
    // A reason that changes is a transition too (a second ordinal gave up).
    let one = failed_last_attempt(&[2]);
    let first = change_of(&one).expect("first");
    let both = written(failed_last_attempt(&[2, 3]), &first);
    let Some(Change {
        write: Write::Set(line),
        ..
    }) = change_of(&both)
    else {
        panic!("the reason changed");
    };
    assert_eq!(
        line.reason.as_deref(),
        Some("CleanupFailed: ordinals 2,3 gave up after 3 attempts")
    );
    // Leaving Stalled removes the reason.
    let cleared = written(failed_last_attempt(&[2]), &first);
    let mut healthy = with_claims(web(3), 0..3, 0..3);
    healthy.set.status = cleared.set.status.clone();
    healthy.set.status_reason = cleared.set.status_reason.clone();
    let change = change_of(&healthy).expect("back to Idle");
    assert_eq!(
        change.write,
        Write::Set(Line {
            status: Status::Idle,
            reason: None
        })
    );
}

#[test]
fn pause_and_resume_are_one_event_each() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.set.status = Some("CleaningUp".into());
    o.set.paused = true;
    let paused = change_of(&o).expect("paused");
    let event = paused.event.clone().expect("the pause Event");
    assert_eq!(event.reason, Reason::ScaleDownPaused);
    assert!(event.note.contains("ordinal 2 waits"), "{}", event.note);
    let mut o = written(o, &paused);
    assert_eq!(change_of(&o), None, "once per pause");
    o.set.paused = false;
    let resumed = change_of(&o).expect("resumed");
    assert_eq!(
        resumed.event.map(|e| e.reason),
        Some(Reason::ScaleDownResumed)
    );
    assert_eq!(
        resumed.write,
        Write::Set(Line {
            status: Status::CleaningUp,
            reason: None
        })
    );
}

#[test]
fn an_opted_out_set_loses_the_annotations_with_its_finalizer() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.set.template = None;
    o.set.status = Some("CleaningUp".into());
    let plan = decide(&o, &Policy::default());
    assert!(
        summary(&plan).iter().any(|s| s.starts_with("finalizer-")),
        "{:?}",
        summary(&plan)
    );
    let change = change(&o, &plan, &BTreeSet::new()).expect("a removal");
    assert_eq!(change.write, Write::Remove);
    // A cleanup still running: the finalizer stays, and so do the annotations for now.
    let mut running = o.clone();
    set_pod(&mut running, 2, cleanup(2, Phase::Running, 1));
    assert_eq!(change_of(&running), None);
    // No finalizer (released by hand): a removal of its own.
    let mut bare = o.clone();
    bare.set.finalizers.clear();
    assert_eq!(change_of(&bare).map(|c| c.write), Some(Write::Remove));
    bare.set.status = None;
    assert_eq!(change_of(&bare), None, "nothing to remove");
    assert!(naming::STATUS_ANNOTATION.ends_with("scaledown-status"));
}

/// A cleanup's own words: the termination message of the last failed attempt goes into the reason,
/// per ordinal (two ordinals that said different things are listed apart, in ordinal order).
#[test]
fn a_given_up_cleanup_says_why_in_the_reason() {
    let says = |o: &mut Observed, n: u32, message: &str| {
        let mut pod = cleanup(n, Phase::Failed, 3);
        if let PodRole::Cleanup(c) = &mut pod.role
            && let Some(f) = c.failure.as_mut()
        {
            f.message = Some(message.into());
        }
        set_pod(o, n, pod);
    };
    let mut one = failed_last_attempt(&[]);
    says(&mut one, 2, "3 keys left: NOREPLICAS");
    assert_eq!(
        status_of(&one, &[]).1.as_deref(),
        Some("CleanupFailed: ordinal 2 gave up after 3 attempts (3 keys left: NOREPLICAS)")
    );
    let mut two = failed_last_attempt(&[]);
    says(&mut two, 3, "disk full");
    says(&mut two, 2, "3 keys left: NOREPLICAS");
    assert_eq!(
        status_of(&two, &[]).1.as_deref(),
        Some(
            "CleanupFailed: ordinal 2 gave up after 3 attempts (3 keys left: NOREPLICAS); \
             CleanupFailed: ordinal 3 gave up after 3 attempts (disk full)"
        )
    );
}
