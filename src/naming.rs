//! Names, keys and ordinals: the strings that make us drop-in compatible with the Go original, and
//! the rules that tie a claim or pod name to a StatefulSet ordinal. Pure functions only.

use std::collections::BTreeMap;

/// StatefulSet annotation holding the cleanup pod template (JSON, or YAML).
pub const TEMPLATE_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-pod-template";
/// StatefulSet annotation: what the cleanup pod inherits from the set's own pod template.
/// [`INHERIT_SCHEDULING`] or [`INHERIT_NONE`]; without it, `--inherit-scheduling` decides.
pub const INHERIT_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-pod-inherit";
/// [`INHERIT_ANNOTATION`] value: the set's tolerations, node selector, node affinity, priority
/// class, image pull secrets and pod security context.
pub const INHERIT_SCHEDULING: &str = "scheduling";
/// [`INHERIT_ANNOTATION`] value: nothing (opts a set out when `--inherit-scheduling` is on).
pub const INHERIT_NONE: &str = "none";
/// Cleanup pod annotation naming the StatefulSet it cleans up after.
pub const OWNER_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-pod-owner";
/// Cleanup pod label whose value is the pod's own name; also the selector of our cleanup-pod watch.
pub const CLEANUP_LABEL: &str = "scaledown-pod";
/// Finalizer we put on annotated StatefulSets so that deletion waits for the cleanups.
pub const FINALIZER: &str = "statefulsets.kubernetes.io/scaledown";

/// Cleanup pod annotation: which attempt of the ordinal's cleanup this pod is (1-based).
pub const ATTEMPT_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-attempt";
/// Cleanup pod annotation: JSON map claim name -> claim UID, the exact claims this pod cleans.
pub const CLAIMS_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-claims";
/// Claim annotation written just before a failed cleanup pod is deleted for a retry: the number of
/// the next attempt. It carries the attempt count across the gap in which no cleanup pod exists.
pub const NEXT_ATTEMPT_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-next-attempt";

/// StatefulSet annotation, written only by this controller: JSON map ordinal -> UID of the cleanup
/// pod this controller created for that ordinal and confirmed. It is the proof that a pod named
/// `<set>-<ordinal>` is ours: labels and annotations on a pod can be forged by anyone who can
/// create pods, this record only by someone who can already edit the StatefulSet.
pub const RECORD_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-cleanups";
/// StatefulSet annotation, written only by this controller: the set's one-word status (`Idle`,
/// `CleaningUp`, `Stalled`, `Paused`). An annotation because kube-controller-manager rebuilds a
/// StatefulSet's status on every sync and would drop a condition it does not know.
pub const STATUS_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-status";
/// StatefulSet annotation, written only by this controller next to the status when it is `Stalled`
/// or `Paused`: why, naming the ordinals concerned (absent otherwise).
pub const STATUS_REASON_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-status-reason";
/// StatefulSet annotation set by users: `"true"` pauses the scale-down of the set (no new cleanup
/// pod; one already running finishes). Any other value, or none, does not.
pub const PAUSED_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-paused";
/// Scheduling gate every cleanup pod is created with. It is removed only after a read of the
/// StatefulSet made while the pod holds the name lock confirms the ordinal is still orphaned.
pub const CONFIRM_GATE: &str = "statefulsets.kubernetes.io/scaledown-confirm";

/// StatefulSet annotation this controller writes on a set being deleted once it has proven a
/// foreground or background deletion (`Foreground/<uid>`, `Background/<uid>`): after the
/// finalizer or pods that proved it are gone, it tells such a deletion from an orphan one.
pub const DELETION_ANNOTATION: &str = "statefulsets.kubernetes.io/scaledown-deletion";

/// Finalizers the API server puts on an object deleted with foreground or orphan propagation.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer of an orphan-propagation deletion.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// Environment variables every cleanup container receives.
pub const ENV_STATEFULSET: &str = "SCALEDOWN_STATEFULSET";
/// The StatefulSet's namespace.
pub const ENV_NAMESPACE: &str = "SCALEDOWN_NAMESPACE";
/// The ordinal cleaned up.
pub const ENV_ORDINAL: &str = "SCALEDOWN_ORDINAL";
/// The StatefulSet's replicas when the cleanup pod was created.
pub const ENV_REPLICAS: &str = "SCALEDOWN_REPLICAS";

/// Name of the pod (stateful or cleanup) of `set` at `ordinal`.
pub fn pod_name(set: &str, ordinal: u32) -> String {
    format!("{}{ordinal}", pod_prefix(set))
}

/// What the name of every pod of `set` starts with.
pub fn pod_prefix(set: &str) -> String {
    format!("{set}-")
}

/// What the name of every claim of claim template `template` of `set` starts with.
pub fn claim_prefix(template: &str, set: &str) -> String {
    format!("{template}-{set}-")
}

/// Name of the scrub pod and of the temporary claim of PV `pv` (the releaser's).
pub fn scrub_name(pv: &str) -> String {
    let mut name = format!("scrub-{pv}");
    name.truncate(253);
    name
}

/// Name of the claim of claim template `template` of `set` at `ordinal`.
pub fn claim_name(template: &str, set: &str, ordinal: u32) -> String {
    format!("{}{ordinal}", claim_prefix(template, set))
}

/// The ordinal of `claim` if it is the claim of `template` in `set`; computed from the set's own
/// names, never by splitting the claim name at a guessed dash.
pub fn claim_ordinal(claim: &str, template: &str, set: &str) -> Option<u32> {
    let rest = claim.strip_prefix(template)?.strip_prefix('-')?;
    let rest = rest.strip_prefix(set)?.strip_prefix('-')?;
    parse_ordinal(rest)
}

