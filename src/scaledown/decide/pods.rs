//! Pods named after an ordinal that are not a recorded cleanup pod of ours: a pod stuck
//! Terminating, another object's pod, and look-alikes of cleanup pods (never cleanups).

use k8s_openapi::jiff::Timestamp;

use super::plan::{Confirm, Plan, PodDeletion, RECORD_GRACE, Step};
use super::view::View;
use crate::reason::Reason;
use crate::scaledown::observe::{OrdinalFacts, PodFacts};

/// A pod of an orphaned ordinal that stays Terminating (its node is gone, or a finalizer holds it)
/// keeps the ordinal from being cleaned, and with a condemned stateful pod the StatefulSet
/// controller's status never lets a recorded cleanup pod go. Past `--cleanup-pending-timeout` it
/// is reported (the set's status says `Stalled`); the controller never force-deletes it.
pub(super) fn stuck_terminating(
    view: &View<'_>,
    ordinal: u32,
    facts: &OrdinalFacts,
    plan: &mut Plan,
) {
    let (Some(pod), Some(since)) = (&facts.pod, facts.terminating_since) else {
        return;
    };
    if !view.opted_in || !view.orphaned(ordinal) || view.hold.is_some() {
        return;
    }
    let timeout = view.policy.pending_timeout;
    let Some(deadline) = since.checked_add(timeout).ok() else {
        return;
    };
    if deadline > view.o.now {
        plan.requeue(crate::scaledown::observe::until(view.o.now, deadline));
        return;
    }
    plan.event(
        Reason::PodStuckTerminating,
        pod.uid.clone(),
        format!(
            "pod {} has been Terminating for more than {}s (its node may be gone); ordinal {ordinal} is not cleaned until it is gone. If its node is dead, delete the pod with --force",
            pod.name,
            timeout.as_secs()
        ),
    );
}

pub(super) fn foreign_pod(
    view: &View<'_>,
    ordinal: u32,
    pod: &PodFacts,
    claims: bool,
    plan: &mut Plan,
) {
    if view.opted_in && !view.o.set.deleting && view.orphaned(ordinal) && claims {
        plan.event(
            Reason::ForeignPod,
            pod.uid.clone(),
            format!(
                "pod {} is neither a pod of this StatefulSet nor a cleanup pod; ordinal {ordinal} is not cleaned while it exists",
                pod.name
            ),
        );
    }
}

/// A gated look-alike younger than [`RECORD_GRACE`] may be a live writer's (another instance, or
/// this one's pass that is recording it right now): it holds the ordinal, untouched, until it is
/// recorded or old enough to be a crashed writer's leftover. Returns whether it is held.
pub(super) fn held_for_writer(
    view: &View<'_>,
    created: Option<Timestamp>,
    plan: &mut Plan,
) -> bool {
    let Some(created) = created else {
        return false;
    };
    let left = crate::scaledown::observe::until(view.o.now, created + RECORD_GRACE);
    if left.is_zero() {
        return false;
    }
    plan.requeue(left);
    true
}

/// A look-alike: judged only on a live read (our record may be newer than the cache). Still gated,
/// it never ran and only blocks the name: delete it. Otherwise report it and touch nothing.
pub(super) fn unproven_pod(
    view: &View<'_>,
    ordinal: u32,
    pod: &PodFacts,
    gated: bool,
    plan: &mut Plan,
) {
    if !(view.opted_in || view.o.set.has_finalizer()) || pod.deleting {
        return;
    }
    plan.confirm(Confirm::Set);
    let what = format!(
        "pod {} looks like a cleanup pod of ordinal {ordinal}, but this controller has no record of creating it",
        pod.name
    );
    if gated {
        plan.event(
            Reason::UnprovenCleanupPod,
            pod.uid.clone(),
            format!("{what}; it never ran (it is still gated) and is deleted"),
        );
        plan.steps.push(Step::DeleteCleanupPod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            why: PodDeletion::NeverRan,
            ran_for: None,
        });
    } else {
        plan.event(
            Reason::UnprovenCleanupPod,
            pod.uid.clone(),
            format!("{what}; it is ignored, never deletes a claim, and ordinal {ordinal} is not cleaned while it exists"),
        );
    }
}
