//! The tests of `observe`, tables mostly: fixture caches in, facts out.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use serde_json::{Value, json};

use super::*;
use crate::scaledown::watch::ordinals;

fn from(value: Value) -> Arc<StatefulSet> {
    Arc::new(serde_json::from_value(value).expect("statefulset"))
}

/// Set `web` in `ns` (uid `uid-web`), opted in, claim template `data`, with `records`.
fn web(replicas: i32, records: Value) -> Arc<StatefulSet> {
    from(json!({
        "metadata": {
            "name": "web", "namespace": "ns", "uid": "uid-web", "generation": 4,
            "annotations": {
                naming::TEMPLATE_ANNOTATION: "{}",
                naming::RECORD_ANNOTATION: records.to_string(),
            },
        },
        "spec": {"replicas": replicas, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    }))
}

fn claim(ns: &str, name: &str) -> Arc<PartialObjectMeta<PersistentVolumeClaim>> {
    let mut c: PartialObjectMeta<PersistentVolumeClaim> = PartialObjectMeta::default();
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some(ns.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    Arc::new(c)
}

/// A pod in `ns` named `name` with `uid`; `extra` is merged into it (labels, owners, volumes ...).
fn pod(name: &str, uid: &str, extra: Value) -> Arc<Pod> {
    let mut value = json!({"metadata": {"name": name, "namespace": "ns", "uid": uid}});
    merge(&mut value, extra);
    Arc::new(serde_json::from_value(value).expect("pod"))
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn owned_by_web() -> Value {
    json!({"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "uid-web",
        "controller": true
    }]}})
}

fn mounting(claim: &str) -> Value {
    json!({"spec": {"containers": [], "volumes": [
        {"name": "v", "persistentVolumeClaim": {"claimName": claim}}
    ]}})
}

fn looks_like_ours() -> Value {
    json!({"metadata": {"labels": {naming::CLEANUP_LABEL: "web-2"},
                        "annotations": {naming::OWNER_ANNOTATION: "web"}}})
}

fn observed(
    set: &Arc<StatefulSet>,
    others: &[Arc<StatefulSet>],
    claims: &[Arc<PartialObjectMeta<PersistentVolumeClaim>>],
    pods: &[Arc<Pod>],
) -> Observed {
    let mut sets = vec![set.clone()];
    sets.extend(others.iter().cloned());
    let cleanup: Vec<Arc<Pod>> = pods
        .iter()
        .filter(|p| p.labels().contains_key(naming::CLEANUP_LABEL))
        .cloned()
        .collect();
    observe(
        set,
        &Sources {
            sets: &sets,
            claims,
            pods,
            cleanup_pods: &cleanup,
            ordinals: &ordinals(set, claims, pods),
            cleanups_in_flight: 0,
            rejections: BTreeMap::new(),
            disputed: Default::default(),
            read: SetRead::LiveSet,
            now: Timestamp::UNIX_EPOCH,
        },
    )
}

fn role_at(o: &Observed, ordinal: u32) -> Option<&PodRole> {
    Some(&o.ordinals.get(&ordinal)?.pod.as_ref()?.role)
}

