//! Whose claim a claim is (issue 23): a name proves nothing. On the local control plane, with the
//! real StatefulSet controller creating the claims (it puts the set's `selector.matchLabels` on
//! each), these tests make claims whose names fit an opted-in set's orphaned ordinals but that are
//! not its own, and check from watches over the whole window that none of them is cleaned or
//! deleted, while a claim made by hand for the set still is.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::fixtures::*;
use support::{from_json, wait_for};

const STATUS: &str = "statefulsets.kubernetes.io/scaledown-status";
const STATUS_REASON: &str = "statefulsets.kubernetes.io/scaledown-status-reason";

/// Waits until the set's status annotations say `Stalled` with a reason containing `needle`, and
/// returns the reason.
async fn wait_stalled(env: &Env, set: &str, needle: &str) -> String {
    let sets = env.sets();
    let reason = || async {
        let s = sets.get_opt(set).await.ok().flatten()?;
        let a = s.annotations();
        let stalled = a.get(STATUS).map(String::as_str) == Some("Stalled");
        a.get(STATUS_REASON)
            .filter(|r| stalled && r.contains(needle))
            .cloned()
    };
    wait_for(&format!("{set} Stalled ({needle})"), LONG, || async {
        reason().await.is_some()
    })
    .await;
    reason().await.unwrap_or_default()
}

/// The claims and pods of the window: names of claims deleted, names of pods created by the
/// controller (cleanup pods).
fn deleted_claims(claims: &support::recorder::Recorder<PersistentVolumeClaim>) -> BTreeSet<String> {
    claims
        .matching(|s| s.deleting)
        .into_iter()
        .map(|s| s.name)
        .collect()
}

fn cleanup_pods_seen(pods: &support::recorder::Recorder<Pod>) -> BTreeSet<String> {
    pods.matching(|s| s.labels.contains_key("scaledown-pod"))
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// `data` + `my-db` and `data-my` + `db` compose to the same claim names. `my-db` does not take
/// part and was scaled to zero to be scaled up again later: its claims are kept on purpose. The
/// opted-in set `db`, scaled to zero, must leave them alone (the Go original, and this controller
/// before, cleaned and deleted them).
#[tokio::test(flavor = "multi_thread")]
async fn claims_kept_by_a_set_that_does_not_take_part_are_left_alone() {
    let env = Env::new("own-kept", 3, &[]).await;
    let kept = keep_claims(&env).await;
    let claims = env.record_claims().await;
    let pods = env.record_pods().await;
    let mut db = SetSpec::new("db", 0, &env.class);
    db.claim_templates = &["data-my"];
    env.create(&db).await;
    let reason = wait_stalled(&env, "db", "ClaimOwnershipConflict").await;
    assert!(
        reason.contains("ordinals 0,1,2"),
        "the status names every ordinal left alone: {reason}"
    );
    // The window ends after the controller said it leaves them alone: nothing was deleted or
    // created in it, and the claims are the same objects.
    assert_eq!(deleted_claims(&claims), BTreeSet::new(), "no claim deleted");
    assert_eq!(cleanup_pods_seen(&pods), BTreeSet::new(), "no cleanup pod");
    for (n, uid) in kept.iter().enumerate() {
        assert_eq!(&env.claim_uid(&format!("data-my-db-{n}")).await, uid);
    }
    let notes = env.event_notes("db", "ClaimOwnershipConflict").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("selector labels of StatefulSet my-db")),
        "the Warning says why: {notes:?}"
    );
}

