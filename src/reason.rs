//! Every outcome the controller reports. One `Reason` drives the Event reason, its type (Normal or
//! Warning), the `reason` label of `scaledown_events_total` and the `reason` field of log lines, so
//! the three can never disagree and nothing matches on reason strings.

/// One reportable outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    // --- Normal ---
    /// A cleanup pod was created, confirmed and released to run.
    SuccessfulCreate,
    /// A cleanup pod succeeded; its claims and the pod are deleted next.
    CleanupSuccess,
    /// A claim or a cleanup pod was deleted (or a stateful pod on background deletion).
    SuccessfulDelete,
    /// A failed cleanup pod was deleted for the next attempt.
    CleanupRetry,
    /// A cleanup pod was created but the confirmation read showed its ordinal wanted (or the set
    /// changed); the pod, which never ran, was deleted again.
    CleanupCancelled,
    /// The set was deleted with orphan propagation.
    OrphanDeletion,
    /// `--dry-run`: what would have been written.
    DryRun,
    /// The PV releaser removed a PV's claimRef: the PV is Available again (plumber-cd's reason).
    Released,
    /// The scrub pod of a Released PV succeeded; the PV is released next.
    Scrubbed,
    /// A claim was bound to its pod's life (an ownerReference to the pod).
    BoundToPod,
    /// A claim bound to a pod that was gone before the binding was made was deleted.
    DeletedWithPod,
    // --- Warning ---
    /// The ordinal was scaled up while its cleanup ran; the claims are kept.
    ScaledUpDuringCleanup,
    CleanupFailed,
    CleanupGaveUp,
    CleanupTemplateInvalid,
    /// The template or the pod rendered from it is over a size or parser budget.
    CleanupTemplateTooLarge,
    CleanupTemplateRestartPolicy,
    CleanupTemplateSelectorOverlap,
    CleanupTemplateVolumeClash,
    CleanupTemplateForbiddenField,
    /// The API server refused the cleanup pod (admission, quota, validation, size, server error).
    CleanupPodRejected,
    /// A cleanup pod has been Pending (unscheduled) past `--cleanup-pending-timeout`.
    CleanupPodStuck,
    ClaimMissing,
    /// A claim of a finished cleanup is mounted by another pod; it is not deleted while so.
    ClaimInUse,
    ClaimOwnershipConflict,
    ForeignPod,
    /// A pod looks like a cleanup pod (label, annotations) but this controller's record on the
    /// StatefulSet does not name its UID: it is never treated as a cleanup.
    UnprovenCleanupPod,
    RetentionPolicyConflict,
    /// The PV releaser could not release a PV (plumber-cd's reason `ErrReleasePV`).
    ReleaseFailed,
    /// A claim asked to be bound to a pod it may not be bound to (a StatefulSet's pod or claim).
    PodBindingRefused,
    /// The scrub of a PV failed (or could not start): the PV stays Released.
    ScrubFailed,
    ReconcileFailed,
}

impl Reason {
    /// Every reason, for metric pre-registration and documentation checks.
    pub const ALL: [Reason; 32] = [
        Reason::SuccessfulCreate,
        Reason::CleanupSuccess,
        Reason::SuccessfulDelete,
        Reason::CleanupRetry,
        Reason::CleanupCancelled,
        Reason::OrphanDeletion,
        Reason::DryRun,
        Reason::Released,
        Reason::Scrubbed,
        Reason::BoundToPod,
        Reason::DeletedWithPod,
        Reason::ScaledUpDuringCleanup,
        Reason::CleanupFailed,
        Reason::CleanupGaveUp,
        Reason::CleanupTemplateInvalid,
        Reason::CleanupTemplateTooLarge,
        Reason::CleanupTemplateRestartPolicy,
        Reason::CleanupTemplateSelectorOverlap,
        Reason::CleanupTemplateVolumeClash,
        Reason::CleanupTemplateForbiddenField,
        Reason::CleanupPodRejected,
        Reason::CleanupPodStuck,
        Reason::ClaimMissing,
        Reason::ClaimInUse,
        Reason::ClaimOwnershipConflict,
        Reason::ForeignPod,
        Reason::UnprovenCleanupPod,
        Reason::RetentionPolicyConflict,
        Reason::ReleaseFailed,
        Reason::PodBindingRefused,
        Reason::ScrubFailed,
        Reason::ReconcileFailed,
    ];

