//! The PV pool releaser (`--pv-releaser-id`) on the local control plane: the real PV binder makes
//! Retain PVs `Released` when their claims go; the releaser makes the ones of its classes
//! `Available` again, and they are bound again by the next claim. The controller runs cluster-wide
//! with `--disable-scaledown` (so it leaves other tests' StatefulSets alone) and an id of its own
//! (so it leaves other tests' PVs alone).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use support::fixtures::*;
use support::pool::*;
use support::recorder::Recorder;
use support::{Cluster, Reclaim, wait_for};

fn start_releaser(cluster: &Cluster, id: &str) -> Controller {
    start_releaser_with(cluster, id, "--metrics-bind-address=0")
}

fn start_releaser_with(cluster: &Cluster, id: &str, metrics: &str) -> Controller {
    let args = [
        "--disable-scaledown",
        "--pv-releaser-id",
        id,
        metrics,
        "--health-probe-bind-address=0",
    ];
    Controller::spawn(&cluster.kubeconfig, &format!("{id}-releaser"), &args, &[])
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The controller's /metrics on 127.0.0.1:`port`, once it answers.
async fn scrape(port: u16) -> String {
    let get = move || -> Option<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.contains(" 200 ").then(|| body.to_string())
    };
    support::wait_for_some("the controller's /metrics", LONG, || async move {
        tokio::task::spawn_blocking(get).await.ok().flatten()
    })
    .await
}

/// A recorder of the Events in `default`, where Events about cluster-scoped PVs go.
/// A recorder of every PV of the cluster.
async fn record_pvs(cluster: &Cluster) -> Recorder<PersistentVolume> {
    Recorder::start(
        Api::<PersistentVolume>::all(cluster.client.clone()),
        kube::runtime::watcher::Config::default(),
    )
    .await
}

async fn record_pv_events(cluster: &Cluster) -> Recorder<Event> {
    Recorder::start(
        Api::<Event>::namespaced(cluster.client.clone(), "default"),
        kube::runtime::watcher::Config::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn released_pvs_of_our_classes_become_available_and_are_bound_again() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("releaser").await;
    let pool = ns.create_static_pvs("pool", 1, Reclaim::Retain).await;
    let other = ns.create_static_pvs("other", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    annotate_class(&cluster, &pool.class, &id).await;
    annotate_class(&cluster, &other.class, "someone-else").await;
    let (pool_pv, other_pv) = (pool.names[0].clone(), other.names[0].clone());
    let pvs = record_pvs(&cluster).await;
    let port = free_port();
    let controller = start_releaser_with(
        &cluster,
        &id,
        &format!("--metrics-bind-address=127.0.0.1:{port}"),
    );
    let released_before =
        support::metric_sum(&scrape(port).await, "scaledown_pv_released_total", &[]);

    bind(&ns, "cache-a", &pool_pv, &pool.class).await;
    bind(&ns, "cache-b", &other_pv, &other.class).await;
    delete_claim(&ns, "cache-b").await;
    delete_claim(&ns, "cache-a").await;
    let took = wait_released(&pvs, &pool_pv).await;
    record(
        "pv releaser: PV Released -> Available",
        format!("{} ms", took.as_millis()),
    );
    eprintln!(
        "pv releaser: PV Released -> Available in {} ms",
        took.as_millis()
    );

    // The pool works as a pool: the released PV is bound by the next claim, and released again.
    bind(&ns, "cache-c", &pool_pv, &pool.class).await;
    let mark = pvs.mark();
    delete_claim(&ns, "cache-c").await;
    pvs.wait_for_since(mark, "PV released a second time", LONG, |s| {
        s.name == pool_pv && is_free(&s.object)
    })
    .await;

    assert_left_released(&cluster, &controller, &pvs, &other_pv).await;

    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    let released_events = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pool_pv.as_str()))
        .filter(|e| e.reason.as_deref() == Some("Released"))
        .count();
    assert!(released_events >= 1, "a Released Event on the PV");
    // Two releases of the pool PV, and none of the other one.
    let released_after =
        support::metric_sum(&scrape(port).await, "scaledown_pv_released_total", &[]);
    assert_eq!(
        released_after - released_before,
        2.0,
        "scaledown_pv_released_total went from {released_before} to {released_after}"
    );
}

