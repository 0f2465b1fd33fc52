//! Table tests over `decide`: each case writes down facts and the plan they must give.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::scaledown::observe::{
    ClaimFacts, CleanupFacts, Failure, Observed, OrdinalFacts, Phase, PodFacts, PodRole, Record,
    Rejection, SetFacts, SetRead,
};

pub(super) const TEMPLATE: &str = r#"{"metadata":{"labels":{"app":"web-cleanup"}},
  "spec":{"containers":[{"name":"main","image":"busybox","volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#;

pub(super) fn t0() -> Timestamp {
    "2026-11-20T12:00:00Z".parse().expect("timestamp")
}

/// StatefulSet `web` in `ns`, opted in, finalizer present, OrderedReady, claim template `data`,
/// read live (the tables below show what a confirmed pass does; `cached_reads_ask_for_a_live_read`
/// shows what a pass from the cache does).
pub(super) fn web(replicas: u32) -> Observed {
    Observed {
        set: SetFacts {
            namespace: "ns".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            resource_version: "7".into(),
            generation: 3,
            record_raw: None,
            records: BTreeMap::new(),
            finalizers: vec![naming::FINALIZER.into()],
            deleting: false,
            template: Some(TEMPLATE.into()),
            claim_templates: vec!["data".into()],
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            replicas,
            start: 0,
            parallel: false,
            when_scaled_delete: false,
            when_deleted_delete: false,
            observed_generation: 3,
            status_replicas: replicas,
            inherit: None,
            scheduling: serde_json::Map::new(),
            ..SetFacts::default()
        },
        ordinals: BTreeMap::new(),
        cleanups_in_flight: 0,
        rejections: BTreeMap::new(),
        disputed: Default::default(),
        read: SetRead::LiveAll,
        now: t0(),
    }
}

pub(super) fn claim(template: &str, ordinal: u32) -> ClaimFacts {
    ClaimFacts {
        template: template.into(),
        name: format!("{template}-web-{ordinal}"),
        uid: format!("uid-{template}-{ordinal}"),
        deleting: false,
        next_attempt: None,
        not_ours: None,
        used_by: Vec::new(),
    }
}

pub(super) fn stateful(ordinal: u32) -> PodFacts {
    PodFacts {
        name: format!("web-{ordinal}"),
        uid: format!("uid-pod-{ordinal}"),
        deleting: false,
        role: PodRole::Stateful,
    }
}

pub(super) fn cleanup(ordinal: u32, phase: Phase, attempt: u32) -> PodFacts {
    PodFacts {
        name: format!("web-{ordinal}"),
        uid: format!("uid-cleanup-{ordinal}-{attempt}"),
        deleting: false,
        role: PodRole::Cleanup(CleanupFacts {
            phase,
            attempt,
            claims: [(format!("data-web-{ordinal}"), format!("uid-data-{ordinal}"))].into(),
            gated: false,
            scheduled: true,
            restarts: None,
            failure: (phase == Phase::Failed).then(|| Failure {
                reason: "Error".into(),
                exit_code: Some(1),
                finished_at: Some(t0()),
                message: None,
            }),
            created: None,
        }),
    }
}

/// Ordinals 0..n with a `data` claim and, for ordinals in `pods`, a stateful pod.
pub(super) fn with_claims(
    mut o: Observed,
    claims: std::ops::Range<u32>,
    pods: std::ops::Range<u32>,
) -> Observed {
    for n in claims {
        o.ordinals
            .entry(n)
            .or_default()
            .claims
            .push(claim("data", n));
    }
    for n in pods {
        o.ordinals.entry(n).or_default().pod = Some(stateful(n));
    }
    o
}

/// Puts `pod` at `ordinal`; a cleanup pod is also recorded on the set, as the controller does when
/// it confirms one it created.
pub(super) fn set_pod(o: &mut Observed, ordinal: u32, pod: PodFacts) {
    if let PodRole::Cleanup(c) = &pod.role {
        o.set.records.insert(
            ordinal,
            Record {
                pod: pod.uid.clone(),
                claims: c.claims.clone(),
            },
        );
    }
    o.ordinals.entry(ordinal).or_default().pod = Some(pod);
}

/// One line per step, so a table row reads like the plan.
pub(super) fn summary(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .map(|s| match s {
            Step::SetFinalizers { adding: true, .. } => "finalizer+".to_string(),
            Step::SetFinalizers {
                adding: false,
                finalizers,
                ..
            } => format!("finalizer- {finalizers:?}"),
            Step::MarkDeletion { propagation } => format!("mark-deletion {propagation:?}"),
            Step::DeleteStatefulPod { name, .. } => format!("delete-stateful {name}"),
            Step::CreateCleanupPod {
                ordinal, attempt, ..
            } => format!("create web-{ordinal}#{attempt}"),
            Step::DeleteClaim { name, uid } => format!("delete-claim {name} {uid}"),
            Step::DeleteCleanupPod { name, why, .. } => format!("delete-cleanup {name} {why:?}"),
            Step::MarkNextAttempt { claim, attempt, .. } => format!("mark {claim} {attempt:?}"),
            Step::Release { name, .. } => format!("release {name}"),
            Step::Event(e) => format!(
                "{} {}",
                if e.reason.is_warning() {
                    "warn"
                } else {
                    "event"
                },
                e.reason
            ),
        })
        .collect()
}

fn plan(o: &Observed) -> Vec<String> {
    summary(&decide(o, &Policy::default()))
}

fn created_pods(plan: &Plan) -> Vec<&serde_json::Value> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::CreateCleanupPod { pod, .. } => Some(pod),
            _ => None,
        })
        .collect()
}

#[test]
fn opt_in_and_finalizer() {
    let mut no_annotation = with_claims(web(2), 0..3, 0..2);
    no_annotation.set.template = None;
    no_annotation.set.finalizers.clear();
    assert_eq!(
        plan(&no_annotation),
        Vec::<String>::new(),
        "unannotated sets are never touched"
    );

    let mut no_templates = with_claims(web(2), 0..3, 0..2);
    no_templates.set.claim_templates.clear();
    no_templates.set.finalizers.clear();
    assert_eq!(plan(&no_templates), Vec::<String>::new());

    let mut new = with_claims(web(3), 0..3, 0..3);
    new.set.finalizers = vec!["other".into()];
    let p = decide(&new, &Policy::default());
    assert_eq!(summary(&p), ["finalizer+"]);
    assert!(
        matches!(&p.steps[0], Step::SetFinalizers { finalizers, resource_version, .. }
        if *finalizers == ["other", naming::FINALIZER] && resource_version == "7")
    );

    let mut deleting_without = with_claims(web(3), 0..0, 0..0);
    deleting_without.set.finalizers.clear();
    deleting_without.set.deleting = true;
    assert_eq!(
        plan(&deleting_without),
        Vec::<String>::new(),
        "no finalizer is added to a deleting set"
    );
}

