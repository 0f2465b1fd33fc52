//! Table tests over the pod-bound claims' `decide`.

use super::*;

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// Claim `cache` of `ns`, created at 12:00, bound to pod `runner`.
fn claim() -> ClaimFacts {
    ClaimFacts {
        namespace: "ns".into(),
        name: "cache".into(),
        uid: "uid-claim".into(),
        resource_version: "5".into(),
        pod: Some("runner".into()),
        created: Some(t("2026-11-24T12:00:00Z")),
        deleting: false,
        owners: Vec::new(),
    }
}

fn exists(stateful: bool) -> PodRead {
    PodRead::Exists {
        uid: "uid-runner".into(),
        stateful,
    }
}

fn gone(users: &[&str]) -> PodRead {
    PodRead::Gone {
        users: users.iter().map(|u| u.to_string()).collect(),
    }
}

const GRACE: Duration = Duration::from_secs(600);

fn kind(plan: &Plan) -> String {
    match plan {
        Plan::Refuse(reason, _) => format!("Refuse({reason})"),
        Plan::Wait(d) => format!("Wait({}s)", d.as_secs()),
        Plan::Attach { pod, uid } => format!("Attach({pod},{uid})"),
        other => format!("{other:?}"),
    }
}

#[test]
fn binding_table() {
    type Change = fn(&mut ClaimFacts);
    let at = |s: &str| t(s);
    let rows: Vec<(&str, Change, PodRead, &str, &str)> = vec![
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
            "ReadPod",
        ),
        (
            "pod runs: attach",
            |_| {},
            exists(false),
            "12:00:05",
            "Attach(runner,uid-runner)",
        ),
        (
            "attached already: the GC has it",
            |c| {
                c.owners
                    .push(("Pod".into(), "runner".into(), "uid-old".into()))
            },
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
        (
            "a StatefulSet's pod",
            |_| {},
            exists(true),
            "12:00:05",
            "Refuse(PodBindingRefused)",
        ),
        (
            "a StatefulSet's claim",
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
    ];
    for (what, change, read, now, want) in rows {
        let mut c = claim();
        change(&mut c);
        let when = format!("2026-11-24T{now}Z");
        let plan = decide(&c, &read, at(&when), GRACE);
        assert_eq!(kind(&plan), want, "{what}");
    }
}

#[test]
fn a_recreated_pod_does_not_keep_the_old_binding() {
    // Attached to the first pod's UID; a new pod with the same name changes nothing: the claim
    // follows the first pod (the garbage collector deletes it once that UID is gone).
    let mut c = claim();
    c.owners
        .push(("Pod".into(), "runner".into(), "uid-first".into()));
    let read = PodRead::Exists {
        uid: "uid-second".into(),
        stateful: false,
    };
    assert_eq!(
        decide(&c, &read, t("2026-11-24T12:00:05Z"), GRACE),
        Plan::Skip
    );
}
