//! One pass over one StatefulSet, in a straight line:
//! observe (caches) → decide → confirm (a live read, decide again, if the plan asks) → act →
//! settle the cleanup pods just created (a read made after the create, the pure verdict, record
//! and release or delete) → remember and report.
//! Also the per-StatefulSet memory of refused creations and recent creates; the error backoff,
//! timing and failure reports are the shared pass runner's (`crate::pass`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::debug;

use crate::error::{Error, Result};
use crate::pass::Runner;
use crate::scaledown::act::{Actor, Created, Done};
use crate::scaledown::decide::{self, Confirm, Plan, Policy, Verdict, decide, status};
use crate::scaledown::expect::{self, Expectations, GoneKind};
use crate::scaledown::live::{self, First};
pub use crate::scaledown::live::{Listed, NamespaceLists, list_namespace};
use crate::scaledown::memory::{Memories, Recalled};
use crate::scaledown::observe::{self, Observed, SetFacts, SetRead, Sources};
use crate::scaledown::room;
use crate::scaledown::watch::{Slice, Stores};

/// Reads of the set for one record of new cleanup pods, when the set keeps changing under us.
const RECORD_TRIES: usize = 3;

/// How soon a set looks again after its caches and a live read disagreed on its deletion, or a
/// guard found it changed since the read a plan was decided on.
const DISAGREE_RECHECK: Duration = Duration::from_secs(1);

/// What the live reads before acting came to.
enum Confirmed {
    /// The facts to act on (live where the plan needed them), and the plan decided on them.
    Plan(Box<(Observed, Plan)>),
    /// The set is gone or was replaced by a new one.
    Gone,
    /// The caches and the live read disagree on the propagation of the set's deletion: nothing
    /// is done this pass.
    Disagree,
}

/// What every pass over a StatefulSet shares: client, caches, policy, writer and the per-set memory.
pub struct Context {
    /// The client of the live reads.
    pub client: Client,
    /// The caches.
    pub stores: Stores,
    /// The rules' settings from the flags.
    pub policy: Policy,
    /// The writer.
    pub actor: Actor,
    /// Whether this process leads.
    pub leadership: Arc<crate::leader::Leadership>,
    /// Every set is looked at again after this long (`--resync-period`).
    pub resync: Duration,
    /// Refusals, contended records and recent creates (`memory`).
    memories: Mutex<Memories>,
    /// Claims and pods this process deleted that the caches may still show.
    expectations: Mutex<Expectations>,
    /// Sets whose creates wait for room under `--max-concurrent-cleanups`.
    waiting_for_room: Mutex<room::Waiting>,
    /// Times, backs off and reports every pass.
    pub runner: Runner<StatefulSet>,
    /// The live lists of namespaces, shared between the passes that wait for one.
    lists: NamespaceLists,
}

impl Context {
    /// The context from its parts.
    pub fn new(
        client: Client,
        stores: Stores,
        policy: Policy,
        actor: Actor,
        leadership: Arc<crate::leader::Leadership>,
        resync: Duration,
        runner: Runner<StatefulSet>,
    ) -> Self {
        Context {
            lists: NamespaceLists::new(client.clone(), runner.metrics(), policy.inherit_scheduling),
            leadership,
            client,
            stores,
            policy,
            actor,
            resync,
            memories: Mutex::new(Memories::default()),
            expectations: Mutex::new(Expectations::default()),
            waiting_for_room: Mutex::new(room::Waiting::default()),
            runner,
        }
    }

    /// One pass, once the caches are ready and this process leads, over the set as the cache
    /// holds it when the pass runs: the pass may have waited for a slot for a minute since a
    /// watch event woke it (thousands of sets changing at once), and decided on the copy it was
    /// woken with it would plan writes the cache already shows done (a finalizer added since) and
    /// test values the set no longer carries. Gone from the cache: its deletion is seen. Our
    /// finalizer, added by an earlier pass and not in the cache yet, is on it (`expect`).
    async fn pass(&self, woken: &StatefulSet) -> Result<Action> {
        self.stores.ready().await?;
        if !self.leadership.may_write() {
            // A standby only keeps its caches warm; it looks at every set when it becomes leader.
            return Ok(Action::await_change());
        }
        match self.stores.newest(woken) {
            Some(set) => self.pass_over(&self.with_finalizer(set)).await,
            None => Ok(Action::await_change()),
        }
    }

