//! Table and property tests over the releaser's `decide`.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::releaser::observe::ClaimRef;

/// A checked scrub template.
fn template() -> serde_json::Value {
    json!({"spec": {"containers": [{"name": "wipe", "image": "busybox"}]}})
}

/// A Released, Retain PV of a class with id `ci`, naming claim `ci/cache` (uid `uid-old`), read
/// live and gone: the one case that is released.
fn releasable() -> PvFacts {
    PvFacts {
        name: "pv-1".into(),
        uid: "uid-pv-1".into(),
        phase: "Released".into(),
        retain: true,
        class: "pool".into(),
        class_id: Some("ci".into()),
        claim_ref: Some(ClaimRef {
            namespace: "ci".into(),
            name: "cache".into(),
            uid: "uid-old".into(),
        }),
        deleting: false,
        claim: ClaimRead::Gone,
        scrub_template: ScrubTemplate::Absent,
        scrub_ns: Some("ops".into()),
        scrub: None,
        scrub_pod: ScrubPod::Missing,
    }
}

fn release() -> Plan {
    Plan::Release {
        claim_uid: "uid-old".into(),
    }
}

/// A PV of a class with a valid scrub template, scrub state `state`, phase `phase`, scrub pod
/// `pod`, whose claimRef names `claim_uid`.
fn scrubbing(state: Scrub, phase: &str, pod: ScrubPod, claim_uid: &str) -> PvFacts {
    let mut pv = releasable();
    pv.scrub_template = ScrubTemplate::Pod(template());
    pv.scrub = Some(state);
    pv.phase = phase.into();
    pv.scrub_pod = pod;
    if let Some(c) = pv.claim_ref.as_mut() {
        c.uid = claim_uid.into();
    }
    pv
}

fn t() -> String {
    "uid-temp".to_string()
}

fn ops() -> String {
    "ops".to_string()
}

fn finish(failed: Option<&str>, pod_uid: Option<&str>) -> Plan {
    Plan::FinishScrub {
        temp_uid: t(),
        failed: failed.map(str::to_string),
        namespace: ops(),
        pod_uid: pod_uid.map(str::to_string),
    }
}

#[test]
fn scrub_table() {
    let mut start = releasable();
    start.scrub_template = ScrubTemplate::Pod(template());
    let want = Plan::StartScrub {
        claim_uid: "uid-old".into(),
        namespace: ops(),
    };
    assert_eq!(decide(&start, "ci"), want, "a template: scrub first");
    let running = || Scrub::Running(t());
    let succeeded = || ScrubPod::Succeeded {
        uid: "uid-pod".into(),
    };
    let failed = || ScrubPod::Failed {
        uid: "uid-pod".into(),
        reason: "Error".into(),
    };
    let rows: Vec<(&str, PvFacts, Plan)> = vec![
        (
            "bound, no pod yet",
            scrubbing(running(), "Bound", ScrubPod::Missing, "uid-temp"),
            Plan::CreateScrubPod {
                temp_uid: t(),
                namespace: ops(),
                pod: crate::template::scrub::render(&template(), "pv-1", "ops"),
            },
        ),
        (
            "not bound yet",
            scrubbing(running(), "Released", ScrubPod::Missing, "uid-temp"),
            Plan::Skip(Skip::Scrubbing),
        ),
        (
            "pod runs",
            scrubbing(running(), "Bound", ScrubPod::Busy, "uid-temp"),
            Plan::Skip(Skip::Scrubbing),
        ),
        (
            "pod succeeded",
            scrubbing(running(), "Bound", succeeded(), "uid-temp"),
            finish(None, Some("uid-pod")),
        ),
        (
            "pod failed",
            scrubbing(running(), "Bound", failed(), "uid-temp"),
            finish(Some("Error"), Some("uid-pod")),
        ),
        (
            "scrubbed, temporary claim still there",
            scrubbing(Scrub::Scrubbed(t()), "Bound", ScrubPod::Missing, "uid-temp"),
            Plan::DeleteTemp {
                temp_uid: t(),
                namespace: ops(),
            },
        ),
        (
            "scrubbed and Released: release",
            scrubbing(
                Scrub::Scrubbed(t()),
                "Released",
                ScrubPod::Missing,
                "uid-temp",
            ),
            Plan::Release { claim_uid: t() },
        ),
        (
            "failed: never handed out",
            scrubbing(
                Scrub::Failed(t()),
                "Released",
                ScrubPod::Missing,
                "uid-temp",
            ),
            Plan::Skip(Skip::ScrubFailed),
        ),
        (
            "failed, temporary claim still there",
            scrubbing(Scrub::Failed(t()), "Bound", ScrubPod::Missing, "uid-temp"),
            Plan::DeleteTemp {
                temp_uid: t(),
                namespace: ops(),
            },
        ),
        (
            "bound to someone else meanwhile",
            scrubbing(
                Scrub::Scrubbed(t()),
                "Released",
                ScrubPod::Missing,
                "uid-other",
            ),
            Plan::Skip(Skip::Rebound),
        ),
    ];
    for (what, pv, want) in rows {
        assert_eq!(decide(&pv, "ci"), want, "{what}");
    }
}

