//! The requests `act` sends, and what it makes of the answers, against a scripted API server
//! (`crate::mock_api`): idempotence (409 on create, 404/409 on delete are done), UID preconditions,
//! refusals as Warning Events rather than errors, and the record's compare-and-swap.

use serde_json::{Value, json};

use super::*;
use crate::error::Category;
use crate::mock_api::{self, Answer, Log, Sent};
use crate::scaledown::observe::format_records;
use k8s_openapi::api::apps::v1::StatefulSet;

const NS_PODS: &str = "/api/v1/namespaces/ns/pods";
const NS_CLAIMS: &str = "/api/v1/namespaces/ns/persistentvolumeclaims";
const SET_PATH: &str = "/apis/apps/v1/namespaces/ns/statefulsets/web";

fn web(record: Option<&str>) -> SetFacts {
    let mut annotations = json!({naming::TEMPLATE_ANNOTATION: "{}"});
    if let Some(r) = record {
        annotations[naming::RECORD_ANNOTATION] = json!(r);
    }
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "generation": 4,
                     "resourceVersion": "7", "annotations": annotations},
        "spec": {"replicas": 1, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    }))
    .expect("statefulset");
    crate::scaledown::observe::set_facts(&set)
}

fn actor(client: kube::Client, leadership: Leadership) -> (Actor, Arc<Metrics>) {
    actor_with(client, leadership, false)
}

fn actor_with(
    client: kube::Client,
    leadership: Leadership,
    dry_run: bool,
) -> (Actor, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let (reporter, _) = crate::pass::test_parts::<StatefulSet>(
        crate::naming::Controller::Scaledown,
        &client,
        &metrics,
        dry_run,
    );
    let actor = Actor::new(client, reporter, metrics.clone(), Arc::new(leadership));
    (actor, metrics)
}

/// Runs `steps` on set `web` against a server answering with `answer`.
async fn run<F>(steps: Vec<Step>, answer: F) -> (Result<()>, Done, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let (actor, _) = actor(client, Leadership::always());
    let mut done = Done::default();
    let plan = Plan {
        steps,
        ..Plan::default()
    };
    let result = actor.execute(&web(None), &plan, &mut done).await;
    actor.report(&web(None), &done).await;
    (result, done, log)
}

fn cleanup_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-1", "namespace": "ns"},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
}

fn create_step() -> Step {
    Step::CreateCleanupPod {
        ordinal: 1,
        attempt: 1,
        pod: cleanup_pod(),
        claims: [("data-web-1".to_string(), "uid-claim".to_string())].into(),
    }
}

fn category(result: &Result<()>) -> Option<Category> {
    result.as_ref().err().map(Error::category)
}

fn warnings(log: &Log) -> Vec<String> {
    log.events()
        .into_iter()
        .filter(|(kind, _, _)| kind == "Warning")
        .map(|(_, reason, note)| format!("{reason}: {note}"))
        .collect()
}

#[tokio::test]
async fn a_create_is_sent_once_as_planned_and_409_means_done() {
    let (result, done, log) = run(vec![create_step()], |_| {
        let mut pod = cleanup_pod();
        pod["metadata"]["uid"] = json!("uid-new");
        (201, pod)
    })
    .await;
    assert!(result.is_ok());
    let sent = log.writes_and_reads();
    assert_eq!(log.lines(), [format!("POST {NS_PODS}")]);
    assert_eq!(sent[0].body, cleanup_pod(), "the template's pod, unchanged");
    assert!(
        sent[0]
            .query
            .contains("fieldManager=statefulset-scaledown-controller")
    );
    assert_eq!(done.created.len(), 1);
    assert_eq!(done.created[0].uid, "uid-new");
    assert_eq!(done.created[0].claims["data-web-1"], "uid-claim");

    let (result, done, log) = run(vec![create_step()], |_| {
        mock_api::status(409, "AlreadyExists", "pods \"web-1\" already exists")
    })
    .await;
    assert!(result.is_ok(), "409 on create is done, not an error");
    assert!(done.created.is_empty() && done.refused.is_empty());
    assert_eq!(log.lines().len(), 1, "no retry");
    assert!(warnings(&log).is_empty());
}

