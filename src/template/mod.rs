//! The cleanup pod template: parse and validate the user's annotation, render one cleanup pod.
//!
//! The template stays a JSON value from parse to API call. It is type-checked against the Pod schema
//! we compile against, but what reaches the API server is the user's JSON with our additions, so
//! fields newer than our bindings pass through unchanged. Pure: no IO, no clock. Bounded: parsing
//! and rendering stay within the limits of [`decode`] whatever the annotation holds.

pub mod decode;
mod error;
#[cfg(test)]
mod fuzz;
pub mod inherit;
pub mod scrub;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::{Map, Value, json};

pub use self::decode::{
    MAX_ALIASES, MAX_ANCHORS, MAX_DEPTH, MAX_DOCUMENTS, MAX_EVENTS, MAX_INPUT_BYTES,
    MAX_MERGE_KEYS, MAX_NODES, MAX_POD_BYTES, MAX_REPLAYED_EVENTS, MAX_SCALAR_BYTES,
};
pub use self::error::TemplateError;
use self::error::clip;
pub(crate) use self::error::quoted;
use crate::naming;

/// A template that passed validation against one StatefulSet.
#[derive(Clone, Debug, PartialEq)]
pub struct CleanupTemplate {
    pod: Map<String, Value>,
}

/// What the rendered pod is for: one ordinal of one StatefulSet, and the claims it mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// The StatefulSet's namespace.
    pub namespace: &'a str,
    /// The StatefulSet's name.
    pub set: &'a str,
    /// The ordinal cleaned up.
    pub ordinal: u32,
    /// The StatefulSet's replicas.
    pub replicas: u32,
    /// The attempt (1 for the first).
    pub attempt: u32,
    /// One entry per claim template, in template order: the template name and, when the claim
    /// exists and is not being deleted, its name and UID. A missing claim is mounted as an empty
    /// directory so the template's volumeMounts stay valid.
    pub volumes: Vec<(&'a str, Option<(&'a str, &'a str)>)>,
}

/// Parses and validates `raw` for a StatefulSet with these claim templates and selector.
///
/// A template that passes renders, for any target of this set with names of legal lengths, a pod
/// within [`MAX_POD_BYTES`]: the check renders it once for the longest such names.
pub fn parse(
    raw: &str,
    claim_templates: &[String],
    selector: Option<&LabelSelector>,
) -> Result<CleanupTemplate, TemplateError> {
    let Value::Object(pod) = decode::decode(raw)? else {
        return Err(TemplateError::NotAPod(
            "expected a mapping with metadata and spec".into(),
        ));
    };
    check_kind(&pod)?;
    // Type-check against the Pod schema; unknown fields are ignored here and kept in `pod`.
    let typed: Pod = serde_json::from_value(Value::Object(pod.clone()))
        .map_err(|e| TemplateError::NotAPod(clip(&e.to_string())))?;
    let spec = typed
        .spec
        .ok_or_else(|| TemplateError::NotAPod("spec is missing".into()))?;
    if spec.containers.is_empty() {
        return Err(TemplateError::NotAPod("spec.containers is empty".into()));
    }
    match spec.restart_policy.as_deref() {
        None | Some("") | Some("OnFailure") | Some("Never") => {}
        Some(other) => return Err(TemplateError::RestartPolicy(quoted(other))),
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
            return Err(TemplateError::VolumeClash(quoted(&volume.name)));
        }
    }
    if let Some(selector) = selector {
        check_selector(selector, meta.labels.unwrap_or_default())?;
    }
    let template = CleanupTemplate { pod };
    template.render(&longest_target(claim_templates).as_target())?;
    Ok(template)
}

fn check_kind(pod: &Map<String, Value>) -> Result<(), TemplateError> {
    match pod.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == "Pod" => {}
        Some(other) => {
            return Err(TemplateError::NotAPod(clip(&format!(
                "kind is {other}, not Pod"
            ))));
        }
    }
    match pod.get("apiVersion") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if v == "v1" => Ok(()),
        Some(other) => Err(TemplateError::NotAPod(clip(&format!(
            "apiVersion is {other}, not v1"
        )))),
    }
}

/// Refuses labels that the StatefulSet's selector would select.
fn check_selector(
    selector: &LabelSelector,
    mut labels: BTreeMap<String, String>,
) -> Result<(), TemplateError> {
    // The cleanup label's value differs per ordinal; any value shows whether it could match.
    labels.insert(naming::CLEANUP_LABEL.into(), "x".into());
    if !selects(selector, &labels) {
        return Ok(());
    }
    let shown = labels
        .iter()
        .filter(|(k, _)| k.as_str() != naming::CLEANUP_LABEL)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Err(TemplateError::SelectorOverlap {
        labels: clip(&format!("{{{shown}}}")),
    })
}

