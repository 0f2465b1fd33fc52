//! DECIDE: a pure function from the facts about one StatefulSet to the plan of writes that moves it
//! toward "every orphaned ordinal cleaned, nothing else touched". No IO, no clock (the time is one
//! of the facts), deterministic: the same facts always give the same plan.
//!
//! The rules, in the order they apply:
//! 1. Opt-in: a set takes part when it has claim templates and a non-blank template annotation. It
//!    then carries our finalizer; an opted-out set loses it once no cleanup of it is in flight.
//! 2. An ordinal is orphaned when it lies outside `[start, start + replicas)`; when the set is being
//!    deleted, every ordinal is, except with orphan propagation or `whenDeleted: Delete`.
//!    With `whenScaled: Delete` Kubernetes deletes scale-down claims itself: we only warn.
//! 3. A cleanup pod is created (gated) for an orphaned ordinal with live claims once no pod of that
//!    name exists; OrderedReady sets one at a time, highest ordinal first; Parallel sets all at
//!    once; never more than `max_in_flight` across everything we watch; a refused creation backs
//!    off and gives up like a failed pod. `confirm_created` then decides, on a read made after the
//!    pod holds the name, whether it may run.
//! 4. Only a pod whose UID is in our record on the set is a cleanup pod. A Succeeded one: on a live
//!    read that still shows the ordinal orphaned, delete the recorded claims (by UID, none in use
//!    by another pod), then the pod; wanted again: keep the claims, delete the pod. A Failed one:
//!    retry after a capped exponential backoff, then give up and keep it. An unproven look-alike
//!    is never a cleanup: still gated (it never ran) it is deleted, else it is only reported.
//! 5. A set deleted with background propagation: we delete its pods, highest ordinal first.
//! 6. The finalizer goes when the set is deleted and no claim and no cleanup is left.
//! 7. A set with the paused annotation (`"true"`) gets no new cleanup pod, no retry and no
//!    release of a recorded gated pod; what already runs finishes, a success deletes its claims.
//!    Deleted while paused, it keeps its finalizer until it is resumed and cleaned.
//!
//! Steps that delete data or release the set (rules 4 and 6), and judging look-alikes, are only
//! planned from a live read of the set: decided from the cache, the plan asks for one instead.

use std::collections::BTreeMap;

use crate::naming;
use crate::reason::Reason;
use crate::scaledown::observe::{
    ClaimFacts, Observed, Phase, PodFacts, PodRole, SetFacts, SetRead,
};

/// The record to write on the set after new cleanup pods were confirmed: the entries already on
/// the set `live` whose ordinal still has claims or a pod in `observed` (the others are finished
/// cleanups), plus the new ones, which replace older entries of their ordinal.
pub fn next_records(
    live: &SetFacts,
    observed: &Observed,
    runs: &[(u32, crate::scaledown::observe::Record)],
) -> BTreeMap<u32, crate::scaledown::observe::Record> {
    let active = |n: &u32| {
        observed
            .ordinals
            .get(n)
            .is_some_and(|f| !f.claims.is_empty() || f.pod.is_some())
    };
    let mut records: BTreeMap<u32, crate::scaledown::observe::Record> = live
        .records
        .iter()
        .filter(|(n, _)| active(n))
        .map(|(n, r)| (*n, r.clone()))
        .collect();
    records.extend(runs.iter().cloned());
    records
}

/// What the walk over the ordinals found.
#[derive(Default)]
struct Scan<'a> {
    /// Orphaned ordinals with live claims that are not someone else's, highest first.
    pending: Vec<u32>,
    set_has_cleanup_pod: bool,
    /// A cleanup pod of this set that has not failed (running, pending or finishing).
    in_flight: bool,
    stateful_pods: Vec<&'a PodFacts>,
    claims_left: bool,
}

