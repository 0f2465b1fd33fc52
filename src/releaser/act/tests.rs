//! The requests the releaser's `act` sends, and what it makes of the answers, against a scripted
//! API server (`crate::mock_api`): the claimRef patches test the claim's UID, the scrub record
//! tests the state it moves from, deletions carry the UID precondition, a lost race (404, 409,
//! 422 on a patch) leaves the PV alone, a refused scrub pod fails the scrub, and a scrub that
//! cannot run is reported once per PV and cause.

use serde_json::{Value, json};

use super::*;
use crate::error::Category;
use crate::mock_api::{self, Answer, Log, Sent};
use crate::naming::{SCRUB_PV_LABEL, SCRUB_STATE_ANNOTATION};
use crate::releaser::observe::{ClaimRead, ClaimRef, ScrubPod, ScrubTemplate};

const PV_PATH: &str = "/api/v1/persistentvolumes/pv-1";
const OPS_CLAIMS: &str = "/api/v1/namespaces/ops/persistentvolumeclaims";
const OPS_PODS: &str = "/api/v1/namespaces/ops/pods";

fn pv() -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "uid": "uid-pv"},
        "spec": {"storageClassName": "pool", "persistentVolumeReclaimPolicy": "Retain",
                 "capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                 "claimRef": {"namespace": "ci", "name": "cache", "uid": "uid-old"}},
        "status": {"phase": "Released"}
    }))
    .expect("pv")
}

/// The facts of `pv()`, whose claimRef names `claim_uid`, with scrub record `scrub`.
fn facts(claim_uid: &str, scrub: Option<Scrub>) -> PvFacts {
    PvFacts {
        name: "pv-1".into(),
        uid: "uid-pv".into(),
        phase: "Released".into(),
        retain: true,
        class: "pool".into(),
        class_id: Some("ci".into()),
        claim_ref: Some(ClaimRef {
            namespace: "ci".into(),
            name: "cache".into(),
            uid: claim_uid.into(),
        }),
        deleting: false,
        claim: ClaimRead::Gone,
        scrub_template: ScrubTemplate::Absent,
        scrub_ns: Some("ops".into()),
        scrub,
        scrub_pod: ScrubPod::Missing,
    }
}

fn writer(client: kube::Client, leadership: Leadership, dry_run: bool) -> (Actor, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let (reporter, _) = crate::pass::test_parts::<PersistentVolume>(
        crate::naming::Controller::Releaser,
        &client,
        &metrics,
        dry_run,
    );
    let releaser = Actor::new(client, reporter, metrics.clone(), Arc::new(leadership));
    (releaser, metrics)
}

/// Acts on `plan` for `pv()` with `facts` against a server answering with `answer`.
async fn run<F>(facts: &PvFacts, plan: Plan, answer: F) -> (Result<()>, Log, Arc<Metrics>)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let (releaser, metrics) = writer(client, Leadership::always(), false);
    let result = releaser.act(&pv(), facts, plan).await;
    (result, log, metrics)
}

fn category(result: &Result<()>) -> Option<Category> {
    result.as_ref().err().map(Error::category)
}

/// The value of the sample `name` (no labels) in the metrics' text.
fn sample(metrics: &Metrics, name: &str) -> Option<String> {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
}

fn record_path() -> String {
    format!(
        "/metadata/annotations/{}",
        SCRUB_STATE_ANNOTATION.replace('/', "~1")
    )
}

fn release(claim_uid: &str) -> Plan {
    Plan::Release {
        claim_uid: claim_uid.into(),
    }
}