#[test]
fn scale_down_table() {
    let mut two_templates = with_claims(web(1), 0..2, 0..1);
    two_templates.set.claim_templates = vec!["data".into(), "logs".into()];
    for n in 0..2 {
        two_templates
            .ordinals
            .entry(n)
            .or_default()
            .claims
            .push(claim("logs", n));
    }
    let mut one_missing = two_templates.clone();
    one_missing
        .ordinals
        .entry(1)
        .or_default()
        .claims
        .retain(|c| c.template == "data");

    let mut terminating = with_claims(web(2), 0..3, 0..2);
    terminating.ordinals.entry(2).or_default().claims[0].deleting = true;

    let mut slow_pod = with_claims(web(2), 0..3, 0..3);
    if let Some(p) = slow_pod.ordinals.entry(2).or_default().pod.as_mut() {
        p.deleting = true;
    }

    let mut start = with_claims(web(2), 0..0, 0..0);
    start.set.start = 5;
    start = with_claims(start, 5..8, 5..7);

    let mut parallel = with_claims(web(2), 0..5, 0..2);
    parallel.set.parallel = true;

    let mut hole = with_claims(web(3), 0..3, 0..3);
    hole.ordinals.entry(1).or_default().pod = None;

    let mut conflict = with_claims(web(2), 0..3, 0..2);
    conflict.ordinals.entry(2).or_default().claims[0].not_ours = Some("data-web".into());

    let mut when_scaled = with_claims(web(2), 0..3, 0..2);
    when_scaled.set.when_scaled_delete = true;
    // Kubernetes already deleting the claim when the first pass sees the scale-down.
    let mut when_scaled_deleting = when_scaled.clone();
    when_scaled_deleting.ordinals.entry(2).or_default().claims[0].deleting = true;

    let mut foreign = with_claims(web(2), 0..3, 0..2);
    set_pod(
        &mut foreign,
        2,
        PodFacts {
            role: PodRole::Foreign,
            ..stateful(2)
        },
    );

    let cases: Vec<(&str, Observed, Vec<&str>)> = vec![
        ("steady state", with_claims(web(3), 0..3, 0..3), vec![]),
        (
            "basic 3->2",
            with_claims(web(2), 0..3, 0..2),
            vec!["create web-2#1"],
        ),
        ("pod still terminating", slow_pod, vec![]),
        (
            "scale to zero",
            with_claims(web(0), 0..1, 0..0),
            vec!["create web-0#1"],
        ),
        (
            "ordered 4->1: highest only",
            with_claims(web(1), 0..4, 0..1),
            vec!["create web-3#1"],
        ),
        (
            "parallel 5->2: all",
            parallel,
            vec!["create web-4#1", "create web-3#1", "create web-2#1"],
        ),
        ("two templates", two_templates, vec!["create web-1#1"]),
        (
            "one claim missing",
            one_missing,
            vec!["warn ClaimMissing", "create web-1#1"],
        ),
        (
            "claim above replicas that never had a pod",
            with_claims(web(2), 5..6, 0..0),
            vec!["create web-5#1"],
        ),
        ("ordinals.start", start, vec!["create web-7#1"]),
        ("claim already terminating", terminating, vec![]),
        ("hole below replicas", hole, vec![]),
        (
            "claim of another set",
            conflict,
            vec!["warn ClaimOwnershipConflict"],
        ),
        (
            "whenScaled: Delete",
            when_scaled,
            vec!["warn RetentionPolicyConflict"],
        ),
        (
            "whenScaled: Delete, claim already being deleted",
            when_scaled_deleting,
            vec!["warn RetentionPolicyConflict"],
        ),
        ("foreign pod", foreign, vec!["warn ForeignPod"]),
    ];
    for (name, o, want) in cases {
        assert_eq!(plan(&o), want, "{name}");
    }
}

#[test]
fn created_pod_mounts_the_ordinals_claims() {
    let mut o = with_claims(web(1), 0..2, 0..1);
    o.set.claim_templates = vec!["data".into(), "logs".into()];
    let p = decide(&o, &Policy::default());
    let pod = created_pods(&p)[0];
    assert_eq!(pod["metadata"]["name"], "web-1");
    assert_eq!(pod["metadata"]["labels"]["scaledown-pod"], "web-1");
    assert_eq!(
        pod["metadata"]["annotations"][naming::OWNER_ANNOTATION],
        "web"
    );
    assert_eq!(
        pod["metadata"]["annotations"][naming::CLAIMS_ANNOTATION],
        r#"{"data-web-1":"uid-data-1"}"#
    );
    assert_eq!(
        pod["spec"]["volumes"],
        serde_json::json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}},
            {"name": "logs", "emptyDir": {}},
        ])
    );
    assert!(pod["metadata"].get("ownerReferences").is_none());
}

#[test]
fn template_errors_warn_and_create_nothing() {
    let cases = [
        ("{oops", "CleanupTemplateInvalid"),
        (
            r#"{"spec":{"restartPolicy":"Always","containers":[{"name":"m","image":"x"}]}}"#,
            "CleanupTemplateRestartPolicy",
        ),
        (
            r#"{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"m","image":"x"}]}}"#,
            "CleanupTemplateSelectorOverlap",
        ),
        (
            r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#,
            "CleanupTemplateVolumeClash",
        ),
    ];
    for (raw, reason) in cases {
        let mut o = with_claims(web(2), 0..3, 0..2);
        o.set.template = Some(raw.into());
        o.set.finalizers.clear();
        assert_eq!(
            plan(&o),
            ["finalizer+".to_string(), format!("warn {reason}")],
            "{raw}"
        );
    }
}

#[test]
fn ordered_sets_clean_one_ordinal_at_a_time() {
    let base = with_claims(web(1), 0..4, 0..1);
    let mut running = base.clone();
    set_pod(&mut running, 3, cleanup(3, Phase::Running, 1));
    assert_eq!(
        plan(&running),
        Vec::<String>::new(),
        "no second cleanup while one runs"
    );

    let mut succeeded = base.clone();
    set_pod(&mut succeeded, 3, cleanup(3, Phase::Succeeded, 1));
    assert_eq!(
        plan(&succeeded),
        [
            "event CleanupSuccess",
            "delete-claim data-web-3 uid-data-3",
            "delete-cleanup web-3 Completed"
        ]
    );

    let mut next = base.clone();
    next.ordinals.remove(&3);
    assert_eq!(plan(&next), ["create web-2#1"]);

    let mut gave_up = base.clone();
    set_pod(&mut gave_up, 3, cleanup(3, Phase::Failed, 3));
    assert_eq!(
        plan(&gave_up),
        ["warn CleanupGaveUp"],
        "a given-up ordinal holds the lower ones back"
    );

    let mut waiting_for_pod = base;
    set_pod(
        &mut waiting_for_pod,
        3,
        PodFacts {
            deleting: true,
            ..stateful(3)
        },
    );
    assert_eq!(
        plan(&waiting_for_pod),
        Vec::<String>::new(),
        "highest first: wait for pod 3 to go"
    );
}

