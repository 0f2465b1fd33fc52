//! The round's perturbation: every controller instance talks to the API server through a Sieve
//! proxy of its own (`support::sieve`), which delays or coalesces one resource's watch, or stops
//! the instance right after its n-th write of a kind: the instance is SIGKILLed at that moment
//! (its later writes are held until then) and started again by the runner.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::check::PodDelete;
use super::plan::{INSTANCES, Perturbation, instance_name};
use crate::support::client_from;
use crate::support::sieve::{Sieve, StopHook};

/// PIDs of the running instances, and the PIDs a stop killed (their exit is planned).
#[derive(Clone, Default)]
pub struct Pids {
    pub running: Arc<Mutex<Vec<Option<u32>>>>,
    pub stopped: Arc<Mutex<HashSet<u32>>>,
}

pub struct Proxies {
    sieves: Vec<Arc<Sieve>>,
    start: Instant,
    /// Per instance, how much of its proxy's write log has been handed to the checker.
    taken: Vec<usize>,
    stop: Option<tokio::task::JoinHandle<()>>,
    fired: Arc<Mutex<Vec<String>>>,
    /// Rounds per perturbation kind, and stops armed and fired.
    pub counts: BTreeMap<String, usize>,
    pub stops: (usize, usize),
}

impl Proxies {
    pub async fn start(admin: &Path, start: Instant) -> Proxies {
        let mut sieves = Vec::new();
        for _ in 0..INSTANCES {
            sieves.push(Arc::new(Sieve::start(client_from(admin).await).await));
        }
        Proxies {
            sieves,
            start,
            taken: vec![0; INSTANCES],
            stop: None,
            fired: Arc::default(),
            counts: BTreeMap::new(),
            stops: (0, 0),
        }
    }

    /// The kubeconfig instance `i` uses: its proxy as the server.
    pub fn kubeconfig(&self, i: usize) -> PathBuf {
        self.sieves[i].kubeconfig(&instance_name(i))
    }

    /// Sets the rules of `p` on every proxy; a stop is armed on each, and the first to fire
    /// kills its instance and disarms the others.
    pub fn apply(&mut self, p: &Perturbation, pids: &Pids) {
        *self.counts.entry(p.kind()).or_default() += 1;
        match *p {
            Perturbation::None => {}
            Perturbation::DelayWatch { resource, ms } => {
                for s in &self.sieves {
                    s.delay_watch(resource, Duration::from_millis(ms));
                }
            }
            Perturbation::Coalesce { resource, ms } => {
                for s in &self.sieves {
                    s.coalesce_watch(resource, Some(Duration::from_millis(ms)));
                }
            }
            Perturbation::StopAfterWrite { verb, resource, n } => {
                self.stops.0 += 1;
                let hooks: Vec<StopHook> = self
                    .sieves
                    .iter()
                    .map(|s| s.stop_after_write(verb, resource, s.writes(verb, resource) + n))
                    .collect();
                self.stop = Some(tokio::spawn(stop_then_kill(
                    self.sieves.clone(),
                    hooks,
                    pids.clone(),
                    self.fired.clone(),
                )));
            }
        }
    }

    /// Ends the round's perturbation: rules cleared, held writes resumed, an unfired stop
    /// disarmed. Returns what it did.
    pub fn end(&mut self) -> String {
        for s in &self.sieves {
            s.clear_rules();
        }
        let armed = self.stop.take();
        if let Some(task) = &armed {
            task.abort();
        }
        for s in &self.sieves {
            s.resume();
        }
        let fired: Vec<String> = std::mem::take(&mut *lock(&self.fired));
        self.stops.1 += fired.len();
        match (armed, fired.is_empty()) {
            (None, _) => "rules cleared".into(),
            (Some(_), true) => "the stop never fired (not that many writes of its kind)".into(),
            (Some(_), false) => fired.join("; "),
        }
    }

    /// The pod deletes the controllers sent since the last call.
    pub fn take_pod_deletes(&mut self) -> Vec<PodDelete> {
        let mut out = Vec::new();
        for (i, s) in self.sieves.iter().enumerate() {
            let log = s.write_log();
            for w in &log[self.taken[i].min(log.len())..] {
                if w.target.verb == "delete" && w.target.resource == "pods" {
                    out.push(PodDelete {
                        at: w.at.saturating_duration_since(self.start),
                        instance: instance_name(i),
                        ns: w.target.namespace.clone().unwrap_or_default(),
                        name: w.target.name.clone().unwrap_or_default(),
                        uid: w.uid.clone(),
                        status: w.status,
                    });
                }
            }
            self.taken[i] = log.len();
        }
        out
    }

    /// Every proxy's summary.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (i, s) in self.sieves.iter().enumerate() {
            lines.extend(
                s.summary()
                    .into_iter()
                    .map(|l| format!("{}: {l}", instance_name(i))),
            );
        }
        lines
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for the first hook to fire, disarms the other proxies, SIGKILLs that instance and lets
/// its held writes go (the runner starts the instance again).
async fn stop_then_kill(
    sieves: Vec<Arc<Sieve>>,
    hooks: Vec<StopHook>,
    pids: Pids,
    fired: Arc<Mutex<Vec<String>>>,
) {
    let waits = hooks.into_iter().enumerate().map(|(i, mut hook)| {
        Box::pin(async move {
            let ok = hook.wait().await;
            (i, ok, hook.what().to_string())
        })
    });
    let ((i, ok, what), _, _) = futures::future::select_all(waits).await;
    if !ok {
        return;
    }
    for (j, s) in sieves.iter().enumerate() {
        if j != i {
            s.resume();
        }
    }
    let pid = lock(&pids.running)[i];
    let note = match pid {
        Some(pid) => {
            lock(&pids.stopped).insert(pid);
            let _ = tokio::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .await;
            // Held writes go once the process is gone (a crashed process's writes in flight).
            tokio::time::sleep(Duration::from_millis(200)).await;
            format!("{} SIGKILLed right after its {what}", instance_name(i))
        }
        None => format!("{} had stopped already at its {what}", instance_name(i)),
    };
    sieves[i].resume();
    lock(&fired).push(note);
}