#[tokio::test]
async fn a_release_removes_the_claim_ref_only_while_it_names_the_gone_claim() {
    let (result, log, metrics) = run(&facts("uid-old", None), release("uid-old"), |_| {
        (200, json!({}))
    })
    .await;
    assert!(result.is_ok());
    assert_eq!(log.lines(), [format!("PATCH {PV_PATH}")]);
    let sent = &log.writes_and_reads()[0];
    assert_eq!(sent.content_type, "application/json-patch+json");
    assert_eq!(
        sent.body,
        json!([
            {"op": "test", "path": "/spec/claimRef/uid", "value": "uid-old"},
            {"op": "remove", "path": "/spec/claimRef"},
        ])
    );
    let events = log.published();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with("Normal Released: released: claim ci/cache (uid-old) is gone"),
        "{events:?}"
    );
    assert_eq!(
        sample(&metrics, "scaledown_pv_released_total").as_deref(),
        Some("1")
    );

    // After a scrub: from the temporary claim, and the record goes too.
    let scrubbed = facts("uid-temp", Some(Scrub::Scrubbed("uid-temp".into())));
    let (result, log, _) = run(&scrubbed, release("uid-temp"), |_| (200, json!({}))).await;
    assert!(result.is_ok());
    assert_eq!(
        log.writes_and_reads()[0].body,
        json!([
            {"op": "test", "path": "/spec/claimRef/uid", "value": "uid-temp"},
            {"op": "remove", "path": "/spec/claimRef"},
            {"op": "remove", "path": record_path()},
        ])
    );
    assert!(
        log.published()[0].contains("released: scrubbed; "),
        "{:?}",
        log.published()
    );
}

#[tokio::test]
async fn a_release_that_loses_the_race_leaves_the_pv_alone() {
    for (code, reason) in [(422, "Invalid"), (409, "Conflict"), (404, "NotFound")] {
        let (result, log, metrics) = run(&facts("uid-old", None), release("uid-old"), move |_| {
            mock_api::status(code, reason, "the test op failed")
        })
        .await;
        assert!(result.is_ok(), "{code}: a PV that changed is not an error");
        assert_eq!(log.lines().len(), 1, "{code}: no retry");
        assert!(log.published().is_empty(), "{code}: {:?}", log.published());
        assert_eq!(
            sample(&metrics, "scaledown_pv_released_total").as_deref(),
            Some("0")
        );
    }
}

#[tokio::test]
async fn a_refused_release_is_a_warning_and_an_error_for_the_retry() {
    for (code, reason, want) in [
        (403, "Forbidden", Category::Forbidden),
        (500, "InternalError", Category::ServerError),
    ] {
        let (result, log, _) = run(&facts("uid-old", None), release("uid-old"), move |_| {
            mock_api::status(code, reason, "no")
        })
        .await;
        assert_eq!(category(&result), Some(want), "{code}");
        let events = log.published();
        assert_eq!(events.len(), 1, "{code}: {events:?}");
        assert!(
            events[0].starts_with("Warning ErrReleasePV: could not release PV pv-1"),
            "{events:?}"
        );
    }
}

fn start() -> Plan {
    Plan::StartScrub {
        claim_uid: "uid-old".into(),
        namespace: "ops".into(),
    }
}

/// Answers the temporary claim's create with `create`, its read with uid `uid-read`, the PV's
/// patch with `patch`, and deletions with success.
fn scrub_server(create: Answer, patch: Answer) -> impl Fn(&Sent) -> Answer + Send + Sync {
    move |sent: &Sent| match sent.method.as_str() {
        "POST" => create.clone(),
        "GET" => (
            200,
            json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-read"}}),
        ),
        "PATCH" => patch.clone(),
        _ => mock_api::deleted(),
    }
}

#[tokio::test]
async fn a_scrub_starts_with_the_temporary_claim_then_hands_the_pv_over() {
    let created = (
        201,
        json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-temp"}}),
    );
    let (result, log, _) = run(
        &facts("uid-old", None),
        start(),
        scrub_server(created, (200, json!({}))),
    )
    .await;
    assert!(result.is_ok());
    assert_eq!(
        log.lines(),
        [format!("POST {OPS_CLAIMS}"), format!("PATCH {PV_PATH}")]
    );
    let sent = log.writes_and_reads();
    let claim = &sent[0].body;
    assert_eq!(claim["metadata"]["name"], "scrub-pv-1");
    assert_eq!(claim["metadata"]["labels"][SCRUB_PV_LABEL], "true");
    assert_eq!(claim["metadata"]["annotations"][SCRUB_PV_LABEL], "pv-1");
    assert_eq!(claim["spec"]["volumeName"], "pv-1");
    assert_eq!(claim["spec"]["storageClassName"], "pool");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "5Gi");
    assert_eq!(sent[1].content_type, "application/json-patch+json");
    let ops = &sent[1].body;
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/spec/claimRef/uid", "value": "uid-old"}),
        "the hand-over first tests the gone claim"
    );
    assert_eq!(ops[1]["op"], "replace");
    assert_eq!(
        ops[1]["value"]["uid"], "uid-temp",
        "to the claim just created"
    );
    assert_eq!(ops[1]["value"]["namespace"], "ops");
    assert_eq!(ops[2]["value"][SCRUB_STATE_ANNOTATION], "running:uid-temp");
    assert!(log.published().is_empty());
}

