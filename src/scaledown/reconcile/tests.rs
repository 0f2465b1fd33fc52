//! One pass over one StatefulSet against a scripted API server (`crate::mock_api`): the caches are
//! filled by hand, and the test checks the order of the requests: no claim is deleted and no
//! cleanup pod is let run without a live read of the set made before the write.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::*;
use crate::caches::PodCache;
use crate::error::Category;
use crate::index::{Index, Keys};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::mock_api::{self, Answer, Log, Sent};
use crate::naming;
use crate::scaledown::observe::{Record, Rejection, format_records};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

const SET_PATH: &str = "/apis/apps/v1/namespaces/ns/statefulsets/web";
const CLAIMS: &str = "/api/v1/namespaces/ns/persistentvolumeclaims";
const SETS: &str = "/apis/apps/v1/namespaces/ns/statefulsets";
const PODS: &str = "/api/v1/namespaces/ns/pods";

const TEMPLATE: &str = r#"{"spec":{"containers":[{"name":"main","image":"busybox",
  "volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#;

/// Set `web` in `ns` with `replicas`, opted in, finalizer on, claim template `data`, and a record
/// of cleanup pod `uid-cleanup` for ordinal 1 when `recorded`. Its status annotation already says
/// `CleaningUp` (what these passes compute), so the passes below write no status of their own.
fn web(replicas: i32, recorded: bool) -> Value {
    let mut annotations = json!({naming::TEMPLATE_ANNOTATION: TEMPLATE,
                                 naming::STATUS_ANNOTATION: "CleaningUp"});
    if recorded {
        let record = Record {
            pod: "uid-cleanup".into(),
            claims: [("data-web-1".to_string(), "uid-data-1".to_string())].into(),
        };
        annotations[naming::RECORD_ANNOTATION] = json!(format_records(&[(1, record)].into()));
    }
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "generation": 3,
                     "resourceVersion": "7", "finalizers": [naming::FINALIZER],
                     "annotations": annotations},
        "spec": {"replicas": replicas, "serviceName": "web",
                 "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
        "status": {"replicas": replicas, "observedGeneration": 3}
    })
}

fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

fn claim(ordinal: u32) -> kube::core::PartialObjectMeta<PersistentVolumeClaim> {
    object(
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": format!("data-web-{ordinal}"), "namespace": "ns",
        "uid": format!("uid-data-{ordinal}")}}),
    )
}

/// The stateful pod of ordinal 0, mounting its claim.
fn stateful_pod() -> Pod {
    object(
        json!({"metadata": {"name": "web-0", "namespace": "ns", "uid": "uid-pod-0",
        "labels": {"app": "web"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "uid-web", "controller": true}]},
        "spec": {"containers": [], "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]}}),
    )
}

/// A Succeeded pod `web-1` that looks like a cleanup pod (label, owner annotation, claims), with
/// `uid`: ours when the set's record names it, forged otherwise.
fn succeeded_cleanup(uid: &str) -> Pod {
    object(
        json!({"metadata": {"name": "web-1", "namespace": "ns", "uid": uid,
        "labels": {naming::CLEANUP_LABEL: "web-1"},
        "annotations": {naming::OWNER_ANNOTATION: "web"}},
        "spec": {"containers": [], "nodeName": "node", "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}}]},
        "status": {"phase": "Succeeded"}}),
    )
}

fn index<K: kube::Resource + Keys + Clone>(objects: Vec<K>) -> Index<K> {
    let index = Index::default();
    index.apply(&Event::Init);
    for o in objects {
        index.apply(&Event::InitApply(o));
    }
    index.apply(&Event::InitDone);
    index
}

/// A context over caches holding `set`, claims of ordinals 0 and 1, and `pods`, talking to a
/// server that answers with `answer`.
fn context<F>(set: &StatefulSet, pods: Vec<Pod>, answer: F) -> (Context, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let (client, log) = mock_api::serve(answer);
    let (sets, mut writer) = reflector::store::<StatefulSet>();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitApply(set.clone()));
    writer.apply_watcher_event(&Event::InitDone);
    let cleanup: Vec<Pod> = pods
        .iter()
        .filter(|p| p.labels().contains_key(naming::CLEANUP_LABEL))
        .cloned()
        .collect();
    let stores = Stores {
        sets,
        claims: index(vec![claim(0), claim(1)]),
        pods: {
            let cache = PodCache::default();
            cache.apply(&Event::Init);
            pods.into_iter()
                .for_each(|p| cache.apply(&Event::InitApply(p)));
            cache.apply(&Event::InitDone);
            cache
        },
        cleanup_pods: index(cleanup),
    };
    let metrics = Arc::new(Metrics::default());
    let leadership = Arc::new(Leadership::always());
    let (reporter, runner) = crate::pass::test_parts(
        crate::naming::Controller::Scaledown,
        &client,
        &metrics,
        false,
    );
    let actor = Actor::new(
        client.clone(),
        reporter,
        metrics.clone(),
        leadership.clone(),
    );
    let ctx = Context::new(
        client,
        stores,
        Policy::default(),
        actor,
        leadership,
        Duration::from_secs(300),
        runner,
    );
    (ctx, log)
}

/// Answers reads of the set with `live` (404 when `None`) and every write with success; a
/// created pod gets UID `uid-new`.
fn server(live: Option<Value>) -> impl Fn(&Sent) -> Answer + Send + Sync + 'static {
    move |sent| match (sent.method.as_str(), sent.path.as_str()) {
        ("GET", SET_PATH) => match &live {
            Some(set) => (200, set.clone()),
            None => mock_api::status(404, "NotFound", "statefulsets \"web\" not found"),
        },
        ("POST", PODS) => {
            let mut pod = sent.body.clone();
            pod["metadata"]["uid"] = json!("uid-new");
            (201, pod)
        }
        ("PATCH", SET_PATH) => json_patch_of(live.as_ref(), &sent.body),
        ("DELETE", _) => mock_api::deleted(),
        _ => (200, json!({})),
    }
}

/// A JSON patch of the set applied as the API server does: all or nothing, 422 when a test op
/// fails, 404 when there is no set.
fn json_patch_of(live: Option<&Value>, body: &Value) -> Answer {
    let Some(live) = live else {
        return mock_api::status(404, "NotFound", "statefulsets \"web\" not found");
    };
    // kube-apiserver's patcher takes a null `test` value as "the path is absent"; the json-patch
    // crate has no such rule, so those ops are checked here and left out.
    let mut ops = body.as_array().cloned().expect("a JSON patch");
    for op in ops
        .iter()
        .filter(|op| op["op"] == "test" && op["value"].is_null())
    {
        let path = op["path"].as_str().expect("a path");
        if live.pointer(path).is_some() {
            return mock_api::status(422, "Invalid", &format!("{path} is present"));
        }
    }
    ops.retain(|op| !(op["op"] == "test" && op["value"].is_null()));
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("a JSON patch");
    let mut set = live.clone();
    match json_patch::patch(&mut set, &patch) {
        Ok(()) => (200, set),
        Err(e) => mock_api::status(422, "Invalid", &e.to_string()),
    }
}

/// `web` as it is after a scale to `replicas`: a spec change, so a new generation.
fn scaled(replicas: i32) -> Value {
    let mut set = web(replicas, false);
    set["metadata"]["generation"] = json!(4);
    set
}

async fn pass(set: Value, pods: Vec<Pod>, live: Option<Value>) -> (Result<Action>, Log) {
    let set: StatefulSet = object(set);
    // The API server's list of the namespace's sets holds the set as it is now, if it still is.
    let sets: Vec<Value> = live.iter().cloned().collect();
    let (ctx, log) = context(&set, pods.clone(), listing(server(live), pods, sets));
    (ctx.pass(&set).await, log)
}

/// `answer`, with the lists of the namespace's claims (those of ordinals 0 and 1) and of `pods`
/// answered as the API server holds them.
fn listing<F>(
    answer: F,
    pods: Vec<Pod>,
    sets: Vec<Value>,
) -> impl Fn(&Sent) -> Answer + Send + Sync + 'static
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    let claims = list(json!([
        serde_json::to_value(claim(0)).expect("claim"),
        serde_json::to_value(claim(1)).expect("claim")
    ]));
    let pods = list(serde_json::to_value(&pods).expect("pods"));
    let sets = list(Value::Array(sets));
    move |sent| match (sent.method.as_str(), sent.path.as_str()) {
        ("GET", CLAIMS) => (200, claims.clone()),
        ("GET", PODS) => (200, pods.clone()),
        ("GET", SETS) => (200, sets.clone()),
        _ => answer(sent),
    }
}