#[tokio::test]
async fn refused_creations_are_warnings_not_errors() {
    let table = [
        (400, "BadRequest"),
        (403, "Forbidden"),
        (413, "RequestEntityTooLarge"),
        (422, "Invalid"),
        (500, "InternalError"),
    ];
    for (code, reason) in table {
        let (result, done, log) = run(vec![create_step()], move |_| {
            mock_api::status(code, reason, "refused by the test")
        })
        .await;
        assert!(result.is_ok(), "{code}: a refusal is not a reconcile error");
        assert_eq!(
            done.refused,
            [Refusal {
                ordinal: 1,
                code,
                message: "refused by the test".into()
            }],
            "{code}"
        );
        let warnings = warnings(&log);
        assert_eq!(warnings.len(), 1, "{code}: {warnings:?}");
        assert!(
            warnings[0].starts_with("CleanupPodRejected: ")
                && warnings[0].contains(&format!("({code})"))
                && warnings[0].contains("refused by the test"),
            "{warnings:?}"
        );
        assert_eq!(log.lines().len(), 1, "{code}: no retry within the pass");
    }
}

#[tokio::test]
async fn transient_create_failures_are_errors_for_the_backoff() {
    for (code, reason, want) in [
        (503, "ServiceUnavailable", Category::ServerError),
        (429, "TooManyRequests", Category::Throttled),
    ] {
        let (result, done, log) = run(vec![create_step()], move |_| {
            mock_api::status(code, reason, "later")
        })
        .await;
        assert_eq!(category(&result), Some(want), "{code}");
        assert!(done.refused.is_empty() && done.created.is_empty());
        assert!(
            warnings(&log).is_empty(),
            "{code}: not reported as a refusal"
        );
    }
}

fn deletes() -> Vec<(Step, String)> {
    vec![
        (
            Step::DeleteClaim {
                name: "data-web-1".into(),
                uid: "uid-claim".into(),
            },
            format!("DELETE {NS_CLAIMS}/data-web-1"),
        ),
        (
            Step::DeleteCleanupPod {
                name: "web-1".into(),
                uid: "uid-claim".into(),
                why: PodDeletion::Completed,
                ran_for: None,
            },
            format!("DELETE {NS_PODS}/web-1"),
        ),
        (
            Step::DeleteStatefulPod {
                name: "web-1".into(),
                uid: "uid-claim".into(),
            },
            format!("DELETE {NS_PODS}/web-1"),
        ),
    ]
}

#[tokio::test]
async fn deletes_carry_the_uid_and_404_or_409_mean_done() {
    for (step, line) in deletes() {
        let (result, _, log) = run(vec![step.clone()], |_| mock_api::deleted()).await;
        assert!(result.is_ok(), "{line}");
        let sent = log.writes_and_reads();
        assert_eq!(log.lines(), std::slice::from_ref(&line));
        assert_eq!(
            sent[0].body["preconditions"]["uid"], "uid-claim",
            "{line}: UID precondition"
        );
        let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
        assert_eq!(reasons, ["SuccessfulDelete"], "{line}");

        for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
            let (result, _, log) = run(vec![step.clone()], move |_| {
                mock_api::status(code, reason, "x")
            })
            .await;
            assert!(result.is_ok(), "{line} answered {code} is done");
            assert!(log.events().is_empty(), "{line} {code}: nothing to report");
        }
        let (result, _, _) = run(vec![step.clone()], |_| {
            mock_api::status(500, "InternalError", "x")
        })
        .await;
        assert_eq!(category(&result), Some(Category::ServerError), "{line}");
    }
}

#[tokio::test]
async fn a_failed_step_stops_the_plan() {
    let steps = vec![
        Step::DeleteClaim {
            name: "data-web-1".into(),
            uid: "uid-a".into(),
        },
        Step::DeleteClaim {
            name: "data-web-2".into(),
            uid: "uid-b".into(),
        },
    ];
    let (result, _, log) = run(steps, |_| mock_api::status(503, "x", "x")).await;
    assert!(result.is_err());
    assert_eq!(log.lines(), [format!("DELETE {NS_CLAIMS}/data-web-1")]);
}

