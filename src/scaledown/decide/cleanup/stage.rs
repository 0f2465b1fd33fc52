//! Where one recorded cleanup pod is in its life ([`Stage`]), and the decision about it: each
//! stage has its own transition (`run` and `finish` hold them).

use crate::scaledown::decide::plan::{Plan, PodDeletion, Step};
use crate::scaledown::decide::view::View;
use crate::scaledown::observe::{CleanupFacts, OrdinalFacts, Phase, PodFacts};

/// The stage of a recorded cleanup pod (its UID is in the set's record), read from its facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Still carrying the confirm gate: waits to be released, or cancelled if the ordinal is
    /// wanted again.
    Gated,
    /// Released, not started yet (scheduling, image pull): reported if it stays so too long.
    Starting,
    /// Started (or its node stopped reporting: `Unknown`): in-place restarts are reported.
    Running,
    /// Exited 0: its claims are deleted (kept if the ordinal is wanted again), then the pod.
    Succeeded,
    /// Failed: retried after a backoff, or given up and kept for inspection.
    Failed,
    /// Being deleted: nothing to do until it is gone.
    Ending,
}

impl Stage {
    /// The stage of a cleanup pod with these facts.
    pub fn of(cleanup: &CleanupFacts, deleting: bool) -> Stage {
        match cleanup.phase {
            _ if deleting => Stage::Ending,
            Phase::Succeeded => Stage::Succeeded,
            Phase::Failed => Stage::Failed,
            Phase::Pending if cleanup.gated => Stage::Gated,
            Phase::Pending => Stage::Starting,
            Phase::Running | Phase::Unknown => Stage::Running,
        }
    }
}

/// Removes next-attempt marks that a cleanup pod of `attempt` (or a stateful pod) made stale.
pub fn clear_marks(plan: &mut Plan, facts: &OrdinalFacts, attempt: Option<u32>) {
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

/// The decision about one existing recorded cleanup pod.
pub struct CleanupStep<'a> {
    /// The set as this pass sees it.
    pub view: &'a View<'a>,
    /// The pod's ordinal.
    pub ordinal: u32,
    /// The ordinal's claims and pod.
    pub facts: &'a OrdinalFacts,
    /// The pod.
    pub pod: &'a PodFacts,
    /// What the record and the pod's status say of it.
    pub cleanup: &'a CleanupFacts,
}

impl CleanupStep<'_> {
    /// Plans the transition out of the pod's stage.
    pub fn plan(&self, plan: &mut Plan) {
        let stage = Stage::of(self.cleanup, self.pod.deleting);
        let unstarted =
            stage == Stage::Gated || (stage == Stage::Starting && !self.cleanup.scheduled);
        if unstarted && !self.missing_claims().is_empty() {
            return self.cancel_without_claims(plan);
        }
        match stage {
            Stage::Gated => self.release(plan),
            Stage::Starting => {
                self.check_restarts(plan);
                self.check_stuck(plan);
            }
            Stage::Running => self.check_restarts(plan),
            Stage::Succeeded => self.complete(plan),
            Stage::Failed => self.failed(plan),
            Stage::Ending => {}
        }
    }

    pub(super) fn delete_pod(&self, why: PodDeletion) -> Step {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleanup(phase: Phase, gated: bool) -> CleanupFacts {
        CleanupFacts {
            phase,
            attempt: 1,
            claims: Default::default(),
            gated,
            failure: None,
            created: None,
            scheduled: false,
            restarts: None,
        }
    }

    #[test]
    fn every_phase_has_one_stage() {
        let table = [
            (Phase::Pending, true, false, Stage::Gated),
            (Phase::Pending, false, false, Stage::Starting),
            (Phase::Running, false, false, Stage::Running),
            (Phase::Unknown, false, false, Stage::Running),
            (Phase::Succeeded, false, false, Stage::Succeeded),
            (Phase::Failed, false, false, Stage::Failed),
            (Phase::Succeeded, false, true, Stage::Ending),
            (Phase::Pending, true, true, Stage::Ending),
        ];
        for (phase, gated, deleting, stage) in table {
            assert_eq!(
                Stage::of(&cleanup(phase, gated), deleting),
                stage,
                "{phase:?} gated={gated} deleting={deleting}"
            );
        }
    }
}
