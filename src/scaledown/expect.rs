//! What this process deleted that its caches may not show yet (client-go's controller
//! expectations, for deletes). A claim deleted when its cleanup succeeded can still be in the claim
//! cache when the next pass runs (the watch event is on its way); decided on that cache, the pass
//! would take the claim for a live one and create a new cleanup pod for an ordinal that was just
//! finished. Until the caches have seen a delete of ours, the object is shown to observe as being
//! deleted, which is what it is.
//!
//! A delete is remembered for [`EXPECTATION_TTL`] (client-go's `ExpectationsTimeout`), however
//! soon the cache shows it: a UID we deleted never comes back alive, so masking it can never hide
//! a real object, while a cache can show it alive again after it showed it gone (a relist served
//! by an API server whose watch cache lags, or a resumed watch replaying older events). The memory
//! holds the deletes of the last few minutes, per namespace.
//!
//! The same holds for the next-attempt marks we write on claims. A failed cleanup is retried by
//! marking its claims with the next attempt and then deleting the pod; when the pod watch shows the
//! delete before the claim watch shows the mark (each resource has its own watch, and they lag
//! differently), a pass decided on the caches would read no mark and start attempt 1 again, and
//! a cleanup that always fails would never reach its retry limit. Until the claim cache shows a
//! mark of ours (or the claim gone, replaced or being deleted), the claim is shown to observe with
//! the mark we wrote.
//!
//! And for our finalizer: a set gets it in its first pass, often with its status annotations in
//! the same patch, and a pass that runs before the set watch shows that write (at start, 1,000
//! sets and their pods wake a pass each within seconds) would send the finalizer again, or the
//! status guarded by a test of the old value, which the API server refuses. Until the set cache
//! shows the finalizer (or the set replaced, or [`EXPECTATION_TTL`] is over), a pass sees the set
//! with the finalizer and the status annotations we wrote.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::caches::Claim;
use crate::naming::{FINALIZER, NEXT_ATTEMPT_ANNOTATION};
use crate::scaledown::watch::Slice;

/// An object a delete of ours removed (or found gone), by kind, name and UID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gone {
    /// Claim or pod.
    pub kind: GoneKind,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// The kinds of object a delete of ours removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GoneKind {
    /// A claim.
    Claim,
    /// A pod (cleanup or stateful).
    Pod,
}

impl Gone {
    pub(crate) fn claim(name: &str, uid: &str) -> Gone {
        Gone {
            kind: GoneKind::Claim,
            name: name.into(),
            uid: uid.into(),
        }
    }

