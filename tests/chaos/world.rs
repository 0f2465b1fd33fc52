//! The cluster side of the run: namespaces, PVs, StatefulSets, the two elected controller
//! instances, and live snapshots.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::perturb::{Pids, Proxies};
use super::plan::{INSTANCES, SetDef, instance_name};
use super::record::{ATTEMPT, CLEANUP_LABEL, OWNER, Recorder};
use crate::support::fixtures::{Controller, SetSpec, template};
use crate::support::{CLASS_LABEL, Cluster, Reclaim, TestNamespace, create_static_pvs_from};

pub const LEASE: &str = "chaos-leader";
/// Available PVs kept in the class: claims of scale-ups bind at once.
const SPARE_PVS: usize = 16;

/// What the cleanup container runs: a script as people write them, with `&&`, `|`, `>` and `2>&1`
/// (KWOK runs nothing, but the template must pass through the controller's record unchanged).
pub const CLEANUP_SCRIPT: &str = "cd /var/data && tar -cf - . 2>&1 | gzip > /tmp/ordinal-$SCALEDOWN_ORDINAL.tgz && rm -rf /var/data/* > /dev/null 2>&1";

/// The cleanup template of a set: succeeds (or, for the failing set, fails) 1 s after it runs.
pub fn cleanup_template(failing: bool) -> String {
    let labels = if failing {
        json!({"sim.scaledown.io/outcome": "Failed"})
    } else {
        json!({})
    };
    let mut pod: serde_json::Value = serde_json::from_str(&template(
        labels,
        json!({"sim.scaledown.io/after": "1s"}),
        "Never",
    ))
    .expect("the fixture template is JSON");
    pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", CLEANUP_SCRIPT]);
    pod.to_string()
}

pub struct World {
    pub cluster: Cluster,
    pub namespaces: Vec<TestNamespace>,
    pub ns_names: Vec<String>,
    pub sets: Vec<SetDef>,
    pub class: String,
    pv_next: usize,
    last_top_up: Option<Instant>,
    /// `spec.replicas` as the runner last wrote it.
    pub replicas: Vec<i32>,
    pub controllers: Controllers,
    /// UIDs of every forged pod, and the ones not deleted yet.
    pub forged: HashSet<String>,
    pub live_forged: Vec<(usize, String, String)>,
    /// When the runner first saw each forged pod finished.
    pub forged_finished: HashMap<String, Instant>,
    /// Pods whose owning StatefulSet is gone, by UID: when the runner first saw each.
    pub dangling_since: HashMap<String, Instant>,
    pub last_nudge: Option<Instant>,
    pub nudges: u64,
    /// Claims touched because kube-controller-manager's pvc-protection left them Terminating with
    /// no pod using them (by UID).
    pub touched_claims: HashSet<String>,
    pub recorder: Recorder,
    pub watches: Vec<tokio::task::JoinHandle<()>>,
    /// The controllers' Sieve proxies, and the PIDs of the instances behind them.
    pub proxies: Proxies,
    pub pids: Pids,
    /// UIDs of the sets the runner deleted with background propagation (their stateful pods are
    /// the controller's to delete).
    pub background_sets: HashSet<String>,
    /// Per namespace index, the UID of the ConfigMap that owns the foreign claims.
    pub foreign_owners: HashMap<usize, String>,
    /// Namespaces the runner deleted that were not gone yet at the last look.
    pub doomed: Vec<String>,
}