/// A scrub that cannot run: blocked before the PV is taken over, failed once it is under way.
#[test]
fn blocked_scrub_table() {
    type Change = fn(&mut PvFacts);
    let no_ns: Change = |p| p.scrub_ns = None;
    let bad_template: Change = |p| {
        p.scrub_template = ScrubTemplate::Invalid("the scrub template has no containers".into())
    };
    let no_template: Change = |p| p.scrub_template = ScrubTemplate::Absent;
    let blocked_ns = Plan::ScrubBlocked(Blocked::NoNamespace);
    let running = || Scrub::Running(t());
    let succeeded = ScrubPod::Succeeded {
        uid: "uid-pod".into(),
    };
    let rows: Vec<(&str, PvFacts, Change, Plan)> = vec![
        (
            "invalid template, not started: the PV is not taken over",
            releasable(),
            bad_template,
            Plan::ScrubBlocked(Blocked::InvalidTemplate(
                "the scrub template has no containers".into(),
            )),
        ),
        (
            "no namespace, not started",
            releasable(),
            |p| {
                p.scrub_template = ScrubTemplate::Pod(template());
                p.scrub_ns = None;
            },
            blocked_ns.clone(),
        ),
        (
            "invalid template and its claim still there: nothing to say yet",
            releasable(),
            |p| {
                p.scrub_template = ScrubTemplate::Invalid("x".into());
                p.claim = ClaimRead::Exists {
                    uid: "uid-old".into(),
                };
            },
            Plan::Skip(Skip::ClaimExists),
        ),
        (
            "invalid template of another releaser's class",
            releasable(),
            |p| {
                p.scrub_template = ScrubTemplate::Invalid("x".into());
                p.class_id = Some("other".into());
            },
            Plan::Skip(Skip::NotOurs),
        ),
        (
            "no namespace for the scrub pod",
            scrubbing(running(), "Bound", ScrubPod::Missing, "uid-temp"),
            no_ns,
            blocked_ns.clone(),
        ),
        (
            "no namespace to finish in",
            scrubbing(running(), "Bound", succeeded.clone(), "uid-temp"),
            no_ns,
            blocked_ns.clone(),
        ),
        (
            "no namespace to delete the temporary claim in",
            scrubbing(Scrub::Scrubbed(t()), "Bound", ScrubPod::Missing, "uid-temp"),
            no_ns,
            blocked_ns.clone(),
        ),
        (
            "no namespace, but the release needs none",
            scrubbing(
                Scrub::Scrubbed(t()),
                "Released",
                ScrubPod::Missing,
                "uid-temp",
            ),
            no_ns,
            Plan::Release { claim_uid: t() },
        ),
        (
            "template broken while the scrub waits for its pod: the scrub fails",
            scrubbing(running(), "Bound", ScrubPod::Missing, "uid-temp"),
            bad_template,
            finish(
                Some("scrub template: the scrub template has no containers"),
                None,
            ),
        ),
        (
            "template removed while the scrub waits for its pod",
            scrubbing(running(), "Bound", ScrubPod::Missing, "uid-temp"),
            no_template,
            finish(
                Some("the StorageClass no longer has a scrub template"),
                None,
            ),
        ),
        (
            "template broken after the pod succeeded: the scrub stands",
            scrubbing(running(), "Bound", succeeded.clone(), "uid-temp"),
            bad_template,
            finish(None, Some("uid-pod")),
        ),
    ];
    for (what, mut pv, change, want) in rows {
        change(&mut pv);
        assert_eq!(decide(&pv, "ci"), want, "{what}");
    }
    assert_eq!(
        Blocked::InvalidTemplate("no spec".into()).to_string(),
        "its scrub template is invalid: no spec"
    );
}

