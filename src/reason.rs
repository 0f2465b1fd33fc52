//! Every outcome the controller reports. One `Reason` drives the Event reason, its type (Normal or
//! Warning), the `reason` label of `scaledown_events_total` and the `reason` field of log lines, so
//! the three can never disagree and nothing matches on reason strings.
//!
//! The list below is the one place a reason is declared: its kind, its Event string, its doc and
//! its description. `reasons!` generates the enum, [`Reason::ALL`], [`Reason::as_str`],
//! [`Reason::kind`] and [`Reason::description`] from it,
//! so a reason without a kind does not compile and `ALL` cannot miss one.

/// The Event type of a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Progress: nothing for a human to do.
    Normal,
    /// Something a human should look at.
    Warning,
}

/// Declares [`Reason`] from `Kind Variant = "EventString" when "description",` entries (each with
/// its doc for developers; the description is for operators).
macro_rules! reasons {
    ($( $(#[$doc:meta])* $kind:ident $variant:ident = $name:literal when $when:literal, )+) => {
        /// One reportable outcome.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )+
        }

        impl Reason {
            /// Every reason in declaration order, for metric pre-registration and documentation
            /// checks.
            pub const ALL: [Reason; [$( Reason::$variant, )+].len()] = [$( Reason::$variant, )+];

            /// The Event reason (and metric label, and log field).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Reason::$variant => $name, )+
                }
            }

            /// Normal or Warning.
            pub const fn kind(self) -> Kind {
                match self {
                    $( Reason::$variant => Kind::$kind, )+
                }
            }

            /// When the reason is reported, for operators: the "When" column of the Event table
            /// in docs/reference.md (generated from this, see
            /// `tests::the_event_table_is_generated_from_the_code`).
            pub const fn description(self) -> &'static str {
                match self {
                    $( Reason::$variant => $when, )+
                }
            }
        }
    };
}