#[test]
fn completion_table() {
    let policy = Policy::default();
    let succeeded = |o: Observed| {
        let mut o = o;
        set_pod(&mut o, 2, cleanup(2, Phase::Succeeded, 1));
        o
    };
    let mut gone = succeeded(with_claims(web(2), 0..2, 0..2));
    gone.ordinals.entry(2).or_default();
    let mut terminating = succeeded(with_claims(web(2), 0..3, 0..2));
    terminating.ordinals.entry(2).or_default().claims[0].deleting = true;
    let mut replaced = succeeded(with_claims(web(2), 0..3, 0..2));
    replaced.ordinals.entry(2).or_default().claims[0].uid = "uid-new".into();
    let scaled_up = succeeded(with_claims(web(3), 0..3, 0..2));
    let mut two_templates = succeeded(with_claims(web(2), 0..3, 0..2));
    two_templates.set.claim_templates.push("logs".into());
    if let Some(PodFacts {
        role: PodRole::Cleanup(c),
        ..
    }) = two_templates.ordinals.entry(2).or_default().pod.as_mut()
    {
        c.claims.insert("logs-web-2".into(), "uid-logs-2".into());
    }
    let mut in_use = succeeded(with_claims(web(2), 0..3, 0..2));
    in_use.ordinals.entry(2).or_default().claims[0].used_by = vec!["debug-pod".into()];
    let mut record_names_other_claim = succeeded(with_claims(web(2), 0..3, 0..2));
    if let Some(PodFacts {
        role: PodRole::Cleanup(c),
        ..
    }) = record_names_other_claim
        .ordinals
        .entry(2)
        .or_default()
        .pod
        .as_mut()
    {
        c.claims = [("data-web-0".to_string(), "uid-data-0".to_string())].into();
    }

    let cases: Vec<(&str, Observed, Vec<&str>)> = vec![
        (
            "succeeded",
            succeeded(with_claims(web(2), 0..3, 0..2)),
            vec![
                "event CleanupSuccess",
                "delete-claim data-web-2 uid-data-2",
                "delete-cleanup web-2 Completed",
            ],
        ),
        (
            "claims already gone (crash after deleting them)",
            gone,
            vec!["event CleanupSuccess", "delete-cleanup web-2 Completed"],
        ),
        (
            "claims terminating",
            terminating,
            vec!["event CleanupSuccess", "delete-cleanup web-2 Completed"],
        ),
        (
            "a new claim with the same name is never deleted",
            replaced,
            vec!["event CleanupSuccess", "delete-cleanup web-2 Completed"],
        ),
        (
            "two templates, one claim missing: the other is still deleted",
            two_templates,
            vec![
                "event CleanupSuccess",
                "delete-claim data-web-2 uid-data-2",
                "delete-cleanup web-2 Completed",
            ],
        ),
        (
            "scaled up during cleanup: the claims are kept, the name lock goes",
            scaled_up,
            vec![
                "warn ScaledUpDuringCleanup",
                "delete-cleanup web-2 ScaledUp",
            ],
        ),
        (
            "a claim mounted by another pod waits, and so does the pod",
            in_use,
            vec!["warn ClaimInUse"],
        ),
        (
            "only claims of the pod's own ordinal are ever deleted",
            record_names_other_claim,
            vec!["event CleanupSuccess", "delete-cleanup web-2 Completed"],
        ),
    ];
    for (name, o, want) in cases {
        assert_eq!(summary(&decide(&o, &policy)), want, "{name}");
    }
}

#[test]
fn failures_retry_with_backoff_then_give_up() {
    let policy = Policy {
        backoff_base: Duration::from_secs(10),
        ..Policy::default()
    };
    let failed = |attempt: u32, seconds_later: i64| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        set_pod(&mut o, 2, cleanup(2, Phase::Failed, attempt));
        o.now = t0()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds_later))
            .expect("time");
        o
    };

    let waiting = decide(&failed(1, 3), &policy);
    assert_eq!(summary(&waiting), ["warn CleanupFailed"]);
    assert_eq!(waiting.requeue_after, Some(Duration::from_secs(7)));

    let retry = decide(&failed(1, 10), &policy);
    assert_eq!(
        summary(&retry),
        [
            "warn CleanupFailed",
            "mark data-web-2 Some(2)",
            "delete-cleanup web-2 Retry"
        ]
    );

    let second = decide(&failed(2, 19), &policy);
    assert_eq!(
        second.requeue_after,
        Some(Duration::from_secs(1)),
        "second backoff is 20 s"
    );

    assert_eq!(
        summary(&decide(&failed(3, 1000), &policy)),
        ["warn CleanupGaveUp"]
    );

    let mut marked = with_claims(web(2), 0..3, 0..2);
    marked.ordinals.entry(2).or_default().claims[0].next_attempt = Some(2);
    assert_eq!(
        summary(&decide(&marked, &policy)),
        ["create web-2#2"],
        "the mark survives a restart"
    );

    let mut running_marked = marked.clone();
    set_pod(&mut running_marked, 2, cleanup(2, Phase::Running, 2));
    assert_eq!(
        summary(&decide(&running_marked, &policy)),
        ["mark data-web-2 None"],
        "stale mark cleared"
    );

    let mut wanted_again = failed(1, 1000);
    wanted_again.set.replicas = 3;
    assert_eq!(
        summary(&decide(&wanted_again, &policy)),
        ["warn CleanupFailed"],
        "no retry once the ordinal is wanted"
    );

    let deleted_by_user = with_claims(web(2), 0..3, 0..2);
    assert_eq!(
        summary(&decide(&deleted_by_user, &policy)),
        ["create web-2#1"],
        "a deleted cleanup pod is recreated"
    );
}

#[test]
fn concurrency_cap_counts_cleanups_everywhere() {
    let mut o = with_claims(web(2), 0..5, 0..2);
    o.set.parallel = true;
    o.cleanups_in_flight = 1;
    let capped = Policy {
        max_in_flight: Some(2),
        ..Policy::default()
    };
    assert_eq!(summary(&decide(&o, &capped)), ["create web-4#1"]);
    o.cleanups_in_flight = 2;
    let held = decide(&o, &capped);
    assert_eq!(summary(&held), Vec::<String>::new());
    // Held back: woken when room frees up (no event of this set tells when), not polled.
    assert_eq!((held.requeue_after, held.waits_for_room), (None, true));
    assert!(!decide(&o, &Policy::default()).waits_for_room);
}

