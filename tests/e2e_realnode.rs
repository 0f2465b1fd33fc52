//! e2e tests on the real node (`hack/real-node.sh`: a kubelet with containerd beside the KWOK
//! nodes, started by `hack/cluster.sh up` unless `SCALEDOWN_REAL_NODE=0`). Here containers really
//! run, volumes are really mounted, and the test reads from the host the files pods wrote.
//!
//! *Data path*: a sharded StatefulSet of four members, each writing its own files into its claim
//! (hostPath PVs on the real node); scaled 4 → 2 (OrderedReady), the controller's cleanup pods copy
//! the removed members' files to an archive (a plain hostPath volume shared with the test). The
//! test checks every file is there, byte-identical, and that no claim was deleted before its
//! cleanup container exited 0.
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_realnode` (or `make e2e`).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::fixtures::{Controller, FINALIZER, OWNER, record};
use support::recorder::{self, Recorder, Seen};
use support::{
    Cluster, REAL_NODE, from_json, real_node_ready, real_node_selector, real_node_skipped,
    real_node_toleration, wait_for, wait_for_gone,
};

const TIMEOUT: Duration = Duration::from_secs(120);
const FILES_PER_SHARD: usize = 3;

/// What member `ordinal` writes into `/data/shard-<ordinal>/file-<i>.bin` (the pod's script makes
/// the same bytes with `yes | head -c`): distinct per member and file, of different sizes.
fn expected_file(ordinal: usize, i: usize) -> Vec<u8> {
    let line = format!("shard {ordinal} file {i}\n");
    line.bytes()
        .cycle()
        .take(4096 * i + 17 * ordinal + 1)
        .collect()
}

/// The member's script: write the files (to a temp name, renamed when complete), mark the volume
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

/// The cleanup script: copy the removed member's files to the archive (under a temp name, renamed
/// when complete), then exit 0.
const CLEANUP_SCRIPT: &str = "set -e; o=$SCALEDOWN_ORDINAL; echo archiving shard $o; \
    rm -rf /archive/.shard-$o.tmp; mkdir -p /archive/.shard-$o.tmp; \
    cp -a /data/shard-$o/. /archive/.shard-$o.tmp/; sync; \
    mv /archive/.shard-$o.tmp /archive/shard-$o; ls -l /archive/shard-$o; echo archived shard $o";

fn millis(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[tokio::test]
async fn real_node_data_path_ordered_scale_down_archives_removed_members() {
    let cluster = Cluster::connect().await;
    if !real_node_ready(&cluster.client).await {
        if let Some(why) = real_node_skipped() {
            eprintln!("e2e_realnode: SKIPPED, no real node in this cluster: {why}");
            return;
        }
        panic!(
            "e2e: node {REAL_NODE} is not Ready; hack/cluster.sh up starts it (see hack/real-node.sh status)"
        );
    }
    let ns = cluster.namespace("realnode-data-path").await;
    let pvs = ns.create_real_pvs("real", 4).await;
    let archive = ns.shared_host_dir("archive");
    let set_name = "shard";

    let template = json!({
        "metadata": {"labels": {"app": "shard-cleanup"}},
        "spec": {
            "tolerations": [real_node_toleration()],
            "nodeSelector": real_node_selector(),
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", CLEANUP_SCRIPT],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "archive", "mountPath": "/archive"}
                ]
            }],
            "volumes": [{"name": "archive", "hostPath": {"path": archive.to_string_lossy(), "type": "Directory"}}]
        }
    });
    let set: StatefulSet = from_json(json!({
        "metadata": {"name": set_name, "annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": template.to_string()}},
        "spec": {
            "replicas": 4,
            "serviceName": set_name,
            "podManagementPolicy": "OrderedReady",
            "selector": {"matchLabels": {"app": set_name}},
            "template": {
                "metadata": {"labels": {"app": set_name}},
                "spec": {
                    "tolerations": [real_node_toleration()],
                    "nodeSelector": real_node_selector(),
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", member_script()],
                        "readinessProbe": {"exec": {"command": ["test", "-f", "/data/.written"]},
                                           "periodSeconds": 1},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]
                }
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": pvs.class,
                "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }));

    let _controller = Controller::start(&cluster, &ns.name, &[]).await;
    let pods_api: Api<Pod> = ns.api();
    let claims_api: Api<PersistentVolumeClaim> = ns.api();
    let sets: Api<StatefulSet> = ns.api();
    let pods = Recorder::start(pods_api.clone(), watcher::Config::default()).await;
    let claims = Recorder::start(claims_api.clone(), watcher::Config::default()).await;

    let t0 = Instant::now();
    sets.create(&PostParams::default(), &set)
        .await
        .expect("create statefulset");
    wait_for(
        "4 ready members on the real node",
        Duration::from_secs(180),
        || async {
            sets.get_opt(set_name)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.status)
                .and_then(|s| s.ready_replicas)
                == Some(4)
        },
    )
    .await;
    eprintln!(
        "e2e_realnode: 4 members Ready on {REAL_NODE} after {}",
        millis(t0.elapsed())
    );
    wait_for(&format!("finalizer on {set_name}"), TIMEOUT, || async {
        sets.get_opt(set_name)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| {
                s.metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == FINALIZER)
            })
    })
    .await;

    // Each member's files, read from its PV's directory on this host.
    let mut volume_of = BTreeMap::new();
    for o in 0..4usize {
        let claim = claims_api
            .get(&format!("data-{set_name}-{o}"))
            .await
            .expect("get claim");
        let pv = claim
            .spec
            .and_then(|s| s.volume_name)
            .expect("claim bound to a PV");
        let dir = ns.pv_dir(&pvs.class, &pv);
        let pod = pods_api
            .get(&format!("{set_name}-{o}"))
            .await
            .expect("get member");
        assert_eq!(
            recorder::node(&pod),
            Some(REAL_NODE),
            "member {o} runs on the real node"
        );
        for i in 1..=FILES_PER_SHARD {
            let path = dir.join(format!("shard-{o}/file-{i}.bin"));
            let got = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("member {o} did not write {}: {e}", path.display()));
            assert!(
                got == expected_file(o, i),
                "{} has other bytes than member {o} should have written",
                path.display()
            );
        }
        volume_of.insert(o, dir);
    }
    eprintln!("e2e_realnode: every member's files are on the host: {volume_of:?}");

    // Scale 4 -> 2: members 3 and 2 go (OrderedReady: 3 first), each followed by its cleanup pod.
    let scaled = Instant::now();
    sets.patch(
        set_name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await
    .expect("scale");
    for o in [3, 2] {
        wait_for_gone(
            &claims_api,
            &format!("data-{set_name}-{o}"),
            Duration::from_secs(240),
        )
        .await;
    }
    eprintln!(
        "e2e_realnode: claims of members 3 and 2 gone {} after the scale-down",
        millis(scaled.elapsed())
    );

    // Every file the removed members wrote is in the archive, byte-identical.
    for o in [2usize, 3] {
        for i in 1..=FILES_PER_SHARD {
            let path = archive.join(format!("shard-{o}/file-{i}.bin"));
            let got = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "the cleanup of member {o} did not archive {}: {e}",
                    path.display()
                )
            });
            assert!(
                got == expected_file(o, i),
                "{} differs from what member {o} wrote ({} bytes, expected {})",
                path.display(),
                got.len(),
                expected_file(o, i).len()
            );
        }
    }
    // The kept members' claims are still there.
    for o in [0, 1] {
        assert!(
            claims_api
                .get_opt(&format!("data-{set_name}-{o}"))
                .await
                .expect("get claim")
                .is_some(),
            "claim of kept member {o} is gone"
        );
    }

    // Order and timings, from the watch recordings.
    let seen_pods = pods.seen();
    let seen_claims = claims.seen();
    for o in [3usize, 2] {
        let name = format!("{set_name}-{o}");
        let claim_name = format!("data-{name}");
        let mine: Vec<&Seen<Pod>> = seen_pods.iter().filter(|s| s.name == name).collect();
        let member_gone = mine
            .iter()
            .find(|s| s.gone() && !s.annotations.contains_key(OWNER))
            .unwrap_or_else(|| panic!("no deletion of member {name} recorded"));
        let cleanup_uid = mine
            .iter()
            .find(|s| s.annotations.contains_key(OWNER))
            .map(|s| s.uid.clone())
            .unwrap_or_else(|| panic!("no cleanup pod {name} recorded"));
        let cleanup: Vec<&&Seen<Pod>> = mine.iter().filter(|s| s.uid == cleanup_uid).collect();
        assert_eq!(
            cleanup
                .iter()
                .filter_map(|s| recorder::node(&s.object))
                .next(),
            Some(REAL_NODE),
            "cleanup pod {name} ran on the real node"
        );
        let running = cleanup
            .iter()
            .find(|s| recorder::phase(&s.object) == "Running")
            .unwrap_or_else(|| panic!("cleanup pod {name} never seen Running"));
        let terminated = |s: &Seen<Pod>| {
            s.object
                .status
                .as_ref()
                .and_then(|st| st.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == "main"))
                .and_then(|c| c.state.as_ref())
                .and_then(|st| st.terminated.clone())
        };
        let exited = cleanup
            .iter()
            .find(|s| terminated(s).is_some())
            .unwrap_or_else(|| panic!("cleanup container of {name} never seen terminated"));
        let term = terminated(exited).expect("terminated");
        assert_eq!(term.exit_code, 0, "cleanup container of {name} exit code");
        let finished_at = term.finished_at.expect("finishedAt").0;

        let claim_deleting = seen_claims
            .iter()
            .find(|s| s.name == claim_name && s.deleting)
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
        record(
            &format!("real node: stateful pod gone -> cleanup pod Running (member {o})"),
            millis(gone_to_running),
        );
        record(
            &format!("real node: cleanup container exit -> claim deleted (member {o})"),
            millis(exit_to_deleted),
        );
    }
}