    /// The Event reason (and metric label, and log field).
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::SuccessfulCreate => "SuccessfulCreate",
            Reason::CleanupSuccess => "CleanupSuccess",
            Reason::SuccessfulDelete => "SuccessfulDelete",
            Reason::CleanupRetry => "CleanupRetry",
            Reason::CleanupCancelled => "CleanupCancelled",
            Reason::OrphanDeletion => "OrphanDeletion",
            Reason::DryRun => "DryRun",
            Reason::Released => "Released",
            Reason::Scrubbed => "Scrubbed",
            Reason::BoundToPod => "BoundToPod",
            Reason::DeletedWithPod => "DeletedWithPod",
            Reason::ScaledUpDuringCleanup => "ScaledUpDuringCleanup",
            Reason::CleanupFailed => "CleanupFailed",
            Reason::CleanupGaveUp => "CleanupGaveUp",
            Reason::CleanupTemplateInvalid => "CleanupTemplateInvalid",
            Reason::CleanupTemplateTooLarge => "CleanupTemplateTooLarge",
            Reason::CleanupTemplateRestartPolicy => "CleanupTemplateRestartPolicy",
            Reason::CleanupTemplateSelectorOverlap => "CleanupTemplateSelectorOverlap",
            Reason::CleanupTemplateVolumeClash => "CleanupTemplateVolumeClash",
            Reason::CleanupTemplateForbiddenField => "CleanupTemplateForbiddenField",
            Reason::CleanupPodRejected => "CleanupPodRejected",
            Reason::CleanupPodStuck => "CleanupPodStuck",
            Reason::ClaimMissing => "ClaimMissing",
            Reason::ClaimInUse => "ClaimInUse",
            Reason::ClaimOwnershipConflict => "ClaimOwnershipConflict",
            Reason::ForeignPod => "ForeignPod",
            Reason::UnprovenCleanupPod => "UnprovenCleanupPod",
            Reason::RetentionPolicyConflict => "RetentionPolicyConflict",
            Reason::ReleaseFailed => "ErrReleasePV",
            Reason::PodBindingRefused => "PodBindingRefused",
            Reason::ScrubFailed => "ErrScrubPV",
            Reason::ReconcileFailed => "ReconcileFailed",
        }
    }

    /// When the reason is reported: the "When" column of the Event table in docs/reference.md
    /// (generated from this, see `tests::the_event_table_is_generated_from_the_code`).
    pub const fn description(self) -> &'static str {
        match self {
            Reason::SuccessfulCreate => "a cleanup pod was created, confirmed and released to run",
            Reason::CleanupSuccess => {
                "a cleanup pod succeeded; its claims and the pod are deleted next"
            }
            Reason::SuccessfulDelete => {
                "a claim or a cleanup pod was deleted (or a stateful pod on background deletion)"
            }
            Reason::CleanupRetry => "a failed cleanup pod was deleted for the next attempt",
            Reason::CleanupCancelled => {
                "a cleanup pod was created but its ordinal was wanted again (or the set changed); it never ran and was deleted"
            }
            Reason::OrphanDeletion => "the set was deleted with orphan propagation",
            Reason::DryRun => {
                "`--dry-run`: on a StatefulSet, what the scale-down controller would have written (the companions only log it)"
            }
            Reason::Released => {
                "on a PersistentVolume (Events of cluster objects go to namespace `default`): the PV releaser made it Available again (plumber-cd's reason)"
            }
            Reason::Scrubbed => {
                "on a PersistentVolume: its scrub pod succeeded; it is released next"
            }
            Reason::BoundToPod => {
                "on a claim: it now has an ownerReference to its pod's UID and goes with that pod"
            }
            Reason::DeletedWithPod => {
                "on a claim: its pod was gone before it could be bound, and the grace is over; deleted"
            }
            Reason::ScaledUpDuringCleanup => {
                "the ordinal was scaled up while its cleanup ran; the claims are kept"
            }
            Reason::CleanupFailed => {
                "a cleanup pod failed, or the kubelet restarted its failed container (`restartPolicy: OnFailure`) (reason, exit code, what happens next)"
            }
            Reason::CleanupGaveUp => {
                "the last attempt failed (the pod stays), or the API server refused the pod `--cleanup-attempts` times"
            }
            Reason::CleanupTemplateInvalid => "the annotation is not JSON/YAML, or not a pod",
            Reason::CleanupTemplateTooLarge => {
                "the template or the pod rendered from it exceeds a size or parser budget (the limit is named)"
            }
            Reason::CleanupTemplateRestartPolicy => "`restartPolicy: Always`",
            Reason::CleanupTemplateSelectorOverlap => {
                "the pod's labels match the set's selector (the StatefulSet controller would adopt it)"
            }
            Reason::CleanupTemplateVolumeClash => {
                "a template volume has a claim template's name but is not a claim volume"
            }
            Reason::CleanupTemplateForbiddenField => {
                "`metadata.ownerReferences` or `metadata.finalizers` in the template"
            }
            Reason::CleanupPodRejected => {
                "the API server refused the rendered pod: admission, quota, validation, size (code and message included)"
            }
            Reason::CleanupPodStuck => {
                "a cleanup pod is still Pending after `--cleanup-pending-timeout`"
            }
            Reason::ClaimMissing => {
                "a claim of the ordinal does not exist; an `emptyDir` stands in"
            }
            Reason::ClaimInUse => {
                "a claim due for deletion (of a finished cleanup, or bound to a pod that is gone) is mounted by another pod; it is deleted once that pod is gone"
            }
            Reason::ClaimOwnershipConflict => {
                "the claim also belongs to another StatefulSet that uses it"
            }
            Reason::ForeignPod => {
                "a pod named `S-N` is neither the set's nor ours; the ordinal waits"
            }
            Reason::UnprovenCleanupPod => {
                "a pod looks like a cleanup pod but is not in the controller's record; it never causes a deletion"
            }
            Reason::RetentionPolicyConflict => {
                "`whenScaled`/`whenDeleted: Delete`; Kubernetes deletes the claims"
            }
            Reason::ReleaseFailed => {
                "on a PersistentVolume: the release failed (plumber-cd's reason); retried after 10 s"
            }
            Reason::PodBindingRefused => {
                "on a claim: it names a StatefulSet's pod, belongs to a StatefulSet, or names no pod; nothing is written to the claim"
            }
            Reason::ScrubFailed => {
                "on a PersistentVolume: its scrub failed (the pod failed, the template is invalid, or the API server refused the pod); it stays Released"
            }
            Reason::ReconcileFailed => {
                "two or more passes over the set failed in a row; names the error category and the API server's answer; the set backs off (once per distinct answer)"
            }
        }
    }

    /// Whether the Event is a Warning (something a human should look at).
    pub const fn is_warning(self) -> bool {
        !matches!(
            self,
            Reason::SuccessfulCreate
                | Reason::CleanupSuccess
                | Reason::SuccessfulDelete
                | Reason::CleanupRetry
                | Reason::CleanupCancelled
                | Reason::OrphanDeletion
                | Reason::DryRun
                | Reason::Released
                | Reason::Scrubbed
                | Reason::BoundToPod
                | Reason::DeletedWithPod
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_once_with_distinct_names() {
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        assert!(
            Reason::ALL.windows(2).all(|w| w[0] < w[1]),
            "ALL is in declaration order"
        );
    }

    /// The Event table of docs/reference.md is exactly one row per reason, in `ALL`'s order.
    #[test]
    fn the_event_table_is_generated_from_the_code() {
        let mut table = String::from("| Event reason | Type | When |\n|---|---|---|\n");
        for reason in Reason::ALL {
            let kind = if reason.is_warning() {
                "Warning"
            } else {
                "Normal"
            };
            let when = crate::docs::cell(reason.description());
            table.push_str(&format!("| `{reason}` | {kind} | {when} |\n"));
        }
        crate::docs::check_generated("events", &table);
    }
}