#[test]
fn deletion_table() {
    let deleting = |o: Observed, finalizers: &[&str]| {
        let mut o = o;
        o.set.deleting = true;
        o.set.finalizers = finalizers.iter().map(|f| f.to_string()).collect();
        o
    };
    let marked = |o: Observed, p: Propagation| {
        let mut o = o;
        o.set.deletion_mark = Some(mark_value(p, &o.set.uid));
        o
    };
    let ours = naming::FINALIZER;
    let mut copied_mark = deleting(with_claims(web(3), 0..3, 0..0), &[ours]);
    copied_mark.set.deletion_mark = Some(mark_value(Propagation::Background, "uid-old"));
    let mut fg_pods_going = deleting(
        with_claims(web(3), 0..3, 0..3),
        &["foregroundDeletion", ours],
    );
    for f in fg_pods_going.ordinals.values_mut() {
        if let Some(p) = f.pod.as_mut() {
            p.deleting = true;
        }
    }
    let mut bg_parallel = deleting(with_claims(web(3), 0..3, 0..3), &[ours]);
    bg_parallel.set.parallel = true;
    let mut bg_one_going = marked(
        deleting(with_claims(web(3), 0..3, 0..3), &[ours]),
        Propagation::Background,
    );
    if let Some(p) = bg_one_going.ordinals.entry(2).or_default().pod.as_mut() {
        p.deleting = true;
    }
    let mut orphaned_pods = deleting(with_claims(web(3), 0..3, 0..3), &[ours]);
    for f in orphaned_pods.ordinals.values_mut() {
        if let Some(p) = f.pod.as_mut() {
            p.role = PodRole::Foreign;
        }
    }
    let mut orphan_running = deleting(with_claims(web(3), 0..3, 0..2), &["orphan", ours]);
    set_pod(&mut orphan_running, 2, cleanup(2, Phase::Running, 1));
    let mut cleanup_running = marked(
        deleting(with_claims(web(3), 0..3, 0..0), &[ours]),
        Propagation::Background,
    );
    cleanup_running.ordinals.remove(&0);
    cleanup_running.ordinals.remove(&1);
    set_pod(&mut cleanup_running, 2, cleanup(2, Phase::Running, 1));
    let mut when_deleted = deleting(with_claims(web(3), 0..3, 0..0), &[ours]);
    when_deleted.set.when_deleted_delete = true;
    let mut annotation_removed = with_claims(web(3), 0..3, 0..3);
    annotation_removed.set.template = None;
    let mut annotation_removed_running = with_claims(web(2), 0..3, 0..2);
    annotation_removed_running.set.template = None;
    set_pod(
        &mut annotation_removed_running,
        2,
        cleanup(2, Phase::Running, 1),
    );

    let cases: Vec<(&str, Observed, Vec<&str>)> = vec![
        (
            "foreground: wait for the GC to delete the pods (and mark it)",
            fg_pods_going,
            vec!["mark-deletion Foreground"],
        ),
        (
            "foreground: pods gone, clean highest first",
            deleting(
                with_claims(web(3), 0..3, 0..0),
                &["foregroundDeletion", ours],
            ),
            vec!["mark-deletion Foreground", "create web-2#1"],
        ),
        (
            "background: marked first, then we delete the highest pod",
            deleting(with_claims(web(3), 0..3, 0..3), &[ours]),
            vec!["mark-deletion Background", "delete-stateful web-2"],
        ),
        ("background: one pod at a time", bg_one_going, vec![]),
        (
            "foreground, GC done: the mark tells",
            marked(
                deleting(with_claims(web(3), 0..3, 0..0), &[ours]),
                Propagation::Foreground,
            ),
            vec!["create web-2#1"],
        ),
        (
            "background, pods gone: the mark tells",
            marked(
                deleting(with_claims(web(3), 0..3, 0..0), &[ours]),
                Propagation::Background,
            ),
            vec!["create web-2#1"],
        ),
        (
            "no pods, no finalizer, no mark: claims kept as after an orphan deletion",
            deleting(with_claims(web(3), 0..3, 0..0), &[ours]),
            vec!["warn DeletionUnproven", "finalizer- []"],
        ),
        (
            "a mark copied from another set proves nothing",
            copied_mark,
            vec!["warn DeletionUnproven", "finalizer- []"],
        ),
        (
            "nothing proves the deletion: ordinals past replicas are cleaned as after a scale-down",
            deleting(with_claims(web(1), 0..3, 0..0), &[ours]),
            vec!["warn DeletionUnproven", "create web-2#1"],
        ),
        (
            "nothing proves the deletion of a set scaled to zero: it is cleaned",
            deleting(with_claims(web(0), 0..2, 0..0), &[ours]),
            vec!["create web-1#1"],
        ),
        (
            "background, Parallel: all pods",
            bg_parallel,
            vec![
                "mark-deletion Background",
                "delete-stateful web-2",
                "delete-stateful web-1",
                "delete-stateful web-0",
            ],
        ),
        (
            "orphan: finalizer released, nothing cleaned",
            deleting(with_claims(web(3), 0..3, 0..3), &["orphan", ours]),
            vec!["event OrphanDeletion", "finalizer- [\"orphan\"]"],
        ),
        (
            "orphan seen after the GC dropped its finalizer",
            orphaned_pods,
            vec!["event OrphanDeletion", "finalizer- []"],
        ),
        (
            "orphan: a running cleanup finishes first",
            orphan_running,
            vec!["event OrphanDeletion"],
        ),
        (
            "a running cleanup holds the finalizer",
            cleanup_running,
            vec![],
        ),
        (
            "claims left hold the finalizer",
            deleting(with_claims(web(3), 0..3, 0..1), &[ours]),
            vec![
                "mark-deletion Background",
                "create web-2#1",
                "delete-stateful web-0",
            ],
        ),
        (
            "all cleaned: finalizer released",
            deleting(with_claims(web(3), 0..0, 0..0), &["x", ours]),
            vec!["finalizer- [\"x\"]"],
        ),
        (
            "whenDeleted: Delete",
            when_deleted,
            vec!["warn RetentionPolicyConflict", "finalizer- []"],
        ),
        (
            "annotation removed",
            annotation_removed,
            vec!["finalizer- []"],
        ),
        (
            "annotation removed while a cleanup runs",
            annotation_removed_running,
            vec![],
        ),
    ];
    for (name, o, want) in cases {
        assert_eq!(plan(&o), want, "{name}");
    }
}