/// A list answer holding `items`.
fn list(items: Value) -> Value {
    json!({"metadata": {"resourceVersion": "9"}, "items": items})
}

/// Whether `lines` begin with a live read of the namespace: its claims first, then its pods and
/// its StatefulSets (sent together, so in either order). The set itself is taken from that list.
fn begins_with_namespace_read(lines: &[String]) -> bool {
    let mut next: Vec<&String> = lines.iter().skip(1).take(2).collect();
    next.sort();
    lines.first() == Some(&format!("GET {CLAIMS}"))
        && next == [&format!("GET {PODS}"), &format!("GET {SETS}")]
}

fn claim_deletes(log: &Log) -> Vec<Sent> {
    log.writes_and_reads()
        .into_iter()
        .filter(|s| s.method == "DELETE" && s.path.starts_with(CLAIMS))
        .collect()
}

#[tokio::test]
async fn a_claim_is_deleted_only_after_a_live_read_still_shows_it_orphaned() {
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let (result, log) = pass(web(1, true), pods, Some(web(1, true))).await;
    assert!(result.is_ok(), "{result:?}");
    let lines = log.lines();
    assert!(
        begins_with_namespace_read(&lines),
        "the live read comes first: {lines:?}"
    );
    let deletes = claim_deletes(&log);
    assert_eq!(deletes.len(), 1, "{lines:?}");
    assert_eq!(deletes[0].path, format!("{CLAIMS}/data-web-1"));
    assert_eq!(deletes[0].body["preconditions"]["uid"], "uid-data-1");
    let pod_delete = format!("DELETE {PODS}/web-1");
    assert!(lines.contains(&pod_delete), "{lines:?}");
}

#[tokio::test]
async fn a_scale_up_seen_by_the_live_read_keeps_the_claim() {
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let (result, log) = pass(web(1, true), pods, Some(web(2, true))).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(
        begins_with_namespace_read(&log.lines()),
        "{:?}",
        log.lines()
    );
    assert!(claim_deletes(&log).is_empty(), "{:?}", log.lines());
}

#[tokio::test]
async fn a_set_gone_or_replaced_on_the_live_read_gets_no_writes() {
    let pods = || vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let mut replaced = web(1, true);
    replaced["metadata"]["uid"] = json!("uid-web-2");
    for live in [None, Some(replaced)] {
        let (result, log) = pass(web(1, true), pods(), live).await;
        assert!(result.is_ok(), "{result:?}");
        let lines = log.lines();
        assert!(
            lines.len() == 3 && begins_with_namespace_read(&lines),
            "a read and nothing else: {lines:?}"
        );
    }
}

