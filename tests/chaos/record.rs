//! The recording: watches on pods, claims and StatefulSets of the run's namespaces, running for the
//! whole run, append one [`Obs`] per change they see.
//!
//! Order. Every object of these kinds lives in the one etcd of the local control plane, whose
//! revision is global, so `metadata.resourceVersion` orders changes across kinds: a claim deleted
//! at revision 900 was deleted after a pod that turned Succeeded at revision 850. A change seen on
//! a watch happened exactly at its revision. After a watch broke (an API server restart), the
//! watcher may list again: a change seen only in that list happened somewhere in
//! `(the object's previous revision, its listed revision]`, and an object missing from the list
//! vanished in `(its last revision, a revision read right after the list]`. Every [`Obs`] carries
//! that interval, `(after, rv]`; the checker only calls a violation when it holds for every point
//! of the interval.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

pub const OWNER: &str = "statefulsets.kubernetes.io/scaledown-pod-owner";
pub const CLAIMS: &str = "statefulsets.kubernetes.io/scaledown-claims";
pub const ATTEMPT: &str = "statefulsets.kubernetes.io/scaledown-attempt";
pub const CLEANUP_LABEL: &str = "scaledown-pod";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Claim,
    Set,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    Added,
    Modified,
    Deleted,
    /// Seen in a list after the watch broke (the change happened in `(after, rv]`).
    Listed,
    /// Missing from such a list: deleted in `(after, rv]`.
    Vanished,
    /// Written by the runner itself (a scale): `rv` from the API server's answer.
    Written,
}

/// One observed change of one object.
#[derive(Clone, Debug)]
pub struct Obs {
    /// Since the start of the run.
    pub at: Duration,
    pub round: usize,
    pub kind: Kind,
    pub how: How,
    pub ns: String,
    pub name: String,
    pub uid: String,
    /// The change happened at a revision in `(after, rv]`.
    pub after: u64,
    pub rv: u64,
    pub phase: Option<String>,
    /// `deletionTimestamp` set, or the object is gone.
    pub deleting: bool,
    /// Pods: the `scaledown-pod` label is present.
    pub cleanup_label: bool,
    /// Pods: annotations a cleanup pod carries.
    pub owner: Option<String>,
    pub claims: BTreeMap<String, String>,
    pub attempt: Option<u32>,
    pub node: Option<String>,
    /// StatefulSets: `spec.replicas`.
    pub replicas: Option<i32>,
    /// Pods and claims: the `app` label (the sets' `selector.matchLabels`).
    pub app: Option<String>,
    /// Pods and claims: the first ownerReference, `(kind, uid)`.
    pub owner_ref: Option<(String, String)>,
}

impl Obs {
    fn new(kind: Kind, how: How, ns: &str, name: &str, uid: &str, after: u64, rv: u64) -> Obs {
        Obs {
            at: Duration::ZERO,
            round: 0,
            kind,
            how,
            ns: ns.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            after,
            rv,
            phase: None,
            deleting: matches!(how, How::Deleted | How::Vanished),
            cleanup_label: false,
            owner: None,
            claims: BTreeMap::new(),
            attempt: None,
            node: None,
            replicas: None,
            app: None,
            owner_ref: None,
        }
    }

    /// A record made up by the checker's self-test.
    pub fn synthetic(kind: Kind, ns: &str, name: &str, uid: &str, after: u64, rv: u64) -> Obs {
        Obs::new(kind, How::Modified, ns, name, uid, after, rv)
    }

    /// A cleanup pod by its looks (label or owner annotation); forged pods look like one too.
    pub fn looks_like_cleanup(&self) -> bool {
        self.cleanup_label || self.owner.is_some()
    }

    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "at_ms": self.at.as_millis() as u64, "round": self.round,
            "kind": format!("{:?}", self.kind), "how": format!("{:?}", self.how),
            "ns": self.ns, "name": self.name, "uid": self.uid, "after": self.after, "rv": self.rv,
            "phase": self.phase, "deleting": self.deleting, "cleanup_label": self.cleanup_label,
            "owner": self.owner, "claims": self.claims, "attempt": self.attempt,
            "node": self.node, "replicas": self.replicas, "app": self.app,
            "owner_ref": self.owner_ref,
        })
    }
}

pub fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kinds the recorder watches, and what it keeps of each.
pub trait Watched:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    fn fill(&self, obs: &mut Obs);
}

impl Watched for Pod {
    const KIND: Kind = Kind::Pod;
    fn fill(&self, obs: &mut Obs) {
        obs.phase = self.status.as_ref().and_then(|s| s.phase.clone());
        obs.cleanup_label = self.labels().contains_key(CLEANUP_LABEL);
        let a = self.annotations();
        obs.owner = a.get(OWNER).cloned();
        obs.claims = a
            .get(CLAIMS)
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or_default();
        obs.attempt = a.get(ATTEMPT).and_then(|v| v.parse().ok());
        obs.node = self.spec.as_ref().and_then(|s| s.node_name.clone());
    }
}

impl Watched for PersistentVolumeClaim {
    const KIND: Kind = Kind::Claim;
    fn fill(&self, obs: &mut Obs) {
        obs.phase = self.status.as_ref().and_then(|s| s.phase.clone());
    }
}

impl Watched for StatefulSet {
    const KIND: Kind = Kind::Set;
    fn fill(&self, obs: &mut Obs) {
        obs.replicas = Some(self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1));
    }
}

