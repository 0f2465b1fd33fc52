use super::*;
use kube::runtime::watcher::Event;

#[test]
fn candidates_are_every_split_before_the_ordinal() {
    assert_eq!(candidate_sets("data-web-2-0"), ["web-2", "2"]);
    assert_eq!(candidate_sets("b-c-a-1"), ["c-a", "a"]);
    assert!(candidate_sets("data-web-01").is_empty());
    assert!(candidate_sets("data--0").is_empty());
    assert!(candidate_sets("plain").is_empty());
}

fn claim(name: &str, annotations: serde_json::Value) -> Claim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
            "annotations": annotations,
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}
    }))
    .expect("claim")
}

/// With a kube store, the index holds the store's objects (one copy of each claim), follows
/// changes and deletes, and a relist replaces both at its end.
#[test]
fn the_claim_index_shares_the_stores_objects() {
    let (reader, writer) = reflector::store::<Claim>();
    let index = Index::default();
    let mut apply = claim_applier(index.clone(), Some(writer));
    let plain = || claim("data-web-0", serde_json::json!({}));
    for event in [Event::Init, Event::InitApply(plain()), Event::InitDone] {
        apply(&event);
    }
    let held = |name: &str| {
        (
            reader.get(&ObjectRef::new(name).within("ns")),
            index.get("ns", name),
        )
    };
    let (stored, indexed) = held("data-web-0");
    assert!(Arc::ptr_eq(
        &stored.expect("stored"),
        &indexed.expect("indexed")
    ));
    apply(&Event::Apply(claim("cache", serde_json::json!({"a": "b"}))));
    let (stored, indexed) = held("cache");
    assert!(Arc::ptr_eq(
        &stored.expect("stored"),
        &indexed.expect("indexed")
    ));
    apply(&Event::Delete(plain()));
    assert!(matches!(held("data-web-0"), (None, None)));
    for event in [Event::Init, Event::InitApply(plain()), Event::InitDone] {
        apply(&event);
    }
    assert!(
        matches!(held("cache"), (None, None)),
        "gone with the relist"
    );
    assert!(index.get("ns", "data-web-0").is_some());
}

/// A pruned claim keeps what the scale-down controller and pod-bound read.
#[test]
fn a_pruned_claim_keeps_our_annotations_only() {
    let bound = crate::naming::BOUND_TO_POD_ANNOTATION;
    let waiting = crate::naming::WAITING_SINCE_ANNOTATION;
    let mut c = claim(
        "cache",
        serde_json::json!({bound: "runner", waiting: "runner@2026-11-24T12:00:00Z",
                           naming::NEXT_ATTEMPT_ANNOTATION: "2", LAST_APPLIED: "{}"}),
    );
    prune_claim(&mut c);
    let mut kept: Vec<&String> = c.annotations().keys().collect();
    kept.sort();
    let mut want = vec![bound, waiting, naming::NEXT_ATTEMPT_ANNOTATION];
    want.sort();
    assert_eq!(kept, want);
    assert!(c.metadata.managed_fields.is_none());
}

#[test]
fn a_pruned_set_keeps_what_observe_reads() {
    let mut full: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u", "generation": 2,
            "labels": {"app": "web", "tier": "db"},
            "annotations": {LAST_APPLIED: "{}", naming::TEMPLATE_ANNOTATION: "{\"spec\":{}}"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
        "spec": {"replicas": 2, "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app"}]}},
            "volumeClaimTemplates": [
                {"metadata": {"name": "data", "labels": {"app": "web"}},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": "1Gi"}}},
                 "status": {"phase": "Pending"}},
                {"metadata": {"name": "logs"}}]},
        "status": {"replicas": 2, "observedGeneration": 2, "currentRevision": "web-1",
            "updateRevision": "web-2", "readyReplicas": 1,
            "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("a set");
    let before = observe_facts(&full);
    prune_set(&mut full);
    assert!(full.metadata.managed_fields.is_none());
    assert!(full.metadata.labels.is_none());
    assert!(!full.annotations().contains_key(LAST_APPLIED));
    let spec = full.spec.as_ref().expect("spec");
    assert_eq!(spec.template, Default::default());
    let names = [Some("data".to_string()), Some("logs".to_string())];
    let claims: Vec<_> = names
        .into_iter()
        .map(|name| PersistentVolumeClaim {
            metadata: ObjectMeta {
                name,
                ..Default::default()
            },
            ..Default::default()
        })
        .collect();
    assert_eq!(spec.volume_claim_templates.as_ref(), Some(&claims));
    let status = StatefulSetStatus {
        replicas: 2,
        observed_generation: Some(2),
        ..Default::default()
    };
    assert_eq!(full.status, Some(status));
    assert_eq!(observe_facts(&full), before, "observe sees the same set");
}

fn observe_facts(set: &StatefulSet) -> String {
    format!("{:?}", crate::scaledown::observe::set_facts(set))
}