#[tokio::test]
async fn a_pass_decides_on_the_set_as_the_cache_holds_it_when_the_pass_runs() {
    // Woken with the set as it was before the finalizer was added (and before kcm's status
    // writes since); by the time the pass has a slot, the cache holds the newer set.
    let mut woken = web(1, false);
    woken["metadata"]["finalizers"] = json!([]);
    woken["metadata"]["resourceVersion"] = json!("5");
    woken["metadata"]["annotations"][naming::STATUS_ANNOTATION] = json!("Idle");
    let newest: StatefulSet = object(web(1, false));
    let (ctx, log) = context(&newest, vec![stateful_pod()], server(Some(web(1, false))));
    let result = ctx.pass(&object(woken)).await;
    assert!(result.is_ok(), "{result:?}");
    // The newest set has its finalizer and says `CleaningUp`: no finalizer patch, no status write
    // (the orphaned ordinal 1 gets its cleanup pod and record all the same).
    let set_patches: Vec<Sent> = log
        .writes_and_reads()
        .into_iter()
        .filter(|s| s.method == "PATCH" && s.path == SET_PATH)
        .collect();
    assert!(!set_patches.is_empty(), "{:?}", log.lines());
    for patch in &set_patches {
        let body = patch.body.to_string();
        assert!(!body.contains(naming::FINALIZER), "{body}");
        assert!(!body.contains("Idle"), "{body}");
    }

    // Gone from the cache by then: its deletion is seen, nothing is read or written.
    let (ctx, log) = context(&newest, vec![stateful_pod()], server(None));
    let mut other = web(1, false);
    other["metadata"]["name"] = json!("db");
    let result = ctx.pass(&object(other)).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(log.all().is_empty(), "{:?}", log.lines());
}

#[tokio::test]
async fn a_forged_succeeded_pod_deletes_nothing_and_is_reported() {
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-forged")];
    let (result, log) = pass(web(1, false), pods, Some(web(1, false))).await;
    assert!(result.is_ok(), "{result:?}");
    let lines = log.lines();
    assert!(claim_deletes(&log).is_empty(), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("DELETE")),
        "the look-alike is not ours to delete either: {lines:?}"
    );
    let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
    assert!(
        reasons.iter().any(|r| r == "UnprovenCleanupPod"),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_new_cleanup_pod_runs_only_when_a_write_after_its_create_confirms_it_orphaned() {
    let (result, log) = pass(web(1, false), vec![stateful_pod()], Some(web(1, false))).await;
    assert!(result.is_ok(), "{result:?}");
    // Created and recorded; released by a later pass, on a read of the namespace.
    assert_eq!(
        log.lines(),
        [format!("POST {PODS}"), format!("PATCH {SET_PATH}")]
    );
    let sent = log.writes_and_reads();
    let gates = &sent[0].body["spec"]["schedulingGates"];
    assert_eq!(
        gates,
        &json!([{"name": naming::CONFIRM_GATE}]),
        "created gated"
    );
    let tested: Vec<&str> = sent[1]
        .body
        .as_array()
        .expect("a JSON patch")
        .iter()
        .filter(|op| op["op"] == "test")
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(
        tested.contains(&"/metadata/generation") && tested.contains(&"/metadata/uid"),
        "the record is a compare-and-swap on the spec: {tested:?}"
    );

    // Scaled up between the decision and the record: the record's test fails, the read after it
    // shows the ordinal wanted, and the pod is deleted by UID, never released.
    let (result, log) = pass(web(1, false), vec![stateful_pod()], Some(scaled(2))).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        log.lines(),
        [
            format!("POST {PODS}"),
            format!("PATCH {SET_PATH}"),
            format!("GET {SET_PATH}"),
            format!("DELETE {PODS}/web-1"),
        ]
    );
    assert_eq!(
        log.writes_and_reads()[3].body["preconditions"]["uid"],
        "uid-new"
    );
}

/// A gated cleanup pod of a set the StatefulSet controller has caught up with.
fn gated_cleanup() -> Pod {
    let mut pod = succeeded_cleanup("uid-cleanup");
    pod.status = None;
    pod.spec.as_mut().expect("spec").node_name = None;
    pod.spec.as_mut().expect("spec").scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: naming::CONFIRM_GATE.into(),
        }]);
    pod
}

/// Issue 23: a claim the caches show as the set's and a live read of the namespace shows owned by
/// another object cancels the gated cleanup pod, and the ordinal is remembered as disputed, so the
/// next pass from the caches asks for a live read before it creates a pod again.
#[tokio::test]
async fn a_claim_a_live_read_shows_someone_elses_is_remembered_as_disputed() {
    let set: StatefulSet = object(web(1, true));
    let pods = vec![stateful_pod(), gated_cleanup()];
    let mut owned = serde_json::to_value(claim(1)).expect("claim");
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "example.com/v1",
        "kind": "Shard", "name": "s1", "uid": "uid-shard"}]);
    let claims = list(json!([
        serde_json::to_value(claim(0)).expect("claim"),
        owned
    ]));
    let live_pods = list(serde_json::to_value(&pods).expect("pods"));
    let sets = list(json!([web(1, true)]));
    let inner = server(Some(web(1, true)));
    let answer = move |sent: &Sent| match (sent.method.as_str(), sent.path.as_str()) {
        ("GET", CLAIMS) => (200, claims.clone()),
        ("GET", PODS) => (200, live_pods.clone()),
        ("GET", SETS) => (200, sets.clone()),
        _ => inner(sent),
    };
    let (ctx, log) = context(&set, pods, answer);
    ctx.pass(&set).await.expect("pass");
    let lines = log.lines();
    assert!(
        lines.contains(&format!("DELETE {PODS}/web-1"))
            && !lines.iter().any(|l| l.starts_with("PATCH /api/v1")),
        "cancelled, never released: {lines:?}"
    );
    let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
    assert!(
        reasons.contains(&"ClaimOwnershipConflict".to_string()),
        "{reasons:?}"
    );
    assert_eq!(ctx.memories().recall(&set).disputed, [1].into());
}

