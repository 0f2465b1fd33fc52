//! Claims bound to a plain pod's life (opt-in with `--pod-bound-claims`): a claim annotated
//! `statefulsets.kubernetes.io/bound-to-pod: <pod>` gets an ownerReference to that pod's UID, so the
//! garbage collector deletes it when the pod is gone, also while this controller is down. A claim
//! whose pod went before it was bound is deleted after `--pod-bound-grace`, unless another pod
//! mounts it. Never for StatefulSet pods or claims (the scale-down controller's).
//!
//! Same shape as the other controllers: watch (claims, metadata only) → observe → decide (pure)
//! → confirm (a live list of the namespace's pods) → act.

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::restarting::{WatchBackoff, restarting};
use reconcile::{Context, error_policy, reconcile};

/// kube's Controller over the claims of `namespace` (or all), as one future that ends after `stop`
/// once the running passes have.
pub fn controller(
    client: &Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let api: Api<PartialObjectMeta<PersistentVolumeClaim>> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store::<PartialObjectMeta<PersistentVolumeClaim>>();
    let claims = restarting("bound claims", move || {
        watcher(api.clone(), watcher::Config::default()).modify(|c| {
            c.metadata.managed_fields = None;
        })
    });
    let changes = reflector::reflector(writer, claims).applied_objects();
    Controller::for_stream(changes, store)
        .trigger_backoff(WatchBackoff::default())
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
