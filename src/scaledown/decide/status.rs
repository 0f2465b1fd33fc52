//! The one-word status of an opted-in StatefulSet (`Idle`, `CleaningUp`, `Stalled`, `Paused`) and
//! the reason of a `Stalled` or `Paused` one, from the facts and the plan `decide` made of them.
//! Pure like the rest of decide. The controller writes it to two annotations of the set only when
//! it differs from what the set carries; `kubectl scaledown status` shows the same value.

use std::collections::{BTreeMap, BTreeSet};

pub use super::plan::{Change, Line, Status, Write};
use super::plan::{Event, Plan, Step};
use crate::reason::Reason;
use crate::scaledown::observe::{Observed, PodRole};

/// Why a cleanup cannot go on, in the order causes are listed in a reason.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stall {
    /// With the last attempt's termination message, if it left one.
    GaveUp {
        attempts: u32,
        message: Option<String>,
    },
    Refused {
        code: u16,
        given_up: bool,
    },
    Template(Reason),
    Stuck,
    Terminating,
    ClaimInUse,
    Foreign,
    Unproven,
    NotOurs,
    Contended,
}

impl Stall {
    /// The reason's text for these ordinals (sorted; possibly none, for a template).
    fn render(&self, ordinals: &BTreeSet<u32>) -> String {
        let which = ordinal_list(ordinals);
        match self {
            Stall::GaveUp { attempts, message } => {
                let said = message
                    .as_ref()
                    .map_or(String::new(), |m| format!(" ({m})"));
                format!("CleanupFailed: {which} gave up after {attempts} attempts{said}")
            }
            Stall::Refused { code, given_up } => {
                let next = if *given_up { "given up" } else { "retrying" };
                format!("CleanupPodRejected: {which} refused by the API server ({code}), {next}")
            }
            Stall::Template(reason) if ordinals.is_empty() => {
                format!("{reason}: the template annotation cannot make a cleanup pod")
            }
            Stall::Template(reason) => format!(
                "{reason}: {which} {} for a template that can make a cleanup pod",
                waits(ordinals)
            ),
            Stall::Stuck => {
                format!("CleanupPodStuck: {which} Pending past --cleanup-pending-timeout")
            }
            Stall::Terminating => format!(
                "PodStuckTerminating: {which} held by a pod Terminating past --cleanup-pending-timeout"
            ),
            Stall::ClaimInUse => format!("ClaimInUse: {which} with a claim mounted by another pod"),
            Stall::Foreign => {
                format!("ForeignPod: {which} held by a pod neither the set's nor a cleanup pod")
            }
            Stall::Unproven => {
                format!("UnprovenCleanupPod: {which} held by a look-alike not in the record")
            }
            Stall::NotOurs => format!(
                "ClaimOwnershipConflict: {which} with a claim not proven this set's (left alone)"
            ),
            Stall::Contended => format!(
                "RecordContended: {which} could not be recorded on the StatefulSet (it kept changing)"
            ),
        }
    }
}

/// The verb after [`ordinal_list`].
fn waits(ordinals: &BTreeSet<u32>) -> &'static str {
    if ordinals.len() == 1 { "waits" } else { "wait" }
}

/// `ordinal 2` or `ordinals 2,3`.
fn ordinal_list(ordinals: &BTreeSet<u32>) -> String {
    let list: Vec<String> = ordinals.iter().map(u32::to_string).collect();
    let noun = if list.len() == 1 {
        "ordinal"
    } else {
        "ordinals"
    };
    format!("{noun} {}", list.join(","))
}

/// The ordinal an Event of the plan is about, from its key: a pod's UID (a cleanup or look-alike
/// pod), `refused-<ordinal>`, `<claim UID> <pods>` (a claim in use) or a claim's name (a claim not
/// proven ours). `None` for others.
pub fn event_ordinal(o: &Observed, event: &Event) -> Option<u32> {
    if let Some(ordinal) = event.key.strip_prefix("refused-") {
        return ordinal.parse().ok();
    }
    if event.reason == Reason::ClaimOwnershipConflict {
        return o
            .ordinals
            .iter()
            .find_map(|(n, f)| f.claims.iter().any(|c| c.name == event.key).then_some(*n));
    }
    let by_pod = o
        .ordinals
        .iter()
        .find_map(|(n, f)| (f.pod.as_ref()?.uid == event.key).then_some(*n));
    if by_pod.is_some() || event.reason != Reason::ClaimInUse {
        return by_pod;
    }
    let claim_uid = event.key.split(' ').next()?;
    o.ordinals
        .iter()
        .find_map(|(n, f)| f.claims.iter().any(|c| c.uid == claim_uid).then_some(*n))
}

