//! One reconcile: observe from the caches, decide, confirm dangerous steps on a live read, act.
//! Also the per-StatefulSet error backoff, which kube's Controller leaves to us.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

use crate::act::Actor;
use crate::decide::{Policy, Step, decide};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::naming;
use crate::observe::{self, Observed, Sources};
use crate::watch::Stores;

/// How long a cleanup pod we created counts as in flight before the cache shows it.
const CREATED_GRACE: Duration = Duration::from_secs(60);
/// Error backoff per StatefulSet: first retry after this, doubling per failure.
const ERROR_BACKOFF_BASE: Duration = Duration::from_secs(1);
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub policy: Policy,
    pub actor: Actor,
    pub metrics: Arc<Metrics>,
    pub leadership: Arc<crate::leader::Leadership>,
    pub resync: Duration,
    /// Serialises confirmations and the writes they allow, so the concurrency cap holds.
    confirm: tokio::sync::Mutex<()>,
    /// Cleanup pods created by us that the cache may not show yet: (namespace, name) -> when.
    created: Mutex<HashMap<(String, String), Instant>>,
    /// Consecutive failed reconciles per StatefulSet.
    failures: Mutex<HashMap<ObjectRef<StatefulSet>, u32>>,
}

fn arcs<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        policy: Policy,
        actor: Actor,
        metrics: Arc<Metrics>,
        leadership: Arc<crate::leader::Leadership>,
        resync: Duration,
    ) -> Self {
        Context {
            leadership,
            client,
            stores,
            policy,
            actor,
            metrics,
            resync,
            confirm: tokio::sync::Mutex::new(()),
            created: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Cleanup pods in flight everywhere we watch: the cache, plus our creations it does not show yet.
    fn cleanups_in_flight(&self, cleanup_pods: &[Arc<Pod>]) -> usize {
        let cached = cleanup_pods
            .iter()
            .filter(|p| observe::in_flight(p))
            .count();
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        created.retain(|(ns, name), at| {
            at.elapsed() < CREATED_GRACE
                && !cleanup_pods
                    .iter()
                    .any(|p| p.namespace().as_deref() == Some(ns) && p.name_any() == *name)
        });
        self.metrics.set_cleanups_running(cached);
        cached + created.len()
    }

    fn observe_cached(&self, set: &StatefulSet) -> Observed {
        let cleanup_pods = self.stores.cleanup_pods.state();
        observe::observe(
            set,
            &Sources {
                sets: &self.stores.sets.state(),
                claims: &self.stores.claims.state(),
                pods: &self.stores.pods.state(),
                cleanups_in_flight: self.cleanups_in_flight(&cleanup_pods),
                cleanup_pods: &cleanup_pods,
                now: Timestamp::now(),
            },
        )
    }

    /// The same facts read from the API server instead of the caches; `None` if the set is gone
    /// or was replaced by a new one with the same name.
    async fn observe_live(&self, set: &StatefulSet) -> Result<Option<Observed>> {
        let ns = set.namespace().unwrap_or_default();
        let name = set.name_any();
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
        let live = sets
            .get_opt(&name)
            .await
            .map_err(Error::kube("get statefulset", &name))?;
        let Some(live) = live.filter(|l| l.uid() == set.uid()) else {
            return Ok(None);
        };
        let all = ListParams::default();
        let sets_in_ns = arcs(
            sets.list(&all)
                .await
                .map_err(Error::kube("list statefulsets", &ns))?
                .items,
        );
        let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let claims = arcs(
            claims_api
                .list_metadata(&all)
                .await
                .map_err(Error::kube("list claims", &ns))?
                .items,
        );
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let pods = arcs(
            pods_api
                .list_metadata(&all)
                .await
                .map_err(Error::kube("list pods", &ns))?
                .items,
        );
        let cleanup_pods = arcs(
            pods_api
                .list(&ListParams::default().labels(naming::CLEANUP_LABEL))
                .await
                .map_err(Error::kube("list cleanup pods", &ns))?
                .items,
        );
        let in_flight = self.cleanups_in_flight(&self.stores.cleanup_pods.state());
        Ok(Some(observe::observe(
            &live,
            &Sources {
                sets: &sets_in_ns,
                claims: &claims,
                pods: &pods,
                cleanup_pods: &cleanup_pods,
                cleanups_in_flight: in_flight,
                now: Timestamp::now(),
            },
        )))
    }

    async fn reconcile_set(&self, set: &StatefulSet) -> Result<Action> {
        self.stores.ready().await?;
        if !self.leadership.may_write() {
            // A standby only keeps its caches warm; it looks at every set when it becomes leader.
            return Ok(Action::await_change());
        }
        let cached = self.observe_cached(set);
        let plan = decide(&cached, &self.policy);
        if !plan.needs_confirmation() {
            let result = self.actor.execute(&cached.set, &plan).await;
            return self.finish(&cached.set, plan.requeue_after, result).await;
        }
        // Creating a cleanup pod or releasing a deleted set: decide again on a live read, so that a
        // scale-up that just happened wins and no claim or cleanup pod is overlooked.
        let _one_at_a_time = self.confirm.lock().await;
        let Some(live) = self.observe_live(set).await? else {
            return Ok(Action::await_change());
        };
        let plan = decide(&live, &self.policy);
        self.remember_creations(&live, &plan.steps);
        let result = self.actor.execute(&live.set, &plan).await;
        self.finish(&live.set, plan.requeue_after, result).await
    }

    fn remember_creations(&self, live: &Observed, steps: &[Step]) {
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        for step in steps {
            if let Step::CreateCleanupPod { ordinal, .. } = step {
                let key = (
                    live.set.namespace.clone(),
                    naming::pod_name(&live.set.name, *ordinal),
                );
                created.insert(key, Instant::now());
            }
        }
    }

    async fn finish(
        &self,
        set: &observe::SetFacts,
        requeue: Option<Duration>,
        result: Result<()>,
    ) -> Result<Action> {
        if let Err(err) = &result {
            self.actor.report_rejection(set, err).await;
        }
        result?;
        let after = requeue
            .map_or(self.resync, |d| d.min(self.resync))
            .max(Duration::from_millis(500));
        Ok(Action::requeue(after))
    }
}

/// The reconciler handed to kube's Controller.
pub async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = ctx.reconcile_set(&set).await;
    ctx.metrics.reconciled(
        started.elapsed().as_secs_f64(),
        result.as_ref().err().map(Error::category),
    );
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ObjectRef::from(set.as_ref()));
    }
    debug!(set = %set.name_any(), namespace = ?set.namespace(), ok = result.is_ok(), "reconciled");
    result
}

/// Capped exponential backoff per StatefulSet; other sets are not slowed down.
pub fn error_policy(set: Arc<StatefulSet>, err: &Error, ctx: Arc<Context>) -> Action {
    let mut failures = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
    let n = failures.entry(ObjectRef::from(set.as_ref())).or_insert(0);
    *n = n.saturating_add(1);
    let delay = ERROR_BACKOFF_BASE
        .saturating_mul(2u32.saturating_pow(*n - 1))
        .min(ERROR_BACKOFF_MAX);
    warn!(set = %set.name_any(), namespace = ?set.namespace(), category = err.category(), retry_in = ?delay, "reconcile failed: {err}");
    Action::requeue(delay)
}
