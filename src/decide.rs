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
//! 3. A cleanup pod is created for an orphaned ordinal with live claims once no pod of that name
//!    exists; OrderedReady sets one at a time, highest ordinal first; Parallel sets all at once;
//!    never more than `max_in_flight` across everything we watch.
//! 4. A Succeeded cleanup pod: delete the claims it was created for (by UID), then the pod.
//!    A Failed one: retry after a capped exponential backoff, then give up and keep it.
//! 5. A set deleted with background propagation: we delete its pods, highest ordinal first.
//! 6. The finalizer goes when the set is deleted and no claim and no cleanup is left.

use std::time::Duration;

use serde_json::Value;

use crate::naming;
use crate::observe::{ClaimFacts, CleanupFacts, Observed, OrdinalFacts, Phase, PodFacts, PodRole};
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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_attempts: 3,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            max_in_flight: None,
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

/// What to write, in order. `act` carries the steps out one by one and stops at the first error.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Look again after this long even if nothing changes (a retry backoff is running).
    pub requeue_after: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Replace the set's finalizer list, guarded by its resourceVersion.
    SetFinalizers {
        finalizers: Vec<String>,
        resource_version: String,
        adding: bool,
    },
    /// Delete a stateful pod of a set deleted with background propagation.
    DeleteStatefulPod {
        name: String,
        uid: String,
    },
    CreateCleanupPod {
        ordinal: u32,
        attempt: u32,
        pod: Value,
    },
    DeleteClaim {
        name: String,
        uid: String,
    },
    DeleteCleanupPod {
        name: String,
        uid: String,
        why: PodDeletion,
        /// How long the cleanup took, from the pod's creation (for the duration metric).
        ran_for: Option<Duration>,
    },
    /// Set (or with `None` remove) the next-attempt mark on a claim.
    MarkNextAttempt {
        claim: String,
        uid: String,
        attempt: Option<u32>,
    },
    Event(Event),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDeletion {
    /// The cleanup succeeded and its claims are deleted.
    Completed,
    /// The cleanup failed; a new attempt follows.
    Retry,
}

/// An Event on the StatefulSet. `key` identifies the occurrence, so that the same problem seen on
/// every reconcile is published once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    pub key: String,
}

/// Event reasons decided here; `act` adds `SuccessfulCreate` and `SuccessfulDelete`.
pub mod reason {
    pub const CLEANUP_SUCCESS: &str = "CleanupSuccess";
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    pub const CLEANUP_GAVE_UP: &str = "CleanupGaveUp";
    pub const SCALED_UP_DURING_CLEANUP: &str = "ScaledUpDuringCleanup";
    pub const CLAIM_MISSING: &str = "ClaimMissing";
    pub const CLAIM_OWNERSHIP_CONFLICT: &str = "ClaimOwnershipConflict";
    pub const FOREIGN_POD: &str = "ForeignPod";
    pub const RETENTION_POLICY_CONFLICT: &str = "RetentionPolicyConflict";
    pub const ORPHAN_DELETION: &str = "OrphanDeletion";
}

impl Plan {
    /// Whether the plan holds a step that must be confirmed against a live read first.
    pub fn needs_confirmation(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(
                s,
                Step::CreateCleanupPod { .. } | Step::SetFinalizers { adding: false, .. }
            )
        })
    }

    fn event(&mut self, warning: bool, reason: &'static str, key: String, note: String) {
        self.steps.push(Step::Event(Event {
            warning,
            reason,
            note,
            key,
        }));
    }

    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

/// Why no new cleanup may start on an orphaned ordinal of this set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    OptedOut,
    Template,
    OrphanDeletion,
    RetainedByKubernetes,
}

impl Hold {
    fn explain(self) -> &'static str {
        match self {
            Hold::OptedOut => "StatefulSet no longer asks for cleanups",
            Hold::Template => "cleanup pod template is invalid",
            Hold::OrphanDeletion => "StatefulSet was deleted with orphan propagation",
            Hold::RetainedByKubernetes => "claim retention policy deletes the claims",
        }
    }
}