#[test]
fn release_table() {
    type Change = fn(&mut PvFacts);
    let rows: Vec<(&str, Change, Plan)> = vec![
        ("claim gone", |_| {}, release()),
        (
            "a new claim of the same name",
            |p| {
                p.claim = ClaimRead::Exists {
                    uid: "uid-new".into(),
                }
            },
            release(),
        ),
        (
            "the claim still exists",
            |p| {
                p.claim = ClaimRead::Exists {
                    uid: "uid-old".into(),
                }
            },
            Plan::Skip(Skip::ClaimExists),
        ),
        (
            "not read yet",
            |p| p.claim = ClaimRead::NotRead,
            Plan::ReadClaim,
        ),
        (
            "another id",
            |p| p.class_id = Some("other".into()),
            Plan::Skip(Skip::NotOurs),
        ),
        (
            "class without id or gone",
            |p| p.class_id = None,
            Plan::Skip(Skip::NotOurs),
        ),
        (
            "Delete policy",
            |p| p.retain = false,
            Plan::Skip(Skip::NotRetain),
        ),
        (
            "Bound",
            |p| p.phase = "Bound".into(),
            Plan::Skip(Skip::NotReleased),
        ),
        (
            "Available",
            |p| p.phase = "Available".into(),
            Plan::Skip(Skip::NotReleased),
        ),
        (
            "Failed",
            |p| p.phase = "Failed".into(),
            Plan::Skip(Skip::NotReleased),
        ),
        (
            "being deleted",
            |p| p.deleting = true,
            Plan::Skip(Skip::Deleting),
        ),
        (
            "no claimRef",
            |p| p.claim_ref = None,
            Plan::Skip(Skip::NoClaim),
        ),
        (
            "pre-bound by name only",
            |p| {
                if let Some(c) = p.claim_ref.as_mut() {
                    c.uid.clear()
                }
            },
            Plan::Skip(Skip::NoClaim),
        ),
    ];
    for (what, change, want) in rows {
        let mut pv = releasable();
        change(&mut pv);
        assert_eq!(decide(&pv, "ci"), want, "{what}");
    }
}

/// Random PV facts, weighted towards the releasable corner so that every condition is often the
/// only one that fails.
fn any_facts() -> impl Strategy<Value = PvFacts> {
    let phase = prop_oneof![
        3 => Just("Released"),
        1 => Just("Bound"),
        1 => prop::sample::select(vec!["", "Pending", "Available", "Failed"]),
    ];
    let id = prop_oneof![3 => Just(Some("ci")), 1 => prop::option::of(Just("other"))];
    let uid = prop_oneof![3 => Just("uid-old"), 1 => prop::sample::select(vec!["", "uid-new"])];
    let claim = prop_oneof![
        2 => Just(ClaimRead::Gone),
        1 => Just(ClaimRead::NotRead),
        1 => uid.clone().prop_map(|u| ClaimRead::Exists { uid: u.into() }),
    ];
    let claim_ref = prop_oneof![
        5 => uid.prop_map(|u| Some(ClaimRef {
            namespace: "ci".into(),
            name: "cache".into(),
            uid: u.into(),
        })),
        1 => Just(None),
    ];
    let weighted = |yes: u32| prop_oneof![yes => Just(true), 1 => Just(false)];
    (
        (
            phase,
            weighted(4),
            id,
            claim_ref,
            weighted(1).prop_map(|b| !b),
            claim,
        ),
        any_scrub(),
    )
        .prop_map(
            |((phase, retain, id, claim_ref, deleting, claim), scrub)| PvFacts {
                phase: phase.into(),
                retain,
                class_id: id.map(String::from),
                claim_ref,
                deleting,
                claim,
                ..scrub
            },
        )
}