/// A set on a tainted pool, opted in, with `inherit` as its inherit annotation.
fn pool_set(inherit: Option<&str>, template: bool) -> StatefulSet {
    let mut annotations = serde_json::json!({LAST_APPLIED: "{}"});
    if template {
        annotations[naming::TEMPLATE_ANNOTATION] = serde_json::json!(
            r#"{"spec":{"containers":[{"name":"c","image":"c","volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#
        );
    }
    if let Some(value) = inherit {
        annotations[naming::INHERIT_ANNOTATION] = serde_json::json!(value);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns", "uid": "u", "generation": 1,
            "annotations": annotations},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
                "containers": [{"name": "app", "image": "app"}],
                "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {"pool": "db"},
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "h"}]}},
                "securityContext": {"fsGroup": 2000}}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
        "status": {"replicas": 1}
    }))
    .expect("a set")
}

/// The cache keeps the scheduling fields of sets that inherit them, and nothing of the pod
/// template of the others (no extra memory for sets that do not opt in).
#[test]
fn a_pruned_set_keeps_scheduling_only_when_it_inherits() {
    let cases: &[(Option<&str>, bool, bool, bool)] = &[
        // annotation, takes part, --inherit-scheduling, kept
        (None, true, false, false),
        (None, true, true, true),
        (Some("scheduling"), true, false, true),
        (Some("scheduling"), false, true, false),
        (None, false, true, false),
        (Some("none"), true, true, false),
        (Some("nonsense"), true, true, false),
    ];
    for (inherit, takes_part, flag, kept) in cases {
        let full = pool_set(*inherit, *takes_part);
        let mut set = full.clone();
        prune_set_for(&mut set, *flag);
        let case = format!("annotation {inherit:?}, takes part {takes_part}, flag {flag}");
        let template = set.spec.as_ref().map(|s| &s.template).expect("spec");
        assert!(template.metadata.is_none(), "{case}");
        assert!(!set.annotations().contains_key(LAST_APPLIED), "{case}");
        let facts = crate::scaledown::observe::set_facts(&set);
        if *kept {
            let spec = template.spec.as_ref().expect("scheduling kept");
            assert!(spec.containers.is_empty(), "{case}: no containers");
            assert!(spec.affinity.is_none(), "{case}: pod anti-affinity dropped");
            let want = crate::scaledown::observe::set_facts(&full).scheduling;
            assert_eq!(facts.scheduling, want, "{case}");
            let keys: Vec<&String> = facts.scheduling.keys().collect();
            assert_eq!(keys, ["nodeSelector", "securityContext", "tolerations"]);
        } else {
            assert_eq!(template, &Default::default(), "{case}: nothing kept");
            assert!(facts.scheduling.is_empty(), "{case}");
        }
        if !flag {
            let mut default = full.clone();
            prune_set(&mut default);
            assert_eq!(default, set, "{case}: prune_set is the flag off");
        }
        let mut watched = full.clone();
        set_pruner(*flag)(&mut watched);
        assert_eq!(watched, set, "{case}: the watch prunes with the flag");
    }
}

/// Whichever read a pass decides on (the cache, or the live read pruned the same way, or the
/// unpruned object), the plan and the cleanup pod are the same.
#[test]
fn cache_and_live_reads_give_the_same_cleanup_pod() {
    use crate::scaledown::decide::{Policy, decide};
    use crate::scaledown::observe::{Observed, OrdinalFacts, SetRead};
    for inherit in [None, Some("scheduling"), Some("none"), Some("nonsense")] {
        for flag in [false, true] {
            let full = pool_set(inherit, true);
            let mut pruned = full.clone();
            prune_set_for(&mut pruned, flag);
            let policy = Policy {
                inherit_scheduling: flag,
                ..Policy::default()
            };
            let plan = |set: &StatefulSet| {
                let facts = crate::scaledown::observe::set_facts(set);
                let claim = crate::scaledown::observe::ClaimFacts {
                    template: "data".into(),
                    name: "data-db-1".into(),
                    uid: "c1".into(),
                    deleting: false,
                    next_attempt: None,
                    not_ours: None,
                    used_by: Vec::new(),
                };
                let o = Observed {
                    set: facts,
                    ordinals: [(
                        1,
                        OrdinalFacts {
                            claims: vec![claim],
                            ..OrdinalFacts::default()
                        },
                    )]
                    .into(),
                    cleanups_in_flight: 0,
                    rejections: Default::default(),
                    disputed: Default::default(),
                    read: SetRead::LiveSet,
                    now: "2026-11-20T12:00:00Z".parse().expect("time"),
                };
                decide(&o, &policy)
            };
            let case = format!("annotation {inherit:?}, flag {flag}");
            let from_cache = plan(&pruned);
            assert_eq!(from_cache, plan(&full), "{case}");
            let created = from_cache
                .steps
                .iter()
                .find_map(|s| match s {
                    crate::scaledown::decide::Step::CreateCleanupPod { pod, .. } => Some(pod),
                    _ => None,
                })
                .expect("a cleanup pod");
            let inherits = inherit == Some("scheduling") || (inherit.is_none() && flag);
            assert_eq!(
                created["spec"].get("tolerations").is_some(),
                inherits,
                "{case}"
            );
        }
    }
}
