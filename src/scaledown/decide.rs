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
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::naming;
use crate::reason::Reason;
use crate::scaledown::observe::{
    ClaimFacts, CleanupFacts, Observed, OrdinalFacts, Phase, PodFacts, PodRole, SetFacts, SetRead,
};
use crate::template::{self, Target};

/// Operator settings that shape decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Attempts per cleanup series before giving up (`--cleanup-attempts`).
    pub max_attempts: u32,
    /// Wait after the first failure; doubles per attempt (`--cleanup-backoff`).
    pub backoff_base: Duration,
    /// Cap of that wait (`--cleanup-backoff-max`).
    pub backoff_max: Duration,
    /// Cap of cleanup pods in flight across everything we watch (`--max-concurrent-cleanups`).
    pub max_in_flight: Option<usize>,
    /// A cleanup pod Pending this long is reported as stuck (`--cleanup-pending-timeout`).
    pub pending_timeout: Duration,
    /// Cleanup pods of sets without the inherit annotation inherit the set's scheduling fields
    /// (`--inherit-scheduling`).
    pub inherit_scheduling: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_attempts: 3,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            max_in_flight: None,
            pending_timeout: Duration::from_secs(600),
            inherit_scheduling: false,
        }
    }
}

impl Policy {
    /// How long to wait after attempt `attempt` (1-based) failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.backoff_base
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// Whether a recorded cleanup pod may be released (may run): the StatefulSet controller must have
/// seen the scale-down's condemned pods go, so a late delete by name from it (it sends no UID
/// precondition) can only meet a pod that never ran. Its status is computed from its own pod
/// cache: `observedGeneration` at the set's generation and `replicas` no more than the spec asks
/// mean its cache holds no condemned pod any more. A set being deleted is exempt: the StatefulSet
/// controller no longer deletes its pods; the garbage collector does, by UID.
pub fn may_release(set: &SetFacts) -> bool {
    set.deleting
        || (set.observed_generation >= set.generation && set.status_replicas <= set.replicas)
}

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

/// Why no new cleanup may start on an orphaned ordinal of this set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    OptedOut,
    Template,
    OrphanDeletion,
    /// The set carries the paused annotation: no new cleanup pod, no retry.
    Paused,
    RetainedByKubernetes,
}

impl Hold {
    fn explain(self) -> &'static str {
        match self {
            Hold::OptedOut => "StatefulSet no longer asks for cleanups",
            Hold::Template => "cleanup pod template is invalid",
            Hold::Paused => {
                "StatefulSet is paused (annotation statefulsets.kubernetes.io/scaledown-paused)"
            }
            Hold::OrphanDeletion => "StatefulSet was deleted with orphan propagation",
            Hold::RetainedByKubernetes => "claim retention policy deletes the claims",
        }
    }
}

/// What holds for the set as a whole, worked out once per decision.
struct View<'a> {
    o: &'a Observed,
    policy: &'a Policy,
    opted_in: bool,
    template: Option<template::CleanupTemplate>,
    /// The set's scheduling fields its cleanup pods inherit, when they do.
    inherited: Option<&'a serde_json::Map<String, Value>>,
    /// How the set is being deleted, if it is.
    deletion: Option<Propagation>,
    background_deletion: bool,
    /// Being deleted, and nothing proves how ([`Propagation::Unproven`]): only the ordinals its
    /// spec no longer wants are orphaned, as after a scale-down; the others keep their claims.
    unproven: bool,
    hold: Option<Hold>,
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

impl<'a> View<'a> {
    fn new(o: &'a Observed, policy: &'a Policy, plan: &mut Plan) -> Self {
        let set = &o.set;
        let opted_in = set.template.is_some() && !set.claim_templates.is_empty();
        let template = match &set.template {
            Some(raw) if opted_in => parse_template(raw, set, plan),
            _ => None,
        };
        let inherited = opted_in.then(|| inherited(set, policy, plan)).flatten();
        let deletion = propagation(o);
        let orphan_deletion = deletion == Some(Propagation::Orphan);
        let background_deletion = deletion == Some(Propagation::Background);
        let hold = if !opted_in {
            Some(Hold::OptedOut)
        } else if orphan_deletion {
            Some(Hold::OrphanDeletion)
        } else if set.deleting && set.when_deleted_delete || !set.deleting && set.when_scaled_delete
        {
            Some(Hold::RetainedByKubernetes)
        } else if set.paused {
            Some(Hold::Paused)
        } else if template.is_none() {
            Some(Hold::Template)
        } else {
            None
        };
        View {
            o,
            policy,
            opted_in,
            template,
            inherited,
            deletion,
            background_deletion,
            // With `whenDeleted: Delete` Kubernetes deletes the claims itself (RetainedByKubernetes).
            unproven: deletion == Some(Propagation::Unproven) && !set.when_deleted_delete,
            hold,
        }
    }