    /// Observe and decide (on a live read where the plan needs one), let the creates through the
    /// memories, act, report what was done (also when a step failed), and say when to look again.
    async fn pass_over(&self, set: &StatefulSet) -> Result<Action> {
        let recalled = self.memories().recall(set);
        let cached = self.observe_cached(set, &recalled);
        let plan = decide(&cached, &self.policy);
        let (observed, mut plan) = match self.confirm(set, cached, plan, &recalled).await? {
            Confirmed::Plan(confirmed) => *confirmed,
            Confirmed::Gone => return Ok(Action::await_change()),
            Confirmed::Disagree => return Ok(Action::requeue(DISAGREE_RECHECK)),
        };
        plan.status = status::change(&observed, &plan, &recalled.contended);
        log_decided(&observed, &plan);
        let cap = self.policy.max_in_flight;
        let (plan, reserved) =
            self.memories()
                .admit(&observed.set, plan, cap, &self.stores.cleanup_pods);
        let mut done = Done::default();
        let acted = self.act(set, &observed, &plan, &reserved, &mut done).await;
        // Report what act did (also in a pass that failed midway), then the status's Event.
        self.actor.report(&observed.set, &done).await;
        if let (Some(change), Ok(true)) = (&plan.status, &acted) {
            self.actor.status_event(&observed.set, change).await;
        }
        acted?;
        Ok(Action::requeue(self.next_look(set, &plan, done.stale)))
    }

    /// Carries out `plan`, remembers what it did, settles the cleanup pods it created (after a
    /// failed step too) and writes the status change. `Ok(true)` if the status change was
    /// written (its Event is due).
    async fn act(
        &self,
        set: &StatefulSet,
        observed: &Observed,
        plan: &Plan,
        reserved: &[String],
        done: &mut Done,
    ) -> Result<bool> {
        let executed = self.actor.execute(&observed.set, plan, done).await;
        self.memories()
            .remember(set, observed, done, reserved, &self.stores.sets);
        self.expect_unseen(&observed.set, done);
        // Pods created before a failed step are settled all the same.
        let status = plan.status.as_ref().map(|c| &c.write);
        let unsent = status.filter(|_| done.status.is_none());
        let created = std::mem::take(&mut done.created);
        let recorded = self.settle(set, observed, created, unsent, done).await?;
        executed?;
        self.write_status(observed, plan, recorded, done).await
    }

    /// Writes the plan's status change unless a patch of the pass carried it (the finalizer's:
    /// `done.status`, or the record's: `recorded`). Whether it is written.
    async fn write_status(
        &self,
        observed: &Observed,
        plan: &Plan,
        recorded: bool,
        done: &mut Done,
    ) -> Result<bool> {
        let Some(change) = &plan.status else {
            return Ok(false);
        };
        match done.status {
            Some(written) => Ok(written),
            None if recorded => Ok(true),
            None => self.actor.write_status(&observed.set, change, done).await,
        }
    }

    /// When to look at `set` again: the plan's own wait, soon after a guard found the set changed
    /// (its watch event is on the way), at once if room under the cap freed up meanwhile, and
    /// the resync at the latest.
    fn next_look(&self, set: &StatefulSet, plan: &Plan, stale: bool) -> Duration {
        let stale = stale.then_some(DISAGREE_RECHECK);
        let room = plan
            .waits_for_room
            .then(|| self.wait_for_room(set))
            .flatten();
        plan.requeue_after
            .into_iter()
            .chain(stale)
            .chain(room)
            .min()
            .map_or(self.resync, |d| d.min(self.resync))
            .max(Duration::from_millis(500))
    }