pub fn decide(o: &Observed, policy: &Policy) -> Plan {
    let mut plan = Plan::default();
    let set = &o.set;
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

    let template = match &set.template {
        Some(raw) if opted_in => {
            match template::parse(raw, &set.claim_templates, set.selector.as_ref()) {
                Ok(t) => Some(t),
                Err(e) => {
                    plan.event(
                        true,
                        e.reason().as_str(),
                        e.to_string(),
                        format!("{e}; no cleanup pod is created until the annotation is fixed"),
                    );
                    None
                }
            }
        }
        _ => None,
    };

    let orphan_deletion = set.deleting
        && (set.finalizers.iter().any(|f| f == naming::ORPHAN_FINALIZER)
            || (!set
                .finalizers
                .iter()
                .any(|f| f == naming::FOREGROUND_FINALIZER)
                && o.ordinals
                    .values()
                    .any(|f| matches!(f.pod.as_ref().map(|p| &p.role), Some(PodRole::Foreign)))));
    let background_deletion = set.deleting
        && !orphan_deletion
        && !set
            .finalizers
            .iter()
            .any(|f| f == naming::FOREGROUND_FINALIZER);
    let hold = if !opted_in {
        Some(Hold::OptedOut)
    } else if set.deleting && orphan_deletion {
        Some(Hold::OrphanDeletion)
    } else if set.deleting && set.when_deleted_delete || !set.deleting && set.when_scaled_delete {
        Some(Hold::RetainedByKubernetes)
    } else if template.is_none() {
        Some(Hold::Template)
    } else {
        None
    };
    let orphaned = |ordinal: u32| !set.wants(ordinal);

    // Ordinals that need a cleanup (orphaned, live claims, not someone else's), highest first.
    let mut pending: Vec<u32> = Vec::new();
    let mut set_has_cleanup_pod = false;
    let mut in_flight = false;
    let mut stateful_pods: Vec<&PodFacts> = Vec::new();
    let mut claims_left = false;

    for (&ordinal, facts) in o.ordinals.iter().rev() {
        let live: Vec<&ClaimFacts> = facts.claims.iter().filter(|c| c.live()).collect();
        let conflict = live
            .iter()
            .find_map(|c| Some((c, c.wanted_by_other.as_ref()?)));
        if let Some((claim, other)) = conflict {
            if opted_in && orphaned(ordinal) {
                plan.event(
                    true,
                    reason::CLAIM_OWNERSHIP_CONFLICT,
                    claim.name.clone(),
                    format!(
                        "claim {} also belongs to StatefulSet {other}, which still uses it; ordinal {ordinal} is left alone",
                        claim.name
                    ),
                );
            }
        } else if orphaned(ordinal) && !live.is_empty() {
            claims_left = true;
            pending.push(ordinal);
        }

        let Some(pod) = &facts.pod else { continue };
        match &pod.role {
            PodRole::Stateful => {
                stateful_pods.push(pod);
                clear_marks(&mut plan, facts, None);
            }
            PodRole::Foreign => {
                if opted_in && !set.deleting && orphaned(ordinal) && !live.is_empty() {
                    plan.event(
                        true,
                        reason::FOREIGN_POD,
                        pod.uid.clone(),
                        format!(
                            "pod {} is neither a pod of this StatefulSet nor a cleanup pod; ordinal {ordinal} is not cleaned while it exists",
                            pod.name
                        ),
                    );
                }
            }
            PodRole::Cleanup(cleanup) => {
                set_has_cleanup_pod = true;
                in_flight |= cleanup.phase != Phase::Failed;
                clear_marks(&mut plan, facts, Some(cleanup.attempt));
                if !pod.deleting {
                    let no_retry = if !orphaned(ordinal) {
                        Some("ordinal is wanted again")
                    } else {
                        hold.map(Hold::explain)
                    };
                    let step = CleanupStep {
                        o,
                        policy,
                        ordinal,
                        facts,
                        pod,
                        cleanup,
                        no_retry,
                    };
                    step.plan(&mut plan);
                }
            }
        }
    }

    match hold {
        Some(Hold::RetainedByKubernetes) if claims_left => {
            let (field, what) = if set.deleting {
                ("whenDeleted", "deletion")
            } else {
                ("whenScaled", "scale-down")
            };
            plan.event(
                true,
                reason::RETENTION_POLICY_CONFLICT,
                field.into(),
                format!(
                    "persistentVolumeClaimRetentionPolicy.{field} is Delete, so Kubernetes deletes these claims itself; no cleanup pod runs on {what}"
                ),
            );
        }
        Some(Hold::OrphanDeletion) => plan.event(
            false,
            reason::ORPHAN_DELETION,
            String::new(),
            "the StatefulSet was deleted with orphan propagation: its pods and claims are kept and no cleanup runs".into(),
        ),
        _ => {}
    }

    if let (None, Some(template)) = (hold, &template) {
        create_cleanup_pods(
            o,
            policy,
            template,
            &pending,
            set_has_cleanup_pod,
            &mut plan,
        );
    }

    if background_deletion && opted_in {
        // Nobody deletes the pods of a set held by a finalizer: we do, the way a scale to zero would.
        let mut alive = stateful_pods.iter().filter(|p| !p.deleting);
        let one_at_a_time = !set.parallel;
        if !(one_at_a_time && stateful_pods.iter().any(|p| p.deleting)) {
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
    }

    if set.has_finalizer() {
        let done = if !opted_in || !set.deleting {
            // Opted out: release the set once nothing of ours runs; opted in and alive: keep it.
            !opted_in && !in_flight
        } else if matches!(
            hold,
            Some(Hold::OrphanDeletion | Hold::RetainedByKubernetes)
        ) {
            !in_flight
        } else {
            !in_flight && !claims_left
        };
        if done {
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
    plan
}

fn create_cleanup_pods(
    o: &Observed,
    policy: &Policy,
    template: &template::CleanupTemplate,
    pending: &[u32],
    set_has_cleanup_pod: bool,
    plan: &mut Plan,
) {
    let set = &o.set;
    let ready = |ordinal: &&u32| o.ordinals.get(ordinal).is_some_and(|f| f.pod.is_none());
    let chosen: Vec<u32> = if set.parallel {
        pending.iter().filter(ready).copied().collect()
    } else if set_has_cleanup_pod {
        Vec::new()
    } else {
        // Highest first, one at a time: only the highest pending ordinal, once its pod is gone.
        pending.first().filter(ready).copied().into_iter().collect()
    };
    let room = policy
        .max_in_flight
        .map_or(usize::MAX, |cap| cap.saturating_sub(o.cleanups_in_flight));
    for ordinal in chosen.into_iter().take(room) {
        let Some(facts) = o.ordinals.get(&ordinal) else {
            continue;
        };
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
                    true,
                    reason::CLAIM_MISSING,
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
        let pod = match template.render(&Target {
            namespace: &set.namespace,
            set: &set.name,
            ordinal,
            replicas: set.replicas,
            attempt,
            volumes,
        }) {
            Ok(pod) => pod,
            Err(e) => {
                let note = format!("{e}; no cleanup pod is created for ordinal {ordinal}");
                plan.event(true, e.reason().as_str(), e.to_string(), note);
                continue;
            }
        };
        plan.steps.push(Step::CreateCleanupPod {
            ordinal,
            attempt,
            pod,
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

/// The decision about one existing, not-deleting cleanup pod.
struct CleanupStep<'a> {
    o: &'a Observed,
    policy: &'a Policy,
    ordinal: u32,
    facts: &'a OrdinalFacts,
    pod: &'a PodFacts,
    cleanup: &'a CleanupFacts,
    /// Why a failure may not be retried, if it may not.
    no_retry: Option<&'static str>,
}

impl CleanupStep<'_> {
    fn plan(&self, plan: &mut Plan) {
        match self.cleanup.phase {
            Phase::Succeeded => self.complete(plan),
            Phase::Failed => self.failed(plan),
            Phase::Pending | Phase::Running | Phase::Unknown => {}
        }
    }

    fn complete(&self, plan: &mut Plan) {
        let (pod, set, ordinal) = (self.pod, &self.o.set, self.ordinal);
        let claims: Vec<&ClaimFacts> = self
            .cleanup
            .claims
            .iter()
            .filter_map(|(name, uid)| {
                let seen = self.facts.claims.iter().find(|c| c.name == *name)?;
                // Only the claim the pod was created for, never a newer one with the same name.
                uid.as_ref()
                    .is_none_or(|uid| *uid == seen.uid)
                    .then_some(seen)
            })
            .collect();
        let names = claims
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        plan.event(
            false,
            reason::CLEANUP_SUCCESS,
            pod.uid.clone(),
            format!(
                "cleanup pod {} succeeded; deleting its claims [{names}] and the pod",
                pod.name
            ),
        );
        if set.wants(ordinal) {
            plan.event(
                false,
                reason::SCALED_UP_DURING_CLEANUP,
                pod.uid.clone(),
                format!(
                    "ordinal {ordinal} was scaled up while its cleanup ran; the cleaned claims are deleted and the StatefulSet recreates pod {} on fresh claims",
                    pod.name
                ),
            );
        }
        // Claims first, then the pod: once the pod's name is free the StatefulSet may recreate the
        // ordinal, and it then finds the old claims already being deleted and waits for fresh ones
        // (pvc-protection releases them only once this pod is gone).
        for claim in claims.iter().filter(|c| c.live()) {
            plan.steps.push(Step::DeleteClaim {
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            });
        }
        plan.steps.push(Step::DeleteCleanupPod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            why: PodDeletion::Completed,
            ran_for: self
                .cleanup
                .created
                .map(|c| crate::observe::until(c, self.o.now)),
        });
    }

    fn failed(&self, plan: &mut Plan) {
        let (pod, cleanup, policy) = (self.pod, self.cleanup, self.policy);
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
        if let Some(why) = self.no_retry {
            plan.event(
                true,
                reason::CLEANUP_FAILED,
                pod.uid.clone(),
                format!("{what}; not retried because the {why}; the pod stays for inspection and its claims are kept"),
            );
            return;
        }
        if cleanup.attempt >= policy.max_attempts {
            plan.event(
                true,
                reason::CLEANUP_GAVE_UP,
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
            true,
            reason::CLEANUP_FAILED,
            pod.uid.clone(),
            format!("{what}; retrying in {}s", backoff.as_secs()),
        );
        let failed_at = failure.and_then(|f| f.finished_at).unwrap_or(self.o.now);
        let retry_at = failed_at.checked_add(backoff).unwrap_or(failed_at);
        if retry_at > self.o.now {
            plan.requeue(crate::observe::until(self.o.now, retry_at));
            return;
        }
        let next = cleanup.attempt + 1;
        for claim in self.facts.claims.iter().filter(|c| c.live()) {
            plan.steps.push(Step::MarkNextAttempt {
                claim: claim.name.clone(),
                uid: claim.uid.clone(),
                attempt: Some(next),
            });
        }
        plan.steps.push(Step::DeleteCleanupPod {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            why: PodDeletion::Retry,
            ran_for: None,
        });
    }
}

#[cfg(test)]
mod tests;
