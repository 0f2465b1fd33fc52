//! Hot-loop detector: every test namespace ([`super::Cluster::namespace`]) records the cleanup pods
//! created in it, and the namespace guard's `Drop` fails the test if one ordinal got more of them
//! than the controller's attempts allow (docs/usage.md, "Safety contract", *No hot loop*).
//!
//! **What is counted.** Pods with the controller's cleanup label (`scaledown-pod`, the selector of
//! the watch) whose `metadata.managedFields` name the controller's field manager
//! ([`CONTROLLER_MANAGER`], the `fieldManager` of its create call). Look-alikes that tests forge
//! (`tests/e2e_trust.rs`) carry the label and our annotations, but were created by another client,
//! so they are never counted. A pod is counted once per UID.
//!
//! **Per what.** Per cleanup pod name (one ordinal of one set) *and* per generation of its
//! StatefulSet in force when the pod was created. Every spec change (a scale, a deletion) bumps
//! the generation and starts a new series legitimately: a test that scales `s` 2→1→2 twenty times
//! gets twenty cleanup pods of `s-1`, one per scale-down. The generation in force is taken from a
//! StatefulSet watch of the same namespace: the latest state of the owner set (annotation
//! `scaledown-pod-owner`) with a `resourceVersion` below the pod's first one. All objects of the
//! test cluster share one etcd, so these numbers order changes across kinds.
//!
//! **The bound** ([`bound_for`]): `--cleanup-attempts` of the controllers started for the
//! namespace through [`super::fixtures::Controller`] (their largest value; [`DEFAULT_ATTEMPTS`]
//! when none was, e.g. a controller installed by Helm), plus [`SLACK`]. The slack covers the
//! re-creates docs/usage.md allows without a new attempt: a gated, never-run pod that
//! kube-controller-manager's late delete by name removed, and that the controller creates again
//! (KWOK is built to delete with a UID precondition, as a kubelet does, so its late deletes no
//! longer remove a new pod). A hot loop (the
//! same failure answered by a new pod, pass after pass) crosses it within seconds.
//!
//! **One create per ordinal and attempt** (issue 23): within a series, no attempt number may run
//! in two pods. A pod counts as run once it was seen without the controller's scheduling gate; a
//! pod removed while still gated never ran, and the controller may create it again for the same
//! attempt (the slack above). A set with an explicit bound from the test is exempt.
//!
//! **Opting out**, visibly in the test: `ns.allow_cleanup_creates(set, n, why)` (an explicit bound
//! for one set's ordinals, with a reason; for tests that provoke a persistent failure on purpose)
//! or `ns.skip_hot_loop_check(why)` (no check, with a reason); see [`super::TestNamespace`].
//! `SCALEDOWN_E2E_HOTLOOP=0` switches the detector off for a whole run (no watches are started).
//!
//! A watch misses a pod that was created and deleted while it was relisting after a 410 Gone; the
//! detector can therefore undercount, never overcount.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;

use super::fixtures::is_gated;
use super::recorder::Recorder;

/// Field manager the controller sends with every write, its create of a cleanup pod included
/// (`statefulset_scaledown_controller::scaledown::act::FIELD_MANAGER`).
pub const CONTROLLER_MANAGER: &str =
    statefulset_scaledown_controller::scaledown::act::FIELD_MANAGER;
/// `--cleanup-attempts` when the test started no controller of its own with the flag.
pub const DEFAULT_ATTEMPTS: usize = 3;
/// Creates beyond the attempts that one ordinal may get in one generation of its set: two
/// re-creates of a never-run pod that a delete by name (kube-controller-manager's late one, or
/// KWOK's) took away.
pub const SLACK: usize = 2;
/// Label of every cleanup pod (value: the pod's name).
const CLEANUP_LABEL: &str = statefulset_scaledown_controller::naming::CLEANUP_LABEL;
/// Annotation naming the StatefulSet a cleanup pod belongs to.
const OWNER: &str = statefulset_scaledown_controller::naming::OWNER_ANNOTATION;
/// Annotation with the pod's attempt number.
const ATTEMPT: &str = statefulset_scaledown_controller::naming::ATTEMPT_ANNOTATION;

