//! `example/redis` on the real node: Redis shards re-sharded by their cleanup pods.
//!
//! The example as a user applies it (`kubectl apply -k example/redis`), placed on the real node
//! (toleration, node selector; the cleanup pods inherit them) with claims on its hostPath PVs. Keys
//! go in and come out through the example's own client (`client.sh` in a shard pod), which finds
//! the shards by their DNS names (CoreDNS of the real node).
//!
//! - *Re-sharding*: 10,000 keys on 5 shards, scaled to 2 (OrderedReady): every key reads back with
//!   its value from the survivors; each removed shard's drain moved exactly the keys that shard
//!   held, ran after the previous one had finished (4, 3, 2), exited 0, and its claim was deleted
//!   only after that (pod and claim watches, ordered by resourceVersion).
//! - *Refused drain*: a survivor refusing writes (`min-replicas-to-write 1`) makes the drain of
//!   shard 2 fail: both attempts exit 1, the claim is kept, the Events carry the exit code and the
//!   drain's termination message, and the set is `Stalled` with both in the reason; once the survivor accepts writes and the given-up pod is
//!   deleted (docs/usage.md, *Failure*), the next drain succeeds and every key reads back.
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_redis` (or `make e2e`).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerStateTerminated, PersistentVolumeClaim, Pod, Service,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use support::fixtures::{OWNER, record};
use support::realnode::{RealEnv, RealTest};
use support::recorder::{self, Seen, event_note};
use support::{
    REAL_NODE, from_json, real_node_selector, real_node_toleration, wait_for, wait_for_gone,
};

/// The example's StatefulSet, Service and ConfigMap names.
const SET: &str = "redis";
const TIMEOUT: Duration = Duration::from_secs(180);
const STATUS: &str = "statefulsets.kubernetes.io/scaledown-status";
const REASON: &str = "statefulsets.kubernetes.io/scaledown-status-reason";

/// Key `i` and its value (words, as client.sh wants them).
fn kv(i: usize) -> (String, String) {
    let v = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    (format!("key:{i:05}"), format!("value-{i}-{v:x}"))
}

/// The redis example on a real-node test's namespace.
impl RealEnv {
    /// `kubectl apply -k example/redis`, as objects: the ConfigMap of the scripts, the headless
    /// Service and the StatefulSet with `shards` replicas, on the real node and its PVs. Waits
    /// until every shard is Ready.
    async fn apply_example(&self, shards: i32) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("example/redis");
        let dir = dir.to_string_lossy();
        let out = self
            .cluster
            .kubectl(&[
                "create",
                "-n",
                &self.ns.name,
                "--dry-run=client",
                "-o",
                "json",
                "-k",
                &dir,
            ])
            .await;
        let pp = PostParams::default();
        for object in serde_json::Deserializer::from_str(&out).into_iter::<Value>() {
            let mut object = object.expect("kubectl's JSON");
            match object["kind"].as_str() {
                Some("ConfigMap") => {
                    let cm: ConfigMap = from_json(object);
                    self.ns.api().create(&pp, &cm).await.expect("configmap");
                }
                Some("Service") => {
                    let svc: Service = from_json(object);
                    self.ns.api().create(&pp, &svc).await.expect("service");
                }
                Some("StatefulSet") => {
                    let spec = &mut object["spec"];
                    spec["replicas"] = json!(shards);
                    spec["template"]["spec"]["tolerations"] = json!([real_node_toleration()]);
                    spec["template"]["spec"]["nodeSelector"] = real_node_selector();
                    spec["volumeClaimTemplates"][0]["spec"]["storageClassName"] =
                        json!(self.pvs.class);
                    let set: StatefulSet = from_json(object);
                    self.sets().create(&pp, &set).await.expect("statefulset");
                }
                other => panic!("unexpected object in example/redis: {other:?}"),
            }
        }
        let t0 = Instant::now();
        let sets = self.sets();
        wait_for(&format!("{shards} ready shards"), TIMEOUT, || async {
            let s = sets.get_opt(SET).await.ok().flatten();
            s.and_then(|s| s.status).and_then(|s| s.ready_replicas) == Some(shards)
        })
        .await;
        eprintln!(
            "e2e_redis: {shards} shards Ready after {} ms",
            t0.elapsed().as_millis()
        );
    }

    /// Runs `args` in shard 0's container with `stdin`; returns stdout (panics if it fails).
    async fn exec(&self, args: &[&str], stdin: &str) -> String {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(support::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.cluster.kubeconfig)
            .args([
                "-n",
                &self.ns.name,
                "exec",
                "-i",
                &format!("{SET}-0"),
                "-c",
                "redis",
                "--",
            ])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl exec");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.as_bytes())
            .await
            .expect("write stdin");
        drop(input);
        let out = child.wait_with_output().await.expect("kubectl exec");
        assert!(
            out.status.success(),
            "{args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `client.sh put N`: keys 0..count, each to its owner among `shards`.
    async fn put(&self, shards: usize, count: usize) {
        let lines: String = (0..count)
            .map(|i| {
                let (k, v) = kv(i);
                format!("{k} {v}\n")
            })
            .collect();
        let t0 = Instant::now();
        let n = shards.to_string();
        self.exec(&["sh", "/scripts/client.sh", "put", &n], &lines)
            .await;
        eprintln!(
            "e2e_redis: put {count} keys on {shards} shards in {} ms",
            t0.elapsed().as_millis()
        );
    }

    /// `client.sh get N` for keys 0..count: asserts that every key reads back with its value.
    async fn assert_all_read_back(&self, shards: usize, count: usize) {
        let keys: String = (0..count).map(|i| kv(i).0 + "\n").collect();
        let n = shards.to_string();
        let out = self
            .exec(&["sh", "/scripts/client.sh", "get", &n], &keys)
            .await;
        let got: BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once(' ')).collect();
        let wrong: Vec<String> = (0..count)
            .filter_map(|i| {
                let (k, v) = kv(i);
                let g = got.get(k.as_str()).copied();
                (g != Some(v.as_str())).then(|| format!("{k}: {g:?}, expected {v}"))
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {count} keys do not read back from {shards} shards, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        eprintln!("e2e_redis: all {count} keys read back from {shards} shards");
    }

    /// `client.sh count N`: the keys on each shard.
    async fn counts(&self, shards: usize) -> Vec<usize> {
        let out = self
            .exec(
                &["sh", "/scripts/client.sh", "count", &shards.to_string()],
                "",
            )
            .await;
        let counts: Vec<usize> = out
            .lines()
            .map(|l| {
                let n = l.split_whitespace().nth(1);
                n.and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("client.sh count: {out}"))
            })
            .collect();
        assert_eq!(counts.len(), shards, "client.sh count: {out}");
        counts
    }

    async fn scale(&self, replicas: i32) {
        let patch = json!({"spec": {"replicas": replicas}});
        self.sets()
            .patch(SET, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("scale");
    }

    /// The set's status annotation and its reason.
    async fn status(&self) -> (String, String) {
        let set = self.sets().get(SET).await.expect("get set");
        let a = set.metadata.annotations.unwrap_or_default();
        let get = |k: &str| a.get(k).cloned().unwrap_or_default();
        (get(STATUS), get(REASON))
    }

    async fn wait_status(&self, want: &str) {
        wait_for(&format!("status {want}"), TIMEOUT, || async {
            self.status().await.0 == want
        })
        .await;
    }

    /// UIDs of the cleanup pods of shard `o` (our owner annotation), in order of creation.
    fn cleanup_uids(&self, o: usize) -> Vec<String> {
        let name = format!("{SET}-{o}");
        self.pods
            .uids_of(&name)
            .into_iter()
            .filter(|uid| {
                let ours = |s: &Seen<Pod>| s.uid == *uid && s.annotations.contains_key(OWNER);
                self.pods.first(ours).is_some()
            })
            .collect()
    }

    /// The first recorded state of pod `uid` whose container had terminated.
    fn exited(&self, uid: &str) -> (Seen<Pod>, ContainerStateTerminated) {
        let seen = self
            .pods
            .first(|s| s.uid == uid && terminated(&s.object).is_some())
            .unwrap_or_else(|| panic!("cleanup pod {uid} never seen terminated"));
        let t = terminated(&seen.object).expect("terminated");
        (seen, t)
    }

    /// The claim of shard `o` exists, and no watch saw it being deleted.
    async fn assert_claim_kept(&self, o: usize) {
        let name = format!("data-{SET}-{o}");
        let api: Api<PersistentVolumeClaim> = self.ns.api();
        let live = api.get_opt(&name).await.expect("get claim");
        assert!(
            live.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
            "claim {name} is gone or going"
        );
        let deleting = self.claims.first(|s| s.name == name && s.deleting);
        assert!(deleting.is_none(), "claim {name} was seen being deleted");
    }
}

/// The terminated state of container `drain`.
fn terminated(pod: &Pod) -> Option<ContainerStateTerminated> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let drain = statuses.iter().find(|c| c.name == "drain")?;
    drain.state.as_ref()?.terminated.clone()
}

/// The number after `word` in `text` ("in 123 ms" -> 123 for "in").
fn number_after(text: &str, word: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == word
            && let Some(n) = words.clone().next().and_then(|n| n.parse().ok())
        {
            return Some(n);
        }
    }
    None
}

// === re-sharding ===

#[tokio::test(flavor = "multi_thread")]
async fn redis_5_to_2_moves_every_key_to_the_surviving_shards() {
    const KEYS: usize = 10_000;
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_redis",
        test: "redis-reshard",
        class: "redis",
        pvs: 5,
        flags: &[],
        set: SET,
    })
    .await
    else {
        return;
    };
    env.apply_example(5).await;
    env.put(5, KEYS).await;
    let before = env.counts(5).await;
    assert_eq!(before.iter().sum::<usize>(), KEYS, "per shard: {before:?}");
    assert!(
        before.iter().all(|&c| c > 0),
        "every shard holds keys: {before:?}"
    );
    record("redis 5 -> 2: keys per shard before", format!("{before:?}"));

    let scaled = Instant::now();
    env.scale(2).await;
    let claims: Api<PersistentVolumeClaim> = env.ns.api();
    for o in [4, 3, 2] {
        wait_for_gone(&claims, &format!("data-{SET}-{o}"), TIMEOUT).await;
    }
    env.wait_status("Idle").await;
    let total = scaled.elapsed();
    let after = env.counts(2).await;
    eprintln!(
        "e2e_redis: 5 -> 2 in {} ms; keys per shard before {before:?}, after {after:?}",
        total.as_millis()
    );
    record("redis 5 -> 2: keys per shard after", format!("{after:?}"));
    record(
        "redis 5 -> 2: scale-down to Idle",
        format!("{} ms", total.as_millis()),
    );
    assert_eq!(
        after.iter().sum::<usize>(),
        KEYS,
        "per shard after: {after:?}"
    );
    // Rendezvous hashing: what shards 0 and 1 owned stays, they only gain the removed shards' keys.
    assert!(
        after[0] >= before[0] && after[1] >= before[1],
        "{before:?} -> {after:?}"
    );
    env.assert_all_read_back(2, KEYS).await;

    let mut previous_gone: Option<Seen<Pod>> = None;
    for o in [4usize, 3, 2] {
        let uid = assert_drained_then_deleted(&env, o, before[o]);
        let first = env.pods.first(|s| s.uid == uid).expect("first state");
        if let Some(prev) = &previous_gone {
            assert!(
                first.resource_version > prev.resource_version,
                "drain of {o} created (rv {}) before the previous drain's pod was gone (rv {})",
                first.resource_version,
                prev.resource_version
            );
        }
        previous_gone = Some(env.pods.deletion_of(&uid).expect("drain pod deleted"));
    }
    for o in [0, 1] {
        env.assert_claim_kept(o).await;
    }
}

/// Shard `o` was drained by one cleanup pod on the real node whose container exited 0 saying it
/// moved all `keys` keys, and claim `data-redis-<o>` was deleted after that exit was recorded.
/// Returns the pod's UID.
fn assert_drained_then_deleted(env: &RealEnv, o: usize, keys: usize) -> String {
    let uids = env.cleanup_uids(o);
    assert_eq!(uids.len(), 1, "one drain pod for shard {o}: {uids:?}");
    let (exited, t) = env.exited(&uids[0]);
    assert_eq!(
        recorder::node(&exited.object),
        Some(REAL_NODE),
        "drain {o} on the real node"
    );
    let message = t.message.clone().unwrap_or_default().trim().to_string();
    assert_eq!(t.exit_code, 0, "drain of shard {o}: {message}");
    assert!(
        message.contains(&format!("moved all {keys} keys of shard {o}")),
        "drain of shard {o} holding {keys} keys: {message}"
    );
    let claim = format!("data-{SET}-{o}");
    let deleting = env
        .claims
        .first(|s| s.name == claim && s.deleting)
        .unwrap_or_else(|| panic!("no deletion of claim {claim} recorded"));
    assert!(
        deleting.resource_version > exited.resource_version,
        "claim {claim} deleted (rv {}) before the drain's exit 0 was recorded (rv {})",
        deleting.resource_version,
        exited.resource_version
    );
    let script_ms = number_after(&message, "in").unwrap_or_default();
    let container_s = match (&t.started_at, &t.finished_at) {
        (Some(s), Some(f)) => f.0.as_second() - s.0.as_second(),
        _ => -1,
    };
    eprintln!(
        "e2e_redis: shard {o}: {message}; container ran {container_s} s; claim deleted {} ms after the exit was seen",
        deleting.at.saturating_duration_since(exited.at).as_millis()
    );
    record(
        &format!("redis 5 -> 2: drain of shard {o} ({keys} keys), the script's own time"),
        format!("{script_ms} ms"),
    );
    uids[0].clone()
}

// === refused drain ===

#[tokio::test(flavor = "multi_thread")]
async fn redis_drain_refused_by_a_survivor_keeps_the_claim_then_succeeds() {
    const KEYS: usize = 1_000;
    let flags = [
        "--cleanup-attempts",
        "2",
        "--cleanup-backoff",
        "2s",
        "--resync-period",
        "2s",
    ];
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_redis",
        test: "redis-refused",
        class: "redis",
        pvs: 3,
        flags: &flags,
        set: SET,
    })
    .await
    else {
        return;
    };
    env.ns.allow_more_cleanup_creates(
        SET,
        1,
        "the test deletes the given-up drain pod to start a fresh series",
    );
    env.apply_example(3).await;
    env.put(3, KEYS).await;
    let before = env.counts(3).await;
    // Shard 1 refuses writes: a master that wants a replica it does not have.
    let refuse = [
        "redis-cli",
        "-h",
        "redis-1.redis",
        "CONFIG",
        "SET",
        "min-replicas-to-write",
    ];
    let set_refusal = |v: &'static str| {
        let mut args = refuse.to_vec();
        args.push(v);
        args
    };
    assert_eq!(env.exec(&set_refusal("1"), "").await.trim(), "OK");
    let probe = env
        .exec(
            &[
                "sh",
                "-c",
                "redis-cli -h redis-1.redis SET probe 1 2>&1; true",
            ],
            "",
        )
        .await;
    assert!(
        probe.contains("NOREPLICAS"),
        "shard 1 refuses writes: {probe}"
    );

    env.scale(2).await;
    let gave_up = env.events.wait_event(SET, "CleanupGaveUp", TIMEOUT).await;
    let failed = env.events.events(SET, "CleanupFailed");
    assert_eq!(
        failed.len(),
        1,
        "one CleanupFailed: {}",
        env.events.describe()
    );
    for (event, attempt) in [
        (&failed[0], "(attempt 1 of 2)"),
        (&gave_up, "(attempt 2 of 2)"),
    ] {
        let note = event_note(event);
        // The exit code, and the drain's own words (its termination message).
        assert!(
            note.contains(attempt)
                && note.contains("exit code 1 (")
                && note.contains("still on shard 2")
                && note.contains("NOREPLICAS"),
            "{}: {note}",
            recorder::event_reason(event)
        );
        eprintln!("e2e_redis: {}: {note}", recorder::event_reason(event));
    }
    // The status is written in a pass of its own after the Event: wait for it.
    env.wait_status("Stalled").await;
    let (_, reason) = env.status().await;
    assert!(
        reason.starts_with("CleanupFailed: ordinal 2 gave up after 2 attempts (")
            && reason.contains("still on shard 2")
            && reason.contains("NOREPLICAS"),
        "the reason carries the drain's termination message: {reason}"
    );
    eprintln!("e2e_redis: Stalled: {reason}");
    let uids = env.cleanup_uids(2);
    assert_eq!(uids.len(), 2, "two attempts: {uids:?}");
    for uid in &uids {
        let (_, t) = env.exited(uid);
        let message = t.message.unwrap_or_default().trim().to_string();
        assert_eq!(t.exit_code, 1, "{message}");
        assert!(
            message.contains("still on shard 2") && message.contains("NOREPLICAS"),
            "the drain says what it could not move and why: {message}"
        );
        // Shard 0 took its keys; those of shard 1 stay on shard 2.
        let left: usize = message
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count of keys left: {message}"));
        assert!(
            left > 0 && left < before[2],
            "{left} of {} left: {message}",
            before[2]
        );
        eprintln!("e2e_redis: refused drain: {message}");
    }
    env.assert_claim_kept(2).await;

    // Shard 1 accepts writes again; deleting the given-up pod starts a new series.
    assert_eq!(env.exec(&set_refusal("0"), "").await.trim(), "OK");
    let pods: Api<Pod> = env.ns.api();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uids[1].clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete(&format!("{SET}-2"), &dp)
        .await
        .expect("delete the given-up pod");
    let claims: Api<PersistentVolumeClaim> = env.ns.api();
    wait_for_gone(&claims, &format!("data-{SET}-2"), TIMEOUT).await;
    env.wait_status("Idle").await;
    let uids = env.cleanup_uids(2);
    assert_eq!(uids.len(), 3, "a third drain after the delete: {uids:?}");
    let (_, t) = env.exited(&uids[2]);
    let message = t.message.unwrap_or_default().trim().to_string();
    assert_eq!(t.exit_code, 0, "{message}");
    assert!(message.contains("keys of shard 2"), "{message}");
    let after = env.counts(2).await;
    eprintln!("e2e_redis: refused then accepted: before {before:?}, after {after:?}; {message}");
    assert_eq!(after.iter().sum::<usize>(), KEYS);
    env.assert_all_read_back(2, KEYS).await;
    env.assert_claim_kept(0).await;
    env.assert_claim_kept(1).await;
}