impl World {
    pub async fn setup(sets: Vec<SetDef>, recorder: Recorder) -> World {
        let cluster = Cluster::connect().await;
        let namespaces = vec![
            cluster.namespace("chaos-a").await,
            cluster.namespace("chaos-b").await,
        ];
        let ns_names: Vec<String> = namespaces.iter().map(|n| n.name.clone()).collect();
        let pvs = namespaces[0]
            .create_static_pvs("pv", 0, Reclaim::Delete)
            .await;
        let watches = recorder.watch_all(&cluster.client, &ns_names);
        let proxies = Proxies::start(&cluster.kubeconfig, recorder.start()).await;
        let pids = Pids::default();
        let kubeconfigs = (0..INSTANCES).map(|i| proxies.kubeconfig(i)).collect();
        let controllers = Controllers::start(kubeconfigs, &ns_names[0], pids.clone());
        let replicas = sets.iter().map(|s| s.initial).collect();
        let mut world = World {
            cluster,
            namespaces,
            ns_names,
            sets,
            class: pvs.class,
            pv_next: 0,
            last_top_up: None,
            replicas,
            controllers,
            forged: HashSet::new(),
            live_forged: Vec::new(),
            forged_finished: HashMap::new(),
            dangling_since: HashMap::new(),
            last_nudge: None,
            nudges: 0,
            touched_claims: HashSet::new(),
            recorder,
            watches,
            proxies,
            pids,
            background_sets: HashSet::new(),
            foreign_owners: HashMap::new(),
            doomed: Vec::new(),
        };
        world.top_up_pvs(true).await;
        for i in 0..world.sets.len() {
            let replicas = world.sets[i].initial;
            if let Err(e) = world.create_set(i, replicas).await {
                panic!("chaos: {e}");
            }
        }
        world
    }