/// A mark the API server applied is handed to the expectations (the claim cache may not show it
/// by the next pass); one refused because the claim is gone or replaced is not.
#[tokio::test]
async fn a_written_mark_is_remembered_and_a_refused_one_is_not() {
    let mark = |claim: &str, attempt| Step::MarkNextAttempt {
        claim: claim.into(),
        uid: format!("uid-{claim}"),
        attempt,
    };
    let steps = vec![
        mark("data-web-1", Some(2)),
        mark("data-web-2", Some(2)),
        mark("data-web-3", None),
    ];
    let (result, done, log) = run(steps, |sent| {
        if sent.path.ends_with("/data-web-2") {
            mock_api::status(409, "Conflict", "uid mismatch")
        } else {
            (200, json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"}}))
        }
    })
    .await;
    assert!(result.is_ok());
    let sent = log.writes_and_reads();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0].body["metadata"]["uid"], "uid-data-web-1");
    assert_eq!(
        sent[0].body["metadata"]["annotations"][naming::NEXT_ATTEMPT_ANNOTATION],
        "2"
    );
    assert_eq!(
        sent[2].body["metadata"]["annotations"][naming::NEXT_ATTEMPT_ANNOTATION],
        Value::Null,
        "a removal is a merge-patch null"
    );
    let marked: Vec<_> = done
        .marked
        .iter()
        .map(|m| (m.claim.as_str(), m.attempt))
        .collect();
    assert_eq!(marked, [("data-web-1", Some(2)), ("data-web-3", None)]);
}

#[tokio::test]
async fn a_process_that_may_not_write_sends_nothing() {
    let (client, log) = mock_api::serve(|_| mock_api::deleted());
    let (actor, _) = actor(client, Leadership::elected());
    let plan = Plan {
        steps: deletes().into_iter().map(|(s, _)| s).collect(),
        ..Plan::default()
    };
    let result = actor.execute(&web(None), &plan, &mut Done::default()).await;
    assert_eq!(category(&result), Some(Category::NotLeader));
    let settled = actor
        .settle(
            &web(None),
            &BTreeMap::new(),
            &[],
            true,
            None,
            &mut Done::default(),
        )
        .await
        .map(|_| ());
    assert_eq!(category(&settled), Some(Category::NotLeader));
    let status = actor
        .write_status(&web(None), &idle(), &mut Done::default())
        .await
        .map(|_| ());
    assert_eq!(category(&status), Some(Category::NotLeader));
    assert!(log.all().is_empty(), "{:?}", log.lines());
}

#[tokio::test]
async fn the_finalizer_is_added_by_a_merge_and_removed_by_a_compare_and_swap() {
    let add = Step::SetFinalizers {
        finalizers: vec!["other.example/keep".into(), naming::FINALIZER.into()],
        resource_version: "7".into(),
        adding: true,
    };
    let (result, _, log) = run(vec![add.clone()], |_| (200, json!({}))).await;
    assert!(result.is_ok());
    assert_eq!(log.lines(), [format!("PATCH {SET_PATH}")]);
    let sent = &log.writes_and_reads()[0];
    // A merge of our finalizer alone: another's cannot be lost, and kcm's status writes
    // meanwhile cannot make it a 409.
    assert_eq!(sent.content_type, "application/strategic-merge-patch+json");
    assert_eq!(
        sent.body["metadata"]["finalizers"],
        json!([naming::FINALIZER])
    );
    assert_eq!(sent.body["metadata"]["uid"], web(None).uid);
    assert!(sent.body["metadata"].get("resourceVersion").is_none());
    for code in [404, 409, 422] {
        let (result, _, _) = run(vec![add.clone()], move |_| {
            mock_api::status(code, "Refused", "gone, replaced or being deleted")
        })
        .await;
        assert!(result.is_ok(), "{code}: the watch brings the next pass");
    }

    let remove = Step::SetFinalizers {
        finalizers: vec!["other.example/keep".into()],
        resource_version: "7".into(),
        adding: false,
    };
    let (result, _, log) = run(vec![remove.clone()], |_| (200, json!({}))).await;
    assert!(result.is_ok());
    let sent = &log.writes_and_reads()[0];
    assert_eq!(sent.content_type, "application/merge-patch+json");
    assert_eq!(sent.body["metadata"]["resourceVersion"], "7");
    assert_eq!(
        sent.body["metadata"]["finalizers"],
        json!(["other.example/keep"])
    );
    let (result, _, _) = run(vec![remove], |_| mock_api::status(409, "Conflict", "x")).await;
    assert!(
        result.is_ok(),
        "a stale cache is not an error; the watch brings the next pass"
    );
}

