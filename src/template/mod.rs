//! The cleanup pod template: parse and validate the user's annotation, render one cleanup pod.
//!
//! The template stays a JSON value from parse to API call. It is type-checked against the Pod schema
//! we compile against, but what reaches the API server is the user's JSON with our additions, so
//! fields newer than our bindings pass through unchanged. Pure: no IO, no clock.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::{Map, Value, json};

use crate::naming;

/// Everything that can be wrong with a template. Each variant is one Warning Event reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the annotation is neither JSON nor YAML: {0}")]
    Unparseable(String),
    #[error("the template is not a pod: {0}")]
    NotAPod(String),
    #[error("restartPolicy {0:?} is not allowed: use OnFailure (the default) or Never")]
    RestartPolicy(String),
    #[error(
        "the cleanup pod's labels {labels} match the StatefulSet's selector, so the StatefulSet controller would adopt and delete it"
    )]
    SelectorOverlap { labels: String },
    #[error(
        "volume {0:?} has the name of a claim template but is not a persistentVolumeClaim volume"
    )]
    VolumeClash(String),
    #[error("field {0} may not be set in a cleanup pod template")]
    ForbiddenField(&'static str),
}

impl TemplateError {
    /// The Event reason for this problem.
    pub fn reason(&self) -> &'static str {
        match self {
            TemplateError::Unparseable(_) | TemplateError::NotAPod(_) => "CleanupTemplateInvalid",
            TemplateError::RestartPolicy(_) => "CleanupTemplateRestartPolicy",
            TemplateError::SelectorOverlap { .. } => "CleanupTemplateSelectorOverlap",
            TemplateError::VolumeClash(_) => "CleanupTemplateVolumeClash",
            TemplateError::ForbiddenField(_) => "CleanupTemplateForbiddenField",
        }
    }
}

/// A template that passed validation against one StatefulSet.
#[derive(Clone, Debug, PartialEq)]
pub struct CleanupTemplate {
    pod: Map<String, Value>,
}

/// What the rendered pod is for: one ordinal of one StatefulSet, and the claims it mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub namespace: &'a str,
    pub set: &'a str,
    pub ordinal: u32,
    pub replicas: u32,
    pub attempt: u32,
    /// One entry per claim template, in template order: the template name and, when the claim
    /// exists and is not being deleted, its name and UID. A missing claim is mounted as an empty
    /// directory so the template's volumeMounts stay valid.
    pub volumes: Vec<(&'a str, Option<(&'a str, &'a str)>)>,
}

/// Parses and validates `raw` for a StatefulSet with these claim templates and selector.
pub fn parse(
    raw: &str,
    claim_templates: &[String],
    selector: Option<&LabelSelector>,
) -> Result<CleanupTemplate, TemplateError> {
    let value: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        // YAML is a superset of JSON; keep the JSON error when both fail on JSON-looking input.
        Err(json_err) => serde_yaml_ng::from_str(raw).map_err(|yaml_err| {
            let msg = if raw.trim_start().starts_with('{') {
                json_err.to_string()
            } else {
                yaml_err.to_string()
            };
            TemplateError::Unparseable(msg)
        })?,
    };
    let Value::Object(pod) = value else {
        return Err(TemplateError::NotAPod(
            "expected a mapping with metadata and spec".into(),
        ));
    };
    check_kind(&pod)?;
    // Type-check against the Pod schema; unknown fields are ignored here and kept in `pod`.
    let typed: Pod = serde_json::from_value(Value::Object(pod.clone()))
        .map_err(|e| TemplateError::NotAPod(e.to_string()))?;
    let spec = typed
        .spec
        .ok_or_else(|| TemplateError::NotAPod("spec is missing".into()))?;
    if spec.containers.is_empty() {
        return Err(TemplateError::NotAPod("spec.containers is empty".into()));
    }
    match spec.restart_policy.as_deref() {
        None | Some("") | Some("OnFailure") | Some("Never") => {}
        Some(other) => return Err(TemplateError::RestartPolicy(other.to_string())),
    }
    let meta = typed.metadata;
    if meta.owner_references.is_some_and(|o| !o.is_empty()) {
        return Err(TemplateError::ForbiddenField("metadata.ownerReferences"));
    }
    if meta.finalizers.is_some_and(|f| !f.is_empty()) {
        return Err(TemplateError::ForbiddenField("metadata.finalizers"));
    }
    for volume in spec.volumes.iter().flatten() {
        if claim_templates.contains(&volume.name) && volume.persistent_volume_claim.is_none() {
            return Err(TemplateError::VolumeClash(volume.name.clone()));
        }
    }
    if let Some(selector) = selector {
        let mut labels = meta.labels.unwrap_or_default();
        // The cleanup label's value differs per ordinal; any value shows whether it could match.
        labels.insert(naming::CLEANUP_LABEL.into(), "x".into());
        if selects(selector, &labels) {
            let shown = labels
                .iter()
                .filter(|(k, _)| k.as_str() != naming::CLEANUP_LABEL)
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            return Err(TemplateError::SelectorOverlap {
                labels: format!("{{{shown}}}"),
            });
        }
    }
    Ok(CleanupTemplate { pod })
}