/// Whether the plan's events say Kubernetes, not us, deals with the unwanted claims.
fn not_ours(plan: &Plan) -> bool {
    events(plan).any(|e| {
        matches!(
            e.reason,
            Reason::RetentionPolicyConflict | Reason::OrphanDeletion
        )
    })
}

fn events(plan: &Plan) -> impl Iterator<Item = &Event> {
    plan.steps.iter().filter_map(|s| match s {
        Step::Event(e) => Some(e),
        _ => None,
    })
}

/// Unwanted ordinals with a claim of this set (not another set's) that is not gone yet.
fn waiting(o: &Observed) -> BTreeSet<u32> {
    o.ordinals
        .iter()
        .filter(|(n, f)| !o.set.wants(**n) && f.claims.iter().any(|c| c.not_ours.is_none()))
        .map(|(n, _)| *n)
        .collect()
}

/// The stalls the plan and the facts show, each with its ordinals.
fn stalls(o: &Observed, plan: &Plan, contended: &BTreeSet<u32>) -> BTreeMap<Stall, BTreeSet<u32>> {
    let mut found: BTreeMap<Stall, BTreeSet<u32>> = BTreeMap::new();
    let waiting = waiting(o);
    let deleted: BTreeSet<&str> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::DeleteCleanupPod { uid, .. } => Some(uid.as_str()),
            _ => None,
        })
        .collect();
    let mut given_up_refusals = BTreeSet::new();
    for event in events(plan) {
        let ordinal = event_ordinal(o, event);
        let stall = match event.reason {
            Reason::CleanupGaveUp if event.key.starts_with("refused-") => {
                given_up_refusals.extend(ordinal);
                continue;
            }
            Reason::CleanupGaveUp => Stall::GaveUp {
                attempts: ordinal.and_then(|n| attempt(o, n)).unwrap_or(1),
                message: ordinal.and_then(|n| last_words(o, n)),
            },
            Reason::CleanupTemplateInvalid
            | Reason::CleanupTemplateTooLarge
            | Reason::CleanupTemplateRestartPolicy
            | Reason::CleanupTemplateSelectorOverlap
            | Reason::CleanupTemplateVolumeClash
            | Reason::CleanupTemplateForbiddenField => {
                found
                    .entry(Stall::Template(event.reason))
                    .or_default()
                    .extend(waiting.iter().copied());
                continue;
            }
            Reason::CleanupPodStuck => Stall::Stuck,
            Reason::PodStuckTerminating => Stall::Terminating,
            Reason::ClaimInUse => Stall::ClaimInUse,
            Reason::ForeignPod => Stall::Foreign,
            Reason::ClaimOwnershipConflict => Stall::NotOurs,
            // A gated look-alike is deleted in this plan: it only held the name for a moment.
            Reason::UnprovenCleanupPod if !deleted.contains(event.key.as_str()) => Stall::Unproven,
            _ => continue,
        };
        found.entry(stall).or_default().extend(ordinal);
    }
    let creating: BTreeSet<u32> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::CreateCleanupPod { ordinal, .. } => Some(*ordinal),
            _ => None,
        })
        .collect();
    // A refusal whose backoff is over is tried again in this plan: not (yet) a stall.
    let refused = o
        .rejections
        .iter()
        .filter(|(n, _)| waiting.contains(n) && !creating.contains(n));
    for (n, refusal) in refused {
        let stall = Stall::Refused {
            code: refusal.code,
            given_up: given_up_refusals.contains(n),
        };
        found.entry(stall).or_default().insert(*n);
    }
    let lost: BTreeSet<u32> = contended.intersection(&waiting).copied().collect();
    if !lost.is_empty() {
        found.insert(Stall::Contended, lost);
    }
    found.retain(|stall, ordinals| !ordinals.is_empty() || matches!(stall, Stall::Template(_)));
    found
}

