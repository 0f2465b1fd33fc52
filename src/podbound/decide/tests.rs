//! Table tests over the pod-bound claims' `decide`.

use super::*;
use crate::podbound::observe::{NamedPod, PodRef, Waiting};

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// Claim `cache` of `ns`, bound to pod `runner`, waiting for it since 12:00 (recorded).
fn claim() -> ClaimFacts {
    ClaimFacts {
        namespace: "ns".into(),
        name: "cache".into(),
        uid: "uid-claim".into(),
        resource_version: "5".into(),
        pod: Some("runner".into()),
        waiting: Some(Waiting {
            pod: "runner".into(),
            since: t("2026-11-24T12:00:00Z"),
        }),
        deleting: false,
        owners: Vec::new(),
        created: Some(t("2026-11-24T11:00:00Z")),
    }
}

fn pod(name: &str) -> PodRef {
    PodRef {
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// A read: the named pod `runner` (if `named`, stateful or not), these users, this StatefulSet.
fn read(named: Option<bool>, users: &[&str], set: Option<&str>) -> PodRead {
    PodRead::Read {
        named: named.map(|stateful| NamedPod {
            uid: "uid-runner".into(),
            stateful,
        }),
        users: users.iter().map(|u| pod(u)).collect(),
        statefulset: set.map(str::to_string),
    }
}

fn exists(stateful: bool) -> PodRead {
    read(Some(stateful), &[], None)
}

fn gone(users: &[&str]) -> PodRead {
    read(None, users, None)
}

fn owned_by(c: &mut ClaimFacts, name: &str) {
    c.owners
        .push(("Pod".into(), name.into(), format!("uid-{name}")));
}

const GRACE: Duration = Duration::from_secs(600);

fn kind(plan: &Plan) -> String {
    match plan {
        Plan::Refuse(reason, _) => format!("Refuse({reason})"),
        Plan::Wait(d) => format!("Wait({}s)", d.as_secs()),
        Plan::Record(w) => format!("Record({})", w.format()),
        Plan::Attach(pods) => {
            let pods: Vec<String> = pods
                .iter()
                .map(|p| format!("{}:{}", p.name, p.uid))
                .collect();
            format!("Attach({})", pods.join(","))
        }
        other => format!("{other:?}"),
    }
}

type Change = fn(&mut ClaimFacts);

fn check(rows: Vec<(&str, Change, PodRead, &str, &str)>) {
    for (what, change, read, now, want) in rows {
        let mut c = claim();
        change(&mut c);
        let when = format!("2026-11-24T{now}Z");
        let plan = decide(&c, &read, t(&when), GRACE);
        assert_eq!(kind(&plan), want, "{what}");
    }
}

#[test]
fn binding_table() {
    check(vec![
        (
            "not opted in",
            |c| c.pod = None,
            exists(false),
            "12:00:05",
            "Skip",
        ),
        (
            "not read yet",
            |_| {},
            PodRead::NotRead,
            "12:00:05",
            "ReadPods",
        ),
        (
            "bound, not read yet: the pods that mount it are looked at",
            |c| owned_by(c, "runner"),
            PodRead::NotRead,
            "12:00:05",
            "ReadPods",
        ),
        (
            "pod runs: attach",
            |_| {},
            exists(false),
            "12:00:05",
            "Attach(runner:uid-runner)",
        ),
        (
            "pod runs and mounts it: attached once",
            |_| {},
            read(Some(false), &["runner"], None),
            "12:00:05",
            "Attach(runner:uid-runner)",
        ),
        (
            "attached already, pod gone: the GC has it",
            |c| owned_by(c, "runner"),
            gone(&[]),
            "13:00:00",
            "Skip",
        ),
        (
            "claim being deleted",
            |c| c.deleting = true,
            gone(&[]),
            "13:00:00",
            "Skip",
        ),
    ]);
}

/// Refusals: nothing is written, a Warning says why.
#[test]
fn refusal_table() {
    check(vec![
        (
            "a StatefulSet's pod",
            |_| {},
            exists(true),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
        (
            "a claim owned by a StatefulSet",
            |c| {
                c.owners
                    .push(("StatefulSet".into(), "web".into(), "uid-web".into()))
            },
            exists(false),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
        (
            "no pod named",
            |c| c.pod = Some(String::new()),
            exists(false),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
    ]);
}

/// A claim never bound: it waits for its pod within the grace; after it, it is deleted only if no
/// pod mounts it.
#[test]
fn grace_table() {
    check(vec![
        (
            "pod not there yet, in grace",
            |_| {},
            gone(&[]),
            "12:04:00",
            "Wait(360s)",
        ),
        (
            "pod gone, grace over",
            |_| {},
            gone(&[]),
            "12:10:00",
            "Delete",
        ),
        (
            "pod gone, another pod mounts it",
            |_| {},
            gone(&["other"]),
            "13:00:00",
            "Refuse(ClaimInUse)",
        ),
    ]);
}

/// The grace counts from the recorded start of the wait for the pod the annotation names now, never
/// from the claim's creation: an old claim annotated for a pod still to come (or a typo) is first
/// recorded as waiting, then waits the whole grace. (Before the record, an old claim was deleted
/// on its first pass.)
#[test]
fn the_grace_counts_from_the_recorded_wait_not_the_creation() {
    check(vec![
        (
            "old claim, no record: the wait starts now, nothing is deleted",
            |c| c.waiting = None,
            gone(&[]),
            "13:00:00",
            "Record(runner@2026-11-24T13:00:00Z)",
        ),
        (
            "recorded for another pod (the annotation changed): the wait starts again",
            |c| c.pod = Some("runner-2".into()),
            gone(&[]),
            "13:00:00",
            "Record(runner-2@2026-11-24T13:00:00Z)",
        ),
        (
            "recorded a minute ago on an old claim: most of the grace left",
            |c| {
                c.waiting = Some(Waiting {
                    pod: "runner".into(),
                    since: t("2026-11-24T12:59:00Z"),
                })
            },
            gone(&[]),
            "13:00:00",
            "Wait(540s)",
        ),
        (
            "recorded in the future (clock set back): the whole grace",
            |c| {
                c.waiting = Some(Waiting {
                    pod: "runner".into(),
                    since: t("2026-11-24T14:00:00Z"),
                })
            },
            gone(&[]),
            "13:00:00",
            "Wait(600s)",
        ),
        (
            "no record, but the pod runs: attached, nothing recorded",
            |c| c.waiting = None,
            exists(false),
            "13:00:00",
            "Attach(runner:uid-runner)",
        ),
        (
            "no record, another pod mounts it: kept, nothing recorded",
            |c| c.waiting = None,
            gone(&["other"]),
            "13:00:00",
            "Refuse(ClaimInUse)",
        ),
    ]);
}

/// A pod is usually created right after its claim: a claim younger than `RECORD_AFTER` is looked
/// at again instead of recorded, so the owner patch that follows tests a resourceVersion no record
/// has moved. Recording later only starts the grace later.
#[test]
fn a_young_claim_is_not_recorded_yet() {
    check(vec![
        (
            "created 2 s ago, no record, no pod yet: looked at again at 5 s, nothing written",
            |c| {
                c.waiting = None;
                c.created = Some(t("2026-11-24T12:59:58Z"));
            },
            gone(&[]),
            "13:00:00",
            "Wait(3s)",
        ),
        (
            "created 5 s ago, no record, no pod: the wait starts now",
            |c| {
                c.waiting = None;
                c.created = Some(t("2026-11-24T12:59:55Z"));
            },
            gone(&[]),
            "13:00:00",
            "Record(runner@2026-11-24T13:00:00Z)",
        ),
        (
            "created an hour in the future (clocks apart), no record: recorded now, not in an hour",
            |c| {
                c.waiting = None;
                c.created = Some(t("2026-11-24T14:00:00Z"));
            },
            gone(&[]),
            "13:00:00",
            "Record(runner@2026-11-24T13:00:00Z)",
        ),
        (
            "no creation time, no record: the wait starts now",
            |c| {
                c.waiting = None;
                c.created = None;
            },
            gone(&[]),
            "13:00:00",
            "Record(runner@2026-11-24T13:00:00Z)",
        ),
        (
            "created 2 s ago and its pod is there: attached at once",
            |c| {
                c.waiting = None;
                c.created = Some(t("2026-11-24T12:59:58Z"));
            },
            exists(false),
            "13:00:00",
            "Attach(runner:uid-runner)",
        ),
        (
            "created 3 s ago and recorded 1 s ago: the grace goes on from the record",
            |c| c.created = Some(t("2026-11-24T11:59:58Z")),
            gone(&[]),
            "12:00:01",
            "Wait(599s)",
        ),
    ]);
}

#[test]
fn a_waiting_record_reads_back_as_written() {
    // The record reads back as written, and nothing else passes for one.
    let w = Waiting::parse("runner@2026-11-24T13:00:00Z").expect("parses");
    assert_eq!(
        (w.pod.as_str(), w.since),
        ("runner", t("2026-11-24T13:00:00Z"))
    );
    assert_eq!(w.format(), "runner@2026-11-24T13:00:00Z");
    for bad in ["runner", "runner@yesterday", "", "@"] {
        assert_eq!(Waiting::parse(bad), None, "{bad}");
    }
}

/// A claim another live pod mounts is never left to the garbage collector with the named pod as
/// its only owner: that pod becomes an owner too.
#[test]
fn other_pods_that_mount_the_claim_become_owners() {
    check(vec![
        (
            "first binding: the named pod and the reader in one patch",
            |_| {},
            read(Some(false), &["runner", "reader"], None),
            "12:00:05",
            "Attach(runner:uid-runner,reader:uid-reader)",
        ),
        (
            "bound: a new reader is added",
            |c| owned_by(c, "runner"),
            read(Some(false), &["runner", "reader"], None),
            "12:00:05",
            "Attach(reader:uid-reader)",
        ),
        (
            "bound, the named pod gone: a new reader is still added",
            |c| owned_by(c, "reader"),
            read(None, &["reader", "late"], None),
            "13:00:00",
            "Attach(late:uid-late)",
        ),
        (
            "bound, every user an owner: nothing to do",
            |c| {
                owned_by(c, "runner");
                owned_by(c, "reader");
            },
            read(Some(false), &["runner", "reader"], None),
            "12:00:05",
            "Skip",
        ),
        (
            "bound by its creator to another pod: users added as well",
            |c| owned_by(c, "creator-set"),
            read(Some(false), &["reader"], None),
            "12:00:05",
            "Attach(reader:uid-reader)",
        ),
        (
            "bound to a StatefulSet's pod by its creator: users added, nothing refused",
            |c| owned_by(c, "runner"),
            read(Some(true), &["reader"], None),
            "12:00:05",
            "Attach(reader:uid-reader)",
        ),
    ]);
}

/// A claim named `<template>-<set>-<ordinal>` of a StatefulSet of the namespace is refused whatever
/// else holds: never bound, never deleted after the grace.
#[test]
fn a_statefulset_claim_by_name_is_refused() {
    let set = Some("web");
    check(vec![
        (
            "names a plain running pod",
            |_| {},
            read(Some(false), &[], set),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
        (
            "names a pod that is gone, grace over",
            |_| {},
            read(None, &[], set),
            "13:00:00",
            "Refuse(PodBindingRefused)",
        ),
        (
            "bound already: no owner added",
            |c| owned_by(c, "runner"),
            read(Some(false), &["reader"], set),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
    ]);
}

#[test]
fn a_recreated_pod_does_not_keep_the_old_binding() {
    // Attached to the first pod's UID; a new pod with the same name that does not mount the claim
    // changes nothing: the claim follows the first pod (the garbage collector deletes it once
    // that UID is gone).
    let mut c = claim();
    c.owners
        .push(("Pod".into(), "runner".into(), "uid-first".into()));
    let read = PodRead::Read {
        named: Some(NamedPod {
            uid: "uid-second".into(),
            stateful: false,
        }),
        users: Vec::new(),
        statefulset: None,
    };
    assert_eq!(
        decide(&c, &read, t("2026-11-24T12:00:05Z"), GRACE),
        Plan::Skip
    );
    // If it mounts the claim, it uses it: it is added as an owner like any other pod that does.
    let read = PodRead::Read {
        named: Some(NamedPod {
            uid: "uid-second".into(),
            stateful: false,
        }),
        users: vec![PodRef {
            name: "runner".into(),
            uid: "uid-second".into(),
        }],
        statefulset: None,
    };
    assert_eq!(
        kind(&decide(&c, &read, t("2026-11-24T12:00:05Z"), GRACE)),
        "Attach(runner:uid-second)"
    );
}