/// Issue 23: a recorded cleanup pod runs only after a live read of its namespace (claims, pods and
/// StatefulSets: another set the cache does not show yet may want its claims), then the guard on
/// the set, then the release.
#[tokio::test]
async fn a_recorded_cleanup_pod_is_released_after_a_live_read_of_its_namespace() {
    let pods = vec![stateful_pod(), gated_cleanup()];
    let (result, log) = pass(web(1, true), pods, Some(web(1, true))).await;
    assert!(result.is_ok(), "{result:?}");
    let lines = log.lines();
    assert!(begins_with_namespace_read(&lines), "{lines:?}");
    assert_eq!(
        lines[3..],
        [format!("PATCH {SET_PATH}"), format!("PATCH {PODS}/web-1")]
    );
}

/// The set's scheduling fields reach the created pod only when the set inherits them: from the
/// cache as the watch prunes it, with `--inherit-scheduling` off and on.
#[tokio::test]
async fn the_created_pod_carries_the_sets_scheduling_when_it_inherits() {
    for flag in [false, true] {
        let mut full = web(1, false);
        full["spec"]["template"]["spec"] = json!({
            "containers": [{"name": "app", "image": "app"}],
            "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "db"}
        });
        let mut cached: StatefulSet = object(full.clone());
        crate::caches::prune_set_for(&mut cached, flag);
        let (mut ctx, log) = context(&cached, vec![stateful_pod()], server(Some(full)));
        ctx.policy.inherit_scheduling = flag;
        ctx.pass(&cached).await.expect("a pass");
        let sent = log.writes_and_reads();
        assert_eq!(
            (sent[0].method.as_str(), sent[0].path.as_str()),
            ("POST", PODS),
            "{:?}",
            log.lines()
        );
        let spec = &sent[0].body["spec"];
        assert_eq!(
            spec.get("nodeSelector").is_some(),
            flag,
            "flag {flag}: {spec}"
        );
        assert_eq!(
            spec.get("tolerations").is_some(),
            flag,
            "flag {flag}: {spec}"
        );
        assert!(
            spec["containers"][0]["name"] == "main",
            "the template's containers"
        );
    }
}

#[tokio::test]
async fn a_template_removed_before_the_record_cancels_the_new_pod() {
    let mut opted_out = web(1, false);
    opted_out["metadata"]["annotations"] = json!({});
    let (result, log) = pass(web(1, false), vec![stateful_pod()], Some(opted_out)).await;
    assert!(result.is_ok(), "{result:?}");
    let lines = log.lines();
    assert_eq!(
        lines[..3],
        [
            format!("POST {PODS}"),
            format!("PATCH {SET_PATH}"),
            format!("GET {SET_PATH}"),
        ],
        "{lines:?}"
    );
    assert!(lines.contains(&format!("DELETE {PODS}/web-1")), "{lines:?}");
    assert!(
        !lines.contains(&format!("PATCH {PODS}/web-1")),
        "never released: {lines:?}"
    );
}

#[tokio::test]
async fn a_created_pod_is_not_created_again_before_the_cache_shows_it() {
    let set: StatefulSet = object(web(1, false));
    let (ctx, log) = context(&set, vec![stateful_pod()], server(Some(web(1, false))));
    ctx.pass(&set).await.expect("first pass");
    ctx.pass(&set).await.expect("second pass");
    let creates = log.lines().iter().filter(|l| l.starts_with("POST")).count();
    assert_eq!(creates, 1, "{:?}", log.lines());
}

/// Issue 25: a cleanup pod whose watch event arrives while a pass runs (after it observed the
/// caches, before it admits its creates) is not created again: the create would meet 409.
#[tokio::test]
async fn a_create_decided_before_the_cache_showed_the_pod_is_held_back() {
    let set: StatefulSet = object(web(1, false));
    let (ctx, _) = context(&set, vec![], server(Some(web(1, false))));
    let recalled = ctx.memories().recall(&set);
    let observed = ctx.observe_cached(&set, &recalled);
    let plan = decide(&observed, &ctx.policy);
    let creates = |plan: &Plan| {
        plan.steps
            .iter()
            .filter(|s| matches!(s, decide::Step::CreateCleanupPod { .. }))
            .count()
    };
    assert_eq!(creates(&plan), 1, "ordinal 1 is orphaned: {plan:?}");
    // The pod's watch event arrives now.
    ctx.stores.cleanup_pods.insert(Arc::new(gated_cleanup()));
    let (admitted, names) =
        ctx.memories()
            .admit(&observed.set, plan, None, &ctx.stores.cleanup_pods);
    assert_eq!(creates(&admitted), 0, "{admitted:?}");
    assert!(names.is_empty());
}

/// A running cleanup pod of another set, which counts against `--max-concurrent-cleanups`.
fn other_cleanup_running() -> Pod {
    object(
        json!({"metadata": {"name": "other-0", "namespace": "ns", "uid": "uid-other-0",
        "labels": {naming::CLEANUP_LABEL: "other-0"}},
        "spec": {"containers": []}, "status": {"phase": "Running"}}),
    )
}

