//! WATCH: the pod-bound claims read the shared caches (`crate::caches`); this maps their changes to
//! the claims they concern: the opted-in claims' own changes, and a pod's change to the claims it
//! mounts.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::observe::claims_of;
use crate::caches::{Caches, Claim};
use crate::naming::BOUND_TO_POD_ANNOTATION;

/// The changes of the claims that opted in (annotation `bound-to-pod`), from the shared claim
/// watch.
pub fn opted_in(caches: &Caches) -> impl Stream<Item = Arc<Claim>> + Send + 'static {
    caches.claim_changes(false).filter(|claim| {
        std::future::ready(claim.annotations().contains_key(BOUND_TO_POD_ANNOTATION))
    })
}

/// The opted-in claims, not being deleted, that `pod` mounts without being one of their owners:
/// a pass over each adds it as an owner (or, for a claim not bound yet, looks at it again).
pub fn claims_to_wake(pod: &Pod, claims: &Store<Claim>) -> Vec<ObjectRef<Claim>> {
    let (Some(ns), Some(uid)) = (pod.namespace(), pod.uid()) else {
        return Vec::new();
    };
    claims_of(pod)
        .map(|name| ObjectRef::<Claim>::new(name).within(&ns))
        .filter(|r| {
            claims.get(r).is_some_and(|c| {
                c.annotations().contains_key(BOUND_TO_POD_ANNOTATION)
                    && c.metadata.deletion_timestamp.is_none()
                    && !c.owner_references().iter().any(|o| o.uid == uid)
            })
        })
        .collect()
}