/// The attempt of the recorded cleanup pod of `ordinal`.
fn attempt(o: &Observed, ordinal: u32) -> Option<u32> {
    match &o.ordinals.get(&ordinal)?.pod.as_ref()?.role {
        PodRole::Cleanup(c) => Some(c.attempt),
        _ => None,
    }
}

/// The termination message of the failed cleanup pod of `ordinal`, if it left one.
fn last_words(o: &Observed, ordinal: u32) -> Option<String> {
    match &o.ordinals.get(&ordinal)?.pod.as_ref()?.role {
        PodRole::Cleanup(c) => c.failure.as_ref()?.message.clone(),
        _ => None,
    }
}

/// Whether anything of ours is left to do: an unwanted ordinal's claim, or a cleanup pod.
fn busy(o: &Observed, plan: &Plan) -> bool {
    let cleanup_pods = o
        .ordinals
        .values()
        .any(|f| matches!(f.pod.as_ref().map(|p| &p.role), Some(PodRole::Cleanup(_))));
    cleanup_pods || (!not_ours(plan) && !waiting(o).is_empty())
}

/// The status of the set in `o`, given the plan decided on it and the ordinals whose record this
/// process could not write (its memory, like refusals). `None` for a set that did not opt in.
pub fn line(o: &Observed, plan: &Plan, contended: &BTreeSet<u32>) -> Option<Line> {
    let set = &o.set;
    if set.template.is_none() || set.claim_templates.is_empty() {
        return None;
    }
    if set.paused {
        let waiting = waiting(o);
        let reason = if waiting.is_empty() {
            "Paused: no ordinal waits for a cleanup".to_string()
        } else {
            let (which, verb) = (ordinal_list(&waiting), waits(&waiting));
            format!("Paused: {which} {verb} for a cleanup")
        };
        return Some(Line {
            status: Status::Paused,
            reason: Some(reason),
        });
    }
    let stalls = stalls(o, plan, contended);
    if !stalls.is_empty() {
        let reasons: Vec<String> = stalls.iter().map(|(s, n)| s.render(n)).collect();
        return Some(Line {
            status: Status::Stalled,
            reason: Some(reasons.join("; ")),
        });
    }
    let status = if busy(o, plan) {
        Status::CleaningUp
    } else {
        Status::Idle
    };
    Some(Line {
        status,
        reason: None,
    })
}

/// What to write to the status annotations, if they differ from what the set carries: the new
/// status, or their removal once the set opted out (a removal rides in the patch that releases
/// the finalizer when the plan has one; with no finalizer left it is a write of its own).
pub fn change(o: &Observed, plan: &Plan, contended: &BTreeSet<u32>) -> Option<Change> {
    let set = &o.set;
    let carried = (set.status.as_deref(), set.status_reason.as_deref());
    let Some(line) = line(o, plan, contended) else {
        let releasing = plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::SetFinalizers { adding: false, .. }));
        let present = carried != (None, None);
        return (present && (releasing || !set.has_finalizer())).then_some(Change {
            write: Write::Remove,
            event: None,
        });
    };
    if carried == (Some(line.status.as_str()), line.reason.as_deref()) {
        return None;
    }
    let was_paused = carried.0 == Some(Status::Paused.as_str());
    let event = match (was_paused, line.status == Status::Paused) {
        (false, true) => Some(Event {
            reason: Reason::ScaleDownPaused,
            key: format!("paused {}", set.resource_version),
            note: format!(
                "scale-down paused by annotation statefulsets.kubernetes.io/scaledown-paused: no new cleanup pod until it is removed; {}",
                line.reason.as_deref().unwrap_or_default()
            ),
        }),
        (true, false) => Some(Event {
            reason: Reason::ScaleDownResumed,
            key: format!("resumed {}", set.resource_version),
            note: format!("scale-down resumed; the status is {}", line.status),
        }),
        _ => None,
    };
    Some(Change {
        write: Write::Set(line),
        event,
    })
}

#[cfg(test)]
mod tests;
