//! DECIDE: whether one PV is released (or scrubbed first), from its facts alone. Pure and
//! deterministic.
//!
//! A PV is taken up only when every one of these holds: its StorageClass names this releaser's id;
//! its reclaim policy is Retain; it is not being deleted; it is `Released` and names a claim by UID;
//! and a live read shows that claim gone (no claim of that name, or one with another UID). Then:
//! - without a scrub template on the class, `spec.claimRef` is removed (guarded by the claim's
//!   UID in `act`), so the PV is Available with its data;
//! - with one, a temporary claim takes the PV over (the claimRef swap is guarded by the old
//!   claim's UID), a scrub pod runs on it, and only after it Succeeded and the temporary claim is
//!   gone is the PV released. A failed scrub leaves the PV Released for good (a Warning says why).
//!
//! A scrub that cannot run is a plan too, [`Plan::ScrubBlocked`], with its cause: a template that
//! cannot make a pod (checked before the PV is taken over, so the PV stays Released and untouched
//! until the class is fixed), or no scrub namespace for a step that needs one. A template that
//! breaks while a scrub waits for its pod fails that scrub, as a failed pod would.

use super::observe::{ClaimRead, PvFacts, ScrubPod, ScrubTemplate};
use super::scrub::Scrub;

/// What to do about one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing; why.
    Skip(Skip),
    /// Read the claim named by `claimRef` from the API server, then decide again.
    ReadClaim,
    /// Remove `spec.claimRef` (and our scrub record), if it still names the claim with this UID.
    Release {
        /// The UID `claimRef` must still name.
        claim_uid: String,
    },
    /// Create the temporary claim in `namespace` and hand the PV to it, if `claimRef` still names
    /// `claim_uid`.
    StartScrub {
        /// The UID `claimRef` must still name.
        claim_uid: String,
        /// The scrub namespace.
        namespace: String,
    },
    /// Create `pod` (the scrub pod, rendered) on the temporary claim with this UID in `namespace`.
    CreateScrubPod {
        /// The temporary claim's UID.
        temp_uid: String,
        /// The scrub namespace.
        namespace: String,
        /// The scrub pod to create.
        pod: serde_json::Value,
    },
    /// Record the outcome (the pod succeeded, or failed with this reason), delete the pod (by its
    /// UID, if there is one) and the temporary claim.
    FinishScrub {
        /// The temporary claim's UID.
        temp_uid: String,
        /// Why the scrub failed (`None`: it succeeded).
        failed: Option<String>,
        /// The scrub namespace.
        namespace: String,
        /// The scrub pod's UID, if it is still there.
        pod_uid: Option<String>,
    },
    /// Delete the temporary claim (its scrub is over).
    DeleteTemp {
        /// The temporary claim's UID.
        temp_uid: String,
        /// The scrub namespace.
        namespace: String,
    },
    /// The class asks for a scrub that cannot run; nothing is written (reported once per cause).
    ScrubBlocked(Blocked),
}

/// Why a scrub the class asks for cannot run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// The class's scrub template cannot make a pod (the parser's or the check's words).
    InvalidTemplate(String),
    /// No scrub namespace is known (`--pv-scrub-namespace`, or the controller's own namespace).
    NoNamespace,
    /// A claim of the temporary claim's name exists that this releaser did not create (or created
    /// in an earlier process, and never recorded on the PV): the PV is not handed to it.
    ClaimTaken {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The claim's UID.
        uid: String,
    },
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::InvalidTemplate(why) => write!(f, "its scrub template is invalid: {why}"),
            Blocked::NoNamespace => {
                f.write_str("no scrub namespace is known (--pv-scrub-namespace, or POD_NAMESPACE)")
            }
            Blocked::ClaimTaken {
                namespace,
                name,
                uid,
            } => write!(
                f,
                "claim {namespace}/{name} (uid {uid}) exists and was not created by this releaser for it, so the PV is not handed to it"
            ),
        }
    }
}

/// What to make of a claim that already has the temporary claim's name (its create was answered
/// 409).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    /// The claim this process created for the PV (its UID is the one recorded at the create) and
    /// has not handed the PV to yet: the scrub goes on with it.
    Adopt(String),
    /// A claim being deleted (a former scrub's): try again once it is gone.
    Deleting,
    /// Anyone else's: never handed the PV.
    Foreign(String),
}

/// Whether the existing claim with `uid` (being deleted: `deleting`) is the one this process
/// created for the PV (`created`: the UID it recorded at the create, if any). Only a UID match
/// adopts it; names, labels and annotations can be set by anyone who may create claims there.
pub fn existing(uid: &str, deleting: bool, created: Option<&str>) -> Existing {
    if deleting {
        Existing::Deleting
    } else if !uid.is_empty() && created == Some(uid) {
        Existing::Adopt(uid.to_string())
    } else {
        Existing::Foreign(uid.to_string())
    }
}