/// The releaser looked at `pv` while it was Released (a `NotOurs` decision in its log), left it
/// alone (its claimRef never cleared after it was Released), and it is still Released.
async fn assert_left_released(
    cluster: &Cluster,
    controller: &Controller,
    pvs: &Recorder<PersistentVolume>,
    other_pv: &str,
) {
    let looked = format!("pv={other_pv}");
    wait_for("the releaser's decision on the other PV", LONG, || {
        let log = controller.log_text();
        let seen = log
            .lines()
            .any(|l| l.contains(&looked) && l.contains("NotOurs"));
        async move { seen }
    })
    .await;
    let other_seen = pvs.of(other_pv);
    let released_at = other_seen
        .iter()
        .find(|s| phase(&s.object) == "Released")
        .map(|s| s.at)
        .expect("the other PV was Released");
    let lost_claim_ref = other_seen
        .iter()
        .filter(|s| s.at > released_at)
        .filter(|s| {
            s.object
                .spec
                .as_ref()
                .is_some_and(|sp| sp.claim_ref.is_none())
        })
        .count();
    assert_eq!(
        lost_claim_ref, 0,
        "a PV of another releaser's class was released"
    );
    let other_now = Api::<PersistentVolume>::all(cluster.client.clone())
        .get(other_pv)
        .await
        .expect("get the other PV");
    assert_eq!(phase(&other_now), "Released");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_releaser_refuses_namespace_scope_at_start() {
    let cluster = Cluster::connect().await;
    let mut controller = Controller::spawn(
        &cluster.kubeconfig,
        "releaser-namespace-scope",
        &["--namespace", "default", "--pv-releaser-id", "x"],
        &[],
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = controller.exited() {
            break status;
        }
        assert!(started.elapsed() < LONG, "the controller did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "a configuration error");
    assert!(
        controller.log_text().contains("needs cluster scope"),
        "{}",
        controller.log_text()
    );
}

/// A scrub template that finishes (KWOK completes `scaledown-pod` pods) with `outcome`.
fn scrub_template(outcome: &str) -> String {
    serde_json::json!({
        "metadata": {"labels": {"scaledown-pod": "scrub", "sim.scaledown.io/outcome": outcome},
                     "annotations": {"sim.scaledown.io/after": "1s"}},
        "spec": {"containers": [{"name": "wipe", "image": "busybox",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}
    })
    .to_string()
}

async fn set_scrub_template(cluster: &Cluster, class: &str, template: &str) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> =
        Api::all(cluster.client.clone());
    let patch = serde_json::json!({"metadata": {"annotations": {
        "reclaimable-pv-releaser.kubernetes.io/scrub-pod-template": template}}});
    classes
        .patch(
            class,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("annotate the StorageClass");
}

fn scrub_state(pv: &PersistentVolume) -> Option<&str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("reclaimable-pv-releaser.kubernetes.io/scrub-state"))
        .map(String::as_str)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pv_is_scrubbed_before_its_release_and_a_failed_scrub_keeps_it_released() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("scrub").await;
    let clean = ns.create_static_pvs("clean", 1, Reclaim::Retain).await;
    let dirty = ns.create_static_pvs("dirty", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    for (class, outcome) in [(&clean.class, "Succeeded"), (&dirty.class, "Failed")] {
        annotate_class(&cluster, class, &id).await;
        set_scrub_template(&cluster, class, &scrub_template(outcome)).await;
    }
    let (clean_pv, dirty_pv) = (clean.names[0].clone(), dirty.names[0].clone());
    let pvs = record_pvs(&cluster).await;
    let events = record_pv_events(&cluster).await;
    let port = free_port();
    let metrics = format!("--metrics-bind-address=127.0.0.1:{port}");
    let args = [
        "--disable-scaledown",
        "--pv-releaser-id",
        &id,
        "--pv-scrub-namespace",
        &ns.name,
        &metrics,
        "--health-probe-bind-address=0",
    ];
    let controller = Controller::spawn(&cluster.kubeconfig, &format!("{id}-scrub"), &args, &[]);
    bind(&ns, "cache-a", &clean_pv, &clean.class).await;
    bind(&ns, "cache-b", &dirty_pv, &dirty.class).await;
    delete_claim(&ns, "cache-a").await;
    delete_claim(&ns, "cache-b").await;

    assert_scrubbed_then_released(&cluster, &pvs, &clean_pv).await;

    // The failed scrub: recorded, the temporary claim deleted, the PV Released and never handed out.
    let failed = pvs
        .wait_for(
            "the dirty PV Released again after its failed scrub",
            LONG,
            |s| {
                s.name == dirty_pv
                    && phase(&s.object) == "Released"
                    && scrub_state(&s.object).is_some_and(|st| st.starts_with("failed:"))
            },
        )
        .await;
    let looked = format!("pv={dirty_pv}");
    wait_for(
        "the releaser's decision after the failed scrub",
        LONG,
        || {
            let log = controller.log_text();
            let seen = log
                .lines()
                .any(|l| l.contains(&looked) && l.contains("ScrubFailed"));
            async move { seen }
        },
    )
    .await;
    let handed_out = pvs
        .of(&dirty_pv)
        .iter()
        .filter(|s| s.at >= failed.at)
        .any(|s| {
            phase(&s.object) == "Available"
                || s.object
                    .spec
                    .as_ref()
                    .is_some_and(|sp| sp.claim_ref.is_none())
        });
    assert!(!handed_out, "a PV whose scrub failed was handed out");
    assert_scrubs_reported(&events, port, &clean_pv, &dirty_pv).await;
}

/// Scrubbed, then released: on the way the PV was bound to its temporary claim, and the scrub
/// record went with the release.
async fn assert_scrubbed_then_released(
    cluster: &Cluster,
    pvs: &Recorder<PersistentVolume>,
    clean_pv: &str,
) {
    wait_released(pvs, clean_pv).await;
    let temp = format!("scrub-{clean_pv}");
    let held = pvs.of(clean_pv).iter().any(|s| {
        s.object
            .spec
            .as_ref()
            .and_then(|sp| sp.claim_ref.as_ref())
            .and_then(|r| r.name.as_deref())
            == Some(temp.as_str())
            && phase(&s.object) == "Bound"
    });
    assert!(
        held,
        "the clean PV was held by its temporary claim while scrubbed"
    );
    let now = Api::<PersistentVolume>::all(cluster.client.clone())
        .get(clean_pv)
        .await
        .expect("get");
    assert_eq!(scrub_state(&now), None, "the record goes with the release");
}

/// Reported: a Warning `ErrScrubPV` on the dirty PV (none on the clean one), and one scrub of each
/// outcome in `scaledown_pv_scrubs_total`.
async fn assert_scrubs_reported(
    events: &Recorder<Event>,
    port: u16,
    clean_pv: &str,
    dirty_pv: &str,
) {
    let warning = events.wait_event(dirty_pv, "ErrScrubPV", LONG).await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        events.events(clean_pv, "ErrScrubPV").is_empty(),
        "no ErrScrubPV on the clean PV"
    );
    let metrics = scrape(port).await;
    let failed = support::metric_sum(
        &metrics,
        "scaledown_pv_scrubs_total",
        &[("outcome", "failed")],
    );
    let succeeded = support::metric_sum(
        &metrics,
        "scaledown_pv_scrubs_total",
        &[("outcome", "succeeded")],
    );
    assert_eq!(
        (failed, succeeded),
        (1.0, 1.0),
        "scaledown_pv_scrubs_total by outcome"
    );
}

/// A class whose scrub template cannot make a pod: the PV is not taken over (no temporary claim,
/// no record, its claimRef kept) and one Warning `ScrubBlocked` says why, however many passes
/// look at it; once the template is fixed, the PV is scrubbed and released.
#[tokio::test(flavor = "multi_thread")]
async fn a_scrub_that_cannot_run_is_reported_once_and_runs_once_fixed() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("blocked").await;
    let pool = ns.create_static_pvs("broken", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    annotate_class(&cluster, &pool.class, &id).await;
    set_scrub_template(&cluster, &pool.class, r#"{"spec":{"containers":[]}}"#).await;
    let pv = pool.names[0].clone();
    let pvs = record_pvs(&cluster).await;
    let events = record_pv_events(&cluster).await;
    let port = free_port();
    let metrics = format!("--metrics-bind-address=127.0.0.1:{port}");
    let args = [
        "--disable-scaledown",
        "--pv-releaser-id",
        &id,
        "--pv-scrub-namespace",
        &ns.name,
        &metrics,
        "--health-probe-bind-address=0",
    ];
    let controller = Controller::spawn(&cluster.kubeconfig, &format!("{id}-blocked"), &args, &[]);
    bind(&ns, "cache", &pv, &pool.class).await;
    delete_claim(&ns, "cache").await;
    let warning = events.wait_event(&pv, "ScrubBlocked", LONG).await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|n| n.contains("the scrub template has no containers")),
        "{warning:?}"
    );

    // More passes over the blocked PV: a change of its class wakes it. The marker that they ran:
    // the controller's decisions about it.
    let decided = || {
        let looked = format!("pv={pv}");
        controller
            .log_text()
            .lines()
            .filter(|l| l.contains("decided") && l.contains(&looked) && l.contains("ScrubBlocked"))
            .count()
    };
    let before = decided();
    for (i, poke) in ["1", "2"].into_iter().enumerate() {
        // One change at a time: changes that come while a pass is queued wake it only once.
        poke_class(&cluster, &pool.class, poke).await;
        wait_for(
            "a pass over the blocked PV after a change of its class",
            LONG,
            || {
                let seen = decided();
                async move { seen > before + i }
            },
        )
        .await;
    }
    let blocked = events.events(&pv, "ScrubBlocked");
    assert_eq!(blocked.len(), 1, "{}", events.describe());
    assert!(blocked[0].series.is_none(), "{}", events.describe());
    let reported = support::metric_sum(
        &scrape(port).await,
        "scaledown_events_total",
        &[("reason", "ScrubBlocked")],
    );
    assert_eq!(reported, 1.0, "one ScrubBlocked counted");
    let released = pvs
        .wait_for("the blocked PV Released", LONG, |s| {
            s.name == pv && phase(&s.object) == "Released"
        })
        .await;
    let touched = pvs.of(&pv).iter().filter(|s| s.at >= released.at).any(|s| {
        scrub_state(&s.object).is_some()
            || s.object
                .spec
                .as_ref()
                .and_then(|sp| sp.claim_ref.as_ref())
                .and_then(|r| r.name.as_deref())
                != Some("cache")
    });
    assert!(!touched, "the blocked PV was written to");
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(cluster.client.clone(), &ns.name);
    let temp = claims.get_opt(&format!("scrub-{pv}")).await.expect("get");
    assert!(temp.is_none(), "no temporary claim for a blocked scrub");

    // Fixed: the class change wakes the PV, and it is scrubbed, then released.
    set_scrub_template(&cluster, &pool.class, &scrub_template("Succeeded")).await;
    assert_scrubbed_then_released(&cluster, &pvs, &pv).await;
}

/// A claim named like the temporary claim (`scrub-<pv>`, in the scrub namespace, volumeName set to
/// the PV) that someone else created before the scrub: the PV is never handed to it (its claimRef
/// never names that claim, watched over the whole test), one Warning `ScrubBlocked` names it, and
/// the PV is backed off; once that claim is gone, the PV is scrubbed and released. (The releaser
/// adopted it on the 409 of its create and bound the Released PV, with its data, to it.)
#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_claim_named_like_the_temporary_claim_never_gets_the_pv() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("foreign").await;
    let pool = ns.create_static_pvs("taken", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    annotate_class(&cluster, &pool.class, &id).await;
    set_scrub_template(&cluster, &pool.class, &scrub_template("Succeeded")).await;
    let pv = pool.names[0].clone();
    let pvs = record_pvs(&cluster).await;
    let events = record_pv_events(&cluster).await;
    // The PV is bound first: a claim naming it by volumeName would take it while it is Available.
    bind(&ns, "cache", &pv, &pool.class).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), &ns.name);
    let temp = format!("scrub-{pv}");
    let foreign_uid = create_foreign_claim(&claims, &temp, &pv, &pool.class).await;
    let args = [
        "--disable-scaledown",
        "--pv-releaser-id",
        &id,
        "--pv-scrub-namespace",
        &ns.name,
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ];
    let _controller = Controller::spawn(&cluster.kubeconfig, &format!("{id}-foreign"), &args, &[]);
    delete_claim(&ns, "cache").await;

    let warning = events.wait_event(&pv, "ScrubBlocked", LONG).await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("claim {}/{temp} (uid {foreign_uid})", ns.name)),
        "{note}"
    );
    // A window of passes (the backoff retries within it), then the verdict over every state seen.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let claim_ref = |s: &support::recorder::Seen<PersistentVolume>| {
        let r = s.object.spec.as_ref().and_then(|sp| sp.claim_ref.clone());
        r.map(|r| (r.name.unwrap_or_default(), r.uid.unwrap_or_default()))
    };
    // In the window only the foreign claim has the temporary claim's name.
    let names_foreign = |s: &support::recorder::Seen<PersistentVolume>| {
        claim_ref(s).is_some_and(|(name, uid)| name == temp || uid == foreign_uid)
    };
    let seen = pvs.of(&pv);
    assert!(!seen.is_empty());
    assert!(
        !seen.iter().any(names_foreign),
        "the PV was handed to the foreign claim"
    );
    let now = claims.get(&temp).await.expect("the foreign claim");
    assert_eq!(
        now.status.and_then(|s| s.phase).as_deref(),
        Some("Pending"),
        "the foreign claim never bound"
    );
    assert_eq!(
        events.events(&pv, "ScrubBlocked").len(),
        1,
        "{}",
        events.describe()
    );

    // The foreign claim gone, the backed-off PV is scrubbed by a claim of the releaser's own.
    claims
        .delete(&temp, &kube::api::DeleteParams::default())
        .await
        .expect("delete the foreign claim");
    support::wait_for_gone(&claims, &temp, LONG).await;
    assert_scrubbed_then_released(&cluster, &pvs, &pv).await;
    let handed = pvs
        .of(&pv)
        .iter()
        .any(|s| claim_ref(s).is_some_and(|(_, uid)| uid == foreign_uid));
    assert!(!handed, "the PV was handed to the foreign claim");
}

