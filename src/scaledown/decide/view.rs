//! What holds for a StatefulSet as a whole in one decision (the [`View`]): the operator's
//! [`Policy`], whether the set takes part, its parsed template and inherited scheduling, how it is
//! being deleted, and what holds every new cleanup back ([`Hold`]).

use serde_json::Value;

use super::deletion::{Propagation, propagation};
use super::plan::Plan;
use crate::naming;
use crate::reason::Reason;
use crate::scaledown::observe::{Observed, SetFacts};
use crate::template;
use std::time::Duration;

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

/// Why no new cleanup may start on an orphaned ordinal of this set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    OptedOut,
    Template,
    OrphanDeletion,
    /// The set carries the paused annotation: no new cleanup pod, no retry.
    Paused,
    RetainedByKubernetes,
}

impl Hold {
    pub(super) fn explain(self) -> &'static str {
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
pub(super) struct View<'a> {
    pub(super) o: &'a Observed,
    pub(super) policy: &'a Policy,
    pub(super) opted_in: bool,
    pub(super) template: Option<template::CleanupTemplate>,
    /// The set's scheduling fields its cleanup pods inherit, when they do.
    pub(super) inherited: Option<&'a serde_json::Map<String, Value>>,
    /// How the set is being deleted, if it is.
    pub(super) deletion: Option<Propagation>,
    pub(super) background_deletion: bool,
    /// Being deleted, and nothing proves how ([`Propagation::Unproven`]): only the ordinals its
    /// spec no longer wants are orphaned, as after a scale-down; the others keep their claims.
    pub(super) unproven: bool,
    pub(super) hold: Option<Hold>,
}

impl<'a> View<'a> {
    pub(super) fn new(o: &'a Observed, policy: &'a Policy, plan: &mut Plan) -> Self {
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

    pub(super) fn orphaned(&self, ordinal: u32) -> bool {
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