#[test]
fn cached_reads_ask_for_a_live_read_before_deleting_or_releasing() {
    let cached = |mut o: Observed| {
        o.read = SetRead::Cached;
        o
    };
    let policy = Policy::default();
    let creation = decide(&cached(with_claims(web(2), 0..3, 0..2)), &policy);
    assert_eq!(
        summary(&creation),
        ["create web-2#1"],
        "creations are confirmed after the create"
    );
    assert_eq!(creation.confirm, None);

    let mut succeeded = with_claims(web(2), 0..3, 0..2);
    set_pod(&mut succeeded, 2, cleanup(2, Phase::Succeeded, 1));
    let p = decide(&cached(succeeded.clone()), &policy);
    assert_eq!(
        (summary(&p), p.confirm),
        (vec![], Some(Confirm::SetAndNamespace)),
        "deleting claims: the set and the pods that may mount them are read live"
    );
    succeeded.read = SetRead::LiveSet;
    assert_eq!(
        decide(&succeeded, &policy).confirm,
        Some(Confirm::SetAndNamespace),
        "a live set alone is not enough: a pod the cache misses may mount the claim"
    );
    succeeded.read = SetRead::LiveAll;
    assert!(
        summary(&decide(&succeeded, &policy))
            .contains(&"delete-claim data-web-2 uid-data-2".to_string())
    );

    let mut release = with_claims(web(3), 0..0, 0..0);
    release.set.deleting = true;
    let p = decide(&cached(release.clone()), &policy);
    assert_eq!(
        (summary(&p), p.confirm),
        (vec![], Some(Confirm::SetAndNamespace))
    );
    release.read = SetRead::LiveSet;
    let p = decide(&release, &policy);
    assert_eq!(
        p.confirm,
        Some(Confirm::SetAndNamespace),
        "the namespace must be read live too"
    );
    assert!(p.steps.is_empty());

    let steady = decide(&cached(with_claims(web(3), 0..3, 0..3)), &policy);
    assert_eq!((steady.steps.len(), steady.confirm), (0, None));

    // A deletion nothing proves: a cache that misses our mark must not warn or release.
    let mut unproven = with_claims(web(3), 0..3, 0..0);
    unproven.set.deleting = true;
    let p = decide(&cached(unproven), &policy);
    assert_eq!(
        (summary(&p), p.confirm),
        (vec![], Some(Confirm::SetAndNamespace))
    );

    // Foreground is marked from any read (the finalizer cannot come back); background only from
    // a live one (a lagging pod cache still shows pods the GC has orphaned).
    let mut foreground = with_claims(web(3), 0..3, 0..3);
    foreground.set.deleting = true;
    foreground
        .set
        .finalizers
        .push(naming::FOREGROUND_FINALIZER.into());
    let p = decide(&cached(foreground), &policy);
    assert_eq!(
        (summary(&p), p.confirm),
        (vec!["mark-deletion Foreground".to_string()], None)
    );
    let mut background = with_claims(web(3), 0..3, 0..3);
    background.set.deleting = true;
    let p = decide(&cached(background), &policy);
    assert_eq!(
        (summary(&p), p.confirm),
        (vec![], Some(Confirm::SetAndNamespace))
    );
}

#[test]
fn look_alikes_are_never_cleanups() {
    let forged = |gated: bool, replicas: u32| {
        let mut o = with_claims(web(replicas), 0..3, 0..2);
        set_pod(
            &mut o,
            2,
            PodFacts {
                name: "web-2".into(),
                uid: "uid-forged".into(),
                deleting: false,
                role: PodRole::Unproven {
                    gated,
                    created: None,
                },
            },
        );
        o
    };
    assert_eq!(plan(&forged(false, 2)), ["warn UnprovenCleanupPod"]);
    assert_eq!(
        plan(&forged(true, 2)),
        ["warn UnprovenCleanupPod", "delete-cleanup web-2 NeverRan"]
    );
    assert_eq!(
        plan(&forged(false, 3)),
        ["warn UnprovenCleanupPod"],
        "wanted ordinal"
    );
    let mut cached = forged(false, 2);
    cached.read = SetRead::Cached;
    assert_eq!(
        decide(&cached, &Policy::default()).confirm,
        Some(Confirm::Set)
    );
}

#[test]
fn recorded_but_gated_pods_are_released_or_cancelled_on_a_live_read() {
    let gated = |replicas: u32| {
        let mut o = with_claims(web(replicas), 0..3, 0..2);
        let mut pod = cleanup(2, Phase::Pending, 1);
        if let PodRole::Cleanup(c) = &mut pod.role {
            c.gated = true;
            c.scheduled = false;
        }
        set_pod(&mut o, 2, pod);
        o
    };
    assert_eq!(plan(&gated(2)), ["release web-2"]);
    assert_eq!(
        plan(&gated(3)),
        ["event CleanupCancelled", "delete-cleanup web-2 NeverRan"]
    );
}

/// Found by `make chaos` (seed 20261128): after a failover the new leader's claim cache still
/// showed the claim of a cleanup the old leader had just finished, so it created and released a
/// cleanup pod for it. That pod could never be scheduled, kept the ordinal's name and held the
/// finalizer of the set, which was being deleted, forever. A cleanup pod that has not started and
/// whose recorded claims are gone, replaced or being deleted is deleted, on a live list.
#[test]
fn a_cleanup_pod_that_has_not_started_goes_when_its_claims_are_gone() {
    let with_pod = |gated: bool, scheduled: bool, claim: Option<ClaimFacts>| {
        let mut o = with_claims(web(2), 0..2, 0..2);
        o.ordinals.entry(2).or_default().claims.extend(claim);
        let mut pod = cleanup(2, Phase::Pending, 1);
        if let PodRole::Cleanup(c) = &mut pod.role {
            c.gated = gated;
            c.scheduled = scheduled;
        }
        set_pod(&mut o, 2, pod);
        o
    };
    let cancelled = ["event CleanupCancelled", "delete-cleanup web-2 NeverRan"];
    let mut deleting = claim("data", 2);
    deleting.deleting = true;
    let mut replaced = claim("data", 2);
    replaced.uid = "uid-data-2-new".into();
    let mut rivals = claim("data", 2);
    rivals.not_ours = Some("it is also a claim of StatefulSet data-web".into());
    for (what, gated, scheduled, claim) in [
        ("gated, claim gone", true, false, None),
        (
            "gated, claim being deleted",
            true,
            false,
            Some(deleting.clone()),
        ),
        ("gated, claim replaced", true, false, Some(replaced.clone())),
        ("released, not scheduled, claim gone", false, false, None),
        (
            "released, not scheduled, claim replaced",
            false,
            false,
            Some(replaced),
        ),
    ] {
        let o = with_pod(gated, scheduled, claim);
        assert_eq!(plan(&o), cancelled, "{what}");
        let mut cached = o.clone();
        cached.read = SetRead::Cached;
        let asked = decide(&cached, &Policy::default());
        assert_eq!(
            (asked.steps.len(), asked.confirm),
            (0, Some(Confirm::SetAndNamespace)),
            "{what}: decided on a live list only"
        );
    }
    // Scheduled: it may have started its init containers; its claim going is not ours to judge.
    assert!(!plan(&with_pod(false, true, Some(deleting))).contains(&cancelled[1].to_string()));
    // Its claim another set's (on a live read): never released, the conflict is reported.
    assert_eq!(
        plan(&with_pod(true, false, Some(rivals))),
        [
            "warn ClaimOwnershipConflict",
            "event CleanupCancelled",
            "delete-cleanup web-2 NeverRan"
        ]
    );
    // Its claim there: released as before.
    assert_eq!(
        plan(&with_pod(true, false, Some(claim("data", 2)))),
        ["release web-2"]
    );
}

