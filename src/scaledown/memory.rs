//! What the scale-down controller remembers between passes, besides the caches and the
//! expectations of its deletes (`expect`): per set, the creates the API server refused and the
//! records that lost every race; per cleanup pod name, the creates not yet in the cache and the
//! creates of the last minutes (their backoff). One bounded type, behind one lock held for a count
//! or an update only, never across an API call.
//!
//! Bounds: a refusal or contended record lives as long as its set and template; a create not yet
//! cached at most [`CREATED_GRACE`]; a name's creates at most [`RECREATE_WINDOW`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::index::Index;
use crate::naming;
use crate::scaledown::act::{Created, Done};
use crate::scaledown::decide::{self, Plan, Step, Verdict};
use crate::scaledown::observe::{self, Observed, Phase, PodFacts, PodRole, Rejection, SetFacts};

/// How long a cleanup pod we created may be missing from the cache before we stop counting it.
pub const CREATED_GRACE: Duration = Duration::from_secs(5);
/// How long the creates of one cleanup pod name are remembered for [`recreate_delay`].
pub const RECREATE_WINDOW: Duration = Duration::from_secs(600);
/// The longest wait between two creates of one cleanup pod name.
pub const RECREATE_DELAY_MAX: Duration = Duration::from_secs(60);

/// One cleanup pod name: (namespace, name).
type PodKey = (String, String);

/// The refused creations of one StatefulSet.
#[derive(Clone, Debug, Default)]
pub struct SetMemory {
    /// Hash of what the refused pods were made from ([`template_hash`]).
    pub template: u64,
    /// Creations the API server refused, per ordinal.
    pub refusals: BTreeMap<u32, Rejection>,
    /// Ordinals whose new cleanup pod could not be recorded on the set (every try lost a race).
    pub contended: BTreeSet<u32>,
    /// Ordinals a live read of the namespace found with a claim not proven this set's (see
    /// [`Recalled::disputed`]).
    pub disputed: BTreeSet<u32>,
}

impl SetMemory {
    fn is_empty(&self) -> bool {
        self.refusals.is_empty() && self.contended.is_empty() && self.disputed.is_empty()
    }
}

/// What this process remembers of one StatefulSet when a pass starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recalled {
    /// Refused creations per ordinal.
    pub refusals: BTreeMap<u32, Rejection>,
    /// Ordinals whose record lost every race.
    pub contended: BTreeSet<u32>,
    /// Ordinals whose claim the last live read of the namespace found not proven this set's
    /// (another set, which the caches may not show yet, makes or selects it): a cleanup pod is
    /// created for them only on a live read, so a lagging cache cannot create, cancel and create
    /// one again and again.
    pub disputed: BTreeSet<u32>,
}

/// Everything remembered between passes (see the module's documentation).
#[derive(Debug, Default)]
pub struct Memories {
    /// Cleanup pods created by us that the cache may not show yet -> when.
    created: HashMap<PodKey, Instant>,
    /// Creates per cleanup pod name in the last [`RECREATE_WINDOW`]: (count, last create).
    recreates: HashMap<PodKey, (u32, Instant)>,
    /// Per StatefulSet: only sets with refused creations or contended records.
    pub sets: HashMap<ObjectRef<StatefulSet>, SetMemory>,
}

/// Hash of what a set's cleanup pod is made from: its template annotation, its inherit annotation
/// and the scheduling fields the cache keeps of it (only those of a set that inherits them), so
/// that a change of any of them forgets the refusals of the pods made before.
pub fn template_hash(set: &StatefulSet) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let annotations = set.annotations();
    annotations
        .get(naming::TEMPLATE_ANNOTATION)
        .hash(&mut hasher);
    annotations
        .get(naming::INHERIT_ANNOTATION)
        .hash(&mut hasher);
    let scheduling = set.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    serde_json::to_string(&scheduling)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

impl Memories {
    /// What is remembered of `set`, forgotten when what its cleanup pods are made from changed.
    pub fn recall(&mut self, set: &StatefulSet) -> Recalled {
        let key = ObjectRef::from(set);
        let Some(entry) = self.sets.get(&key) else {
            return Default::default();
        };
        if entry.template != template_hash(set) {
            self.sets.remove(&key);
            return Default::default();
        }
        Recalled {
            refusals: entry.refusals.clone(),
            contended: entry.contended.clone(),
            disputed: entry.disputed.clone(),
        }
    }