/// Random scrub facts (template, namespace, record, pod) on the releasable PV; a record names
/// `uid-old`, the claim the PV most often names, so that its steps are reached.
fn any_scrub() -> impl Strategy<Value = PvFacts> {
    let template = prop_oneof![
        2 => Just(ScrubTemplate::Absent),
        2 => Just(ScrubTemplate::Pod(template())),
        1 => Just(ScrubTemplate::Invalid("no containers".into())),
    ];
    let ns = prop_oneof![4 => Just(Some("ops".to_string())), 1 => Just(None)];
    let record = prop_oneof![
        2 => Just(None),
        1 => prop::sample::select(vec!["running", "scrubbed", "failed"])
            .prop_map(|s| Scrub::parse(&format!("{s}:uid-old"))),
    ];
    let pod = prop_oneof![
        Just(ScrubPod::Missing),
        Just(ScrubPod::Busy),
        Just(ScrubPod::Succeeded {
            uid: "uid-pod".into()
        }),
        Just(ScrubPod::Failed {
            uid: "uid-pod".into(),
            reason: "Error".into()
        }),
    ];
    (template, ns, record, pod).prop_map(|(scrub_template, scrub_ns, scrub, scrub_pod)| PvFacts {
        scrub_template,
        scrub_ns,
        scrub,
        scrub_pod,
        ..releasable()
    })
}

const CASES: u32 = 20_000;

/// A release happens only with every condition of the module doc, and is guarded by the UID of the
/// claim the PV names; the plan is a function of the facts.
fn check(pv: &PvFacts) -> Result<(), TestCaseError> {
    let plan = decide(pv, "ci");
    prop_assert_eq!(&plan, &decide(&pv.clone(), "ci"));
    if let Plan::Release { claim_uid } = &plan {
        let named = pv
            .claim_ref
            .as_ref()
            .map(|c| c.uid.clone())
            .unwrap_or_default();
        prop_assert_eq!(claim_uid, &named);
        prop_assert!(!claim_uid.is_empty());
        prop_assert_eq!(pv.class_id.as_deref(), Some("ci"));
        prop_assert!(pv.retain && pv.phase == "Released" && !pv.deleting);
        match &pv.scrub {
            // Never handed out dirty: with a scrub, only after it succeeded, and only from the
            // temporary claim that scrub used.
            Some(scrub) => prop_assert_eq!(scrub, &Scrub::Scrubbed(named.clone())),
            None => {
                prop_assert_eq!(&pv.scrub_template, &ScrubTemplate::Absent);
                let still_there = matches!(&pv.claim, ClaimRead::Exists { uid } if *uid == named);
                prop_assert!(!still_there && pv.claim != ClaimRead::NotRead);
            }
        }
    }
    if matches!(pv.scrub, Some(Scrub::Failed(_))) {
        let handed_out = matches!(plan, Plan::Release { .. } | Plan::CreateScrubPod { .. });
        prop_assert!(!handed_out, "a failed scrub is never released or run again");
    }
    check_scrub(pv, &plan)
}