/// Found by `make chaos` (seed 42, the final deletion of every set; issue 23 item 7): once the set
/// that kept the claims is deleted (here with orphan propagation, as to change an immutable field
/// and apply the set again), its labels on the kept claims are no set's any more, and the
/// opted-in set `db` cleans and deletes the claims. They are still the deleted set's (its
/// retention policy keeps them); nothing proves them `db`'s. Fails on the controller at be36c94:
/// at its next resync `db` creates cleanup pods for the kept ordinals (`db-2` and `db-1` within
/// the window in the run that confirmed it) and goes on to delete the claims.
#[tokio::test(flavor = "multi_thread")]
async fn claims_kept_by_a_deleted_set_are_left_alone() {
    // Deleting `my-db` does not wake `db`: its next resync does.
    let mut env = Env::new("own-kept-gone", 3, &["--resync-period", "2s"]).await;
    let kept = keep_claims(&env).await;
    let mut db = SetSpec::new("db", 0, &env.class);
    db.claim_templates = &["data-my"];
    db.template = Some(ok_template().replace(r#""name":"data""#, r#""name":"data-my""#));
    env.create(&db).await;
    wait_stalled(&env, "db", "ClaimOwnershipConflict").await;
    let claims = env.record_claims().await;
    let pods = env.record_pods().await;
    let orphan = kube::api::DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        ..Default::default()
    };
    env.sets()
        .delete("my-db", &orphan)
        .await
        .expect("delete my-db (orphan)");
    support::wait_for_gone(&env.sets(), "my-db", LONG).await;
    let ns = env.ns.name.clone();
    // Two resyncs of `db` at least after `my-db` is gone.
    env.controller().wait_reconciles(&ns, "db", 6).await;
    assert_eq!(cleanup_pods_seen(&pods), BTreeSet::new(), "no cleanup pod");
    assert_eq!(deleted_claims(&claims), BTreeSet::new(), "no claim deleted");
    for (n, uid) in kept.iter().enumerate() {
        assert_eq!(&env.claim_uid(&format!("data-my-db-{n}")).await, uid);
    }
}

/// `my-db` (not taking part, template `data`) with three running replicas, scaled to zero: its
/// claims `data-my-db-0..2` are kept on purpose. Returns their UIDs.
async fn keep_claims(env: &Env) -> Vec<Option<String>> {
    let mut keeper = SetSpec::new("my-db", 3, &env.class);
    keeper.template = None;
    keeper.parallel = true;
    env.create_pods_running(&keeper).await;
    env.scale("my-db", 0).await;
    for n in 0..3 {
        support::wait_for_gone(&env.pods(), &format!("my-db-{n}"), LONG).await;
    }
    let mut kept = Vec::new();
    for n in 0..3 {
        kept.push(env.claim_uid(&format!("data-my-db-{n}")).await);
    }
    assert!(
        kept.iter().all(Option::is_some),
        "my-db's claims exist: {kept:?}"
    );
    kept
}

/// Before the set exists: `data-web-1` is made by hand without labels (pre-provisioned, a known
/// practice) and `data-web-2` is made by hand with an ownerReference to a ConfigMap (another
/// object's). The StatefulSet controller adopts both by name. After 3 → 1, ordinal 1 is cleaned
/// and its claim deleted; ordinal 2 is left alone with a Warning, and its claim stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_another_object_owns_is_left_alone_and_a_hand_made_one_is_cleaned() {
    let env = Env::new("own-foreign", 3, &[]).await;
    let config_maps: Api<ConfigMap> = env.ns.api();
    let owner = config_maps
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "owner"}})),
        )
        .await
        .expect("create config map");
    let claim = |name: &str, owners: serde_json::Value| -> PersistentVolumeClaim {
        from_json(json!({
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.class,
                     "resources": {"requests": {"storage": "1Gi"}}}
        }))
    };
    let owned = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                        "uid": owner.uid().expect("uid")}]);
    for c in [claim("data-web-1", json!([])), claim("data-web-2", owned)] {
        env.claims()
            .create(&PostParams::default(), &c)
            .await
            .expect("create claim");
    }
    let mut web = SetSpec::new("web", 3, &env.class);
    web.parallel = true;
    env.create_running(&web).await;
    let foreign_uid = env.claim_uid("data-web-2").await;

    let claims = env.record_claims().await;
    let pods = env.record_pods().await;
    env.scale("web", 1).await;
    env.wait_claim_gone("data-web-1").await;
    let reason = wait_stalled(&env, "web", "ClaimOwnershipConflict: ordinal 2").await;
    assert!(!reason.contains("ordinal 1"), "{reason}");
    assert_eq!(
        deleted_claims(&claims),
        BTreeSet::from(["data-web-1".to_string()]),
        "only the hand-made claim of ordinal 1 is deleted"
    );
    assert_eq!(
        cleanup_pods_seen(&pods),
        BTreeSet::from(["web-1".to_string()]),
        "ordinal 2 got no cleanup pod"
    );
    assert_eq!(env.claim_uid("data-web-2").await, foreign_uid);
    let notes = env.event_notes("web", "ClaimOwnershipConflict").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("data-web-2") && n.contains("owned by ConfigMap owner")),
        "{notes:?}"
    );
}
