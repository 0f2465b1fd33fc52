//! Whose claim a claim is: proven by its owners and labels, never by its name alone.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;

use super::facts::SetFacts;

/// Whether a claim whose name fits `set` is proven `set`'s, and if not, why (docs/usage.md,
/// *Whose claim it is*). A name proves nothing on its own: the StatefulSet controller puts the set's
/// `selector.matchLabels` on every claim it creates, so a claim is `set`'s when
/// - no ownerReference names another object than `set`, and
/// - no other set of the namespace still wants the ordinal its name gives for that set, and
/// - it carries `set`'s matchLabels and no other set that could own it by name has its matchLabels
///   on it too, or it carries no labels at all (made by hand) and no other set could own it by
///   name. Labels that are not `set`'s prove it another set's, even of a set deleted since.
///
/// `others` are the other sets of the namespace that could own the claim by name or whose
/// matchLabels it carries (`scaledown::watch::Stores::slice` gathers them).
pub fn claim_ownership(
    claim: &PartialObjectMeta<PersistentVolumeClaim>,
    set: &SetFacts,
    others: &[SetFacts],
) -> Option<String> {
    let name = claim.name_any();
    if let Some(owner) = claim.owner_references().iter().find(|o| o.uid != set.uid) {
        return Some(format!("it is owned by {} {}", owner.kind, owner.name));
    }
    let by_name: Vec<&SetFacts> = others
        .iter()
        .filter(|o| o.name != set.name && o.makes_claim(&name))
        .collect();
    if let Some(other) = by_name
        .iter()
        .find(|o| o.claim_ordinal(&name).is_some_and(|n| o.wants(n)))
    {
        return Some(format!(
            "it is also a claim of StatefulSet {}, which still uses that ordinal",
            other.name
        ));
    }
    let labels = claim.labels();
    let carries = |s: &SetFacts| {
        !s.match_labels.is_empty()
            && s.match_labels
                .iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
    };
    if carries(set) {
        return by_name.iter().find(|o| carries(o)).map(|o| {
            format!(
                "it carries the selector labels of this set and of StatefulSet {}, whose claims have the same name",
                o.name
            )
        });
    }
    if let Some(other) = others.iter().find(|o| o.name != set.name && carries(o)) {
        return Some(format!(
            "it carries the selector labels of StatefulSet {}, not this set's",
            other.name
        ));
    }
    // Every claim a StatefulSet made carries that set's labels; one deleted since is no longer
    // among `others`, so labels that are not this set's prove the claim someone else's.
    if !labels.is_empty() {
        return Some(format!(
            "it carries labels ({}) but not this set's selector labels ({}): another StatefulSet's claim, maybe of one deleted since (add this set's labels to it if it is this set's)",
            pairs(labels.iter()),
            pairs(set.match_labels.iter())
        ));
    }
    by_name.first().map(|o| {
        format!(
            "StatefulSet {} makes a claim of the same name and the claim carries neither set's selector labels",
            o.name
        )
    })
}

/// `k=v` pairs, comma separated.
fn pairs<'a>(labels: impl Iterator<Item = (&'a String, &'a String)>) -> String {
    labels
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
