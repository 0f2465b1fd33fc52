//! Tables over what a cleanup pod inherits: the annotation and the flag, the fields taken from the
//! set, and the merge in which the cleanup template wins field by field.

use serde_json::json;

use super::*;
use crate::reason::Reason;
use crate::template::tests::{GOOD, selector, target, templates};
use crate::template::{MAX_POD_BYTES, parse};

#[test]
fn the_annotation_and_the_flag_decide_what_is_inherited() {
    let unknown = |v: &str| Inherit::Unknown(v.into());
    let cases: &[(Option<&str>, bool, Inherit)] = &[
        (None, false, Inherit::Nothing),
        (None, true, Inherit::Scheduling),
        (Some("scheduling"), false, Inherit::Scheduling),
        (Some("scheduling"), true, Inherit::Scheduling),
        (Some("none"), false, Inherit::Nothing),
        (Some("none"), true, Inherit::Nothing),
        (Some(" scheduling\n"), false, Inherit::Scheduling),
        (Some("  "), true, Inherit::Scheduling),
        (Some(""), false, Inherit::Nothing),
        (Some("Scheduling"), true, unknown("Scheduling")),
        (Some("tolerations"), false, unknown("tolerations")),
        (Some("scheduling,none"), true, unknown("scheduling,none")),
    ];
    for (annotation, flag, want) in cases {
        assert_eq!(
            &inherit(*annotation, *flag),
            want,
            "annotation {annotation:?}, flag {flag}"
        );
    }
}

/// A pod template spec of a StatefulSet on a dedicated pool, with fields that are not inherited.
fn set_spec() -> PodSpec {
    serde_json::from_value(json!({
        "containers": [{"name": "app", "image": "app", "env": [{"name": "A", "value": "1"}]}],
        "initContainers": [{"name": "init", "image": "init"}],
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "db"},
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "zone"}}]}
        },
        "priorityClassName": "db-critical",
        "imagePullSecrets": [{"name": "registry"}],
        "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
        "serviceAccountName": "db",
        "hostNetwork": true,
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
        "volumes": [{"name": "conf", "configMap": {"name": "db"}}]
    }))
    .expect("a pod spec")
}

fn inherited() -> Map<String, Value> {
    scheduling_of(&set_spec())
}