/// Held back by the cap, a set is not polled: it waits (until the resync at the latest) and is
/// woken by a cleanup pod's change once there is room.
#[tokio::test]
async fn the_cap_holds_creations_back_until_a_cleanup_pod_frees_room() {
    let set: StatefulSet = object(web(1, false));
    let pods = || vec![stateful_pod(), other_cleanup_running()];
    let (mut ctx, log) = context(&set, pods(), server(Some(web(1, false))));
    ctx.policy.max_in_flight = Some(1);
    let action = ctx.pass(&set).await.expect("pass");
    assert!(
        log.lines().is_empty(),
        "no create over the cap: {:?}",
        log.lines()
    );
    assert_eq!(action, Action::requeue(ctx.resync), "no poll");
    assert_eq!(ctx.wake_for_room(), Vec::new(), "still no room");
    ctx.stores.cleanup_pods.remove(&other_cleanup_running());
    assert_eq!(
        ctx.wake_for_room(),
        vec![ObjectRef::from_obj(&set)],
        "the other set's cleanup pod is gone: room for this one"
    );
    assert_eq!(ctx.wake_for_room(), Vec::new(), "woken once");

    let (mut ctx, log) = context(&set, pods(), server(Some(web(1, false))));
    ctx.policy.max_in_flight = Some(2);
    ctx.pass(&set).await.expect("pass");
    assert_eq!(log.lines()[0], format!("POST {PODS}"), "room for one more");
}

/// `server`, but every JSON patch of the set is refused (an admission policy, or a record whose
/// test can never match).
fn refusing_records(live: Value, code: u16) -> impl Fn(&Sent) -> Answer + Send + Sync + 'static {
    let base = server(Some(live));
    move |sent| {
        if sent.method == "PATCH" && sent.path == SET_PATH {
            mock_api::status(code, "Refused", "the record is refused")
        } else {
            base(sent)
        }
    }
}

