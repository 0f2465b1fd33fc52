//! Claims bound to a plain pod's life (opt-in with `--pod-bound-claims`): a claim annotated
//! `statefulsets.kubernetes.io/bound-to-pod: <pod>` gets an ownerReference to that pod's UID, and
//! one to every other pod that mounts it, so the garbage collector deletes it once all of them are
//! gone, also while this controller is down. A claim whose pod went before it was bound is deleted
//! after `--pod-bound-grace`, unless a pod mounts it. Never for StatefulSet pods or claims (the
//! scale-down controller's).
//!
//! Same shape as the other controllers: watch (the shared caches of `crate::caches`: claims,
//! pods, StatefulSets; a pod change wakes the claims it mounts at once) → observe (from the caches)
//! → decide (pure) → confirm (before a write, a fresh read of what the write relies on, and decide
//! again: see `reconcile`) → act.

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;
pub mod watch;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

use crate::caches::{Caches, Claim};
use crate::cli::Args;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::pass;
use crate::resuming::WatchBackoff;
use reconcile::{Context, error_policy, reconcile};

/// The pod-bound claims' pass context: the caches it reads (`claims`: the same claims as the
/// shared index, in the kube store its Controller reads from) and its writer.
pub fn context(
    args: &Args,
    client: &Client,
    (caches, claims): (&Caches, Store<Claim>),
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<Context> {
    let (reporter, runner) =
        pass::from_args(crate::naming::Controller::PodBound, args, client, metrics);
    let actor = act::Actor::new(client.clone(), reporter, leadership.clone());
    Arc::new(Context::new(
        client.clone(),
        (caches.clone(), claims),
        actor,
        args.pod_bound_grace,
        leadership.clone(),
        runner,
    ))
}

/// kube's Controller over the opted-in claims of the shared caches, woken also by the pods that
/// mount them, as one future that ends after `stop` once the running passes have.
pub fn controller(
    caches: &Caches,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let store = ctx.claims.clone();
    let cached = store.clone();
    let opted_in = watch::opted_in(caches);
    let passes = Controller::for_shared_stream(opted_in, store)
        .trigger_backoff(WatchBackoff::default())
        .watches_shared_stream(caches.pod_changes(), move |pod| {
            watch::claims_to_wake(&pod, &cached)
        });
    let passes = pass::run_controller(
        passes,
        crate::naming::Controller::PodBound,
        (reconcile, error_policy),
        ctx.clone(),
        became_leader,
        stop,
    );
    // What the passes remember of a claim goes with it.
    let forget = caches.claim_deletes().for_each(move |claim| {
        ctx.runner.gone(&claim);
        std::future::ready(())
    });
    async move {
        tokio::select! {
            _ = passes => {}
            _ = forget => {}
        }
    }
}
