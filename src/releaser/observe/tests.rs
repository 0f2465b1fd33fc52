//! Table tests over the releaser's `observe`: the scrub pod's state, the scrub template's check,
//! and the facts of one PV.

use serde_json::json;

use super::*;

fn pod(phase: Option<&str>, reason: Option<&str>, deleting: bool) -> Pod {
    let mut pod = json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-pod"},
                         "status": {"phase": phase, "reason": reason}});
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-25T12:00:00Z");
    }
    serde_json::from_value(pod).expect("pod")
}

#[test]
fn the_scrub_pod_is_classified_by_its_phase() {
    let succeeded = || ScrubPod::Succeeded {
        uid: "uid-pod".into(),
    };
    let failed = |reason: &str| ScrubPod::Failed {
        uid: "uid-pod".into(),
        reason: reason.into(),
    };
    let rows = [
        ("no pod", None, ScrubPod::Missing),
        (
            "Pending",
            Some(pod(Some("Pending"), None, false)),
            ScrubPod::Busy,
        ),
        (
            "Running",
            Some(pod(Some("Running"), None, false)),
            ScrubPod::Busy,
        ),
        ("no phase yet", Some(pod(None, None, false)), ScrubPod::Busy),
        (
            "Unknown",
            Some(pod(Some("Unknown"), None, false)),
            ScrubPod::Busy,
        ),
        (
            "Succeeded",
            Some(pod(Some("Succeeded"), None, false)),
            succeeded(),
        ),
        (
            "Succeeded, being deleted",
            Some(pod(Some("Succeeded"), None, true)),
            succeeded(),
        ),
        (
            "Failed with a reason",
            Some(pod(Some("Failed"), Some("DeadlineExceeded"), false)),
            failed("DeadlineExceeded"),
        ),
        (
            "Failed without one",
            Some(pod(Some("Failed"), None, false)),
            failed("Failed"),
        ),
        (
            "Failed with an empty one",
            Some(pod(Some("Failed"), Some(""), true)),
            failed("Failed"),
        ),
        (
            "Running, being deleted",
            Some(pod(Some("Running"), None, true)),
            ScrubPod::Missing,
        ),
    ];
    for (what, pod, want) in rows {
        assert_eq!(scrub_pod_state(pod.as_ref()), want, "{what}");
    }
}

fn class(template: Option<&str>) -> StorageClass {
    let mut annotations = json!({CONTROLLER_ID_ANNOTATION: "ci"});
    if let Some(t) = template {
        annotations[SCRUB_TEMPLATE_ANNOTATION] = json!(t);
    }
    serde_json::from_value(
        json!({"metadata": {"name": "pool", "annotations": annotations},
                                  "provisioner": "x"}),
    )
    .expect("class")
}

/// The kind of the template fact: `Absent`, `Pod` or the error of `Invalid`.
fn kind(t: &ScrubTemplate) -> String {
    match t {
        ScrubTemplate::Absent => "Absent".into(),
        ScrubTemplate::Pod(_) => "Pod".into(),
        ScrubTemplate::Invalid(why) => format!("Invalid: {why}"),
    }
}

#[test]
fn the_scrub_template_is_checked_in_observe() {
    let good = r#"{"spec":{"containers":[{"name":"wipe","image":"busybox"}]}}"#;
    let yaml = "spec:\n  containers:\n  - name: wipe\n    image: busybox\n";
    let rows: [(&str, Option<&str>, &str); 9] = [
        ("no annotation", None, "Absent"),
        ("empty", Some("  \n"), "Absent"),
        ("a pod (JSON)", Some(good), "Pod"),
        ("a pod (YAML)", Some(yaml), "Pod"),
        ("not JSON or YAML", Some("{"), "Invalid: "),
        (
            "not a pod",
            Some("[1, 2]"),
            "Invalid: the scrub template is not a pod",
        ),
        (
            "no spec",
            Some(r#"{"metadata":{}}"#),
            "Invalid: the scrub template has no spec",
        ),
        (
            "no containers",
            Some(r#"{"spec":{"containers":[]}}"#),
            "Invalid: the scrub template has no containers",
        ),
        (
            "volume data taken",
            Some(
                r#"{"spec":{"containers":[{"name":"a","image":"b"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#,
            ),
            "Invalid: the scrub template must not define volume `data`",
        ),
    ];
    for (what, template, want) in rows {
        let got = kind(&scrub_template(Some(&class(template))));
        assert!(got.starts_with(want), "{what}: {got}");
    }
    assert_eq!(scrub_template(None), ScrubTemplate::Absent, "no class");
    let ScrubTemplate::Pod(pod) = scrub_template(Some(&class(Some(good)))) else {
        panic!("a pod");
    };
    assert_eq!(
        pod["spec"]["containers"][0]["name"], "wipe",
        "not rendered yet"
    );
    assert!(pod.get("metadata").is_none(), "not rendered yet: {pod}");
}

fn pv(class: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "uid": "uid-pv",
                     "annotations": {SCRUB_STATE_ANNOTATION: "running:uid-temp"}},
        "spec": {"storageClassName": class, "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": "ops", "name": "scrub-pv-1", "uid": "uid-temp"}},
        "status": {"phase": "Bound"}
    }))
    .expect("pv")
}

#[test]
fn the_facts_of_a_pv_under_a_scrub() {
    let running = pod(Some("Running"), None, false);
    let template = r#"{"spec":{"containers":[{"name":"wipe","image":"busybox"}]}}"#;
    let facts = observe(
        &pv("pool"),
        Some(&class(Some(template))),
        ClaimRead::NotRead,
        Some(&running),
        Some("ops"),
    );
    assert_eq!(facts.class_id.as_deref(), Some("ci"));
    assert!(matches!(facts.scrub_template, ScrubTemplate::Pod(_)));
    assert_eq!(facts.scrub_ns.as_deref(), Some("ops"));
    assert_eq!(facts.scrub, Some(Scrub::Running("uid-temp".into())));
    assert_eq!(facts.scrub_pod, ScrubPod::Busy);
    assert_eq!(
        facts.claim_ref.as_ref().map(|c| c.uid.as_str()),
        Some("uid-temp")
    );

    // Another class's object is not this PV's class: no id, no template.
    let other = observe(
        &pv("other"),
        Some(&class(Some(template))),
        ClaimRead::NotRead,
        None,
        Some(""),
    );
    assert_eq!(other.class_id, None);
    assert_eq!(other.scrub_template, ScrubTemplate::Absent);
    assert_eq!(other.scrub_ns, None, "an empty namespace is none");
    assert_eq!(other.scrub_pod, ScrubPod::Missing);
}
