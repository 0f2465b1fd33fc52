//! The status of fixture sets, observed and decided on as the controller would, and its table.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::core::PartialObjectMeta;
use serde_json::{Value, json};

use super::*;
use crate::naming;
use crate::scaledown::decide::{Policy, decide};
use crate::scaledown::observe::{Record, SetRead, Sources, format_records, observe};

const TEMPLATE: &str = r#"{"spec":{"containers":[{"name":"main","image":"busybox"}]}}"#;

fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// Set `web` with `replicas`, a record of cleanup pod `uid-cleanup-1` at ordinal 1, and `extra`
/// merged into its spec.
fn web(replicas: i32, spec_extra: Value) -> StatefulSet {
    let record = Record {
        pod: "uid-cleanup-1".into(),
        claims: [("data-web-1".to_string(), "uid-data-web-1".to_string())].into(),
    };
    let mut spec = json!({"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                          "template": {}, "volumeClaimTemplates": [{"metadata": {"name": "data"}}]});
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, spec_extra) {
        s.extend(e);
    }
    object(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "generation": 2,
                     "finalizers": [naming::FINALIZER],
                     "annotations": {naming::TEMPLATE_ANNOTATION: TEMPLATE,
                                     naming::RECORD_ANNOTATION: format_records(&[(1, record)].into())}},
        "spec": spec
    }))
}

fn claims(n: u32) -> Vec<Arc<PartialObjectMeta<PersistentVolumeClaim>>> {
    (0..n)
        .map(|i| {
            Arc::new(object(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("data-web-{i}"), "namespace": "ns",
                             "uid": format!("uid-data-web-{i}")}}),
            ))
        })
        .collect()
}

fn stateful_pod() -> Arc<Pod> {
    Arc::new(object(
        json!({"metadata": {"name": "web-0", "namespace": "ns", "uid": "uid-pod-0",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "uid-web", "controller": true}]},
        "spec": {"containers": [], "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]}}),
    ))
}

fn cleanup_pod(uid: &str, phase: &str) -> Arc<Pod> {
    Arc::new(object(
        json!({"metadata": {"name": "web-1", "namespace": "ns", "uid": uid,
        "labels": {naming::CLEANUP_LABEL: "web-1"},
        "annotations": {naming::OWNER_ANNOTATION: "web", naming::ATTEMPT_ANNOTATION: "2"}},
        "spec": {"containers": [], "nodeName": "n", "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}}]},
        "status": {"phase": phase}}),
    ))
}

fn status_of(set: StatefulSet, pods: Vec<Arc<Pod>>, claim_count: u32) -> SetStatus {
    let set = Arc::new(set);
    let cleanup: Vec<Arc<Pod>> = pods
        .iter()
        .filter(|p| p.name_any() == "web-1")
        .cloned()
        .collect();
    let claims = claims(claim_count);
    let observed = observe(
        &set,
        &Sources {
            sets: std::slice::from_ref(&set),
            claims: &claims,
            pods: &pods,
            cleanup_pods: &cleanup,
            ordinals: &crate::scaledown::watch::ordinals(&set, &claims, &pods),
            cleanups_in_flight: 0,
            rejections: BTreeMap::new(),
            disputed: Default::default(),
            read: SetRead::LiveAll,
            now: "2026-11-24T12:00:00Z".parse().expect("timestamp"),
        },
    );
    let plan = decide(&observed, &Policy::default());
    SetStatus::new(&observed, &plan, Some("CleanupFailed: x (5s ago)".into()))
}

use kube::ResourceExt;

#[test]
fn a_running_cleanup_and_the_next_orphan_waiting_for_it() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-cleanup-1", "Running")];
    let s = status_of(web(1, json!({})), pods, 3);
    assert_eq!(s.wanted, "0");
    assert_eq!(s.orphaned_claims, ["data-web-1", "data-web-2"]);
    assert_eq!(
        s.cleanups,
        [Cleanup {
            pod: "web-1".into(),
            ordinal: 1,
            phase: "Running".into(),
            attempt: 2
        }]
    );
    assert!(s.unproven_pods.is_empty() && s.gave_up.is_empty() && s.warnings.is_empty());
    assert!(!s.native_policy_conflict && s.has_finalizer && !s.deleting);
}

#[test]
fn a_succeeded_cleanup_shows_the_deletions_that_come_next() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-cleanup-1", "Succeeded")];
    let s = status_of(web(1, json!({})), pods, 2);
    assert!(
        s.next.iter().any(|n| n == "delete claim data-web-1"),
        "{:?}",
        s.next
    );
    assert!(
        s.next.iter().any(|n| n == "delete cleanup pod web-1"),
        "{:?}",
        s.next
    );
}

