//! Inherited scheduling: the fields of a StatefulSet's own pod template that decide where its pods
//! may run, handed to its cleanup pod so that it runs where the set runs (a tainted, dedicated
//! node pool) instead of elsewhere or nowhere.
//!
//! The fields, and only these: `tolerations`, `nodeSelector`, `affinity.nodeAffinity`,
//! `priorityClassName`, `imagePullSecrets` and the pod-level `securityContext`. Pod affinity and
//! anti-affinity are not inherited: a set's anti-affinity usually keeps its own pods apart, so the
//! cleanup pod would be pushed away from the set's remaining pods (or, with affinity, drawn to
//! them), which is not what a one-off pod draining a claim wants.
//!
//! The cleanup template wins field by field: a field it sets (even to an empty list or map) is
//! kept as it is; for `affinity`, the set's `nodeAffinity` is added beside the template's
//! `podAffinity`/`podAntiAffinity` unless the template has a `nodeAffinity` of its own. Pure.

use k8s_openapi::api::core::v1::{Affinity, PodSpec};
use serde_json::{Map, Value};

use crate::naming;

/// What a StatefulSet's cleanup pod inherits, from its annotation and the flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inherit {
    /// Nothing: the template is used as written.
    Nothing,
    /// The StatefulSet's scheduling fields (see [`keep_scheduling`]).
    Scheduling,
    /// The annotation holds a value we do not know (trimmed): nothing is inherited.
    Unknown(String),
}

/// What a set with `annotation` (the value of [`naming::INHERIT_ANNOTATION`]) inherits when
/// `by_default` (`--inherit-scheduling`) is the answer for sets without one. Blank reads as absent.
pub fn inherit(annotation: Option<&str>, by_default: bool) -> Inherit {
    match annotation.map(str::trim).filter(|v| !v.is_empty()) {
        None if by_default => Inherit::Scheduling,
        None => Inherit::Nothing,
        Some(naming::INHERIT_SCHEDULING) => Inherit::Scheduling,
        Some(naming::INHERIT_NONE) => Inherit::Nothing,
        Some(other) => Inherit::Unknown(other.to_string()),
    }
}

/// `spec` reduced to the inherited fields (the rest, containers included, is dropped), so that a
/// cache keeps what a cleanup pod may inherit and nothing more.
pub fn keep_scheduling(spec: PodSpec) -> PodSpec {
    PodSpec {
        tolerations: spec.tolerations,
        node_selector: spec.node_selector,
        affinity: spec
            .affinity
            .and_then(|a| a.node_affinity)
            .map(|node| Affinity {
                node_affinity: Some(node),
                ..Default::default()
            }),
        priority_class_name: spec.priority_class_name,
        image_pull_secrets: spec.image_pull_secrets,
        security_context: spec.security_context,
        ..Default::default()
    }
}

/// The inherited fields `spec` sets, as the JSON of a pod spec (empty lists, maps and strings
/// count as unset). `affinity` holds only `nodeAffinity`.
pub fn scheduling_of(spec: &PodSpec) -> Map<String, Value> {
    let mut fields = Map::new();
    put(&mut fields, "tolerations", &spec.tolerations);
    put(&mut fields, "nodeSelector", &spec.node_selector);
    let node = spec.affinity.as_ref().and_then(|a| a.node_affinity.clone());
    let affinity = node.map(|node| Affinity {
        node_affinity: Some(node),
        ..Default::default()
    });
    put(&mut fields, "affinity", &affinity);
    put(&mut fields, "priorityClassName", &spec.priority_class_name);
    put(&mut fields, "imagePullSecrets", &spec.image_pull_secrets);
    put(&mut fields, "securityContext", &spec.security_context);
    fields
}

fn put<T: serde::Serialize>(fields: &mut Map<String, Value>, key: &str, value: &Option<T>) {
    let Some(value) = value.as_ref().and_then(|v| serde_json::to_value(v).ok()) else {
        return;
    };
    let empty = match &value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty() || o.get("nodeAffinity").is_some_and(is_empty_object),
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    if !empty {
        fields.insert(key.into(), value);
    }
}

fn is_empty_object(value: &Value) -> bool {
    value.as_object().is_some_and(Map::is_empty)
}

/// Adds `inherited` (from [`scheduling_of`]) to the rendered cleanup pod's `spec`, the template
/// winning field by field.
pub fn merge(spec: &mut Map<String, Value>, inherited: &Map<String, Value>) {
    for (key, value) in inherited {
        if key == "affinity" {
            merge_affinity(spec, value);
        } else if !is_set(spec.get(key)) {
            spec.insert(key.clone(), value.clone());
        }
    }
}

fn merge_affinity(spec: &mut Map<String, Value>, inherited: &Value) {
    let Some(node) = inherited.get("nodeAffinity") else {
        return;
    };
    match spec.get_mut("affinity") {
        Some(Value::Object(affinity)) => {
            if !is_set(affinity.get("nodeAffinity")) {
                affinity.insert("nodeAffinity".into(), node.clone());
            }
        }
        _ => {
            let mut affinity = Map::new();
            affinity.insert("nodeAffinity".into(), node.clone());
            spec.insert("affinity".into(), Value::Object(affinity));
        }
    }
}

/// A field the template sets: present and not null (an empty list or map is the template's choice).
fn is_set(value: Option<&Value>) -> bool {
    !matches!(value, None | Some(Value::Null))
}

#[cfg(test)]
mod tests;
