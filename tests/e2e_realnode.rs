//! e2e tests on the real node (`hack/real-node.sh`: a kubelet with containerd beside the KWOK
//! nodes, started by `hack/cluster.sh up` unless `SCALEDOWN_REAL_NODE=0`). Here containers really
//! run, volumes are really mounted, and the test reads from the host the files pods wrote.
//!
//! - *Data path* (OrderedReady 4 → 2, Parallel 4 → 1): a sharded StatefulSet, each member writing
//!   its own files into its claim (hostPath PVs on the real node); the controller's cleanup pods
//!   copy the removed members' files to an archive (a plain hostPath volume shared with the test).
//!   Every file must be there, byte-identical, and no claim deleted before its cleanup container
//!   exited 0.
//! - *No overlap*: members with a real grace period trap SIGTERM, take 2 s to stop and write their
//!   stop time into the volume; cleanup pods write their start time. Both read `/proc/uptime`, one
//!   clock for the host and every pod (no time namespaces), so the test compares them directly.
//! - *Failure*: a cleanup container that exits 3 under `restartPolicy: Never` (two attempts, the
//!   backoff between them, then giving up; the claim is kept) and an image that cannot be pulled
//!   (`CleanupPodStuck`; the claims are kept).
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_realnode` (or `make e2e`).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::{FINALIZER, OWNER, record};
use support::realnode::{RealEnv, RealTest};
use support::recorder::{self, Seen, event_note};
use support::{
    REAL_NODE, from_json, real_node_selector, real_node_toleration, wait_for, wait_for_gone,
};

const TIMEOUT: Duration = Duration::from_secs(120);
const FILES_PER_SHARD: usize = 3;
/// Every test's StatefulSet.
const SET: &str = "shard";
/// Attempt number of a cleanup pod (docs/usage.md, "Failure").
const ATTEMPT: &str = "statefulsets.kubernetes.io/scaledown-attempt";
/// Shell function for the pods' scripts: seconds since boot, host-wide (see [`host_uptime`]).
const NOW_FN: &str = "now() { read -r t _ </proc/uptime; echo $t; }; ";

// === what the pods run ===

/// What member `ordinal` writes into `/data/shard-<ordinal>/file-<i>.bin` (the pod's script makes
/// the same bytes with `yes | head -c`): distinct per member and file, of different sizes.
fn expected_file(ordinal: usize, i: usize) -> Vec<u8> {
    let line = format!("shard {ordinal} file {i}\n");
    line.bytes()
        .cycle()
        .take(4096 * i + 17 * ordinal + 1)
        .collect()
}

/// The data-path member: write the files (to a temp name, renamed when complete), mark the volume
/// written (the readiness probe waits for it), then wait for SIGTERM.
fn member_script() -> String {
    let mut s = String::from("set -e; o=${HOSTNAME##*-}; d=/data/shard-$o; mkdir -p $d; ");
    for i in 1..=FILES_PER_SHARD {
        s.push_str(&format!(
            "yes \"shard $o file {i}\" | head -c $((4096 * {i} + 17 * o + 1)) >$d/.file-{i}.tmp; mv $d/.file-{i}.tmp $d/file-{i}.bin; "
        ));
    }
    s.push_str("sync; touch /data/.written; trap 'exit 0' TERM; sleep 100000 & wait");
    s
}

/// A member that only marks its volume written and stops at once on SIGTERM.
const IDLE_MEMBER: &str = "touch /data/.written; trap 'exit 0' TERM; sleep 100000 & wait";

/// A member that takes its time to stop: on SIGTERM it notes the time, works 2 s, writes its stop
/// time into the volume (the last thing it does there) and exits 0.
fn slow_stopping_member() -> String {
    format!(
        "{NOW_FN}touch /data/.written; \
         stop() {{ now >/data/member-sigterm; sleep 2; now >/data/.stopped; mv /data/.stopped /data/member-stopped; sync; exit 0; }}; \
         trap stop TERM; sleep 100000 & wait"
    )
}

/// The data-path cleanup: copy the removed member's files to the archive (under a temp name,
/// renamed when complete), then exit 0.
const ARCHIVE_CLEANUP: &str = "set -e; o=$SCALEDOWN_ORDINAL; echo archiving shard $o; \
    rm -rf /archive/.shard-$o.tmp; mkdir -p /archive/.shard-$o.tmp; \
    cp -a /data/shard-$o/. /archive/.shard-$o.tmp/; sync; \
    mv /archive/.shard-$o.tmp /archive/shard-$o; ls -l /archive/shard-$o; echo archived shard $o";

/// The no-overlap cleanup: its start time first, 1 s of work, its end time.
fn timed_cleanup() -> String {
    format!(
        "{NOW_FN}now >/data/cleanup-started; ls -la /data; sleep 1; now >/data/cleanup-ended; sync"
    )
}

/// The failing cleanup: logs its start and exit times in the volume, then exits 3.
fn failing_cleanup() -> String {
    format!(
        "{NOW_FN}echo \"start $(now)\" >>/data/attempts.log; echo failing on purpose; \
         echo \"exit $(now)\" >>/data/attempts.log; sync; exit 3"
    )
}

/// A cleanup pod template on the real node: container `main` runs `script` in `image` with the
/// claim at /data (and `archive`, a host directory, at /archive).
fn cleanup_template(
    image: &str,
    script: &str,
    restart: Option<&str>,
    archive: Option<&Path>,
) -> Value {
    let mut mounts = vec![json!({"name": "data", "mountPath": "/data"})];
    let mut volumes = vec![];
    if let Some(dir) = archive {
        mounts.push(json!({"name": "archive", "mountPath": "/archive"}));
        volumes.push(json!({"name": "archive",
            "hostPath": {"path": dir.to_string_lossy(), "type": "Directory"}}));
    }
    let mut spec = json!({
        "tolerations": [real_node_toleration()],
        "nodeSelector": real_node_selector(),
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "main", "image": image, "command": ["sh", "-c", script],
                        "volumeMounts": mounts}],
        "volumes": volumes,
    });
    if let Some(policy) = restart {
        spec["restartPolicy"] = json!(policy);
    }
    json!({"metadata": {"labels": {"app": "shard-cleanup"}}, "spec": spec})
}

/// The sharded StatefulSet [`SET`] on the real node: members run `script` in busybox with claim
/// `data` at /data, Ready once /data/.written exists; `cleanup` is its cleanup template.
fn sharded_set(
    replicas: i32,
    policy: &str,
    class: &str,
    grace: i64,
    script: &str,
    cleanup: &Value,
) -> StatefulSet {
    from_json(json!({
        "metadata": {"name": SET, "annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": cleanup.to_string()}},
        "spec": {
            "replicas": replicas,
            "serviceName": SET,
            "podManagementPolicy": policy,
            "selector": {"matchLabels": {"app": SET}},
            "template": {
                "metadata": {"labels": {"app": SET}},
                "spec": {
                    "tolerations": [real_node_toleration()],
                    "nodeSelector": real_node_selector(),
                    "terminationGracePeriodSeconds": grace,
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", script],
                        "readinessProbe": {"exec": {"command": ["test", "-f", "/data/.written"]},
                                           "periodSeconds": 1},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]
                }
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }))
}

// === clocks and pod status ===

fn millis(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// The first field of a `/proc/uptime` text: seconds since boot.
fn parse_uptime(text: &str) -> f64 {
    text.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("not an uptime: {text:?}"))
}

/// Seconds since boot, from /proc/uptime: host-wide (pods on the real node share the host's
/// kernel and no time namespace), so the test and every pod read the same clock (10 ms steps).
fn host_uptime() -> f64 {
    parse_uptime(&std::fs::read_to_string("/proc/uptime").expect("read /proc/uptime"))
}

/// A time a pod wrote into file `name` of the host directory `dir` (a volume on the real node).
fn pod_clock(dir: &Path, name: &str) -> f64 {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no time in {}: {e}", path.display()));
    parse_uptime(&text)
}

/// Maps this process's `Instant`s (when a watch saw a change) to host uptime seconds.
struct HostClock {
    instant: Instant,
    uptime: f64,
}

impl HostClock {
    fn now() -> HostClock {
        HostClock {
            instant: Instant::now(),
            uptime: host_uptime(),
        }
    }

    fn at(&self, i: Instant) -> f64 {
        match i.checked_duration_since(self.instant) {
            Some(after) => self.uptime + after.as_secs_f64(),
            None => self.uptime - self.instant.duration_since(i).as_secs_f64(),
        }
    }
}

/// The status of container `main`.
fn main_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "main")
}

fn terminated(pod: &Pod) -> Option<ContainerStateTerminated> {
    main_status(pod)?.state.as_ref()?.terminated.clone()
}

/// Container `main` has started (it runs or has run).
fn container_started(pod: &Pod) -> bool {
    main_status(pod)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
}

fn waiting_reason(pod: &Pod) -> Option<String> {
    main_status(pod)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

/// Milliseconds from `a` to `b` (API server times).
fn ms_between(a: &k8s_openapi::jiff::Timestamp, b: &k8s_openapi::jiff::Timestamp) -> i64 {
    b.as_millisecond() - a.as_millisecond()
}

// === the environment ===

impl RealEnv {
    /// Creates `set` and waits until its `replicas` members are Ready and it has our finalizer.
    async fn create_ready(&self, set: &StatefulSet, replicas: i32) {
        let t0 = Instant::now();
        let sets = self.sets();
        sets.create(&PostParams::default(), set)
            .await
            .expect("create statefulset");
        wait_for(
            &format!("{replicas} ready members on the real node"),
            Duration::from_secs(180),
            || async {
                let set = sets.get_opt(SET).await.ok().flatten();
                set.and_then(|s| s.status).and_then(|s| s.ready_replicas) == Some(replicas)
            },
        )
        .await;
        eprintln!(
            "e2e_realnode: {replicas} members Ready on {REAL_NODE} after {}",
            millis(t0.elapsed())
        );
        wait_for(&format!("finalizer on {SET}"), TIMEOUT, || async {
            sets.get_opt(SET).await.ok().flatten().is_some_and(|s| {
                let finalizers = s.metadata.finalizers.unwrap_or_default();
                finalizers.iter().any(|f| f == FINALIZER)
            })
        })
        .await;
        for o in 0..replicas {
            let states = self.pods.of(&format!("{SET}-{o}"));
            let node = states.iter().rev().find_map(|s| recorder::node(&s.object));
            assert_eq!(node, Some(REAL_NODE), "member {o} runs on the real node");
        }
    }

    async fn scale(&self, replicas: i32) {
        let patch = json!({"spec": {"replicas": replicas}});
        self.sets()
            .patch(SET, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("scale");
    }

    /// The host directory of the PV that claim `data-<SET>-<o>` is bound to.
    async fn volume_dir(&self, o: usize) -> PathBuf {
        let claim = self
            .claims_api()
            .get(&format!("data-{SET}-{o}"))
            .await
            .expect("get claim");
        let pv = claim.spec.and_then(|s| s.volume_name).expect("claim bound");
        self.ns.pv_dir(&self.pvs.class, &pv)
    }

    /// The cleanup pods of ordinal `o` (our owner annotation), by UID in order of creation.
    fn cleanup_uids(&self, o: usize) -> Vec<String> {
        let name = format!("{SET}-{o}");
        self.pods
            .uids_of(&name)
            .into_iter()
            .filter(|uid| {
                let ours = self
                    .pods
                    .first(|s| s.uid == *uid && s.annotations.contains_key(OWNER));
                ours.is_some()
            })
            .collect()
    }

    /// Every recorded state of the pod with `uid`.
    fn states(&self, uid: &str) -> Vec<Seen<Pod>> {
        self.pods.matching(|s| s.uid == uid)
    }

    /// The deletion of stateful member `o` (the pod without our owner annotation).
    fn member_gone(&self, o: usize) -> Seen<Pod> {
        let name = format!("{SET}-{o}");
        self.pods
            .first(|s| s.name == name && s.gone() && !s.annotations.contains_key(OWNER))
            .unwrap_or_else(|| panic!("no deletion of member {name} recorded"))
    }

    /// Asserts claim `data-<SET>-<o>` still exists, and no watch ever saw it being deleted.
    async fn assert_claim_kept(&self, o: usize) {
        let name = format!("data-{SET}-{o}");
        let live = self.claims_api().get_opt(&name).await.expect("get claim");
        let live = live.unwrap_or_else(|| panic!("claim {name} is gone"));
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "claim {name} is being deleted"
        );
        let deleting = self.claims.first(|s| s.name == name && s.deleting);
        assert!(
            deleting.is_none(),
            "claim {name} was seen being deleted: {deleting:?}"
        );
    }

    /// Waits until the controller has looked at the set `n` more times (its log), closing a window
    /// in which nothing may happen with a positive event.
    async fn wait_reconciles(&self, n: usize) {
        let controller = self.controller.as_ref().expect("controller");
        controller.wait_reconciles(&self.ns.name, SET, n).await;
    }
}

// === data path ===

#[tokio::test(flavor = "multi_thread")]
async fn real_node_data_path_ordered_scale_down_archives_removed_members() {
    data_path("realnode-data-path", "OrderedReady", 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn real_node_data_path_parallel_scale_down_archives_removed_members() {
    data_path("realnode-data-parallel", "Parallel", 1).await;
}

/// A sharded set of 4 members scaled to `target` with `policy`: every file of every removed member
/// is archived byte-identical, kept members keep their claims, and no claim was deleted before its
/// cleanup container exited 0.
async fn data_path(test: &str, policy: &str, target: i32) {
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_realnode",
        test,
        class: "real",
        pvs: 4,
        flags: &[],
        set: SET,
    })
    .await
    else {
        return;
    };
    let archive = env.ns.shared_host_dir("archive");
    let cleanup = cleanup_template("busybox", ARCHIVE_CLEANUP, None, Some(&archive));
    let set = sharded_set(4, policy, &env.pvs.class, 5, &member_script(), &cleanup);
    env.create_ready(&set, 4).await;
    for o in 0..4 {
        let dir = env.volume_dir(o).await;
        assert_shard(&dir.join(format!("shard-{o}")), o, "its volume");
    }
    eprintln!("e2e_realnode: every member's files are on the host");

    let removed: Vec<usize> = (target as usize..4).rev().collect();
    let scaled = Instant::now();
    env.scale(target).await;
    for o in &removed {
        let claim = format!("data-{SET}-{o}");
        wait_for_gone(&env.claims_api(), &claim, TIMEOUT).await;
    }
    eprintln!(
        "e2e_realnode: {policy} 4 -> {target}: claims of members {removed:?} gone {} after the scale-down",
        millis(scaled.elapsed())
    );
    for &o in &removed {
        assert_shard(&archive.join(format!("shard-{o}")), o, "the archive");
    }
    for o in 0..target as usize {
        env.assert_claim_kept(o).await;
    }
    for &o in &removed {
        let (gone_to_running, exit_to_deleted) = assert_deleted_after_exit(&env, o);
        let what = format!("real node, {policy} 4 -> {target}");
        record(
            &format!("{what}: stateful pod gone -> cleanup pod Running (member {o})"),
            millis(gone_to_running),
        );
        record(
            &format!("{what}: cleanup container exit -> claim deleted (member {o})"),
            millis(exit_to_deleted),
        );
    }
}

/// The files member `o` wrote are in `dir` (a `shard-<o>` directory in `place`), byte-identical.
fn assert_shard(dir: &Path, o: usize, place: &str) {
    for i in 1..=FILES_PER_SHARD {
        let path = dir.join(format!("file-{i}.bin"));
        let got = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "file {i} of member {o} not in {place}, {}: {e}",
                path.display()
            )
        });
        let want = expected_file(o, i);
        assert!(
            got == want,
            "{} differs from what member {o} wrote ({} bytes, expected {})",
            path.display(),
            got.len(),
            want.len()
        );
    }
}

/// From the recordings: the cleanup pod of `o` ran on the real node, its container exited 0, and
/// its claim was deleted after that. Returns (member gone -> cleanup Running, exit -> claim deleted).
fn assert_deleted_after_exit(env: &RealEnv, o: usize) -> (Duration, Duration) {
    let name = format!("{SET}-{o}");
    let claim_name = format!("data-{name}");
    let member_gone = env.member_gone(o);
    let uids = env.cleanup_uids(o);
    let uid = uids
        .first()
        .unwrap_or_else(|| panic!("no cleanup pod {name} recorded"));
    let cleanup = env.states(uid);
    let node = cleanup.iter().find_map(|s| recorder::node(&s.object));
    assert_eq!(
        node,
        Some(REAL_NODE),
        "cleanup pod {name} ran on the real node"
    );
    // A short script can go from Pending to Succeeded between two status updates: the first
    // state with the container started (running or already terminated) counts.
    let running = cleanup
        .iter()
        .find(|s| recorder::phase(&s.object) == "Running" || container_started(&s.object))
        .unwrap_or_else(|| panic!("cleanup pod {name} never seen Running"));
    let exited = cleanup
        .iter()
        .find(|s| terminated(&s.object).is_some())
        .unwrap_or_else(|| panic!("cleanup container of {name} never seen terminated"));
    let term = terminated(&exited.object).expect("terminated");
    assert_eq!(term.exit_code, 0, "cleanup container of {name} exit code");
    let finished_at = term.finished_at.expect("finishedAt").0;

    let claim_deleting = env
        .claims
        .first(|s| s.name == claim_name && s.deleting)
        .unwrap_or_else(|| panic!("no deletion of claim {claim_name} recorded"));
    let deletion_ts = claim_deleting
        .object
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0);
    // One etcd: resource versions order changes across kinds. The claim's deletion must come
    // after the change that recorded the container's exit 0.
    assert!(
        claim_deleting.resource_version > exited.resource_version,
        "claim {claim_name} deleted (rv {}) before its cleanup container's exit was recorded (rv {})",
        claim_deleting.resource_version,
        exited.resource_version
    );
    if let Some(ts) = deletion_ts {
        // Both are second-precision server times.
        assert!(
            ts >= finished_at,
            "claim {claim_name} deletionTimestamp {ts:?} before the cleanup container finished at {finished_at:?}"
        );
    }
    let gone_to_running = running.at.saturating_duration_since(member_gone.at);
    let exit_to_deleted = claim_deleting.at.saturating_duration_since(exited.at);
    eprintln!(
        "e2e_realnode: member {o}: stateful pod gone -> cleanup pod Running: {}; cleanup container exit (seen) -> claim deleted (seen): {}; finishedAt {finished_at:?}, claim deletionTimestamp {deletion_ts:?}",
        millis(gone_to_running),
        millis(exit_to_deleted)
    );
    (gone_to_running, exit_to_deleted)
}

// === no overlap ===

/// Members with a 10 s grace period that take 2 s to stop after SIGTERM, scaled 3 -> 1
/// (Parallel): each removed member wrote its stop time into its volume before its cleanup pod
/// wrote its start time there, and the cleanup container started only after the member pod was
/// gone (pod watch).
#[tokio::test(flavor = "multi_thread")]
async fn real_node_terminating_member_and_cleanup_never_share_the_volume() {
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_realnode",
        test: "realnode-no-overlap",
        class: "real",
        pvs: 3,
        flags: &[],
        set: SET,
    })
    .await
    else {
        return;
    };
    let cleanup = cleanup_template("busybox", &timed_cleanup(), None, None);
    let member = slow_stopping_member();
    let set = sharded_set(3, "Parallel", &env.pvs.class, 10, &member, &cleanup);
    env.create_ready(&set, 3).await;
    let mut dirs = BTreeMap::new();
    for o in [1usize, 2] {
        dirs.insert(o, env.volume_dir(o).await);
    }

    let scaled_at = host_uptime();
    env.scale(1).await;
    for o in dirs.keys() {
        wait_for_gone(&env.claims_api(), &format!("data-{SET}-{o}"), TIMEOUT).await;
    }
    let clock = HostClock::now();
    for (&o, dir) in &dirs {
        let sigterm = pod_clock(dir, "member-sigterm");
        let stopped = pod_clock(dir, "member-stopped");
        let started = pod_clock(dir, "cleanup-started");
        let ended = pod_clock(dir, "cleanup-ended");
        assert!(
            scaled_at < sigterm,
            "member {o}: SIGTERM at {sigterm} s, before the scale-down at {scaled_at} s: the clocks are not one"
        );
        assert!(
            stopped - sigterm >= 2.0,
            "member {o}: stopped {stopped} s only {:.2} s after SIGTERM ({sigterm} s): its grace period was cut short",
            stopped - sigterm
        );
        assert!(
            stopped < started,
            "member {o} stopped at {stopped} s, after its cleanup pod started at {started} s: two pods used the volume at once"
        );
        assert!(
            started < ended,
            "cleanup of {o}: started {started} s, ended {ended} s"
        );
        let (gone, container) = assert_started_after_member_gone(&env, o);
        eprintln!(
            "e2e_realnode: member {o}: SIGTERM {sigterm:.2} s, stopped {stopped:.2} s (+{:.2} s), pod gone (seen) {:.2} s, cleanup container started (seen) {:.2} s, cleanup script started {started:.2} s (+{:.2} s after the member stopped), ended {ended:.2} s",
            stopped - sigterm,
            clock.at(gone),
            clock.at(container),
            started - stopped,
        );
        record(
            &format!("real node: member stopped -> its cleanup started (member {o})"),
            format!("{} ms", ((started - stopped) * 1000.0).round()),
        );
    }
}

/// From the pod watch: the first state of `o`'s cleanup pod with its container started came after
/// the member pod was gone (in etcd order and as seen), and the container's `startedAt` is not
/// before the member container's `finishedAt`. Returns when the two were seen.
fn assert_started_after_member_gone(env: &RealEnv, o: usize) -> (Instant, Instant) {
    let gone = env.member_gone(o);
    let uids = env.cleanup_uids(o);
    let uid = uids
        .first()
        .unwrap_or_else(|| panic!("no cleanup pod of {o} recorded"));
    let states = env.states(uid);
    let created = states.first().expect("a recorded state");
    let started = states
        .iter()
        .find(|s| container_started(&s.object))
        .unwrap_or_else(|| panic!("cleanup container of {o} never seen started"));
    assert!(
        created.resource_version > gone.resource_version && started.at >= gone.at,
        "cleanup pod of {o} (rv {}, started rv {}) before member {o} was gone (rv {})",
        created.resource_version,
        started.resource_version,
        gone.resource_version
    );
    let member_finished = terminated(&gone.object).and_then(|t| t.finished_at);
    let cleanup_started = main_status(&started.object)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.running.as_ref().and_then(|r| r.started_at.clone()));
    if let (Some(f), Some(s)) = (&member_finished, &cleanup_started) {
        assert!(
            s.0 >= f.0,
            "cleanup of {o} started at {:?}, member finished at {:?}",
            s.0,
            f.0
        );
    }
    (gone.at, started.at)
}

// === failure ===

/// A cleanup container that exits 3, with 2 attempts and a 2 s backoff: a Warning
/// `CleanupFailed` carrying exit code 3 after attempt 1, attempt 2 no sooner than the backoff
/// allows, `CleanupGaveUp` after it, the failed pod kept, and the claim kept throughout.
#[tokio::test(flavor = "multi_thread")]
async fn real_node_cleanup_exit_3_is_retried_with_backoff_then_given_up() {
    let flags = [
        "--cleanup-attempts",
        "2",
        "--cleanup-backoff",
        "2s",
        "--resync-period",
        "2s",
    ];
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_realnode",
        test: "realnode-exit-3",
        class: "real",
        pvs: 2,
        flags: &flags,
        set: SET,
    })
    .await
    else {
        return;
    };
    // `Never`: under the default `OnFailure` the kubelet restarts the container in place
    // (CrashLoopBackOff), the pod stays Running and never reaches phase Failed.
    let cleanup = cleanup_template("busybox", &failing_cleanup(), Some("Never"), None);
    let set = sharded_set(2, "Parallel", &env.pvs.class, 5, IDLE_MEMBER, &cleanup);
    env.create_ready(&set, 2).await;
    let dir = env.volume_dir(1).await;
    env.scale(1).await;
    env.events.wait_event(SET, "CleanupGaveUp", TIMEOUT).await;
    // The window: the controller looks at the set twice more after giving up.
    env.wait_reconciles(2).await;
    let uids = env.cleanup_uids(1);
    assert_eq!(
        uids.len(),
        2,
        "two cleanup pods, no third after giving up: {uids:?}"
    );
    let attempts = assert_attempts_failed_with_3(&env, &uids);
    assert_failure_events(&env, &uids);
    assert!(
        env.pods.deletion_of(&uids[0]).is_some(),
        "attempt 1 deleted for the retry"
    );
    assert!(
        env.pods.deletion_of(&uids[1]).is_none(),
        "the given-up pod stays"
    );
    assert_backoff(&env, &dir, &uids, &attempts, Duration::from_secs(2));
    env.assert_claim_kept(1).await;
    env.assert_claim_kept(0).await;
}

/// The same failing script under the default `restartPolicy` (`OnFailure`): the kubelet restarts
/// the container in place and the pod never reaches Failed. A Warning `CleanupFailed` names the
/// restarts and exit code 3 from the real container status; no second pod, the claims kept.
#[tokio::test(flavor = "multi_thread")]
async fn real_node_cleanup_restarted_in_place_is_reported_and_claims_kept() {
    let flags = ["--cleanup-attempts", "2", "--resync-period", "2s"];
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_realnode",
        test: "realnode-restarts",
        class: "real",
        pvs: 2,
        flags: &flags,
        set: SET,
    })
    .await
    else {
        return;
    };
    let cleanup = cleanup_template("busybox", &failing_cleanup(), None, None);
    let set = sharded_set(2, "Parallel", &env.pvs.class, 5, IDLE_MEMBER, &cleanup);
    env.create_ready(&set, 2).await;
    env.scale(1).await;
    let seen = env
        .events
        .wait_for("Warning CleanupFailed for a restart", TIMEOUT, |s| {
            recorder::ours(&s.object)
                && recorder::event_reason(&s.object) == "CleanupFailed"
                && event_note(&s.object).contains("restarted it in place")
        })
        .await;
    let note = event_note(&seen.object);
    assert_eq!(seen.object.type_.as_deref(), Some("Warning"));
    assert!(
        note.contains("exit code 3") && note.contains("container main"),
        "{note}"
    );
    let uids = env.cleanup_uids(1);
    assert_eq!(
        uids.len(),
        1,
        "one cleanup pod, restarted in place: {uids:?}"
    );
    let pod = last_state(&env, &uids[0]);
    let status = main_status(&pod).expect("container status");
    let last_exit = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert!(status.restart_count >= 1, "restarted by the kubelet");
    assert_eq!(last_exit, Some(3), "the real container's exit code");
    assert_ne!(
        recorder::phase(&pod),
        "Failed",
        "OnFailure never fails the pod"
    );
    assert_eq!(
        seen.object.action.as_deref(),
        Some(uids[0].as_str()),
        "about the pod"
    );
    eprintln!("e2e_realnode: restarted in place: {note}");
    env.wait_reconciles(2).await;
    assert!(env.pods.deletion_of(&uids[0]).is_none(), "the pod stays");
    env.assert_claim_kept(1).await;
    env.assert_claim_kept(0).await;
}

/// Cleanup pods `uids` are attempts 1, 2, ... (annotation), ran on the real node and failed with
/// their container's real exit code 3. Returns their last recorded states.
fn assert_attempts_failed_with_3(env: &RealEnv, uids: &[String]) -> Vec<Pod> {
    let pods: Vec<Pod> = uids.iter().map(|u| last_state(env, u)).collect();
    for (i, pod) in pods.iter().enumerate() {
        let n = i + 1;
        let attempt = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ATTEMPT));
        assert_eq!(
            attempt.cloned(),
            Some(n.to_string()),
            "attempt annotation of pod {n}"
        );
        assert_eq!(
            recorder::node(pod),
            Some(REAL_NODE),
            "attempt {n} on the real node"
        );
        assert_eq!(recorder::phase(pod), "Failed", "phase of attempt {n}");
        let exit = terminated(pod).map(|t| t.exit_code);
        assert_eq!(exit, Some(3), "attempt {n}: the real container's exit code");
    }
    pods
}

/// One Warning `CleanupFailed` about attempt 1 (its action is the pod's UID) and one Warning
/// `CleanupGaveUp` about attempt 2, both with the container's exit code 3.
fn assert_failure_events(env: &RealEnv, uids: &[String]) {
    let all = env.events.describe();
    for (reason, uid, attempt) in [
        ("CleanupFailed", &uids[0], "(attempt 1 of 2)"),
        ("CleanupGaveUp", &uids[1], "(attempt 2 of 2)"),
    ] {
        let events = env.events.events(SET, reason);
        let actions: Vec<&str> = events
            .iter()
            .map(|e| e.action.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(
            actions,
            [uid.as_str()],
            "{reason} Events, by pod UID; all Events:\n{all}"
        );
        let event = &events[0];
        assert_eq!(event.type_.as_deref(), Some("Warning"), "{reason}");
        let note = event_note(event);
        assert!(
            note.contains(attempt) && note.contains("exit code 3"),
            "{reason}: {note}"
        );
        eprintln!("e2e_realnode: {reason}: {note}");
    }
}

/// The latest recorded state of the pod with `uid`.
fn last_state(env: &RealEnv, uid: &str) -> Pod {
    let states = env.states(uid);
    let last = states.iter().rev().find(|s| !s.gone()).or(states.last());
    (*last.expect("recorded").object).clone()
}

/// The gap between attempt 1 and attempt 2 is at least `backoff` on the API server's clock, which
/// the controller counts on: attempt 1's container `finishedAt` -> attempt 2's `creationTimestamp`.
/// On the host's clock (the script's exit -> the retry's delete of attempt 1, and -> the start of
/// attempt 2's script) it may be up to 1 s shorter: those API times are whole seconds (truncated),
/// and the controller counts from the latest of them (docs/usage.md, "Failure").
fn assert_backoff(env: &RealEnv, dir: &Path, uids: &[String], pods: &[Pod], backoff: Duration) {
    let log = std::fs::read_to_string(dir.join("attempts.log")).expect("attempts.log");
    let times = |what: &str| -> Vec<f64> {
        log.lines()
            .filter_map(|l| l.strip_prefix(what))
            .map(parse_uptime)
            .collect()
    };
    let (starts, exits) = (times("start "), times("exit "));
    assert_eq!(
        (starts.len(), exits.len()),
        (2, 2),
        "two attempts ran, once each: {log}"
    );
    let finished = terminated(&pods[0])
        .and_then(|t| t.finished_at)
        .expect("finishedAt")
        .0;
    let created = pods[1]
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("created")
        .0;
    let api_gap = ms_between(&finished, &created);
    let clock = HostClock::now();
    let deleted = env.pods.deletion_of(&uids[0]).expect("attempt 1 deleted");
    let to_delete = clock.at(deleted.at) - exits[0];
    let to_start = starts[1] - exits[0];
    eprintln!(
        "e2e_realnode: backoff {backoff:?}: attempt 1 exit -> retry (attempt 1 deleted, seen) {to_delete:.2} s, -> attempt 2 script start {to_start:.2} s; finishedAt -> attempt 2 creationTimestamp {api_gap} ms; log: {log:?}"
    );
    record(
        "real node: exit 3, attempt 1 exit -> retry delete (backoff 2s)",
        format!("{:.0} ms", to_delete * 1000.0),
    );
    record(
        "real node: exit 3, attempt 1 exit -> attempt 2 start (backoff 2s)",
        format!("{:.0} ms", to_start * 1000.0),
    );
    assert!(
        api_gap >= backoff.as_millis() as i64,
        "attempt 2 created {api_gap} ms after attempt 1 finished (backoff {backoff:?})"
    );
    let min = backoff.as_secs_f64() - 1.0;
    assert!(
        to_delete >= min,
        "attempt 1 deleted for the retry {to_delete:.2} s after its exit (backoff {backoff:?})"
    );
    assert!(
        to_start >= min && to_start > to_delete,
        "attempt 2 started {to_start:.2} s after attempt 1 exited (backoff {backoff:?})"
    );
}

/// A cleanup image that cannot be pulled, with a 5 s pending timeout: the pod is really in
/// ErrImagePull/ImagePullBackOff on the real node, a Warning `CleanupPodStuck` comes no sooner
/// than the timeout, and the claims are kept.
#[tokio::test(flavor = "multi_thread")]
async fn real_node_cleanup_image_pull_failure_is_reported_stuck() {
    let flags = ["--cleanup-pending-timeout", "5s", "--resync-period", "2s"];
    let Some(env) = RealEnv::new(RealTest {
        suite: "e2e_realnode",
        test: "realnode-no-image",
        class: "real",
        pvs: 2,
        flags: &flags,
        set: SET,
    })
    .await
    else {
        return;
    };
    let image = "docker.io/library/scaledown-no-such-image:1";
    let cleanup = cleanup_template(image, "exit 0", None, None);
    let set = sharded_set(2, "Parallel", &env.pvs.class, 5, IDLE_MEMBER, &cleanup);
    env.create_ready(&set, 2).await;
    env.scale(1).await;

    let name = format!("{SET}-1");
    let pulling = env
        .pods
        .wait_for("cleanup pod failing to pull its image", TIMEOUT, |s| {
            s.name == name
                && s.annotations.contains_key(OWNER)
                && matches!(
                    waiting_reason(&s.object).as_deref(),
                    Some("ErrImagePull" | "ImagePullBackOff")
                )
        })
        .await;
    assert_eq!(
        recorder::node(&pulling.object),
        Some(REAL_NODE),
        "on the real node"
    );
    assert_eq!(recorder::phase(&pulling.object), "Pending");
    let message = main_status(&pulling.object)
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone());
    eprintln!(
        "e2e_realnode: cleanup pod {name}: {:?}: {message:?}",
        waiting_reason(&pulling.object)
    );
    let api_ms = assert_stuck_event(&env, &pulling, Duration::from_secs(5)).await;
    record(
        "real node: image pull failure, cleanup pod created -> CleanupPodStuck (timeout 5s)",
        format!("{api_ms} ms"),
    );

    // The window: the controller looks at the set twice more; the pod and the claims stay.
    env.wait_reconciles(2).await;
    assert!(
        env.pods.deletion_of(&pulling.uid).is_none(),
        "the stuck pod was deleted"
    );
    assert_eq!(env.cleanup_uids(1).len(), 1, "one cleanup pod");
    let now = last_state(&env, &pulling.uid);
    assert_eq!(
        recorder::phase(&now),
        "Pending",
        "the stuck pod is still Pending"
    );
    env.assert_claim_kept(1).await;
    env.assert_claim_kept(0).await;
}

/// Waits for the Warning `CleanupPodStuck` about cleanup pod `pod` and checks it came no sooner
/// than `timeout` after the pod's creationTimestamp (API server times); returns that delay in ms.
async fn assert_stuck_event(env: &RealEnv, pod: &Seen<Pod>, timeout: Duration) -> i64 {
    let seen = env
        .events
        .wait_for("Warning CleanupPodStuck", TIMEOUT, |s| {
            recorder::ours(&s.object) && recorder::event_reason(&s.object) == "CleanupPodStuck"
        })
        .await;
    let stuck = &seen.object;
    assert_eq!(stuck.type_.as_deref(), Some("Warning"));
    assert_eq!(recorder::event_regarding(stuck), SET);
    assert_eq!(
        stuck.action.as_deref(),
        Some(pod.uid.as_str()),
        "about the pod"
    );
    let note = event_note(stuck);
    let limit = format!("{}s", timeout.as_secs());
    assert!(
        note.contains(&pod.name) && note.contains("not started") && note.contains(&limit),
        "{note}"
    );
    let first = env.pods.first(|s| s.uid == pod.uid).expect("first state");
    let created = first
        .object
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("created")
        .0;
    let event_time = stuck.event_time.as_ref().expect("eventTime").0;
    let api_ms = ms_between(&created, &event_time);
    assert!(
        api_ms >= timeout.as_millis() as i64,
        "CleanupPodStuck {api_ms} ms after the pod's creationTimestamp"
    );
    eprintln!(
        "e2e_realnode: cleanup pod created -> CleanupPodStuck {api_ms} ms (API times), {} (seen); note: {note}",
        millis(seen.at.saturating_duration_since(first.at))
    );
    api_ms
}
