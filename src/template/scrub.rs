//! The releaser's scrub pod template (the StorageClass annotation
//! `reclaimable-pv-releaser.kubernetes.io/scrub-template`): checked under the same parser budgets as
//! the cleanup pod template ([`decode`]), and rendered for one PV. Pure.

use serde_json::{Map, Value, json};

use super::{array_entry, decode, object_entry};
use crate::naming::{SCRUB_PV_LABEL, scrub_name};

/// The scrub template checked (under the template parser's budgets): JSON or YAML of a pod with
/// containers that does not define volume `data`. The error says why it cannot make a scrub pod.
pub fn check(template: &str) -> Result<Value, String> {
    let pod = decode::decode(template).map_err(|e| e.to_string())?;
    if !pod.is_object() {
        return Err("the scrub template is not a pod".into());
    }
    let typed: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod.clone()).map_err(|e| e.to_string())?;
    let spec = typed.spec.ok_or("the scrub template has no spec")?;
    if spec.containers.is_empty() {
        return Err("the scrub template has no containers".into());
    }
    if spec.volumes.iter().flatten().any(|v| v.name == "data") {
        return Err("the scrub template must not define volume `data` (it is the PV)".into());
    }
    Ok(pod)
}

/// The scrub pod of `pv` from a template that passed [`check`]: the template's pod with our name,
/// namespace, label and annotation, restartPolicy `Never` unless it sets one, and the temporary
/// claim mounted as volume `data`.
pub fn render(template: &Value, pv: &str, namespace: &str) -> Value {
    let mut pod = match template {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let meta = object_entry(&mut pod, "metadata");
    meta.insert("name".into(), json!(scrub_name(pv)));
    meta.insert("namespace".into(), json!(namespace));
    object_entry(meta, "labels").insert(SCRUB_PV_LABEL.into(), json!("true"));
    object_entry(meta, "annotations").insert(SCRUB_PV_LABEL.into(), json!(pv));
    let spec = object_entry(&mut pod, "spec");
    spec.entry("restartPolicy").or_insert(json!("Never"));
    array_entry(spec, "volumes")
        .push(json!({"name": "data", "persistentVolumeClaim": {"claimName": scrub_name(pv)}}));
    Value::Object(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrub_pod_mounts_the_temporary_claim_and_keeps_the_template() {
        let template = r#"{"metadata":{"labels":{"app":"wipe"}},
            "spec":{"containers":[{"name":"wipe","image":"busybox",
                    "volumeMounts":[{"name":"data","mountPath":"/data"}]}]}}"#;
        let p = render(&check(template).expect("a pod"), "pv-1", "ops");
        assert_eq!(p["metadata"]["name"], "scrub-pv-1");
        assert_eq!(p["metadata"]["namespace"], "ops");
        assert_eq!(p["metadata"]["labels"]["app"], "wipe");
        assert_eq!(p["metadata"]["labels"][SCRUB_PV_LABEL], "true");
        assert_eq!(p["metadata"]["annotations"][SCRUB_PV_LABEL], "pv-1");
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        assert_eq!(
            p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "scrub-pv-1"
        );
        let clash = r#"{"spec":{"containers":[{"name":"a","image":"b"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#;
        assert!(check(clash).is_err());
        assert!(check(r#"{"spec":{"containers":[]}}"#).is_err());
        assert!(check("[1, 2]").is_err());
        assert!(check("{").is_err());
        assert!(check(r#"{"metadata":{}}"#).is_err(), "no spec");
    }
}
