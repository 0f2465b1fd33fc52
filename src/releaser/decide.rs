//! DECIDE: whether one PV is released, from its facts alone. Pure and deterministic.
//!
//! A PV is released (its `spec.claimRef` removed, so it becomes Available with its data) only when
//! every one of these holds: its StorageClass names this releaser's id; its reclaim policy is
//! Retain; it is `Released`; it is not being deleted; it names a claim by UID; and a live read shows
//! that claim gone (no claim of that name, or one with another UID). The removal itself is guarded
//! by the claim's UID (`act`), so a PV bound again meanwhile is never touched.

use super::observe::{ClaimRead, PvFacts};

/// What to do about one PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing; why.
    Skip(Skip),
    /// Read the claim named by `claimRef` from the API server, then decide again.
    ReadClaim,
    /// Remove `spec.claimRef`, if it still names the claim with this UID.
    Release { claim_uid: String },
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
}

pub fn decide(pv: &PvFacts, id: &str) -> Plan {
    let skip = if pv.class_id.as_deref() != Some(id) {
        Some(Skip::NotOurs)
    } else if !pv.retain {
        Some(Skip::NotRetain)
    } else if pv.phase != "Released" {
        Some(Skip::NotReleased)
    } else if pv.deleting {
        Some(Skip::Deleting)
    } else {
        None
    };
    if let Some(skip) = skip {
        return Plan::Skip(skip);
    }
    let Some(claim) = pv.claim_ref.as_ref().filter(|c| !c.uid.is_empty()) else {
        return Plan::Skip(Skip::NoClaim);
    };
    match &pv.claim {
        ClaimRead::NotRead => Plan::ReadClaim,
        ClaimRead::Exists { uid } if *uid == claim.uid => Plan::Skip(Skip::ClaimExists),
        ClaimRead::Exists { .. } | ClaimRead::Gone => Plan::Release {
            claim_uid: claim.uid.clone(),
        },
    }
}

#[cfg(test)]
mod tests;