/// Issue 23: an ordinal whose claim a live read of the namespace found another set's gets its
/// cleanup pod only on such a read: from the caches (which may not show that set yet) the plan asks
/// for one instead of creating a pod that would be cancelled, created again, and so on.
#[test]
fn a_disputed_ordinal_is_created_for_only_on_a_live_read() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.disputed.insert(2);
    assert_eq!(plan(&o), ["create web-2#1"], "live, and now ours");
    o.read = SetRead::Cached;
    let asked = decide(&o, &Policy::default());
    assert_eq!(
        (summary(&asked), asked.confirm),
        (vec![], Some(Confirm::SetAndNamespace))
    );
    o.disputed.clear();
    assert_eq!(plan(&o), ["create web-2#1"], "cached, undisputed");
}

#[test]
fn recorded_pods_wait_for_the_statefulset_controller_before_they_run() {
    let gated = |status_replicas: u32, observed_generation: i64| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        o.set.status_replicas = status_replicas;
        o.set.observed_generation = observed_generation;
        let mut pod = cleanup(2, Phase::Pending, 1);
        if let PodRole::Cleanup(c) = &mut pod.role {
            c.gated = true;
            c.scheduled = false;
        }
        set_pod(&mut o, 2, pod);
        o
    };
    // Its pod cache still counts the condemned pod, or it has not acted on the scale-down yet.
    for (replicas, generation) in [(3, 3), (2, 2), (3, 2)] {
        let waiting = decide(&gated(replicas, generation), &Policy::default());
        assert_eq!(
            summary(&waiting),
            Vec::<String>::new(),
            "{replicas} {generation}"
        );
        // No poll: the set's status change brings the next pass, and no live read until then.
        assert_eq!((waiting.requeue_after, waiting.confirm), (None, None));
    }
    assert_eq!(plan(&gated(2, 3)), ["release web-2"]);
    assert_eq!(plan(&gated(1, 4)), ["release web-2"]);
    // From the cache: waiting costs no request; caught up, a live read of the set and of its
    // namespace (another set the cache does not show yet may want the claims).
    let cached = |mut o: Observed| {
        o.read = SetRead::Cached;
        decide(&o, &Policy::default())
    };
    let waiting = cached(gated(3, 3));
    assert_eq!((waiting.steps.len(), waiting.confirm), (0, None));
    let ready = cached(gated(2, 3));
    assert_eq!(
        (ready.steps.len(), ready.confirm),
        (0, Some(Confirm::SetAndNamespace))
    );
    let mut deleting = gated(3, 2);
    deleting.set.deleting = true;
    assert!(
        may_release(&deleting.set),
        "the garbage collector deletes by UID"
    );
}

#[test]
fn a_fresh_gated_look_alike_holds_its_ordinal_for_its_writer() {
    let look_alike = |age_secs: u64| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        o.now = t0() + Duration::from_secs(age_secs);
        set_pod(
            &mut o,
            2,
            PodFacts {
                name: "web-2".into(),
                uid: "uid-other-writer".into(),
                deleting: false,
                role: PodRole::Unproven {
                    gated: true,
                    created: Some(t0()),
                },
            },
        );
        o
    };
    let fresh = decide(&look_alike(5), &Policy::default());
    assert_eq!(
        summary(&fresh),
        Vec::<String>::new(),
        "neither deleted nor created again"
    );
    assert_eq!(
        fresh.requeue_after,
        Some(RECORD_GRACE - Duration::from_secs(5))
    );
    assert_eq!(
        plan(&look_alike(RECORD_GRACE.as_secs())),
        ["warn UnprovenCleanupPod", "delete-cleanup web-2 NeverRan"]
    );
}

#[test]
fn confirm_created_runs_only_orphaned_ordinals_of_opted_in_sets() {
    let o = web(2);
    assert_eq!(confirm_created(&o.set, 2), Verdict::Run);
    assert!(matches!(confirm_created(&o.set, 1), Verdict::Cancel(_)));
    let mut opted_out = o.set.clone();
    opted_out.template = None;
    assert!(matches!(confirm_created(&opted_out, 2), Verdict::Cancel(_)));
    let mut deleting = o.set.clone();
    deleting.deleting = true;
    assert_eq!(confirm_created(&deleting, 0), Verdict::Run);
}

#[test]
fn stuck_pending_pods_are_reported_once_past_the_timeout() {
    let pending = |minutes: i64| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        let mut pod = cleanup(2, Phase::Pending, 1);
        if let PodRole::Cleanup(c) = &mut pod.role {
            c.created = Some(t0());
            c.scheduled = false;
        }
        set_pod(&mut o, 2, pod);
        o.now = t0()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(minutes))
            .expect("time");
        o
    };
    let early = decide(&pending(4), &Policy::default());
    assert_eq!(summary(&early), Vec::<String>::new());
    assert_eq!(early.requeue_after, Some(Duration::from_secs(360)));
    assert_eq!(plan(&pending(11)), ["warn CleanupPodStuck"]);
}

/// Issue 23: a condemned pod stuck Terminating (a dead node) holds its ordinal: past the pending
/// timeout it is reported, and the set's status says `Stalled` with the ordinal, instead of
/// waiting in silence. The controller never force-deletes it.
#[test]
fn a_pod_stuck_terminating_is_reported_past_the_timeout() {
    let terminating = |minutes: i64| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        let mut pod = stateful(2);
        pod.deleting = true;
        set_pod(&mut o, 2, pod);
        if let Some(f) = o.ordinals.get_mut(&2) {
            f.terminating_since = Some(t0());
        }
        o.now = t0()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_mins(minutes))
            .expect("time");
        o
    };
    let early = decide(&terminating(4), &Policy::default());
    assert_eq!(summary(&early), Vec::<String>::new());
    assert_eq!(early.requeue_after, Some(Duration::from_secs(360)));
    let late = terminating(11);
    let p = decide(&late, &Policy::default());
    assert_eq!(summary(&p), ["warn PodStuckTerminating"]);
    let line = status::line(&late, &p, &Default::default()).expect("a status");
    assert_eq!(
        line.reason.as_deref(),
        Some(
            "PodStuckTerminating: ordinal 2 held by a pod Terminating past --cleanup-pending-timeout"
        )
    );
    let mut wanted = terminating(11);
    wanted.set.replicas = 3;
    assert_eq!(
        summary(&decide(&wanted, &Policy::default())),
        Vec::<String>::new(),
        "a wanted ordinal is the StatefulSet controller's"
    );
}