    /// Remembers (or, after a record went through, forgets) ordinals whose record lost every race:
    /// the status names them until one of their cleanups is recorded.
    pub fn contended(
        &mut self,
        set: &StatefulSet,
        ordinals: impl Iterator<Item = u32>,
        lost: bool,
    ) {
        let key = ObjectRef::from(set);
        if lost {
            self.entry(set).contended.extend(ordinals);
        } else if let Some(entry) = self.sets.get_mut(&key) {
            for n in ordinals {
                entry.contended.remove(&n);
            }
            if entry.is_empty() {
                self.sets.remove(&key);
            }
        }
    }

    fn entry(&mut self, set: &StatefulSet) -> &mut SetMemory {
        self.sets
            .entry(ObjectRef::from(set))
            .or_insert_with(|| SetMemory {
                template: template_hash(set),
                ..SetMemory::default()
            })
    }

    /// Cleanup pods in flight everywhere we watch: those the cache shows, and ours it does not
    /// show yet.
    pub fn in_flight(&mut self, cleanup_pods: &Index<Pod>) -> usize {
        self.forget_cached(cleanup_pods);
        let cached = cleanup_pods
            .all()
            .iter()
            .filter(|p| observe::in_flight(p))
            .count();
        cached + self.created.len()
    }

    /// Forgets our creations the cache shows by now (or that are too old to still be missing).
    fn forget_cached(&mut self, cleanup_pods: &Index<Pod>) {
        self.created.retain(|(ns, name), at| {
            at.elapsed() < CREATED_GRACE && cleanup_pods.get(ns, name).is_none()
        });
    }

