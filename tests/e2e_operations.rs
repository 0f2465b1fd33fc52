//! Operating the controller: leader election with failover, metrics and probes, SIGTERM.
//! Each test has its own namespace, Lease and controller processes (default election timings:
//! lease 15 s, renew deadline 10 s, retry 2 s).

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use support::fixtures::*;
use support::http_get;
use support::{from_json, wait_for, wait_for_gone, wait_for_pod_phase};

const LEASE_DURATION: Duration = Duration::from_secs(15);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The value of an unlabelled sample, or the sum over the samples of a labelled family.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn election_env(test: &str, pvs: usize) -> (Env, String) {
    let mut env = Env::new(test, pvs, &[]).await;
    env.controller = None; // this test starts its own controllers
    let lease = format!("lease-{}", env.ns.name);
    (env, lease)
}

async fn start_elected(env: &Env, lease: &str, name: &str, extra: &[&str]) -> Controller {
    let mut args = vec![
        "--leader-elect",
        "--leader-election-namespace",
        &env.ns.name,
        "--leader-election-id",
        lease,
    ];
    args.extend_from_slice(extra);
    Controller::start_with_env(&env.cluster, &env.ns.name, &args, &[("POD_NAME", name)]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_one_acts_and_the_other_takes_over() {
    let (env, lease) = election_env("failover", 3).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("25s"));
    let mut a = Some(start_elected(&env, &lease, "replica-a", &[]).await);
    let mut b = Some(start_elected(&env, &lease, "replica-b", &[]).await);
    let leases: Api<Lease> = env.ns.api();
    let leader = support::wait_for_some("a leader", LONG, || async {
        support::lease_holder(&leases, &lease).await
    })
    .await;
    env.create_running(&spec).await;

    env.scale("web", 2).await;
    let cleanup = env.wait_cleanup_pod("web-2").await;
    wait_for_pod_phase(&env.pods(), "web-2", "Running", LONG).await;
    let instances = |events: Vec<Event>| -> BTreeSet<String> {
        events
            .into_iter()
            .filter(|e| {
                e.reporting_controller.as_deref() == Some("statefulset-scaledown-controller")
            })
            .filter_map(|e| e.reporting_instance)
            .collect()
    };
    let events: Api<Event> = env.ns.api();
    let before = instances(
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    );
    assert_eq!(
        before,
        BTreeSet::from([leader.clone()]),
        "only the leader acts"
    );

    // SIGKILL the leader in the middle of the cleanup.
    let (dead, survivor) = if leader == "replica-a" {
        (&mut a, "replica-b")
    } else {
        (&mut b, "replica-a")
    };
    let killed_at = Instant::now();
    if let Some(c) = dead.as_mut() {
        c.kill().await;
    }
    wait_for(
        "the survivor holds the Lease",
        LEASE_DURATION + Duration::from_secs(20),
        || async { support::lease_holder(&leases, &lease).await.as_deref() == Some(survivor) },
    )
    .await;
    let takeover = killed_at.elapsed();
    record(
        "leader SIGKILLed -> other replica holds the Lease",
        format!("{} ms", takeover.as_millis()),
    );
    assert!(
        takeover <= LEASE_DURATION + Duration::from_secs(5),
        "takeover took {takeover:?}, more than lease duration + 5 s"
    );

    // The survivor finishes the cleanup the dead leader started, without a second cleanup pod.
    env.wait_claim_gone("data-web-2").await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    let all: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    let creates: Vec<&Event> = all
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("statefulset-scaledown-controller"))
        .filter(|e| e.reason.as_deref() == Some("SuccessfulCreate"))
        .collect();
    assert_eq!(
        creates.len(),
        1,
        "the cleanup pod {} was created once",
        cleanup.name_any()
    );
    let completed_by: BTreeSet<String> = all
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CleanupSuccess"))
        .filter_map(|e| e.reporting_instance.clone())
        .collect();
    assert_eq!(completed_by, BTreeSet::from([survivor.to_string()]));
}

