//! The scrub pod and the temporary claim of a PV, built from the StorageClass's scrub template.
//! Pure: names, objects and the JSON patches that hand a PV to its scrub; the writes are in `act`.

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{Map, Value, json};

use crate::naming::{SCRUB_PV_LABEL, SCRUB_STATE_ANNOTATION};
use crate::template::decode;

/// Where the scrub of a PV stands, from the PV's own annotation (only the releaser writes PVs'
/// annotations it reads; PVs are cluster objects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scrub {
    /// The temporary claim with this UID holds the PV; the scrub pod runs or is to be created.
    Running(String),
    /// The scrub pod succeeded; the PV is released once the temporary claim is gone.
    Scrubbed(String),
    /// The scrub pod failed: the PV is never handed out.
    Failed(String),
}

impl Scrub {
    pub fn parse(raw: &str) -> Option<Scrub> {
        let (state, uid) = raw.split_once(':')?;
        let uid = uid.to_string();
        match state {
            "running" => Some(Scrub::Running(uid)),
            "scrubbed" => Some(Scrub::Scrubbed(uid)),
            "failed" => Some(Scrub::Failed(uid)),
            _ => None,
        }
    }

    pub fn format(&self) -> String {
        match self {
            Scrub::Running(u) => format!("running:{u}"),
            Scrub::Scrubbed(u) => format!("scrubbed:{u}"),
            Scrub::Failed(u) => format!("failed:{u}"),
        }
    }

    pub fn temp_uid(&self) -> &str {
        match self {
            Scrub::Running(u) | Scrub::Scrubbed(u) | Scrub::Failed(u) => u,
        }
    }
}

/// Name of the scrub pod and of the temporary claim of `pv`.
pub fn name(pv: &str) -> String {
    let mut name = format!("scrub-{pv}");
    name.truncate(253);
    name
}

/// The temporary claim that takes `pv` over: same class, modes and size, bound by `volumeName`.
pub fn temp_claim(pv: &PersistentVolume, namespace: &str) -> Value {
    let spec = pv.spec.clone().unwrap_or_default();
    let size = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name(&pv_name), "namespace": namespace,
                     "labels": {SCRUB_PV_LABEL: "true"},
                     "annotations": {SCRUB_PV_LABEL: pv_name}},
        "spec": {"accessModes": spec.access_modes.unwrap_or_default(),
                 "storageClassName": spec.storage_class_name,
                 "volumeMode": spec.volume_mode,
                 "volumeName": pv_name,
                 "resources": {"requests": {"storage": size}}}
    })
}

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
    let meta = object(&mut pod, "metadata");
    meta.insert("name".into(), json!(name(pv)));
    meta.insert("namespace".into(), json!(namespace));
    object(meta, "labels").insert(SCRUB_PV_LABEL.into(), json!("true"));
    object(meta, "annotations").insert(SCRUB_PV_LABEL.into(), json!(pv));
    let spec = object(&mut pod, "spec");
    spec.entry("restartPolicy").or_insert(json!("Never"));
    let volumes = spec.entry("volumes").or_insert(json!([]));
    if !volumes.is_array() {
        *volumes = json!([]);
    }
    if let Value::Array(list) = volumes {
        list.push(json!({"name": "data", "persistentVolumeClaim": {"claimName": name(pv)}}));
    }
    Value::Object(pod)
}

/// `map[key]` as an object, made one if it is missing or not an object.
fn object<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = map.entry(key).or_insert_with(|| json!({}));
    if !slot.is_object() {
        *slot = json!({});
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

fn annotation_path() -> String {
    format!(
        "/metadata/annotations/{}",
        SCRUB_STATE_ANNOTATION.replace('~', "~0").replace('/', "~1")
    )
}

/// The JSON patch that hands `pv` (whose claimRef names `old_uid`) to the temporary claim.
pub fn hand_over(pv: &PersistentVolume, old_uid: &str, namespace: &str, temp_uid: &str) -> Value {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let claim_ref = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "namespace": namespace, "name": name(&pv_name), "uid": temp_uid});
    let state = Scrub::Running(temp_uid.into()).format();
    let record = if pv.metadata.annotations.is_some() {
        json!({"op": "add", "path": annotation_path(), "value": state})
    } else {
        json!({"op": "add", "path": "/metadata/annotations",
               "value": {SCRUB_STATE_ANNOTATION: state}})
    };
    json!([
        {"op": "test", "path": "/spec/claimRef/uid", "value": old_uid},
        {"op": "replace", "path": "/spec/claimRef", "value": claim_ref},
        record,
    ])
}

/// The JSON patch that records `to` over `from`.
pub fn record(from: &Scrub, to: &Scrub) -> Value {
    json!([
        {"op": "test", "path": annotation_path(), "value": from.format()},
        {"op": "replace", "path": annotation_path(), "value": to.format()},
    ])
}

/// The JSON patch that releases a PV: claimRef removed if it names `claim_uid`, and our record
/// (when there is one) with it.
pub fn release(claim_uid: &str, recorded: bool) -> Value {
    let mut ops = vec![
        json!({"op": "test", "path": "/spec/claimRef/uid", "value": claim_uid}),
        json!({"op": "remove", "path": "/spec/claimRef"}),
    ];
    if recorded {
        ops.push(json!({"op": "remove", "path": annotation_path()}));
    }
    Value::Array(ops)
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

    #[test]
    fn the_hand_over_tests_the_old_claim_first() {
        let pv: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pv-1"}})).expect("pv");
        let ops = hand_over(&pv, "uid-old", "ops", "uid-temp");
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/spec/claimRef/uid", "value": "uid-old"})
        );
        assert_eq!(ops[1]["value"]["uid"], "uid-temp");
        assert_eq!(ops[2]["value"][SCRUB_STATE_ANNOTATION], "running:uid-temp");
        let release = release("uid-temp", true);
        assert_eq!(release[0]["value"], "uid-temp");
        assert_eq!(release.as_array().map(Vec::len), Some(3));
    }
}