/// Creates claim `name` as someone else would: named, labelled and annotated like the temporary
/// claim of `pv`, which it names by volumeName. Returns its UID.
async fn create_foreign_claim(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    pv: &str,
    class: &str,
) -> String {
    let foreign: PersistentVolumeClaim = support::from_json(serde_json::json!({
        "metadata": {"name": name,
                     "labels": {"reclaimable-pv-releaser.kubernetes.io/scrub-pv": "true"},
                     "annotations": {"reclaimable-pv-releaser.kubernetes.io/scrub-pv": pv}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}
    }));
    let foreign = claims
        .create(&kube::api::PostParams::default(), &foreign)
        .await
        .expect("create the foreign claim");
    foreign.metadata.uid.expect("uid")
}

/// A change of StorageClass `class` that means nothing (an annotation of the test's own).
async fn poke_class(cluster: &Cluster, class: &str, value: &str) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> =
        Api::all(cluster.client.clone());
    let patch = serde_json::json!({"metadata": {"annotations": {"e2e.scaledown.io/poke": value}}});
    classes
        .patch(
            class,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("poke the StorageClass");
}

/// A build pod on claim `claim`: runs until deleted.
async fn consume(ns: &support::TestNamespace, pod: &str, claim: &str) {
    let spec: k8s_openapi::api::core::v1::Pod = support::from_json(serde_json::json!({
        "metadata": {"name": pod},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "build", "image": "busybox",
                                 "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                 "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}]}
    }));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    pods.create(&kube::api::PostParams::default(), &spec)
        .await
        .expect("create build pod");
    support::wait_for_pod_phase(&pods, pod, "Running", LONG).await;
    pods.delete(pod, &kube::api::DeleteParams::default())
        .await
        .expect("delete build pod");
    support::wait_for_gone(&pods, pod, LONG).await;
}