/// The plan for one StatefulSet, from its facts and the flags' policy. Pure: same facts, same plan.
pub fn decide(o: &Observed, policy: &Policy) -> Plan {
    let mut plan = Plan::default();
    add_finalizer(&o.set, &mut plan);
    let view = View::new(o, policy, &mut plan);
    if let Some(propagation) = deletion::to_mark(o, view.deletion).filter(|_| view.opted_in) {
        plan.steps.push(Step::MarkDeletion { propagation });
    }
    let scan = scan_ordinals(&view, &mut plan);
    hold_events(&view, &scan, &mut plan);
    if let (None, Some(template)) = (view.hold, &view.template) {
        create_cleanup_pods(
            &view,
            template,
            &scan.pending,
            scan.set_has_cleanup_pod,
            &mut plan,
        );
    }
    if view.background_deletion && view.opted_in {
        delete_stateful_pods(&o.set, &scan.stateful_pods, &mut plan);
    }
    release_finalizer(&view, &scan, &mut plan);
    if o.set.deleting && (view.unproven || plan.steps.iter().any(Step::destructive)) {
        // The propagation is inferred from the pods: only a live read of them (after the set)
        // tells an orphan deletion from a background one (see `propagation`).
        plan.confirm(Confirm::SetAndNamespace);
    }
    match plan.confirm {
        Some(depth) if !covers(o.read, depth) => Plan {
            confirm: Some(depth),
            ..Plan::default()
        },
        _ => Plan {
            confirm: None,
            ..plan
        },
    }
}

/// Whether a read of this kind is enough for steps that need `depth`.
fn covers(read: SetRead, depth: Confirm) -> bool {
    match depth {
        Confirm::Set => matches!(read, SetRead::LiveSet | SetRead::LiveAll),
        Confirm::SetAndNamespace => read == SetRead::LiveAll,
    }
}

fn add_finalizer(set: &SetFacts, plan: &mut Plan) {
    let opted_in = set.template.is_some() && !set.claim_templates.is_empty();
    if opted_in && !set.deleting && !set.has_finalizer() {
        let mut finalizers = set.finalizers.clone();
        finalizers.push(naming::FINALIZER.into());
        plan.steps.push(Step::SetFinalizers {
            finalizers,
            resource_version: set.resource_version.clone(),
            adding: true,
        });
    }
}

fn scan_ordinals<'a>(view: &View<'a>, plan: &mut Plan) -> Scan<'a> {
    let mut scan = Scan::default();
    for (&ordinal, facts) in view.o.ordinals.iter().rev() {
        let live: Vec<&ClaimFacts> = facts.claims.iter().filter(|c| c.live()).collect();
        let conflict = live.iter().find_map(|c| Some((c, c.not_ours.as_ref()?)));
        if let Some((claim, other)) = conflict {
            if view.opted_in && view.orphaned(ordinal) {
                plan.event(
                    Reason::ClaimOwnershipConflict,
                    claim.name.clone(),
                    format!(
                        "claim {} is not proven this StatefulSet's: {other}; ordinal {ordinal} is left alone (not cleaned, no claim deleted)",
                        claim.name
                    ),
                );
            }
        } else if view.orphaned(ordinal) && !live.is_empty() {
            scan.claims_left = true;
            scan.pending.push(ordinal);
        }
        let Some(pod) = &facts.pod else { continue };
        stuck_terminating(view, ordinal, facts, plan);
        match &pod.role {
            PodRole::Stateful => {
                scan.stateful_pods.push(pod);
                clear_marks(plan, facts, None);
            }
            PodRole::Foreign => foreign_pod(view, ordinal, pod, !live.is_empty(), plan),
            PodRole::Unproven { gated, created } => {
                if !(*gated && held_for_writer(view, *created, plan)) {
                    unproven_pod(view, ordinal, pod, *gated, plan);
                }
            }
            PodRole::Cleanup(cleanup) => {
                scan.set_has_cleanup_pod = true;
                scan.in_flight |= cleanup.phase != Phase::Failed;
                clear_marks(plan, facts, Some(cleanup.attempt));
                let step = CleanupStep {
                    view,
                    ordinal,
                    facts,
                    pod,
                    cleanup,
                };
                step.plan(plan);
            }
        }
    }
    scan
}

/// The ordinals a deletion nothing proves keeps: those its spec still wants, with a live claim
/// of the set's.
fn kept_unproven(view: &View<'_>) -> Vec<u32> {
    if !view.unproven || !view.opted_in || !view.o.set.has_finalizer() {
        return Vec::new();
    }
    view.o
        .ordinals
        .iter()
        .filter(|(n, f)| {
            !view.orphaned(**n) && f.claims.iter().any(|c| c.live() && c.not_ours.is_none())
        })
        .map(|(n, _)| *n)
        .collect()
}