fn created(ordinal: u32, uid: &str) -> Created {
    Created {
        ordinal,
        name: format!("web-{ordinal}"),
        uid: uid.into(),
        attempt: 1,
        claims: [(format!("data-web-{ordinal}"), format!("uid-data-{ordinal}"))].into(),
    }
}

fn records(ordinal: u32, uid: &str) -> BTreeMap<u32, Record> {
    let pod = created(ordinal, uid);
    [(
        ordinal,
        Record {
            pod: pod.uid,
            claims: pod.claims,
        },
    )]
    .into()
}

/// Settles the pod `web-1` (uid `uid-new`) with `verdict` on set `web` with `old_record`.
async fn settle<F>(old_record: Option<&str>, verdict: Verdict, answer: F) -> (Result<()>, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (result, log) = settle_with(old_record, verdict, None, answer).await;
    (result.map(|_| ()), log)
}

async fn settle_with<F>(
    old_record: Option<&str>,
    verdict: Verdict,
    status: Option<&Write>,
    answer: F,
) -> (Result<bool>, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let (actor, _) = actor(client, Leadership::always());
    let verdicts = [(created(1, "uid-new"), verdict)];
    let mut done = Done::default();
    let result = actor
        .settle(
            &web(old_record),
            &records(1, "uid-new"),
            &verdicts,
            true,
            status,
            &mut done,
        )
        .await;
    actor.report(&web(old_record), &done).await;
    (result, log)
}

#[tokio::test]
async fn a_confirmed_pod_is_recorded_with_test_ops_then_released_by_uid() {
    let old = format_records(&records(0, "uid-old"));
    let (result, log) = settle(Some(&old), Verdict::Run, |_| (200, json!({}))).await;
    assert!(result.is_ok());
    assert_eq!(
        log.lines(),
        [
            format!("PATCH {SET_PATH}"),
            format!("PATCH {NS_PODS}/web-1")
        ]
    );
    let sent = log.writes_and_reads();
    assert_eq!(sent[0].content_type, "application/json-patch+json");
    let path = format!(
        "/metadata/annotations/{}",
        naming::RECORD_ANNOTATION.replace('/', "~1")
    );
    assert_eq!(
        sent[0].body,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-web"},
            {"op": "test", "path": "/metadata/generation", "value": 4},
            {"op": "test", "path": template_path(), "value": "{}"},
            {"op": "test", "path": path, "value": old},
            {"op": "add", "path": path, "value": format_records(&records(1, "uid-new"))},
        ])
    );
    assert_eq!(
        sent[1].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(sent[1].body["metadata"]["uid"], "uid-new");
    assert_eq!(
        sent[1].body["spec"]["schedulingGates"],
        json!([{"$patch": "delete", "name": naming::CONFIRM_GATE}])
    );
    let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["SuccessfulCreate"]);
}

#[tokio::test]
async fn a_record_that_loses_the_race_is_contended_and_releases_nothing() {
    for (code, reason) in [(409, "Conflict"), (422, "Invalid"), (404, "NotFound")] {
        let (result, log) = settle(None, Verdict::Run, move |_| {
            mock_api::status(code, reason, "the test op failed")
        })
        .await;
        assert_eq!(category(&result), Some(Category::Contended), "{code}");
        assert_eq!(
            log.lines(),
            [format!("PATCH {SET_PATH}")],
            "{code}: no release"
        );
        assert!(log.events().is_empty(), "{code}");
    }
    let (result, log) = settle(None, Verdict::Run, |_| mock_api::status(403, "x", "x")).await;
    assert_eq!(category(&result), Some(Category::Forbidden));
    assert_eq!(log.lines().len(), 1, "no release after a failed record");
}

