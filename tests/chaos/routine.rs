//! Routine operations of users on the sets: deletion with each propagation and re-creation under
//! the same name, scale to zero and back, claims made by hand or owned by another object, and the
//! deletion of a whole namespace.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use serde_json::json;

use super::check::short;
use super::plan::Propagation;
use super::world::{World, cleanup_template};
use crate::support::fixtures::SetSpec;
use crate::support::{from_json, unique_name};

/// How long a deleted set may take to go (its cleanups included) before the round calls it a
/// stall (invariant 4).
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the failing set's deletion may wait on its cleanups before the runner gives up on
/// them as a user would (a deletion nothing proves cleans the ordinals past `replicas`).
const GIVE_UP_AFTER: Duration = Duration::from_secs(20);
/// The ConfigMap that owns the foreign claims of a namespace.
const FOREIGN_OWNER: &str = "foreign-owner";

impl World {
    /// Deletes set `set` with `how`, waits until it is gone, and creates it again with the same
    /// name and size. A set that does not go is a stall: the note starts with `STALL`.
    pub async fn recreate(&mut self, set: usize, how: Propagation) -> String {
        let name = self.sets[set].name;
        let api = self.api::<StatefulSet>(set);
        let uid = match api.get_opt(name).await {
            Ok(Some(s)) => s.uid().unwrap_or_default(),
            Ok(None) => return format!("{name} is not there"),
            Err(e) => return format!("cannot read {name}: {e}"),
        };
        let policy = match how {
            Propagation::Orphan => PropagationPolicy::Orphan,
            Propagation::Foreground => PropagationPolicy::Foreground,
            Propagation::Background => PropagationPolicy::Background,
        };
        if how == Propagation::Background {
            self.background_sets.insert(uid.clone());
        }
        let params = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = api.delete(name, &params).await {
            return format!("delete {name} ({how:?}) failed: {e}");
        }
        let t0 = Instant::now();
        let mut gave_up = None;
        loop {
            self.controllers.revive();
            // A forged pod holds its ordinal's name: a user deletes it once it finished.
            if let Ok(snap) = self.snapshot().await {
                self.retire_forged(&snap).await;
            }
            if gave_up.is_none() && self.sets[set].failing && t0.elapsed() >= GIVE_UP_AFTER {
                gave_up = Some(self.give_up_cleanups(set).await);
            }
            match api.get_opt(name).await {
                Ok(None) => break,
                Ok(Some(s)) if s.uid().as_deref() != Some(uid.as_str()) => break,
                _ if t0.elapsed() >= GONE_TIMEOUT => {
                    return format!(
                        "STALL: {name} ({how:?} deletion) still there after {GONE_TIMEOUT:?}"
                    );
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        let gone = t0.elapsed().as_secs_f64();
        let gave_up = gave_up.map_or(String::new(), |note| format!(" ({note})"));
        match self.create_set(set, self.replicas[set]).await {
            Ok(new) => format!(
                "{how:?}-deleted {name} uid {} in {gone:.1} s{gave_up}, created again uid {}",
                short(&uid),
                short(&new.uid().unwrap_or_default())
            ),
            Err(e) => format!("HARNESS: {e}"),
        }
    }

    /// What a user does when the failing set's deletion waits on cleanups that never succeed
    /// (docs/usage.md, "To give up on cleanup"): removes the template annotation, after which
    /// the finalizer goes once no cleanup runs. The set's deletion could not be proven an orphan
    /// deletion (no pod of it left), so its ordinals past `replicas` are cleaned as after a
    /// scale-down, and with this set's template that never ends.
    async fn give_up_cleanups(&mut self, set: usize) -> String {
        let name = self.sets[set].name;
        let patch = json!({"metadata": {"annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": null}}});
        let patched = self
            .api::<StatefulSet>(set)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        match patched {
            Ok(_) => format!(
                "its cleanups never succeed: template annotation removed after {GIVE_UP_AFTER:?}"
            ),
            Err(e) => format!("template annotation not removed: {e}"),
        }
    }

    /// Scales a set to 0 and, `back_after` ms later, back to its size.
    pub async fn zero_and_back(&mut self, set: usize, back_after: u64) -> String {
        let size = self.replicas[set];
        if let Err(e) = self.scale(set, 0).await {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(back_after)).await;
        match self.scale(set, size).await {
            Ok(()) => format!("{}=0, {back_after} ms later ={size}", self.sets[set].name),
            Err(e) => e,
        }
    }

    /// A claim named for ordinal `ordinal` of the set's first claim template: made by hand (no
    /// owner, no labels), or (`foreign`) owned by a ConfigMap.
    pub async fn make_claim(&mut self, set: usize, ordinal: i32, foreign: bool) -> String {
        let def = self.sets[set].clone();
        let name = format!("{}-{}-{ordinal}", def.claim_templates[0], def.name);
        let mut claim = json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": self.class,
                     "resources": {"requests": {"storage": "1Gi"}}}
        });
        if foreign {
            let owner = match self.foreign_owner(set).await {
                Ok(uid) => uid,
                Err(e) => return format!("HARNESS: {e}"),
            };
            claim["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1",
                "kind": "ConfigMap", "name": FOREIGN_OWNER, "uid": owner}]);
        }
        let claim: PersistentVolumeClaim = from_json(claim);
        let what = if foreign {
            "foreign-owned"
        } else {
            "hand-made"
        };
        match self
            .api::<PersistentVolumeClaim>(set)
            .create(&PostParams::default(), &claim)
            .await
        {
            Ok(c) => format!(
                "{what} claim {name} uid {}",
                short(&c.uid().unwrap_or_default())
            ),
            Err(kube::Error::Api(e)) if e.code == 409 => format!("{name} exists already"),
            Err(e) => format!("HARNESS: creating {what} claim {name}: {e}"),
        }
    }

    /// The UID of the set's namespace's ConfigMap `foreign-owner`, created on first use.
    async fn foreign_owner(&mut self, set: usize) -> Result<String, String> {
        let ns = self.sets[set].ns;
        if let Some(uid) = self.foreign_owners.get(&ns) {
            return Ok(uid.clone());
        }
        let cm: ConfigMap = from_json(json!({"metadata": {"name": FOREIGN_OWNER}}));
        let cm = self
            .api::<ConfigMap>(set)
            .create(&PostParams::default(), &cm)
            .await
            .map_err(|e| format!("cannot create ConfigMap {FOREIGN_OWNER}: {e}"))?;
        let uid = cm.uid().unwrap_or_default();
        self.foreign_owners.insert(ns, uid.clone());
        Ok(uid)
    }

    /// A namespace of its own with an opted-in Parallel set of `replicas`, deleted whole once
    /// the set's claims exist. Quiescing waits until it is gone.
    pub async fn delete_namespace(&mut self, replicas: i32) -> String {
        let name = unique_name("chaos-gone");
        let namespaces: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = from_json(json!({
            "metadata": {"name": name, "labels": {"scaledown.e2e/test": "true"}}
        }));
        if let Err(e) = namespaces.create(&PostParams::default(), &ns).await {
            return format!("HARNESS: cannot create namespace {name}: {e}");
        }
        self.doomed.push(name.clone());
        let mut spec = SetSpec::new("web", replicas, &self.class);
        spec.template = Some(cleanup_template(false));
        spec.parallel = true;
        let sets: Api<StatefulSet> = Api::namespaced(self.client(), &name);
        // A new namespace's default ServiceAccount comes a moment later; pods wait for it.
        let t0 = Instant::now();
        let mut created = sets.create(&PostParams::default(), &spec.build()).await;
        while created.is_err() && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            created = sets.create(&PostParams::default(), &spec.build()).await;
        }
        if let Err(e) = created {
            return format!("HARNESS: cannot create web in {name}: {e}");
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), &name);
        while t0.elapsed() < Duration::from_secs(15) {
            let n = claims
                .list(&Default::default())
                .await
                .map_or(0, |l| l.items.len());
            if n >= replicas as usize {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        match namespaces.delete(&name, &DeleteParams::default()).await {
            Ok(_) => format!(
                "namespace {name} with web={replicas} deleted after {:.1} s",
                t0.elapsed().as_secs_f64()
            ),
            Err(e) => format!("HARNESS: cannot delete namespace {name}: {e}"),
        }
    }

    /// The deleted namespaces still there (and forgets the ones gone).
    pub async fn doomed_left(&mut self) -> Vec<String> {
        let namespaces: Api<Namespace> = Api::all(self.client());
        let mut left = Vec::new();
        for name in std::mem::take(&mut self.doomed) {
            match namespaces.get_opt(&name).await {
                Ok(None) => {}
                Ok(Some(ns)) => {
                    let phase = ns.status.and_then(|s| s.phase).unwrap_or_default();
                    left.push(format!("namespace {name} ({phase})"));
                    self.doomed.push(name);
                }
                Err(_) => self.doomed.push(name),
            }
        }
        left
    }
}

/// Whether a claim must stay whatever its name says: another object owns it, or it carries the
/// labels of a set that does not take part (kept on purpose).
pub fn kept_on_purpose(claim: &PersistentVolumeClaim, sets: &[super::plan::SetDef]) -> bool {
    let foreign = claim
        .owner_references()
        .iter()
        .any(|r| r.kind != "StatefulSet");
    let app = claim.labels().get("app").map(String::as_str);
    foreign || sets.iter().any(|s| !s.opted_in && Some(s.name) == app)
}