    pub fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    pub fn api<K>(&self, set: usize) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client(), &self.ns_names[self.sets[set].ns])
    }

    /// Creates set `i` with `replicas`; the set as the API server returned it is recorded.
    pub async fn create_set(&self, i: usize, replicas: i32) -> Result<StatefulSet, String> {
        let def = &self.sets[i];
        let mut spec = SetSpec::new(def.name, replicas, &self.class);
        spec.template = def.opted_in.then(|| cleanup_template(def.failing));
        spec.claim_templates = def.claim_templates;
        spec.parallel = def.parallel;
        let set = self
            .api::<StatefulSet>(i)
            .create(&PostParams::default(), &spec.build())
            .await
            .map_err(|e| format!("cannot create StatefulSet {}: {e}", def.name))?;
        self.recorder.written(&set);
        Ok(set)
    }

    /// Patches `spec.replicas` of set `i` and records the write.
    pub async fn scale(&mut self, i: usize, replicas: i32) -> Result<(), String> {
        let patch = json!({"spec": {"replicas": replicas}});
        let set = self
            .api::<StatefulSet>(i)
            .patch(
                self.sets[i].name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("scale {} failed: {e}", self.sets[i].name))?;
        self.recorder.written(&set);
        self.replicas[i] = replicas;
        Ok(())
    }

    /// Keeps `SPARE_PVS` PVs of the class Available (claims use PVs up: a deleted claim's PV is
    /// deleted with it). Rate-limited to one look every 2 s unless `now`.
    pub async fn top_up_pvs(&mut self, now: bool) {
        if !now
            && self
                .last_top_up
                .is_some_and(|t| t.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.last_top_up = Some(Instant::now());
        let api: Api<PersistentVolume> = Api::all(self.client());
        let selector = format!("{CLASS_LABEL}={}", self.class);
        let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
            return;
        };
        let available = list
            .items
            .iter()
            .filter(|pv| {
                pv.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_none_or(|p| p == "Available" || p == "Pending")
            })
            .count();
        if available < SPARE_PVS {
            let n = SPARE_PVS - available;
            create_static_pvs_from(
                &self.client(),
                &self.class,
                self.pv_next,
                n,
                Reclaim::Delete,
            )
            .await;
            self.pv_next += n;
        }
    }

    /// Live pods, claims and sets of both namespaces.
    pub async fn snapshot(&self) -> Result<Snapshot, kube::Error> {
        let mut snap = Snapshot::default();
        for ns in &self.ns_names {
            let pods: Api<Pod> = Api::namespaced(self.client(), ns);
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), ns);
            let sets: Api<StatefulSet> = Api::namespaced(self.client(), ns);
            let lp = ListParams::default();
            snap.pods.extend(pods.list(&lp).await?.items);
            snap.claims.extend(claims.list(&lp).await?.items);
            snap.sets.extend(sets.list(&lp).await?.items);
        }
        Ok(snap)
    }

    /// Deletes a pod by UID (a newer pod of the same name is never touched); grace 0.
    pub async fn delete_pod(&self, set: usize, name: &str, uid: Option<&str>) -> bool {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: uid.map(|u| Preconditions {
                uid: Some(u.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.api::<Pod>(set).delete(name, &params).await.is_ok()
    }

    /// Every set and ordinal whose claim names fit the claim `name` in namespace `ns`
    /// (`data` + `my-db` and `data-my` + `db` both fit `data-my-db-N`).
    pub fn claim_owners(&self, ns: &str, name: &str) -> Vec<(usize, u32)> {
        (0..self.sets.len())
            .filter_map(|i| self.owner_among(i..i + 1, ns, name, true))
            .collect()
    }

    /// Which set and ordinal a pod or claim named `name` in namespace `ns` belongs to.
    pub fn owner_of(&self, ns: &str, name: &str, claim: bool) -> Option<(usize, u32)> {
        self.owner_among(0..self.sets.len(), ns, name, claim)
    }

    fn owner_among(
        &self,
        among: std::ops::Range<usize>,
        ns: &str,
        name: &str,
        claim: bool,
    ) -> Option<(usize, u32)> {
        self.sets[among.clone()]
            .iter()
            .zip(among)
            .find_map(|(s, i)| {
                if self.ns_names[s.ns] != ns {
                    return None;
                }
                let ordinal = |rest: &str| {
                    let n = rest.strip_prefix(s.name)?.strip_prefix('-')?;
                    n.parse::<u32>()
                        .ok()
                        .filter(|_| n == "0" || !n.starts_with('0'))
                };
                if claim {
                    s.claim_templates
                        .iter()
                        .find_map(|t| ordinal(name.strip_prefix(t)?.strip_prefix('-')?))
                        .map(|n| (i, n))
                } else {
                    ordinal(name).map(|n| (i, n))
                }
            })
    }
}

#[derive(Default)]
pub struct Snapshot {
    pub pods: Vec<Pod>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub sets: Vec<StatefulSet>,
}

pub fn looks_like_cleanup(pod: &Pod) -> bool {
    pod.labels().contains_key(CLEANUP_LABEL) || pod.annotations().contains_key(OWNER)
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("none")
}

pub fn attempt(pod: &Pod) -> u32 {
    pod.annotations()
        .get(ATTEMPT)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// The two controller instances, with leader election on one Lease, restarted whenever they exit.
pub struct Controllers {
    /// Per instance: the kubeconfig of its Sieve proxy.
    kubeconfigs: Vec<PathBuf>,
    args: Vec<String>,
    lease_ns: String,
    procs: Vec<Option<Controller>>,
    pids: Pids,
    pub logs: Vec<PathBuf>,
}

impl Controllers {
    fn start(kubeconfigs: Vec<PathBuf>, lease_ns: &str, pids: Pids) -> Controllers {
        let args = [
            "--leader-elect",
            "--leader-election-namespace",
            lease_ns,
            "--leader-election-id",
            LEASE,
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "1s",
            "--cleanup-backoff",
            "1s",
            "--cleanup-attempts",
            "2",
            "--resync-period",
            "5s",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
        ];
        let dir = crate::support::repo_dir().join("target/e2e-logs");
        let logs: Vec<PathBuf> = (0..INSTANCES)
            .map(|i| dir.join(format!("{}.log", instance_name(i))))
            .collect();
        for log in &logs {
            let _ = std::fs::remove_file(log);
        }
        *pids.running.lock().unwrap_or_else(|e| e.into_inner()) = vec![None; INSTANCES];
        let mut controllers = Controllers {
            kubeconfigs,
            args: args.iter().map(|a| a.to_string()).collect(),
            lease_ns: lease_ns.to_string(),
            procs: (0..INSTANCES).map(|_| None).collect(),
            pids,
            logs,
        };
        for i in 0..INSTANCES {
            controllers.procs[i] = Some(controllers.spawn(i));
        }
        controllers
    }

    fn spawn(&self, i: usize) -> Controller {
        let name = instance_name(i);
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let c = Controller::spawn(&self.kubeconfigs[i], &name, &args, &[("POD_NAME", &name)]);
        self.pids.running.lock().unwrap_or_else(|e| e.into_inner())[i] = c.pid();
        c
    }

    /// Starts again every instance that exited: on its own (a leader that could not renew its
    /// Lease exits by design) or SIGKILLed by a stop-after-write; returns what exited on its own.
    pub fn revive(&mut self) -> Vec<String> {
        let mut exits = Vec::new();
        for i in 0..INSTANCES {
            let status = self.procs[i].as_mut().and_then(Controller::exited);
            if let Some(status) = status {
                let pid = self.pids.running.lock().unwrap_or_else(|e| e.into_inner())[i];
                let stopped = self.pids.stopped.lock().unwrap_or_else(|e| e.into_inner());
                if !pid.is_some_and(|p| stopped.contains(&p)) {
                    exits.push(format!("{} exited ({status})", instance_name(i)));
                }
                drop(stopped);
                self.procs[i] = Some(self.spawn(i));
            }
        }
        exits
    }

    pub async fn kill(&mut self, i: usize) -> String {
        if let Some(c) = self.procs[i].as_mut() {
            c.kill().await;
        }
        self.procs[i] = Some(self.spawn(i));
        format!("SIGKILLed and restarted {}", instance_name(i))
    }

    pub async fn leader(&self, client: &Client) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), &self.lease_ns);
        crate::support::lease_holder(&leases, LEASE).await
    }

    /// SIGTERM to the leader (it releases the Lease), then starts it again as a candidate.
    pub async fn failover(&mut self, client: &Client) -> String {
        let Some(leader) = self.leader(client).await else {
            return "no leader to fail over".into();
        };
        let Some(i) = (0..INSTANCES).find(|i| instance_name(*i) == leader) else {
            return format!("leader {leader} is not ours");
        };
        let t0 = Instant::now();
        let status = match self.procs[i].as_mut() {
            Some(c) => c.terminate(Duration::from_secs(10)).await,
            None => None,
        };
        // Restarted at once, it would win the released Lease again: let the other take over.
        let mut new_leader = None;
        while t0.elapsed() < Duration::from_secs(8) {
            new_leader = self.leader(client).await.filter(|l| *l != leader);
            if new_leader.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.procs[i] = Some(self.spawn(i));
        let took = format!(
            "{} took over after {:.1} s",
            new_leader.as_deref().unwrap_or("nobody"),
            t0.elapsed().as_secs_f64()
        );
        match status {
            Some(s) => format!("SIGTERMed leader {leader} ({s}), {took}"),
            None => format!("leader {leader} ignored SIGTERM for 10 s and was SIGKILLed, {took}"),
        }
    }

    /// Lines of the instance logs that report a panic.
    pub fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for log in &self.logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            out.extend(
                text.lines()
                    .filter(|l| l.contains("panicked"))
                    .map(|l| format!("{}: {l}", log.display())),
            );
        }
        out
    }

    pub fn stop(&mut self) {
        for p in &mut self.procs {
            p.take();
        }
    }
}

/// Live claims of an ordinal of a set: claim name -> UID (claims being deleted are left out).
pub fn claims_of(
    snap: &Snapshot,
    ns: &str,
    def: &SetDef,
    ordinal: u32,
) -> BTreeMap<String, String> {
    def.claim_templates
        .iter()
        .filter_map(|t| {
            let name = format!("{t}-{}-{ordinal}", def.name);
            let claim = snap.claims.iter().find(|c| {
                c.name_any() == name
                    && c.namespace().as_deref() == Some(ns)
                    && c.metadata.deletion_timestamp.is_none()
            })?;
            Some((name, claim.uid()?))
        })
        .collect()
}