    /// Lets the plan's creates through once (the rule is `decide::admit`): a pod this process
    /// created that the cache does not show yet is not created again, a name created again and
    /// again waits out its backoff, and with a cap creates take their places under it by being
    /// entered as created before they are, so every set creates in parallel and the cap still
    /// holds. Returns the plan and the names entered.
    pub fn admit(
        &mut self,
        set: &SetFacts,
        plan: Plan,
        cap: Option<usize>,
        cleanup_pods: &Index<Pod>,
    ) -> (Plan, Vec<String>) {
        // Every pass forgets what the cache shows by now: the pass that the pod's own watch
        // event starts is one of them.
        self.forget_cached(cleanup_pods);
        let names: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::CreateCleanupPod { ordinal, .. } => {
                    Some(naming::pod_name(&set.name, *ordinal))
                }
                _ => None,
            })
            .collect();
        if names.is_empty() {
            return (plan, Vec::new());
        }
        let waits = names
            .into_iter()
            .filter_map(|name| {
                let key = (set.namespace.clone(), name);
                let cached_soon = || {
                    self.created
                        .get(&key)
                        .map(|at| CREATED_GRACE.saturating_sub(at.elapsed()))
                };
                // The cache shows the name taken by now, though the plan was decided on a view
                // without it (its watch event arrived during the pass, and `forget_cached` just
                // forgot our create): the create would only meet 409. The pod's own watch event
                // starts the next pass.
                let shown_now = || cleanup_pods.get(&key.0, &key.1).map(|_| CREATED_GRACE);
                let left = self
                    .recreate_wait(&key)
                    .or_else(cached_soon)
                    .or_else(shown_now)?;
                Some((key.1, left))
            })
            .collect();
        let in_flight = cap.map_or(0, |_| self.in_flight(cleanup_pods));
        let admission = decide::Admission {
            in_flight,
            cap,
            waits,
        };
        let (plan, admitted) = decide::admit(set, plan, &admission);
        for name in &admitted {
            let key = (set.namespace.clone(), name.clone());
            self.created.insert(key, Instant::now());
        }
        (plan, admitted)
    }

    /// Cancelled creations are no longer in flight, and may be created again.
    pub fn forget_created(&mut self, ns: &str, verdicts: &[(Created, Verdict)]) {
        for (pod, _) in verdicts.iter().filter(|(_, v)| *v != Verdict::Run) {
            self.created.remove(&(ns.to_string(), pod.name.clone()));
        }
    }

    /// Remembers what the writes of one pass did: refused creations count up, created ones reset;
    /// the names `reserved` by `admit` and not created are no longer in flight.
    pub fn remember(
        &mut self,
        set: &StatefulSet,
        observed: &Observed,
        done: &Done,
        reserved: &[String],
        sets: &Store<StatefulSet>,
    ) {
        self.remember_refusals(set, observed, done, sets);
        let ns = &observed.set.namespace;
        for name in reserved {
            if !done.created.iter().any(|c| c.name == *name) {
                self.created.remove(&(ns.clone(), name.clone()));
            }
        }
        for created in &done.created {
            self.created
                .insert((ns.clone(), created.name.clone()), Instant::now());
        }
        self.recreates
            .retain(|_, (_, last)| last.elapsed() < RECREATE_WINDOW);
        // A cleanup pod that ran (whatever its end) was not lost: its name starts afresh, so a set
        // scaled down again and again is never held back by its earlier, finished cleanups.
        for name in observed
            .ordinals
            .values()
            .filter_map(|o| ran(o.pod.as_ref()?))
        {
            self.recreates.remove(&(ns.clone(), name.to_string()));
        }
        for created in &done.created {
            let key = (ns.clone(), created.name.clone());
            let entry = self.recreates.entry(key).or_insert((0, Instant::now()));
            *entry = (entry.0.saturating_add(1), Instant::now());
        }
    }

    fn remember_refusals(
        &mut self,
        set: &StatefulSet,
        observed: &Observed,
        done: &Done,
        sets: &Store<StatefulSet>,
    ) {
        let entry = self.entry(set);
        for refusal in &done.refused {
            let count = entry.refusals.get(&refusal.ordinal).map_or(0, |r| r.count);
            let rejection = Rejection {
                count: count + 1,
                last: observed.now,
                code: refusal.code,
                message: refusal.message.clone(),
            };
            entry.refusals.insert(refusal.ordinal, rejection);
        }
        for created in &done.created {
            entry.refusals.remove(&created.ordinal);
        }
        if observed.read == observe::SetRead::LiveAll {
            entry.disputed = observed
                .ordinals
                .iter()
                .filter(|(_, f)| f.claims.iter().any(|c| c.not_ours.is_some()))
                .map(|(n, _)| *n)
                .collect();
        }
        if entry.is_empty() {
            self.sets.remove(&ObjectRef::from(set));
        }
        // Sets deleted meanwhile (a namespace deleted with them) take their memory along.
        self.sets.retain(|set, _| sets.get(set).is_some());
    }

    /// How long a create of cleanup pod `key` must still wait, given its creates in the window.
    pub fn recreate_wait(&self, key: &(String, String)) -> Option<Duration> {
        let (count, last) = self.recreates.get(key)?;
        let left = recreate_delay(count.saturating_add(1)).saturating_sub(last.elapsed());
        (!left.is_zero()).then_some(left)
    }

    /// Enters `count` creates of `key`, the last one `ago` (tests: a name created again and again).
    #[cfg(test)]
    pub fn created_before(&mut self, key: PodKey, count: u32, last: Instant) {
        self.recreates.insert(key, (count, last));
    }
}

/// The name of a recorded cleanup pod that got past Pending (it ran).
fn ran(pod: &PodFacts) -> Option<&str> {
    match &pod.role {
        PodRole::Cleanup(c) if c.phase != Phase::Pending => Some(pod.name.as_str()),
        _ => None,
    }
}

/// The least time between the `nth` create of one cleanup pod name (within [`RECREATE_WINDOW`])
/// and the one before: none for the first two, then 1 s doubling to [`RECREATE_DELAY_MAX`]. A
/// pod deleted by someone else before it ran (a stale StatefulSet controller deleting by name, a
/// forger taking the name) is thus created again at a rate set by this backoff, never by theirs.
pub fn recreate_delay(nth: u32) -> Duration {
    if nth <= 2 {
        return Duration::ZERO;
    }
    Duration::from_secs(1)
        .saturating_mul(2u32.saturating_pow(nth - 3))
        .min(RECREATE_DELAY_MAX)
}