/// The ordinal of `pod` if it is named like a pod of `set`.
pub fn pod_ordinal(pod: &str, set: &str) -> Option<u32> {
    parse_ordinal(pod.strip_prefix(set)?.strip_prefix('-')?)
}

/// Which claim and pod names are those of one StatefulSet's ordinals ([`claim_ordinal`],
/// [`pod_ordinal`]), worked out once where the set's objects are gathered: what reads them then
/// looks the names up instead of parsing them with the set's name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ordinals {
    /// Claim name -> (claim template, ordinal), for every claim template whose name it fits, in
    /// the set's order of templates.
    pub claims: BTreeMap<String, Vec<(String, u32)>>,
    /// Pod name -> ordinal.
    pub pods: BTreeMap<String, u32>,
}

impl Ordinals {
    /// The ordinals `claims` and `pods` have as names of set `set`, whose claim templates are
    /// `templates`; the names that give none are left out.
    pub fn of<'a>(
        set: &str,
        templates: &[&str],
        claims: impl IntoIterator<Item = &'a str>,
        pods: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut ordinals = Ordinals::default();
        for claim in claims {
            let fits: Vec<(String, u32)> = templates
                .iter()
                .filter_map(|t| Some((t.to_string(), claim_ordinal(claim, t, set)?)))
                .collect();
            if !fits.is_empty() {
                ordinals.claims.insert(claim.to_string(), fits);
            }
        }
        for pod in pods {
            if let Some(ordinal) = pod_ordinal(pod, set) {
                ordinals.pods.insert(pod.to_string(), ordinal);
            }
        }
        ordinals
    }
}

/// A canonical decimal ordinal: digits only, no sign, no leading zero, within the int32 range the
/// StatefulSet API uses.
pub fn parse_ordinal(s: &str) -> Option<u32> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return None;
    }
    s.parse::<u32>().ok().filter(|n| *n <= i32::MAX as u32)
}

/// Claim annotation naming the pod (same namespace) whose life the claim shares.
pub const BOUND_TO_POD_ANNOTATION: &str = "statefulsets.kubernetes.io/bound-to-pod";
/// Claim annotation written by the controller: `<pod>@<RFC 3339 time>`, when it first saw the
/// claim wait for that pod (named by [`BOUND_TO_POD_ANNOTATION`], not there). The grace of a claim
/// whose pod never shows counts from this time, not from the claim's creation.
pub const WAITING_SINCE_ANNOTATION: &str = "statefulsets.kubernetes.io/bound-to-pod-waiting-since";

// The PV releaser's keys.
/// StorageClass annotation naming the releaser that may release its PVs (plumber-cd's key).
pub const CONTROLLER_ID_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/controller-id";
/// StorageClass annotation (ours): a pod template run on a Released PV before it is released.
pub const SCRUB_TEMPLATE_ANNOTATION: &str =
    "reclaimable-pv-releaser.kubernetes.io/scrub-pod-template";
/// PV annotation written only by the releaser: `<state>:<UID of the temporary claim>`.
pub const SCRUB_STATE_ANNOTATION: &str = "reclaimable-pv-releaser.kubernetes.io/scrub-state";
/// Label on scrub pods and temporary claims: the PV they are for.
pub const SCRUB_PV_LABEL: &str = "reclaimable-pv-releaser.kubernetes.io/scrub-pv";

/// The controller's name: the Events' reporting component, the field manager of its writes and
/// the default Lease name.
pub const CONTROLLER_NAME: &str = "statefulset-scaledown-controller";

/// The controllers of this process: the value of the `controller` label and log field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Controller {
    /// The scale-down controller (`scaledown`).
    Scaledown,
    /// The PV pool releaser (`pv-releaser`).
    Releaser,
    /// Claims bound to a pod's life (`pod-bound`).
    PodBound,
}

impl Controller {
    /// Every controller, in the order of the metrics' label values.
    pub const ALL: [Controller; 3] = [
        Controller::Scaledown,
        Controller::Releaser,
        Controller::PodBound,
    ];

    /// The label value and log field.
    pub const fn as_str(self) -> &'static str {
        match self {
            Controller::Scaledown => "scaledown",
            Controller::Releaser => "pv-releaser",
            Controller::PodBound => "pod-bound",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_ordinals_come_from_the_sets_own_names() {
        let cases = [
            ("data-web-2", "data", "web", Some(2)),
            ("data-web-0", "data", "web", Some(0)),
            ("data-web-10", "data", "web", Some(10)),
            // another set whose name shares the prefix
            ("data-web-2-0", "data", "web", None),
            ("data-web-2-0", "data", "web-2", Some(0)),
            // non-canonical ordinals
            ("data-web-02", "data", "web", None),
            ("data-web-+2", "data", "web", None),
            ("data-web--2", "data", "web", None),
            ("data-web-", "data", "web", None),
            ("data-web-x", "data", "web", None),
            ("data-web-2147483648", "data", "web", None),
            ("data-web-2147483647", "data", "web", Some(2_147_483_647)),
            // other template, other set
            ("logs-web-1", "data", "web", None),
            ("data-db-1", "data", "web", None),
            ("dataweb-1", "data", "web", None),
            // dashes inside template and set names
            ("b-c-a-3", "b-c", "a", Some(3)),
            ("b-c-a-3", "b", "c-a", Some(3)),
        ];
        for (claim, template, set, want) in cases {
            assert_eq!(
                claim_ordinal(claim, template, set),
                want,
                "{claim} for {template}/{set}"
            );
        }
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(claim_name("data", "web", 7), "data-web-7");
        assert_eq!(pod_name("web", 7), "web-7");
        assert_eq!(pod_ordinal("web-7", "web"), Some(7));
        assert_eq!(pod_ordinal("web-2-0", "web"), None);
        assert_eq!(pod_ordinal("web-07", "web"), None);
    }
}