#[tokio::test]
async fn a_record_refused_every_time_deletes_its_pod_and_the_set_waits_out_its_backoff() {
    let set = Arc::new(object::<StatefulSet>(web(1, false)));
    let (ctx, log) = context(
        &set,
        vec![stateful_pod()],
        refusing_records(web(1, false), 422),
    );
    let ctx = Arc::new(ctx);
    let first = reconcile(set.clone(), ctx.clone()).await;
    assert!(matches!(first, Err(Error::Contended { .. })), "{first:?}");
    let record = format!("PATCH {SET_PATH}");
    let get = format!("GET {SET_PATH}");
    assert_eq!(
        log.lines(),
        [
            format!("POST {PODS}"),
            record.clone(),
            get.clone(),
            record.clone(),
            get,
            record,
            format!("DELETE {PODS}/web-1"),
        ],
        "three tries, then the pod that never ran is deleted by UID"
    );
    assert_eq!(
        log.writes_and_reads()[6].body["preconditions"]["uid"],
        "uid-new"
    );
    // Whatever wakes the set meanwhile (its pod's watch events), no pass runs before the backoff.
    for _ in 0..50 {
        reconcile(set.clone(), ctx.clone()).await.expect("held");
        let left = ctx.runner.backing_off(&set).expect("still backing off");
        assert!(left <= crate::pass::Backoff::default().base, "{left:?}");
    }
    assert_eq!(log.lines().len(), 7, "{:?}", log.lines());
    assert!(
        !log.events().iter().any(|e| e.1 == "ReconcileFailed"),
        "one failure is no Warning yet"
    );
    // After it, one more pass, one more failure: a longer wait and one Warning with the answer.
    tokio::time::sleep(crate::pass::Backoff::default().base + Duration::from_millis(100)).await;
    let second = reconcile(set.clone(), ctx.clone()).await;
    assert!(second.is_err());
    assert_eq!(log.lines().len(), 14, "{:?}", log.lines());
    let wait = ctx.runner.backing_off(&set).expect("backing off");
    assert!(wait > crate::pass::Backoff::default().base, "{wait:?}");
    let warnings: Vec<_> = log
        .events()
        .into_iter()
        .filter(|e| e.1 == "ReconcileFailed")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "Warning");
    assert!(
        warnings[0].2.contains("the record is refused"),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn a_recorded_pod_waits_for_the_statefulset_controller_to_let_go_of_the_ordinal() {
    let mut counting = web(1, false);
    counting["status"]["replicas"] = json!(2);
    let (result, log) = pass(counting.clone(), vec![stateful_pod()], Some(counting)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        log.lines(),
        [format!("POST {PODS}"), format!("PATCH {SET_PATH}")],
        "recorded, holding the name, but not released"
    );
}

#[tokio::test]
async fn a_record_forbidden_by_admission_deletes_its_pod_at_once_and_backs_off() {
    let set = Arc::new(object::<StatefulSet>(web(1, false)));
    let (ctx, log) = context(
        &set,
        vec![stateful_pod()],
        refusing_records(web(1, false), 403),
    );
    let ctx = Arc::new(ctx);
    let failed = reconcile(set.clone(), ctx.clone()).await;
    assert!(
        matches!(&failed, Err(e) if e.category() == Category::Forbidden),
        "{failed:?}"
    );
    assert_eq!(
        log.lines(),
        [
            format!("POST {PODS}"),
            format!("PATCH {SET_PATH}"),
            format!("DELETE {PODS}/web-1"),
        ],
        "a 403 is not retried within the pass"
    );
    assert!(ctx.runner.backing_off(&set).is_some());
}

#[tokio::test]
async fn a_read_without_a_record_never_overwrites_one_written_meanwhile() {
    // The cache shows no record; another pass (or writer) recorded a pod since.
    let mut live = web(1, false);
    let other = Record {
        pod: "uid-other".into(),
        claims: [("data-web-1".to_string(), "uid-data-1".to_string())].into(),
    };
    live["metadata"]["annotations"][naming::RECORD_ANNOTATION] =
        json!(format_records(&[(1, other)].into()));
    let (_, log) = pass(web(1, false), vec![stateful_pod()], Some(live.clone())).await;
    let sent = log.writes_and_reads();
    let record_path = format!(
        "/metadata/annotations/{}",
        naming::RECORD_ANNOTATION.replace('/', "~1")
    );
    let record_test = |i: usize| {
        sent[i]
            .body
            .as_array()
            .expect("a JSON patch")
            .iter()
            .find_map(|op| {
                (op["op"] == "test" && op["path"] == record_path.as_str())
                    .then(|| op["value"].clone())
            })
    };
    assert_eq!(sent[1].line(), format!("PATCH {SET_PATH}"));
    assert_eq!(record_test(1), Some(Value::Null), "absence is tested");
    assert_eq!(
        sent[2].line(),
        format!("GET {SET_PATH}"),
        "refused: read again"
    );
    assert_eq!(
        record_test(3),
        Some(live["metadata"]["annotations"][naming::RECORD_ANNOTATION].clone()),
        "the next try tests the record it read"
    );
}

#[test]
fn recreates_of_one_name_back_off() {
    let secs: Vec<u64> = (1..=10)
        .map(|n| crate::scaledown::memory::recreate_delay(n).as_secs())
        .collect();
    assert_eq!(secs, [0, 0, 1, 2, 4, 8, 16, 32, 60, 60]);
}

#[tokio::test]
async fn a_pod_deleted_by_someone_else_again_and_again_is_created_at_the_backoff_pace() {
    let set: StatefulSet = object(web(1, false));
    let (ctx, log) = context(&set, vec![stateful_pod()], server(Some(web(1, false))));
    let key = ("ns".to_string(), "web-1".to_string());
    // Two creates of web-1 a moment ago; someone deleted both before they ran.
    ctx.memories()
        .created_before(key.clone(), 2, Instant::now());
    let action = ctx.pass(&set).await.expect("pass");
    assert!(log.lines().is_empty(), "held back: {:?}", log.lines());
    assert_ne!(
        action,
        Action::await_change(),
        "it looks again once the wait is over"
    );
    assert!(ctx.memories().recreate_wait(&key).is_some());
}

#[tokio::test]
async fn a_cleanup_pod_that_ran_clears_its_name_so_the_next_scale_down_is_not_held_back() {
    // A set scaled down again and again: web-1 was created many times, each time it ran.
    let set: StatefulSet = object(web(1, true));
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let answer = listing(server(Some(web(1, true))), pods.clone(), vec![web(1, true)]);
    let (ctx, _log) = context(&set, pods, answer);
    let key = ("ns".to_string(), "web-1".to_string());
    ctx.memories()
        .created_before(key.clone(), 5, Instant::now());
    assert!(
        ctx.memories().recreate_wait(&key).is_some(),
        "held back before"
    );
    ctx.pass(&set).await.expect("pass");
    assert!(
        ctx.memories().recreate_wait(&key).is_none(),
        "a pod that ran is not a lost create: the name starts afresh"
    );
}

#[tokio::test]
async fn a_new_cleanup_carries_the_status_in_its_record_and_costs_no_request() {
    let mut fresh = web(1, false);
    let annotations = fresh["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    annotations.insert(naming::STATUS_ANNOTATION.into(), json!("Idle"));
    let (result, log) = pass(fresh.clone(), vec![stateful_pod()], Some(fresh)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        log.lines(),
        [format!("POST {PODS}"), format!("PATCH {SET_PATH}")],
        "Idle -> CleaningUp rides in the record"
    );
    let status_path = format!(
        "/metadata/annotations/{}",
        naming::STATUS_ANNOTATION.replace('/', "~1")
    );
    let record = &log.writes_and_reads()[1].body;
    assert!(
        record
            .as_array()
            .expect("a JSON patch")
            .iter()
            .any(|op| op["path"] == status_path.as_str() && op["value"] == "CleaningUp"),
        "{record}"
    );
}

#[tokio::test]
async fn a_status_change_alone_is_one_guarded_patch_and_the_next_pass_writes_nothing() {
    // Replicas 2, claims of 0 and 1: nothing orphaned, but the set still says CleaningUp.
    let (result, log) = pass(web(2, false), vec![stateful_pod()], Some(web(2, false))).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(log.lines(), [format!("PATCH {SET_PATH}")]);
    let ops = log.writes_and_reads()[0].body.clone();
    assert_eq!(ops[1]["op"], "test", "{ops}");
    assert_eq!(
        ops[1]["value"], "CleaningUp",
        "guarded by the status it replaces"
    );
    assert_eq!(ops[2]["value"], "Idle", "{ops}");
    assert!(log.events().is_empty(), "no Event for Idle");

    let mut idle = web(2, false);
    idle["metadata"]["annotations"][naming::STATUS_ANNOTATION] = json!("Idle");
    let (result, log) = pass(idle.clone(), vec![stateful_pod()], Some(idle)).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(log.lines().is_empty(), "{:?}", log.lines());
}

#[tokio::test]
async fn pausing_and_resuming_are_one_event_each_after_the_status_write() {
    let mut paused = web(1, false);
    paused["metadata"]["annotations"][naming::PAUSED_ANNOTATION] = json!("true");
    let (result, log) = pass(paused.clone(), vec![stateful_pod()], Some(paused.clone())).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        log.lines(),
        [format!("PATCH {SET_PATH}")],
        "no cleanup pod while paused, only the status"
    );
    let events = log.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, "ScaleDownPaused");
    assert!(events[0].2.contains("ordinal 1 waits"), "{events:?}");

    let mut still = paused;
    still["metadata"]["annotations"][naming::STATUS_ANNOTATION] = json!("Paused");
    still["metadata"]["annotations"][naming::STATUS_REASON_ANNOTATION] =
        json!("Paused: ordinal 1 waits for a cleanup");
    let (result, log) = pass(still.clone(), vec![stateful_pod()], Some(still.clone())).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(
        log.lines().is_empty() && log.events().is_empty(),
        "{:?}",
        log.lines()
    );

    let mut resumed = still;
    resumed["metadata"]["annotations"][naming::PAUSED_ANNOTATION] = json!("false");
    let (result, log) = pass(resumed.clone(), vec![stateful_pod()], Some(resumed)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        log.lines(),
        [format!("POST {PODS}"), format!("PATCH {SET_PATH}")],
        "resumed: the cleanup is created, and the status rides in its record"
    );
    let reasons: Vec<String> = log.events().into_iter().map(|e| e.1).collect();
    assert!(
        reasons.contains(&"ScaleDownResumed".to_string()),
        "{reasons:?}"
    );
}

