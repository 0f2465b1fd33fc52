//! End-to-end tests of the controller on the local control plane: the real StatefulSet controller,
//! garbage collector, PV binder and pvc-protection, with KWOK standing in for kubelets. Every test
//! has its own namespace and runs its own controller process, limited to that namespace.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::json;
use support::fixtures::*;
use support::{Cluster, Reclaim, from_json, wait_for, wait_for_gone, wait_for_pod_phase};

// === scale-down ===

#[tokio::test(flavor = "multi_thread")]
async fn basic_scale_down_3_to_2() {
    let env = Env::new("basic", 3, &[]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    let kept = [
        env.claim_uid("data-web-0").await,
        env.claim_uid("data-web-1").await,
    ];
    let mut pod_uids = Vec::new();
    for name in ["web-0", "web-1"] {
        pod_uids.push(env.pods().get(name).await);
    }

    env.scale("web", 2).await;
    // Measure from the stateful pod's disappearance to the cleanup pod's creation.
    let pods = env.pods();
    let mut gone_at = None;
    let deadline = Instant::now() + LONG;
    let cleanup = loop {
        assert!(
            Instant::now() < deadline,
            "no cleanup pod web-2 within {LONG:?}"
        );
        match pods.get_opt("web-2").await.expect("get pod") {
            None => {
                gone_at.get_or_insert_with(Instant::now);
            }
            Some(p) if is_cleanup(&p) => break p,
            Some(p) => assert!(
                gone_at.is_none(),
                "stateful pod web-2 came back: {:?}",
                p.metadata.owner_references
            ),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    if let Some(gone_at) = gone_at {
        record(
            "basic 3->2: stateful pod gone -> cleanup pod created",
            format!("{} ms", gone_at.elapsed().as_millis()),
        );
    }
    assert_eq!(
        cleanup.labels().get("scaledown-pod").map(String::as_str),
        Some("web-2")
    );
    assert_eq!(
        cleanup.labels().get("app").map(String::as_str),
        Some("cleanup")
    );
    assert_eq!(
        cleanup.annotations().get(OWNER).map(String::as_str),
        Some("web")
    );
    assert!(
        cleanup.owner_references().is_empty(),
        "no ownerReference to the set"
    );
    let spec = cleanup.spec.as_ref().expect("spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "data")
        .expect("data volume");
    assert_eq!(
        volume
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("data-web-2")
    );
    let env_vars: Vec<(String, String)> = spec.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    for (k, v) in [
        ("SCALEDOWN_STATEFULSET", "web"),
        ("SCALEDOWN_NAMESPACE", env.ns.name.as_str()),
        ("SCALEDOWN_ORDINAL", "2"),
        ("SCALEDOWN_REPLICAS", "2"),
    ] {
        assert!(
            env_vars.contains(&(k.to_string(), v.to_string())),
            "env {k}={v} in {env_vars:?}"
        );
    }

    env.wait_claim_gone("data-web-2").await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    assert_eq!(
        [
            env.claim_uid("data-web-0").await,
            env.claim_uid("data-web-1").await
        ],
        kept,
        "claims 0 and 1 untouched"
    );
    for (name, before) in ["web-0", "web-1"].iter().zip(pod_uids) {
        let before = before.expect("pod before");
        assert_eq!(
            env.pods().get(name).await.expect("pod after").uid(),
            before.uid(),
            "{name} untouched"
        );
    }
    for reason in ["SuccessfulCreate", "CleanupSuccess", "SuccessfulDelete"] {
        env.wait_event("web", reason).await;
    }
    // The controller's stderr is a file here, not a terminal: text logs without colour codes.
    let log = env.controller.as_ref().expect("controller").log_text();
    assert!(log.contains("pass done"), "the log has lines: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log file:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn waits_for_a_slow_terminating_pod() {
    let env = Env::new("slow-pod", 3, &["--resync-period", "2s"]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    env.hold_pod("web-2", true).await;
    let pods = env.record_pods().await;
    env.scale("web", 2).await;
    pods.wait_for("web-2 terminating", LONG, |s| {
        s.name == "web-2" && s.deleting
    })
    .await;
    // The window: the controller looks at the set twice while web-2 terminates.
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 2).await;
    let early = pods.matching(|s| s.name == "web-2" && s.annotations.contains_key(OWNER));
    assert!(
        early.is_empty(),
        "no cleanup pod while the stateful pod terminates: {:?}",
        early.iter().map(|s| &s.uid).collect::<Vec<_>>()
    );
    env.hold_pod("web-2", false).await;
    env.wait_cleanup_pod("web-2").await;
    env.wait_claim_gone("data-web-2").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_to_zero() {
    let env = Env::new("zero", 1, &[]).await;
    env.create_running(&SetSpec::new("web", 1, &env.class))
        .await;
    env.scale("web", 0).await;
    env.wait_cleanup_pod("web-0").await;
    env.wait_claim_gone("data-web-0").await;
    wait_for_gone(&env.pods(), "web-0", LONG).await;
}

/// `--max-concurrent-cleanups 1` with three sets scaled down at once: the cap holds across sets
/// (they are reconciled in parallel, without a lock around their passes), and all three finish.
#[tokio::test(flavor = "multi_thread")]
async fn max_concurrent_cleanups_holds_across_sets() {
    let env = Env::new("cap", 6, &["--max-concurrent-cleanups", "1"]).await;
    let names = ["a", "b", "c"];
    for name in names {
        let mut spec = SetSpec::new(name, 2, &env.class);
        spec.template = Some(template_running_for("2s"));
        env.create_running(&spec).await;
    }
    let pods = env.record_pods().await;
    for name in names {
        env.scale(name, 1).await;
    }
    for name in names {
        env.wait_claim_gone(&format!("data-{name}-1")).await;
    }
    // Replay the recording: cleanup pods in flight (seen, not finished, not gone) at every change.
    let mut in_flight = std::collections::BTreeSet::new();
    let (mut most, mut cleanups) = (0, std::collections::BTreeSet::new());
    for seen in pods
        .seen()
        .iter()
        .filter(|s| s.annotations.contains_key(OWNER))
    {
        let finished = matches!(
            support::recorder::phase(&seen.object),
            "Succeeded" | "Failed"
        );
        if seen.gone() || finished {
            in_flight.remove(&seen.uid);
        } else {
            in_flight.insert(seen.uid.clone());
        }
        cleanups.insert(seen.uid.clone());
        most = most.max(in_flight.len());
    }
    assert_eq!(cleanups.len(), 3, "one cleanup pod per set");
    assert_eq!(most, 1, "cleanup pods in flight at once with a cap of 1");
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_5_to_2_cleans_all_at_once() {
    let env = Env::new("parallel", 5, &[]).await;
    let mut spec = SetSpec::new("web", 5, &env.class);
    spec.parallel = true;
    spec.template = Some(template_running_for("6s"));
    env.create_running(&spec).await;
    env.scale("web", 2).await;
    let pods = env.pods();
    wait_for("three cleanup pods at once", LONG, || async {
        cleanup_pods(&pods).await.len() == 3
    })
    .await;
    for n in 2..5 {
        env.wait_claim_gone(&format!("data-web-{n}")).await;
    }
    assert!(env.claim_uid("data-web-1").await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn ordered_4_to_1_one_cleanup_at_a_time() {
    let env = Env::new("ordered", 4, &[]).await;
    env.create_running(&SetSpec::new("web", 4, &env.class))
        .await;
    let pods = env.record_pods().await;
    env.scale("web", 1).await;
    for n in (1..4).rev() {
        env.wait_claim_gone(&format!("data-web-{n}")).await;
    }
    let last = pods
        .uids_of("web-1")
        .into_iter()
        .find(|uid| {
            pods.first(|s| s.uid == *uid && s.annotations.contains_key(OWNER))
                .is_some()
        })
        .expect("a cleanup pod web-1");
    pods.wait_for("cleanup pod web-1 to be gone", LONG, |s| {
        s.uid == last && s.gone()
    })
    .await;
    // Everything the pod watch saw, in order: at most one cleanup pod existed at any moment.
    let mut alive: Vec<String> = Vec::new();
    let mut order: Vec<String> = Vec::new();
    for s in pods.matching(|s| s.annotations.contains_key(OWNER)) {
        if s.gone() {
            alive.retain(|uid| *uid != s.uid);
        } else if !alive.contains(&s.uid) {
            alive.push(s.uid.clone());
            order.push(s.name.clone());
        }
        assert!(
            alive.len() <= 1,
            "more than one cleanup pod at once when {} appeared: {alive:?}",
            s.name
        );
    }
    assert_eq!(order, ["web-3", "web-2", "web-1"], "highest ordinal first");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_claim_templates() {
    let env = Env::new("two-templates", 4, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.claim_templates = &["data", "logs"];
    env.create_running(&spec).await;
    env.scale("web", 1).await;
    let pod = env.wait_cleanup_pod("web-1").await;
    let volumes: Vec<(String, Option<String>)> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| {
            (
                v.name.clone(),
                v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone()),
            )
        })
        .collect();
    assert!(
        volumes.contains(&("data".into(), Some("data-web-1".into()))),
        "{volumes:?}"
    );
    assert!(
        volumes.contains(&("logs".into(), Some("logs-web-1".into()))),
        "{volumes:?}"
    );
    env.wait_claim_gone("data-web-1").await;
    env.wait_claim_gone("logs-web-1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_missing_for_one_template() {
    let env = Env::new("missing-claim", 4, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.claim_templates = &["data", "logs"];
    env.create_running(&spec).await;
    env.hold_pod("web-1", true).await;
    env.scale("web", 1).await;
    // While web-1 terminates, somebody deletes logs-web-1 (pvc-protection holds it until web-1 goes).
    env.claims()
        .delete("logs-web-1", &DeleteParams::default())
        .await
        .expect("delete claim");
    env.hold_pod("web-1", false).await;
    let pod = env.wait_cleanup_pod("web-1").await;
    let logs = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == "logs")
        .expect("logs volume");
    assert!(
        logs.empty_dir.is_some(),
        "a missing claim is replaced by an empty directory: {logs:?}"
    );
    env.wait_event("web", "ClaimMissing").await;
    env.wait_claim_gone("data-web-1").await;
    wait_for_gone(&env.pods(), "web-1", LONG).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_above_the_replica_count_that_never_had_a_pod() {
    let env = Env::new("pre-existing", 3, &[]).await;
    let claim: PersistentVolumeClaim = from_json(json!({"metadata": {"name": "data-web-5"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.class, "resources": {"requests": {"storage": "1Gi"}}}}));
    env.claims()
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    env.wait_cleanup_pod("web-5").await;
    env.wait_claim_gone("data-web-5").await;
    assert!(env.claim_uid("data-web-1").await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn start_ordinal() {
    let env = Env::new("start-ordinal", 3, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.start = Some(5);
    env.create_running(&spec).await;
    env.scale("web", 2).await;
    env.wait_cleanup_pod("web-7").await;
    env.wait_claim_gone("data-web-7").await;
    assert!(
        env.claim_uid("data-web-5").await.is_some() && env.claim_uid("data-web-6").await.is_some()
    );
    assert!(cleanup_pods(&env.pods()).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sets_sharing_a_name_prefix() {
    let env = Env::new("prefixes", 5, &[]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    env.create_running(&SetSpec::new("web-2", 2, &env.class))
        .await;
    let other = [
        env.claim_uid("data-web-2-0").await,
        env.claim_uid("data-web-2-1").await,
    ];
    env.scale("web", 2).await;
    env.wait_claim_gone("data-web-2").await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    assert_eq!(
        [
            env.claim_uid("data-web-2-0").await,
            env.claim_uid("data-web-2-1").await
        ],
        other
    );
    env.pods().get("web-2-0").await.expect("web-2-0 untouched");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_template_error_is_a_warning_and_no_pod() {
    let env = Env::new("template-errors", 12, &["--resync-period", "2s"]).await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let cases: Vec<(&str, String, &str)> = vec![
        ("bad-json", "{not json".into(), "CleanupTemplateInvalid"),
        ("not-a-pod", r#"{"spec":{"containers":"nope"}}"#.into(), "CleanupTemplateInvalid"),
        ("always", template(json!({}), json!({}), "Always"), "CleanupTemplateRestartPolicy"),
        ("selector", template(json!({"app": "selector"}), json!({}), ""), "CleanupTemplateSelectorOverlap"),
        (
            "clash",
            r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#.into(),
            "CleanupTemplateVolumeClash",
        ),
        ("rejected", r#"{"spec":{"containers":[{"name":"Bad_Name","image":"x"}]}}"#.into(), "CleanupPodRejected"),
    ];
    for (name, raw, _) in &cases {
        let mut spec = SetSpec::new(name, 2, &env.class);
        spec.template = Some(raw.clone());
        env.create_running(&spec).await;
        env.scale(name, 1).await;
    }
    for (name, _, reason) in &cases {
        env.wait_event(name, reason).await;
    }
    // The window: until every set was looked at twice more after its warning.
    let controller = env.controller.as_ref().expect("controller");
    for (name, _, _) in &cases {
        controller.wait_reconciles(&env.ns.name, name, 2).await;
    }
    let created = pods.matching(|s| s.annotations.contains_key(OWNER));
    assert!(
        created.is_empty(),
        "no cleanup pod for a bad template: {:?}",
        created.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for (name, _, reason) in &cases {
        let claim = format!("data-{name}-1");
        assert!(
            claims.first(|s| s.name == claim && s.deleting).is_none(),
            "{name}: claim kept"
        );
        let count = env
            .event_reasons(name)
            .await
            .iter()
            .filter(|r| r == reason)
            .count();
        assert_eq!(count, 1, "{name}: one {reason} event");
    }
    // Fixing the annotation re-evaluates it.
    let fix = json!({"metadata": {"annotations": {"statefulsets.kubernetes.io/scaledown-pod-template": ok_template()}}});
    env.sets()
        .patch("always", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .expect("fix template");
    env.wait_claim_gone("data-always-1").await;
}

// === failure and user interference ===

#[tokio::test(flavor = "multi_thread")]
async fn failing_cleanup_is_retried_then_given_up() {
    let env = Env::new(
        "failing",
        2,
        &["--cleanup-attempts", "2", "--resync-period", "2s"],
    )
    .await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(failing_template());
    env.create_running(&spec).await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    env.scale("web", 1).await;
    env.wait_event("web", "CleanupFailed").await;
    env.wait_event("web", "CleanupGaveUp").await;
    let pod = env.pods().get("web-1").await.expect("failed pod kept");
    assert_eq!(
        pod.annotations()
            .get("statefulsets.kubernetes.io/scaledown-attempt")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(support::pod_phase(&pod), Some("Failed"));
    // The window: the controller looks at the set twice more after giving up.
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 2).await;
    assert!(
        claims.first(|s| s.deleting).is_none(),
        "claims kept after a failure"
    );
    let kept = pod.uid().expect("uid");
    // Cleanup pods that ran: a fresh one that KWOK or the StatefulSet controller deleted by name
    // before it was released never ran and was no attempt.
    let cleanup_uids: Vec<String> = pods
        .uids_of("web-1")
        .into_iter()
        .filter(|uid| {
            pods.first(|s| {
                s.uid == *uid
                    && s.annotations.contains_key(OWNER)
                    && support::recorder::ran(&s.object)
            })
            .is_some()
        })
        .collect();
    assert_eq!(
        cleanup_uids.last(),
        Some(&kept),
        "no further attempt after giving up: {cleanup_uids:?}"
    );
    assert_eq!(cleanup_uids.len(), 2, "two attempts: {cleanup_uids:?}");
    assert!(pods.deletion_of(&kept).is_none(), "the given-up pod stays");
    // Deleting the given-up pod starts a fresh series.
    env.ns.allow_more_cleanup_creates(
        "web",
        1,
        "the test deletes the given-up pod web-1, which starts a fresh series at attempt 1",
    );
    env.pods()
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("delete failed pod");
    let pods = env.pods();
    let old = pod.uid();
    let fresh = support::wait_for_some("fresh cleanup pod", LONG, || async {
        pods.get_opt("web-1")
            .await
            .ok()
            .flatten()
            .filter(|p| is_cleanup(p) && p.uid() != old)
    })
    .await;
    assert_eq!(
        fresh
            .annotations()
            .get("statefulsets.kubernetes.io/scaledown-attempt")
            .map(String::as_str),
        Some("1")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cleanup_pod_deleted_by_a_user_is_recreated() {
    let env = Env::new("user-delete", 2, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(template(
        json!({"sim.scaledown.io/outcome": "Running"}),
        json!({}),
        "",
    ));
    env.create_running(&spec).await;
    env.ns.allow_more_cleanup_creates(
        "web",
        1,
        "the test deletes the running cleanup pod web-1 once; its attempt starts over",
    );
    env.scale("web", 1).await;
    let first = env.wait_cleanup_pod("web-1").await;
    env.pods()
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("delete cleanup pod");
    let pods = env.pods();
    let old = first.uid();
    support::wait_for_some("recreated cleanup pod", LONG, || async {
        pods.get_opt("web-1")
            .await
            .ok()
            .flatten()
            .filter(|p| is_cleanup(p) && p.uid() != old)
    })
    .await;
    assert!(env.claim_uid("data-web-1").await.is_some());
}

/// A released cleanup pod that cannot be scheduled (its template's nodeSelector matches no node)
/// and whose claim is then deleted by a user can never start: the controller deletes it
/// (`CleanupCancelled`) instead of keeping the ordinal's name forever. The same state followed a
/// failover in `make chaos` (seed 20261128), where the new leader's claim cache lagged.
#[tokio::test(flavor = "multi_thread")]
async fn an_unscheduled_cleanup_pod_whose_claim_is_deleted_goes() {
    let env = Env::new("claim-gone", 2, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    let mut unschedulable: serde_json::Value =
        serde_json::from_str(&ok_template()).expect("template");
    unschedulable["spec"]["nodeSelector"] = json!({"scaledown.test/nowhere": "true"});
    spec.template = Some(unschedulable.to_string());
    env.create_running(&spec).await;
    let pods = env.record_pods().await;
    env.scale("web", 1).await;
    // Returned once released (ungated).
    let cleanup = env.wait_cleanup_pod("web-1").await;
    env.claims()
        .delete("data-web-1", &DeleteParams::default())
        .await
        .expect("delete claim data-web-1");
    let uid = cleanup.uid().unwrap_or_default();
    let gone = pods
        .wait_for("cleanup pod web-1 deleted", LONG, |s| {
            s.uid == uid && s.deleting
        })
        .await;
    assert_eq!(gone.name, "web-1");
    env.wait_event("web", "CleanupCancelled").await;
    env.wait_claim_gone("data-web-1").await;
    wait_for_gone(&env.pods(), "web-1", LONG).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_up_during_cleanup() {
    let env = Env::new("scale-up-during", 4, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("8s"));
    env.create_running(&spec).await;
    let old_claim = env.claim_uid("data-web-2").await;
    env.scale("web", 2).await;
    let cleanup = env.wait_cleanup_pod("web-2").await;
    wait_for_pod_phase(&env.pods(), "web-2", "Running", LONG).await;
    env.scale("web", 3).await;
    env.wait_event("web", "ScaledUpDuringCleanup").await;
    // Safety contract: a claim is deleted only if a read of the set made after the cleanup
    // succeeded still shows the ordinal orphaned. It does not, so the claim is kept and the
    // StatefulSet recreates web-2 on it once the cleanup pod is gone.
    let pods = env.pods();
    let stateful = support::wait_for_some("stateful web-2 again", LONG, || async {
        pods.get_opt("web-2")
            .await
            .ok()
            .flatten()
            .filter(|p| !is_cleanup(p))
    })
    .await;
    assert_ne!(stateful.uid(), cleanup.uid());
    wait_for_pod_phase(&env.pods(), "web-2", "Running", LONG).await;
    let claim = env.claim_uid("data-web-2").await;
    assert!(
        claim.is_some() && claim == old_claim,
        "the claim of the wanted ordinal is kept: {old_claim:?} -> {claim:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_up_before_the_cleanup_pod_is_created() {
    let env = Env::new("scale-up-before", 3, &["--resync-period", "2s"]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    let claim = env.claim_uid("data-web-2").await;
    let pods = env.record_pods().await;
    env.hold_pod("web-2", true).await;
    env.scale("web", 2).await;
    wait_for("web-2 terminating", LONG, || async {
        env.pods()
            .get("web-2")
            .await
            .map(|p| p.metadata.deletion_timestamp.is_some())
            .unwrap_or(false)
    })
    .await;
    env.scale("web", 3).await;
    let old = pods
        .uids_of("web-2")
        .into_iter()
        .next()
        .expect("web-2 seen");
    env.hold_pod("web-2", false).await;
    // The window: until the StatefulSet's new web-2 runs and the controller looked twice more.
    pods.wait_for("a new stateful web-2 running", LONG, |s| {
        s.name == "web-2"
            && s.uid != old
            && !s.annotations.contains_key(OWNER)
            && support::recorder::phase(&s.object) == "Running"
    })
    .await;
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 2).await;
    let created = pods.matching(|s| s.name == "web-2" && s.annotations.contains_key(OWNER));
    assert!(
        created.is_empty(),
        "a cleanup pod was created for an ordinal that is wanted again: {:?}",
        created.iter().map(|s| &s.uid).collect::<Vec<_>>()
    );
    assert_eq!(
        env.claim_uid("data-web-2").await,
        claim,
        "the original claim, data and all"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_killed_while_a_cleanup_runs() {
    let mut env = Env::new("kill-running", 2, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(template_running_for("6s"));
    env.create_running(&spec).await;
    env.scale("web", 1).await;
    let pod = env.wait_cleanup_pod("web-1").await;
    env.controller().kill().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.controller = Some(Controller::start(&env.cluster, &env.ns.name, &[]).await);
    env.wait_claim_gone("data-web-1").await;
    wait_for_gone(&env.pods(), "web-1", LONG).await;
    let creates = env
        .event_reasons("web")
        .await
        .iter()
        .filter(|r| *r == "SuccessfulCreate")
        .count();
    assert_eq!(
        creates,
        1,
        "the running cleanup pod {} was neither duplicated nor recreated",
        pod.name_any()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_killed_while_completing() {
    let mut env = Env::new("kill-completing", 3, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(template_running_for("3s"));
    env.create_running(&spec).await;
    env.scale("web", 1).await;
    env.wait_cleanup_pod("web-1").await;
    env.controller().kill().await;
    wait_for_pod_phase(&env.pods(), "web-1", "Succeeded", LONG).await;
    // The crash happened between the two deletes: the claim is being deleted (pvc-protection keeps
    // it while the Succeeded pod exists), the pod is still there.
    env.claims()
        .delete("data-web-1", &DeleteParams::default())
        .await
        .expect("delete claim");
    env.controller = Some(Controller::start(&env.cluster, &env.ns.name, &[]).await);
    wait_for_gone(&env.pods(), "web-1", LONG).await;
    env.wait_claim_gone("data-web-1").await;
    env.scale("web", 2).await;
    wait_for_pod_phase(&env.pods(), "web-1", "Running", LONG).await;
}

// === StatefulSet deletion ===

async fn delete_set_and_wait(env: &Env, set: &str, policy: PropagationPolicy) {
    let params = DeleteParams {
        propagation_policy: Some(policy),
        ..Default::default()
    };
    env.sets()
        .delete(set, &params)
        .await
        .expect("delete statefulset");
    wait_for_gone(&env.sets(), set, Duration::from_secs(180)).await;
}

async fn assert_all_cleaned(env: &Env) {
    let pods = env.pods();
    wait_for("no pods left", LONG, || async {
        pods.list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
    })
    .await;
    let claims = env.claims();
    wait_for("no claims left", LONG, || async {
        claims
            .list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
    })
    .await;
}

/// Deleting the set cleans every ordinal, then the finalizer goes and nothing is left.
async fn deletion_cleans_everything(test: &str, policy: PropagationPolicy) {
    let env = Env::new(test, 3, &[]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    delete_set_and_wait(&env, "web", policy).await;
    assert_all_cleaned(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_with_foreground_propagation() {
    deletion_cleans_everything("delete-foreground", PropagationPolicy::Foreground).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_with_background_propagation() {
    deletion_cleans_everything("delete-background", PropagationPolicy::Background).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_with_orphan_propagation() {
    let env = Env::new("delete-orphan", 3, &[]).await;
    env.create_running(&SetSpec::new("web", 3, &env.class))
        .await;
    let claims = [
        env.claim_uid("data-web-0").await,
        env.claim_uid("data-web-2").await,
    ];
    delete_set_and_wait(&env, "web", PropagationPolicy::Orphan).await;
    for n in 0..3 {
        let pod = env
            .pods()
            .get(&format!("web-{n}"))
            .await
            .expect("pods are kept");
        assert!(!is_cleanup(&pod));
    }
    assert_eq!(
        [
            env.claim_uid("data-web-0").await,
            env.claim_uid("data-web-2").await
        ],
        claims,
        "claims kept"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_while_a_cleanup_runs() {
    let env = Env::new("delete-during", 3, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("6s"));
    env.create_running(&spec).await;
    env.scale("web", 2).await;
    env.wait_cleanup_pod("web-2").await;
    delete_set_and_wait(&env, "web", PropagationPolicy::Background).await;
    assert_all_cleaned(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_the_annotation_removes_the_finalizer() {
    let env = Env::new("annotation-removed", 2, &[]).await;
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    let patch = json!({"metadata": {"annotations": {"statefulsets.kubernetes.io/scaledown-pod-template": null}}});
    env.sets()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("remove annotation");
    env.wait_finalizer("web", false).await;
    delete_set_and_wait(&env, "web", PropagationPolicy::Background).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn when_scaled_delete_is_left_to_kubernetes() {
    let env = Env::new("when-scaled", 3, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.extra_spec = json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"}});
    env.create_running(&spec).await;
    env.scale("web", 2).await;
    env.wait_event("web", "RetentionPolicyConflict").await;
    // Kubernetes itself deletes the claim; we never run a cleanup pod for it.
    env.wait_claim_gone("data-web-2").await;
    assert!(
        env.event_reasons("web")
            .await
            .iter()
            .all(|r| r != "SuccessfulCreate")
    );
}

// === running it ===

/// The controller of one namespace cleans its own scale-down while a scale-down in another
/// namespace happens at the same time; everything the other namespace's watches saw shows that it
/// was never touched.
#[tokio::test(flavor = "multi_thread")]
async fn namespace_mode_leaves_other_namespaces_alone() {
    let env = Env::new("ns-mode", 2, &["--resync-period", "2s"]).await;
    let other = env.cluster.namespace("ns-mode-other").await;
    let class = other
        .create_static_pvs("pv", 2, Reclaim::Retain)
        .await
        .class;
    let other = Env {
        cluster: Cluster::connect().await,
        ns: other,
        class,
        controller: None,
    };
    let other_sets = other.record_sets().await;
    let other_pods = other.record_pods().await;
    let other_claims = other.record_claims().await;
    let other_events = other.record_events().await;
    other.create(&SetSpec::new("web", 2, &other.class)).await;
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    wait_for_pod_phase(&other.pods(), "web-1", "Running", LONG).await;
    other.scale("web", 1).await;
    env.scale("web", 1).await;
    wait_for_gone(&other.pods(), "web-1", LONG).await;
    // The controller demonstrably works meanwhile: it cleans its own namespace's scale-down,
    // then looks at its set twice more.
    env.wait_claim_gone("data-web-1").await;
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 2).await;

    assert!(
        other_sets
            .first(|s| s.object.finalizers().iter().any(|f| f == FINALIZER))
            .is_none(),
        "our finalizer was put on a set outside the namespace"
    );
    let touched = other_pods.matching(|s| s.annotations.contains_key(OWNER));
    assert!(
        touched.is_empty(),
        "cleanup pods outside the namespace: {:?}",
        touched.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(
        other_claims.first(|s| s.deleting).is_none(),
        "a claim outside the namespace was deleted"
    );
    assert!(
        other_events.latest_events().is_empty(),
        "our Events outside the namespace:\n{}",
        other_events.describe()
    );
    assert!(other_claims.uids_of("data-web-1").len() == 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_writes_nothing() {
    let env = Env::new("dry-run", 3, &["--dry-run", "--resync-period", "2s"]).await;
    let sets = env.record_sets().await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    env.create_pods_running(&SetSpec::new("web", 3, &env.class))
        .await;
    env.scale("web", 2).await;
    wait_for_gone(&env.pods(), "web-2", LONG).await;
    env.wait_event("web", "DryRun").await;
    // The window: the controller looks at the scaled-down set twice more.
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 2).await;
    assert!(
        sets.first(|s| s.object.finalizers().iter().any(|f| f == FINALIZER))
            .is_none(),
        "no finalizer in dry-run"
    );
    assert!(
        pods.first(|s| s.annotations.contains_key(OWNER)).is_none(),
        "no cleanup pod in dry-run"
    );
    assert!(
        claims.first(|s| s.deleting).is_none(),
        "no claim deleted in dry-run"
    );
}

// === status and pause ===

const STATUS: &str = "statefulsets.kubernetes.io/scaledown-status";
const STATUS_REASON: &str = "statefulsets.kubernetes.io/scaledown-status-reason";
const PAUSED: &str = "statefulsets.kubernetes.io/scaledown-paused";

/// `kubectl wait` on the set's status annotation, as the README shows it; whether it succeeded.
async fn kubectl_wait_status(env: &Env, set: &str, status: &str, timeout: &str) -> bool {
    let jsonpath = format!(
        "jsonpath={{.metadata.annotations.statefulsets\\.kubernetes\\.io/scaledown-status}}={status}"
    );
    let out = tokio::process::Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(&env.cluster.kubeconfig)
        .args(["-n", &env.ns.name, "wait", &format!("sts/{set}")])
        .arg(format!("--for={jsonpath}"))
        .arg(format!("--timeout={timeout}"))
        .output()
        .await
        .expect("run kubectl wait");
    out.status.success()
}

fn status_of(set: &k8s_openapi::api::apps::v1::StatefulSet) -> (Option<&str>, Option<&str>) {
    let a = set.annotations();
    (
        a.get(STATUS).map(String::as_str),
        a.get(STATUS_REASON).map(String::as_str),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_wait_for_idle_after_a_scale_down() {
    let env = Env::new("status-idle", 3, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("1s"));
    env.create_running(&spec).await;
    assert!(
        kubectl_wait_status(&env, "web", "Idle", "60s").await,
        "a new set is Idle"
    );
    let sets = env.record_sets().await;
    env.scale("web", 2).await;
    let scaled = Instant::now();
    sets.wait_for("status CleaningUp", LONG, |s| {
        s.annotations.get(STATUS).map(String::as_str) == Some("CleaningUp")
    })
    .await;
    assert!(
        kubectl_wait_status(&env, "web", "Idle", "120s").await,
        "kubectl wait for Idle"
    );
    record(
        "status: scale 3->2 -> kubectl wait ...=Idle returned",
        format!("{} ms", scaled.elapsed().as_millis()),
    );
    assert!(
        env.claim_uid("data-web-2").await.is_none(),
        "Idle means the claim is gone"
    );
    let statuses: Vec<(Option<String>, Option<String>)> = sets
        .seen()
        .iter()
        .map(|s| {
            let (status, reason) = status_of(&s.object);
            (status.map(str::to_string), reason.map(str::to_string))
        })
        .collect();
    let mut transitions = statuses.clone();
    transitions.dedup();
    assert_eq!(
        transitions,
        [
            (Some("Idle".into()), None),
            (Some("CleaningUp".into()), None),
            (Some("Idle".into()), None)
        ],
        "one transition each way, no reason: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cleanup_that_gives_up_stalls_the_set_with_its_reason() {
    let env = Env::new(
        "status-stalled",
        2,
        &["--cleanup-attempts", "2", "--cleanup-backoff", "1s"],
    )
    .await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(failing_template());
    env.create_running(&spec).await;
    let sets = env.record_sets().await;
    let scaled = Instant::now();
    env.scale("web", 1).await;
    let stalled = sets
        .wait_for("status Stalled", LONG, |s| {
            status_of(&s.object).0 == Some("Stalled")
        })
        .await;
    record(
        "status: scale 2->1, failing cleanup (2 attempts, 1 s backoff) -> Stalled",
        format!("{} ms", scaled.elapsed().as_millis()),
    );
    assert_eq!(
        status_of(&stalled.object).1,
        Some("CleanupFailed: ordinal 1 gave up after 2 attempts")
    );
    assert!(
        kubectl_wait_status(&env, "web", "Stalled", "5s").await,
        "kubectl sees it too"
    );
    env.wait_event("web", "CleanupGaveUp").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_holds_new_cleanups_until_resumed() {
    let env = Env::new("status-paused", 3, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template_running_for("1s"));
    env.create_running(&spec).await;
    let sets = env.record_sets().await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let pause = json!({"metadata": {"annotations": {PAUSED: "true"}}});
    env.sets()
        .patch("web", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .expect("pause");
    let paused = sets
        .wait_for("status Paused", LONG, |s| {
            status_of(&s.object).0 == Some("Paused")
        })
        .await;
    let marker = pods.mark();
    env.wait_event("web", "ScaleDownPaused").await;
    env.scale("web", 1).await;
    wait_for_gone(&env.pods(), "web-1", LONG).await;
    let waiting = sets
        .wait_for("the reason lists both ordinals", LONG, |s| {
            status_of(&s.object).1 == Some("Paused: ordinals 1,2 wait for a cleanup")
        })
        .await;
    // Close the window on the pod watch, then look at every pod change since the pause.
    let closed = pods.close_window(&env.pods(), "web-0").await;
    let created: Vec<String> = pods
        .since(marker)
        .iter()
        .filter(|s| s.resource_version < closed.resource_version && is_cleanup(&s.object))
        .map(|s| s.name.clone())
        .collect();
    assert!(
        created.is_empty(),
        "no cleanup pod while paused: {created:?}"
    );
    assert!(
        claims.first(|s| s.deleting).is_none(),
        "no claim touched while paused"
    );
    assert!(
        env.sets()
            .get("web")
            .await
            .expect("set")
            .finalizers()
            .iter()
            .any(|f| f == "statefulsets.kubernetes.io/scaledown"),
        "the finalizer stays"
    );
    assert!(paused.resource_version < waiting.resource_version);

    let resume = json!({"metadata": {"annotations": {PAUSED: null}}});
    env.sets()
        .patch("web", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .expect("resume");
    let resumed = Instant::now();
    env.wait_claim_gone("data-web-2").await;
    env.wait_claim_gone("data-web-1").await;
    assert!(
        kubectl_wait_status(&env, "web", "Idle", "60s").await,
        "Idle after the resumed cleanups"
    );
    record(
        "status: resume with 2 orphaned ordinals -> Idle",
        format!("{} ms", resumed.elapsed().as_millis()),
    );
    env.wait_event("web", "ScaleDownResumed").await;
    let pauses = env
        .event_reasons("web")
        .await
        .iter()
        .filter(|r| *r == "ScaleDownPaused")
        .count();
    assert_eq!(pauses, 1, "one Event per pause");
}
