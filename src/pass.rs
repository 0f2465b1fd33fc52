//! The pass runner shared by the three controllers: what kube's Controller leaves to us around each
//! pass over one object. It keeps the count of running passes (shutdown waits for it), times every
//! pass into the reconcile metrics under the controller's label, backs a failing object off (capped,
//! doubling, per object, whatever wakes it meanwhile), logs each failure, and from the second
//! failure in a row reports a `ReconcileFailed` Warning through the controller's reporter.
//!
//! A controller's `reconcile` is `runner.run(&object, || ctx.pass(&object))`; its `error_policy` is
//! `runner.error_policy(&object)`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::error::{Category, Error, Result};
use crate::metrics::Metrics;
use crate::naming::Controller;
use crate::reason::Reason;
use crate::report::{Outcome, Reporter};

mod backoff;
mod running;
mod slots;
pub use backoff::Backoff;
use running::{Passes, Running};
use slots::Slot;
pub use slots::parked;

/// An object whose last passes failed.
#[derive(Clone, Copy, Debug)]
struct Failing {
    failures: u32,
    retry_at: Instant,
}

/// When an object was first woken by a watch event since its last pass started, and whether a
/// pass over it runs now.
#[derive(Clone, Copy, Debug, Default)]
struct Wake {
    due: Option<Instant>,
    running: bool,
}

/// The objects woken and not yet started, and those running; pruned of woken objects no pass
/// ever started (they went away) once the map doubles.
struct Wakes<K: Resource> {
    objects: HashMap<ObjectRef<K>, Wake>,
    prune_at: usize,
}

/// Entries kept before the first prune of [`Wakes`].
const WAKES_PRUNE_AT: usize = 1024;

/// A woken object whose pass has not started after this long went away (kube's Controller never
/// runs a pass over an object no longer in the store): its entry is dropped at the next prune.
const WAKE_STALE: Duration = Duration::from_secs(600);

/// The pass runner of one controller over objects of type `K`.
pub struct Runner<K: Resource> {
    controller: Controller,
    backoff: Backoff,
    metrics: Arc<Metrics>,
    reporter: Arc<Reporter>,
    /// Passes running now.
    running: Passes,
    /// Objects whose last pass failed; an entry goes with the next good pass, or once its wait is
    /// long over (the object may be gone), so the map holds failing objects only.
    failing: Mutex<HashMap<ObjectRef<K>, Failing>>,
    /// Objects woken by watch events (`woke`): how long a pass waited for a slot.
    wakes: Mutex<Wakes<K>>,
    /// The slots passes run in, if this runner bounds them (`with_slots`) rather than kube's
    /// Controller: a pass gives its slot back while it waits for a shared read ([`parked`]).
    slots: Option<Arc<Semaphore>>,
}