fn observe<K: Watched>(obj: &K, how: How, after: u64) -> Obs {
    let meta = obj.meta();
    let rv = rv_of(meta);
    let mut obs = Obs::new(
        K::KIND,
        how,
        meta.namespace.as_deref().unwrap_or_default(),
        &obj.name_any(),
        meta.uid.as_deref().unwrap_or_default(),
        after.min(rv.saturating_sub(1)),
        rv,
    );
    obj.fill(&mut obs);
    obs.deleting |= meta.deletion_timestamp.is_some();
    if K::KIND != Kind::Set {
        obs.app = obj.labels().get("app").cloned();
        obs.owner_ref = meta
            .owner_references
            .as_ref()
            .and_then(|refs| refs.first())
            .map(|r| (r.kind.clone(), r.uid.clone()));
    }
    obs
}

/// The shared recording.
#[derive(Clone)]
pub struct Recorder {
    log: Arc<Mutex<Vec<Obs>>>,
    round: Arc<AtomicUsize>,
    start: Instant,
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            log: Arc::new(Mutex::new(Vec::new())),
            round: Arc::new(AtomicUsize::new(0)),
            start,
        }
    }

    /// When the run started (the zero of every `at`).
    pub fn start(&self) -> Instant {
        self.start
    }

    pub fn set_round(&self, round: usize) {
        self.round.store(round, Ordering::SeqCst);
    }

    pub fn push(&self, mut obs: Obs) {
        obs.at = self.start.elapsed();
        obs.round = self.round.load(Ordering::SeqCst);
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(obs);
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> Vec<Obs> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records a StatefulSet as the runner's own write returned it.
    pub fn written(&self, set: &StatefulSet) {
        let rv = rv_of(set.meta());
        self.push(observe(set, How::Written, rv.saturating_sub(1)));
    }

    /// Starts the watches on pods, claims and StatefulSets of `namespaces`; they run until the
    /// returned handles are aborted.
    pub fn watch_all(
        &self,
        client: &Client,
        namespaces: &[String],
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        for ns in namespaces {
            tasks.push(tokio::spawn(
                self.clone()
                    .watch(Api::<Pod>::namespaced(client.clone(), ns)),
            ));
            tasks.push(tokio::spawn(self.clone().watch(
                Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
            )));
            tasks.push(tokio::spawn(
                self.clone()
                    .watch(Api::<StatefulSet>::namespaced(client.clone(), ns)),
            ));
        }
        tasks
    }

    async fn watch<K: Watched>(self, api: Api<K>) {
        let mut state = StreamState::default();
        let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            match event {
                // The API server is away (a restart): poll again a little later.
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                Ok(event) => self.on_event(&api, &mut state, event).await,
            }
        }
    }

    async fn on_event<K: Watched>(&self, api: &Api<K>, st: &mut StreamState, event: Event<K>) {
        match event {
            Event::Init => {
                st.gap_start = st.max_rv;
                st.listed.clear();
            }
            Event::InitApply(obj) => {
                let (uid, rv) = st.remember(&obj);
                st.listed.insert(uid.clone());
                let prev = st.known.insert(uid, rv);
                st.max_rv = st.max_rv.max(rv);
                if prev != Some(rv) {
                    self.push(observe(&obj, How::Listed, prev.unwrap_or(st.gap_start)));
                }
            }
            Event::InitDone => {
                let gone: Vec<(String, u64)> = st
                    .known
                    .iter()
                    .filter(|(uid, _)| !st.listed.contains(*uid))
                    .map(|(uid, rv)| (uid.clone(), *rv))
                    .collect();
                if gone.is_empty() {
                    return;
                }
                let bound = fresh_rv(api).await;
                for (uid, last) in gone {
                    st.known.remove(&uid);
                    let (ns, name) = st.names.get(&uid).cloned().unwrap_or_default();
                    self.push(Obs::new(
                        K::KIND,
                        How::Vanished,
                        &ns,
                        &name,
                        &uid,
                        last,
                        bound,
                    ));
                }
            }
            Event::Apply(obj) => {
                let (uid, rv) = st.remember(&obj);
                let how = if st.known.insert(uid, rv).is_some() {
                    How::Modified
                } else {
                    How::Added
                };
                st.max_rv = st.max_rv.max(rv);
                self.push(observe(&obj, how, rv.saturating_sub(1)));
            }
            Event::Delete(obj) => {
                let rv = rv_of(obj.meta());
                st.known.remove(&obj.uid().unwrap_or_default());
                st.max_rv = st.max_rv.max(rv);
                self.push(observe(&obj, How::Deleted, rv.saturating_sub(1)));
            }
        }
    }
}

#[derive(Default)]
struct StreamState {
    /// Live objects by UID, with the last revision seen.
    known: HashMap<String, u64>,
    names: HashMap<String, (String, String)>,
    listed: HashSet<String>,
    max_rv: u64,
    gap_start: u64,
}

impl StreamState {
    /// Notes the namespace and name of `obj` (a vanished object is known by its UID only) and
    /// returns its UID and revision.
    fn remember<K: Watched>(&mut self, obj: &K) -> (String, u64) {
        let uid = obj.uid().unwrap_or_default();
        self.names
            .entry(uid.clone())
            .or_insert_with(|| (obj.namespace().unwrap_or_default(), obj.name_any()));
        (uid, rv_of(obj.meta()))
    }
}

/// The current revision of the store (a list of one object is a consistent read); `u64::MAX`
/// (any time at all) if the API server does not answer for a while.
async fn fresh_rv<K: Watched>(api: &Api<K>) -> u64 {
    for _ in 0..50 {
        if let Ok(list) = api.list_metadata(&ListParams::default().limit(1)).await
            && let Some(rv) = list.metadata.resource_version.and_then(|v| v.parse().ok())
        {
            return rv;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    u64::MAX
}