    /// Decides again on a live read for as long as the plan asks for one (at most twice: the set,
    /// then the set with its namespace).
    async fn confirm(
        &self,
        set: &StatefulSet,
        cached: Observed,
        mut plan: Plan,
        recalled: &Recalled,
    ) -> Result<Confirmed> {
        let cached_propagation = decide::propagation(&cached);
        let mut observed = cached;
        for _ in 0..2 {
            let Some(depth) = plan.confirm else { break };
            let Some(live) = self.observe_live(set, depth, recalled).await? else {
                return Ok(Confirmed::Gone);
            };
            plan = decide(&live, &self.policy);
            observed = live;
        }
        let live_propagation = decide::propagation(&observed);
        if observed.read == SetRead::LiveAll && live_propagation != cached_propagation {
            // The caches lag the API server (and one another): wait until they agree with it.
            debug!(
                set = %observed.set.name,
                namespace = %observed.set.namespace,
                cached = ?cached_propagation,
                live = ?live_propagation,
                "the caches and a live read disagree on how the set is deleted; nothing is done this pass"
            );
            return Ok(Confirmed::Disagree);
        }
        if plan.confirm.is_some() {
            return Ok(Confirmed::Gone);
        }
        Ok(Confirmed::Plan(Box::new((observed, plan))))
    }

    /// The verdict on each cleanup pod created in this pass, carried out by `act`.
    ///
    /// The first verdict is on the facts the creates were decided on, and the record that lets the
    /// pods run is written with test ops on the set's UID, generation, template annotation and
    /// previous record: the API server applies it only if none changed since, so the write made
    /// after the creates is itself the confirmation that the ordinals are still orphaned (one
    /// request instead of a read and a write). A failed test means the set changed: read it, judge
    /// again on that read, and write again.
    /// Returns whether a record was written (it carried `status`, if any).
    async fn settle(
        &self,
        set: &StatefulSet,
        observed: &Observed,
        created: Vec<Created>,
        status: Option<&status::Write>,
        done: &mut Done,
    ) -> Result<bool> {
        let mut pending = created;
        let mut facts = Some(observed.set.clone());
        for attempt in 1..=RECORD_TRIES {
            if pending.is_empty() {
                return Ok(false);
            }
            if attempt > 1 {
                let inherit = self.policy.inherit_scheduling;
                let live = live::read_set(&self.client, &observed.set, inherit).await?;
                facts = live.as_ref().map(observe::set_facts);
            }
            let verdicts = decide::verdicts(facts.as_ref(), &pending);
            let on = facts.as_ref().unwrap_or(&observed.set);
            let runs = decide::runs(&verdicts);
            self.memories()
                .forget_created(&observed.set.namespace, &verdicts);
            let records = decide::next_records(on, observed, &runs);
            // Released here only on a read of the namespace: another set may want the claims.
            let release = decide::may_release(on) && observed.read == SetRead::LiveAll;
            match self
                .actor
                .settle(on, &records, &verdicts, release, status, done)
                .await
            {
                Err(Error::Contended { .. }) if attempt < RECORD_TRIES => {
                    pending.retain(|c| runs.iter().any(|(n, _)| *n == c.ordinal));
                }
                // Refused for good, or not known to be written: the pods never ran; delete them.
                Err(err @ (Error::Contended { .. } | Error::Unrecorded { .. })) => {
                    pending.retain(|c| runs.iter().any(|(n, _)| *n == c.ordinal));
                    if matches!(err, Error::Contended { .. }) {
                        self.memories()
                            .contended(set, pending.iter().map(|c| c.ordinal), true);
                    }
                    self.abandon(on, &pending, done).await?;
                    return Err(err);
                }
                Ok(recorded) => {
                    self.memories()
                        .contended(set, runs.iter().map(|(n, _)| *n), false);
                    return Ok(recorded);
                }
                Err(other) => return Err(other),
            }
        }
        Ok(false)
    }