#[test]
fn pod_roles_table() {
    let recorded = json!({"2": {"pod": "uid-ours", "claims": {"data-web-2": "uid-data-web-2"}}});
    let gated = json!({"spec": {"containers": [],
        "schedulingGates": [{"name": naming::CONFIRM_GATE}]}});
    let mut gated_look_alike = looks_like_ours();
    merge(&mut gated_look_alike, gated);
    // (what the pod at ordinal 2 is, the role observe must give it)
    let rows: Vec<(&str, Arc<Pod>, &str)> = vec![
        (
            "the set's own pod",
            pod("web-2", "uid-s", owned_by_web()),
            "stateful",
        ),
        (
            "ours, recorded",
            pod("web-2", "uid-ours", looks_like_ours()),
            "cleanup",
        ),
        (
            "recorded UID but no label: the record decides",
            pod("web-2", "uid-ours", json!({})),
            "cleanup",
        ),
        (
            "look-alike, other UID",
            pod("web-2", "uid-forged", looks_like_ours()),
            "unproven",
        ),
        (
            "look-alike, still gated",
            pod("web-2", "uid-x", gated_look_alike),
            "unproven-gated",
        ),
        (
            "somebody's pod",
            pod("web-2", "uid-f", json!({})),
            "foreign",
        ),
        (
            "owned by another set of the same name",
            pod(
                "web-2",
                "uid-o",
                json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
                    "kind": "StatefulSet", "name": "web", "uid": "uid-old-web", "controller": true}]}}),
            ),
            "foreign",
        ),
    ];
    let set = web(2, recorded);
    for (what, p, want) in rows {
        let o = observed(&set, &[], &[claim("ns", "data-web-2")], &[p]);
        let got = match role_at(&o, 2) {
            Some(PodRole::Stateful) => "stateful",
            Some(PodRole::Cleanup(_)) => "cleanup",
            Some(PodRole::Unproven { gated: false, .. }) => "unproven",
            Some(PodRole::Unproven { gated: true, .. }) => "unproven-gated",
            Some(PodRole::Foreign) => "foreign",
            None => "none",
        };
        assert_eq!(got, want, "{what}");
    }
}

/// Found by `make chaos` (seed 20261128, round 38): the cleanup-pod cache still held the
/// recorded, Succeeded cleanup pod `web-2` while the pod cache already held the set's new pod of
/// that name. The role came from the first and the UID from the second, so "delete the finished
/// cleanup pod" was sent with the stateful pod's UID and deleted it. The whole copy is used only
/// when it is the same object.
#[test]
fn a_stale_cleanup_pod_copy_never_lends_its_role_to_the_pod_now_holding_the_name() {
    let set = web(
        3,
        json!({"2": {"pod": "uid-ours", "claims": {"data-web-2": "uid-data-web-2"}}}),
    );
    let stateful = pod("web-2", "uid-new-stateful", owned_by_web());
    let stale_cleanup = pod("web-2", "uid-ours", looks_like_ours());
    let (claims, pods) = ([claim("ns", "data-web-2")], [stateful]);
    let o = observe(
        &set,
        &Sources {
            sets: std::slice::from_ref(&set),
            claims: &claims,
            pods: &pods,
            cleanup_pods: &[stale_cleanup],
            ordinals: &ordinals(&set, &claims, &pods),
            cleanups_in_flight: 0,
            rejections: BTreeMap::new(),
            disputed: Default::default(),
            read: SetRead::LiveSet,
            now: Timestamp::UNIX_EPOCH,
        },
    );
    let facts = o.ordinals.get(&2).and_then(|f| f.pod.as_ref());
    assert_eq!(
        facts.map(|p| (p.uid.as_str(), &p.role)),
        Some(("uid-new-stateful", &PodRole::Stateful))
    );
}

#[test]
fn cleanup_claims_come_from_the_record_not_the_pod() {
    let set = web(
        2,
        json!({"2": {"pod": "uid-ours", "claims": {"data-web-2": "uid-r"}}}),
    );
    let mut lying = looks_like_ours();
    merge(
        &mut lying,
        json!({"metadata": {"annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-claims": "{\"data-web-0\":\"uid-data-web-0\"}"
        }}}),
    );
    let o = observed(
        &set,
        &[],
        &[claim("ns", "data-web-2")],
        &[pod("web-2", "uid-ours", lying)],
    );
    let Some(PodRole::Cleanup(c)) = role_at(&o, 2) else {
        panic!("a recorded pod is a cleanup pod")
    };
    assert_eq!(
        c.claims,
        BTreeMap::from([("data-web-2".to_string(), "uid-r".to_string())])
    );
}

