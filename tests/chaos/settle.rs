//! The end of a round (every set at its final size, the controllers idle) and the end of the run
//! (every set deleted).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::check::short;
use super::routine::kept_on_purpose;
use super::world::{Snapshot, World, attempt, cleanup_template, looks_like_cleanup, phase};

const POLL: Duration = Duration::from_millis(500);
/// How long a pod of a deleted StatefulSet may stay before the runner deletes it.
const DANGLING_GRACE: Duration = Duration::from_secs(30);

/// Why the cluster is not quiescent yet: cleanup pods left (invariant 3), anything else.
#[derive(Default, Debug)]
pub struct Unsettled {
    pub cleanup_pods: Vec<String>,
    pub other: Vec<String>,
}

impl Unsettled {
    pub fn is_empty(&self) -> bool {
        self.cleanup_pods.is_empty() && self.other.is_empty()
    }
}

impl World {
    /// Deletes the forged pods, scales every set to `finals`, and waits until the controllers
    /// are idle: no cleanup pod left (a given-up pod of the failing set on an orphaned ordinal
    /// excepted), no orphaned claim left (the failing set's stay, each under a given-up pod),
    /// every wanted pod ready. Returns how long it took, or what was still unsettled at `timeout`.
    pub async fn quiesce(
        &mut self,
        finals: &[i32],
        timeout: Duration,
    ) -> Result<Duration, Unsettled> {
        for (i, &n) in finals.iter().enumerate() {
            if let Err(e) = self.scale(i, n).await {
                eprintln!("chaos: {e}");
            }
        }
        let t0 = Instant::now();
        loop {
            self.controllers.revive();
            self.top_up_pvs(false).await;
            let doomed = self.doomed_left().await;
            let unsettled = match self.snapshot().await {
                Ok(snap) => {
                    self.create_missing(&snap).await;
                    self.retire_forged(&snap).await;
                    self.clear_simulator_artifacts(&snap).await;
                    self.collect_dangling(&snap).await;
                    self.release_failed_wanted(&snap).await;
                    self.retire_previous_sets_pods(&snap).await;
                    let mut unsettled = self.unsettled(&snap);
                    unsettled
                        .other
                        .extend(doomed.into_iter().map(|d| format!("{d} not gone")));
                    self.nudge_unready(&snap).await;
                    self.touch_forgotten_claims(&snap).await;
                    unsettled
                }
                Err(e) => Unsettled {
                    other: vec![format!("cannot list: {e}")],
                    ..Unsettled::default()
                },
            };
            if unsettled.is_empty() {
                return Ok(t0.elapsed());
            }
            let dead = crate::support::dead_components();
            if t0.elapsed() >= timeout || !dead.is_empty() {
                return Err(unsettled);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A forged pod gets 5 s after it finished (more than a leader takeover) for the controller to
    /// (mis)handle it, then a user
    /// deletes it: the StatefulSet cannot bring its ordinal back while it holds the name.
    pub async fn retire_forged(&mut self, snap: &Snapshot) {
        let mut keep = Vec::new();
        for (set, name, uid) in std::mem::take(&mut self.live_forged) {
            let Some(pod) = snap.pods.iter().find(|p| p.uid().as_deref() == Some(&uid)) else {
                continue;
            };
            if !matches!(phase(pod), "Succeeded" | "Failed") {
                keep.push((set, name, uid));
                continue;
            }
            let finished = *self
                .forged_finished
                .entry(uid.clone())
                .or_insert_with(Instant::now);
            if finished.elapsed() >= Duration::from_secs(5) {
                self.delete_pod(set, &name, Some(&uid)).await;
            } else {
                keep.push((set, name, uid));
            }
        }
        self.live_forged = keep;
    }

    /// KWOK patches a pod's status by name: a patch computed for a pod that was deleted a moment
    /// ago (a forged pod the controller removed) can land on the cleanup pod the controller created
    /// under the same name, which then reports Running while still gated, with no node. No kubelet
    /// does that, and no node will ever finish it; a user deletes it (the set's bound grows by one
    /// create), and the run prints it.
    async fn clear_simulator_artifacts(&mut self, snap: &Snapshot) {
        for pod in snap.pods.iter().filter(|p| {
            looks_like_cleanup(p)
                && phase(p) == "Running"
                && p.spec.as_ref().is_none_or(|s| s.node_name.is_none())
                && p.metadata.deletion_timestamp.is_none()
        }) {
            let ns = pod.namespace().unwrap_or_default();
            let Some((set, _)) = self.owner_of(&ns, &pod.name_any(), false) else {
                continue;
            };
            println!(
                "chaos: SIMULATOR: pod {ns}/{} uid {} reports Running with no node (KWOK's status \
                 patch of a deleted pod of that name); deleted as a user would",
                pod.name_any(),
                pod.uid().unwrap_or_default()
            );
            self.delete_pod(set, &pod.name_any(), pod.uid().as_deref())
                .await;
            let def = &self.sets[set];
            self.namespaces[def.ns].allow_more_cleanup_creates(
                def.name,
                1,
                "the chaos runner deleted a pod KWOK marked Running without a node",
            );
        }
    }

    /// kube-controller-manager's StatefulSet controller, its informers behind after an API server
    /// restart, can create a pod for a set that was deleted a moment before; its garbage collector,
    /// behind as well, then leaves that pod for minutes, and the set created again under the name
    /// cannot get its ordinal back (our controller rightly keeps the claims the pod mounts). A pod
    /// owned by a StatefulSet UID that no longer exists, still there after [`DANGLING_GRACE`], is
    /// deleted as a user would, and the run prints it.
    async fn collect_dangling(&mut self, snap: &Snapshot) {
        let live: HashSet<String> = snap.sets.iter().filter_map(|s| s.uid()).collect();
        let mut seen = HashMap::new();
        for pod in &snap.pods {
            let owner = pod.owner_references().iter().find(|o| {
                o.kind == "StatefulSet" && o.controller == Some(true) && !live.contains(&o.uid)
            });
            let (Some(owner), Some(uid)) = (owner, pod.uid()) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let since = self
                .dangling_since
                .get(&uid)
                .copied()
                .unwrap_or_else(Instant::now);
            seen.insert(uid.clone(), since);
            let ns = pod.namespace().unwrap_or_default();
            let Some((set, _)) = self.owner_of(&ns, &pod.name_any(), false) else {
                continue;
            };
            if since.elapsed() >= DANGLING_GRACE {
                println!(
                    "chaos: CONTROL PLANE: pod {ns}/{} uid {uid} of deleted StatefulSet uid {} still \
                     there after {DANGLING_GRACE:?} (kube-controller-manager behind); deleted as a \
                     user would",
                    pod.name_any(),
                    owner.uid
                );
                self.delete_pod(set, &pod.name_any(), Some(&uid)).await;
            }
        }
        self.dangling_since = seen;
    }

    /// A set that a deletion of a round took longer than the round to remove is created again
    /// when it is gone (the round reported the stall).
    async fn create_missing(&mut self, snap: &Snapshot) {
        for i in 0..self.sets.len() {
            let ns = &self.ns_names[self.sets[i].ns];
            let there = snap
                .sets
                .iter()
                .any(|s| s.name_any() == self.sets[i].name && s.namespace().as_ref() == Some(ns));
            if !there {
                let created = self.create_set(i, self.replicas[i]).await;
                eprintln!(
                    "chaos: {} was gone; created again: {:?}",
                    self.sets[i].name,
                    created.map(|s| s.uid())
                );
            }
        }
    }

    /// The StatefulSet controller backs off (up to minutes) while a pod it does not own holds an
    /// ordinal's name, and the pod's deletion does not wake it: touch the sets that lack pods.
    async fn nudge_unready(&mut self, snap: &Snapshot) {
        if self
            .last_nudge
            .is_some_and(|t| t.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.last_nudge = Some(Instant::now());
        for (i, def) in self.sets.iter().enumerate() {
            let ns = &self.ns_names[def.ns];
            let lacking = snap.sets.iter().any(|s| {
                s.name_any() == def.name
                    && s.namespace().as_deref() == Some(ns)
                    && s.status.as_ref().map_or(0, |st| st.replicas) < self.replicas[i]
            });
            if lacking {
                let patch = json!({"metadata": {"annotations": {
                    "chaos.scaledown.io/nudge": self.nudges.to_string()}}});
                self.nudges += 1;
                let _ = self
                    .api::<StatefulSet>(i)
                    .patch(def.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        }
    }

    /// After an API server restart, kube-controller-manager's pvc-protection controller can miss
    /// the deletion of the last pod using a claim and leave the claim Terminating for good (seed
    /// 20261124, round 187: more than 4 minutes; touching the claim made it go in 160 ms). The
    /// controller under test has done its part (it requested the deletion); a claim Terminating for
    /// 15 s with no pod using it is touched so pvc-protection looks at it again, and the run says so.
    async fn touch_forgotten_claims(&mut self, snap: &Snapshot) {
        let now = k8s_openapi::jiff::Timestamp::now();
        for claim in &snap.claims {
            let Some(since) = claim.metadata.deletion_timestamp.as_ref() else {
                continue;
            };
            let uid = claim.uid().unwrap_or_default();
            let name = claim.name_any();
            let ns = claim.namespace().unwrap_or_default();
            let used = snap.pods.iter().any(|p| {
                p.namespace().as_deref() == Some(&ns)
                    && p.spec
                        .iter()
                        .flat_map(|s| s.volumes.iter().flatten())
                        .any(|v| {
                            v.persistent_volume_claim
                                .as_ref()
                                .is_some_and(|c| c.claim_name == name)
                        })
            });
            let stuck = now.duration_since(since.0).as_secs() >= 15;
            if used || !stuck || !self.touched_claims.insert(uid) {
                continue;
            }
            eprintln!(
                "chaos: control plane: claim {ns}/{name} Terminating since {} with no pod using it (pvc-protection missed it); touched it",
                since.0
            );
            let patch = json!({"metadata": {"annotations": {"chaos.scaledown.io/touch": "1"}}});
            let api: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
                kube::Api::namespaced(self.client(), &ns);
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    }

    /// A failed cleanup pod stays on an ordinal that is wanted again: a user deletes it so the
    /// set can bring the ordinal back (docs/usage.md, "Scale-up during a cleanup"). Not while
    /// the set is being deleted: then no ordinal is wanted, and deleting the pod would only start
    /// a new series of cleanups that fail again.
    async fn release_failed_wanted(&self, snap: &Snapshot) {
        let deleting: HashSet<(String, String)> = snap
            .sets
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_some())
            .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
            .collect();
        for pod in snap
            .pods
            .iter()
            .filter(|p| looks_like_cleanup(p) && phase(p) == "Failed")
        {
            let ns = pod.namespace().unwrap_or_default();
            if let Some((set, ordinal)) = self.owner_of(&ns, &pod.name_any(), false)
                && (ordinal as i32) < self.replicas[set]
                && pod.metadata.deletion_timestamp.is_none()
                && !deleting.contains(&(ns.clone(), self.sets[set].name.to_string()))
            {
                self.delete_pod(set, &pod.name_any(), pod.uid().as_deref())
                    .await;
            }
        }
    }

    /// A failed cleanup pod older than the set that now has its name (the set was deleted with
    /// orphan propagation and created again while that pod's series was cut short) is not the new
    /// set's: the controller keeps it and warns `UnprovenCleanupPod` (docs/usage.md), and it holds
    /// its ordinal's name. A user reading the Warning deletes it; so does the runner, and says so.
    async fn retire_previous_sets_pods(&self, snap: &Snapshot) {
        for pod in snap
            .pods
            .iter()
            .filter(|p| looks_like_cleanup(p) && phase(p) == "Failed")
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let ns = pod.namespace().unwrap_or_default();
            let Some((set, _)) = self.owner_of(&ns, &pod.name_any(), false) else {
                continue;
            };
            let name = self.sets[set].name;
            let Some(current) = snap
                .sets
                .iter()
                .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == name)
            else {
                continue;
            };
            let (Some(born), Some(set_born)) = (
                pod.metadata.creation_timestamp.as_ref(),
                current.metadata.creation_timestamp.as_ref(),
            ) else {
                continue;
            };
            if born.0 < set_born.0 {
                println!(
                    "chaos: deleting failed cleanup pod {ns}/{} uid {}: it is older than the set {name} now there (a previous set's, cut short by an orphan deletion)",
                    pod.name_any(),
                    short(pod.uid().as_deref().unwrap_or_default())
                );
                self.delete_pod(set, &pod.name_any(), pod.uid().as_deref())
                    .await;
            }
        }
    }

    /// The set and ordinal of a claim: the set whose `app` label it carries if its names fit,
    /// else the first whose names fit.
    fn claim_set(&self, claim: &PersistentVolumeClaim) -> Option<(usize, u32)> {
        let ns = claim.namespace().unwrap_or_default();
        let owners = self.claim_owners(&ns, &claim.name_any());
        let app = claim.labels().get("app").map(String::as_str);
        owners
            .iter()
            .find(|(i, _)| Some(self.sets[*i].name) == app)
            .or(owners.first())
            .copied()
    }

    /// The ordinals the controller leaves alone on purpose, whole (namespace, set, ordinal): one of
    /// their claims is another object's or a set's that keeps its claims (every set whose names
    /// fit it), or (`in_use`) its name also fits another set that still uses that ordinal.
    fn left_alone(
        &self,
        claims: &[PersistentVolumeClaim],
        in_use: bool,
    ) -> HashSet<(String, usize, u32)> {
        let mut out = HashSet::new();
        for claim in claims {
            let ns = claim.namespace().unwrap_or_default();
            let owners = self.claim_owners(&ns, &claim.name_any());
            if kept_on_purpose(claim, &self.sets) {
                out.extend(owners.iter().map(|&(i, n)| (ns.clone(), i, n)));
            } else if let Some((set, ordinal)) = self.claim_set(claim)
                && in_use
                && owners
                    .iter()
                    .any(|&(j, n)| j != set && (n as i32) < self.replicas[j])
            {
                out.insert((ns.clone(), set, ordinal));
            }
        }
        out
    }

    fn unsettled(&self, snap: &Snapshot) -> Unsettled {
        let mut out = Unsettled::default();
        let given_up = |p: &Pod| phase(p) == "Failed" && attempt(p) >= 2;
        for pod in snap.pods.iter().filter(|p| looks_like_cleanup(p)) {
            let ns = pod.namespace().unwrap_or_default();
            let owner = self.owner_of(&ns, &pod.name_any(), false);
            let allowed = owner.is_some_and(|(set, ordinal)| {
                self.sets[set].failing && ordinal as i32 >= self.replicas[set] && given_up(pod)
            });
            if !allowed {
                let forged = self.forged.contains(&pod.uid().unwrap_or_default());
                out.cleanup_pods.push(format!(
                    "{}cleanup pod {ns}/{} uid {} phase {} attempt {}{}",
                    if forged { "FORGED " } else { "" },
                    pod.name_any(),
                    super::check::short(&pod.uid().unwrap_or_default()),
                    phase(pod),
                    attempt(pod),
                    if pod.metadata.deletion_timestamp.is_some() {
                        " (terminating)"
                    } else {
                        ""
                    },
                ));
            }
        }
        let left_alone = self.left_alone(&snap.claims, true);
        for claim in &snap.claims {
            let ns = claim.namespace().unwrap_or_default();
            let Some((set, ordinal)) = self.claim_set(claim) else {
                continue;
            };
            if left_alone.contains(&(ns.clone(), set, ordinal)) {
                continue;
            }
            if ordinal as i32 >= self.replicas[set] {
                let def = &self.sets[set];
                let held = snap.pods.iter().any(|p| {
                    p.name_any() == format!("{}-{ordinal}", def.name)
                        && p.namespace().as_deref() == Some(&ns)
                        && given_up(p)
                });
                if !(def.failing && held) {
                    out.other.push(format!(
                        "orphaned claim {ns}/{} not cleaned",
                        claim.name_any()
                    ));
                }
            }
        }
        for (i, def) in self.sets.iter().enumerate() {
            let ns = &self.ns_names[def.ns];
            let set = snap
                .sets
                .iter()
                .find(|s| s.name_any() == def.name && s.namespace().as_deref() == Some(ns));
            let status = set.and_then(|s| s.status.as_ref());
            let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
            let pods = status.map_or(0, |s| s.replicas);
            let observed = set.is_some_and(|s| {
                status.and_then(|st| st.observed_generation) == s.metadata.generation
            });
            if !observed || ready != self.replicas[i] || pods != self.replicas[i] {
                out.other.push(format!(
                    "{} has {pods} pods, {ready} ready, wants {}",
                    def.name, self.replicas[i]
                ));
            }
        }
        out
    }

    /// Invariant (4): every set can be deleted. The failing set's template is fixed first (its
    /// cleanups could never succeed, so its finalizer could never go) and its given-up pods are
    /// deleted; then every set is deleted with background propagation and must be gone within
    /// `timeout`, with no claim of it left. Returns the problems.
    pub async fn delete_all(&mut self, timeout: Duration) -> Vec<String> {
        let mut problems = Vec::new();
        self.delete_forged().await;
        let fixed = json!({"metadata": {"annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": cleanup_template(false)}}});
        for i in 0..self.sets.len() {
            if self.sets[i].failing {
                let patched = self
                    .api::<StatefulSet>(i)
                    .patch(
                        self.sets[i].name,
                        &PatchParams::default(),
                        &Patch::Merge(&fixed),
                    )
                    .await;
                if let Err(e) = patched {
                    problems.push(format!(
                        "cannot fix the template of {}: {e}",
                        self.sets[i].name
                    ));
                }
            }
        }
        if let Ok(snap) = self.snapshot().await {
            for pod in snap
                .pods
                .iter()
                .filter(|p| looks_like_cleanup(p) && phase(p) == "Failed")
            {
                let ns = pod.namespace().unwrap_or_default();
                if let Some((set, _)) = self.owner_of(&ns, &pod.name_any(), false) {
                    self.delete_pod(set, &pod.name_any(), pod.uid().as_deref())
                        .await;
                    // Deleting a given-up pod starts a new series (docs/usage.md), in the same
                    // generation: attempt 1 runs again, by design.
                    let def = &self.sets[set];
                    self.namespaces[def.ns].allow_more_cleanup_creates(
                        def.name,
                        1,
                        "the chaos runner deleted a given-up cleanup pod to let the set be deleted",
                    );
                }
            }
        }
        for i in 0..self.sets.len() {
            let api = self.api::<StatefulSet>(i);
            if let Ok(Some(set)) = api.get_opt(self.sets[i].name).await {
                self.background_sets.insert(set.uid().unwrap_or_default());
            }
            let deleted = api
                .delete(self.sets[i].name, &DeleteParams::background())
                .await;
            if let Err(e) = deleted {
                problems.push(format!("cannot delete {}: {e}", self.sets[i].name));
            }
        }
        problems.extend(self.wait_sets_gone(timeout).await);
        problems
    }

    /// Waits until no StatefulSet is left; returns what was left at `timeout`, or the claims
    /// that outlived their sets.
    async fn wait_sets_gone(&mut self, timeout: Duration) -> Vec<String> {
        let mut problems = Vec::new();
        let t0 = Instant::now();
        loop {
            self.controllers.revive();
            let snap = match self.snapshot().await {
                Ok(snap) => snap,
                Err(_) => {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            let left: Vec<String> = snap
                .sets
                .iter()
                .map(|s| self.describe_left(s, &snap))
                .collect();
            if left.is_empty() {
                let left_alone = self.left_alone(&snap.claims, false);
                problems.extend(
                    snap.claims
                        .iter()
                        .filter(|c| {
                            let ns = c.namespace().unwrap_or_default();
                            c.metadata.deletion_timestamp.is_none()
                                && !kept_on_purpose(c, &self.sets)
                                && !self
                                    .claim_set(c)
                                    .is_some_and(|(i, n)| left_alone.contains(&(ns, i, n)))
                        })
                        .map(|c| {
                            format!(
                                "claim {}/{} outlived its set",
                                c.namespace().unwrap_or_default(),
                                c.name_any()
                            )
                        }),
                );
                println!(
                    "chaos: every set deleted in {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
                return problems;
            }
            if t0.elapsed() >= timeout {
                problems.extend(
                    left.into_iter()
                        .map(|l| format!("not deleted after {timeout:?}: {l}")),
                );
                return problems;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn describe_left(&self, set: &StatefulSet, snap: &Snapshot) -> String {
        let ns = set.namespace().unwrap_or_default();
        let prefix = format!("{}-", set.name_any());
        let pods: Vec<String> = snap
            .pods
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(&ns) && p.name_any().starts_with(&prefix))
            .map(|p| format!("{} {}", p.name_any(), phase(p)))
            .collect();
        format!(
            "StatefulSet {ns}/{} finalizers {:?}, pods [{}]",
            set.name_any(),
            set.finalizers(),
            pods.join(", ")
        )
    }
}