#[tokio::test]
async fn the_record_tests_that_no_record_was_there() {
    let (_, log) = settle(None, Verdict::Run, |_| (200, json!({}))).await;
    let ops = log.writes_and_reads()[0].body.clone();
    let tests: Vec<(&Value, &Value)> = ops
        .as_array()
        .expect("a JSON patch")
        .iter()
        .filter(|op| op["op"] == "test")
        .map(|op| (&op["path"], &op["value"]))
        .collect();
    let record_path = format!(
        "/metadata/annotations/{}",
        naming::RECORD_ANNOTATION.replace('/', "~1")
    );
    assert_eq!(tests.len(), 4, "{tests:?}");
    assert_eq!(tests[0].0, &json!("/metadata/uid"));
    assert_eq!(tests[1].0, &json!("/metadata/generation"));
    assert_eq!(tests[2].0, &json!(template_path()));
    // kube-apiserver applies a null test only when the path is absent.
    assert_eq!(tests[3], (&json!(record_path), &Value::Null));
}

/// The JSON pointer of the template annotation.
fn template_path() -> String {
    format!(
        "/metadata/annotations/{}",
        naming::TEMPLATE_ANNOTATION.replace('/', "~1")
    )
}

#[tokio::test]
async fn a_cancelled_pod_is_deleted_by_uid_and_never_recorded() {
    let verdict = Verdict::Cancel("ordinal 1 is wanted again".into());
    let (result, log) = settle(None, verdict, |_| mock_api::deleted()).await;
    assert!(result.is_ok());
    assert_eq!(log.lines(), [format!("DELETE {NS_PODS}/web-1")]);
    assert_eq!(
        log.writes_and_reads()[0].body["preconditions"]["uid"],
        "uid-new"
    );
    let events = log.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1, "CleanupCancelled");
    assert!(
        events[0].2.contains("ordinal 1 is wanted again"),
        "{events:?}"
    );
}

fn release_step() -> Step {
    Step::Release {
        name: "web-1".into(),
        uid: "uid-new".into(),
    }
}

/// The release window's count after carrying out `steps` against `answer`.
async fn windows_after<F>(steps: Vec<Step>, answer: F) -> (Result<()>, Done, Log, String)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let (actor, metrics) = actor(client, Leadership::always());
    let mut done = Done::default();
    let plan = Plan {
        steps,
        ..Plan::default()
    };
    let result = actor.execute(&web(None), &plan, &mut done).await;
    let count = metrics
        .encode()
        .lines()
        .find(|l| l.starts_with("scaledown_release_window_seconds_count"))
        .unwrap_or_default()
        .to_string();
    (result, done, log, count)
}

#[tokio::test]
async fn a_release_of_a_pod_gone_or_replaced_is_done_and_measures_no_window() {
    for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
        let (result, done, log, windows) = windows_after(vec![release_step()], move |sent| {
            if sent.path == SET_PATH {
                (200, json!({}))
            } else {
                mock_api::status(code, reason, "x")
            }
        })
        .await;
        assert!(result.is_ok(), "{code}");
        assert!(!done.stale, "{code}");
        let sent = log.writes_and_reads();
        assert_eq!(sent[1].body["metadata"]["uid"], "uid-new");
        assert!(windows.ends_with(" 0"), "{code}: {windows}");
    }
    let (_, _, _, windows) = windows_after(vec![release_step()], |_| (200, json!({}))).await;
    assert!(windows.ends_with(" 1"), "a release: {windows}");
}

/// The release is preceded by a patch of test ops only on the set (UID, generation, template,
/// record), and a refused test leaves the pod gated and the rest of the plan undone.
#[tokio::test]
async fn a_release_is_sent_only_after_the_server_confirmed_the_read_of_the_set() {
    let (result, done, log) = run(vec![release_step()], |_| (200, json!({}))).await;
    assert!(result.is_ok());
    assert!(!done.stale);
    assert_eq!(
        log.lines(),
        [
            format!("PATCH {SET_PATH}"),
            format!("PATCH {NS_PODS}/web-1")
        ]
    );
    let guard = &log.writes_and_reads()[0];
    assert_eq!(guard.content_type, "application/json-patch+json");
    let ops = guard.body.as_array().expect("a JSON patch");
    assert!(ops.iter().all(|op| op["op"] == "test"), "{ops:?}");
    assert!(
        ops.iter()
            .any(|op| op["path"] == "/metadata/generation" && op["value"] == 4),
        "{ops:?}"
    );
    // A scale-up saved since the read: the test op fails (422), or the set is gone (404).
    for code in [422, 409, 404] {
        let steps = vec![
            release_step(),
            Step::DeleteClaim {
                name: "data-web-2".into(),
                uid: "uid-claim".into(),
            },
        ];
        let (result, done, log) = run(steps, move |sent| {
            if sent.path == SET_PATH {
                mock_api::status(code, "Invalid", "the test operation failed")
            } else {
                (200, json!({}))
            }
        })
        .await;
        assert!(result.is_ok(), "{code}: {result:?}");
        assert!(done.stale, "{code}");
        assert_eq!(log.lines(), [format!("PATCH {SET_PATH}")], "{code}");
    }
}