/// A claim named `scrub-pv-1` this releaser did not create (409 on the create; read, UID
/// `uid-read`): the PV is not handed to it (no patch), a Warning `ScrubBlocked` names it, once, and
/// the pass fails with the 409 (category conflict) so the PV is backed off. (The releaser adopted
/// any claim of that name and handed it the PV.)
#[tokio::test]
async fn a_foreign_claim_with_the_temporary_name_is_never_handed_the_pv() {
    let (client, log) = mock_api::serve(scrub_server(
        mock_api::status(409, "AlreadyExists", "exists"),
        (200, json!({})),
    ));
    let (releaser, _) = writer(client, Leadership::always(), false);
    for pass in 0..2 {
        let result = releaser.act(&pv(), &facts("uid-old", None), start()).await;
        assert_eq!(category(&result), Some(Category::Conflict), "pass {pass}");
    }
    let read = format!("GET {OPS_CLAIMS}/scrub-pv-1");
    let create = format!("POST {OPS_CLAIMS}");
    assert_eq!(
        log.lines(),
        [&create, &read, &create, &read].map(String::clone),
        "no hand-over"
    );
    let events = log.published();
    assert_eq!(events.len(), 1, "once per PV and claim: {events:?}");
    assert!(
        events[0].starts_with("Warning ScrubBlocked: PV pv-1: StorageClass pool asks for a scrub before release, but claim ops/scrub-pv-1 (uid uid-read) exists and was not created by this releaser"),
        "{events:?}"
    );

    // One being deleted (a former scrub's) is waited for, without a Warning.
    let (result, log, _) = run(&facts("uid-old", None), start(), |sent: &Sent| {
        match sent.method.as_str() {
            "POST" => mock_api::status(409, "AlreadyExists", "exists"),
            _ => (
                200,
                json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-read",
                   "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
        }
    })
    .await;
    assert_eq!(category(&result), Some(Category::Conflict));
    assert_eq!(log.lines().len(), 2, "{:?}", log.lines());
    assert!(log.published().is_empty(), "{:?}", log.published());
}

/// The claim this process created, whose hand-over failed (500): on the next pass its create is
/// answered 409 and it is read under the UID recorded at the create, so the PV is handed to it; a
/// hand-over lost to a changed PV (422, 409) then deletes it by that UID.
#[tokio::test]
async fn the_claim_this_process_created_is_adopted_after_a_failed_hand_over() {
    for (code, reason) in [(200, ""), (422, "Invalid"), (409, "Conflict")] {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let patches = calls.clone();
        let (client, log) = mock_api::serve(move |sent: &Sent| match sent.method.as_str() {
            "POST" if log_count(&patches) == 0 => (
                201,
                json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-temp"}}),
            ),
            "POST" => mock_api::status(409, "AlreadyExists", "exists"),
            "GET" => (
                200,
                json!({"metadata": {"name": "scrub-pv-1", "uid": "uid-temp"}}),
            ),
            "PATCH" if patches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
                mock_api::status(500, "InternalError", "try again")
            }
            "PATCH" if code == 200 => (200, json!({})),
            "PATCH" => mock_api::status(code, reason, "the test op failed"),
            _ => mock_api::deleted(),
        });
        let (releaser, _) = writer(client, Leadership::always(), false);
        let first = releaser.act(&pv(), &facts("uid-old", None), start()).await;
        assert_eq!(category(&first), Some(Category::ServerError), "{code}");
        let again = releaser.act(&pv(), &facts("uid-old", None), start()).await;
        assert!(again.is_ok(), "{code}: {again:?}");
        let sent = log.writes_and_reads();
        let lines: Vec<String> = sent.iter().map(Sent::line).collect();
        assert_eq!(
            lines[2..4],
            [
                format!("POST {OPS_CLAIMS}"),
                format!("GET {OPS_CLAIMS}/scrub-pv-1")
            ],
            "{code}"
        );
        assert_eq!(
            sent[4].body[1]["value"]["uid"], "uid-temp",
            "{code}: adopted"
        );
        if code == 200 {
            assert_eq!(sent.len(), 5, "{lines:?}");
        } else {
            assert_eq!(lines[5], format!("DELETE {OPS_CLAIMS}/scrub-pv-1"));
            assert_eq!(sent[5].body["preconditions"]["uid"], "uid-temp", "{code}");
        }
        assert!(log.published().is_empty(), "{code}: {:?}", log.published());
    }

    // Refused create: no hand-over without the claim.
    let forbidden = mock_api::status(403, "Forbidden", "no");
    let (result, log, _) = run(
        &facts("uid-old", None),
        start(),
        scrub_server(forbidden, (200, json!({}))),
    )
    .await;
    assert_eq!(category(&result), Some(Category::Forbidden));
    assert_eq!(log.lines().len(), 1, "no hand-over without the claim");
}