#[test]
fn a_forged_pod_is_shown_as_unproven_with_its_warning() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-forged", "Succeeded")];
    let s = status_of(web(1, json!({})), pods, 2);
    assert_eq!(s.unproven_pods, ["web-1"]);
    assert!(s.cleanups.is_empty());
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("UnprovenCleanupPod: ")),
        "{:?}",
        s.warnings
    );
    assert!(
        !s.next.iter().any(|n| n.starts_with("delete claim")),
        "{:?}",
        s.next
    );
}

#[test]
fn a_cleanup_that_failed_its_last_attempt_is_a_give_up() {
    let mut pod = (*cleanup_pod("uid-cleanup-1", "Failed")).clone();
    pod.annotations_mut()
        .insert(naming::ATTEMPT_ANNOTATION.into(), "3".into());
    let s = status_of(web(1, json!({})), vec![stateful_pod(), Arc::new(pod)], 2);
    assert_eq!(s.gave_up, [1]);
    assert!(
        s.warnings.iter().any(|w| w.starts_with("CleanupGaveUp: ")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn the_native_retention_policy_is_a_conflict() {
    let spec = json!({"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete"}});
    let s = status_of(web(3, spec), vec![stateful_pod()], 1);
    assert!(s.native_policy_conflict);
    assert_eq!(s.wanted, "0..2");
    let table = render(&[s], false, true);
    assert!(table.contains("nothing: whenScaled is Delete"), "{table}");
}

#[test]
fn the_table_aligns_columns_and_marks_empty_cells() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-cleanup-1", "Running")];
    let s = status_of(web(1, json!({})), pods, 3);
    let table = render(std::slice::from_ref(&s), false, true);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("NAMESPACE  STATEFULSET  STATUS      WANTED  ORPHANED"),
        "{table}"
    );
    let at = |line: &str, col: &str| line.find(col);
    assert_eq!(
        at(lines[0], "ORPHANED"),
        at(lines[1], "data-web-1,data-web-2"),
        "{table}"
    );
    assert!(lines[1].contains("web-1:Running#2"), "{table}");
    assert!(lines[1].contains("  -  "), "gave-up is empty: {table}");
    let wide = render(&[s], true, true);
    assert!(
        wide.lines()
            .next()
            .is_some_and(|h| h.ends_with("LAST-WARNING")),
        "{wide}"
    );
    assert!(wide.contains("CleanupFailed: x (5s ago)"), "{wide}");
}

#[test]
fn no_headers_leaves_out_the_header_line_only() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-cleanup-1", "Running")];
    let s = status_of(web(1, json!({})), pods, 3);
    let sets = [
        s.clone(),
        SetStatus {
            name: "db".into(),
            ..s
        },
    ];
    for output in [Output::Table, Output::Wide] {
        let with = format(&sets, output, true).expect("table");
        let without = format(&sets, output, false).expect("table");
        assert_eq!(with.lines().count(), 3, "{with}");
        assert!(with.starts_with("NAMESPACE"), "{with}");
        assert_eq!(without.lines().count(), 2, "{without}");
        assert!(!without.contains("NAMESPACE"), "{without}");
        let first: Vec<&str> = without
            .lines()
            .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
            .collect();
        assert_eq!(first, ["web", "db"], "{without}");
    }
    assert_eq!(format(&[], Output::Table, false).expect("table"), "");
}

#[test]
fn yaml_carries_the_same_fields_as_json() {
    let pods = vec![stateful_pod(), cleanup_pod("uid-cleanup-1", "Running")];
    let s = status_of(web(1, json!({})), pods, 3);
    let json: Value =
        serde_json::from_str(&format(std::slice::from_ref(&s), Output::Json, true).expect("json"))
            .expect("JSON");
    let yaml_text = format(&[s], Output::Yaml, false).expect("yaml");
    let yaml: Value = serde_saphyr::from_str(&yaml_text).expect("YAML");
    assert_eq!(yaml, json, "{yaml_text}");
    assert_eq!(yaml[0]["cleanups"][0]["pod"], "web-1", "{yaml_text}");
    assert!(yaml_text.contains("status: CleaningUp"), "{yaml_text}");
}
