//! The requests the pod-bound claims' `act` sends, and what it makes of the answers, against a
//! scripted API server (`crate::mock_api`): the owner patch tests the claim's UID and
//! resourceVersion, the deletion carries both as preconditions, a claim that changed or went
//! (404, 409, 422) is left for the next pass, and a refusal is one Warning and no write.

use serde_json::json;

use super::*;
use crate::error::Category;
use crate::metrics::Metrics;
use crate::mock_api::{self, Answer, Log, Sent};

const CLAIM_PATH: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/cache";

pub(super) fn claim(owners: Vec<(String, String, String)>) -> ClaimFacts {
    ClaimFacts {
        namespace: "ns".into(),
        name: "cache".into(),
        uid: "uid-claim".into(),
        resource_version: "5".into(),
        pod: Some("runner".into()),
        waiting: None,
        deleting: false,
        owners,
    }
}

pub(super) fn pods(names: &[&str]) -> Vec<PodRef> {
    names
        .iter()
        .map(|n| PodRef {
            name: n.to_string(),
            uid: format!("uid-{n}"),
        })
        .collect()
}

fn binder(client: Client, leadership: Leadership, dry_run: bool) -> Actor {
    let metrics = Arc::new(Metrics::default());
    let (reporter, _) = crate::pass::test_parts::<PersistentVolumeClaim>(
        crate::naming::Controller::PodBound,
        &client,
        &metrics,
        dry_run,
    );
    Actor::new(client, reporter, Arc::new(leadership))
}

fn serve<F>(answer: F) -> (Actor, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    (binder(client, Leadership::always(), false), log)
}

fn category(result: &Result<()>) -> Option<Category> {
    result.as_ref().err().map(Error::category)
}

#[tokio::test]
async fn owners_are_added_by_a_patch_that_tests_the_claims_uid_and_version() {
    let (binder, log) = serve(|_| (200, json!({})));
    let result = binder
        .attach(&claim(Vec::new()), &pods(&["runner", "reader"]))
        .await;
    assert!(result.is_ok());
    assert_eq!(log.lines(), [format!("PATCH {CLAIM_PATH}")]);
    let sent = &log.writes_and_reads()[0];
    assert_eq!(sent.content_type, "application/json-patch+json");
    let reference = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "name": name, "uid": format!("uid-{name}"),
               "blockOwnerDeletion": false})
    };
    assert_eq!(
        sent.body,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-claim"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
            {"op": "add", "path": "/metadata/ownerReferences",
             "value": [reference("runner"), reference("reader")]},
        ])
    );
    let events = log.published();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("Normal BoundToPod: claim cache is deleted once every pod that owns it is gone; owners added: runner (uid uid-runner), reader (uid uid-reader)"),
        "{events:?}"
    );

    // A claim with owners: appended, the others kept.
    let (binder, log) = serve(|_| (200, json!({})));
    let owners = vec![("Pod".into(), "runner".into(), "uid-runner".into())];
    binder
        .attach(&claim(owners), &pods(&["late"]))
        .await
        .expect("attach");
    let ops = &log.writes_and_reads()[0].body;
    assert_eq!(ops[2]["path"], "/metadata/ownerReferences/-");
    assert_eq!(ops[2]["value"], reference("late"));
}

#[tokio::test]
async fn an_owner_patch_on_a_changed_claim_waits_for_the_next_pass() {
    for (code, reason) in [(422, "Invalid"), (409, "Conflict"), (404, "NotFound")] {
        let (binder, log) = serve(move |_| mock_api::status(code, reason, "the test op failed"));
        let result = binder.attach(&claim(Vec::new()), &pods(&["runner"])).await;
        assert!(result.is_ok(), "{code}: not an error");
        assert_eq!(log.lines().len(), 1, "{code}: no retry");
        assert!(log.published().is_empty(), "{code}: {:?}", log.published());
    }
    for (code, reason, want) in [
        (403, "Forbidden", Category::Forbidden),
        (503, "ServiceUnavailable", Category::ServerError),
    ] {
        let (binder, log) = serve(move |_| mock_api::status(code, reason, "no"));
        let result = binder.attach(&claim(Vec::new()), &pods(&["runner"])).await;
        assert_eq!(category(&result), Some(want), "{code}");
        assert!(log.published().is_empty(), "{code}");
    }
}

#[tokio::test]
async fn a_claim_is_deleted_with_its_uid_and_version_as_preconditions() {
    let (binder, log) = serve(|_| mock_api::deleted());
    assert!(binder.delete(&claim(Vec::new())).await.is_ok());
    assert_eq!(log.lines(), [format!("DELETE {CLAIM_PATH}")]);
    let body = &log.writes_and_reads()[0].body;
    assert_eq!(body["preconditions"]["uid"], "uid-claim");
    assert_eq!(body["preconditions"]["resourceVersion"], "5");
    let events = log.published();
    assert_eq!(
        events,
        ["Normal DeletedWithPod: deleted claim cache: its pod runner is gone"]
    );

    for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
        let (binder, log) = serve(move |_| mock_api::status(code, reason, "x"));
        assert!(
            binder.delete(&claim(Vec::new())).await.is_ok(),
            "{code} is done"
        );
        assert!(
            log.published().is_empty(),
            "{code}: nothing deleted, nothing said"
        );
    }
    let (binder, _) = serve(|_| mock_api::status(403, "Forbidden", "x"));
    let result = binder.delete(&claim(Vec::new())).await;
    assert_eq!(category(&result), Some(Category::Forbidden));
}

#[tokio::test]
async fn a_refusal_is_a_warning_on_the_claim_and_no_write() {
    let (binder, log) = serve(|_| mock_api::status(500, "InternalError", "no writes"));
    let note = "claim cache belongs to a StatefulSet; not bound to pod runner".to_string();
    binder
        .refuse(&claim(Vec::new()), Reason::PodBindingRefused, note.clone())
        .await;
    assert!(log.lines().is_empty(), "{:?}", log.lines());
    assert_eq!(
        log.published(),
        [format!("Warning PodBindingRefused: {note}")]
    );
    let event = log
        .all()
        .into_iter()
        .find(Sent::is_event)
        .expect("an Event");
    assert_eq!(event.path, "/apis/events.k8s.io/v1/namespaces/ns/events");
    assert_eq!(event.body["regarding"]["uid"], "uid-claim");
    assert_eq!(event.body["regarding"]["kind"], "PersistentVolumeClaim");
}

#[tokio::test]
async fn a_process_that_may_not_write_sends_nothing() {
    let (client, log) = mock_api::serve(|_| mock_api::deleted());
    let standby = binder(client, Leadership::elected(), false);
    let attached = standby.attach(&claim(Vec::new()), &pods(&["runner"])).await;
    assert_eq!(category(&attached), Some(Category::NotLeader));
    let deleted = standby.delete(&claim(Vec::new())).await;
    assert_eq!(category(&deleted), Some(Category::NotLeader));
    assert!(log.all().is_empty(), "{:?}", log.lines());

    let (client, log) = mock_api::serve(|_| mock_api::deleted());
    let dry = binder(client, Leadership::always(), true);
    assert!(
        dry.attach(&claim(Vec::new()), &pods(&["runner"]))
            .await
            .is_ok()
    );
    assert!(dry.delete(&claim(Vec::new())).await.is_ok());
    assert!(log.lines().is_empty(), "dry-run wrote: {:?}", log.lines());
    let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["DryRun", "DryRun"]);
}