/// `--cleanup-attempts` of the controllers started per namespace (the largest seen).
static ATTEMPTS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// Remembers the `--cleanup-attempts` of a controller started with `args` for the namespace of
/// its `--namespace` flag (called by [`super::fixtures::Controller::spawn`]). A controller without
/// `--namespace` (cluster scope) is not tied to a test namespace and changes no bound.
pub fn note_controller_args(args: &[&str]) {
    let value = |flag: &str| -> Option<String> {
        let prefix = format!("{flag}=");
        args.iter().enumerate().find_map(|(i, a)| {
            if *a == flag {
                args.get(i + 1).map(|v| v.to_string())
            } else {
                a.strip_prefix(&prefix).map(str::to_string)
            }
        })
    };
    let Some(namespace) = value("--namespace") else {
        return;
    };
    let attempts = value("--cleanup-attempts")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ATTEMPTS);
    let mut all = ATTEMPTS.lock().unwrap_or_else(|p| p.into_inner());
    let entry = all.entry(namespace).or_insert(attempts);
    *entry = (*entry).max(attempts);
}

/// `--cleanup-attempts` in force for `namespace` (see [`note_controller_args`]).
pub fn attempts_for(namespace: &str) -> usize {
    ATTEMPTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(namespace)
        .copied()
        .unwrap_or(DEFAULT_ATTEMPTS)
}

/// The default bound per ordinal and generation in `namespace`: attempts plus [`SLACK`].
pub fn bound_for(namespace: &str) -> usize {
    attempts_for(namespace) + SLACK
}

/// Whether the detector runs (`SCALEDOWN_E2E_HOTLOOP=0` turns it off).
pub fn enabled() -> bool {
    std::env::var("SCALEDOWN_E2E_HOTLOOP").map_or(true, |v| v != "0")
}

/// The cleanup pods the controller created for one ordinal in one generation of its set.
#[derive(Clone, Debug)]
pub struct OrdinalCreates {
    /// The cleanup pod's name (`<set>-<ordinal>`).
    pub pod: String,
    /// The set it belongs to (its owner annotation).
    pub set: String,
    /// UID and generation of the set in force at the first create (None: the watch saw no set).
    pub set_uid: Option<String>,
    pub generation: Option<i64>,
    /// The created pods, in order: UID, attempt annotation, time since the recorder started.
    pub pods: Vec<(String, Option<String>, std::time::Duration)>,
    /// The UIDs of those pods that were ever seen without the controller's gate (released).
    pub released: HashSet<String>,
}

impl OrdinalCreates {
    pub fn count(&self) -> usize {
        self.pods.len()
    }

    /// The attempts that more than one released pod ran for, with their pods: one create per
    /// ordinal and attempt (issue 23). A pod removed while still gated never ran and is exempt:
    /// docs/usage.md lets the controller create such a pod again for the same attempt.
    pub fn attempts_run_twice(&self) -> Vec<String> {
        let mut per_attempt: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (uid, attempt, _) in self.pods.iter().filter(|p| self.released.contains(&p.0)) {
            per_attempt
                .entry(attempt.as_deref().unwrap_or("?"))
                .or_default()
                .push(uid);
        }
        per_attempt
            .into_iter()
            .filter(|(_, uids)| uids.len() > 1)
            .map(|(attempt, uids)| {
                format!("attempt {attempt} released {} times: {uids:?}", uids.len())
            })
            .collect()
    }

