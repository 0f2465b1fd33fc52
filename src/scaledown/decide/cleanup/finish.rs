//! The stages a cleanup pod ends in: `Succeeded` deletes its recorded claims (on a live read that
//! still shows the ordinal orphaned and no other pod using them), then the pod; kept claims if the
//! ordinal is wanted again. `Failed` retries after a backoff, or gives up.

use super::stage::CleanupStep;
use crate::reason::Reason;
use crate::scaledown::decide::plan::{Confirm, Plan, PodDeletion, Step};
use crate::scaledown::decide::view::Hold;
use crate::scaledown::observe::ClaimFacts;

impl CleanupStep<'_> {
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

    pub(super) fn complete(&self, plan: &mut Plan) {
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
            // No timer: the deletion of a pod that mounts the claim wakes the set
            // (`watch::sets_of_pod`), and the resync is the fallback.
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

    pub(super) fn failed(&self, plan: &mut Plan) {
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