    fn orphaned(&self, ordinal: u32) -> bool {
        let set = &self.o.set;
        if self.unproven {
            !set.in_spec(ordinal)
        } else {
            !set.wants(ordinal)
        }
    }
}

/// The scheduling fields the set's cleanup pods inherit: its own, when its annotation (or, without
/// one, the flag) asks for them. An unknown value inherits nothing and is reported once.
fn inherited<'a>(
    set: &'a SetFacts,
    policy: &Policy,
    plan: &mut Plan,
) -> Option<&'a serde_json::Map<String, Value>> {
    match template::inherit::inherit(set.inherit.as_deref(), policy.inherit_scheduling) {
        template::inherit::Inherit::Scheduling => Some(&set.scheduling),
        template::inherit::Inherit::Nothing => None,
        template::inherit::Inherit::Unknown(value) => {
            let shown = template::quoted(&value);
            plan.event(
                Reason::CleanupInheritInvalid,
                format!("inherit {shown}"),
                format!(
                    "annotation {} is {shown}; it may be {:?} or {:?}: the cleanup pod inherits nothing from the StatefulSet until it is fixed",
                    naming::INHERIT_ANNOTATION,
                    naming::INHERIT_SCHEDULING,
                    naming::INHERIT_NONE
                ),
            );
            None
        }
    }
}

