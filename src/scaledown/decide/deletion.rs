//! How a StatefulSet being deleted is being deleted (orphan, foreground or background), from the
//! facts of one read, and the mark this controller leaves on the set once it has proven a
//! foreground or background deletion, for the passes after the evidence is gone.

use crate::naming;
use crate::scaledown::observe::{Observed, PodRole, SetFacts};

/// How a set being deleted is being deleted, as far as the facts tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The garbage collector deletes the pods first (finalizer `foregroundDeletion`).
    Foreground,
    /// Nobody deletes the pods while our finalizer holds the set: we do.
    Background,
    /// The pods and claims are kept: the garbage collector takes the set's ownerReferences off
    /// the pods, then the `orphan` finalizer off the set.
    Orphan,
    /// Nothing tells: no `orphan` or `foregroundDeletion` finalizer, no pod of the set's ordinals
    /// left, and no mark of ours. An orphan deletion of a set whose pods were all gone looks like
    /// this, so it is treated as one (nothing cleaned), with a Warning.
    Unproven,
}

impl Propagation {
    fn as_str(self) -> &'static str {
        match self {
            Propagation::Foreground => "Foreground",
            Propagation::Background => "Background",
            Propagation::Orphan => "Orphan",
            Propagation::Unproven => "Unproven",
        }
    }
}

/// The propagation of the set's deletion (`None` while it is not being deleted).
///
/// The `orphan` and `foregroundDeletion` finalizers say so only until the garbage collector is done
/// with the pods; after that, a pod named after an ordinal that the set no longer owns says orphan,
/// a pod it still owns says background. Once no such pod is left, only our mark
/// ([`naming::DELETION_ANNOTATION`], written while the evidence was there) tells foreground and
/// background from an orphan deletion: without it the deletion is [`Propagation::Unproven`].
///
/// A view in which the pods lag the set mistakes an orphan deletion for a background one, so
/// destructive steps of a deleting set are only decided on a live read of the set and then of its
/// pods (`decide` asks for one), and the pass does nothing when that read and its cache disagree.
pub fn propagation(o: &Observed) -> Option<Propagation> {
    let set = &o.set;
    if !set.deleting {
        return None;
    }
    let has = |f: &str| set.finalizers.iter().any(|x| x == f);
    let role = |wanted: fn(&PodRole) -> bool| {
        o.ordinals
            .values()
            .any(|f| f.pod.as_ref().is_some_and(|p| wanted(&p.role)))
    };
    Some(if has(naming::ORPHAN_FINALIZER) {
        Propagation::Orphan
    } else if has(naming::FOREGROUND_FINALIZER) {
        Propagation::Foreground
    } else if role(|r| matches!(r, PodRole::Foreign)) {
        Propagation::Orphan
    } else if role(|r| matches!(r, PodRole::Stateful)) {
        Propagation::Background
    } else {
        marked(set).unwrap_or(Propagation::Unproven)
    })
}

/// The value of our mark for `propagation` on the set with UID `uid`. The UID is part of it, so a
/// set created again from a copy of an old one's manifest does not inherit the old one's mark.
pub fn mark_value(propagation: Propagation, uid: &str) -> String {
    format!("{}/{uid}", propagation.as_str())
}

/// The propagation our mark on `set` records, if it is a foreground or background one made for
/// this very set.
fn marked(set: &SetFacts) -> Option<Propagation> {
    let (kind, uid) = set.deletion_mark.as_deref()?.split_once('/')?;
    if uid.is_empty() || uid != set.uid {
        return None;
    }
    [Propagation::Foreground, Propagation::Background]
        .into_iter()
        .find(|p| p.as_str() == kind)
}

/// The mark to write now, if any: a foreground or background deletion proven by evidence that
/// will not last (the finalizer, the set's own pods) and not yet marked as such.
pub fn to_mark(o: &Observed, propagation: Option<Propagation>) -> Option<Propagation> {
    let p =
        propagation.filter(|p| matches!(p, Propagation::Foreground | Propagation::Background))?;
    (o.set.has_finalizer() && marked(&o.set) != Some(p)).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaledown::decide::tests::{stateful, web, with_claims};

    fn deleting(finalizers: &[&str], pods: std::ops::Range<u32>) -> Observed {
        let mut o = with_claims(web(3), 0..3, pods);
        o.set.deleting = true;
        o.set.finalizers = finalizers.iter().map(|f| f.to_string()).collect();
        o
    }

    #[test]
    fn evidence_in_order_finalizers_pods_mark() {
        let ours = naming::FINALIZER;
        let p = |o: &Observed| propagation(o).expect("deleting");
        assert_eq!(propagation(&web(3)), None);
        assert_eq!(p(&deleting(&["orphan", ours], 0..3)), Propagation::Orphan);
        assert_eq!(
            p(&deleting(&["foregroundDeletion", ours], 0..0)),
            Propagation::Foreground
        );
        assert_eq!(p(&deleting(&[ours], 0..3)), Propagation::Background);
        let mut foreign = deleting(&[ours], 0..3);
        if let Some(pod) = foreign.ordinals.get_mut(&1).and_then(|f| f.pod.as_mut()) {
            pod.role = PodRole::Foreign;
        }
        assert_eq!(p(&foreign), Propagation::Orphan);
        // No pod, no finalizer: only our mark for this very set tells.
        let mut bare = deleting(&[ours], 0..0);
        assert_eq!(p(&bare), Propagation::Unproven);
        bare.set.deletion_mark = Some(mark_value(Propagation::Background, "uid-web"));
        assert_eq!(p(&bare), Propagation::Background);
        bare.set.deletion_mark = Some(mark_value(Propagation::Foreground, "uid-web"));
        assert_eq!(p(&bare), Propagation::Foreground);
        for copied in [
            "Background/uid-old",
            "Background/",
            "Background",
            "Orphan/uid-web",
            "",
        ] {
            bare.set.deletion_mark = Some(copied.into());
            assert_eq!(p(&bare), Propagation::Unproven, "{copied:?}");
        }
        // A pod of the set outranks the mark.
        bare.ordinals.entry(0).or_default().pod = Some(stateful(0));
        bare.set.deletion_mark = Some(mark_value(Propagation::Foreground, "uid-web"));
        assert_eq!(p(&bare), Propagation::Background);
    }

    #[test]
    fn marked_once_while_the_evidence_lasts() {
        let ours = naming::FINALIZER;
        let mut bg = deleting(&[ours], 0..3);
        assert_eq!(
            to_mark(&bg, propagation(&bg)),
            Some(Propagation::Background)
        );
        bg.set.deletion_mark = Some(mark_value(Propagation::Background, "uid-web"));
        assert_eq!(to_mark(&bg, propagation(&bg)), None);
        let fg = deleting(&["foregroundDeletion", ours], 0..3);
        assert_eq!(
            to_mark(&fg, propagation(&fg)),
            Some(Propagation::Foreground)
        );
        let orphan = deleting(&["orphan", ours], 0..3);
        assert_eq!(to_mark(&orphan, propagation(&orphan)), None);
        let not_ours = deleting(&["foregroundDeletion"], 0..3);
        assert_eq!(to_mark(&not_ours, propagation(&not_ours)), None);
    }
}
