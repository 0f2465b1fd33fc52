//! What this process deleted that its caches may not show yet (client-go's controller
//! expectations, for deletes). A claim deleted when its cleanup succeeded can still be in the claim
//! cache when the next pass runs (the watch event is on its way); decided on that cache, the pass
//! would take the claim for a live one and create a new cleanup pod for an ordinal that was just
//! finished. Until the caches have seen a delete of ours, the object is shown to observe as being
//! deleted, which is what it is.
//!
//! An entry is forgotten once the cache shows the object gone, replaced (another UID) or being
//! deleted, and at the latest after [`EXPECTATION_TTL`] (client-go's `ExpectationsTimeout`), so the
//! memory holds at most the deletes of the last few minutes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::caches::Claim;
use crate::scaledown::act::{Gone, GoneKind};
use crate::scaledown::watch::Slice;

/// How long a delete is expected to reach the caches at the most.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(300);

type Key = (String, GoneKind, String);

/// Deletes of ours the caches have not shown yet: (namespace, kind, name) -> (UID, when).
#[derive(Debug, Default)]
pub struct Expectations {
    gone: HashMap<Key, (String, Instant)>,
}

/// What a cache shows of one object: its UID and whether it is being deleted.
pub struct Shown {
    pub uid: String,
    pub deleting: bool,
}

impl Expectations {
    /// Records the deletes of one pass in `ns`.
    pub fn deleted(&mut self, ns: &str, gone: &[Gone], now: Instant) {
        for g in gone {
            let key = (ns.to_string(), g.kind, g.name.clone());
            self.gone.insert(key, (g.uid.clone(), now));
        }
    }

    /// Forgets the deletes the caches show by now (`shows`: what the cache holds under that
    /// kind, namespace and name) and those older than [`EXPECTATION_TTL`].
    pub fn forget_seen(
        &mut self,
        now: Instant,
        shows: impl Fn(GoneKind, &str, &str) -> Option<Shown>,
    ) {
        self.gone.retain(|(ns, kind, name), (uid, at)| {
            let pending = match shows(*kind, ns, name) {
                Some(shown) => shown.uid == *uid && !shown.deleting,
                None => false,
            };
            pending && now.saturating_duration_since(*at) < EXPECTATION_TTL
        });
    }

    /// Whether the object of this kind, namespace, name and UID was deleted by us and the cache
    /// has not shown it yet.
    pub fn expects_gone(&self, kind: GoneKind, ns: &str, name: &str, uid: &str) -> bool {
        self.gone
            .get(&(ns.to_string(), kind, name.to_string()))
            .is_some_and(|(u, _)| u == uid)
    }

    pub fn len(&self) -> usize {
        self.gone.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gone.is_empty()
    }

    /// `slice` (of namespace `ns`) with every object we deleted and the cache still shows as
    /// alive marked as being deleted, as of `now`.
    pub fn mask(&self, ns: &str, slice: &mut Slice, now: Timestamp) {
        if self.gone.keys().all(|(n, _, _)| n != ns) {
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

    #[test]
    fn an_expectation_ends_when_the_cache_shows_the_delete_or_after_the_ttl() {
        let start = Instant::now();
        let mut e = Expectations::default();
        let gone = [
            gone_claim("still-cached", "a"),
            gone_claim("deleting", "b"),
            gone_claim("absent", "c"),
            gone_claim("replaced", "d"),
        ];
        e.deleted("ns", &gone, start);
        let cache = |_: GoneKind, _: &str, name: &str| match name {
            "still-cached" => Some(Shown {
                uid: "a".into(),
                deleting: false,
            }),
            "deleting" => Some(Shown {
                uid: "b".into(),
                deleting: true,
            }),
            "replaced" => Some(Shown {
                uid: "new".into(),
                deleting: false,
            }),
            _ => None,
        };
        e.forget_seen(start, cache);
        assert_eq!(
            e.len(),
            1,
            "only the claim the cache still shows alive is expected"
        );
        assert!(e.expects_gone(GoneKind::Claim, "ns", "still-cached", "a"));
        e.forget_seen(start + EXPECTATION_TTL, cache);
        assert!(e.is_empty(), "forgotten after the TTL");
    }
}
