//! The patches `act` sends to a StatefulSet and the release of a cleanup pod: each a
//! compare-and-swap or guarded by the object's UID, and what each answer means.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info};

use super::ops::{
    FIELD_MANAGER, annotation_path, describe_status, guard_ops, record_ops, status_merge,
    status_ops,
};
use crate::apijson;
use crate::error::{Error, Result, code, is_status};
use crate::naming;
use crate::scaledown::decide::status::Write;
use crate::scaledown::decide::{Propagation, mark_value};
use crate::scaledown::observe::{Record, SetFacts};

/// Patch parameters naming our field manager (managed fields show the controller's writes).
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Adds our finalizer: a strategic merge of the finalizer list (its merge key is the value), so no
/// resourceVersion is needed to keep another's finalizer, and kube-controller-manager's status
/// writes, which come by the thousand when thousands of sets change at once, never make it a 409.
/// Guarded by the set's UID: a set of that name created since gets nothing. `Ok(false)`: the set
/// is gone, replaced or being deleted (the API server refuses a new finalizer then).
async fn add_finalizer(client: &Client, set: &SetFacts, status: Option<&Write>) -> Result<bool> {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &set.namespace);
    let mut patch = json!({"metadata": {"uid": set.uid, "finalizers": [naming::FINALIZER]}});
    if let Some(write) = status {
        patch["metadata"]["annotations"] = status_merge(write);
    }
    let params = patch_params();
    match api
        .patch(&set.name, &params, &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT, code::INVALID]) => {
            debug!(set = %set.name, namespace = %set.namespace, error = %e, "set gone, replaced or being deleted before its finalizer");
            Ok(false)
        }
        Err(e) => Err(Error::kube("add the finalizer of statefulset", &set.name)(
            e,
        )),
    }
}

/// Removes our finalizer: the set's list without it, guarded by the resourceVersion it was read at
/// (a compare-and-swap: a finalizer added meanwhile is never dropped). `Ok(false)`: it raced a
/// change.
async fn remove_finalizer(
    client: &Client,
    set: &SetFacts,
    finalizers: &[String],
    resource_version: &str,
    status: Option<&Write>,
) -> Result<bool> {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &set.namespace);
    let mut patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
    if let Some(write) = status {
        patch["metadata"]["annotations"] = status_merge(write);
    }
    match api
        .patch(&set.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        // Our cache was behind; the newer set is on its way through the watch and brings
        // another pass, which decides again. Not a failure worth an error backoff.
        Err(e) if is_status(&e, &[code::CONFLICT]) => {
            debug!(set = %set.name, namespace = %set.namespace, "finalizer patch raced a change; the next pass retries");
            Ok(false)
        }
        Err(e) => Err(Error::kube("patch finalizers of statefulset", &set.name)(e)),
    }
}

/// Adds or removes our finalizer (see [`add_finalizer`] and [`remove_finalizer`]), with the
/// status annotations when `status` rides along. Whether the patch was applied.
pub async fn set_finalizers(
    client: &Client,
    set: &SetFacts,
    finalizers: &[String],
    resource_version: &str,
    adding: bool,
    status: Option<&Write>,
) -> Result<bool> {
    let written = if adding {
        add_finalizer(client, set, status).await?
    } else {
        remove_finalizer(client, set, finalizers, resource_version, status).await?
    };
    if written {
        let verb = if adding { "added" } else { "removed" };
        info!(set = %set.name, namespace = %set.namespace, "{verb} finalizer {}", naming::FINALIZER);
    }
    Ok(written)
}

/// Leaves the deletion mark on the set (merge patch guarded by its UID: a set of that name
/// created since gets none). `Ok(false)`: the set is gone or replaced, the plan is stale.
pub async fn mark_deletion(
    client: &Client,
    set: &SetFacts,
    propagation: Propagation,
) -> Result<bool> {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &set.namespace);
    let value = mark_value(propagation, &set.uid);
    let patch = json!({"metadata": {
        "uid": set.uid,
        "annotations": {naming::DELETION_ANNOTATION: value},
    }});
    let params = patch_params();
    match api.patch(&set.name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            info!(set = %set.name, namespace = %set.namespace, mark = %value, "marked the deletion's propagation");
            Ok(true)
        }
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT, code::INVALID]) => {
            debug!(set = %set.name, error = %e, "set gone or replaced before its deletion mark");
            Ok(false)
        }
        Err(e) => Err(Error::kube("mark the deletion of statefulset", &set.name)(
            e,
        )),
    }
}

