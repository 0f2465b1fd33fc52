//! The stages before a recorded cleanup pod ends: released once its ordinal is confirmed orphaned
//! and the StatefulSet controller has let go (`Gated`); reported when it stays Pending too long
//! (`Starting`) or its container restarts in place (`Running`).

use super::record::confirm_created;
use super::stage::CleanupStep;
use crate::reason::Reason;
use crate::scaledown::decide::plan::{Confirm, Plan, PodDeletion, Step, Verdict};
use crate::scaledown::decide::view::Hold;
use crate::scaledown::observe::SetFacts;

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

impl CleanupStep<'_> {
    /// Recorded but still gated: the process stopped between the record and the release. Let it
    /// run if a live read still confirms the ordinal, else delete it (it never ran).
    /// A recorded pod still gated. No poll while it waits: the resume of a paused set and the
    /// StatefulSet controller's status catching up are changes of the set, whose watch brings
    /// the next pass; only then is the set read live, once, to release or cancel.
    pub(super) fn release(&self, plan: &mut Plan) {
        match confirm_created(&self.view.o.set, self.ordinal) {
            Verdict::Run if self.view.hold == Some(Hold::Paused) => {}
            Verdict::Run if !may_release(&self.view.o.set) => {}
            Verdict::Run => {
                // Released on a live list of the namespace too: its claims must still be the
                // set's (no other set, which the cache may not show yet, wants them).
                plan.confirm(Confirm::SetAndNamespace);
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

    /// The recorded claims of the pod that are gone, replaced (same name, another UID), being
    /// deleted, or no longer proven the set's: a pod that mounts them can never be scheduled,
    /// would mount a new claim, or would clean another set's data.
    pub(super) fn missing_claims(&self) -> Vec<&str> {
        self.cleanup
            .claims
            .iter()
            .filter(|(name, uid)| {
                !self
                    .facts
                    .claims
                    .iter()
                    .any(|c| c.name == **name && c.uid == **uid && c.live() && c.not_ours.is_none())
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// A cleanup pod that has not started (gated, or released and not scheduled) whose claims
    /// are gone: deleted, on a live list of the namespace. Seen after a failover, when the new
    /// leader's claim cache still showed the claims of a cleanup the old leader had finished: the
    /// pod it created could never be scheduled and kept the ordinal's name, and the finalizer of a
    /// deleted set, forever.
    pub(super) fn cancel_without_claims(&self, plan: &mut Plan) {
        plan.confirm(Confirm::SetAndNamespace);
        plan.event(
            Reason::CleanupCancelled,
            self.pod.uid.clone(),
            format!(
                "cleanup pod {} never ran and is deleted: its claims [{}] are gone, being deleted or not proven this StatefulSet's",
                self.pod.name,
                self.missing_claims().join(", ")
            ),
        );
        plan.steps.push(self.delete_pod(PodDeletion::NeverRan));
    }

    /// A container the kubelet restarts in place after it failed (`restartPolicy: OnFailure`): the
    /// pod never reaches Failed, so `--cleanup-attempts` and the backoff do not apply. Say so; the
    /// claims stay, as for any cleanup that has not succeeded.
    pub(super) fn check_restarts(&self, plan: &mut Plan) {
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

    pub(super) fn check_stuck(&self, plan: &mut Plan) {
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
}