use crate::scaledown::decide::status::{Line, Status};

fn idle() -> Change {
    Change {
        write: Write::Set(Line {
            status: Status::Idle,
            reason: None,
        }),
        event: None,
    }
}

fn stalled() -> Write {
    Write::Set(Line {
        status: Status::Stalled,
        reason: Some("CleanupFailed: ordinal 1 gave up after 3 attempts".into()),
    })
}

fn status_path() -> String {
    format!(
        "/metadata/annotations/{}",
        naming::STATUS_ANNOTATION.replace('/', "~1")
    )
}

fn reason_path() -> String {
    format!(
        "/metadata/annotations/{}",
        naming::STATUS_REASON_ANNOTATION.replace('/', "~1")
    )
}

#[tokio::test]
async fn the_status_rides_in_the_record_patch_without_touching_its_test_ops() {
    let old = format_records(&records(0, "uid-old"));
    let status = Write::Set(Line {
        status: Status::CleaningUp,
        reason: None,
    });
    let (result, log) = settle_with(Some(&old), Verdict::Run, Some(&status), |_| {
        (200, json!({}))
    })
    .await;
    assert!(matches!(result, Ok(true)), "recorded, with the status");
    assert_eq!(
        log.lines(),
        [
            format!("PATCH {SET_PATH}"),
            format!("PATCH {NS_PODS}/web-1")
        ],
        "no request of its own"
    );
    let record_path = format!(
        "/metadata/annotations/{}",
        naming::RECORD_ANNOTATION.replace('/', "~1")
    );
    assert_eq!(
        log.writes_and_reads()[0].body,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-web"},
            {"op": "test", "path": "/metadata/generation", "value": 4},
            {"op": "test", "path": template_path(), "value": "{}"},
            {"op": "test", "path": record_path, "value": old},
            {"op": "add", "path": record_path, "value": format_records(&records(1, "uid-new"))},
            {"op": "add", "path": status_path(), "value": "CleaningUp"},
            // No reason: an add then a remove, which applies whether or not one is there.
            {"op": "add", "path": reason_path(), "value": ""},
            {"op": "remove", "path": reason_path()},
        ]),
        "the record's test ops are exactly those of a record without a status"
    );
    // Cancelled: no record, so the status is not written by settle.
    let (result, _) = settle_with(
        None,
        Verdict::Cancel("wanted".into()),
        Some(&status),
        |_| mock_api::deleted(),
    )
    .await;
    assert!(matches!(result, Ok(false)));
}