/// Refusals are remembered per template: a change of the template annotation, of the inherit
/// annotation or of the scheduling fields the cache keeps makes a new one; a scale does not.
#[test]
fn what_a_cleanup_pod_is_made_from_is_hashed_for_its_refusals() {
    let hash = |set: Value, flag: bool| {
        let mut set: StatefulSet = object(set);
        crate::caches::prune_set_for(&mut set, flag);
        crate::scaledown::memory::template_hash(&set)
    };
    let base = hash(web(1, false), true);
    assert_eq!(
        hash(web(2, false), true),
        base,
        "a scale keeps the refusals"
    );
    let mut other = web(1, false);
    other["metadata"]["annotations"][naming::TEMPLATE_ANNOTATION] = json!("{}");
    assert_ne!(hash(other, true), base);
    let mut none = web(1, false);
    none["metadata"]["annotations"][naming::INHERIT_ANNOTATION] = json!("none");
    assert_ne!(hash(none, true), base);
    let mut pooled = web(1, false);
    pooled["spec"]["template"]["spec"] = json!({"containers": [], "nodeSelector": {"pool": "db"}});
    assert_ne!(hash(pooled.clone(), true), base, "inherited fields changed");
    assert_eq!(
        hash(pooled, false),
        hash(web(1, false), false),
        "not inherited: not kept, not hashed"
    );
}

/// Issue 23: a pod that mounts the claim and that the pod cache does not show yet stops the delete
/// of the claim: whether a claim is in use is decided on a live list of the namespace's pods.
#[tokio::test]
async fn a_pod_seen_only_live_keeps_the_claim_of_a_finished_cleanup() {
    let cached = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let reader: Pod = object(json!({"metadata": {"name": "reader", "namespace": "ns",
        "uid": "uid-reader"},
        "spec": {"containers": [], "volumes": [
            {"name": "d", "persistentVolumeClaim": {"claimName": "data-web-1"}}]},
        "status": {"phase": "Running"}}));
    let mut live_pods = cached.clone();
    live_pods.push(reader);
    let set: StatefulSet = object(web(1, true));
    let answer = listing(server(Some(web(1, true))), live_pods, vec![web(1, true)]);
    let (ctx, log) = context(&set, cached, answer);
    ctx.pass(&set).await.expect("pass");
    let lines = log.lines();
    assert!(
        lines.contains(&format!("GET {PODS}")),
        "pods read live: {lines:?}"
    );
    assert!(claim_deletes(&log).is_empty(), "{lines:?}");
    assert!(
        !lines.contains(&format!("DELETE {PODS}/web-1")),
        "the cleanup pod stays while its claim waits: {lines:?}"
    );
}

/// Issue 23: once the claims of a finished cleanup are deleted, a pass decided on a claim cache
/// that still holds them (its watch event is on its way) does not create a cleanup pod for that
/// ordinal again.
#[tokio::test]
async fn a_finished_cleanup_is_not_created_again_from_a_stale_claim_cache() {
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let set: StatefulSet = object(web(1, true));
    let answer = listing(server(Some(web(1, true))), pods.clone(), vec![web(1, true)]);
    let (ctx, log) = context(&set, pods, answer);
    ctx.pass(&set).await.expect("first pass");
    assert_eq!(claim_deletes(&log).len(), 1, "{:?}", log.lines());
    // The pod's delete reached the caches, the claim's did not yet.
    let gone = succeeded_cleanup("uid-cleanup");
    ctx.stores.pods.apply(&Event::Delete(gone.clone()));
    ctx.stores.cleanup_pods.apply(&Event::Delete(gone));
    let before = log.lines().len();
    ctx.pass(&set).await.expect("second pass");
    let after: Vec<String> = log.lines()[before..].to_vec();
    assert!(
        !after.contains(&format!("POST {PODS}")),
        "no cleanup pod for a claim already deleted: {after:?}"
    );
}

/// Issue 23: an orphan deletion seen through a pod cache that lags the set cache. The set's
/// `orphan` finalizer is gone, its cached pods still name it as owner, but the garbage collector
/// already took the ownerReferences off: the live read shows them orphaned, and nothing is deleted
/// or created.
#[tokio::test]
async fn an_orphan_deletion_behind_a_lagging_pod_cache_deletes_nothing() {
    let mut deleting = web(2, false);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let owned = |n: u32| -> Pod {
        object(
            json!({"metadata": {"name": format!("web-{n}"), "namespace": "ns",
            "uid": format!("uid-pod-{n}"), "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                 "uid": "uid-web", "controller": true}]},
            "spec": {"containers": [], "volumes": [{"name": "data",
                "persistentVolumeClaim": {"claimName": format!("data-web-{n}")}}]},
            "status": {"phase": "Running"}}),
        )
    };
    let orphaned = |n: u32| {
        let mut p = owned(n);
        p.metadata.owner_references = None;
        p
    };
    let set: StatefulSet = object(deleting.clone());
    let answer = listing(
        server(Some(deleting.clone())),
        vec![orphaned(0), orphaned(1)],
        vec![deleting],
    );
    let (ctx, log) = context(&set, vec![owned(0), owned(1)], answer);
    ctx.pass(&set).await.expect("pass");
    let lines = log.lines();
    assert!(
        lines.contains(&format!("GET {PODS}")),
        "pods read live: {lines:?}"
    );
    let writes: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("DELETE") || l.starts_with("POST"))
        .collect();
    assert!(writes.is_empty(), "{lines:?}");
}

