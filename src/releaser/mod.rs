//! The PV pool releaser (opt-in with `--pv-releaser-id ID`): a PersistentVolume whose StorageClass
//! carries `reclaimable-pv-releaser.kubernetes.io/controller-id: ID` (plumber-cd's annotation), whose
//! reclaim policy is Retain and which is `Released` because its claim is really gone, gets its
//! `spec.claimRef` removed, so it is `Available` again, with its data, for the next claim.
//!
//! Same shape as the scale-down controller: watch (PVs and StorageClasses) → observe → decide (pure)
//! → confirm (a live read of the claim) → act (the guarded writes of the plan) → report. This file
//! wires them: the pass context and the Controller.

pub mod act;
pub mod decide;
pub mod gauges;
pub mod observe;
pub mod reconcile;
pub mod scrub;
pub mod watch;

use std::sync::Arc;

use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::pass;
use crate::resuming::WatchBackoff;
use gauges::Pool;
use reconcile::{Context, error_policy, reconcile};
use watch::Watches;

/// The PV releaser's pass context: its writer, the StorageClass cache and the scrub pods.
pub fn context(
    args: &Args,
    client: &Client,
    pool: &Pool,
    (scrub_pods, scrub_ns): (Store<Pod>, Option<String>),
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<Context> {
    let (reporter, runner) =
        pass::from_args(crate::naming::Controller::Releaser, args, client, metrics);
    let actor = act::Actor::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    Arc::new(Context::new(
        client.clone(),
        pool.classes.clone(),
        scrub_pods,
        scrub_ns,
        pool.id.clone(),
        actor,
        leadership.clone(),
        runner,
    ))
}

/// kube's Controller over PVs, woken also by a change of their StorageClass, as one future that
/// ends after `stop` once the running passes have.
pub fn controller(
    watches: Watches,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let Watches {
        pvs,
        pv_changes,
        class_changes,
        scrub_changes,
        ..
    } = watches;
    let cached = pvs.clone();
    let passes = Controller::for_stream(pv_changes, pvs)
        .trigger_backoff(WatchBackoff::default())
        // A class change is rare; it wakes the PVs of that class (a scan of the PV cache).
        .watches_stream(class_changes, move |class: StorageClass| {
            watch::pvs_of_class(&class, &cached)
        })
        // A scrub pod names its PV in an annotation (PV names may be longer than a label value).
        .watches_stream(scrub_changes, |pod: Pod| watch::pv_of_scrub_pod(&pod));
    pass::run_controller(
        passes,
        crate::naming::Controller::Releaser,
        (reconcile, error_policy),
        ctx,
        became_leader,
        stop,
    )
}