#[tokio::test]
async fn the_status_rides_in_the_finalizer_patch() {
    let step = Step::SetFinalizers {
        finalizers: vec![naming::FINALIZER.into()],
        resource_version: "7".into(),
        adding: true,
    };
    for (answer, written) in [(200, true), (409, false)] {
        let (client, log) = mock_api::serve(move |_| match answer {
            200 => (200, json!({})),
            _ => mock_api::status(409, "Conflict", "x"),
        });
        let (actor, _) = actor(client, Leadership::always());
        let plan = Plan {
            steps: vec![step.clone()],
            status: Some(Change {
                write: stalled(),
                event: None,
            }),
            ..Plan::default()
        };
        let mut done = Done::default();
        let result = actor.execute(&web(None), &plan, &mut done).await;
        assert!(result.is_ok());
        assert_eq!(done.status, Some(written), "{answer}");
        assert_eq!(log.lines(), [format!("PATCH {SET_PATH}")], "one request");
        let annotations = &log.writes_and_reads()[0].body["metadata"]["annotations"];
        assert_eq!(annotations[naming::STATUS_ANNOTATION], "Stalled");
        assert_eq!(
            annotations[naming::STATUS_REASON_ANNOTATION],
            "CleanupFailed: ordinal 1 gave up after 3 attempts"
        );
    }
    // Released on opt-out: both annotations removed in the same patch.
    let (client, log) = mock_api::serve(|_| (200, json!({})));
    let (actor, _) = actor(client, Leadership::always());
    let plan = Plan {
        steps: vec![Step::SetFinalizers {
            finalizers: vec![],
            resource_version: "7".into(),
            adding: false,
        }],
        status: Some(Change {
            write: Write::Remove,
            event: None,
        }),
        ..Plan::default()
    };
    let mut done = Done::default();
    assert!(actor.execute(&web(None), &plan, &mut done).await.is_ok());
    let annotations = &log.writes_and_reads()[0].body["metadata"]["annotations"];
    assert_eq!(
        annotations,
        &json!({naming::STATUS_ANNOTATION: null, naming::STATUS_REASON_ANNOTATION: null})
    );
}

#[tokio::test]
async fn a_status_of_its_own_tests_the_status_it_replaces() {
    let mut set = web(None);
    set.status = Some("CleaningUp".into());
    let change = Change {
        write: stalled(),
        event: Some(Event {
            reason: Reason::ScaleDownPaused,
            note: "paused".into(),
            key: "paused 7".into(),
        }),
    };
    let (client, log) = mock_api::serve(|_| (200, json!({})));
    let (actor, _) = super::tests::actor(client, Leadership::always());
    assert!(matches!(
        actor
            .write_status(&set, &change, &mut Done::default())
            .await,
        Ok(true)
    ));
    let sent = log.writes_and_reads();
    assert_eq!(sent[0].content_type, "application/json-patch+json");
    assert_eq!(
        sent[0].body,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-web"},
            {"op": "test", "path": status_path(), "value": "CleaningUp"},
            {"op": "add", "path": status_path(), "value": "Stalled"},
            {"op": "add", "path": reason_path(), "value": "CleanupFailed: ordinal 1 gave up after 3 attempts"},
        ])
    );
    actor.status_event(&set, &change).await;
    let events = log.events();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Normal", "ScaleDownPaused")
    );

    // Someone else changed it since (the test op fails): left alone, not an error.
    for (code, reason) in [(422, "Invalid"), (409, "Conflict"), (404, "NotFound")] {
        let (client, _) = mock_api::serve(move |_| mock_api::status(code, reason, "x"));
        let (actor, _) = super::tests::actor(client, Leadership::always());
        assert!(
            matches!(
                actor
                    .write_status(&set, &change, &mut Done::default())
                    .await,
                Ok(false)
            ),
            "{code}"
        );
    }
    let (client, _) = mock_api::serve(|_| mock_api::status(403, "Forbidden", "x"));
    let (actor, _) = super::tests::actor(client, Leadership::always());
    let result = actor
        .write_status(&set, &change, &mut Done::default())
        .await
        .map(|_| ());
    assert_eq!(category(&result), Some(Category::Forbidden));

    // No status yet: the test is that there is none.
    let (client, log) = mock_api::serve(|_| (200, json!({})));
    let (actor, _) = super::tests::actor(client, Leadership::always());
    assert!(
        actor
            .write_status(&web(None), &idle(), &mut Done::default())
            .await
            .is_ok()
    );
    assert_eq!(log.writes_and_reads()[0].body[1]["value"], Value::Null);
}

#[tokio::test]
async fn under_dry_run_a_status_is_a_dry_run_record() {
    let (client, log) = mock_api::serve(|_| (200, json!({})));
    let (actor, _) = actor_with(client, Leadership::always(), true);
    let mut done = Done::default();
    assert!(matches!(
        actor.write_status(&web(None), &idle(), &mut done).await,
        Ok(true)
    ));
    actor.report(&web(None), &done).await;
    assert!(
        log.lines().iter().all(|l| !l.starts_with("PATCH")),
        "{:?}",
        log.lines()
    );
    let events = log.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, "DryRun");
    assert!(events[0].2.contains("set status Idle"), "{events:?}");
}
