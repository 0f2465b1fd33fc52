//! The scale-down controller: when an opted-in StatefulSet scales down, run its cleanup pod on the
//! orphaned claims and delete them once it succeeded. One pass over one set, in one direction:
//!
//! ```text
//! watch (caches, indexed per set) → observe (facts) → decide (pure plan) → confirm (live read)
//!   → act (the only writes) → settle (new cleanup pods: record and release, or delete)
//! ```

pub mod act;
pub mod decide;
pub mod expect;
pub mod gauges;
pub mod live;
pub mod memory;
pub mod observe;
pub mod reconcile;
pub mod room;
pub mod watch;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Client;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use crate::caches::Caches;
use crate::cli::Args;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::pass;
use crate::resuming::WatchBackoff;
use act::Actor;
use reconcile::{Context, error_policy, reconcile};
use watch::{Stores, Watches};

/// What every pass shares: client, caches, policy, the writer and the per-set memory.
pub fn context(
    args: &Args,
    client: &Client,
    stores: Stores,
    metrics: &Arc<Metrics>,
    leadership: &Arc<Leadership>,
) -> Arc<Context> {
    let (reporter, runner) =
        pass::from_args(crate::naming::Controller::Scaledown, args, client, metrics);
    // The runner bounds the passes, so that one waiting for a shared list of its namespace does
    // not hold a slot (see `controller`); 0 leaves them unbounded, as it did kube's Controller.
    let runner = match args.concurrency {
        0 => runner,
        slots => runner.with_slots(slots),
    };
    let actor = Actor::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    Arc::new(Context::new(
        client.clone(),
        stores,
        args.policy(),
        actor,
        leadership.clone(),
        args.resync_period,
        runner,
    ))
}

/// kube's Controller over the StatefulSets, woken by changes of their claims, pods and cleanup
/// pods, as one future; after `stop` it takes no new work and ends once the running passes have.
pub fn controller(
    watches: Watches,
    caches: &Caches,
    ctx: Arc<Context>,
    became_leader: impl Stream<Item = ()> + Send + 'static,
    stop: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let Watches {
        stores,
        cleanup_pods,
    } = watches;
    let cached_sets = stores.sets.clone();
    let sets_of_pods = stores.sets.clone();
    // Every mapper tells the runner what it woke, which times the wait for a slot.
    let (woke_set, woke_claim, woke_pod, waking) =
        (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());
    let set_changes = caches
        .set_changes()
        .inspect(move |set| woke_set.runner.woke([&ObjectRef::from_obj(set.as_ref())]));
    let passes = Controller::for_shared_stream(set_changes, stores.sets)
        // Every due pass starts at once; the runner's slots (`--concurrency`, handed out in
        // order) bound the passes doing work, and a pass parked on a shared namespace list gives
        // its slot back: 500 cleanups ending together share a few lists instead of queueing 32 at
        // a time behind one list each (issue 25).
        .with_config(controller::Config::default().concurrency(0))
        // The watches never yield errors; should one ever reach the Controller, retry soon.
        .trigger_backoff(WatchBackoff::default())
        .watches_shared_stream(caches.claim_changes(true), move |claim| {
            let sets = watch::sets_of_claim(claim.as_ref(), &cached_sets);
            woke_claim.runner.woke(&sets);
            sets
        })
        .watches_shared_stream(caches.pod_changes(), move |pod| {
            let sets = watch::sets_of_pod(pod.as_ref(), &sets_of_pods);
            woke_pod.runner.woke(&sets);
            sets
        })
        // A cleanup pod's change may free room under the cap: it also wakes sets waiting for it.
        .watches_stream(cleanup_pods, move |pod| {
            let mut sets: Vec<_> = watch::set_of_pod(&pod).into_iter().collect();
            sets.extend(waking.wake_for_room());
            waking.runner.woke(&sets);
            sets
        });
    // A new leader looks at every set at once instead of waiting for the resync.
    pass::run_controller(
        passes,
        crate::naming::Controller::Scaledown,
        (reconcile, error_policy),
        ctx,
        became_leader,
        stop,
    )
}