impl<K> Runner<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// A runner of `controller`'s passes that reports through `reporter`.
    pub fn new(
        controller: Controller,
        backoff: Backoff,
        metrics: Arc<Metrics>,
        reporter: Arc<Reporter>,
    ) -> Self {
        Runner {
            controller,
            backoff,
            metrics,
            reporter,
            running: Passes::default(),
            failing: Mutex::new(HashMap::new()),
            wakes: Mutex::new(Wakes {
                objects: HashMap::new(),
                prune_at: WAKES_PRUNE_AT,
            }),
            slots: None,
        }
    }

    /// This runner runs at most `slots` passes at once, handing them out in the order they were
    /// asked for; a pass waiting on a shared read ([`parked`]) gives its slot back meanwhile.
    /// kube's Controller then starts every due pass at once (`concurrency(0)`) and leaves the
    /// bound to the runner.
    pub fn with_slots(mut self, slots: u16) -> Self {
        self.slots = Some(Arc::new(Semaphore::new(usize::from(slots.max(1)))));
        self
    }

    /// The metrics the runner counts into.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// A watch event woke `objects` (the controller's mappers call this with what they return):
    /// their next pass counts the wait from the first such event, or from the end of the pass
    /// running now, to its start (`scaledown_pass_start_wait_seconds`).
    pub fn woke<'a>(&self, objects: impl IntoIterator<Item = &'a ObjectRef<K>>)
    where
        K: 'a,
    {
        let now = Instant::now();
        let mut wakes = self.lock_wakes();
        for key in objects {
            let wake = wakes.objects.entry(key.clone()).or_default();
            wake.due.get_or_insert(now);
        }
        if wakes.objects.len() >= wakes.prune_at {
            wakes
                .objects
                .retain(|_, w| w.running || w.due.is_some_and(|d| now - d < WAKE_STALE));
            wakes.prune_at = (wakes.objects.len() * 2).max(WAKES_PRUNE_AT);
        }
    }

    /// Objects woken and not started, or running (for tests and the memory bound).
    pub fn woken(&self) -> usize {
        self.lock_wakes().objects.len()
    }

    /// The pass over `key` starts: observes how long it waited since it was due, if a watch
    /// event woke it.
    fn started(&self, key: &ObjectRef<K>) {
        let now = Instant::now();
        let waited = {
            let mut wakes = self.lock_wakes();
            let wake = wakes.objects.entry(key.clone()).or_default();
            wake.running = true;
            wake.due
                .take()
                .map(|due| now.saturating_duration_since(due))
        };
        if let Some(waited) = waited {
            self.metrics.pass_start_waited(waited.as_secs_f64());
        }
    }

    /// The pass over `key` ended: an object woken meanwhile is due from now on (kube's Controller
    /// holds it until this pass is over); one not woken is forgotten.
    fn ended(&self, key: &ObjectRef<K>) {
        let now = Instant::now();
        let mut wakes = self.lock_wakes();
        match wakes.objects.get_mut(key) {
            Some(wake) if wake.due.is_some() => {
                wake.due = Some(now);
                wake.running = false;
            }
            _ => {
                wakes.objects.remove(key);
            }
        }
    }

    fn lock_wakes(&self) -> std::sync::MutexGuard<'_, Wakes<K>> {
        self.wakes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the pass `make` makes over `object` unless the object is still backing off from a
    /// failed pass (then it is looked at again when the wait is over: a failure that repeats never
    /// turns into a loop, however many watch events wake the object).
    ///
    /// The pass is made, on the heap, only once a slot is held: kube's Controller keeps a task
    /// for every object woken, and a task waiting for its slot then holds a few hundred bytes
    /// instead of the whole pass (a scale-down pass is kilobytes: 1,401 tasks woken at once took
    /// 19.5 MiB at the start of `idle`'s 1,000 sets, bench/notes.md).
    pub async fn run<F>(&self, object: &K, make: impl FnOnce() -> F) -> Result<Action>
    where
        F: Future<Output = Result<Action>>,
    {
        let key = ObjectRef::from_obj(object);
        let slot = match &self.slots {
            Some(semaphore) => Slot::take(semaphore).await,
            None => None,
        };
        let _started = Started::new(self, &key);
        if let Some(wait) = self.waiting(&key) {
            return Ok(Action::requeue(wait));
        }
        let _running = Running::new(&self.running);
        let started = Instant::now();
        let pass = Box::pin(make());
        let result = match slot {
            Some(slot) => slot.hold(pass).await,
            None => pass.await,
        };
        let category = result.as_ref().err().map(Error::category);
        self.metrics
            .reconciled(self.controller, started.elapsed().as_secs_f64(), category);
        match &result {
            Ok(_) => self.forget(&key),
            Err(err) => Box::pin(self.failed(object, &key, err)).await,
        }
        let namespace = key.namespace.as_deref().unwrap_or("");
        debug!(controller = self.controller.as_str(), namespace, name = %key.name, ok = result.is_ok(), "pass done");
        result
    }

    /// What kube's Controller does after a failed pass: look again when the backoff is over.
    pub fn error_policy(&self, object: &K) -> Action {
        let wait = self.waiting(&ObjectRef::from_obj(object));
        Action::requeue(
            wait.unwrap_or(self.backoff.base)
                .max(Duration::from_millis(1)),
        )
    }

    /// Resolves once no pass is running.
    pub async fn idle(&self) {
        let mut running = self.running.count.subscribe();
        let _ = running.wait_for(|n| *n == 0).await;
    }

    /// How long the pass running longest has been running, if one runs (for `/healthz`).
    pub fn longest_pass(&self) -> Option<Duration> {
        let started = self.running.started();
        started.1.values().next().map(|at| at.elapsed())
    }

    /// The controller this runner runs passes of.
    pub fn controller(&self) -> Controller {
        self.controller
    }

    /// Forgets what was remembered of `object` (it was deleted): its backoff, its wake, and what
    /// its reporter published about it.
    pub fn gone(&self, object: &K) {
        let key = ObjectRef::from_obj(object);
        self.forget(&key);
        let mut wakes = self.lock_wakes();
        if wakes.objects.get(&key).is_some_and(|w| !w.running) {
            wakes.objects.remove(&key);
        }
        drop(wakes);
        if let Some(uid) = object.meta().uid.as_deref() {
            self.reporter.forget(uid);
        }
    }

    /// Objects backing off now (for tests and the memory bound).
    pub fn failing(&self) -> usize {
        self.lock().len()
    }

    /// How long `object` still waits after its last failed pass, if it does.
    pub fn backing_off(&self, object: &K) -> Option<Duration> {
        self.waiting(&ObjectRef::from_obj(object))
    }

    fn waiting(&self, key: &ObjectRef<K>) -> Option<Duration> {
        let at = self.lock().get(key)?.retry_at;
        let left = at.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    fn forget(&self, key: &ObjectRef<K>) {
        self.lock().remove(key);
    }

    /// Counts a failed pass, sets the object's wait, logs it, and from the second failure in a
    /// row reports a Warning naming the error (the same error again publishes nothing new).
    async fn failed(&self, object: &K, key: &ObjectRef<K>, err: &Error) {
        let category = err.category();
        let (failures, delay) = self.count(key, category);
        warn!(controller = self.controller.as_str(), object = %key, category = category.as_str(), failures, retry_in = ?delay, "pass failed: {err}");
        if failures < 2 || category == Category::NotLeader {
            return;
        }
        let note = format!(
            "{failures} passes in a row failed ({}): {err}; next try in {}s",
            category.as_str(),
            delay.as_secs()
        );
        let outcome = Outcome::new(Reason::ReconcileFailed, object.object_ref(&()), note)
            .key(format!("{} {err}", category.as_str()));
        self.reporter.report(outcome).await;
    }

    fn count(&self, key: &ObjectRef<K>, category: Category) -> (u32, Duration) {
        let now = Instant::now();
        let mut failing = self.lock();
        // Entries whose wait ended long ago belong to objects no pass has looked at since: gone.
        let stale = self.backoff.max.saturating_mul(2);
        failing.retain(|_, f| now.saturating_duration_since(f.retry_at) < stale);
        let failures = failing.get(key).map_or(0, |f| f.failures).saturating_add(1);
        let delay = self.backoff.after(failures, category);
        failing.insert(
            key.clone(),
            Failing {
                failures,
                retry_at: now + delay,
            },
        );
        (failures, delay)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<K>, Failing>> {
        self.failing.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The reporter of `controller` (Events under `identity`) and its runner with the default backoff.
pub fn parts<K>(
    controller: Controller,
    client: &kube::Client,
    identity: kube::runtime::events::Reporter,
    metrics: &Arc<Metrics>,
    dry_run: bool,
) -> (Arc<Reporter>, Runner<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let reporter = Reporter::new(
        controller,
        client.clone(),
        identity,
        metrics.clone(),
        dry_run,
    );
    let reporter = Arc::new(reporter);
    let runner = Runner::new(
        controller,
        Backoff::default(),
        metrics.clone(),
        reporter.clone(),
    );
    (reporter, runner)
}

/// [`parts`] for unit tests: Events under the reporting controller "test".
#[cfg(test)]
pub fn test_parts<K>(
    controller: Controller,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    dry_run: bool,
) -> (Arc<Reporter>, Runner<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let identity = kube::runtime::events::Reporter {
        controller: "test".into(),
        instance: None,
    };
    parts(controller, client, identity, metrics, dry_run)
}

/// A started pass (also one that only finds its object backing off), until it is dropped: what
/// [`Runner::started`] and [`Runner::ended`] keep of its wakes.
struct Started<'a, K: Resource<DynamicType = ()> + Clone + 'static>(
    &'a Runner<K>,
    &'a ObjectRef<K>,
);

impl<'a, K: Resource<DynamicType = ()> + Clone + 'static> Started<'a, K> {
    fn new(runner: &'a Runner<K>, key: &'a ObjectRef<K>) -> Self {
        runner.started(key);
        Started(runner, key)
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Drop for Started<'_, K> {
    fn drop(&mut self) {
        self.0.ended(self.1);
    }
}

#[cfg(test)]
mod tests;

/// [`parts`] as the flags set them up: Events under [`crate::naming::CONTROLLER_NAME`] and this
/// replica's identity, `--dry-run`.
pub fn from_args<K>(
    controller: Controller,
    args: &crate::cli::Args,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
) -> (Arc<Reporter>, Runner<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let identity = kube::runtime::events::Reporter {
        controller: crate::naming::CONTROLLER_NAME.into(),
        instance: Some(args.identity()),
    };
    parts(controller, client, identity, metrics, args.dry_run)
}

/// The tail every controller's Controller ends with: a new leader looks at every object at once
/// (`became_leader`), no new work after `stop`, the passes run through `reconcile` and
/// `error_policy`, and what the run stream yields is logged under the controller's label. One
/// future that ends once the running passes have (after `stop`).
pub fn run_controller<K, Ctx, Fut>(
    controller: kube::runtime::Controller<K>,
    label: Controller,
    (reconcile, error_policy): (
        impl FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
        impl Fn(Arc<K>, &Error, Arc<Ctx>) -> Action + Send + Sync + 'static,
    ),
    ctx: Arc<Ctx>,
    became_leader: impl futures::Stream<Item = ()> + Send + 'static,
    stop: &tokio_util::sync::CancellationToken,
) -> impl Future<Output = ()> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    Ctx: Send + Sync + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::controller::Error as RunError;
    let controller_label = label.as_str();
    controller
        .reconcile_all_on(became_leader)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| async move {
            match result {
                Ok((object, _)) => {
                    let namespace = object.namespace.as_deref().unwrap_or("");
                    debug!(controller = controller_label, namespace, name = %object.name, "reconciled");
                }
                // Already logged and counted by the runner and error_policy.
                Err(RunError::ReconcilerFailed(..)) => {}
                Err(RunError::ObjectNotFound(object)) => {
                    let namespace = object.namespace.as_deref().unwrap_or("");
                    debug!(controller = controller_label, namespace, name = %object.name, "gone before its pass");
                }
                Err(e) => warn!(controller = controller_label, error = %e, "watch or queue error"),
            }
        })
}
