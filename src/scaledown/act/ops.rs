//! What `act` sends, as plain data: the JSON patches of the record, its guard and the status
//! annotations (their `test` ops), the Events' references, a UID-guarded delete, and one line per
//! write for dry-run records and logs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Preconditions};
use serde_json::json;
use tracing::debug;

use crate::error::{Error, Result, code, is_status, status_code};
use crate::naming;
use crate::reason::Reason;
use crate::scaledown::decide::status::Write;
use crate::scaledown::decide::{Event, Step};
use crate::scaledown::expect::{Gone, Mark};
use crate::scaledown::observe::{Created, Record, SetFacts, format_records};

/// Field manager of every write we make.
pub const FIELD_MANAGER: &str = "statefulset-scaledown-controller";

/// The API server refused to create the cleanup pod of `ordinal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The ordinal whose cleanup pod was refused.
    pub ordinal: u32,
    /// The HTTP status code of the refusal.
    pub code: u16,
    /// The API server's message.
    pub message: String,
}

/// What carrying out a plan did, beyond the writes themselves.
#[derive(Debug, Default)]
pub struct Done {
    /// The cleanup pods created (gated), waiting for their verdict.
    pub created: Vec<Created>,
    /// The creations the API server refused.
    pub refused: Vec<Refusal>,
    /// The plan's status change rode in its finalizer patch: `Some(true)` written, `Some(false)`
    /// the patch raced a change (the next pass decides again); `None` no finalizer patch was sent.
    pub status: Option<bool>,
    /// The objects this plan deleted (or found deleted already): the caches may still show them.
    pub deleted: Vec<Gone>,
    /// A guard found the set changed since the read the plan was decided on: the steps after it
    /// were not carried out, and the next pass decides again on a newer read.
    pub stale: bool,
    /// The next-attempt marks this plan wrote: the claim cache may not show them yet.
    pub marked: Vec<Mark>,
    /// This plan added our finalizer to the set, with the status annotations that rode in the
    /// same patch (`None`: removed): the set cache may not show them yet.
    pub finalizer_added: Option<BTreeMap<String, Option<String>>>,
    /// What the pass reports of what was done, in the order it was done: the pass's report
    /// stage sends it after act, also when a step failed midway.
    pub reports: Vec<Report>,
}

impl Done {
    /// Reports `reason` on the set, about the object written (`related`).
    pub fn report(&mut self, reason: Reason, key: &str, note: String, related: ObjectReference) {
        let event = Event {
            reason,
            note,
            key: key.to_string(),
        };
        self.reports.push(Report::Event(event, Some(related)));
    }
}

/// One thing a pass reports about what act did.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// An Event on the set, with the object written as its related object, if any.
    Event(Event, Option<ObjectReference>),
    /// Under `--dry-run`: a write not made, as [`describe`] says it (a `DryRun` record).
    DryRun(String),
}

/// A cleanup pod to create, as its step gives it.
pub struct NewPod<'a> {
    pub ordinal: u32,
    pub attempt: u32,
    pub pod: &'a serde_json::Value,
    pub claims: &'a BTreeMap<String, String>,
}

/// What a create of a cleanup pod came to.
pub enum Creation {
    Created(String),
    Exists,
    Refused { code: u16, message: String },
}

/// What a UID-guarded delete found.
pub enum Deleted {
    /// Deleted now.
    Now,
    /// Already gone, or the name belongs to a newer object (404, or 409 on the UID precondition).
    Before,
}

/// Deletes `name` if it still has `uid`.
pub async fn delete<K>(api: &Api<K>, name: &str, uid: &str, action: &'static str) -> Result<Deleted>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(Deleted::Now),
        // 404: already gone. 409: the name now belongs to a newer object, which is not ours to delete.
        Err(e) if is_status(&e, &[code::NOT_FOUND, code::CONFLICT]) => {
            debug!(name, code = ?status_code(&e), "already deleted or replaced");
            Ok(Deleted::Before)
        }
        Err(e) => Err(Error::kube(action, name)(e)),
    }
}

pub fn set_ref(set: &SetFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("StatefulSet".into()),
        name: Some(set.name.clone()),
        namespace: Some(set.namespace.clone()),
        uid: Some(set.uid.clone()),
        ..Default::default()
    }
}

pub fn pod_ref(ns: &str, name: &str, uid: &str) -> ObjectReference {
    core_ref("Pod", ns, name, uid)
}