#[test]
fn a_cleanup_container_restarted_by_the_kubelet_is_reported_and_its_claims_kept() {
    use crate::scaledown::observe::Restarts;
    let restarted = |phase: Phase, count: u32| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        let mut pod = cleanup(2, phase, 1);
        if let PodRole::Cleanup(c) = &mut pod.role {
            c.created = Some(t0());
            c.restarts = (count > 0).then(|| Restarts {
                count,
                container: "main".into(),
                reason: "Error".into(),
                exit_code: 3,
            });
        }
        set_pod(&mut o, 2, pod);
        o.now = t0();
        o
    };
    // Running (or Pending while an init container crash-loops): a Warning, no step on the claims.
    assert_eq!(plan(&restarted(Phase::Running, 2)), ["warn CleanupFailed"]);
    assert_eq!(plan(&restarted(Phase::Pending, 1)), ["warn CleanupFailed"]);
    assert_eq!(plan(&restarted(Phase::Running, 0)), Vec::<String>::new());
    let p = decide(&restarted(Phase::Running, 2), &Policy::default());
    let note = p
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Event(e) => Some(e.note.clone()),
            _ => None,
        })
        .expect("an event");
    assert!(
        note.contains("exit code 3") && note.contains("2 restart(s)") && note.contains("Never"),
        "{note}"
    );
}

#[test]
fn refused_creations_back_off_then_give_up() {
    let refused = |count: u32, seconds_later: i64| {
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
        o.now = t0()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds_later))
            .expect("time");
        o
    };
    let waiting = decide(&refused(1, 4), &Policy::default());
    assert_eq!(summary(&waiting), Vec::<String>::new());
    assert_eq!(waiting.requeue_after, Some(Duration::from_secs(6)));
    assert_eq!(plan(&refused(1, 10)), ["create web-2#1"]);
    assert_eq!(plan(&refused(3, 10_000)), ["warn CleanupGaveUp"]);
}

#[test]
fn next_records_keep_active_ordinals_and_add_new_ones() {
    let mut o = with_claims(web(1), 0..3, 0..1);
    let old = Record {
        pod: "old".into(),
        claims: BTreeMap::new(),
    };
    o.set.records = [(2, old.clone()), (7, old.clone())].into();
    let new = Record {
        pod: "new".into(),
        claims: BTreeMap::new(),
    };
    let records = next_records(&o.set, &o, &[(1, new.clone())]);
    assert_eq!(records, [(1, new), (2, old)].into());
}

/// Parallel set `web` at 1 replica: ordinal 4's cleanup succeeded, ordinal 3's failed (attempt 1)
/// at `failed_at`; the facts are read `secs` later.
fn two_finished_cleanups(failed_at: Timestamp, secs: i64) -> Observed {
    let mut o = with_claims(web(1), 0..6, 0..1);
    o.set.parallel = true;
    set_pod(&mut o, 4, cleanup(4, Phase::Succeeded, 1));
    let mut failed = cleanup(3, Phase::Failed, 1);
    if let PodRole::Cleanup(c) = &mut failed.role {
        c.failure = c.failure.take().map(|f| Failure {
            finished_at: Some(failed_at),
            ..f
        });
    }
    set_pod(&mut o, 3, failed);
    o.now = failed_at
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .expect("time");
    o
}

/// The plan is a function of the facts and of their clock `o.now` alone: the backoff of a failed
/// cleanup is counted on `o.now`, never on the machine's clock, so the same scenario a year before
/// or ten years after `t0` gives the same plan; and a decision leaves nothing behind for the next.
#[test]
fn the_plan_depends_on_the_facts_and_their_clock_only() {
    let policy = Policy::default();
    let year = k8s_openapi::jiff::SignedDuration::from_hours(24 * 365);
    let (before, after) = (t0().checked_sub(year), t0().checked_add(year * 10));
    let shifted = [before.expect("time"), after.expect("time")];

    let waiting = decide(&two_finished_cleanups(t0(), 4), &policy);
    assert_eq!(
        summary(&waiting),
        [
            "event CleanupSuccess",
            "delete-claim data-web-4 uid-data-4",
            "delete-cleanup web-4 Completed",
            "warn CleanupFailed",
            "create web-5#1",
            "create web-2#1",
            "create web-1#1"
        ]
    );
    assert_eq!(waiting.requeue_after, Some(Duration::from_secs(6)));
    let retrying = decide(&two_finished_cleanups(t0(), 10), &policy);
    assert_eq!(
        summary(&retrying)[3..6],
        [
            "warn CleanupFailed",
            "mark data-web-3 Some(2)",
            "delete-cleanup web-3 Retry"
        ],
        "the backoff ended at t0 + 10 s by the facts' clock"
    );
    for base in shifted {
        let _unrelated = decide(&with_claims(web(2), 0..4, 0..2), &policy);
        assert_eq!(
            decide(&two_finished_cleanups(base, 4), &policy),
            waiting,
            "at {base}"
        );
        assert_eq!(
            decide(&two_finished_cleanups(base, 10), &policy),
            retrying,
            "at {base}"
        );
    }
}

#[test]
fn backoff_doubles_and_caps() {
    let p = Policy {
        backoff_base: Duration::from_secs(10),
        backoff_max: Duration::from_secs(60),
        ..Policy::default()
    };
    let got: Vec<u64> = (1..=5).map(|a| p.backoff(a).as_secs()).collect();
    assert_eq!(got, [10, 20, 40, 60, 60]);
    assert_eq!(p.backoff(u32::MAX), Duration::from_secs(60));
}

#[test]
fn unused_ordinal_facts_are_harmless() {
    let mut o = web(2);
    o.ordinals.insert(9, OrdinalFacts::default());
    assert_eq!(plan(&o), Vec::<String>::new());
}