/// Writes `records` on the set, only if its identity, spec (generation), template annotation
/// and our previous record are still those of `live`: a compare-and-swap, so a successful write
/// confirms every fact the verdicts were judged on.
pub async fn record(
    client: &Client,
    live: &SetFacts,
    records: &BTreeMap<u32, Record>,
    status: Option<&Write>,
) -> Result<()> {
    let mut ops = record_ops(live, records);
    // The status rides along: its ops test nothing, so they never fail the record's swap.
    ops.extend(status.map(status_ops).unwrap_or_default());
    match swap(client, live, &ops).await? {
        Ok(_) => Ok(()),
        // A failed test op (the set changed since the read) or a conflict: read again.
        Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
            debug!(set = %live.name, error = %e, "record lost a race");
            Err(Error::Contended {
                set: live.name.clone(),
                answer: e.to_string(),
            })
        }
        Err(source) => Err(Error::Unrecorded {
            set: live.name.clone(),
            source,
        }),
    }
}

/// Whether the set is still as `live` shows it (UID, generation, template annotation, our
/// record): a JSON patch of test ops only, which the API server applies without a change or
/// refuses. What it confirms can change again only in the round trip to the next write.
pub async fn guard(client: &Client, live: &SetFacts) -> Result<bool> {
    match swap(client, live, &guard_ops(live)).await? {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
            debug!(set = %live.name, error = %e, "the set changed since its read; no release");
            Ok(false)
        }
        Err(e) => Err(Error::kube("confirm the read of statefulset", &live.name)(
            e,
        )),
    }
}

/// Sends a JSON patch to the set, encoded as the API server encodes the set, so a test of the
/// template compares like with like. The outer error: the patch could not be encoded.
pub async fn swap(
    client: &Client,
    live: &SetFacts,
    ops: &[serde_json::Value],
) -> Result<std::result::Result<StatefulSet, kube::Error>> {
    let params = patch_params();
    let request =
        apijson::patch_request::<StatefulSet>(Some(&live.namespace), &live.name, &ops, &params)?;
    Ok(client.request::<StatefulSet>(request).await)
}

/// Removes our scheduling gate from a recorded cleanup pod (UID-guarded), so it may run.
/// `Ok(false)`: the pod was gone or replaced, nothing was released.
pub async fn release(client: &Client, ns: &str, name: &str, uid: &str) -> Result<bool> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = json!({
        "metadata": {"uid": uid},
        "spec": {"schedulingGates": [{"$patch": "delete", "name": naming::CONFIRM_GATE}]}
    });
    let params = patch_params();
    match pods.patch(name, &params, &Patch::Strategic(&patch)).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {
            debug!(pod = %name, "cleanup pod gone or replaced before its release");
            Ok(false)
        }
        Err(e) => Err(Error::kube("release cleanup pod", name)(e)),
    }
}

/// Writes the status annotations in a patch of their own, guarded by test ops on the set's UID and
/// on the status it carried when decided. `Ok(false)`: someone changed it meanwhile (that change
/// wakes another pass).
pub async fn status(client: &Client, set: &SetFacts, write: &Write) -> Result<bool> {
    let status_path = annotation_path(naming::STATUS_ANNOTATION);
    let carried = set.status.as_ref().map_or(json!(null), |s| json!(s));
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": set.uid}),
        json!({"op": "test", "path": status_path, "value": carried}),
    ];
    ops.extend(status_ops(write));
    let params = patch_params();
    let request =
        apijson::patch_request::<StatefulSet>(Some(&set.namespace), &set.name, &ops, &params)?;
    match client.request::<StatefulSet>(request).await {
        Ok(_) => {
            debug!(set = %set.name, namespace = %set.namespace, status = %describe_status(write), "wrote status");
            Ok(true)
        }
        Err(e) if is_status(&e, &[code::CONFLICT, code::INVALID, code::NOT_FOUND]) => {
            debug!(set = %set.name, error = %e, "status write lost a race; the next pass decides again");
            Ok(false)
        }
        Err(e) => Err(Error::kube(
            "patch status annotations of statefulset",
            &set.name,
        )(e)),
    }
}