    /// Deletes the cleanup pods of this pass whose record was refused every time: they never ran,
    /// and the backoff that follows the failed pass decides when the next one is created.
    async fn abandon(&self, on: &SetFacts, pending: &[Created], done: &mut Done) -> Result<()> {
        let why = "its record on the StatefulSet failed (the set backs off before the next try)";
        let cancels: Vec<(Created, Verdict)> = pending
            .iter()
            .map(|c| (c.clone(), Verdict::Cancel(why.into())))
            .collect();
        self.memories().forget_created(&on.namespace, &cancels);
        self.actor
            .settle(on, &BTreeMap::new(), &cancels, false, None, done)
            .await
            .map(|_| ())
    }

    /// Cleanup pods in flight everywhere we watch, for `--max-concurrent-cleanups` only (without
    /// a cap nothing needs the count).
    fn cleanups_in_flight(&self) -> usize {
        if self.policy.max_in_flight.is_none() {
            return 0;
        }
        self.memories().in_flight(&self.stores.cleanup_pods)
    }

    fn memories(&self) -> std::sync::MutexGuard<'_, Memories> {
        self.memories.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `set` until a cleanup pod's change frees room under the cap. The room is counted
    /// again under the queue's lock (the cleanup pod cache is updated before its change wakes
    /// anyone), so a pod that ended while this pass ran makes the set look again at once
    /// instead of waiting for the next resync.
    fn wait_for_room(&self, set: &StatefulSet) -> Option<Duration> {
        let mut waiting = self
            .waiting_for_room
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.room() > 0 {
            return Some(Duration::ZERO);
        }
        waiting.add(ObjectRef::from_obj(set));
        None
    }

    /// The sets to wake after a change of a cleanup pod: as many of the waiting ones as there is
    /// room for now (none without a cap).
    pub fn wake_for_room(&self) -> Vec<ObjectRef<StatefulSet>> {
        if self.policy.max_in_flight.is_none() {
            return Vec::new();
        }
        let mut waiting = self
            .waiting_for_room
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if waiting.is_empty() {
            return Vec::new();
        }
        waiting.take(self.room())
    }

    /// Free places under `--max-concurrent-cleanups` (0 without a cap: nobody waits then).
    fn room(&self) -> usize {
        self.policy
            .max_in_flight
            .map_or(0, |cap| cap.saturating_sub(self.cleanups_in_flight()))
    }

    /// What the caches hold for a pass over `set`, with what this process deleted and the caches
    /// do not show yet marked as being deleted (`expect`).
    fn slice(&self, set: &StatefulSet) -> Slice {
        let mut slice = self.stores.slice(set);
        let expectations = self.expectations.lock().unwrap_or_else(|p| p.into_inner());
        if !expectations.is_empty() {
            let ns = set.namespace().unwrap_or_default();
            expectations.mask(&ns, &mut slice, Timestamp::now());
        }
        slice
    }

    /// `set` with the finalizer this process added and the cache does not show yet (`expect`).
    fn with_finalizer(&self, set: Arc<StatefulSet>) -> Arc<StatefulSet> {
        let mut expectations = self.expectations.lock().unwrap_or_else(|p| p.into_inner());
        expectations.with_finalizer(set, Instant::now())
    }

    /// Records the deletes, claim marks and finalizer add of a pass, and forgets those the caches
    /// show by now.
    fn expect_unseen(&self, set: &SetFacts, done: &Done) {
        let ns = set.namespace.as_str();
        let mut expectations = self.expectations.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (claims, pods, cleanup_pods) = (
            &self.stores.claims,
            &self.stores.pods,
            &self.stores.cleanup_pods,
        );
        expectations.forget_seen(now, |kind, ns, name| match kind {
            GoneKind::Claim => expect::shown_claim(claims.get(ns, name)),
            GoneKind::Pod => {
                expect::shown_pod(cleanup_pods.get(ns, name).or_else(|| pods.get(ns, name)))
            }
        });
        expectations.deleted(ns, &done.deleted, now);
        expectations.marked(ns, &done.marked, now);
        if let Some(annotations) = &done.finalizer_added {
            let set = (ns, set.name.as_str(), set.uid.as_str());
            expectations.finalizer_added(set, annotations.clone(), now);
        }
    }

