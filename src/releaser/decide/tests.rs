//! Table and property tests over the releaser's `decide`.

use proptest::prelude::*;

use super::*;
use crate::releaser::observe::ClaimRef;

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
        scrub_template: None,
        scrub: None,
        scrub_pod: ScrubPod::Missing,
    }
}

fn release() -> Plan {
    Plan::Release {
        claim_uid: "uid-old".into(),
    }
}

#[test]
fn scrub_table() {
    let scrubbing = |state: Scrub, phase: &str, pod: ScrubPod, claim_uid: &str| {
        let mut pv = releasable();
        pv.scrub_template = Some("{}".into());
        pv.scrub = Some(state);
        pv.phase = phase.into();
        pv.scrub_pod = pod;
        if let Some(c) = pv.claim_ref.as_mut() {
            c.uid = claim_uid.into();
        }
        decide(&pv, "ci")
    };
    let t = || "uid-temp".to_string();
    let mut start = releasable();
    start.scrub_template = Some("{}".into());
    let want = Plan::StartScrub {
        claim_uid: "uid-old".into(),
    };
    assert_eq!(decide(&start, "ci"), want, "a template: scrub first");
    let running = || Scrub::Running(t());
    let failed = |why: &str| Some(why.to_string());
    let rows: Vec<(&str, Plan, Plan)> = vec![
        (
            "bound, no pod yet",
            scrubbing(running(), "Bound", ScrubPod::Missing, "uid-temp"),
            Plan::CreateScrubPod { temp_uid: t() },
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
            scrubbing(running(), "Bound", ScrubPod::Succeeded, "uid-temp"),
            Plan::FinishScrub {
                temp_uid: t(),
                failed: None,
            },
        ),
        (
            "pod failed",
            scrubbing(
                running(),
                "Bound",
                ScrubPod::Failed("Error".into()),
                "uid-temp",
            ),
            Plan::FinishScrub {
                temp_uid: t(),
                failed: failed("Error"),
            },
        ),
        (
            "scrubbed, temporary claim still there",
            scrubbing(Scrub::Scrubbed(t()), "Bound", ScrubPod::Missing, "uid-temp"),
            Plan::DeleteTemp { temp_uid: t() },
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
            Plan::DeleteTemp { temp_uid: t() },
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
    for (what, got, want) in rows {
        assert_eq!(got, want, "{what}");
    }
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
        1 => prop::sample::select(vec!["", "Pending", "Available", "Bound", "Failed"]),
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
        phase,
        weighted(4),
        id,
        claim_ref,
        weighted(1).prop_map(|b| !b),
        claim,
    )
        .prop_map(|(phase, retain, id, claim_ref, deleting, claim)| PvFacts {
            phase: phase.into(),
            retain,
            class_id: id.map(String::from),
            claim_ref,
            deleting,
            claim,
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
                prop_assert!(pv.scrub_template.is_none());
                let still_there = matches!(&pv.claim, ClaimRead::Exists { uid } if *uid == named);
                prop_assert!(!still_there && pv.claim != ClaimRead::NotRead);
            }
        }
    }
    if matches!(pv.scrub, Some(Scrub::Failed(_))) {
        let handed_out = matches!(plan, Plan::Release { .. } | Plan::CreateScrubPod { .. });
        prop_assert!(!handed_out, "a failed scrub is never released or run again");
    }
    Ok(())
}

#[test]
fn releases_only_what_is_ours_released_and_unclaimed() {
    let config = ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let (checked, released) = (
        std::sync::atomic::AtomicU32::new(0),
        std::sync::atomic::AtomicU32::new(0),
    );
    let result = runner.run(&any_facts(), |pv| {
        checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if matches!(decide(&pv, "ci"), Plan::Release { .. }) {
            released.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        check(&pv)
    });
    let (checked, released) = (checked.into_inner(), released.into_inner());
    eprintln!("releaser decide: {checked} random PV states checked, {released} released");
    result.expect("the release property holds");
    assert!(released > 0, "the generator reaches releasable states");
}