/// Scrub steps run in the scrub namespace and from a template that makes a pod; a blocked scrub
/// is one of our PVs whose class asks for a scrub (or that is under one), for the cause the facts
/// show.
fn check_scrub(pv: &PvFacts, plan: &Plan) -> Result<(), TestCaseError> {
    let ours = pv.class_id.as_deref() == Some("ci") && pv.retain && !pv.deleting;
    match plan {
        Plan::StartScrub { namespace, .. } => {
            prop_assert_eq!(Some(namespace), pv.scrub_ns.as_ref());
            prop_assert!(matches!(pv.scrub_template, ScrubTemplate::Pod(_)));
            prop_assert!(pv.scrub.is_none() && pv.phase == "Released" && ours);
        }
        Plan::CreateScrubPod {
            temp_uid,
            namespace,
            pod,
        } => {
            prop_assert_eq!(Some(namespace), pv.scrub_ns.as_ref());
            let ScrubTemplate::Pod(template) = &pv.scrub_template else {
                return Err(TestCaseError::fail("a scrub pod without a template"));
            };
            prop_assert_eq!(
                pod,
                &crate::template::scrub::render(template, &pv.name, namespace)
            );
            prop_assert_eq!(pv.scrub.clone(), Some(Scrub::Running(temp_uid.clone())));
        }
        Plan::FinishScrub {
            namespace,
            failed,
            pod_uid,
            ..
        } => {
            prop_assert_eq!(Some(namespace), pv.scrub_ns.as_ref());
            let (want_uid, want_failed) = match &pv.scrub_pod {
                ScrubPod::Succeeded { uid } => (Some(uid), None),
                ScrubPod::Failed { uid, reason } => (Some(uid), Some(reason.clone())),
                _ => (None, failed.clone()),
            };
            prop_assert_eq!(pod_uid.as_ref(), want_uid);
            prop_assert_eq!(failed, &want_failed);
            prop_assert!(pod_uid.is_some() || failed.is_some(), "no pod: a failure");
        }
        Plan::DeleteTemp { namespace, .. } => {
            prop_assert_eq!(Some(namespace), pv.scrub_ns.as_ref());
        }
        Plan::ScrubBlocked(cause) => {
            prop_assert!(ours);
            prop_assert!(pv.scrub.is_some() || pv.scrub_template != ScrubTemplate::Absent);
            match cause {
                Blocked::InvalidTemplate(why) => {
                    prop_assert!(pv.scrub.is_none(), "a scrub under way fails instead");
                    prop_assert_eq!(&pv.scrub_template, &ScrubTemplate::Invalid(why.clone()));
                }
                Blocked::NoNamespace => prop_assert!(pv.scrub_ns.is_none()),
                Blocked::ClaimTaken { .. } => prop_assert!(false, "found by act, never decided"),
            }
        }
        Plan::Skip(_) | Plan::ReadClaim | Plan::Release { .. } => {}
    }
    Ok(())
}

#[test]
fn releases_only_what_is_ours_released_and_unclaimed() {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let config = ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let (checked, released, blocked) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    let result = runner.run(&any_facts(), |pv| {
        checked.fetch_add(1, Relaxed);
        match decide(&pv, "ci") {
            Plan::Release { .. } => released.fetch_add(1, Relaxed),
            Plan::ScrubBlocked(_) => blocked.fetch_add(1, Relaxed),
            _ => 0,
        };
        check(&pv)
    });
    let (checked, released, blocked) = (
        checked.into_inner(),
        released.into_inner(),
        blocked.into_inner(),
    );
    eprintln!(
        "releaser decide: {checked} random PV states checked, {released} released, {blocked} scrubs blocked"
    );
    result.expect("the release property holds");
    assert!(released > 0, "the generator reaches releasable states");
    assert!(blocked > 0, "the generator reaches blocked scrubs");
}

/// A claim that already has the temporary claim's name is adopted only by the UID this process
/// recorded when it created it; a name, a label or an annotation proves nothing.
#[test]
fn an_existing_temporary_claim_is_adopted_only_by_its_recorded_uid() {
    let cases = [
        (
            "uid-temp",
            false,
            Some("uid-temp"),
            Existing::Adopt("uid-temp".into()),
        ),
        (
            "uid-foreign",
            false,
            Some("uid-temp"),
            Existing::Foreign("uid-foreign".into()),
        ),
        (
            "uid-foreign",
            false,
            None,
            Existing::Foreign("uid-foreign".into()),
        ),
        ("", false, Some(""), Existing::Foreign(String::new())),
        ("uid-temp", true, Some("uid-temp"), Existing::Deleting),
        ("uid-foreign", true, None, Existing::Deleting),
    ];
    for (uid, deleting, created, want) in cases {
        assert_eq!(
            existing(uid, deleting, created),
            want,
            "{uid} {deleting} {created:?}"
        );
    }
}