/// Whether an orphaned ordinal has a claim, live or being deleted.
fn orphaned_claims(view: &View<'_>) -> bool {
    view.o
        .ordinals
        .iter()
        .any(|(n, f)| view.orphaned(*n) && !f.claims.is_empty())
}

fn hold_events(view: &View<'_>, scan: &Scan<'_>, plan: &mut Plan) {
    let set = &view.o.set;
    match view.hold {
        // Claims being deleted count: Kubernetes may delete them before any pass saw them live.
        Some(Hold::RetainedByKubernetes) if scan.claims_left || orphaned_claims(view) => {
            let (field, what) = if set.deleting {
                ("whenDeleted", "deletion")
            } else {
                ("whenScaled", "scale-down")
            };
            plan.event(
                Reason::RetentionPolicyConflict,
                field,
                format!(
                    "persistentVolumeClaimRetentionPolicy.{field} is Delete, so Kubernetes deletes these claims itself; no cleanup pod runs on {what}"
                ),
            );
        }
        Some(Hold::OrphanDeletion) => plan.event(
            Reason::OrphanDeletion,
            "orphan",
            "the StatefulSet was deleted with orphan propagation: its pods and claims are kept and no cleanup runs".into(),
        ),
        _ => {}
    }
    let kept = kept_unproven(view);
    if let (Some(first), Some(last)) = (kept.first(), kept.last()) {
        plan.event(
            Reason::DeletionUnproven,
            format!("unproven {first}-{last}"),
            format!(
                "the StatefulSet is being deleted, but no orphan or foregroundDeletion finalizer, no pod of its ordinals and no mark of ours ({}) is left to tell an orphan deletion from a background one: the claims of ordinals {} that its spec still wants are kept, as after an orphan deletion; delete them yourself if their data is not needed",
                naming::DELETION_ANNOTATION,
                kept.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
        );
    }
}

/// Nobody deletes the pods of a set held by a finalizer: we do, the way a scale to zero would.
fn delete_stateful_pods(set: &SetFacts, stateful_pods: &[&PodFacts], plan: &mut Plan) {
    let one_at_a_time = !set.parallel;
    if one_at_a_time && stateful_pods.iter().any(|p| p.deleting) {
        return;
    }
    let mut alive = stateful_pods.iter().filter(|p| !p.deleting);
    let chosen: Vec<_> = if one_at_a_time {
        alive.next().into_iter().collect()
    } else {
        alive.collect()
    };
    for pod in chosen {
        plan.steps.push(Step::DeleteStatefulPod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        });
    }
}

fn release_finalizer(view: &View<'_>, scan: &Scan<'_>, plan: &mut Plan) {
    let set = &view.o.set;
    if !set.has_finalizer() {
        return;
    }
    let done = if !view.opted_in || !set.deleting {
        // Opted out: release the set once nothing of ours runs; opted in and alive: keep it.
        !view.opted_in && !scan.in_flight
    } else if matches!(
        view.hold,
        Some(Hold::OrphanDeletion | Hold::RetainedByKubernetes)
    ) {
        !scan.in_flight
    } else {
        !scan.in_flight && !scan.claims_left
    };
    if done {
        // Decided on a live list of the namespace, so no claim or cleanup pod is overlooked.
        plan.confirm(Confirm::SetAndNamespace);
        plan.steps.push(Step::SetFinalizers {
            finalizers: set
                .finalizers
                .iter()
                .filter(|f| *f != naming::FINALIZER)
                .cloned()
                .collect(),
            resource_version: set.resource_version.clone(),
            adding: false,
        });
    }
}

mod cleanup;
mod deletion;
pub mod plan;
mod pods;
pub mod status;
mod view;
pub use cleanup::{Admission, Stage, admit, confirm_created, may_release, runs, verdicts};
pub use deletion::{Propagation, mark_value, propagation};
pub use plan::{Confirm, Event, Plan, PodDeletion, RECORD_GRACE, Step, Verdict};
pub use view::Policy;

use cleanup::{CleanupStep, clear_marks, create_cleanup_pods};
use pods::{foreign_pod, held_for_writer, stuck_terminating, unproven_pod};
use view::{Hold, View};

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
