//! DECIDE: what to do about one claim bound to a pod's life. Pure; the clock is passed in.
//!
//! The binding is made durable as ownerReferences from the claim to pods' UIDs, so the garbage
//! collector deletes the claim once every owner is gone, even while this controller is down. The
//! controller attaches the named pod as soon as it sees it, and with it every other pod that mounts
//! the claim and has not finished; while the claim is bound, each pod that starts to mount it is
//! added too. So a claim another live pod mounts is never marked for deletion: that pod is one of
//! its owners. A claim whose pod is gone before it was attached (the pod never seen, or the
//! controller was down for its whole life) is deleted once the grace period is over and no pod
//! mounts it. The grace counts from the first time the controller saw the claim wait for that pod,
//! which it records on the claim ([`Plan::Record`]), not from the claim's creation: an old claim
//! annotated now for a pod still to come (or a typo) has the whole grace.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::observe::{ClaimFacts, Fresh, NamedPod, PodRead, PodRef, Waiting};
use crate::reason::Reason;

/// What a pass over one claim does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing.
    Skip,
    /// Read the pods and StatefulSets (from the caches), then decide again.
    ReadPods,
    /// Add ownerReferences to these pods, in one JSON patch that tests the claim's UID and
    /// resourceVersion.
    Attach(Vec<PodRef>),
    /// Delete the claim (UID and resourceVersion preconditions): its pod is gone, it was never
    /// attached and no pod mounts it.
    Delete,
    /// Record on the claim that it waits for its pod since this time (the grace starts), in one
    /// JSON patch that tests the claim's UID and resourceVersion.
    Record(Waiting),
    /// Look again after this long (the grace period is not over).
    Wait(Duration),
    /// Refuse, with a Warning of this reason and note; nothing is written.
    Refuse(Reason, String),
}

impl Plan {
    /// The read this plan must have been decided on to be carried out (`None`: any, or none).
    /// Deciding from the caches is enough to skip, wait or refuse. A binding is to the named pod's
    /// UID, which a cache that lags could hold for a pod since replaced: that pod, and the
    /// StatefulSets that could make the claim, are read live first. A deletion also needs a live
    /// list of the namespace's pods: no pod of the name, and none that mounts the claim. Recording
    /// when the wait began needs only the caches (a record made while the pod exists only starts a
    /// grace that is never used).
    pub fn needs(&self) -> Option<Fresh> {
        match self {
            Plan::ReadPods => Some(Fresh::Cached),
            Plan::Attach(_) => Some(Fresh::Named),
            Plan::Delete => Some(Fresh::Namespace),
            Plan::Skip | Plan::Record(_) | Plan::Wait(_) | Plan::Refuse(..) => None,
        }
    }
}

/// The plan for `claim`, from what `read` showed, at `now`, with `grace` for a missing pod.
pub fn decide(claim: &ClaimFacts, read: &PodRead, now: Timestamp, grace: Duration) -> Plan {
    let Some(pod) = claim.pod.as_deref() else {
        return Plan::Skip;
    };
    if claim.deleting {
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
    let PodRead::Read {
        named,
        users,
        statefulset,
    } = read
    else {
        return Plan::ReadPods;
    };
    if let Some(set) = statefulset {
        let note = format!(
            "claim {} is named as a claim of StatefulSet {set} (<template>-<set>-<ordinal>), whose claims are the scale-down controller's; not bound to pod {pod}",
            claim.name
        );
        return Plan::Refuse(Reason::PodBindingRefused, note);
    }
    if claim.bound() {
        // The garbage collector has it; keep every pod that mounts it among its owners.
        return attach_missing(claim, Vec::new(), users);
    }
    match named {
        Some(NamedPod { stateful: true, .. }) => Plan::Refuse(
            Reason::PodBindingRefused,
            format!(
                "pod {pod} belongs to a StatefulSet, whose claims are the scale-down controller's; claim {} is not bound to it",
                claim.name
            ),
        ),
        Some(NamedPod { uid, .. }) => {
            let first = PodRef {
                name: pod.to_string(),
                uid: uid.clone(),
            };
            attach_missing(claim, vec![first], users)
        }
        None if !users.is_empty() => Plan::Refuse(
            Reason::ClaimInUse,
            format!(
                "claim {} outlived pod {pod} but is mounted by {}; kept",
                claim.name,
                names(users)
            ),
        ),
        None => waited(claim, pod, now, grace),
    }
}

/// How old a claim must be before the wait for its pod is recorded. A pod is usually created right
/// after its claim, and the pod watch can deliver it after the claim's: a record written in that
/// moment changes the claim's resourceVersion under the owner patch that follows, which the API
/// server then refuses (`podbound` bench, 2026-11-28: 766 of 2,621 claim patches answered 422).
/// Recording later only starts the grace later.
pub const RECORD_AFTER: Duration = Duration::from_secs(5);

/// A claim whose pod `pod` is not there and that no pod mounts: deleted once it has waited for
/// that pod for the grace, counted from the recorded start of the wait (a start in the future, a
/// clock set back, counts as now). Without a record of a wait for that pod (none, unreadable, or
/// for another pod name), the wait starts now and is recorded, once the claim is
/// [`RECORD_AFTER`] old; at once if its creation time is later than `now` (the clocks differ, and
/// its age is unknown: waiting for it could take as long as they differ).
fn waited(claim: &ClaimFacts, pod: &str, now: Timestamp, grace: Duration) -> Plan {
    let Some(waiting) = claim.waiting.as_ref().filter(|w| w.pod == pod) else {
        let young = claim
            .created
            .filter(|created| *created <= now)
            .and_then(|created| RECORD_AFTER.checked_sub(age(now, created)))
            .filter(|left| !left.is_zero());
        return match young {
            Some(left) => Plan::Wait(left),
            None => Plan::Record(Waiting {
                pod: pod.to_string(),
                since: now,
            }),
        };
    };
    let age = age(now, waiting.since);
    if age >= grace {
        Plan::Delete
    } else {
        Plan::Wait(grace - age)
    }
}

/// The time from `since` to `now`; zero if `since` is later.
fn age(now: Timestamp, since: Timestamp) -> Duration {
    now.duration_since(since)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// `first`, then the `users` that are neither owners of the claim already nor in `first`.
fn attach_missing(claim: &ClaimFacts, mut first: Vec<PodRef>, users: &[PodRef]) -> Plan {
    for user in users {
        if !claim.owned_by(&user.uid) && !first.iter().any(|p| p.uid == user.uid) {
            first.push(user.clone());
        }
    }
    first.retain(|p| !claim.owned_by(&p.uid));
    if first.is_empty() {
        Plan::Skip
    } else {
        Plan::Attach(first)
    }
}

/// "a, b" for notes.
pub fn names(pods: &[PodRef]) -> String {
    pods.iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