fn check_kind(pod: &Map<String, Value>) -> Result<(), TemplateError> {
    match pod.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == "Pod" => {}
        Some(other) => return Err(TemplateError::NotAPod(format!("kind is {other}, not Pod"))),
    }
    match pod.get("apiVersion") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if v == "v1" => Ok(()),
        Some(other) => Err(TemplateError::NotAPod(format!(
            "apiVersion is {other}, not v1"
        ))),
    }
}

/// Whether `selector` selects `labels`. A selector we cannot evaluate is treated as selecting, so
/// that an unusual selector blocks cleanup pods instead of letting the StatefulSet adopt them.
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    match Selector::try_from(selector.clone()) {
        Ok(s) => s.matches(labels),
        Err(_) => true,
    }
}

impl CleanupTemplate {
    /// The cleanup pod for `target`, as the JSON object to send to the API server.
    pub fn render(&self, target: &Target<'_>) -> Value {
        let mut pod = self.pod.clone();
        pod.insert("apiVersion".into(), json!("v1"));
        pod.insert("kind".into(), json!("Pod"));
        pod.remove("status");
        let name = naming::pod_name(target.set, target.ordinal);

        let meta = object_entry(&mut pod, "metadata");
        for server_owned in [
            "generateName",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            meta.remove(server_owned);
        }
        meta.insert("name".into(), json!(name));
        meta.insert("namespace".into(), json!(target.namespace));
        object_entry(meta, "labels").insert(naming::CLEANUP_LABEL.into(), json!(name));
        let claims: BTreeMap<&str, &str> = target
            .volumes
            .iter()
            .filter_map(|(_, claim)| *claim)
            .collect();
        let annotations = object_entry(meta, "annotations");
        annotations.insert(naming::OWNER_ANNOTATION.into(), json!(target.set));
        annotations.insert(
            naming::ATTEMPT_ANNOTATION.into(),
            json!(target.attempt.to_string()),
        );
        annotations.insert(
            naming::CLAIMS_ANNOTATION.into(),
            json!(serde_json::to_string(&claims).unwrap_or_default()),
        );

        let spec = object_entry(&mut pod, "spec");
        let policy = spec
            .get("restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("");
        if policy.is_empty() {
            spec.insert("restartPolicy".into(), json!("OnFailure"));
        }
        let env = [
            (naming::ENV_STATEFULSET, target.set.to_string()),
            (naming::ENV_NAMESPACE, target.namespace.to_string()),
            (naming::ENV_ORDINAL, target.ordinal.to_string()),
            (naming::ENV_REPLICAS, target.replicas.to_string()),
        ];
        for list in ["initContainers", "containers"] {
            if let Some(Value::Array(containers)) = spec.get_mut(list) {
                for container in containers.iter_mut().filter_map(Value::as_object_mut) {
                    set_env(container, &env);
                }
            }
        }
        let volumes = array_entry(spec, "volumes");
        for (template, claim) in &target.volumes {
            volumes.retain(|v| v.get("name").and_then(Value::as_str) != Some(template));
            volumes.push(match claim {
                Some((claim, _)) => {
                    json!({"name": template, "persistentVolumeClaim": {"claimName": claim}})
                }
                None => json!({"name": template, "emptyDir": {}}),
            });
        }
        Value::Object(pod)
    }
}

fn set_env(container: &mut Map<String, Value>, env: &[(&str, String)]) {
    let list = array_entry(container, "env");
    list.retain(|e| {
        let name = e.get("name").and_then(Value::as_str);
        !env.iter().any(|(n, _)| Some(*n) == name)
    });
    list.extend(
        env.iter()
            .map(|(name, value)| json!({"name": name, "value": value})),
    );
}

/// The object under `key`, created (or replacing a null or non-object) when needed.
fn object_entry<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = map.entry(key).or_insert_with(|| json!({}));
    if !slot.is_object() {
        *slot = json!({});
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

/// The array under `key`, created (or replacing a null or non-array) when needed.
fn array_entry<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let slot = map.entry(key).or_insert_with(|| json!([]));
    if !slot.is_array() {
        *slot = json!([]);
    }
    match slot {
        Value::Array(a) => a,
        _ => unreachable!("just made an array"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn templates() -> Vec<String> {
        vec!["data".into(), "logs".into()]
    }

    fn selector() -> LabelSelector {
        LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            ..Default::default()
        }
    }

    const GOOD: &str = r#"{"metadata":{"labels":{"app":"web-cleanup"}},
        "spec":{"containers":[{"name":"main","image":"busybox","volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#;

    fn target<'a>() -> Target<'a> {
        Target {
            namespace: "ns",
            set: "web",
            ordinal: 2,
            replicas: 2,
            attempt: 1,
            volumes: vec![("data", Some(("data-web-2", "uid-d"))), ("logs", None)],
        }
    }

    #[test]
    fn validation_table() {
        let cases: &[(&str, Result<(), &str>)] = &[
            (GOOD, Ok(())),
            // YAML is accepted
            (
                "metadata: {labels: {app: c}}\nspec:\n  containers:\n  - name: m\n    image: x\n",
                Ok(()),
            ),
            ("{not json", Err("CleanupTemplateInvalid")),
            ("- a\n- b\n", Err("CleanupTemplateInvalid")),
            (
                r#"{"spec":{"containers":"nope"}}"#,
                Err("CleanupTemplateInvalid"),
            ),
            (r#"{"metadata":{}}"#, Err("CleanupTemplateInvalid")),
            (
                r#"{"spec":{"containers":[]}}"#,
                Err("CleanupTemplateInvalid"),
            ),
            (
                r#"{"kind":"Deployment","spec":{"containers":[{"name":"m","image":"x"}]}}"#,
                Err("CleanupTemplateInvalid"),
            ),
            (
                r#"{"spec":{"restartPolicy":"Always","containers":[{"name":"m","image":"x"}]}}"#,
                Err("CleanupTemplateRestartPolicy"),
            ),
            (
                r#"{"spec":{"restartPolicy":"Never","containers":[{"name":"m","image":"x"}]}}"#,
                Ok(()),
            ),
            (
                r#"{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"m","image":"x"}]}}"#,
                Err("CleanupTemplateSelectorOverlap"),
            ),
            (
                r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#,
                Err("CleanupTemplateVolumeClash"),
            ),
            (
                r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"x"}}]}}"#,
                Ok(()),
            ),
            (
                r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"a","uid":"b"}]},"spec":{"containers":[{"name":"m","image":"x"}]}}"#,
                Err("CleanupTemplateForbiddenField"),
            ),
        ];
        for (raw, want) in cases {
            let got = parse(raw, &templates(), Some(&selector()))
                .map(|_| ())
                .map_err(|e| e.reason());
            assert_eq!(&got, want, "template {raw}");
        }
    }

    #[test]
    fn render_sets_identity_volumes_env_and_keeps_unknown_fields() {
        let raw = r#"{"metadata":{"name":"ignored","generateName":"g-","labels":{"app":"c"},"annotations":{"a":"b"}},
            "spec":{"futureField":{"x":1},"containers":[{"name":"m","image":"x","env":[{"name":"SCALEDOWN_ORDINAL","value":"99"},{"name":"KEEP","value":"1"}]}],
            "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"wrong"}},{"name":"scratch","emptyDir":{}}]}}"#;
        let pod = parse(raw, &templates(), Some(&selector()))
            .expect("valid")
            .render(&target());
        assert_eq!(pod["metadata"]["name"], "web-2");
        assert_eq!(pod["metadata"]["namespace"], "ns");
        assert!(pod["metadata"].get("generateName").is_none());
        assert_eq!(pod["metadata"]["labels"]["app"], "c");
        assert_eq!(pod["metadata"]["labels"]["scaledown-pod"], "web-2");
        assert_eq!(pod["metadata"]["annotations"]["a"], "b");
        assert_eq!(
            pod["metadata"]["annotations"][naming::OWNER_ANNOTATION],
            "web"
        );
        assert_eq!(
            pod["metadata"]["annotations"][naming::ATTEMPT_ANNOTATION],
            "1"
        );
        assert_eq!(
            pod["metadata"]["annotations"][naming::CLAIMS_ANNOTATION],
            r#"{"data-web-2":"uid-d"}"#
        );
        assert_eq!(pod["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(
            pod["spec"]["futureField"]["x"], 1,
            "unknown fields pass through"
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "scratch", "emptyDir": {}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
                {"name": "logs", "emptyDir": {}},
            ])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["env"],
            json!([
                {"name": "KEEP", "value": "1"},
                {"name": "SCALEDOWN_STATEFULSET", "value": "web"},
                {"name": "SCALEDOWN_NAMESPACE", "value": "ns"},
                {"name": "SCALEDOWN_ORDINAL", "value": "2"},
                {"name": "SCALEDOWN_REPLICAS", "value": "2"},
            ])
        );
        // The rendered pod is a valid Pod for our bindings too.
        let typed: Pod = serde_json::from_value(pod).expect("a pod");
        assert_eq!(
            typed.spec.and_then(|s| s.restart_policy).as_deref(),
            Some("OnFailure")
        );
    }

    #[test]
    fn never_is_kept() {
        let raw = r#"{"spec":{"restartPolicy":"Never","containers":[{"name":"m","image":"x"}]}}"#;
        let pod = parse(raw, &templates(), None)
            .expect("valid")
            .render(&target());
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
    }
}