/// A reference to a core/v1 object, for an Event's related object.
pub fn core_ref(kind: &str, ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        namespace: Some(ns.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// One line saying what a write step would do (for dry-run logs and Events).
pub fn describe(step: &Step) -> String {
    match step {
        Step::SetFinalizers { adding: true, .. } => format!("add finalizer {}", naming::FINALIZER),
        Step::SetFinalizers { adding: false, .. } => {
            format!("remove finalizer {}", naming::FINALIZER)
        }
        Step::MarkDeletion { propagation } => format!("mark deletion {propagation:?}"),
        Step::DeleteStatefulPod { name, .. } => format!("delete pod {name}"),
        Step::CreateCleanupPod {
            ordinal, attempt, ..
        } => format!("create cleanup pod for ordinal {ordinal} (attempt {attempt})"),
        Step::Release { name, .. } => format!("release cleanup pod {name}"),
        Step::DeleteClaim { name, .. } => format!("delete claim {name}"),
        Step::DeleteCleanupPod { name, .. } => format!("delete cleanup pod {name}"),
        Step::MarkNextAttempt { claim, attempt, .. } => {
            format!("mark claim {claim} with next attempt {attempt:?}")
        }
        Step::Event(Event { reason, .. }) => format!("publish event {reason}"),
    }
}

/// The JSON patch of a record: `test` ops on the set's UID, generation, template annotation and
/// our previous record (or its absence) as `live` shows them, then the new record. Sent encoded by
/// [`apijson::to_vec`], so the template compares equal exactly when it is unchanged.
pub fn record_ops(live: &SetFacts, records: &BTreeMap<u32, Record>) -> Vec<serde_json::Value> {
    let path = annotation_path(naming::RECORD_ANNOTATION);
    let mut ops = guard_ops(live);
    ops.push(json!({"op": "add", "path": path, "value": format_records(records)}));
    ops
}

/// The `test` ops of a record: the set's UID, generation, template annotation and our record (or
/// its absence) as `live` shows them.
pub fn guard_ops(live: &SetFacts) -> Vec<serde_json::Value> {
    let path = annotation_path(naming::RECORD_ANNOTATION);
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": live.uid}),
        json!({"op": "test", "path": "/metadata/generation", "value": live.generation}),
    ];
    if let Some(template) = &live.template {
        let template_path = annotation_path(naming::TEMPLATE_ANNOTATION);
        ops.push(json!({"op": "test", "path": template_path, "value": template}));
    }
    // No record in the read: the API server takes a null test value as "absent", so a record
    // written meanwhile by another pass or writer is never overwritten from a stale read.
    let old = live.record_raw.as_ref().map_or(json!(null), |r| json!(r));
    ops.push(json!({"op": "test", "path": path, "value": old}));
    ops
}

/// The JSON pointer of an annotation (RFC 6901 escapes).
pub fn annotation_path(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// JSON-patch ops writing the status annotations: they test nothing, and removing the reason is
/// an add then a remove, so they apply whether or not the reason is there.
pub fn status_ops(write: &Write) -> Vec<serde_json::Value> {
    let status = annotation_path(naming::STATUS_ANNOTATION);
    let reason = annotation_path(naming::STATUS_REASON_ANNOTATION);
    let gone = |path: &str| {
        [
            json!({"op": "add", "path": path, "value": ""}),
            json!({"op": "remove", "path": path}),
        ]
    };
    match write {
        Write::Set(line) => {
            let mut ops = vec![json!({"op": "add", "path": status, "value": line.status.as_str()})];
            match &line.reason {
                Some(text) => ops.push(json!({"op": "add", "path": reason, "value": text})),
                None => ops.extend(gone(&reason)),
            }
            ops
        }
        Write::Remove => gone(&status).into_iter().chain(gone(&reason)).collect(),
    }
}

/// The status annotations as a merge patch's `metadata.annotations` (null removes).
pub fn status_merge(write: &Write) -> serde_json::Value {
    json!(status_annotations(write))
}

/// The status annotations a write leaves on the set (`None`: removed).
pub fn status_annotations(write: &Write) -> BTreeMap<String, Option<String>> {
    let (status, reason) = match write {
        Write::Set(line) => (Some(line.status.as_str().to_string()), line.reason.clone()),
        Write::Remove => (None, None),
    };
    BTreeMap::from([
        (naming::STATUS_ANNOTATION.to_string(), status),
        (naming::STATUS_REASON_ANNOTATION.to_string(), reason),
    ])
}

/// One line saying what a status write does (for dry-run records and logs).
pub fn describe_status(write: &Write) -> String {
    match write {
        Write::Set(line) => match &line.reason {
            Some(reason) => format!("set status {} ({reason})", line.status),
            None => format!("set status {}", line.status),
        },
        Write::Remove => "remove the status annotations".into(),
    }
}
