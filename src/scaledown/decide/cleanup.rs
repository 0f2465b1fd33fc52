//! The life of one recorded cleanup pod after its creation: released once its ordinal is
//! confirmed orphaned and the StatefulSet controller has let go; on success its claims are
//! deleted (or kept, if the ordinal is wanted again), on failure it is retried after a backoff or
//! given up; a pod stuck Pending or restarting is reported. The gate's verdict right after the
//! create is in `created`.

use std::time::Duration;

use super::created::confirm_created;
use super::plan::{Confirm, Plan, PodDeletion, Step, Verdict};
use super::view::{Hold, View};
use crate::reason::Reason;
use crate::scaledown::observe::{
    ClaimFacts, CleanupFacts, OrdinalFacts, Phase, PodFacts, SetFacts,
};

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

/// Removes next-attempt marks that a cleanup pod of `attempt` (or a stateful pod) made stale.
pub(super) fn clear_marks(plan: &mut Plan, facts: &OrdinalFacts, attempt: Option<u32>) {
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
pub(super) struct CleanupStep<'a> {
    pub(super) view: &'a View<'a>,
    pub(super) ordinal: u32,
    pub(super) facts: &'a OrdinalFacts,
    pub(super) pod: &'a PodFacts,
    pub(super) cleanup: &'a CleanupFacts,
}

impl CleanupStep<'_> {
    pub(super) fn plan(&self, plan: &mut Plan) {
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