/// How many PATCHes were answered (the first create is answered 201, later ones 409).
fn log_count(patches: &std::sync::atomic::AtomicUsize) -> usize {
    patches.load(std::sync::atomic::Ordering::SeqCst)
}

fn scrub_pod() -> Value {
    crate::template::scrub::render(
        &json!({"spec": {"containers": [{"name": "wipe", "image": "busybox"}]}}),
        "pv-1",
        "ops",
    )
}

fn create_pod() -> Plan {
    Plan::CreateScrubPod {
        temp_uid: "uid-temp".into(),
        namespace: "ops".into(),
        pod: scrub_pod(),
    }
}

fn running() -> PvFacts {
    let mut facts = facts("uid-temp", Some(Scrub::Running("uid-temp".into())));
    facts.phase = "Bound".into();
    facts
}

#[tokio::test]
async fn the_scrub_pod_is_created_as_planned_and_409_means_done() {
    for answer in [
        (201, scrub_pod()),
        mock_api::status(409, "AlreadyExists", "exists"),
    ] {
        let code = answer.0;
        let (result, log, _) = run(&running(), create_pod(), move |_| answer.clone()).await;
        assert!(result.is_ok(), "{code}");
        assert_eq!(log.lines(), [format!("POST {OPS_PODS}")], "{code}");
        assert_eq!(
            log.writes_and_reads()[0].body,
            scrub_pod(),
            "{code}: the plan's pod"
        );
        assert!(log.published().is_empty(), "{code}");
    }
}

#[tokio::test]
async fn a_refused_scrub_pod_fails_the_scrub() {
    for (code, reason) in [(403, "Forbidden"), (422, "Invalid")] {
        let (result, log, metrics) = run(&running(), create_pod(), move |sent| {
            match sent.method.as_str() {
                "POST" => mock_api::status(code, reason, "refused by the test"),
                "PATCH" => (200, json!({})),
                _ => mock_api::deleted(),
            }
        })
        .await;
        assert!(result.is_ok(), "{code}: a refusal is not a pass error");
        assert_eq!(
            log.lines(),
            [
                format!("POST {OPS_PODS}"),
                format!("PATCH {PV_PATH}"),
                format!("DELETE {OPS_CLAIMS}/scrub-pv-1"),
            ],
            "{code}: recorded, no pod to delete, the temporary claim deleted"
        );
        let sent = log.writes_and_reads();
        assert_eq!(
            sent[1].body,
            json!([
                {"op": "test", "path": record_path(), "value": "running:uid-temp"},
                {"op": "replace", "path": record_path(), "value": "failed:uid-temp"},
            ])
        );
        assert_eq!(sent[2].body["preconditions"]["uid"], "uid-temp");
        let events = log.published();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].starts_with(
                "Warning ErrScrubPV: scrub of PV pv-1 failed (the API server refused the scrub pod"
            ) && events[0].contains(&format!("({code}): refused by the test")),
            "{events:?}"
        );
        let failed = metrics.encode().lines().any(|l| {
            l.starts_with("scaledown_pv_scrubs_total{") && l.contains("failed") && l.ends_with(" 1")
        });
        assert!(failed, "{}", metrics.encode());
    }
    for (code, reason, want) in [
        (503, "ServiceUnavailable", Category::ServerError),
        (429, "TooManyRequests", Category::Throttled),
    ] {
        let (result, log, _) = run(&running(), create_pod(), move |_| {
            mock_api::status(code, reason, "later")
        })
        .await;
        assert_eq!(category(&result), Some(want), "{code}");
        assert_eq!(
            log.lines().len(),
            1,
            "{code}: the scrub is not failed for it"
        );
        assert!(log.published().is_empty(), "{code}");
    }
}