#[test]
fn the_six_scheduling_fields_are_taken_and_nothing_else() {
    let fields = Value::Object(inherited());
    assert_eq!(
        fields,
        json!({
            "tolerations": [{"key": "pool", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "db"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
            "priorityClassName": "db-critical",
            "imagePullSecrets": [{"name": "registry"}],
            "securityContext": {"runAsUser": 1000, "fsGroup": 2000}
        }),
        "pod affinity and anti-affinity, containers, service account, host network, spread and volumes stay the set's"
    );
    let empty: PodSpec = serde_json::from_value(json!({
        "containers": [], "tolerations": [], "nodeSelector": {}, "priorityClassName": "",
        "imagePullSecrets": [], "securityContext": {},
        "affinity": {"nodeAffinity": {}, "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    }))
    .expect("a pod spec");
    assert_eq!(scheduling_of(&empty), Map::new(), "empty values are unset");
    assert_eq!(scheduling_of(&PodSpec::default()), Map::new());
}

/// What the cache keeps of a set's pod template gives the facts the full template gives.
#[test]
fn the_kept_spec_holds_the_scheduling_fields_only() {
    let kept = keep_scheduling(set_spec());
    assert_eq!(scheduling_of(&kept), inherited(), "same facts");
    let json = serde_json::to_value(&kept).expect("serializes");
    let mut keys: Vec<&str> = json
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "affinity",
            "containers",
            "imagePullSecrets",
            "nodeSelector",
            "priorityClassName",
            "securityContext",
            "tolerations"
        ]
    );
    assert_eq!(json["containers"], json!([]), "no container kept");
    assert_eq!(
        json["affinity"].as_object().map(|a| a.len()),
        Some(1),
        "only nodeAffinity: {json}"
    );
}

/// The spec of the pod rendered from `template_spec` (merged into GOOD's spec) with `inherited`.
fn rendered(template_spec: Value, inherited: &Map<String, Value>) -> Value {
    let mut template: Value = serde_json::from_str(GOOD).expect("GOOD is JSON");
    if let (Some(spec), Value::Object(extra)) = (template["spec"].as_object_mut(), template_spec) {
        spec.extend(extra);
    }
    let parsed = parse(&template.to_string(), &templates(), Some(&selector())).expect("valid");
    parsed
        .render_inheriting(&target(), inherited)
        .expect("renders")["spec"]
        .clone()
}

#[test]
fn the_template_wins_field_by_field() {
    let set = inherited();
    let plain = rendered(json!({}), &set);
    for (field, value) in &set {
        assert_eq!(
            &plain[field], value,
            "{field} inherited by a template without it"
        );
    }
    assert_eq!(
        plain["containers"][0]["name"], "main",
        "the template's containers"
    );
    assert!(plain.get("serviceAccountName").is_none());

    // One row per field: the template's own value (also an empty one) is kept as it is.
    let own: &[(&str, Value)] = &[
        (
            "tolerations",
            json!([{"key": "other", "operator": "Exists"}]),
        ),
        ("tolerations", json!([])),
        ("nodeSelector", json!({"pool": "cleanup"})),
        ("nodeSelector", json!({})),
        ("priorityClassName", json!("low")),
        ("imagePullSecrets", json!([{"name": "mine"}])),
        ("securityContext", json!({"runAsUser": 0})),
        (
            "affinity",
            json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}]}}),
        ),
    ];
    for (field, value) in own {
        let spec = rendered(json!({ *field: value }), &set);
        assert_eq!(&spec[*field], value, "the template's {field} wins");
        for (other, inherited) in set.iter().filter(|(k, _)| k != field) {
            assert_eq!(
                &spec[other], inherited,
                "{other} still inherited beside {field}"
            );
        }
    }
    let null = rendered(json!({"tolerations": null, "affinity": null}), &set);
    assert_eq!(null["tolerations"], set["tolerations"], "null is unset");
    assert_eq!(null["affinity"], set["affinity"]);
}

#[test]
fn node_affinity_goes_beside_the_templates_pod_affinity() {
    let set = inherited();
    let anti = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web-cleanup"}}, "topologyKey": "kubernetes.io/hostname"}]});
    let spec = rendered(json!({"affinity": {"podAntiAffinity": anti.clone()}}), &set);
    assert_eq!(
        spec["affinity"],
        json!({"podAntiAffinity": anti, "nodeAffinity": set["affinity"]["nodeAffinity"]})
    );
    let spec = rendered(json!({"affinity": {}}), &set);
    assert_eq!(spec["affinity"], set["affinity"]);
}

#[test]
fn nothing_inherited_renders_the_plain_pod() {
    let template = parse(GOOD, &templates(), Some(&selector())).expect("valid");
    assert_eq!(
        template.render_inheriting(&target(), &Map::new()),
        template.render(&target())
    );
}

/// A set whose own fields push the cleanup pod over the size limit gets the template's size
/// Warning, naming the inherited fields, and no pod.
#[test]
fn inherited_fields_count_against_the_pod_size_limit() {
    let template = parse(GOOD, &templates(), Some(&selector())).expect("valid");
    let value = "v".repeat(60_000);
    let tolerations: Vec<Value> = (0..10)
        .map(|i| json!({"key": format!("k{i}"), "operator": "Equal", "value": value}))
        .collect();
    let mut huge = Map::new();
    huge.insert("tolerations".into(), json!(tolerations));
    let err = template
        .render_inheriting(&target(), &huge)
        .expect_err("over the limit");
    assert_eq!(err.reason(), Reason::CleanupTemplateTooLarge);
    assert!(err.to_string().contains("scheduling fields"), "{err}");
    assert!(
        err.to_string().contains(&MAX_POD_BYTES.to_string()),
        "{err}"
    );
}