/// Claim `name` of `class` with no volumeName: the binder picks an Available PV of the pool.
async fn claim_from_pool(ns: &support::TestNamespace, name: &str, class: &str) -> String {
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        support::from_json(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "resources": {"requests": {"storage": "1Gi"}}}
        }));
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = ns.api();
    claims
        .create(&kube::api::PostParams::default(), &claim)
        .await
        .expect("create claim");
    let bound = support::wait_for_pvc_phase(&claims, name, "Bound", LONG).await;
    bound
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound to a PV")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_of_three_pvs_serves_five_builds_in_turn() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("pool").await;
    let pool = ns.create_static_pvs("pool", 3, Reclaim::Retain).await;
    let plain = ns.create_static_pvs("plain", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    annotate_class(&cluster, &pool.class, &id).await;
    let pvs = record_pvs(&cluster).await;
    let _controller = start_releaser(&cluster, &id);

    // A PV of an unannotated class: Released, and it stays so.
    bind(&ns, "plain", &plain.names[0], &plain.class).await;
    delete_claim(&ns, "plain").await;
    let mut used = Vec::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    for build in 0..5 {
        let claim = format!("cache-{build}");
        let pv = claim_from_pool(&ns, &claim, &pool.class).await;
        consume(&ns, &format!("build-{build}"), &claim).await;
        let mark = pvs.mark();
        delete_claim(&ns, &claim).await;
        let released = pvs
            .wait_for_since(mark, &format!("{pv} Released"), LONG, |s| {
                s.name == pv && phase(&s.object) == "Released"
            })
            .await;
        let available = pvs
            .wait_for_since(mark, &format!("{pv} Available again"), LONG, |s| {
                s.name == pv && is_free(&s.object)
            })
            .await;
        latencies.push((available.at - released.at).as_millis());
        used.push(pv);
    }
    let distinct: std::collections::BTreeSet<&String> = used.iter().collect();
    let reused = used.len() - distinct.len();
    record(
        "pv releaser: 5 builds on a pool of 3 PVs (claim, run, delete, released)",
        format!("{} ms, PVs used {used:?}", started.elapsed().as_millis()),
    );
    record(
        "pv releaser: pool of 3, builds served by a reused PV",
        format!("{reused} of {}", used.len()),
    );
    record(
        "pv releaser: pool PV Released -> Available per build",
        format!("{latencies:?} ms"),
    );
    eprintln!(
        "pv releaser: 5 builds on 3 PVs, {reused} served by a reused PV; Released -> Available {latencies:?} ms"
    );
    assert!(distinct.len() <= 3 && used.len() == 5, "{used:?}");
    assert!(used.len() > distinct.len(), "a PV was reused: {used:?}");
    let plain_now = Api::<PersistentVolume>::all(cluster.client.clone())
        .get(&plain.names[0])
        .await
        .expect("get");
    assert_eq!(
        phase(&plain_now),
        "Released",
        "the unannotated class's PV stays Released"
    );
}