    /// The attempt annotations and times of the creates, e.g. `1 +3.1s, 2 +6.0s`.
    pub fn attempts(&self) -> String {
        self.pods
            .iter()
            .map(|(_, attempt, at)| {
                format!(
                    "{} +{:.1}s",
                    attempt.as_deref().unwrap_or("?"),
                    at.as_secs_f64()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for OrdinalCreates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pods: Vec<String> = self
            .pods
            .iter()
            .map(|(uid, attempt, at)| {
                format!(
                    "{uid} (attempt {}, +{:.1}s)",
                    attempt.as_deref().unwrap_or("?"),
                    at.as_secs_f64()
                )
            })
            .collect();
        write!(
            f,
            "{} (set {} generation {}): {} creates: {}",
            self.pod,
            self.set,
            self.generation.map_or("?".into(), |g| g.to_string()),
            self.pods.len(),
            pods.join(", ")
        )
    }
}

/// The recordings of one test namespace, checked when it is dropped.
pub struct HotLoopCheck {
    namespace: String,
    pods: Recorder<Pod>,
    sets: Recorder<StatefulSet>,
    /// Explicit bounds per set name, with the test's reason.
    allowed: Mutex<BTreeMap<String, (usize, String)>>,
    /// Why the test switched the check off.
    off: Mutex<Option<String>>,
}

/// Whether the controller created this pod (its field manager owns fields of it).
pub fn created_by_controller(pod: &Pod) -> bool {
    pod.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some(CONTROLLER_MANAGER))
}

impl HotLoopCheck {
    /// Starts the two watches of `namespace` (cleanup pods, StatefulSets); returns once both have
    /// listed. `None` when the detector is switched off for the run.
    pub async fn start(client: &Client, namespace: &str) -> Option<HotLoopCheck> {
        if !enabled() {
            return None;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        let (pods, sets) = tokio::join!(
            Recorder::start(pods, watcher::Config::default().labels(CLEANUP_LABEL)),
            Recorder::start(sets, watcher::Config::default()),
        );
        Some(HotLoopCheck {
            namespace: namespace.to_string(),
            pods,
            sets,
            allowed: Mutex::new(BTreeMap::new()),
            off: Mutex::new(None),
        })
    }

    /// Allows the ordinals of set `set` up to `per_ordinal` cleanup pod creates per generation,
    /// instead of the default bound, because of `why` (printed with the result).
    pub fn allow(&self, set: &str, per_ordinal: usize, why: &str) {
        self.allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(set.to_string(), (per_ordinal, why.to_string()));
    }

    /// Raises set `set`'s bound by `more` (on top of what it allows already) because of `why`:
    /// for a test that deletes the controller's cleanup pods itself, once per delete.
    pub fn allow_more(&self, set: &str, more: usize, why: &str) {
        let (base, _) = self.bound_of(set);
        self.allow(set, base + more, why);
    }

    /// Switches the check off for this namespace because of `why` (printed at the end).
    pub fn off(&self, why: &str) {
        *self.off.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }

    /// The bound of set `set`'s ordinals and where it comes from.
    pub fn bound_of(&self, set: &str) -> (usize, String) {
        if let Some((n, why)) = self
            .allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(set)
        {
            return (*n, format!("allowed by the test: {why}"));
        }
        let attempts = attempts_for(&self.namespace);
        (
            attempts + SLACK,
            format!("--cleanup-attempts {attempts} + slack {SLACK}"),
        )
    }

    /// The controller's cleanup pod creates so far, per ordinal and generation of its set, in the
    /// order of their first create; and how many other pods with the cleanup label were seen.
    pub fn creates(&self) -> (Vec<OrdinalCreates>, usize) {
        let sets = self.sets.seen();
        let mut groups: Vec<OrdinalCreates> = Vec::new();
        let mut index: HashMap<(String, Option<String>, Option<i64>), usize> = HashMap::new();
        let mut counted: HashSet<String> = HashSet::new();
        let mut foreign: HashSet<String> = HashSet::new();
        let all = self.pods.seen();
        let released: HashSet<String> = all
            .iter()
            .filter(|s| !is_gated(&s.object))
            .map(|s| s.uid.clone())
            .collect();
        for seen in all {
            if counted.contains(&seen.uid) || foreign.contains(&seen.uid) {
                continue;
            }
            if !created_by_controller(&seen.object) {
                // Its first state names another creator; a later patch of ours (a released gate)
                // never makes someone else's pod ours.
                foreign.insert(seen.uid.clone());
                continue;
            }
            counted.insert(seen.uid.clone());
            let set = seen
                .annotations
                .get(OWNER)
                .cloned()
                .unwrap_or_else(|| seen.name.rsplit_once('-').map_or("", |(s, _)| s).into());
            let in_force = sets
                .iter()
                .filter(|s| s.name == set && s.resource_version < seen.resource_version)
                .max_by_key(|s| s.resource_version);
            let set_uid = in_force.map(|s| s.uid.clone());
            let generation = in_force.and_then(|s| s.object.metadata.generation);
            let key = (seen.name.clone(), set_uid.clone(), generation);
            let at = *index.entry(key).or_insert_with(|| {
                groups.push(OrdinalCreates {
                    pod: seen.name.clone(),
                    set: set.clone(),
                    set_uid,
                    generation,
                    pods: Vec::new(),
                    released: HashSet::new(),
                });
                groups.len() - 1
            });
            if released.contains(&seen.uid) {
                groups[at].released.insert(seen.uid.clone());
            }
            groups[at].pods.push((
                seen.uid.clone(),
                seen.annotations.get(ATTEMPT).cloned(),
                seen.since_start,
            ));
        }
        (groups, foreign.len())
    }

    /// What is wrong with one ordinal series: more creates than its bound, or (unless the test
    /// allowed its set more) an attempt that ran in more than one pod.
    fn over_bound(&self, g: &OrdinalCreates) -> Option<String> {
        let (bound, why) = self.bound_of(&g.set);
        if g.count() > bound {
            return Some(format!("{g} > bound {bound} ({why})"));
        }
        let allowed = self
            .allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&g.set);
        let twice = g.attempts_run_twice();
        (!allowed && !twice.is_empty()).then(|| format!("{g}: {}", twice.join("; ")))
    }

    /// `Err` with a report if an ordinal crossed its bound (and the check is on); `Ok` with a
    /// one-line summary otherwise (empty when the controller created no cleanup pod).
    pub fn verdict(&self) -> Result<String, String> {
        let (groups, foreign) = self.creates();
        let off = self.off.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let total: usize = groups.iter().map(OrdinalCreates::count).sum();
        let over: Vec<String> = groups.iter().filter_map(|g| self.over_bound(g)).collect();
        let most = groups.iter().max_by_key(|g| g.count());
        let summary = match most {
            None if foreign == 0 => String::new(),
            None => format!(
                "hot-loop check {}: no cleanup pod created by the controller ({foreign} other pods with its label)",
                self.namespace
            ),
            Some(g) => {
                let (bound, why) = self.bound_of(&g.set);
                format!(
                    "hot-loop check {}: {total} cleanup pods created by the controller for {} ordinal series; most in one: {} ({}, generation {}, attempt and time: {}), bound {bound} ({why}); {foreign} other pods with its label",
                    self.namespace,
                    groups.len(),
                    g.count(),
                    g.pod,
                    g.generation.map_or("?".into(), |n| n.to_string()),
                    g.attempts(),
                )
            }
        };
        if let Some(why) = off {
            return Ok(format!("{summary} [check off: {why}]"));
        }
        if over.is_empty() {
            return Ok(summary);
        }
        Err(format!(
            "hot loop: in namespace {}, the controller created more cleanup pods for one ordinal within one generation of its StatefulSet than its attempts allow, or released two pods for one attempt (tests/support/hotloop.rs; opt out visibly with `ns.allow_cleanup_creates(set, n, why)` or `ns.skip_hot_loop_check(why)`):\n{}\n(pod watch errors: {:?})",
            self.namespace,
            over.join("\n"),
            self.pods.errors()
        ))
    }
}