#[test]
fn claim_facts_table() {
    let set = web(1, json!({}));
    let other = from(json!({
        "metadata": {"name": "web-1", "namespace": "ns", "uid": "uid-web-1"},
        "spec": {"replicas": 1, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    }));
    let mut deleting = (*claim("ns", "data-web-3")).clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let claims = vec![
        claim("ns", "data-web-1"),
        claim("ns", "data-web-2"),
        Arc::new(deleting),
        claim("other", "data-web-4"),
        claim("ns", "logs-web-5"),
        claim("ns", "data-web-05"),
    ];
    let pods = vec![pod("reader", "uid-r", mounting("data-web-2")), {
        let mut done = mounting("data-web-1");
        merge(&mut done, json!({"status": {"phase": "Succeeded"}}));
        pod("finished", "uid-d", done)
    }];
    let o = observed(&set, &[other], &claims, &pods);
    let facts = |n: u32| {
        o.ordinals
            .get(&n)
            .map(|f| f.claims.clone())
            .unwrap_or_default()
    };
    // `data-web-1` is web's alone (set web-1's claims are `data-web-1-N`); a finished pod uses
    // nothing.
    assert_eq!(facts(1).len(), 1);
    assert!(
        facts(1)[0].used_by.is_empty(),
        "a finished pod uses nothing"
    );
    assert_eq!(facts(1)[0].not_ours, None);
    assert_eq!(facts(2)[0].used_by, ["reader"]);
    assert!(facts(3)[0].deleting);
    assert!(facts(4).is_empty(), "other namespaces are ignored");
    assert!(facts(5).is_empty(), "other claim templates are ignored");
    assert_eq!(
        o.ordinals.len(),
        3,
        "data-web-05 is no ordinal: {:?}",
        o.ordinals.keys()
    );
}

#[test]
fn a_claim_another_set_still_wants_is_marked() {
    // `data-a-b-0` fits set `a-b` (template `data`) and set `b` (template `data-a`).
    let set = from(json!({
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b",
                     "annotations": {naming::TEMPLATE_ANNOTATION: "{}"}},
        "spec": {"replicas": 0, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data-a"}}]}
    }));
    let other = from(json!({
        "metadata": {"name": "a-b", "namespace": "ns", "uid": "uid-ab"},
        "spec": {"replicas": 1, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    }));
    let o = observed(&set, &[other], &[claim("ns", "data-a-b-0")], &[]);
    assert_eq!(
        o.ordinals[&0].claims[0].not_ours.as_deref(),
        Some("it is also a claim of StatefulSet a-b, which still uses that ordinal")
    );
}

#[test]
fn records_table() {
    let one = |raw: &str| parse_records(Some(raw));
    assert_eq!(one(r#"{"2":{"pod":"u","claims":{"c":"v"}}}"#)[&2].pod, "u");
    assert!(one("not json").is_empty(), "malformed proves nothing");
    assert!(
        one(r#"{"02":{"pod":"u"}}"#).is_empty(),
        "not a canonical ordinal"
    );
    assert!(one(r#"{"-1":{"pod":"u"}}"#).is_empty());
    assert!(
        one(r#"{"2":{"claims":{}}}"#).is_empty(),
        "a record names its pod"
    );
    let huge = format!(r#"{{"2":{{"pod":"{}"}}}}"#, "u".repeat(300 * 1024));
    assert!(one(&huge).is_empty(), "over the size limit");
    assert!(parse_records(None).is_empty());
    let records = one(r#"{"3":{"pod":"a","claims":{"d":"e"}},"1":{"pod":"b"}}"#);
    assert_eq!(parse_records(Some(&format_records(&records))), records);
}

#[test]
fn restarts_table() {
    use crate::scaledown::observe::restarts_of;
    // (what the container statuses say, the restarts observe must report: count, container, exit)
    let failed_once = json!({"name": "main", "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}});
    type Want = Option<(u32, &'static str, i32)>;
    let rows: Vec<(&str, serde_json::Value, Want)> = vec![
        ("no statuses yet", json!({}), None),
        (
            "running, never restarted",
            json!({"containerStatuses": [{"name": "main", "restartCount": 0}]}),
            None,
        ),
        (
            "restarted after exit 3",
            json!({"containerStatuses": [failed_once.clone()]}),
            Some((1, "main", 3)),
        ),
        (
            "restarted after exit 0 (a restart that was not a failure)",
            json!({"containerStatuses": [{"name": "main", "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 0}}}]}),
            None,
        ),
        (
            "an init container crash-looping, counts summed",
            json!({"initContainerStatuses": [{"name": "prep", "restartCount": 4,
                    "lastState": {"terminated": {"exitCode": 1}}}],
                "containerStatuses": [{"name": "main", "restartCount": 0}]}),
            Some((4, "prep", 1)),
        ),
        (
            "a negative count from a broken status is ignored",
            json!({"containerStatuses": [{"name": "main", "restartCount": -5,
                "lastState": {"terminated": {"exitCode": 2}}}]}),
            None,
        ),
    ];
    for (what, status, want) in rows {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": "web-2"}, "status": status}))
                .expect("pod");
        let got = restarts_of(&p);
        let got = got
            .as_ref()
            .map(|r| (r.count, r.container.as_str(), r.exit_code));
        assert_eq!(got, want, "{what}");
    }
}

/// What a failed cleanup pod said: its failed container's termination message, on one line and
/// bounded, its end kept; none when blank or absent.
#[test]
fn termination_message_table() {
    use crate::scaledown::observe::{MESSAGE_CHARS, cleanup_facts, said};
    let long = format!("{}END", "x".repeat(2 * MESSAGE_CHARS));
    let rows: Vec<(&str, serde_json::Value, Option<String>)> = vec![
        ("none", json!({"exitCode": 1}), None),
        ("blank", json!({"exitCode": 1, "message": " \n "}), None),
        (
            "lines joined",
            json!({"exitCode": 1, "message": "3 keys left\n  first error: NOREPLICAS\n"}),
            Some("3 keys left first error: NOREPLICAS".into()),
        ),
        (
            "long: the end kept",
            json!({"exitCode": 1, "message": long}),
            Some(format!("…{}END", "x".repeat(MESSAGE_CHARS - 4))),
        ),
    ];
    for (what, terminated, want) in rows {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-2", "annotations": {naming::ATTEMPT_ANNOTATION: "1"}},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "ok", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "message": "fine"}}},
                {"name": "main", "restartCount": 0, "state": {"terminated": terminated}}]}
        }))
        .expect("pod");
        let facts = cleanup_facts(&p, &Default::default());
        let got = facts.failure.and_then(|f| f.message);
        if let Some(g) = &got {
            assert!(
                g.chars().count() <= MESSAGE_CHARS,
                "{what}: {} chars",
                g.chars().count()
            );
        }
        assert_eq!(got, want, "{what}");
    }
    assert_eq!(
        said("é".repeat(MESSAGE_CHARS + 1).as_str()).map(|s| s.chars().count()),
        Some(MESSAGE_CHARS)
    );
}

/// Issue 23: whose claim a claim is, beyond its name. Set `db` (template `data-my`, labels
/// `app=db`) and set `my-db` (template `data`, labels `app=my-db`) both give `data-my-db-0`.
#[test]
fn ownership_of_a_claim_is_proven_by_labels_and_owners_not_by_name() {
    let set = |name: &str, template: &str, app: &str, replicas: i32| {
        from(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "annotations": {naming::TEMPLATE_ANNOTATION: "{}"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                     "template": {},
                     "volumeClaimTemplates": [{"metadata": {"name": template}}]}
        }))
    };
    let db = set("db", "data-my", "db", 0);
    let my_db = set("my-db", "data", "my-db", 0);
    let other = set("cache", "data", "cache", 1);
    let with = |labels: Value, owners: Value| {
        let mut c = PartialObjectMeta::<PersistentVolumeClaim>::default();
        c.metadata.name = Some("data-my-db-0".into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-c".into());
        c.metadata.labels = serde_json::from_value(labels).expect("labels");
        c.metadata.owner_references = serde_json::from_value(owners).expect("owners");
        Arc::new(c)
    };
    let not_ours = |sets: &[Arc<StatefulSet>], claim| {
        let o = observed(&db, sets, &[claim], &[]);
        o.ordinals[&0].claims[0].not_ours.clone()
    };
    let owner = |kind: &str, uid: &str| json!([{"apiVersion": "v1", "kind": kind, "name": "x", "uid": uid}]);
    type Case<'a, C> = (&'a str, &'a [Arc<StatefulSet>], C, Option<&'a str>);
    let cases: Vec<Case<'_, _>> = vec![
        (
            "made by the StatefulSet controller for db",
            &[],
            with(json!({"app": "db"}), Value::Null),
            None,
        ),
        (
            "made by hand, no other set fits its name",
            &[],
            with(Value::Null, Value::Null),
            None,
        ),
        (
            "made by hand with labels that are not db's",
            &[],
            with(json!({"team": "a"}), Value::Null),
            Some(
                "it carries labels (team=a) but not this set's selector labels (app=db): another StatefulSet's claim, maybe of one deleted since (add this set's labels to it if it is this set's)",
            ),
        ),
        (
            "kept by my-db after a scale-down, and my-db deleted since",
            &[],
            with(json!({"app": "my-db"}), Value::Null),
            Some(
                "it carries labels (app=my-db) but not this set's selector labels (app=db): another StatefulSet's claim, maybe of one deleted since (add this set's labels to it if it is this set's)",
            ),
        ),
        (
            "owned by db itself (whenDeleted: Delete)",
            &[],
            with(json!({"app": "db"}), owner("StatefulSet", "uid-db")),
            None,
        ),
        (
            "kept by my-db, which does not take part, after a scale-down",
            std::slice::from_ref(&my_db),
            with(json!({"app": "my-db"}), Value::Null),
            Some("it carries the selector labels of StatefulSet my-db, not this set's"),
        ),
        (
            "made by hand, and my-db fits its name",
            std::slice::from_ref(&my_db),
            with(Value::Null, Value::Null),
            Some(
                "StatefulSet my-db makes a claim of the same name and the claim carries neither set's selector labels",
            ),
        ),
        (
            "another object owns it",
            &[],
            with(json!({"app": "db"}), owner("ConfigMap", "uid-cm")),
            Some("it is owned by ConfigMap x"),
        ),
        (
            "it carries the labels of a set that cannot own it by name",
            std::slice::from_ref(&other),
            with(json!({"app": "cache"}), Value::Null),
            Some("it carries the selector labels of StatefulSet cache, not this set's"),
        ),
    ];
    let mut checked = 0;
    for (what, sets, claim, want) in cases {
        assert_eq!(not_ours(sets, claim).as_deref(), want, "{what}");
        checked += 1;
    }
    // The same labels on both sets: neither proves it.
    let twin = set("my-db", "data", "db", 0);
    let shared = not_ours(&[twin], with(json!({"app": "db"}), Value::Null));
    assert!(
        shared.is_some_and(|w| w.contains("of this set and of StatefulSet my-db")),
        "labels both sets carry prove neither"
    );
    assert_eq!(checked, 9);
}

fn set(ns: &str, name: &str, replicas: i32, annotated: bool) -> Arc<StatefulSet> {
    let mut value = serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {}, "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    });
    if annotated {
        value["metadata"]["annotations"] = serde_json::json!({naming::TEMPLATE_ANNOTATION: "{}"});
    }
    Arc::new(serde_json::from_value(value).expect("statefulset"))
}

#[test]
fn orphans_of_sets_that_did_not_opt_in_are_counted_per_namespace() {
    let sets = [
        set("a", "web", 1, false),
        set("a", "db", 0, true),
        set("b", "web", 2, false),
    ];
    let claims = [
        claim("a", "data-web-0"),
        claim("a", "data-web-1"),
        claim("a", "data-web-5"),
        claim("a", "data-db-0"),
        claim("b", "data-web-1"),
        claim("b", "data-web-2"),
        claim("c", "data-web-9"),
    ];
    let counts = unmanaged_orphans(&sets, &claims);
    assert_eq!(counts, [("a".to_string(), 2), ("b".to_string(), 1)].into());
}