#[test]
fn a_paused_set_finishes_what_runs_and_starts_nothing() {
    let paused = |pod: Option<PodFacts>| {
        let mut o = with_claims(web(1), 0..3, 0..1);
        o.set.paused = true;
        if let Some(pod) = pod {
            set_pod(&mut o, 2, pod);
        }
        o
    };
    let mut gated = cleanup(2, Phase::Pending, 1);
    if let PodRole::Cleanup(c) = &mut gated.role {
        c.gated = true;
    }
    let cases: Vec<(&str, Observed, Vec<&str>)> = vec![
        ("no cleanup pod is created", paused(None), vec![]),
        (
            "a running cleanup that succeeded still deletes its claims",
            paused(Some(cleanup(2, Phase::Succeeded, 1))),
            vec![
                "event CleanupSuccess",
                "delete-claim data-web-2 uid-data-2",
                "delete-cleanup web-2 Completed",
            ],
        ),
        (
            "a failed one is not retried (kept until the resume)",
            paused(Some(cleanup(2, Phase::Failed, 1))),
            vec!["warn CleanupFailed"],
        ),
        (
            "a recorded pod still gated is not released",
            paused(Some(gated.clone())),
            vec![],
        ),
    ];
    for (what, o, expected) in cases {
        assert_eq!(plan(&o), expected, "{what}");
    }
    let mut scaled_up = paused(Some(gated));
    scaled_up.set.replicas = 3;
    assert_eq!(
        plan(&scaled_up),
        ["event CleanupCancelled", "delete-cleanup web-2 NeverRan"],
        "a scale-up while paused gets its name back; the claims are untouched"
    );
    let mut deleted = paused(None);
    deleted.set.deleting = true;
    assert!(
        !plan(&deleted)
            .iter()
            .any(|s| s.starts_with("finalizer-") || s.starts_with("create")),
        "deleted while paused: the finalizer stays, nothing is cleaned until the resume"
    );
}

/// The scheduling fields of a set on a tainted pool, as observe makes them.
fn pool_scheduling() -> serde_json::Map<String, serde_json::Value> {
    let spec = serde_json::json!({
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "db"}
    });
    spec.as_object().cloned().unwrap_or_default()
}

/// The annotation, or without one the flag, decides whether the cleanup pod gets the set's
/// scheduling fields; an unknown value gets nothing and one Warning.
#[test]
fn cleanup_pods_inherit_the_sets_scheduling_when_asked() {
    let create = "create web-2#1";
    let warn = "warn CleanupInheritInvalid";
    let cases: &[(Option<&str>, bool, bool, &[&str])] = &[
        // annotation, --inherit-scheduling, inherits, plan
        (None, false, false, &[create]),
        (None, true, true, &[create]),
        (Some("scheduling"), false, true, &[create]),
        (Some("scheduling"), true, true, &[create]),
        (Some("none"), true, false, &[create]),
        (Some("none"), false, false, &[create]),
        (Some("Scheduling"), true, false, &[warn, create]),
        (Some("all"), false, false, &[warn, create]),
    ];
    for (annotation, flag, inherits, want) in cases {
        let mut o = with_claims(web(2), 0..3, 0..2);
        o.set.inherit = annotation.map(String::from);
        o.set.scheduling = pool_scheduling();
        let policy = Policy {
            inherit_scheduling: *flag,
            ..Policy::default()
        };
        let p = decide(&o, &policy);
        let case = format!("annotation {annotation:?}, flag {flag}");
        assert_eq!(summary(&p), *want, "{case}");
        let pods = created_pods(&p);
        let spec = &pods[0]["spec"];
        assert_eq!(
            spec.get("tolerations").is_some() && spec.get("nodeSelector").is_some(),
            *inherits,
            "{case}: {spec}"
        );
        if *inherits {
            assert_eq!(spec["nodeSelector"], serde_json::json!({"pool": "db"}));
        }
        assert_eq!(decide(&o, &policy), p, "{case}: deterministic");
    }
}

/// Only a set that takes part is told about its inherit annotation.
#[test]
fn an_unknown_inherit_value_is_reported_only_for_sets_that_take_part() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.set.template = None;
    o.set.finalizers.clear();
    o.set.inherit = Some("bogus".into());
    assert_eq!(plan(&o), Vec::<String>::new());
    o.set.template = Some(TEMPLATE.into());
    let p = decide(&o, &Policy::default());
    let Some(Step::Event(e)) = p.steps.get(1) else {
        panic!("an Event after the finalizer: {:?}", summary(&p));
    };
    assert_eq!(e.reason, Reason::CleanupInheritInvalid);
    assert_eq!(e.key, "inherit \"bogus\"", "one series per value");
    assert!(e.note.contains(naming::INHERIT_ANNOTATION), "{}", e.note);
}

/// The cleanup template's own scheduling fields win over the set's.
#[test]
fn the_cleanup_templates_own_fields_win() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.set.template = Some(
        r#"{"metadata":{"labels":{"app":"web-cleanup"}},
  "spec":{"nodeSelector":{"pool":"cleanup"},"containers":[{"name":"main","image":"busybox"}]}}"#
            .into(),
    );
    o.set.inherit = Some("scheduling".into());
    o.set.scheduling = pool_scheduling();
    let p = decide(&o, &Policy::default());
    let spec = &created_pods(&p)[0]["spec"];
    assert_eq!(spec["nodeSelector"], serde_json::json!({"pool": "cleanup"}));
    assert_eq!(spec["tolerations"], o.set.scheduling["tolerations"]);
}

/// A set whose fields make the cleanup pod too large gets a Warning and no pod, not a create the
/// API server would refuse on every pass.
#[test]
fn inherited_fields_over_the_size_limit_are_a_warning_and_no_pod() {
    let mut o = with_claims(web(2), 0..3, 0..2);
    o.set.inherit = Some("scheduling".into());
    let big = "v".repeat(crate::template::MAX_POD_BYTES);
    o.set.scheduling = serde_json::json!({"nodeSelector": {"big": big}})
        .as_object()
        .cloned()
        .unwrap_or_default();
    let p = decide(&o, &Policy::default());
    assert_eq!(summary(&p), ["warn CleanupTemplateTooLarge"]);
    let Some(Step::Event(e)) = p.steps.first() else {
        panic!("an Event");
    };
    assert!(e.note.contains("scheduling fields"), "{}", e.note);
    o.set.inherit = Some("none".into());
    assert_eq!(
        plan(&o),
        ["create web-2#1"],
        "opting out lets the pod through"
    );
}

/// The Events of a failed cleanup carry what its container said (its termination message).
#[test]
fn failure_events_carry_the_termination_message() {
    let note_of = |attempt: u32| {
        let mut o = with_claims(web(2), 0..3, 0..2);
        let mut pod = cleanup(2, Phase::Failed, attempt);
        if let PodRole::Cleanup(c) = &mut pod.role
            && let Some(f) = c.failure.as_mut()
        {
            f.message = Some("166 of 346 keys left: NOREPLICAS".into());
        }
        set_pod(&mut o, 2, pod);
        let p = decide(&o, &Policy::default());
        p.steps
            .iter()
            .find_map(|s| match s {
                Step::Event(e) => Some((e.reason, e.note.clone())),
                _ => None,
            })
            .expect("an event")
    };
    let (reason, note) = note_of(1);
    assert_eq!(reason, Reason::CleanupFailed);
    assert!(
        note.contains("exit code 1 (166 of 346 keys left: NOREPLICAS); retrying"),
        "{note}"
    );
    let (reason, note) = note_of(3);
    assert_eq!(reason, Reason::CleanupGaveUp);
    assert!(
        note.contains("exit code 1 (166 of 346 keys left: NOREPLICAS); giving up"),
        "{note}"
    );
}
