//! Claims bound to a plain pod's life (opt-in with `--pod-bound-claims`): a claim annotated
//! `statefulsets.kubernetes.io/bound-to-pod: <pod>` gets an ownerReference to that pod's UID, and
//! one to every other pod that mounts it, so the garbage collector deletes it once all of them are
//! gone, also while this controller is down. A claim whose pod went before it was bound is deleted
//! after `--pod-bound-grace`, unless a pod mounts it. Never for StatefulSet pods or claims (the
//! scale-down controller's).
//!
//! Same shape as the other controllers: watch (claims, metadata only; pods, to see a new pod
//! mount a claim at once) → observe → decide (pure) → confirm (a live list of the namespace's pods
//! and StatefulSets) → act.

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::resuming::{WatchBackoff, resuming};
use observe::{BOUND_TO_POD_ANNOTATION, claims_of};
use reconcile::{Context, error_policy, reconcile};

type Claim = PartialObjectMeta<PersistentVolumeClaim>;

/// Lists (at start and after a watch is restored) are read in pages of this many objects, as the
/// scale-down controller's.
const LIST_PAGE_SIZE: u32 = 100;

/// kube's Controller over the claims of `namespace` (or all), as one future that ends after `stop`
/// once the running passes have.
pub fn controller(
    client: &Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let api: Api<Claim> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pod_api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store::<Claim>();
    let cached = store.clone();
    let claims = resuming("bound claims", move || {
        watcher(
            api.clone(),
            watcher::Config::default().page_size(LIST_PAGE_SIZE),
        )
        .modify(|c| {
            c.metadata.managed_fields = None;
        })
    });
    let changes = reflector::reflector(writer, claims).applied_objects();
    // Pods are not cached: each change is mapped to the claims it should wake and dropped.
    let pods = resuming("pods mounting bound claims", move || {
        watcher(
            pod_api.clone(),
            watcher::Config::default().page_size(LIST_PAGE_SIZE),
        )
    })
    .touched_objects();
    Controller::for_stream(changes, store)
        .trigger_backoff(WatchBackoff::default())
        .watches_stream(pods, move |pod: Pod| claims_to_wake(&pod, &cached))
        .reconcile_all_on(became_leader)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((claim, _)) => debug!(claim = %claim.name, "pod-bound claim looked at"),
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(claim)) => {
                    debug!(claim = %claim.name, "gone before its pass")
                }
                Err(e) => warn!(error = %e, "claim watch or queue error"),
            }
        })
}

/// The opted-in claims, not being deleted, that `pod` mounts without being one of their owners:
/// a pass over each adds it as an owner (or, for a claim not bound yet, looks at it again).
fn claims_to_wake(pod: &Pod, claims: &Store<Claim>) -> Vec<ObjectRef<Claim>> {
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