fn finish(failed: Option<&str>) -> Plan {
    Plan::FinishScrub {
        temp_uid: "uid-temp".into(),
        failed: failed.map(str::to_string),
        namespace: "ops".into(),
        pod_uid: Some("uid-pod".into()),
    }
}

#[tokio::test]
async fn a_finished_scrub_is_recorded_then_its_pod_and_claim_deleted_by_uid() {
    for (failed, state, event) in [
        (
            None,
            "scrubbed:uid-temp",
            "Normal Scrubbed: scrub of PV pv-1 succeeded",
        ),
        (
            Some("DeadlineExceeded"),
            "failed:uid-temp",
            "Warning ErrScrubPV: scrub of PV pv-1 failed (DeadlineExceeded)",
        ),
    ] {
        let (result, log, _) = run(&running(), finish(failed), |sent| {
            match sent.method.as_str() {
                "PATCH" => (200, json!({})),
                _ => mock_api::deleted(),
            }
        })
        .await;
        assert!(result.is_ok(), "{state}");
        assert_eq!(
            log.lines(),
            [
                format!("PATCH {PV_PATH}"),
                format!("DELETE {OPS_PODS}/scrub-pv-1"),
                format!("DELETE {OPS_CLAIMS}/scrub-pv-1"),
            ],
            "{state}"
        );
        let sent = log.writes_and_reads();
        assert_eq!(
            sent[0].body,
            json!([
                {"op": "test", "path": record_path(), "value": "running:uid-temp"},
                {"op": "replace", "path": record_path(), "value": state},
            ])
        );
        assert_eq!(sent[1].body["preconditions"]["uid"], "uid-pod", "{state}");
        assert_eq!(sent[2].body["preconditions"]["uid"], "uid-temp", "{state}");
        let events = log.published();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].starts_with(event), "{events:?}");
    }
}

#[tokio::test]
async fn deletions_gone_or_replaced_are_done_and_a_lost_record_deletes_nothing() {
    for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
        let (result, log, _) = run(&running(), finish(None), move |sent| {
            match sent.method.as_str() {
                "PATCH" => (200, json!({})),
                _ => mock_api::status(code, reason, "x"),
            }
        })
        .await;
        assert!(result.is_ok(), "{code} on a delete is done");
        assert_eq!(log.lines().len(), 3, "{code}: both deletions sent");
    }
    for (code, reason) in [(409, "Conflict"), (422, "Invalid"), (404, "NotFound")] {
        let (result, log, _) = run(&running(), finish(None), move |_| {
            mock_api::status(code, reason, "the test op failed")
        })
        .await;
        assert!(result.is_ok(), "{code}");
        assert_eq!(
            log.lines(),
            [format!("PATCH {PV_PATH}")],
            "{code}: nothing deleted"
        );
        assert!(log.published().is_empty(), "{code}: nothing reported");
    }
    let (result, log, _) = run(&running(), finish(None), |sent| {
        match sent.method.as_str() {
            "PATCH" => (200, json!({})),
            _ => mock_api::status(500, "InternalError", "x"),
        }
    })
    .await;
    assert_eq!(category(&result), Some(Category::ServerError));
    assert_eq!(
        log.lines().len(),
        2,
        "the pod's deletion failed: no claim deletion"
    );
}

#[tokio::test]
async fn the_temporary_claim_is_deleted_by_uid() {
    let plan = || Plan::DeleteTemp {
        temp_uid: "uid-temp".into(),
        namespace: "ops".into(),
    };
    let (result, log, _) = run(&running(), plan(), |_| mock_api::deleted()).await;
    assert!(result.is_ok());
    assert_eq!(log.lines(), [format!("DELETE {OPS_CLAIMS}/scrub-pv-1")]);
    assert_eq!(
        log.writes_and_reads()[0].body["preconditions"]["uid"],
        "uid-temp"
    );
    for (code, reason) in [(404, "NotFound"), (409, "Conflict")] {
        let (result, _, _) = run(&running(), plan(), move |_| {
            mock_api::status(code, reason, "x")
        })
        .await;
        assert!(result.is_ok(), "{code}");
    }
    let (result, _, _) = run(&running(), plan(), |_| {
        mock_api::status(403, "Forbidden", "x")
    })
    .await;
    assert_eq!(category(&result), Some(Category::Forbidden));
}