fn parse_template(raw: &str, set: &SetFacts, plan: &mut Plan) -> Option<template::CleanupTemplate> {
    match template::parse(raw, &set.claim_templates, set.selector.as_ref()) {
        Ok(t) => Some(t),
        Err(e) => {
            plan.event(
                e.reason(),
                e.to_string(),
                format!("{e}; no cleanup pod is created until the annotation is fixed"),
            );
            None
        }
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
                if !pod.deleting {
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
    }
    scan
}

/// A pod of an orphaned ordinal that stays Terminating (its node is gone, or a finalizer holds it)
/// keeps the ordinal from being cleaned, and with a condemned stateful pod the StatefulSet
/// controller's status never lets a recorded cleanup pod go. Past `--cleanup-pending-timeout` it
/// is reported (the set's status says `Stalled`); the controller never force-deletes it.
fn stuck_terminating(view: &View<'_>, ordinal: u32, facts: &OrdinalFacts, plan: &mut Plan) {
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

fn foreign_pod(view: &View<'_>, ordinal: u32, pod: &PodFacts, claims: bool, plan: &mut Plan) {
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
fn held_for_writer(view: &View<'_>, created: Option<Timestamp>, plan: &mut Plan) -> bool {
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
fn unproven_pod(view: &View<'_>, ordinal: u32, pod: &PodFacts, gated: bool, plan: &mut Plan) {
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

fn create_cleanup_pods(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    pending: &[u32],
    set_has_cleanup_pod: bool,
    plan: &mut Plan,
) {
    let (o, set) = (view.o, &view.o.set);
    let ready = |ordinal: &&u32| o.ordinals.get(ordinal).is_some_and(|f| f.pod.is_none());
    let chosen: Vec<u32> = if set.parallel {
        pending.iter().filter(ready).copied().collect()
    } else if set_has_cleanup_pod {
        Vec::new()
    } else {
        // Highest first, one at a time: only the highest pending ordinal, once its pod is gone.
        pending.first().filter(ready).copied().into_iter().collect()
    };
    let room = view
        .policy
        .max_in_flight
        .map_or(usize::MAX, |cap| cap.saturating_sub(o.cleanups_in_flight));
    let eligible: Vec<u32> = chosen
        .into_iter()
        .filter(|n| !refused_too_recently(view, *n, plan))
        .collect();
    if eligible.len() > room {
        // Held back by `--max-concurrent-cleanups`: woken when a cleanup pod frees room, as no
        // event of this set says when another set's cleanup ends.
        plan.waits_for_room = true;
    }
    for ordinal in eligible.into_iter().take(room) {
        if let Some(facts) = o.ordinals.get(&ordinal) {
            create_one(view, template, ordinal, facts, plan);
        }
    }
}

/// Whether an earlier refusal by the API server holds this ordinal back (backoff, or given up).
fn refused_too_recently(view: &View<'_>, ordinal: u32, plan: &mut Plan) -> bool {
    let (o, policy) = (view.o, view.policy);
    let Some(refusal) = o.rejections.get(&ordinal) else {
        return false;
    };
    let pod = naming::pod_name(&o.set.name, ordinal);
    if refusal.count >= policy.max_attempts {
        plan.event(
            Reason::CleanupGaveUp,
            format!("refused-{ordinal}"),
            format!(
                "the API server refused cleanup pod {pod} {} times (last: {} {}); giving up until the template annotation (or the scheduling the pod inherits) changes or the controller restarts",
                refusal.count, refusal.code, refusal.message
            ),
        );
        return true;
    }
    let retry_at = refusal
        .last
        .checked_add(policy.backoff(refusal.count))
        .unwrap_or(refusal.last);
    if retry_at > o.now {
        plan.requeue(crate::scaledown::observe::until(o.now, retry_at));
        return true;
    }
    false
}

fn create_one(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    ordinal: u32,
    facts: &OrdinalFacts,
    plan: &mut Plan,
) {
    let set = &view.o.set;
    let volumes: Vec<(&str, Option<(&str, &str)>)> = set
        .claim_templates
        .iter()
        .map(|t| {
            let claim = facts.claims.iter().find(|c| c.template == *t && c.live());
            (t.as_str(), claim.map(|c| (c.name.as_str(), c.uid.as_str())))
        })
        .collect();
    for (t, claim) in &volumes {
        if claim.is_none() {
            let name = naming::claim_name(t, &set.name, ordinal);
            plan.event(
                Reason::ClaimMissing,
                name.clone(),
                format!("claim {name} of ordinal {ordinal} does not exist or is being deleted; the cleanup pod gets an empty directory as volume {t}"),
            );
        }
    }
    let attempt = facts
        .claims
        .iter()
        .filter_map(|c| c.next_attempt)
        .max()
        .unwrap_or(1);
    let target = Target {
        namespace: &set.namespace,
        set: &set.name,
        ordinal,
        replicas: set.replicas,
        attempt,
        volumes,
    };
    if let Some(pod) = render(view, template, &target, plan) {
        let claims = target
            .volumes
            .iter()
            .filter_map(|(_, c)| c.map(|(n, u)| (n.to_string(), u.to_string())))
            .collect();
        plan.steps.push(Step::CreateCleanupPod {
            ordinal,
            attempt,
            pod,
            claims,
        });
    }
}

/// The cleanup pod for `target`, with the set's scheduling fields if it inherits them; a pod
/// over the size limit is a Warning and no pod (not a request the API server refuses every pass).
fn render(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    target: &Target<'_>,
    plan: &mut Plan,
) -> Option<Value> {
    let (rendered, fix) = match view.inherited {
        Some(inherited) if !inherited.is_empty() => (
            template.render_inheriting(target, inherited),
            "the annotation or the StatefulSet's scheduling fields are fixed (or the set opts out of inheriting them)",
        ),
        _ => (template.render(target), "the annotation is fixed"),
    };
    rendered
        .map_err(|e| {
            plan.event(
                e.reason(),
                e.to_string(),
                format!("{e}; no cleanup pod is created until {fix}"),
            )
        })
        .ok()
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

/// Removes next-attempt marks that a cleanup pod of `attempt` (or a stateful pod) made stale.
fn clear_marks(plan: &mut Plan, facts: &OrdinalFacts, attempt: Option<u32>) {
    for claim in &facts.claims {
        let stale = match (claim.next_attempt, attempt) {
            (Some(_), None) => true,
            (Some(mark), Some(attempt)) => attempt >= mark,
            (None, _) => false,
        };
        if stale && claim.live() {
            plan.steps.push(Step::MarkNextAttempt {
                claim: claim.name.clone(),
                uid: claim.uid.clone(),
                attempt: None,
            });
        }
    }
}

/// The decision about one existing, not-deleting, recorded cleanup pod.
struct CleanupStep<'a> {
    view: &'a View<'a>,
    ordinal: u32,
    facts: &'a OrdinalFacts,
    pod: &'a PodFacts,
    cleanup: &'a CleanupFacts,
}

impl CleanupStep<'_> {
    fn plan(&self, plan: &mut Plan) {
        match self.cleanup.phase {
            Phase::Succeeded => self.complete(plan),
            Phase::Failed => self.failed(plan),
            Phase::Pending if self.cleanup.gated => self.release(plan),
            Phase::Pending => {
                self.check_restarts(plan);
                self.check_stuck(plan);
            }
            Phase::Running | Phase::Unknown => self.check_restarts(plan),
        }
    }

    fn delete_pod(&self, why: PodDeletion) -> Step {
        Step::DeleteCleanupPod {
            name: self.pod.name.clone(),
            uid: self.pod.uid.clone(),
            why,
            ran_for: (why == PodDeletion::Completed)
                .then_some(self.cleanup.created)
                .flatten()
                .map(|c| crate::scaledown::observe::until(c, self.view.o.now)),
        }
    }

    /// Recorded but still gated: the process stopped between the record and the release. Let it
    /// run if a live read still confirms the ordinal, else delete it (it never ran).
    /// A recorded pod still gated. No poll while it waits: the resume of a paused set and the
    /// StatefulSet controller's status catching up are changes of the set, whose watch brings
    /// the next pass; only then is the set read live, once, to release or cancel.
    fn release(&self, plan: &mut Plan) {
        match confirm_created(&self.view.o.set, self.ordinal) {
            Verdict::Run if self.view.hold == Some(Hold::Paused) => {}
            Verdict::Run if !may_release(&self.view.o.set) => {}
            Verdict::Run => {
                plan.confirm(Confirm::Set);
                plan.steps.push(Step::Release {
                    name: self.pod.name.clone(),
                    uid: self.pod.uid.clone(),
                });
            }
            Verdict::Cancel(why) => {
                plan.confirm(Confirm::Set);
                plan.event(
                    Reason::CleanupCancelled,
                    self.pod.uid.clone(),
                    format!(
                        "cleanup pod {} never ran and is deleted: {why}",
                        self.pod.name
                    ),
                );
                plan.steps.push(self.delete_pod(PodDeletion::NeverRan));
            }
        }
    }

    /// A container the kubelet restarts in place after it failed (`restartPolicy: OnFailure`): the
    /// pod never reaches Failed, so `--cleanup-attempts` and the backoff do not apply. Say so; the
    /// claims stay, as for any cleanup that has not succeeded.
    fn check_restarts(&self, plan: &mut Plan) {
        let Some(r) = &self.cleanup.restarts else {
            return;
        };
        plan.event(
            Reason::CleanupFailed,
            self.pod.uid.clone(),
            format!(
                "cleanup pod {} (attempt {}): container {} failed ({}, exit code {}) and the kubelet restarted it in place, {} restart(s) so far (restartPolicy OnFailure); the claims are kept. Fix the script, or set restartPolicy: Never in the template to get the controller's attempts and backoff instead",
                self.pod.name, self.cleanup.attempt, r.container, r.reason, r.exit_code, r.count
            ),
        );
    }

    fn check_stuck(&self, plan: &mut Plan) {
        let (o, timeout) = (self.view.o, self.view.policy.pending_timeout);
        let Some(deadline) = self
            .cleanup
            .created
            .and_then(|c| c.checked_add(timeout).ok())
        else {
            return;
        };
        if deadline > o.now {
            plan.requeue(crate::scaledown::observe::until(o.now, deadline));
            return;
        }
        let state = if self.cleanup.scheduled {
            "not started"
        } else {
            "not scheduled"
        };
        plan.event(
            Reason::CleanupPodStuck,
            self.pod.uid.clone(),
            format!(
                "cleanup pod {} has been Pending ({state}) for more than {}s; check its Events (image, node selector, quota)",
                self.pod.name,
                timeout.as_secs()
            ),
        );
    }

    /// The claims to delete: recorded for this pod, still the same objects, not being deleted, not
    /// another set's.
    fn recorded_claims(&self) -> Vec<&ClaimFacts> {
        self.cleanup
            .claims
            .iter()
            .filter_map(|(name, uid)| {
                self.facts
                    .claims
                    .iter()
                    .find(|c| c.name == *name && c.uid == *uid)
            })
            .filter(|c| c.live() && c.not_ours.is_none())
            .collect()
    }

    fn complete(&self, plan: &mut Plan) {
        // Deleting data: only on a read of the set made after the pod succeeded.
        plan.confirm(Confirm::Set);
        let (pod, ordinal) = (self.pod, self.ordinal);
        if self.view.o.set.wants(ordinal) {
            plan.event(
                Reason::ScaledUpDuringCleanup,
                pod.uid.clone(),
                format!(
                    "ordinal {ordinal} was scaled up while its cleanup ran; cleanup pod {} succeeded, its claims are kept (their data was drained) and the pod is deleted so the StatefulSet can recreate the ordinal",
                    pod.name
                ),
            );
            plan.steps.push(self.delete_pod(PodDeletion::ScaledUp));
            return;
        }
        let claims = self.recorded_claims();
        if !claims.is_empty() {
            // Whether another pod mounts a claim is decided on a live list: a pod the cache does
            // not show yet would keep the claim's data in use (pvc-protection then deletes it
            // when that pod ends).
            plan.confirm(Confirm::SetAndNamespace);
        }
        let in_use: Vec<&&ClaimFacts> = claims.iter().filter(|c| !c.used_by.is_empty()).collect();
        if !in_use.is_empty() {
            for claim in in_use {
                plan.event(
                    Reason::ClaimInUse,
                    format!("{} {}", claim.uid, claim.used_by.join(",")),
                    format!(
                        "claim {} of finished cleanup pod {} is used by pod(s) {}; it is deleted once they are gone",
                        claim.name,
                        pod.name,
                        claim.used_by.join(", ")
                    ),
                );
            }
            plan.requeue(Duration::from_secs(10));
            return;
        }
        let names: Vec<&str> = claims.iter().map(|c| c.name.as_str()).collect();
        plan.event(
            Reason::CleanupSuccess,
            pod.uid.clone(),
            format!(
                "cleanup pod {} succeeded; deleting its claims [{}] and the pod",
                pod.name,
                names.join(", ")
            ),
        );
        // Claims first, then the pod: once the pod's name is free the StatefulSet may recreate the
        // ordinal, and it then finds the old claims already being deleted and waits for fresh ones
        // (pvc-protection releases them only once this pod is gone).
        for claim in claims {
            plan.steps.push(Step::DeleteClaim {
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            });
        }
        plan.steps.push(self.delete_pod(PodDeletion::Completed));
    }

    fn failed(&self, plan: &mut Plan) {
        let (pod, cleanup, policy, o) = (self.pod, self.cleanup, self.view.policy, self.view.o);
        let failure = cleanup.failure.as_ref();
        let mut what = format!(
            "cleanup pod {} (attempt {} of {}) failed: {}",
            pod.name,
            cleanup.attempt,
            policy.max_attempts,
            failure.map_or("Failed", |f| f.reason.as_str())
        );
        if let Some(code) = failure.and_then(|f| f.exit_code) {
            what.push_str(&format!(", exit code {code}"));
        }
        if let Some(message) = failure.and_then(|f| f.message.as_deref()) {
            what.push_str(&format!(" ({message})"));
        }
        let no_retry = if !self.view.orphaned(self.ordinal) {
            Some("ordinal is wanted again")
        } else {
            self.view.hold.map(Hold::explain)
        };
        if let Some(why) = no_retry {
            plan.event(
                Reason::CleanupFailed,
                pod.uid.clone(),
                format!("{what}; not retried because the {why}; the pod stays for inspection and its claims are kept"),
            );
            return;
        }
        if cleanup.attempt >= policy.max_attempts {
            plan.event(
                Reason::CleanupGaveUp,
                pod.uid.clone(),
                format!(
                    "{what}; giving up: the pod stays for inspection and keeps its claims from being reused; delete pod {} to start a new series",
                    pod.name
                ),
            );
            return;
        }
        let backoff = policy.backoff(cleanup.attempt);
        plan.event(
            Reason::CleanupFailed,
            pod.uid.clone(),
            format!("{what}; retrying in {}s", backoff.as_secs()),
        );
        let failed_at = failure.and_then(|f| f.finished_at).unwrap_or(o.now);
        let retry_at = failed_at.checked_add(backoff).unwrap_or(failed_at);
        if retry_at > o.now {
            plan.requeue(crate::scaledown::observe::until(o.now, retry_at));
            return;
        }
        for claim in self.facts.claims.iter().filter(|c| c.live()) {
            plan.steps.push(Step::MarkNextAttempt {
                claim: claim.name.clone(),
                uid: claim.uid.clone(),
                attempt: Some(cleanup.attempt + 1),
            });
        }
        plan.steps.push(self.delete_pod(PodDeletion::Retry));
    }
}

mod created;
mod deletion;
pub mod plan;
pub mod status;
pub use created::{Admission, admit, confirm_created, runs, verdicts};
pub use deletion::{Propagation, mark_value, propagation};
pub use plan::{Confirm, Event, Plan, PodDeletion, RECORD_GRACE, Step, Verdict};

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