/// The race the JSON patch's test op closes, forced: the releaser acts on a read of a PV that a new
/// claim has taken since. The real API server refuses the patch; the PV keeps its new claim.
#[tokio::test(flavor = "multi_thread")]
async fn a_pv_bound_again_after_the_read_is_left_alone() {
    use statefulset_scaledown_controller::{leader, metrics, pass, releaser};
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("race").await;
    let pool = ns.create_static_pvs("pool", 1, Reclaim::Retain).await;
    let id = ns.name.clone();
    annotate_class(&cluster, &pool.class, &id).await;
    let pv_name = pool.names[0].clone();
    let api: Api<PersistentVolume> = Api::all(cluster.client.clone());
    bind(&ns, "old", &pv_name, &pool.class).await;
    delete_claim(&ns, "old").await;
    wait_for("the PV Released", LONG, || {
        let api = api.clone();
        let name = pv_name.clone();
        async move { api.get(&name).await.is_ok_and(|p| phase(&p) == "Released") }
    })
    .await;
    // The releaser's read: Released, naming the gone claim.
    let stale = api.get(&pv_name).await.expect("read");
    let old_uid = stale
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.clone());
    let facts =
        releaser::observe::observe(&stale, None, releaser::observe::ClaimRead::Gone, None, None);
    // Meanwhile an administrator hands the PV to a new claim.
    let patch = serde_json::json!({"spec": {"claimRef": {"namespace": ns.name, "name": "new",
                                                        "uid": null, "resourceVersion": null}}});
    api.patch(
        &pv_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("rebind by hand");
    bind(&ns, "new", &pv_name, &pool.class).await;
    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    let identity = kube::runtime::events::Reporter {
        controller: "e2e".into(),
        instance: None,
    };
    let (reporter, _) = pass::parts::<PersistentVolume>(
        statefulset_scaledown_controller::naming::Controller::Releaser,
        &cluster.client,
        identity,
        &metrics,
        false,
    );
    let writer = releaser::act::Actor::new(
        cluster.client.clone(),
        reporter,
        metrics,
        std::sync::Arc::new(leader::Leadership::always()),
    );
    writer
        .release(&facts, old_uid.as_deref().expect("old claim uid"))
        .await
        .expect("a lost race is not an error");
    let now = api.get(&pv_name).await.expect("read");
    let claim = now
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.name.clone());
    assert_eq!(claim.as_deref(), Some("new"), "the PV keeps its new claim");
    assert_eq!(phase(&now), "Bound");
}
