//! Carrying out one planned action on the cluster. Each returns a short note of what it did.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::PostParams;
use serde_json::json;

use super::plan::Action;
use super::record::{ATTEMPT, CLAIMS, CLEANUP_LABEL, OWNER};
use super::world::{World, claims_of, looks_like_cleanup};
use crate::support::from_json;

impl World {
    pub async fn act(&mut self, action: &Action) -> String {
        match *action {
            Action::Scale { set, replicas } => match self.scale(set, replicas).await {
                Ok(()) => format!("{}={replicas}", self.sets[set].name),
                Err(e) => e,
            },
            Action::ForgeOrphan { set, by } => self.forge_orphan(set, by).await,
            Action::ForgeWanted { set, pick } => self.forge_wanted(set, pick).await,
            Action::DeleteCleanup { set } => self.delete_cleanup(set).await,
            Action::KillController { instance } => self.controllers.kill(instance).await,
            Action::Failover => {
                let client = self.client();
                self.controllers.failover(&client).await
            }
            Action::RestartApiserver => restart_apiserver().await,
            Action::Recreate { set, how } => self.recreate(set, how).await,
            Action::ZeroAndBack { set, back_after } => self.zero_and_back(set, back_after).await,
            Action::HandMadeClaim { set, ordinal } => self.make_claim(set, ordinal, false).await,
            Action::ForeignClaim { set, ordinal } => self.make_claim(set, ordinal, true).await,
            Action::DeleteNamespace { replicas } => self.delete_namespace(replicas).await,
        }
    }

    /// Scale down by `by`, then take the name of the lowest orphaned ordinal with a forged pod.
    async fn forge_orphan(&mut self, set: usize, by: i32) -> String {
        let current = self.replicas[set];
        if current == 0 {
            return format!("{} has no replica to scale down", self.sets[set].name);
        }
        let target = (current - by).max(0);
        if let Err(e) = self.scale(set, target).await {
            return e;
        }
        let note = self.forge(set, target as u32).await;
        format!("{}={target}, {note}", self.sets[set].name)
    }

    /// Replace the stateful pod of a wanted ordinal by a forged cleanup pod.
    async fn forge_wanted(&mut self, set: usize, pick: u32) -> String {
        let current = self.replicas[set];
        if current <= 0 {
            return format!("{} has no wanted ordinal", self.sets[set].name);
        }
        self.forge(set, pick % current as u32).await
    }

    /// Deletes whatever pod is named `<set>-<ordinal>` and creates, in its place, a pod that looks
    /// like a cleanup pod of that ordinal over its live claims; remembers its UID.
    async fn forge(&mut self, set: usize, ordinal: u32) -> String {
        let def = self.sets[set].clone();
        let ns = self.ns_names[def.ns].clone();
        let name = format!("{}-{ordinal}", def.name);
        let claims = match self.snapshot().await {
            Ok(snap) => claims_of(&snap, &ns, &def, ordinal),
            Err(e) => return format!("forge {name}: cannot list: {e}"),
        };
        let claims_json = serde_json::to_string(&claims).unwrap_or_default();
        let pod: Pod = from_json(json!({
            "metadata": {
                "name": name,
                "labels": {CLEANUP_LABEL: name, "app": "forged"},
                "annotations": {OWNER: def.name, CLAIMS: claims_json, ATTEMPT: "1",
                                "sim.scaledown.io/after": "1s"},
            },
            "spec": {
                "nodeName": format!("kwok-node-{}", ordinal % 3),
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "busybox"}],
            }
        }));
        // The StatefulSet controller (or ours) recreates the name within milliseconds: delete
        // and create again until the forged pod gets it, for at most 3 s.
        let pods = self.api::<Pod>(set);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut tries = 0;
        loop {
            tries += 1;
            self.delete_pod(set, &name, None).await;
            match pods.create(&PostParams::default(), &pod).await {
                Ok(created) => {
                    // Each try deleted whatever held the name, the controller's pod included.
                    self.namespaces[def.ns].allow_more_cleanup_creates(
                        &def.name,
                        tries,
                        "the forger deletes the controller's cleanup pod to take its name",
                    );
                    let uid = created.uid().unwrap_or_default();
                    self.forged.insert(uid.clone());
                    self.live_forged.push((set, name.clone(), uid.clone()));
                    return format!(
                        "forged {name} uid {} over {} claim(s) (try {tries})",
                        super::check::short(&uid),
                        claims.len()
                    );
                }
                Err(kube::Error::Api(e)) if e.code == 409 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(kube::Error::Api(e)) => {
                    return format!("forging {name} lost after {tries} tries: {}", e.message);
                }
                Err(e) => return format!("forging {name} failed: {e}"),
            }
        }
    }

    /// A user deletes a genuine cleanup pod of the set (the controller should start it again).
    async fn delete_cleanup(&mut self, set: usize) -> String {
        let def = &self.sets[set];
        let ns = &self.ns_names[def.ns];
        let Ok(snap) = self.snapshot().await else {
            return "delete-cleanup: cannot list".into();
        };
        let victim = snap.pods.iter().find(|p| {
            looks_like_cleanup(p)
                && p.namespace().as_deref() == Some(ns)
                && p.metadata.deletion_timestamp.is_none()
                && !self.forged.contains(&p.uid().unwrap_or_default())
                && self.owner_of(ns, &p.name_any(), false).map(|o| o.0) == Some(set)
        });
        match victim {
            Some(p) => {
                let deleted = self
                    .delete_pod(set, &p.name_any(), p.uid().as_deref())
                    .await;
                self.namespaces[def.ns].allow_more_cleanup_creates(
                    &def.name,
                    1,
                    "the chaos runner deleted one of its cleanup pods",
                );
                format!("deleted cleanup pod {} ({deleted})", p.name_any())
            }
            None => format!("no cleanup pod of {} to delete", def.name),
        }
    }

    /// Deletes the forged pods still there (the controller must not need anyone else to).
    pub async fn delete_forged(&mut self) {
        for (set, name, uid) in std::mem::take(&mut self.live_forged) {
            self.delete_pod(set, &name, Some(&uid)).await;
        }
    }
}

/// `hack/cluster.sh restart-apiserver 1`: stop kube-apiserver, wait 1 s, start it, wait ready.
async fn restart_apiserver() -> String {
    let script = crate::support::repo_dir().join("hack/cluster.sh");
    let t0 = Instant::now();
    let out = tokio::process::Command::new(script)
        .args(["restart-apiserver", "1"])
        .output()
        .await;
    match out {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let ready = text
                .lines()
                .any(|l| l.contains("restart-apiserver ready-at"));
            let stalled = String::from_utf8_lossy(&out.stderr).contains("ignored SIGTERM");
            format!(
                "apiserver restarted in {:.1} s{}{}",
                t0.elapsed().as_secs_f64(),
                if stalled {
                    " (it ignored SIGTERM for 3 s and was SIGKILLed)"
                } else {
                    ""
                },
                if ready { "" } else { " (no ready line!)" }
            )
        }
        Ok(out) => format!(
            "HARNESS: restart-apiserver failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ),
        Err(e) => format!("HARNESS: cannot run hack/cluster.sh: {e}"),
    }
}