#[tokio::test]
async fn a_blocked_scrub_is_reported_once_per_pv_and_cause() {
    let (client, log) = mock_api::serve(|_| mock_api::status(500, "InternalError", "no writes"));
    let (releaser, metrics) = writer(client, Leadership::always(), false);
    let invalid = |why: &str| Plan::ScrubBlocked(Blocked::InvalidTemplate(why.into()));
    let no_ns = || Plan::ScrubBlocked(Blocked::NoNamespace);
    let one = facts("uid-old", None);
    let mut other = facts("uid-old", None);
    other.name = "pv-2".into();
    other.uid = "uid-pv-2".into();
    let passes = [
        (&one, no_ns(), 1),
        (&one, no_ns(), 1),
        (&one, invalid("no spec"), 2),
        (&one, invalid("no spec"), 2),
        (&other, invalid("no spec"), 3),
        (&one, invalid("no containers"), 4),
        (
            &one,
            Plan::Skip(crate::releaser::decide::Skip::ClaimExists),
            4,
        ),
        // The reporter remembers (PV, cause) for the process's life: the same cause again after a
        // pass that was not blocked publishes nothing new.
        (&one, invalid("no containers"), 4),
    ];
    for (i, (facts, plan, want)) in passes.into_iter().enumerate() {
        let result = releaser.act(&pv(), facts, plan).await;
        assert!(result.is_ok(), "pass {i}");
        assert_eq!(
            log.published().len(),
            want,
            "after pass {i}: {:?}",
            log.published()
        );
    }
    assert!(
        log.lines().is_empty(),
        "nothing but Events: {:?}",
        log.lines()
    );
    let events = log.published();
    assert!(
        events[0].starts_with("Warning ScrubBlocked: PV pv-1: StorageClass pool asks for a scrub before release, but no scrub namespace is known"),
        "{events:?}"
    );
    // The cause is the Event's action, so a new cause is a new Event with its own note, not a
    // series patch of the first one.
    assert!(
        events[1].contains("its scrub template is invalid: no spec;")
            && !events[1].contains("series"),
        "{events:?}"
    );
    assert!(
        events[2].starts_with("Warning ScrubBlocked: PV pv-2: StorageClass pool asks for a scrub before release, but its scrub template is invalid: no spec;"),
        "{events:?}"
    );
    let counted = metrics.encode().lines().any(|l| {
        l.contains("scaledown_events_total{") && l.contains("ScrubBlocked") && l.ends_with(" 4")
    });
    assert!(counted, "{}", metrics.encode());
}

#[tokio::test]
async fn a_process_that_may_not_write_sends_nothing() {
    let plans = || {
        vec![
            release("uid-old"),
            start(),
            create_pod(),
            finish(None),
            Plan::DeleteTemp {
                temp_uid: "uid-temp".into(),
                namespace: "ops".into(),
            },
            Plan::ScrubBlocked(Blocked::NoNamespace),
        ]
    };
    let (client, log) = mock_api::serve(|_| mock_api::status(500, "InternalError", "x"));
    let (standby, _) = writer(client, Leadership::elected(), false);
    for plan in plans() {
        let what = format!("{plan:?}");
        let result = standby.act(&pv(), &running(), plan).await;
        assert_eq!(category(&result), Some(Category::NotLeader), "{what}");
    }
    assert!(log.all().is_empty(), "{:?}", log.lines());

    let (client, log) = mock_api::serve(|_| mock_api::status(500, "InternalError", "x"));
    let (dry, _) = writer(client, Leadership::always(), true);
    for plan in plans().into_iter().take(5) {
        let what = format!("{plan:?}");
        assert!(dry.act(&pv(), &running(), plan).await.is_ok(), "{what}");
    }
    assert!(log.lines().is_empty(), "dry-run wrote: {:?}", log.lines());
    // Each write it would have made is a DryRun Event instead.
    let events = log.events();
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(events.iter().all(|e| e.1 == "DryRun"), "{events:?}");
}
