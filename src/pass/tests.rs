//! The runner on a paused clock, over a scripted API server that only takes Events.

use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;

use super::*;
use crate::mock_api;

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}")}}))
        .expect("pv")
}

fn runner() -> (Runner<PersistentVolume>, Arc<Metrics>, mock_api::Log) {
    let (client, log) = mock_api::serve(|_| mock_api::status(500, "InternalError", "unused"));
    let metrics = Arc::new(Metrics::default());
    let identity = kube::runtime::events::Reporter {
        controller: "test".into(),
        instance: None,
    };
    let reporter = Arc::new(Reporter::new(
        Controller::Releaser,
        client,
        identity,
        metrics.clone(),
        false,
    ));
    let runner = Runner::new(
        Controller::Releaser,
        Backoff::default(),
        metrics.clone(),
        reporter,
    );
    (runner, metrics, log)
}

fn forbidden() -> Error {
    let status = kube::core::Status::failure("no", "Forbidden").with_code(403);
    Error::kube("patch persistentvolume", "a")(kube::Error::Api(Box::new(status)))
}

fn sample(metrics: &Metrics, line_start: &str) -> Option<String> {
    let text = metrics.encode();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(str::to_string)
}

#[test]
fn backoff_doubles_to_its_caps() {
    let b = Backoff::default();
    let secs = |n, c| b.after(n, c).as_secs();
    let api: Vec<u64> = (1..=11).map(|n| secs(n, Category::Forbidden)).collect();
    assert_eq!(api, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    let transport: Vec<u64> = (1..=5).map(|n| secs(n, Category::Transport)).collect();
    assert_eq!(transport, [1, 2, 4, 5, 5]);
    assert_eq!(secs(u32::MAX, Category::Forbidden), 300);
}

#[tokio::test(start_paused = true)]
async fn a_failing_object_waits_out_its_backoff_whatever_wakes_it() {
    let (runner, _, _) = runner();
    let calls = AtomicUsize::new(0);
    let failing = || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Err::<Action, _>(forbidden())
    };
    let a = pv("a");
    assert!(runner.run(&a, failing).await.is_err());
    // Woken ten times within the first second: no pass runs, each is told how long to wait.
    for _ in 0..10 {
        let woken = runner.run(&a, failing).await.expect("waits");
        assert!(
            woken == Action::requeue(Duration::from_secs(1)),
            "{woken:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        runner.error_policy(&a),
        Action::requeue(Duration::from_secs(1))
    );
    // Another object is not held back by it.
    assert!(runner.run(&pv("b"), failing).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(runner.run(&a, failing).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The second failure in a row doubles the wait.
    assert_eq!(
        runner.error_policy(&a),
        Action::requeue(Duration::from_secs(2))
    );
}

/// The `scaledown_pass_start_wait_seconds` count and sum now.
fn start_waits(metrics: &Metrics) -> (String, String) {
    let name = "scaledown_pass_start_wait_seconds";
    let count = sample(metrics, &format!("{name}_count")).expect("count");
    let sum = sample(metrics, &format!("{name}_sum")).expect("sum");
    (count, sum)
}

#[tokio::test(start_paused = true)]
async fn a_woken_pass_counts_its_wait_from_the_first_wake_or_the_end_of_the_pass_running() {
    let (runner, metrics, _) = runner();
    let a = pv("a");
    let key = ObjectRef::from_obj(&a);
    // Not woken by a watch event (a requeue): nothing is observed.
    runner
        .run(&a, || async { Ok(Action::await_change()) })
        .await
        .expect("ok");
    assert_eq!(
        start_waits(&metrics).0,
        "scaledown_pass_start_wait_seconds_count 0"
    );
    assert_eq!(
        runner.woken(),
        0,
        "a pass nobody woke is forgotten once it ended"
    );
    // Woken twice; the pass starts 3 s after the first wake.
    runner.woke([&key]);
    tokio::time::advance(Duration::from_secs(1)).await;
    runner.woke([&key]);
    tokio::time::advance(Duration::from_secs(2)).await;
    // Woken again while its pass runs: due only once that pass ends (4 s later).
    let during = async {
        runner.woke([&key]);
        tokio::time::advance(Duration::from_secs(4)).await;
        Ok(Action::await_change())
    };
    runner.run(&a, || during).await.expect("ok");
    assert_eq!(
        start_waits(&metrics),
        (
            "scaledown_pass_start_wait_seconds_count 1".to_string(),
            "scaledown_pass_start_wait_seconds_sum 3.0".to_string()
        )
    );
    assert_eq!(runner.woken(), 1, "woken during its pass: due now");
    tokio::time::advance(Duration::from_millis(500)).await;
    runner
        .run(&a, || async { Ok(Action::await_change()) })
        .await
        .expect("ok");
    assert_eq!(
        start_waits(&metrics),
        (
            "scaledown_pass_start_wait_seconds_count 2".to_string(),
            "scaledown_pass_start_wait_seconds_sum 3.5".to_string()
        )
    );
    assert_eq!(runner.woken(), 0);
    // An object woken and deleted before its pass is forgotten.
    runner.woke([&key]);
    runner.gone(&a);
    assert_eq!(runner.woken(), 0);
}

#[tokio::test(start_paused = true)]
async fn wakes_of_objects_no_pass_ever_started_are_pruned() {
    let (runner, _, _) = runner();
    let keys: Vec<_> = (0..WAKES_PRUNE_AT - 1)
        .map(|i| ObjectRef::from_obj(&pv(&format!("p{i}"))))
        .collect();
    runner.woke(&keys);
    tokio::time::advance(WAKE_STALE + Duration::from_secs(1)).await;
    // The map reaches its bound: the stale wakes go, the new one stays.
    runner.woke([&ObjectRef::from_obj(&pv("new"))]);
    assert_eq!(runner.woken(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_good_pass_forgets_the_failures() {
    let (runner, _, _) = runner();
    let a = pv("a");
    let _ = runner
        .run(&a, || async { Err::<Action, _>(forbidden()) })
        .await;
    assert_eq!(runner.failing(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    let ok = runner
        .run(&a, || async { Ok(Action::await_change()) })
        .await;
    assert!(ok.is_ok());
    assert_eq!(runner.failing(), 0);
}

#[tokio::test(start_paused = true)]
async fn failures_of_gone_objects_are_forgotten() {
    let (runner, _, _) = runner();
    let _ = runner
        .run(&pv("gone"), || async { Err::<Action, _>(forbidden()) })
        .await;
    // Long after its wait ended, another failure sweeps the stale entry out.
    tokio::time::advance(Duration::from_secs(601)).await;
    let _ = runner
        .run(&pv("b"), || async { Err::<Action, _>(forbidden()) })
        .await;
    assert_eq!(runner.failing(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_second_failure_in_a_row_is_reported_once_per_answer() {
    let (runner, metrics, log) = runner();
    let a = pv("a");
    for _ in 0..4 {
        let _ = runner
            .run(&a, || async { Err::<Action, _>(forbidden()) })
            .await;
        tokio::time::advance(Duration::from_secs(301)).await;
    }
    let events = log.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (type_, reason, note) = &events[0];
    assert_eq!(
        (type_.as_str(), reason.as_str()),
        ("Warning", "ReconcileFailed")
    );
    assert!(
        note.starts_with("2 passes in a row failed (forbidden)"),
        "{note}"
    );
    let errors =
        r#"scaledown_reconcile_errors_total{controller="pv-releaser",category="forbidden"}"#;
    assert_eq!(
        sample(&metrics, errors).as_deref(),
        Some(&*format!("{errors} 4"))
    );
    let passes = r#"scaledown_reconciles_total{controller="pv-releaser"}"#;
    assert_eq!(
        sample(&metrics, passes).as_deref(),
        Some(&*format!("{passes} 4"))
    );
    let other = r#"scaledown_reconciles_total{controller="scaledown"}"#;
    assert_eq!(
        sample(&metrics, other).as_deref(),
        Some(&*format!("{other} 0"))
    );
}

#[tokio::test(start_paused = true)]
async fn idle_waits_for_the_running_passes() {
    let (runner, _, _) = runner();
    let runner = Arc::new(runner);
    let (release, held) = tokio::sync::oneshot::channel::<()>();
    let pass = tokio::spawn({
        let runner = runner.clone();
        async move {
            let a = pv("a");
            runner
                .run(&a, || async move {
                    let _ = held.await;
                    Ok(Action::await_change())
                })
                .await
        }
    });
    tokio::task::yield_now().await;
    let idle = tokio::time::timeout(Duration::from_secs(5), runner.idle()).await;
    assert!(idle.is_err(), "idle while a pass runs");
    let _ = release.send(());
    assert!(pass.await.expect("joined").is_ok());
    let idle = tokio::time::timeout(Duration::from_secs(5), runner.idle()).await;
    assert!(idle.is_ok(), "not idle after the pass ended");
}

#[tokio::test(start_paused = true)]
async fn a_pass_parked_on_a_shared_read_gives_its_slot_back() {
    let (runner, _, _) = runner();
    let runner = Arc::new(runner.with_slots(1));
    let (open_read, read) = tokio::sync::oneshot::channel::<()>();
    let (a_parked, parked_now) = tokio::sync::oneshot::channel::<()>();
    let order = Arc::new(Mutex::new(Vec::new()));
    let a = {
        let (runner, order) = (runner.clone(), order.clone());
        tokio::spawn(async move {
            let pass = async {
                let _ = a_parked.send(());
                parked(read).await.expect("the read opens");
                order.lock().expect("order").push("a after its read");
                Ok(Action::await_change())
            };
            runner.run(&pv("a"), || pass).await
        })
    };
    parked_now.await.expect("a parks");
    // The only slot is free while a waits: b runs to its end meanwhile.
    let b = async {
        order.lock().expect("order").push("b");
        Ok(Action::await_change())
    };
    tokio::time::timeout(Duration::from_secs(5), runner.run(&pv("b"), || b))
        .await
        .expect("b is not held back by the parked pass")
        .expect("b ran");
    open_read.send(()).expect("a waits");
    a.await.expect("joined").expect("a ran");
    assert_eq!(*order.lock().expect("order"), ["b", "a after its read"]);
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_does_not_park_keeps_its_slot() {
    let (runner, _, _) = runner();
    let runner = Arc::new(runner.with_slots(1));
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let (a_started, started) = tokio::sync::oneshot::channel::<()>();
    let a = {
        let runner = runner.clone();
        tokio::spawn(async move {
            let pass = async {
                let _ = a_started.send(());
                gate.await.expect("opens");
                Ok(Action::await_change())
            };
            runner.run(&pv("a"), || pass).await
        })
    };
    started.await.expect("a runs");
    let b = tokio::spawn({
        let runner = runner.clone();
        async move {
            runner
                .run(&pv("b"), || async { Ok(Action::await_change()) })
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!b.is_finished(), "b waits for the only slot");
    open.send(()).expect("a waits");
    a.await.expect("joined").expect("a ran");
    b.await.expect("joined").expect("b ran after a");
}