/// Whether `selector` selects `labels`. A selector we cannot evaluate is treated as selecting, so
/// that an unusual selector blocks cleanup pods instead of letting the StatefulSet adopt them.
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    match Selector::try_from(selector.clone()) {
        Ok(s) => s.matches(labels),
        Err(_) => true,
    }
}

/// The names of the largest target a set with these claim templates can have: namespace and set
/// names of 63 characters (the limit of a label value, which the pod name is), the widest ordinal
/// and replica count, every claim present.
struct LongestTarget<'a> {
    namespace: String,
    claims: Vec<(&'a str, String)>,
}

const UID_SHAPE: &str = "00000000-0000-0000-0000-000000000000";

fn longest_target(claim_templates: &[String]) -> LongestTarget<'_> {
    let namespace = "n".repeat(63);
    let claims = claim_templates
        .iter()
        .map(|t| (t.as_str(), naming::claim_name(t, &namespace, u32::MAX)))
        .collect();
    LongestTarget { namespace, claims }
}

impl LongestTarget<'_> {
    fn as_target(&self) -> Target<'_> {
        Target {
            namespace: &self.namespace,
            set: &self.namespace,
            ordinal: u32::MAX,
            replicas: u32::MAX,
            attempt: u32::MAX,
            volumes: self
                .claims
                .iter()
                .map(|(t, claim)| (*t, Some((claim.as_str(), UID_SHAPE))))
                .collect(),
        }
    }
}

impl CleanupTemplate {
    /// The cleanup pod for `target`, as the JSON object to send to the API server. It carries the
    /// scheduling gate [`naming::CONFIRM_GATE`], so it cannot start before it is confirmed.
    /// Refused when its JSON is over [`MAX_POD_BYTES`].
    pub fn render(&self, target: &Target<'_>) -> Result<Value, TemplateError> {
        self.render_inheriting(target, &Map::new())
    }

    /// [`CleanupTemplate::render`], with the StatefulSet's scheduling fields `inherited` (see
    /// [`inherit`]) added where the template does not set them. The size limit applies to the
    /// result, so a set whose own fields make the pod too large gets the Warning, not a refusal
    /// by the API server on every pass.
    pub fn render_inheriting(
        &self,
        target: &Target<'_>,
        inherited: &Map<String, Value>,
    ) -> Result<Value, TemplateError> {
        let mut pod = self.pod.clone();
        pod.insert("apiVersion".into(), json!("v1"));
        pod.insert("kind".into(), json!("Pod"));
        pod.remove("status");
        render_metadata(object_entry(&mut pod, "metadata"), target);
        let spec = object_entry(&mut pod, "spec");
        render_spec(spec, target);
        inherit::merge(spec, inherited);
        let pod = Value::Object(pod);
        let size = json_size(&pod);
        if size > MAX_POD_BYTES {
            return Err(TemplateError::TooLarge {
                what: if inherited.is_empty() {
                    "the rendered cleanup pod"
                } else {
                    "the rendered cleanup pod with the StatefulSet's scheduling fields"
                },
                size,
                limit: MAX_POD_BYTES,
            });
        }
        Ok(pod)
    }
}

fn render_metadata(meta: &mut Map<String, Value>, target: &Target<'_>) {
    let name = naming::pod_name(target.set, target.ordinal);
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
}

fn render_spec(spec: &mut Map<String, Value>, target: &Target<'_>) {
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
                // A container that fails without writing /dev/termination-log still says why:
                // the kubelet puts the end of its log there (at most 80 lines, 2 KiB), which the
                // CleanupFailed Event and the Stalled reason carry. A template's own policy stays.
                container
                    .entry("terminationMessagePolicy")
                    .or_insert_with(|| json!("FallbackToLogsOnError"));
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
    // Our gate once, after the template's own gates (which stay; their owners remove them).
    let gates = array_entry(spec, "schedulingGates");
    gates.retain(|g| g.get("name").and_then(Value::as_str) != Some(naming::CONFIRM_GATE));
    gates.push(json!({"name": naming::CONFIRM_GATE}));
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

/// The length of `value` as compact JSON, counted without building the text.
fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        // A Value always serializes; should it not, treat it as too large rather than send it.
        Err(_) => usize::MAX,
    }
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