reasons! {
    /// A cleanup pod was created, confirmed and released to run.
    Normal SuccessfulCreate = "SuccessfulCreate"
        when "a cleanup pod was created, confirmed and released to run",
    /// A cleanup pod succeeded; its claims and the pod are deleted next.
    Normal CleanupSuccess = "CleanupSuccess"
        when "a cleanup pod succeeded; its claims and the pod are deleted next",
    /// A claim or a cleanup pod was deleted (or a stateful pod on background deletion).
    Normal SuccessfulDelete = "SuccessfulDelete"
        when "a claim or a cleanup pod was deleted (or a stateful pod on background deletion)",
    /// A failed cleanup pod was deleted for the next attempt.
    Normal CleanupRetry = "CleanupRetry"
        when "a failed cleanup pod was deleted for the next attempt",
    /// A cleanup pod was created but the confirmation read showed its ordinal wanted (or the set
    /// changed), or its claims went before it was scheduled; the pod, which never ran, was deleted.
    Normal CleanupCancelled = "CleanupCancelled"
        when "a cleanup pod was created but its ordinal was wanted again (or the set changed), or its claims were deleted before it was scheduled; it never ran and was deleted",
    /// The set was deleted with orphan propagation.
    Normal OrphanDeletion = "OrphanDeletion"
        when "the set was deleted with orphan propagation",
    /// `--dry-run`: what would have been written.
    Normal DryRun = "DryRun"
        when "`--dry-run`: on the object concerned (a StatefulSet, a PersistentVolume, a claim), a write a controller would have made",
    /// The PV releaser removed a PV's claimRef: the PV is Available again (plumber-cd's reason).
    Normal Released = "Released"
        when "on a PersistentVolume (Events of cluster objects go to namespace `default`): the PV releaser made it Available again (plumber-cd's reason)",
    /// The scrub pod of a Released PV succeeded; the PV is released next.
    Normal Scrubbed = "Scrubbed"
        when "on a PersistentVolume: its scrub pod succeeded; it is released next",
    /// A claim was bound to its pod's life (an ownerReference to the pod).
    Normal BoundToPod = "BoundToPod"
        when "on a claim: it now has an ownerReference to its pod's UID and goes with that pod",
    /// A claim bound to a pod that was gone before the binding was made was deleted.
    Normal DeletedWithPod = "DeletedWithPod"
        when "on a claim: its pod was gone before it could be bound, and the grace is over; deleted",
    /// The set was paused (its paused annotation is `"true"`): no new cleanup pod.
    Normal ScaleDownPaused = "ScaleDownPaused"
        when "the set carries `statefulsets.kubernetes.io/scaledown-paused: \"true\"`: no new cleanup pod until it is removed (once per pause; the note lists the ordinals waiting)",
    /// The paused annotation was removed (or is no longer `"true"`): cleanups go on.
    Normal ScaleDownResumed = "ScaleDownResumed"
        when "the paused annotation was removed (or is no longer `\"true\"`): the cleanups go on with whatever is orphaned then",
    /// The ordinal was scaled up while its cleanup ran; the claims are kept.
    Warning ScaledUpDuringCleanup = "ScaledUpDuringCleanup"
        when "the ordinal was scaled up while its cleanup ran; the claims are kept",
    /// A cleanup pod failed, or the kubelet restarted its failed container (the note: what next).
    Warning CleanupFailed = "CleanupFailed"
        when "a cleanup pod failed, or the kubelet restarted its failed container (`restartPolicy: OnFailure`) (reason, exit code, the failed pod's termination message, what happens next)",
    /// The last attempt failed (the pod stays), or the API server refused the pod every attempt.
    Warning CleanupGaveUp = "CleanupGaveUp"
        when "the last attempt failed (the pod stays; its exit code and termination message), or the API server refused the pod `--cleanup-attempts` times",
    /// The template annotation is not JSON or YAML, or not a pod.
    Warning CleanupTemplateInvalid = "CleanupTemplateInvalid"
        when "the annotation is not JSON/YAML, or not a pod",
    /// The template or the pod rendered from it is over a size or parser budget.
    Warning CleanupTemplateTooLarge = "CleanupTemplateTooLarge"
        when "the template or the pod rendered from it exceeds a size or parser budget (the limit is named)",
    /// The template asks for `restartPolicy: Always`.
    Warning CleanupTemplateRestartPolicy = "CleanupTemplateRestartPolicy"
        when "`restartPolicy: Always`",
    /// The template's labels match the set's selector (the StatefulSet controller would adopt it).
    Warning CleanupTemplateSelectorOverlap = "CleanupTemplateSelectorOverlap"
        when "the pod's labels match the set's selector (the StatefulSet controller would adopt it)",
    /// A template volume has a claim template's name but is not a claim volume.
    Warning CleanupTemplateVolumeClash = "CleanupTemplateVolumeClash"
        when "a template volume has a claim template's name but is not a claim volume",
    /// The template sets `metadata.ownerReferences` or `metadata.finalizers`.
    Warning CleanupTemplateForbiddenField = "CleanupTemplateForbiddenField"
        when "`metadata.ownerReferences` or `metadata.finalizers` in the template",
    /// The inherit annotation has a value other than `scheduling` or `none`: nothing is inherited.
    Warning CleanupInheritInvalid = "CleanupInheritInvalid"
        when "the annotation `statefulsets.kubernetes.io/scaledown-pod-inherit` is neither `scheduling` nor `none`; the cleanup pod inherits nothing from the set (once per value)",
    /// The API server refused the cleanup pod (admission, quota, validation, size, server error).
    Warning CleanupPodRejected = "CleanupPodRejected"
        when "the API server refused the rendered pod: admission, quota, validation, size (code and message included)",
    /// A cleanup pod has been Pending (unscheduled) past `--cleanup-pending-timeout`.
    Warning CleanupPodStuck = "CleanupPodStuck"
        when "a cleanup pod is still Pending after `--cleanup-pending-timeout`",
    /// A pod of an orphaned ordinal has been Terminating past `--cleanup-pending-timeout` (its
    /// node is likely gone); the ordinal waits.
    Warning PodStuckTerminating = "PodStuckTerminating"
        when "a pod of an orphaned ordinal has been Terminating longer than `--cleanup-pending-timeout` (its node may be gone); the ordinal waits until it is gone",
    /// A claim of the ordinal does not exist; an `emptyDir` stands in.
    Warning ClaimMissing = "ClaimMissing"
        when "a claim of the ordinal does not exist; an `emptyDir` stands in",
    /// A claim of a finished cleanup is mounted by another pod; it is not deleted while so.
    Warning ClaimInUse = "ClaimInUse"
        when "a claim due for deletion (of a finished cleanup, or bound to a pod that is gone) is mounted by another pod; it is deleted once that pod is gone",
    /// A claim whose name fits an orphaned ordinal is not proven the set's; the ordinal is left
    /// alone.
    Warning ClaimOwnershipConflict = "ClaimOwnershipConflict"
        when "a claim whose name fits an orphaned ordinal is not proven the set's (another object owns it, it carries another set's selector labels, or another set could own it by name); the ordinal is left alone",
    /// A pod named like the ordinal is neither the set's nor ours; the ordinal waits.
    Warning ForeignPod = "ForeignPod"
        when "a pod named `S-N` is neither the set's nor ours; the ordinal waits",
    /// A pod looks like a cleanup pod (label, annotations) but this controller's record on the
    /// StatefulSet does not name its UID: it is never treated as a cleanup.
    Warning UnprovenCleanupPod = "UnprovenCleanupPod"
        when "a pod looks like a cleanup pod but is not in the controller's record; it never causes a deletion",
    /// The set is being deleted and nothing left proves a foreground or background deletion:
    /// the claims of the ordinals its spec still wants are kept, as after an orphan deletion.
    Warning DeletionUnproven = "DeletionUnproven"
        when "the set is being deleted with no `orphan` or `foregroundDeletion` finalizer, no pod of its ordinals and no deletion mark of ours left: an orphan deletion cannot be ruled out, so the claims of the ordinals its spec still wants are kept (those past `replicas` are cleaned as after a scale-down)",
    /// The set asks Kubernetes to delete its claims (`whenScaled`/`whenDeleted: Delete`).
    Warning RetentionPolicyConflict = "RetentionPolicyConflict"
        when "`whenScaled`/`whenDeleted: Delete`; Kubernetes deletes the claims",
    /// The PV releaser could not release a PV (plumber-cd's reason `ErrReleasePV`).
    Warning ReleaseFailed = "ErrReleasePV"
        when "on a PersistentVolume: the release failed (plumber-cd's reason); retried after 10 s",
    /// A claim asked to be bound to a pod it may not be bound to (a StatefulSet's pod or claim).
    Warning PodBindingRefused = "PodBindingRefused"
        when "on a claim: it names a StatefulSet's pod, belongs to a StatefulSet, or names no pod; nothing is written to the claim",
    /// The scrub of a PV failed (or its pod could not be created): the PV stays Released.
    Warning ScrubFailed = "ErrScrubPV"
        when "on a PersistentVolume: its scrub failed (the pod failed, the API server refused the pod, or the template broke or was removed before the pod was created); it stays Released",
    /// A PV's StorageClass asks for a scrub that cannot run (its template cannot make a pod, no
    /// scrub namespace is known, or a claim this releaser did not create has the temporary claim's
    /// name): nothing is written, the PV stays Released.
    Warning ScrubBlocked = "ScrubBlocked"
        when "on a PersistentVolume: its StorageClass asks for a scrub that cannot run (the template cannot make a pod, no scrub namespace is known, or a claim named like the temporary claim exists that this releaser did not create); nothing is written and it stays Released until that is fixed (once per PV and cause)",
    /// Passes over one object failed in a row; it backs off.
    Warning ReconcileFailed = "ReconcileFailed"
        when "on the object (a StatefulSet, a PersistentVolume, a claim): two or more passes over it failed in a row; names the error category and the API server's answer; it backs off (once per distinct answer)",
}

