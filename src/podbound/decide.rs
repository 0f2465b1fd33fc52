//! DECIDE: what to do about one claim bound to a pod's life. Pure; the clock is passed in.
//!
//! The binding is made durable as an ownerReference from the claim to the pod's UID, so the
//! garbage collector deletes the claim once that pod is gone, even while this controller is down.
//! The controller attaches it as soon as it sees the pod. A claim whose pod is gone before it was
//! attached (the pod never seen, or the controller was down for its whole life) is deleted once the
//! claim is older than the grace period and no other pod mounts it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::observe::{ClaimFacts, PodRead};
use crate::reason::Reason;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    Skip,
    /// Read the named pod (and the pods mounting the claim) live, then decide again.
    ReadPod,
    /// Add an ownerReference to the pod with this UID (guarded by the claim's resourceVersion).
    Attach {
        pod: String,
        uid: String,
    },
    /// Delete the claim (UID precondition): its pod is gone and it was never attached.
    Delete,
    /// Look again after this long (the grace period is not over).
    Wait(Duration),
    /// Refuse, with a Warning of this reason and note; nothing is written.
    Refuse(Reason, String),
}

pub fn decide(claim: &ClaimFacts, read: &PodRead, now: Timestamp, grace: Duration) -> Plan {
    let Some(pod) = claim.pod.as_deref() else {
        return Plan::Skip;
    };
    if claim.deleting || claim.owned_by_pod(pod).is_some() {
        // Deleting already, or the garbage collector has it: nothing left for us.
        return Plan::Skip;
    }
    if pod.is_empty() {
        let note = "the bound-to-pod annotation names no pod".to_string();
        return Plan::Refuse(Reason::PodBindingRefused, note);
    }
    if claim
        .owners
        .iter()
        .any(|(kind, _, _)| kind == "StatefulSet")
    {
        let note = format!(
            "claim {} belongs to a StatefulSet; not bound to pod {pod}",
            claim.name
        );
        return Plan::Refuse(Reason::PodBindingRefused, note);
    }
    match read {
        PodRead::NotRead => Plan::ReadPod,
        PodRead::Exists { stateful: true, .. } => Plan::Refuse(
            Reason::PodBindingRefused,
            format!(
                "pod {pod} belongs to a StatefulSet, whose claims are the scale-down controller's; claim {} is not bound to it",
                claim.name
            ),
        ),
        PodRead::Exists { uid, .. } => Plan::Attach {
            pod: pod.to_string(),
            uid: uid.clone(),
        },
        PodRead::Gone { users } if !users.is_empty() => Plan::Refuse(
            Reason::ClaimInUse,
            format!(
                "claim {} outlived pod {pod} but is mounted by {}; kept",
                claim.name,
                users.join(", ")
            ),
        ),
        PodRead::Gone { .. } => {
            let age = claim.created.map_or(Duration::MAX, |c| {
                now.duration_since(c).try_into().unwrap_or(Duration::ZERO)
            });
            if age >= grace {
                Plan::Delete
            } else {
                Plan::Wait(grace - age)
            }
        }
    }
}

#[cfg(test)]
mod tests;
