//! The fence against the scripted API server: what it lets through is what the server sees.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::error::{Category, Error};
use crate::mock_api::{self, deleted};

fn claim() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-web-1", "namespace": "ns", "uid": "u1", "resourceVersion": "1"}})
}

/// A leader whose term ends in 50 ms, and a fenced client to the scripted server.
fn leader_for_50ms() -> (Arc<Leadership>, Client, mock_api::Log) {
    let leadership = Arc::new(Leadership::elected());
    leadership.set(true, Some(Instant::now() + Duration::from_millis(50)));
    let (raw, log) = mock_api::serve(|sent| match sent.method.as_str() {
        "DELETE" => deleted(),
        _ => (200, claim()),
    });
    (leadership.clone(), client(&raw, &leadership), log)
}

/// Before the renew deadline a delete is sent; once it has passed (by the local clock, before the
/// election task has noticed anything) the same delete is not: the server sees no request, and
/// the caller gets a `not_leader` error. Reads still pass.
#[tokio::test(start_paused = true)]
async fn a_write_after_the_renew_deadline_is_not_sent() {
    let (_leadership, fenced, log) = leader_for_50ms();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(fenced, "ns");
    claims
        .delete("data-web-1", &DeleteParams::default())
        .await
        .expect("within the term the delete is sent");
    assert_eq!(
        log.lines(),
        ["DELETE /api/v1/namespaces/ns/persistentvolumeclaims/data-web-1"]
    );

    tokio::time::advance(Duration::from_millis(50)).await;
    let refused = claims
        .delete("data-web-1", &DeleteParams::default())
        .await
        .expect_err("past the deadline the delete is refused");
    let err = Error::kube("delete claim", "data-web-1")(refused);
    assert_eq!(err.category(), Category::NotLeader, "{err}");
    assert_eq!(
        log.lines().len(),
        1,
        "nothing more was sent: {:?}",
        log.lines()
    );

    claims.get("data-web-1").await.expect("reads pass");
    assert_eq!(
        log.lines().last().map(String::as_str),
        Some("GET /api/v1/namespaces/ns/persistentvolumeclaims/data-web-1")
    );
}

/// Events are writes too: a deposed leader publishes none.
#[tokio::test(start_paused = true)]
async fn events_are_fenced_too() {
    let (leadership, fenced, log) = leader_for_50ms();
    let recorder = Recorder::new(fenced, Reporter::from("fence-test"));
    let claim: PersistentVolumeClaim = serde_json::from_value(claim()).expect("a claim");
    let event = |note: &str| Event {
        type_: EventType::Normal,
        reason: "Test".into(),
        note: Some(note.into()),
        action: "Test".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&claim, &());
    recorder
        .publish(&event("while leading"), &reference)
        .await
        .expect("published while leading");
    leadership.set(false, None);
    let refused = recorder.publish(&event("after"), &reference).await;
    assert!(refused.is_err(), "an Event after the term is refused");
    let notes: Vec<String> = log.events().into_iter().map(|(_, _, note)| note).collect();
    assert_eq!(notes, ["while leading"]);
}

/// Without election every write passes.
#[tokio::test]
async fn without_election_writes_pass() {
    let (raw, log) = mock_api::serve(|_| deleted());
    let fenced = client(&raw, &Arc::new(Leadership::always()));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(fenced, "ns");
    claims
        .delete("data-web-1", &DeleteParams::default())
        .await
        .expect("sent");
    assert_eq!(log.lines().len(), 1);
}

#[test]
fn reads_and_writes_by_method() {
    for method in [Method::GET, Method::HEAD] {
        assert!(!is_write(&method), "{method}");
    }
    for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        assert!(is_write(&method), "{method}");
    }
}