/// Why a PV is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Its StorageClass does not name this releaser.
    NotOurs,
    /// Its reclaim policy is not Retain (Delete and Recycle PVs are Kubernetes' business).
    NotRetain,
    /// It is not `Released` (Available, Bound, Pending or Failed).
    NotReleased,
    /// It is being deleted.
    Deleting,
    /// It names no claim by UID: nothing to release, or only pre-bound by name.
    NoClaim,
    /// The claim it names still exists.
    ClaimExists,
    /// Its scrub runs; nothing to do until the pod finishes.
    Scrubbing,
    /// Its scrub failed: it stays Released.
    ScrubFailed,
    /// Its claimRef no longer names our temporary claim: not ours any more.
    Rebound,
}

/// The plan for `pv`, for the releaser with this `id`.
pub fn decide(pv: &PvFacts, id: &str) -> Plan {
    let skip = if pv.class_id.as_deref() != Some(id) {
        Some(Skip::NotOurs)
    } else if !pv.retain {
        Some(Skip::NotRetain)
    } else if pv.deleting {
        Some(Skip::Deleting)
    } else {
        None
    };
    if let Some(skip) = skip {
        return Plan::Skip(skip);
    }
    match &pv.scrub {
        None => released(pv),
        Some(scrub) => scrubbing(pv, scrub),
    }
}

/// A PV without a scrub record: released, or handed to a scrub, once its claim is gone.
fn released(pv: &PvFacts) -> Plan {
    if pv.phase != "Released" {
        return Plan::Skip(Skip::NotReleased);
    }
    let Some(claim) = pv.claim_ref.as_ref().filter(|c| !c.uid.is_empty()) else {
        return Plan::Skip(Skip::NoClaim);
    };
    match &pv.claim {
        ClaimRead::NotRead => Plan::ReadClaim,
        ClaimRead::Exists { uid } if *uid == claim.uid => Plan::Skip(Skip::ClaimExists),
        ClaimRead::Exists { .. } | ClaimRead::Gone => {
            let claim_uid = claim.uid.clone();
            match &pv.scrub_template {
                ScrubTemplate::Absent => Plan::Release { claim_uid },
                ScrubTemplate::Invalid(why) => {
                    Plan::ScrubBlocked(Blocked::InvalidTemplate(why.clone()))
                }
                ScrubTemplate::Pod(_) => in_scrub_ns(pv, |namespace| Plan::StartScrub {
                    claim_uid,
                    namespace,
                }),
            }
        }
    }
}

/// `plan` in the scrub namespace, or blocked without one.
fn in_scrub_ns(pv: &PvFacts, plan: impl FnOnce(String) -> Plan) -> Plan {
    match &pv.scrub_ns {
        Some(ns) => plan(ns.clone()),
        None => Plan::ScrubBlocked(Blocked::NoNamespace),
    }
}

/// A PV under a scrub: every step checks that its claimRef still names our temporary claim.
fn scrubbing(pv: &PvFacts, scrub: &Scrub) -> Plan {
    let temp_uid = scrub.temp_uid().to_string();
    if pv.claim_ref.as_ref().map(|c| c.uid.as_str()) != Some(temp_uid.as_str()) {
        return Plan::Skip(Skip::Rebound);
    }
    let bound = pv.phase == "Bound";
    let finish = |failed: Option<String>, pod_uid: Option<&String>| {
        in_scrub_ns(pv, |namespace| Plan::FinishScrub {
            temp_uid: temp_uid.clone(),
            failed,
            namespace,
            pod_uid: pod_uid.cloned(),
        })
    };
    match (scrub, &pv.scrub_pod) {
        (Scrub::Running(_), ScrubPod::Succeeded { uid }) => finish(None, Some(uid)),
        (Scrub::Running(_), ScrubPod::Failed { uid, reason }) => {
            finish(Some(reason.clone()), Some(uid))
        }
        (Scrub::Running(_), ScrubPod::Missing) if bound => match &pv.scrub_template {
            ScrubTemplate::Pod(template) => in_scrub_ns(pv, |namespace| Plan::CreateScrubPod {
                pod: crate::template::scrub::render(template, &pv.name, &namespace),
                temp_uid: temp_uid.clone(),
                namespace,
            }),
            ScrubTemplate::Invalid(why) => finish(Some(format!("scrub template: {why}")), None),
            ScrubTemplate::Absent => finish(
                Some("the StorageClass no longer has a scrub template".into()),
                None,
            ),
        },
        (Scrub::Running(_), _) => Plan::Skip(Skip::Scrubbing),
        (Scrub::Scrubbed(_) | Scrub::Failed(_), _) if bound => {
            in_scrub_ns(pv, |namespace| Plan::DeleteTemp {
                temp_uid: temp_uid.clone(),
                namespace,
            })
        }
        (Scrub::Scrubbed(_), _) if pv.phase == "Released" => Plan::Release {
            claim_uid: temp_uid,
        },
        (Scrub::Scrubbed(_), _) => Plan::Skip(Skip::NotReleased),
        (Scrub::Failed(_), _) => Plan::Skip(Skip::ScrubFailed),
    }
}

#[cfg(test)]
mod tests;