    fn observe_cached(&self, set: &StatefulSet, recalled: &Recalled) -> Observed {
        let slice = self.slice(set);
        self.observe_slice(set, &slice, SetRead::Cached, recalled)
    }

    /// The facts of `set` from `slice` (cached, or live: `read`) and this process's memories.
    fn observe_slice(
        &self,
        set: &StatefulSet,
        slice: &Slice,
        read: SetRead,
        recalled: &Recalled,
    ) -> Observed {
        observe::observe(
            set,
            &Sources {
                sets: &slice.sets,
                claims: &slice.claims,
                pods: &slice.pods,
                cleanups_in_flight: self.cleanups_in_flight(),
                cleanup_pods: &slice.cleanup_pods,
                ordinals: &slice.ordinals,
                rejections: recalled.refusals.clone(),
                disputed: recalled.disputed.clone(),
                read,
                now: Timestamp::now(),
            },
        )
    }

    /// The facts with the set read live, and with `SetAndNamespace` the claims and pods of its
    /// namespace too; `None` if the set is gone or was replaced. A read of the namespace takes
    /// the set from its own list of StatefulSets, sent after the claims were listed, instead of a
    /// GET of its own: one request fewer per confirmed pass, and a set at least as new as the
    /// claims it is judged with.
    async fn observe_live(
        &self,
        set: &StatefulSet,
        depth: Confirm,
        recalled: &Recalled,
    ) -> Result<Option<Observed>> {
        let inherit = self.policy.inherit_scheduling;
        let facts = observe::set_facts(set);
        let (live, slice, read) = match depth {
            Confirm::Set => {
                let Some(live) = live::read_set(&self.client, &facts, inherit).await? else {
                    return Ok(None);
                };
                let slice = self.slice(&live);
                (Arc::new(live), slice, SetRead::LiveSet)
            }
            Confirm::SetAndNamespace => {
                // A set being deleted is read first, on its own: its pods must be listed after
                // it (see `live::first_read`).
                let first = match live::first_read(&self.client, set, &facts, inherit).await? {
                    First::Gone => return Ok(None),
                    First::Read(live) => Some(live),
                    First::FromList => None,
                };
                let ns = set.namespace().unwrap_or_default();
                // The slot is handed back while the pass waits: the list is shared. The pass
                // takes its slice before it queues for a slot again, so passes waiting for a
                // slot do not keep whole lists of the namespace alive.
                let lists = &self.lists;
                let taken = crate::pass::parked(async {
                    let listed = lists.list(&ns).await?;
                    let live = first.or_else(|| listed.set(&facts.name, &facts.uid));
                    Ok::<_, Error>(live.map(|live| (listed.slice(&live), live)))
                })
                .await?;
                let Some((slice, live)) = taken else {
                    return Ok(None);
                };
                (live, slice, SetRead::LiveAll)
            }
        };
        Ok(Some(self.observe_slice(&live, &slice, read, recalled)))
    }
}

fn log_decided(observed: &Observed, plan: &Plan) {
    debug!(
        set = %observed.set.name,
        namespace = %observed.set.namespace,
        read = ?observed.read,
        pods = ?observed.pod_roles(),
        steps = plan.steps.len(),
        "decided"
    );
}

/// The reconciler handed to kube's Controller. After a failed pass the set waits out its backoff
/// in the runner, whatever wakes it (its own pods' watch events would otherwise start a pass at
/// once), so a failure that repeats can never turn into a loop of creates.
pub async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    ctx.runner.run(&set, || ctx.pass(&set)).await
}

/// Requeues a set after a failed pass at the end of its backoff.
pub fn error_policy(set: Arc<StatefulSet>, _err: &Error, ctx: Arc<Context>) -> Action {
    ctx.runner.error_policy(&set)
}

#[cfg(test)]
mod tests;
