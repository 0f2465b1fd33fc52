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
    let bound = crate::podbound::observe::BOUND_TO_POD_ANNOTATION;
    let mut c = claim(
        "cache",
        serde_json::json!({bound: "runner", naming::NEXT_ATTEMPT_ANNOTATION: "2", LAST_APPLIED: "{}"}),
    );
    prune_claim(&mut c);
    let mut kept: Vec<&String> = c.annotations().keys().collect();
    kept.sort();
    let mut want = vec![bound, naming::NEXT_ATTEMPT_ANNOTATION];
    want.sort();
    assert_eq!(kept, want);
    assert!(c.metadata.managed_fields.is_none());
}

#[test]
fn a_pruned_set_keeps_what_observe_reads() {
    let mut full: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u", "generation": 2,
            "annotations": {LAST_APPLIED: "{}", naming::TEMPLATE_ANNOTATION: "{\"spec\":{}}"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
        "spec": {"replicas": 2, "serviceName": "web", "selector": {},
            "template": {"spec": {"containers": [{"name": "app", "image": "app"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
        "status": {"replicas": 2}
    }))
    .expect("a set");
    let before = observe_facts(&full);
    prune_set(&mut full);
    assert!(full.metadata.managed_fields.is_none());
    assert!(!full.annotations().contains_key(LAST_APPLIED));
    assert_eq!(
        full.spec.as_ref().map(|s| &s.template),
        Some(&Default::default())
    );
    assert_eq!(observe_facts(&full), before, "observe sees the same set");
}

fn observe_facts(set: &StatefulSet) -> String {
    format!("{:?}", crate::scaledown::observe::set_facts(set))
}