    pub(crate) fn pod(name: &str, uid: &str) -> Gone {
        Gone {
            kind: GoneKind::Pod,
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// How long a delete is expected to reach the caches at the most.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(300);

/// The deletes of one namespace: (kind, name) -> (UID, when).
type GoneIn = HashMap<(GoneKind, String), (String, Instant)>;

/// Deletes and marks of ours the caches have not shown yet.
#[derive(Debug, Default)]
pub struct Expectations {
    /// namespace -> its deletes.
    gone: HashMap<String, GoneIn>,
    /// (namespace, claim) -> the mark we wrote.
    marks: HashMap<(String, String), Marked>,
    /// (namespace, set) -> the finalizer we added to it.
    finalized: HashMap<(String, String), Finalized>,
}

/// Our finalizer added to a set: its UID, the status annotations written with it (`None`:
/// removed), and when.
#[derive(Debug)]
struct Finalized {
    uid: String,
    annotations: BTreeMap<String, Option<String>>,
    at: Instant,
}

/// A next-attempt mark this process wrote on a claim (`attempt: None`: the mark removed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The claim's name.
    pub claim: String,
    /// The claim's UID.
    pub uid: String,
    /// The attempt written (`None`: the mark removed).
    pub attempt: Option<u32>,
}

#[derive(Debug)]
struct Marked {
    uid: String,
    attempt: Option<u32>,
    at: Instant,
}

/// What a cache shows of one object: its UID, whether it is being deleted, and (claims) its
/// next-attempt mark as written.
pub struct Shown {
    /// Its UID.
    pub uid: String,
    /// It is being deleted.
    pub deleting: bool,
    /// Its next-attempt mark, raw (claims only).
    pub mark: Option<String>,
}

impl Expectations {
    /// Records the deletes of one pass in `ns`.
    pub fn deleted(&mut self, ns: &str, gone: &[Gone], now: Instant) {
        if gone.is_empty() {
            return;
        }
        let of_ns = self.gone.entry(ns.to_string()).or_default();
        for g in gone {
            of_ns.insert((g.kind, g.name.clone()), (g.uid.clone(), now));
        }
    }

    /// Records the next-attempt marks one pass in `ns` wrote.
    pub fn marked(&mut self, ns: &str, marks: &[Mark], now: Instant) {
        for m in marks {
            let key = (ns.to_string(), m.claim.clone());
            let marked = Marked {
                uid: m.uid.clone(),
                attempt: m.attempt,
                at: now,
            };
            self.marks.insert(key, marked);
        }
    }

    /// Records that this process added its finalizer to the set `name` (UID `uid`) of `ns`, with
    /// `annotations` in the same patch.
    pub fn finalizer_added(
        &mut self,
        (ns, name, uid): (&str, &str, &str),
        annotations: BTreeMap<String, Option<String>>,
        now: Instant,
    ) {
        let key = (ns.to_string(), name.to_string());
        let added = Finalized {
            uid: uid.to_string(),
            annotations,
            at: now,
        };
        self.finalized.insert(key, added);
    }

    /// `set` as the cache holds it, or a copy with our finalizer and the annotations written with
    /// it when this process added it and the cache does not show it yet. An add the cache shows
    /// (or whose set was replaced, or that is older than [`EXPECTATION_TTL`]) is forgotten: a
    /// later removal by anyone is seen.
    pub fn with_finalizer(&mut self, set: Arc<StatefulSet>, now: Instant) -> Arc<StatefulSet> {
        let meta = set.meta();
        let key = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let Some(added) = self.finalized.get(&key) else {
            return set;
        };
        let shown = meta.finalizers.iter().flatten().any(|f| f == FINALIZER);
        let pending = !shown
            && meta.uid.as_deref() == Some(added.uid.as_str())
            && now.saturating_duration_since(added.at) < EXPECTATION_TTL;
        if !pending {
            self.finalized.remove(&key);
            return set;
        }
        let mut copy = StatefulSet::clone(&set);
        let meta = copy.meta_mut();
        meta.finalizers
            .get_or_insert_with(Vec::new)
            .push(FINALIZER.to_string());
        let annotations = meta.annotations.get_or_insert_with(Default::default);
        for (key, value) in &added.annotations {
            match value {
                Some(v) => annotations.insert(key.clone(), v.clone()),
                None => annotations.remove(key),
            };
        }
        Arc::new(copy)
    }

    /// Forgets the deletes older than [`EXPECTATION_TTL`], and the marks the claim cache shows by
    /// now (`shows`: what the cache holds under that kind, namespace and name) or that are older.
    pub fn forget_seen(
        &mut self,
        now: Instant,
        shows: impl Fn(GoneKind, &str, &str) -> Option<Shown>,
    ) {
        let young = |at: &Instant| now.saturating_duration_since(*at) < EXPECTATION_TTL;
        self.gone.retain(|_, of_ns| {
            of_ns.retain(|_, (_, at)| young(at));
            !of_ns.is_empty()
        });
        self.finalized.retain(|_, added| young(&added.at));
        self.marks.retain(|(ns, claim), m| {
            let pending = match shows(GoneKind::Claim, ns, claim) {
                Some(shown) => {
                    shown.uid == m.uid
                        && !shown.deleting
                        && shown.mark != m.attempt.map(|a| a.to_string())
                }
                None => false,
            };
            pending && young(&m.at)
        });
    }

    /// Whether the object of this kind, namespace, name and UID was deleted by us and the cache
    /// has not shown it yet.
    pub fn expects_gone(&self, kind: GoneKind, ns: &str, name: &str, uid: &str) -> bool {
        self.gone
            .get(ns)
            .and_then(|of_ns| of_ns.get(&(kind, name.to_string())))
            .is_some_and(|(u, _)| u == uid)
    }

    /// The mark we wrote on this claim (namespace, name, UID) that the cache has not shown yet.
    fn pending_mark(&self, ns: &str, claim: &str, uid: &str) -> Option<Option<u32>> {
        self.marks
            .get(&(ns.to_string(), claim.to_string()))
            .filter(|m| m.uid == uid)
            .map(|m| m.attempt)
    }

    /// How many deletes, marks and finalizer adds are expected.
    pub fn len(&self) -> usize {
        self.gone.values().map(HashMap::len).sum::<usize>()
            + self.marks.len()
            + self.finalized.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.gone.is_empty() && self.marks.is_empty() && self.finalized.is_empty()
    }

    /// `slice` (of namespace `ns`) with every object we deleted and the cache still shows as
    /// alive marked as being deleted, as of `now`, and every claim carrying the next-attempt mark
    /// we wrote last.
    pub fn mask(&self, ns: &str, slice: &mut Slice, now: Timestamp) {
        if self.marks.keys().any(|(n, _)| n == ns) {
            self.mask_marks(ns, &mut slice.claims);
        }
        if !self.gone.contains_key(ns) {
            return;
        }
        mask_all(
            &mut slice.claims,
            |c| self.masks(GoneKind::Claim, ns, c),
            now,
        );
        mask_all(&mut slice.pods, |p| self.masks(GoneKind::Pod, ns, p), now);
        mask_all(
            &mut slice.cleanup_pods,
            |p| self.masks(GoneKind::Pod, ns, p),
            now,
        );
    }

    /// Copies of the claims whose mark of ours the cache does not show yet, with that mark.
    fn mask_marks(&self, ns: &str, claims: &mut [Arc<Claim>]) {
        for claim in claims.iter_mut() {
            let meta = claim.meta();
            let name = meta.name.as_deref().unwrap_or_default();
            let uid = meta.uid.as_deref().unwrap_or_default();
            let Some(attempt) = self.pending_mark(ns, name, uid) else {
                continue;
            };
            let mut copy = Claim::clone(claim);
            let annotations = copy
                .meta_mut()
                .annotations
                .get_or_insert_with(Default::default);
            match attempt {
                Some(a) => annotations.insert(NEXT_ATTEMPT_ANNOTATION.to_string(), a.to_string()),
                None => annotations.remove(NEXT_ATTEMPT_ANNOTATION),
            };
            *claim = Arc::new(copy);
        }
    }

    fn masks<K: Resource>(&self, kind: GoneKind, ns: &str, obj: &K) -> bool {
        let meta = obj.meta();
        meta.deletion_timestamp.is_none()
            && self.expects_gone(
                kind,
                ns,
                meta.name.as_deref().unwrap_or_default(),
                meta.uid.as_deref().unwrap_or_default(),
            )
    }
}

/// Marks the objects `masked` picks as being deleted (copies: the caches' objects are shared).
fn mask_all<K: Resource + Clone>(
    objects: &mut [Arc<K>],
    masked: impl Fn(&K) -> bool,
    now: Timestamp,
) {
    for obj in objects.iter_mut().filter(|o| masked(o)) {
        let mut copy = K::clone(obj);
        copy.meta_mut().deletion_timestamp = Some(Time(now));
        *obj = Arc::new(copy);
    }
}

/// The claim cache's view of one claim, for [`Expectations::forget_seen`].
pub fn shown_claim(claim: Option<Arc<Claim>>) -> Option<Shown> {
    shown(claim.as_deref())
}

/// The pod caches' view of one pod, for [`Expectations::forget_seen`].
pub fn shown_pod(pod: Option<Arc<Pod>>) -> Option<Shown> {
    shown(pod.as_deref())
}

fn shown<K: Resource>(obj: Option<&K>) -> Option<Shown> {
    let meta = obj?.meta();
    Some(Shown {
        uid: meta.uid.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        mark: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(NEXT_ATTEMPT_ANNOTATION).cloned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn claim(name: &str, uid: &str) -> Arc<Claim> {
        Arc::new(Claim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn gone_claim(name: &str, uid: &str) -> Gone {
        Gone {
            kind: GoneKind::Claim,
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// The race of issue 23: the claim of a finished cleanup is deleted, and the next pass's claim
    /// cache still holds it. Masked, it reads as being deleted, so no cleanup starts on it; a newer
    /// claim of the same name (another UID) is not masked.
    #[test]
    fn a_claim_we_deleted_reads_as_deleting_until_the_cache_shows_it() {
        let start = Instant::now();
        let mut e = Expectations::default();
        e.deleted("ns", &[gone_claim("data-web-2", "u2")], start);
        let mut slice = Slice {
            claims: vec![claim("data-web-2", "u2"), claim("data-web-3", "u3")],
            ..Slice::default()
        };
        e.mask("ns", &mut slice, Timestamp::now());
        assert!(slice.claims[0].metadata.deletion_timestamp.is_some());
        assert!(slice.claims[1].metadata.deletion_timestamp.is_none());

        let mut newer = Slice {
            claims: vec![claim("data-web-2", "u2-new")],
            ..Slice::default()
        };
        e.mask("ns", &mut newer, Timestamp::now());
        assert!(newer.claims[0].metadata.deletion_timestamp.is_none());

        let mut other_ns = Slice {
            claims: vec![claim("data-web-2", "u2")],
            ..Slice::default()
        };
        e.mask("other", &mut other_ns, Timestamp::now());
        assert!(other_ns.claims[0].metadata.deletion_timestamp.is_none());
    }

    /// A cache that showed our delete can show the object alive again (a relist served by a
    /// lagging API server): the delete is remembered for the TTL whatever the cache showed, so the
    /// claim still reads as being deleted; after the TTL it is forgotten.
    #[test]
    fn a_delete_is_remembered_for_the_ttl_even_after_the_cache_showed_it() {
        let start = Instant::now();
        let mut e = Expectations::default();
        e.deleted("ns", &[gone_claim("data-web-2", "u2")], start);
        let nothing = |_: GoneKind, _: &str, _: &str| None;
        e.forget_seen(start + Duration::from_secs(1), nothing);
        let mut resurrected = Slice {
            claims: vec![claim("data-web-2", "u2")],
            ..Slice::default()
        };
        e.mask("ns", &mut resurrected, Timestamp::now());
        assert!(
            resurrected.claims[0].metadata.deletion_timestamp.is_some(),
            "a claim we deleted, shown alive again after the cache showed it gone"
        );
        e.forget_seen(start + EXPECTATION_TTL, nothing);
        assert!(e.is_empty(), "forgotten after the TTL");
        assert!(e.gone.is_empty(), "no empty namespace left behind");
    }

    fn mark(claim: &str, uid: &str, attempt: Option<u32>) -> Mark {
        Mark {
            claim: claim.into(),
            uid: uid.into(),
            attempt,
        }
    }

    fn marked_claim(name: &str, uid: &str, mark: Option<&str>) -> Arc<Claim> {
        let mut c = Claim::clone(&claim(name, uid));
        if let Some(m) = mark {
            c.metadata.annotations = Some([(NEXT_ATTEMPT_ANNOTATION.to_string(), m.into())].into());
        }
        Arc::new(c)
    }

    fn mark_of(c: &Claim) -> Option<&str> {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NEXT_ATTEMPT_ANNOTATION))
            .map(String::as_str)
    }

    /// The repeated attempt 1 that `make chaos` found: the mark for attempt 2 is written, the
    /// failed pod deleted, and the claim cache still holds the claim without the mark. Masked, the
    /// claim carries the mark we wrote (and a removal of ours reads as removed); another UID of
    /// the same name is left as the cache shows it.
    #[test]
    fn a_claim_we_marked_carries_our_mark_until_the_cache_shows_it() {
        let mut e = Expectations::default();
        let now = Instant::now();
        e.marked(
            "ns",
            &[
                mark("data-web-2", "u2", Some(2)),
                mark("data-web-3", "u3", None),
            ],
            now,
        );
        let mut slice = Slice {
            claims: vec![
                marked_claim("data-web-2", "u2", None),
                marked_claim("data-web-3", "u3", Some("4")),
                marked_claim("data-web-4", "u4", Some("2")),
            ],
            ..Slice::default()
        };
        e.mask("ns", &mut slice, Timestamp::now());
        let marks: Vec<_> = slice.claims.iter().map(|c| mark_of(c)).collect();
        assert_eq!(marks, [Some("2"), None, Some("2")]);

        let mut replaced = Slice {
            claims: vec![marked_claim("data-web-2", "u2-new", None)],
            ..Slice::default()
        };
        e.mask("ns", &mut replaced, Timestamp::now());
        assert_eq!(mark_of(&replaced.claims[0]), None);
    }

    #[test]
    fn a_mark_is_forgotten_once_the_cache_shows_it_or_the_claim_is_gone() {
        let now = Instant::now();
        let mut e = Expectations::default();
        e.marked(
            "ns",
            &[
                mark("lagging", "a", Some(3)),
                mark("seen", "b", Some(3)),
                mark("cleared", "c", None),
                mark("gone", "d", Some(2)),
                mark("deleting", "e", Some(2)),
            ],
            now,
        );
        let cache = |_: GoneKind, _: &str, name: &str| {
            let (uid, deleting, mark) = match name {
                "lagging" => ("a", false, Some("2")),
                "seen" => ("b", false, Some("3")),
                "cleared" => ("c", false, None),
                "deleting" => ("e", true, Some("1")),
                _ => return None,
            };
            Some(Shown {
                uid: uid.into(),
                deleting,
                mark: mark.map(String::from),
            })
        };
        e.forget_seen(now, cache);
        assert_eq!(e.len(), 1, "only the mark the cache does not show is kept");
        assert_eq!(e.pending_mark("ns", "lagging", "a"), Some(Some(3)));
        e.forget_seen(now + EXPECTATION_TTL, cache);
        assert!(e.is_empty(), "forgotten after the TTL");
    }

    fn set(uid: &str, finalizers: &[&str]) -> Arc<StatefulSet> {
        Arc::new(StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn finalized(set: &StatefulSet) -> bool {
        set.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    }

    #[test]
    fn a_set_we_added_our_finalizer_to_carries_it_until_the_cache_shows_it() {
        let mut e = Expectations::default();
        let now = Instant::now();
        let cached = set("uid-web", &["other"]);
        assert!(
            !finalized(&e.with_finalizer(cached.clone(), now)),
            "nothing added yet"
        );
        e.finalizer_added(("ns", "web", "uid-web"), BTreeMap::new(), now);
        let seen = e.with_finalizer(cached.clone(), now + Duration::from_secs(2));
        assert!(finalized(&seen), "the cache lags our add");
        assert_eq!(
            seen.metadata.finalizers.as_ref().map(Vec::len),
            Some(2),
            "others' kept"
        );
        assert!(!finalized(&cached), "the cache's copy is left alone");
        assert!(
            !finalized(&e.with_finalizer(set("uid-new", &[]), now)),
            "a set replaced under the name has no finalizer of ours"
        );
        assert!(e.is_empty(), "and the add is forgotten");
    }

    #[test]
    fn a_finalizer_add_is_forgotten_once_the_cache_shows_it_or_the_ttl_is_over() {
        let mut e = Expectations::default();
        let now = Instant::now();
        e.finalizer_added(("ns", "web", "uid-web"), BTreeMap::new(), now);
        e.with_finalizer(set("uid-web", &[FINALIZER]), now);
        assert!(e.is_empty(), "shown by the cache");
        let removed = e.with_finalizer(set("uid-web", &[]), now);
        assert!(
            !finalized(&removed),
            "a removal after the cache showed it is seen"
        );
        e.finalizer_added(("ns", "web", "uid-web"), BTreeMap::new(), now);
        let late = now + EXPECTATION_TTL;
        assert!(
            !finalized(&e.with_finalizer(set("uid-web", &[]), late)),
            "too old"
        );
        e.finalizer_added(("ns", "web", "uid-web"), BTreeMap::new(), now);
        e.forget_seen(late, |_, _, _| None);
        assert!(e.is_empty(), "old adds are pruned with the deletes");
    }
}