/// Issue 23: the memory of refused creates does not outlive its StatefulSet (a set deleted, or its
/// whole namespace): the next pass of any set drops the entries of sets no longer cached.
#[tokio::test]
async fn the_memory_of_a_deleted_set_is_dropped() {
    let set: StatefulSet = object(web(1, false));
    let (ctx, _log) = context(&set, vec![stateful_pod()], server(Some(web(1, false))));
    let gone = ObjectRef::<StatefulSet>::new("gone").within("deleted-ns");
    let refusal = Rejection {
        count: 1,
        last: Timestamp::now(),
        code: 403,
        message: "forbidden".into(),
    };
    ctx.memories().sets.insert(
        gone.clone(),
        crate::scaledown::memory::SetMemory {
            refusals: [(0, refusal)].into(),
            ..Default::default()
        },
    );
    ctx.pass(&set).await.expect("pass");
    assert!(
        !ctx.memories().sets.contains_key(&gone),
        "the deleted set's memory is gone"
    );
}

/// Issue 25 took the set of a namespace read from the namespace's StatefulSet list, sent with the
/// pod list. A set the caches show being deleted is still read on its own before the lists: an
/// orphan deletion shows as one only in pods listed after the set (the garbage collector takes
/// their owners off before it removes the `orphan` finalizer).
#[tokio::test]
async fn a_set_being_deleted_is_read_before_its_pods_are_listed() {
    let mut deleting = web(2, false);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let set: StatefulSet = object(deleting.clone());
    let answer = listing(
        server(Some(deleting.clone())),
        vec![stateful_pod()],
        vec![deleting],
    );
    let (ctx, log) = context(&set, vec![stateful_pod()], answer);
    // What the pass writes after the reads (the deletion's mark) is not this test's concern.
    let _ = ctx.pass(&set).await;
    let lines = log.lines();
    assert_eq!(lines.first(), Some(&format!("GET {SET_PATH}")), "{lines:?}");
    assert!(begins_with_namespace_read(&lines[1..]), "{lines:?}");
}

/// A set the caches show alive but the namespace's list shows being deleted: the caches and the
/// live read disagree on the deletion, and the pass deletes and creates nothing.
#[tokio::test]
async fn a_deletion_only_the_namespace_read_shows_changes_nothing() {
    let pods = vec![stateful_pod(), succeeded_cleanup("uid-cleanup")];
    let mut deleting = web(1, true);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let (result, log) = pass(web(1, true), pods, Some(deleting)).await;
    assert!(result.is_ok(), "{result:?}");
    let lines = log.lines();
    assert!(begins_with_namespace_read(&lines), "{lines:?}");
    assert_eq!(lines.len(), 3, "a read and nothing else: {lines:?}");
}

/// kube's Controller keeps a task for every set woken, and all of them wait for a pass slot at
/// once when thousands of sets change (at start, 1,000 sets in `idle`): a waiting task must not
/// hold the pass, which is kilobytes, inline. Sizes of this (debug) build: the pass about 7 KB,
/// `reconcile` 480 bytes with the pass made on the heap once a slot is held, 21 KB before.
#[tokio::test]
async fn a_set_waiting_for_a_pass_slot_does_not_hold_its_pass_inline() {
    let set: StatefulSet = object(web(1, false));
    let (ctx, _log) = context(&set, vec![], server(None));
    let ctx = Arc::new(ctx);
    let pass = std::mem::size_of_val(&ctx.pass(&set));
    let waiting = std::mem::size_of_val(&reconcile(Arc::new(set.clone()), ctx.clone()));
    eprintln!("future sizes: a pass {pass} bytes, reconcile {waiting} bytes");
    assert!(
        pass > 2048,
        "the pass is large ({pass} bytes): what this test guards against"
    );
    assert!(
        waiting < 1024,
        "reconcile's future is {waiting} bytes: it holds the pass ({pass} bytes) inline"
    );
}

/// At start, the pods of a set wake it again while the set watch has not shown the finalizer its
/// first pass added with the status (`idle`: 1,241 adds for 1,000 sets; with the finalizer alone
/// expected, 1,000 adds and 317 status writes refused): later passes see the set as written.
#[tokio::test]
async fn a_finalizer_added_is_not_sent_again_while_the_cache_lags() {
    let mut value = web(2, false);
    value["metadata"]["finalizers"] = json!([]);
    let annotations = value["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    annotations.remove(naming::STATUS_ANNOTATION);
    let set: StatefulSet = object(value.clone());
    let (ctx, log) = context(&set, vec![], move |sent: &Sent| {
        match sent.method.as_str() {
            "PATCH" => {
                let mut patched = value.clone();
                patched["metadata"]["finalizers"] = json!([naming::FINALIZER]);
                patched["metadata"]["annotations"][naming::STATUS_ANNOTATION] = json!("Idle");
                (200, patched)
            }
            _ => (200, json!({})),
        }
    });
    let ctx = Arc::new(ctx);
    for _ in 0..3 {
        reconcile(Arc::new(set.clone()), ctx.clone())
            .await
            .expect("a pass");
    }
    let patches: Vec<Sent> = log
        .writes_and_reads()
        .into_iter()
        .filter(|s| s.method == "PATCH")
        .collect();
    let bodies: Vec<String> = patches.iter().map(|s| s.body.to_string()).collect();
    assert_eq!(
        patches.len(),
        1,
        "one patch for three passes on one cache: {bodies:?}"
    );
    let body = &patches[0].body["metadata"];
    assert_eq!(body["finalizers"], json!([naming::FINALIZER]));
    assert_eq!(
        body["annotations"][naming::STATUS_ANNOTATION],
        json!("Idle")
    );
}
