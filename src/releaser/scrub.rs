//! The scrub of a PV: its state recorded on the PV, the temporary claim, and the JSON patches that
//! hand a PV to its scrub and release it. Pure; the scrub pod itself is rendered by
//! `crate::template::scrub`, the writes are in `act`.

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{Value, json};

use crate::naming::{SCRUB_PV_LABEL, SCRUB_STATE_ANNOTATION};

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
    /// `<state>:<uid>` as [`Scrub::format`] writes it; `None` for anything else.
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

    /// The annotation's value: `running:<uid>`, `scrubbed:<uid>` or `failed:<uid>`.
    pub fn format(&self) -> String {
        match self {
            Scrub::Running(u) => format!("running:{u}"),
            Scrub::Scrubbed(u) => format!("scrubbed:{u}"),
            Scrub::Failed(u) => format!("failed:{u}"),
        }
    }

    /// The UID of the temporary claim.
    pub fn temp_uid(&self) -> &str {
        match self {
            Scrub::Running(u) | Scrub::Scrubbed(u) | Scrub::Failed(u) => u,
        }
    }
}

/// Name of the scrub pod and of the temporary claim of `pv`.
pub use crate::naming::scrub_name as name;

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