impl Reason {
    /// Whether the Event is a Warning (something a human should look at).
    pub const fn is_warning(self) -> bool {
        matches!(self.kind(), Kind::Warning)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Kind::{Normal, Warning};
    use super::Reason::*;
    use super::*;

    /// Every reason, written out by hand in declaration order (not generated by `reasons!`).
    const LISTED: [Reason; 38] = [
        SuccessfulCreate,
        CleanupSuccess,
        SuccessfulDelete,
        CleanupRetry,
        CleanupCancelled,
        OrphanDeletion,
        DryRun,
        Released,
        Scrubbed,
        BoundToPod,
        DeletedWithPod,
        ScaleDownPaused,
        ScaleDownResumed,
        ScaledUpDuringCleanup,
        CleanupFailed,
        CleanupGaveUp,
        CleanupTemplateInvalid,
        CleanupTemplateTooLarge,
        CleanupTemplateRestartPolicy,
        CleanupTemplateSelectorOverlap,
        CleanupTemplateVolumeClash,
        CleanupTemplateForbiddenField,
        CleanupInheritInvalid,
        CleanupPodRejected,
        CleanupPodStuck,
        PodStuckTerminating,
        ClaimMissing,
        ClaimInUse,
        ClaimOwnershipConflict,
        ForeignPod,
        UnprovenCleanupPod,
        DeletionUnproven,
        RetentionPolicyConflict,
        ReleaseFailed,
        PodBindingRefused,
        ScrubFailed,
        ScrubBlocked,
        ReconcileFailed,
    ];

    /// The kind and Event string each reason must have. No wildcard: a new reason does not compile
    /// until it is classified here.
    fn expected(reason: Reason) -> (Kind, &'static str) {
        match reason {
            SuccessfulCreate => (Normal, "SuccessfulCreate"),
            CleanupSuccess => (Normal, "CleanupSuccess"),
            SuccessfulDelete => (Normal, "SuccessfulDelete"),
            CleanupRetry => (Normal, "CleanupRetry"),
            CleanupCancelled => (Normal, "CleanupCancelled"),
            OrphanDeletion => (Normal, "OrphanDeletion"),
            DryRun => (Normal, "DryRun"),
            Released => (Normal, "Released"),
            Scrubbed => (Normal, "Scrubbed"),
            BoundToPod => (Normal, "BoundToPod"),
            DeletedWithPod => (Normal, "DeletedWithPod"),
            ScaleDownPaused => (Normal, "ScaleDownPaused"),
            ScaleDownResumed => (Normal, "ScaleDownResumed"),
            ScaledUpDuringCleanup => (Warning, "ScaledUpDuringCleanup"),
            CleanupFailed => (Warning, "CleanupFailed"),
            CleanupGaveUp => (Warning, "CleanupGaveUp"),
            CleanupTemplateInvalid => (Warning, "CleanupTemplateInvalid"),
            CleanupTemplateTooLarge => (Warning, "CleanupTemplateTooLarge"),
            CleanupTemplateRestartPolicy => (Warning, "CleanupTemplateRestartPolicy"),
            CleanupTemplateSelectorOverlap => (Warning, "CleanupTemplateSelectorOverlap"),
            CleanupTemplateVolumeClash => (Warning, "CleanupTemplateVolumeClash"),
            CleanupTemplateForbiddenField => (Warning, "CleanupTemplateForbiddenField"),
            CleanupInheritInvalid => (Warning, "CleanupInheritInvalid"),
            CleanupPodRejected => (Warning, "CleanupPodRejected"),
            CleanupPodStuck => (Warning, "CleanupPodStuck"),
            PodStuckTerminating => (Warning, "PodStuckTerminating"),
            ClaimMissing => (Warning, "ClaimMissing"),
            ClaimInUse => (Warning, "ClaimInUse"),
            ClaimOwnershipConflict => (Warning, "ClaimOwnershipConflict"),
            ForeignPod => (Warning, "ForeignPod"),
            UnprovenCleanupPod => (Warning, "UnprovenCleanupPod"),
            DeletionUnproven => (Warning, "DeletionUnproven"),
            RetentionPolicyConflict => (Warning, "RetentionPolicyConflict"),
            ReleaseFailed => (Warning, "ErrReleasePV"),
            PodBindingRefused => (Warning, "PodBindingRefused"),
            ScrubFailed => (Warning, "ErrScrubPV"),
            ScrubBlocked => (Warning, "ScrubBlocked"),
            ReconcileFailed => (Warning, "ReconcileFailed"),
        }
    }

    #[test]
    fn all_is_every_reason_in_declaration_order() {
        assert_eq!(
            Reason::ALL,
            LISTED,
            "ALL differs from the hand-written list"
        );
        assert!(
            Reason::ALL.windows(2).all(|w| w[0] < w[1]),
            "ALL is in declaration order without repeats"
        );
    }

    #[test]
    fn every_reason_has_its_kind_and_a_distinct_name() {
        for reason in LISTED {
            let (kind, name) = expected(reason);
            assert_eq!(reason.kind(), kind, "kind of {reason:?}");
            assert_eq!(
                reason.is_warning(),
                kind == Warning,
                "is_warning of {reason:?}"
            );
            assert_eq!(reason.as_str(), name, "Event reason of {reason:?}");
            assert_eq!(reason.to_string(), name, "Display of {reason:?}");
        }
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names.len(),
            Reason::ALL.len(),
            "Event reasons repeat: {names:?}"
        );
        let normal = Reason::ALL.iter().filter(|r| r.kind() == Normal).count();
        assert_eq!(
            (normal, Reason::ALL.len() - normal),
            (13, 25),
            "Normal and Warning reasons"
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
