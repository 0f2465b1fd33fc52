//! The pod-bound claims' `act`: the owner patch it builds, and the requests it sends and what it
//! makes of the answers, against a scripted API server (`crate::mock_api`): the owner patch tests the claim's UID and
//! resourceVersion, the deletion carries both as preconditions, a claim that changed or went
//! (404, 409, 422) is left for the next pass, and a refusal is one Warning and no write.

use serde_json::json;

use super::*;
use crate::error::Category;
use crate::metrics::Metrics;
use crate::mock_api::{self, Answer, Log, Sent};

const CLAIM_PATH: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/cache";

fn claim(owners: Vec<(String, String, String)>) -> ClaimFacts {
    ClaimFacts {
        namespace: "ns".into(),
        name: "cache".into(),
        uid: "uid-claim".into(),
        resource_version: "5".into(),
        pod: Some("runner".into()),
        waiting: None,
        deleting: false,
        owners,
        created: None,
    }
}

fn pods(names: &[&str]) -> Vec<PodRef> {
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

// === the owner patch, built ===

fn live(owners: serde_json::Value, rv: &str) -> serde_json::Value {
    let mut meta = json!({"name": "cache", "uid": "uid-claim", "resourceVersion": rv});
    if !owners.is_null() {
        meta["ownerReferences"] = owners;
    }
    json!({"metadata": meta})
}

fn owner_uids(doc: &serde_json::Value) -> Vec<String> {
    doc["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| o["uid"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_owner_patch_adds_every_pod_to_the_state_it_was_decided_on() {
    let patch = owner_patch(&claim(Vec::new()), &pods(&["runner", "reader"])).expect("patch");
    let mut doc = live(serde_json::Value::Null, "5");
    json_patch::patch(&mut doc, &patch).expect("applies");
    assert_eq!(owner_uids(&doc), ["uid-runner", "uid-reader"]);
    let reader = &doc["metadata"]["ownerReferences"][1];
    assert_eq!(reader["blockOwnerDeletion"], json!(false));
    assert!(reader.get("controller").is_none(), "never a controller");

    // Added to the owners there are, which stay.
    let owners = vec![("Pod".into(), "runner".into(), "uid-runner".into())];
    let patch = owner_patch(&claim(owners), &pods(&["late"])).expect("patch");
    let mut doc = live(
        json!([{"kind": "Pod", "name": "runner", "uid": "uid-runner"}]),
        "5",
    );
    json_patch::patch(&mut doc, &patch).expect("applies");
    assert_eq!(owner_uids(&doc), ["uid-runner", "uid-late"]);
}

#[test]
fn the_owner_patch_fails_on_a_changed_or_replaced_claim() {
    let patch = owner_patch(&claim(Vec::new()), &pods(&["runner"])).expect("patch");
    let mut changed = live(serde_json::Value::Null, "6");
    assert!(
        json_patch::patch(&mut changed, &patch).is_err(),
        "resourceVersion"
    );
    let mut replaced = live(serde_json::Value::Null, "5");
    replaced["metadata"]["uid"] = json!("uid-new");
    assert!(json_patch::patch(&mut replaced, &patch).is_err(), "uid");
    assert_eq!(owner_uids(&replaced), Vec::<String>::new());
}

#[tokio::test]
async fn under_dry_run_the_writes_are_dry_run_events_only() {
    let (client, log) = crate::mock_api::serve(|_| crate::mock_api::deleted());
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let (reporter, _) = crate::pass::test_parts::<PersistentVolumeClaim>(
        crate::naming::Controller::PodBound,
        &client,
        &metrics,
        true,
    );
    let binder = Actor::new(client, reporter, Arc::new(Leadership::always()));
    let facts = claim(Vec::new());
    binder
        .attach(&facts, &pods(&["runner"]))
        .await
        .expect("attach");
    binder.delete(&facts).await.expect("delete");
    assert!(log.lines().is_empty(), "wrote: {:?}", log.lines());
    let events = log.events();
    let reasons: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(reasons, ["DryRun", "DryRun"], "{events:?}");
    assert!(
        events[0].2.contains("bind claim cache to pods runner"),
        "{events:?}"
    );
    assert!(
        metrics
            .encode()
            .contains("scaledown_events_total{reason=\"DryRun\"} 2")
    );
}