/// The window in which a scale-up could still meet a released cleanup pod (docs/usage.md, "A
/// scale-up always wins"): from the send of the compare-and-swap that confirmed the set unchanged
/// to the answer to the release, over a Parallel scale-down of ten ordinals. Measured and written
/// down, not bounded: a number of this machine, not a property of the code.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_window_is_measured_per_release() {
    const REPLICAS: i32 = 10;
    let mut env = Env::new("window", REPLICAS as usize, &[]).await;
    let port = free_port();
    let flag = format!("--metrics-bind-address=127.0.0.1:{port}");
    env.controller = Some(Controller::start(&env.cluster, &env.ns.name, &[&flag]).await);
    let mut spec = SetSpec::new("web", REPLICAS, &env.class);
    spec.parallel = true;
    env.create_running(&spec).await;
    env.scale("web", 0).await;
    for n in 0..REPLICAS {
        env.wait_claim_gone(&format!("data-web-{n}")).await;
    }
    let (_, metrics) = http_get(port, "/metrics").await;
    let count = sample(&metrics, "scaledown_release_window_seconds_count");
    assert_eq!(
        count,
        f64::from(REPLICAS),
        "one release per ordinal:\n{metrics}"
    );
    let mean_ms = sample(&metrics, "scaledown_release_window_seconds_sum") / count * 1000.0;
    // The smallest bucket that holds every release.
    let all_within = metrics
        .lines()
        .filter(|l| l.starts_with("scaledown_release_window_seconds_bucket"))
        .find(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(count))
        .and_then(|l| {
            l.split("le=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(str::to_string)
        })
        .unwrap_or_default();
    record(
        "release window (compare-and-swap sent -> release answered), Parallel 10 -> 0",
        format!("mean {mean_ms:.1} ms, all {count} within {all_within} s"),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_and_probes_follow_a_scale_down() {
    let mut env = Env::new("metrics", 5, &[]).await;
    let (metrics_port, probe_port) = (free_port(), free_port());
    let metrics_flag = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
    let probe_flag = format!("--health-probe-bind-address=127.0.0.1:{probe_port}");
    env.controller =
        Some(Controller::start(&env.cluster, &env.ns.name, &[&metrics_flag, &probe_flag]).await);
    wait_for("/readyz 200", LONG, || async {
        http_get(probe_port, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(http_get(probe_port, "/healthz").await.0, 200);

    // A set that did not opt in, scaled down: its claim shows up as an orphan nobody cleans.
    let mut unmanaged = SetSpec::new("plain", 2, &env.class);
    unmanaged.template = None;
    env.create(&unmanaged).await;
    wait_for_pod_phase(&env.pods(), "plain-1", "Running", LONG).await;
    env.scale("plain", 1).await;

    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    let (_, before) = http_get(metrics_port, "/metrics").await;
    env.scale("web", 2).await;
    env.wait_claim_gone("data-web-2").await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    let (status, after) = http_get(metrics_port, "/metrics").await;
    assert_eq!(status, 200);
    let delta = |name: &str| sample(&after, name) - sample(&before, name);
    // One cleanup pod, created once.
    let creates = 1.0;
    assert_eq!(
        delta("scaledown_cleanups_started_total"),
        creates,
        "{after}"
    );
    assert_eq!(delta("scaledown_cleanups_succeeded_total"), 1.0);
    assert_eq!(delta("scaledown_claims_deleted_total"), 1.0);
    assert!(delta("scaledown_reconciles_total") >= 1.0);
    // The passes are counted under the controller that ran them.
    let passes = r#"scaledown_reconciles_total{controller="scaledown"}"#;
    let of_scaledown = |m: &str| {
        m.lines()
            .find(|l| l.starts_with(passes))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        of_scaledown(&after) - of_scaledown(&before) >= 1.0,
        "{after}"
    );
    assert_eq!(delta("scaledown_cleanup_duration_seconds_count"), 1.0);
    // The one release, and the window a scale-up could still meet it in (docs/usage.md).
    assert_eq!(delta("scaledown_release_window_seconds_count"), 1.0);
    let window = delta("scaledown_release_window_seconds_sum");
    assert!(window > 0.0, "{after}");
    record(
        "record (compare-and-swap) sent -> release answered, one cleanup",
        format!("{:.1} ms", window * 1000.0),
    );
    assert_eq!(sample(&after, "scaledown_leader"), 1.0);
    // The client counts what it sends: the cleanup pod creates, and the four watches
    // (sets, pods, cleanup pods, claims) were opened.
    let requests = "scaledown_api_requests_total";
    let pod_creates = [("verb", "create"), ("resource", "pods"), ("code", "201")];
    assert_eq!(
        support::metric_sum(&after, requests, &pod_creates)
            - support::metric_sum(&before, requests, &pod_creates),
        creates,
        "{after}"
    );
    assert!(
        support::metric_sum(&after, requests, &[("verb", "watch")]) >= 4.0,
        "{after}"
    );
    // The gauge follows the cache on the next reconcile after the pod is gone.
    wait_for("cleanups_running back to 0", LONG, || async {
        sample(
            &http_get(metrics_port, "/metrics").await.1,
            "scaledown_cleanups_running",
        ) == 0.0
    })
    .await;
    let orphan_line = format!(
        "scaledown_orphaned_claims{{namespace=\"{}\"}} 1",
        env.ns.name
    );
    wait_for("orphaned claims gauge", LONG, || async {
        http_get(metrics_port, "/metrics")
            .await
            .1
            .lines()
            .any(|l| l == orphan_line)
    })
    .await;

    // Every metric docs/reference.md names is served: its family is declared (a labelled family
    // such as the error counter has samples only once a label value occurred).
    let reference = include_str!("../docs/reference.md");
    let (_, served) = http_get(metrics_port, "/metrics").await;
    for name in reference
        .lines()
        .filter(|l| l.starts_with("| `scaledown_"))
        // The pool of the PV releaser, which this controller does not run, has no samples to show.
        .filter(|l| !l.starts_with("| `scaledown_pv_pool_volumes`"))
        .filter_map(|l| l.split('`').nth(1))
    {
        let family = name.trim_end_matches("_total");
        let declared = format!("# TYPE {family} ");
        assert!(
            served.lines().any(|l| l.starts_with(&declared)),
            "docs/reference.md metric {name} is not in /metrics:\n{served}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_releases_the_lease_and_exits_zero() {
    let (env, lease) = election_env("sigterm", 0).await;
    let mut controller = start_elected(&env, &lease, "replica-term", &["--log-format=json"]).await;
    let leases: Api<Lease> = env.ns.api();
    wait_for("leadership", LONG, || async {
        support::lease_holder(&leases, &lease).await.as_deref() == Some("replica-term")
    })
    .await;
    // Idle memory, once leading with synced caches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = controller.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if let Some(rss) = status.lines().find(|l| l.starts_with("VmRSS:")) {
        record(
            "controller RSS at idle (leader, one namespace)",
            rss.trim_start_matches("VmRSS:").trim().to_string(),
        );
    }

    let sent = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let exit = tokio::time::timeout(Duration::from_secs(5), controller.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no exit within 5 s of SIGTERM:\n{}",
                controller.log_tail(20)
            )
        })
        .expect("wait");
    record(
        "SIGTERM -> exit",
        format!("{} ms", sent.elapsed().as_millis()),
    );
    assert_eq!(
        exit.code(),
        Some(0),
        "exit code after SIGTERM:\n{}",
        controller.log_tail(20)
    );
    assert_eq!(
        support::lease_holder(&leases, &lease).await,
        None,
        "the Lease is released"
    );
    // --log-format json: every line is one JSON object with a level and a message.
    let log = controller.log_tail(10_000);
    assert!(log.lines().count() > 3, "{log}");
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            value.get("level").is_some() && value.get("message").is_some(),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_leader_stops_writing_and_exits_non_zero() {
    let (env, lease) = election_env("frozen-leader", 2).await;
    let mut a = start_elected(&env, &lease, "replica-a", &[]).await;
    let leases: Api<Lease> = env.ns.api();
    wait_for("replica-a leads", LONG, || async {
        support::lease_holder(&leases, &lease).await.as_deref() == Some("replica-a")
    })
    .await;
    // The Lease may name replica-a a moment before replica-a has confirmed it and begun to lead.
    wait_for("replica-a confirms its leadership", LONG, || async {
        a.log_tail(200).contains("became the leader")
    })
    .await;
    let b = start_elected(&env, &lease, "replica-b", &[]).await;

    // Freeze the leader past its lease: it can neither renew nor notice.
    let pid = a.pid().expect("running").to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("kill")
            .success()
    );
    wait_for(
        "replica-b takes over",
        LEASE_DURATION + Duration::from_secs(20),
        || async { support::lease_holder(&leases, &lease).await.as_deref() == Some("replica-b") },
    )
    .await;
    // A scale-down while the old leader is frozen is handled by the new one alone.
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    env.scale("web", 1).await;
    env.wait_cleanup_pod("web-1").await;
    let resumed_at = k8s_openapi::jiff::Timestamp::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .expect("kill")
            .success()
    );

    // On waking it finds its deadline passed and the Lease taken: it exits non-zero, writing nothing.
    let exit = tokio::time::timeout(Duration::from_secs(10), a.child.wait())
        .await
        .unwrap_or_else(|_| panic!("the old leader kept running:\n{}", a.log_tail(20)))
        .expect("wait");
    assert_ne!(exit.code(), Some(0), "{}", a.log_tail(20));
    env.wait_claim_gone("data-web-1").await;
    let events: Api<Event> = env.ns.api();
    let late_from_a = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some("replica-a"))
        .filter(|e| e.event_time.as_ref().is_some_and(|t| t.0 >= resumed_at))
        .count();
    assert_eq!(late_from_a, 0, "the old leader wrote after it woke up");
    drop(b);
}

/// A claim of a finished cleanup that another pod mounts waits for that pod, and the pod's
/// deletion is what wakes the set (issue 25: no polling). The pod is named after no set, and the
/// resync is far out: over a 25 s wait the controller sends at most one live list of pods (the
/// pass its own status write wakes; a recheck every 10 s would send two or more), and the claim
/// goes once the pod is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_in_use_waits_for_its_user_without_polling() {
    let mut env = Env::new("in-use", 3, &[]).await;
    let metrics_port = free_port();
    let metrics_flag = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
    let args = [metrics_flag.as_str(), "--resync-period=10m"];
    env.controller = Some(Controller::start(&env.cluster, &env.ns.name, &args).await);
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    let user: Pod = from_json(serde_json::json!({
        "metadata": {"name": "backup"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}}],
        },
    }));
    env.pods()
        .create(&PostParams::default(), &user)
        .await
        .expect("create the pod that mounts data-web-1");
    wait_for_pod_phase(&env.pods(), "backup", "Running", LONG).await;
    let claims = env.record_claims().await;
    env.scale("web", 1).await;
    env.wait_event("web", "ClaimInUse").await;

    let lists = |metrics: &str| {
        support::metric_sum(
            metrics,
            "scaledown_api_requests_total",
            &[("verb", "list"), ("resource", "pods")],
        )
    };
    let before = lists(&http_get(metrics_port, "/metrics").await.1);
    let ns = env.ns.name.clone();
    let passes = env.controller().reconciles(&ns, "web");
    let early = claims
        .wait_until(Duration::from_secs(25), |s| {
            s.name == "data-web-1" && s.deleting
        })
        .await;
    assert!(early.is_none(), "claim deleted while mounted: {early:?}");
    let listed = lists(&http_get(metrics_port, "/metrics").await.1) - before;
    let passed = env.controller().reconciles(&ns, "web") - passes;
    record(
        "claim in use: live pod lists / passes over a 25 s wait",
        format!("{listed} / {passed}"),
    );
    assert!(
        listed <= 1.0,
        "{listed} live lists of pods, {passed} passes while the claim waited for its user"
    );

    env.pods()
        .delete("backup", &DeleteParams::default())
        .await
        .expect("delete the pod that mounts data-web-1");
    env.wait_claim_gone("data-web-1").await;
    wait_for_gone(&env.pods(), "web-1", LONG).await;
}
