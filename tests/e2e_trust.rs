//! End-to-end tests of what the controller may trust (issue #8): only pods it created and recorded
//! on the StatefulSet are cleanup pods; a claim is deleted only when a read after the pod succeeded
//! shows the ordinal still orphaned; templates are parsed under budgets; refusals of the API server
//! are reported and retried with a bound; distinct facts are distinct Events; a cleanup pod created
//! after a scale-up never runs.
//!
//! Every test has its own namespace and controller process (like tests/e2e_scaledown.rs), and
//! asserts over everything a watch recorded in its window ([`support::recorder::Recorder`]), never
//! over one look after a sleep.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::*;
use support::recorder::{self, Recorder, Seen, event_note, event_reason, event_regarding, ours};
use support::{OUTCOME_LABEL as OUTCOME, from_json, wait_for};

const CLAIMS: &str = "statefulsets.kubernetes.io/scaledown-claims";
const ATTEMPT: &str = "statefulsets.kubernetes.io/scaledown-attempt";
const GATE: &str = "statefulsets.kubernetes.io/scaledown-confirm";
/// Long enough for a warning that today's controller may never publish; the tests then fail on
/// what it did instead.
const WINDOW: Duration = Duration::from_secs(60);

// === shared checks ===

/// Panics if any claim the recorder saw was ever deleted (or marked for deletion).
fn assert_no_claim_deleted(claims: &Recorder<PersistentVolumeClaim>, context: &str) {
    let deleted: Vec<String> = claims
        .matching(|s| s.deleting)
        .iter()
        .map(|s| format!("{} (uid {}) at +{:?}", s.name, s.uid, s.since_start))
        .collect();
    assert!(
        deleted.is_empty(),
        "{context}: claims were deleted: {deleted:?}"
    );
}

/// The UID of a claim as the recorder first saw it.
fn first_uid(claims: &Recorder<PersistentVolumeClaim>, name: &str) -> String {
    claims
        .uids_of(name)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("the claim watch never saw {name}"))
}

/// A pod that looks like a cleanup pod of `set` at `ordinal`, made by someone who can only create
/// pods: our label and annotations, claims `claims` (name -> UID). KWOK lets it succeed in ~3 s.
fn forged_pod(set: &str, ordinal: u32, claims: Value) -> Pod {
    let name = format!("{set}-{ordinal}");
    from_json(json!({
        "metadata": {
            "name": name,
            "labels": {"scaledown-pod": name},
            "annotations": {OWNER: set, CLAIMS: claims.to_string(), ATTEMPT: "1"},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox"}],
        }
    }))
}

/// Deletes whatever pod holds `pod`'s name and creates `pod` in its place as `user`, as fast as a
/// user can; retried while the StatefulSet controller wins the race for the name. Returns the new
/// UID once the pod runs (read through `admin`, as the user may not read pods).
///
/// KWOK, our kubelet stand-in, finishes the deletion of the pod we replaced by a DELETE by name
/// without a UID precondition (a kubelet sends one): when it lands after our create, it removes
/// the forged pod instead. The audit log shows it (`target/cluster/logs/audit.log`). Such a pod is
/// forged again; only a pod that got to run is handed to the test.
async fn replace_pod(user: &Api<Pod>, admin: &Api<Pod>, pod: &Pod) -> String {
    let name = pod.name_any();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for attempt in 1..=50 {
        match user.delete(&name, &now).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete pod {name}: {e}"),
        }
        let uid = match user.create(&PostParams::default(), pod).await {
            Ok(created) => created.uid().expect("uid"),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("create forged pod {name}: {e}"),
        };
        if runs(admin, &name, &uid).await {
            eprintln!("forged pod {name} created at attempt {attempt}");
            return uid;
        }
        eprintln!("forged pod {name} (attempt {attempt}) was deleted before it ran; forging again");
    }
    panic!("could not take the name {name} from the StatefulSet controller in 50 tries")
}

/// Whether pod `name` with `uid` reaches Running or Succeeded before it is deleted.
async fn runs(pods: &Api<Pod>, name: &str, uid: &str) -> bool {
    let started = Instant::now();
    while started.elapsed() < LONG {
        let Some(pod) = pods.get_opt(name).await.expect("get pod") else {
            return false;
        };
        if pod.uid().as_deref() != Some(uid) || pod.metadata.deletion_timestamp.is_some() {
            return false;
        }
        if matches!(recorder::phase(&pod), "Running" | "Succeeded") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("forged pod {name} neither ran nor went away within {LONG:?}")
}

/// ServiceAccount `forger` in `env`'s namespace that may only create and delete pods; returns a
/// pods API that acts as it.
async fn pods_only_user(env: &Env) -> Api<Pod> {
    let pp = PostParams::default();
    let sa: ServiceAccount = from_json(json!({"metadata": {"name": "forger"}}));
    env.ns
        .api::<ServiceAccount>()
        .create(&pp, &sa)
        .await
        .expect("create ServiceAccount forger");
    let role: Role = from_json(json!({
        "metadata": {"name": "forger"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}]
    }));
    env.ns
        .api::<Role>()
        .create(&pp, &role)
        .await
        .expect("create Role forger");
    let binding: RoleBinding = from_json(json!({
        "metadata": {"name": "forger"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "forger"},
        "subjects": [{"kind": "ServiceAccount", "name": "forger", "namespace": env.ns.name}]
    }));
    env.ns
        .api::<RoleBinding>()
        .create(&pp, &binding)
        .await
        .expect("create RoleBinding forger");
    let kubeconfig =
        support::service_account_kubeconfig(&env.cluster, &env.ns.name, "forger").await;
    let client = support::client_from(&kubeconfig).await;
    let pods: Api<Pod> = Api::namespaced(client, &env.ns.name);
    // It really is limited: listing pods is refused.
    let refused = pods.list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "the forger may list pods: {refused:?}"
    );
    pods
}

/// The window of a forged pod: until the controller calls it unproven or deletes one of the claims
/// it names; then until the forged pod Succeeded and the controller has looked at the set twice
/// more. Panics if any claim was deleted, then if the Warning is missing.
async fn forged_pod_window(
    env: &Env,
    set: &str,
    (pod_name, forged_uid): (&str, &str),
    claims: &Recorder<PersistentVolumeClaim>,
    pods: &Recorder<Pod>,
    events: &Recorder<Event>,
) {
    // The Event may be about the set or about the pod.
    let unproven = |events: &Recorder<Event>| {
        let mut all = events.events(set, "UnprovenCleanupPod");
        all.extend(events.events(pod_name, "UnprovenCleanupPod"));
        all
    };
    // Until the controller calls it unproven, or a claim is deleted (which fails below).
    let warned = |s: &Seen<Event>| {
        ours(&s.object)
            && event_reason(&s.object) == "UnprovenCleanupPod"
            && [set, pod_name].contains(&event_regarding(&s.object))
    };
    tokio::select! {
        _ = events.wait_until(WINDOW, warned) => {}
        _ = claims.wait_until(WINDOW, |s| s.deleting) => {}
    }
    // Then until the forged pod finished (or was removed) and the controller looked twice more,
    // and the claims watch delivered a marker set after that: the window holds every change.
    pods.wait_for("the forged pod to succeed or go", WINDOW, |s| {
        s.uid == forged_uid && (recorder::phase(&s.object) == "Succeeded" || s.deleting)
    })
    .await;
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, set, 2).await;
    if claims.first(|s| s.deleting).is_none() {
        let claim = format!("data-{pod_name}");
        claims.close_window(&env.ns.api(), &claim).await;
    }
    assert_no_claim_deleted(claims, "a forged cleanup pod");
    let warning = unproven(events).into_iter().next().unwrap_or_else(|| {
        let history: Vec<String> = pods
            .of(pod_name)
            .iter()
            .map(|p| {
                format!(
                    "{:?} {:?} uid {} rv {} phase {} deleting {} labels {:?}",
                    p.since_start,
                    p.kind,
                    p.uid,
                    p.resource_version,
                    recorder::phase(&p.object),
                    p.deleting,
                    p.labels
                )
            })
            .collect();
        panic!(
            "no Warning UnprovenCleanupPod on {set} within {WINDOW:?}; events:\n{}\npod {pod_name}:\n{}",
            events.describe(),
            history.join("\n")
        )
    });
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        event_note(&warning).contains(pod_name),
        "the Warning names the pod {pod_name}: {}",
        event_note(&warning)
    );
}

// === 1. forged cleanup pods ===

/// Set `s` at 1 replica; a user replaces pod `s-0` by a pod that looks like a cleanup pod of
/// ordinal 0 claiming `data-s-0`, which succeeds. Nothing may be deleted.
async fn forged_pod_on_a_wanted_ordinal(test: &str, pods_only: bool) {
    let env = Env::new(test, 1, &["--resync-period", "2s"]).await;
    env.create_running(&SetSpec::new("s", 1, &env.class)).await;
    let claims = env.record_claims().await;
    let pods = env.record_pods().await;
    let events = env.record_events().await;
    let claim_uid = first_uid(&claims, "data-s-0");

    let user = if pods_only {
        pods_only_user(&env).await
    } else {
        env.pods()
    };
    let forged = forged_pod("s", 0, json!({"data-s-0": claim_uid}));
    let forged_uid = replace_pod(&user, &env.pods(), &forged).await;
    forged_pod_window(
        &env,
        "s",
        (&forged.name_any(), &forged_uid),
        &claims,
        &pods,
        &events,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_pod_on_a_wanted_ordinal_deletes_nothing() {
    forged_pod_on_a_wanted_ordinal("forged-wanted", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_pod_by_a_pods_only_user_deletes_nothing() {
    forged_pod_on_a_wanted_ordinal("forged-pods-only", true).await;
}

/// Set `s` scaled 3->1 with a cleanup that keeps running on ordinal 2, so ordinal 1 (orphaned)
/// waits its turn; a pods-only user creates a forged cleanup pod `s-1` claiming `data-s-1`, which
/// succeeds. The controller must not take it for its own: `data-s-1` stays.
#[tokio::test(flavor = "multi_thread")]
async fn forged_pod_on_an_orphaned_ordinal_deletes_nothing() {
    let env = Env::new("forged-orphaned", 3, &["--resync-period", "2s"]).await;
    let mut spec = SetSpec::new("s", 3, &env.class);
    spec.template = Some(template(json!({OUTCOME: "Running"}), json!({}), "Never"));
    env.create_running(&spec).await;
    let claims = env.record_claims().await;
    let pods = env.record_pods().await;
    let events = env.record_events().await;
    let claim_uid = first_uid(&claims, "data-s-1");
    let user = pods_only_user(&env).await;

    env.scale("s", 1).await;
    pods.wait_for("the cleanup pod s-2 to run", LONG, |s| {
        s.name == "s-2"
            && s.annotations.contains_key(OWNER)
            && recorder::phase(&s.object) == "Running"
    })
    .await;
    let stateful = pods.uids_of("s-1").into_iter().next().expect("s-1 seen");
    pods.wait_for("the stateful pod s-1 to be gone", LONG, |s| {
        s.uid == stateful && s.gone()
    })
    .await;
    let forged = forged_pod("s", 1, json!({"data-s-1": claim_uid}));
    let forged_uid = replace_pod(&user, &env.pods(), &forged).await;
    forged_pod_window(
        &env,
        "s",
        (&forged.name_any(), &forged_uid),
        &claims,
        &pods,
        &events,
    )
    .await;
}

// === 2, 3. template budgets ===

/// Samples the controller's VmRSS every 100 ms while alive; the maximum in kB.
struct RssSampler {
    max_kb: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let max_kb = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (max, halt) = (max_kb.clone(), stop.clone());
        tokio::spawn(async move {
            while !halt.load(Ordering::Relaxed) {
                if let Some(kb) = support::proc_status_kb(pid, "VmRSS") {
                    max.fetch_max(kb, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        RssSampler { max_kb, stop }
    }

    fn max_kb(&self) -> u64 {
        self.max_kb.load(Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A billion-laughs YAML pod template of about 4 KB: a 3 KB string, and nine levels of ten
/// aliases each to the level below (10^9 copies of the string if expanded).
fn alias_bomb() -> String {
    let mut yaml = format!("l0: &l0 \"{}\"\n", "lol".repeat(1000));
    for level in 1..=9 {
        let refs = vec![format!("*l{}", level - 1); 10].join(", ");
        yaml.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    yaml.push_str(
        "metadata:\n  labels: {app: cleanup}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: busybox\n    args: *l9\n",
    );
    yaml
}

/// A JSON pod template of about 250 KB: 8,500 containers.
fn oversized_template() -> String {
    let containers: Vec<Value> = (0..8500)
        .map(|i| json!({"name": format!("c{i}"), "image": "x"}))
        .collect();
    json!({"metadata": {"labels": {"app": "cleanup"}},
           "spec": {"restartPolicy": "Never", "containers": containers}})
    .to_string()
}

/// A normal set `plain` 3->2 next to set `bad` 2->1 whose template is `raw`: `plain` is cleaned,
/// `bad` gets exactly one Warning `CleanupTemplateTooLarge` that names the limit, no pod is ever
/// created for `bad`, the log has at most 3 warnings or errors about it (no retry loop), and the
/// controller stays alive with a peak RSS under 150 MiB (recorded as `measure`).
async fn template_over_budget(test: &str, raw: String, measure: &str) {
    let mut env = Env::new(test, 5, &["--resync-period", "2s"]).await;
    let sampler = RssSampler::start(env.controller().pid().expect("pid"));
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let events = env.record_events().await;
    let mut bad = SetSpec::new("bad", 2, &env.class);
    bad.template = Some(raw);
    env.create_pods_running(&bad).await;
    env.create_running(&SetSpec::new("plain", 3, &env.class))
        .await;
    env.scale("bad", 1).await;
    env.scale("plain", 2).await;

    let plain_claim = first_uid(&claims, "data-plain-2");
    claims
        .wait_for("claim data-plain-2 of the normal set to go", LONG, |s| {
            s.uid == plain_claim && s.gone()
        })
        .await;
    // The window: until the Warning (or a minute without it), then three more looks at the set.
    events
        .wait_until(WINDOW, |s| {
            ours(&s.object)
                && event_regarding(&s.object) == "bad"
                && event_reason(&s.object).starts_with("CleanupTemplate")
        })
        .await;
    let settled = env
        .controller
        .as_ref()
        .expect("controller")
        .settle(&env.ns.name, "bad", 3, LONG)
        .await;
    env.controller().assert_alive();
    let peak_kb = sampler.max_kb();
    record(measure, format!("{peak_kb} kB"));
    eprintln!("{measure}: {peak_kb} kB");

    let bad_pods =
        pods.matching(|s| s.name.starts_with("bad-") && s.annotations.contains_key(OWNER));
    assert!(
        bad_pods.is_empty(),
        "a cleanup pod was created from the template over budget: {:?}",
        bad_pods
            .iter()
            .map(|s| (&s.name, &s.uid))
            .collect::<Vec<_>>()
    );
    assert_no_claim_of("bad", &claims);
    let noise = warnings_about(env.controller(), "bad");
    assert!(
        noise.len() <= 3,
        "{} warnings or errors about set bad in the controller log (a retry loop?):\n{}",
        noise.len(),
        noise.join("\n")
    );
    assert_one_too_large(&events);
    assert!(
        settled,
        "the controller did not reconcile set bad 3 times within {LONG:?} (--resync-period 2s)"
    );
    assert!(
        peak_kb < 150 * 1024,
        "controller RSS reached {peak_kb} kB (limit 150 MiB)"
    );
}

/// Log lines at WARN or ERROR that mention set `set` (or its pods), except conflicts on the
/// finalizer patch (a benign race with the StatefulSet controller's status updates).
fn warnings_about(controller: &Controller, set: &str) -> Vec<String> {
    let mentions = [
        format!("set={set} "),
        format!("StatefulSet.v1.apps/{set}."),
        format!("pod {set}-"),
    ];
    controller
        .plain_log()
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| mentions.iter().any(|m| l.contains(m.as_str())))
        .filter(|l| !l.contains("patch finalizers"))
        .map(|l| l.chars().take(300).collect())
        .collect()
}

/// Exactly one Warning `CleanupTemplateTooLarge` on `bad`, naming the limit.
fn assert_one_too_large(events: &Recorder<Event>) {
    let all = events.events("bad", "CleanupTemplateTooLarge");
    let Some(warning) = all.first() else {
        panic!(
            "no Warning CleanupTemplateTooLarge on bad; events:\n{}",
            events.describe()
        );
    };
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = event_note(warning).to_lowercase();
    assert!(
        note.chars().any(|c| c.is_ascii_digit())
            && ["limit", "at most", "max"].iter().any(|w| note.contains(w)),
        "the Warning names the limit: {note}"
    );
    let count: i32 = all
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(count, 1, "one Warning:\n{}", events.describe());
}

/// Panics if a claim of set `set` was deleted.
fn assert_no_claim_of(set: &str, claims: &Recorder<PersistentVolumeClaim>) {
    let infix = format!("-{set}-");
    let deleted = claims.matching(|s| s.deleting && s.name.contains(&infix));
    assert!(
        deleted.is_empty(),
        "claims of {set} were deleted: {:?}",
        deleted.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn yaml_alias_bomb_is_refused_within_budget() {
    let bomb = alias_bomb();
    assert!(
        (3000..=5200).contains(&bomb.len()),
        "bomb of {} bytes",
        bomb.len()
    );
    template_over_budget(
        "alias-bomb",
        bomb,
        "alias bomb (4 KB YAML): controller peak VmRSS",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_template_is_refused_without_a_retry_storm() {
    let raw = oversized_template();
    assert!(
        (240_000..=255_000).contains(&raw.len()),
        "template of {} bytes",
        raw.len()
    );
    template_over_budget(
        "oversized",
        raw,
        "oversized template (250 KB, 8,500 containers): controller peak VmRSS",
    )
    .await;
}

// === 4. refusals by the API server ===

/// Set `web` 2->1 after `refuse` made the API server refuse new pods: a Warning
/// `CleanupPodRejected` carrying the API's message (`expect` in its note), then, with
/// `--cleanup-attempts 2`, `CleanupGaveUp`; no pod, no claim touched, a bounded number of Events.
async fn refused_cleanup_pod(test: &str, refuse: impl AsyncFnOnce(&Env), expect: &str) {
    let env = Env::new(
        test,
        2,
        &[
            "--cleanup-attempts",
            "2",
            "--cleanup-backoff",
            "1s",
            "--resync-period",
            "2s",
        ],
    )
    .await;
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let events = env.record_events().await;
    refuse(&env).await;
    env.scale("web", 1).await;

    let rejected = events.wait_event("web", "CleanupPodRejected", WINDOW).await;
    assert_eq!(rejected.type_.as_deref(), Some("Warning"));
    assert!(
        event_note(&rejected).contains(expect),
        "the Warning carries the API's message ({expect:?}): {}",
        event_note(&rejected)
    );
    events.wait_event("web", "CleanupGaveUp", WINDOW).await;
    let controller = env.controller.as_ref().expect("controller");
    controller.wait_reconciles(&env.ns.name, "web", 3).await;

    let created = pods.matching(|s| s.name == "web-1" && s.annotations.contains_key(OWNER));
    assert!(created.is_empty(), "a refused pod cannot exist");
    assert_no_claim_deleted(&claims, "a refused cleanup pod");
    let rejections: i32 = events
        .events("web", "CleanupPodRejected")
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert!(
        rejections <= 2,
        "at most one rejection per attempt, saw {rejections}:\n{}",
        events.describe()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_security_refusal_is_reported_and_given_up() {
    refused_cleanup_pod(
        "refused-podsecurity",
        async |env: &Env| {
            // After the set's pods run: Pod Security is checked when a pod is created.
            let patch = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
            Api::<Namespace>::all(env.ns.client())
                .patch(&env.ns.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("label the namespace restricted");
        },
        "violates PodSecurity",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_refusal_is_reported_and_given_up() {
    refused_cleanup_pod(
        "refused-quota",
        async |env: &Env| {
            let no_pods = json!({"hard": {"pods": "0"}});
            env.ns.create_quota("no-pods", no_pods).await;
        },
        "exceeded quota",
    )
    .await;
}

/// An admission policy that refuses cleanup pods in `env`'s namespace with 403, as a webhook would
/// (a ValidatingAdmissionPolicy: the API server's own webhook-free admission, so the test needs no
/// TLS server). Cluster-scoped: named after the namespace and deleted by the returned guard.
async fn refuse_cleanup_pods_by_policy(env: &Env) -> PolicyGuard {
    let name = format!("refuse-cleanup-{}", env.ns.name);
    let policy: ValidatingAdmissionPolicy = from_json(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]}]},
            "validations": [{
                "expression": "!has(object.metadata.labels) || !('scaledown-pod' in object.metadata.labels)",
                "message": "cleanup pods are refused by the test's admission policy",
                "reason": "Forbidden"
            }]
        }
    }));
    let binding = support::deny_in_namespace(&name, &env.ns.name);
    let client = env.ns.client();
    let post = PostParams::default();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&post, &policy)
        .await
        .expect("create the admission policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&post, &binding)
        .await
        .expect("bind the admission policy");
    // The API server loads policies from its own informer: wait until a look-alike is refused.
    let probe: Pod = from_json(json!({
        "metadata": {"name": "policy-probe", "labels": {"scaledown-pod": "probe"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }));
    let pods: Api<Pod> = env.ns.api();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the admission policy to refuse pods", LONG, || async {
        matches!(pods.create(&dry_run, &probe).await, Err(kube::Error::Api(s)) if s.code == 403)
    })
    .await;
    PolicyGuard { client, name }
}

/// Deletes the cluster-scoped admission policy and its binding of one test.
struct PolicyGuard {
    client: kube::Client,
    name: String,
}

impl PolicyGuard {
    async fn remove(self) {
        let dp = DeleteParams::default();
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(self.client)
            .delete(&self.name, &dp)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admission_policy_refusal_is_reported_and_given_up() {
    let guard = Arc::new(tokio::sync::Mutex::new(None));
    let slot = guard.clone();
    refused_cleanup_pod(
        "refused-policy",
        async move |env: &Env| {
            *slot.lock().await = Some(refuse_cleanup_pods_by_policy(env).await);
        },
        "refused by the test's admission policy",
    )
    .await;
    if let Some(policy) = guard.lock().await.take() {
        policy.remove().await;
    }
}

// === 6. distinct facts are distinct Events ===

/// The notes of every Event of ours about `set` with `reason`, read fresh from events.k8s.io/v1.
async fn event_notes(env: &Env, set: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = env.ns.api();
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .iter()
        .filter(|e| ours(e) && event_regarding(e) == set && event_reason(e) == reason)
        .map(|e| event_note(e).to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn give_ups_of_three_ordinals_are_three_visible_events() {
    let env = Env::new("three-give-ups", 4, &["--cleanup-attempts", "1"]).await;
    let mut spec = SetSpec::new("web", 4, &env.class);
    spec.parallel = true;
    spec.template = Some(template(json!({OUTCOME: "Failed"}), json!({}), "Never"));
    env.create_running(&spec).await;
    let events = env.record_events().await;
    env.scale("web", 1).await;
    // Three give-ups happened: three Events, or (today) one series counted three times.
    events
        .wait_until_record("three CleanupGaveUp", WINDOW, |events| {
            events
                .events("web", "CleanupGaveUp")
                .iter()
                .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                .sum::<i32>()
                >= 3
        })
        .await;
    let notes = event_notes(&env, "web", "CleanupGaveUp").await;
    for n in 1..=3 {
        let pod = format!("web-{n}");
        assert!(
            notes.iter().any(|note| note.contains(&pod)),
            "the give-up of ordinal {n} ({pod}) is not visible in any Event; notes: {notes:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_steps_are_separate_events() {
    let env = Env::new("dry-run-events", 3, &["--dry-run"]).await;
    let events = env.record_events().await;
    env.create_pods_running(&SetSpec::new("web", 3, &env.class))
        .await;
    env.scale("web", 2).await;
    // The would-be create of ordinal 2's cleanup pod happened (after the would-be finalizer and
    // status writes, each its own DryRun Event).
    events
        .wait_until_record("the DryRun of the create", WINDOW, |events| {
            events.events("web", "DryRun").iter().any(|e| {
                let note = e.note.as_deref().unwrap_or_default();
                note.contains("create cleanup pod") && note.contains("ordinal 2")
            })
        })
        .await;
    let notes = event_notes(&env, "web", "DryRun").await;
    let finalizer = notes.iter().position(|n| n.contains("finalizer"));
    let create = notes
        .iter()
        .position(|n| n.contains("create cleanup pod") && n.contains("ordinal 2"));
    assert!(
        finalizer.is_some(),
        "a DryRun Event for the finalizer: {notes:#?}"
    );
    assert!(
        create.is_some() && create != finalizer,
        "a separate DryRun Event for creating the cleanup pod of ordinal 2: {notes:#?}"
    );
}

// === 7. scale-up racing the cleanup pod's creation ===

/// The StatefulSet's replicas in force just before `resource_version` (all objects share etcd's
/// revision counter in this cluster).
fn replicas_before(history: &[Seen<StatefulSet>], resource_version: u64) -> Option<i32> {
    history
        .iter()
        .filter(|s| s.resource_version < resource_version)
        .max_by_key(|s| s.resource_version)
        .and_then(|s| s.object.spec.as_ref())
        .and_then(|s| s.replicas)
}

/// Waits until `s-1` is a running stateful pod again. A cleanup pod that holds the name and has
/// run is deleted (as a user would), so the next round can start; returns how many were.
async fn settle_round(env: &Env, pods: &Recorder<Pod>) -> usize {
    let deadline = Instant::now() + LONG;
    let mut deleted = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "s-1 did not come back within {LONG:?}"
        );
        let latest = pods.of("s-1").into_iter().last();
        if let Some(s) = latest.filter(|s| !s.gone()) {
            let pod = &s.object;
            let cleanup = s.annotations.contains_key(OWNER);
            if !cleanup && !s.deleting && recorder::phase(pod) == "Running" {
                return deleted;
            }
            if cleanup && !s.deleting && recorder::ran(pod) {
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(s.uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let _ = env.pods().delete("s-1", &params).await;
                deleted += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One round: scale 2->1 and back to 2. `mode` 0: at once; 1: right when the watch sees the
/// stateful `s-1` gone; 2: that plus `jitter`.
async fn race_round(env: &Env, pods: &Recorder<Pod>, mode: usize, jitter: Duration) {
    let stateful = pods
        .of("s-1")
        .into_iter()
        .rev()
        .find(|s| !s.annotations.contains_key(OWNER))
        .map(|s| s.uid)
        .expect("stateful s-1");
    env.scale("s", 1).await;
    if mode > 0 {
        pods.wait_for("the stateful s-1 to go", LONG, |s| {
            s.uid == stateful && s.gone()
        })
        .await;
        if mode == 2 {
            tokio::time::sleep(jitter).await;
        }
    }
    env.scale("s", 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cleanup_pod_created_after_a_scale_up_never_runs() {
    const ROUNDS: usize = 20;
    let env = Env::new("scale-up-race", 2, &[]).await;
    let mut spec = SetSpec::new("s", 2, &env.class);
    spec.template = Some(template(json!({OUTCOME: "Running"}), json!({}), "Never"));
    env.create_running(&spec).await;
    let sets = env.record_sets().await;
    let pods = env.record_pods().await;
    let claims = env.record_claims().await;
    let mut deleted_by_us = 0;
    for round in 0..ROUNDS {
        let jitter = Duration::from_millis([2, 5, 10, 20, 40][round % 5]);
        race_round(&env, &pods, round % 3, jitter).await;
        deleted_by_us += settle_round(&env, &pods).await;
    }

    let report = race_report(&sets.of("s"), &pods);
    record(
        "scale-up race (20 rounds of 2->1->2)",
        format!("{report}; {deleted_by_us} deleted by the test"),
    );
    eprintln!("scale-up race: {report}");
    assert_no_claim_deleted(&claims, "scale-up race");
    assert!(
        report.ungated_at_creation.is_empty(),
        "cleanup pods of s-1 were created without the gate {GATE}, so nothing confirmed them before they ran: {:?}",
        report.ungated_at_creation
    );
    assert!(
        report.ran_created_after_scale_up.is_empty(),
        "cleanup pods of s-1 ran although they were created after the scale-up had been saved: {:?}",
        report.ran_created_after_scale_up
    );
}

/// What the watches saw of the cleanup pods of `s-1` during the race.
#[derive(Debug, Default)]
struct RaceReport {
    created: usize,
    created_after_scale_up: usize,
    ran: usize,
    /// Pods that ran although the scale-up had been saved before they were scheduled.
    ran_scheduled_after_scale_up: usize,
    ran_created_after_scale_up: Vec<String>,
    ungated_at_creation: Vec<String>,
}

impl std::fmt::Display for RaceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cleanup pods of s-1, {} created without the gate, {} created after the scale-up, {} ran, {} ran although the scale-up was saved before they were scheduled, {} ran although created after the scale-up",
            self.created,
            self.ungated_at_creation.len(),
            self.created_after_scale_up,
            self.ran,
            self.ran_scheduled_after_scale_up,
            self.ran_created_after_scale_up.len()
        )
    }
}

fn race_report(history: &[Seen<StatefulSet>], pods: &Recorder<Pod>) -> RaceReport {
    let mut report = RaceReport::default();
    for uid in pods.uids_of("s-1") {
        let seen = pods.matching(|s| s.uid == uid);
        if !seen.iter().any(|s| s.annotations.contains_key(OWNER)) {
            continue;
        }
        report.created += 1;
        let born = seen[0].resource_version;
        if !recorder::gates(&seen[0].object).iter().any(|g| g == GATE) {
            report.ungated_at_creation.push(uid.clone());
        }
        let wanted = replicas_before(history, born) != Some(1);
        report.created_after_scale_up += usize::from(wanted);
        let Some(scheduled) = seen.iter().find(|s| recorder::ran(&s.object)) else {
            continue;
        };
        report.ran += 1;
        if replicas_before(history, scheduled.resource_version) != Some(1) {
            report.ran_scheduled_after_scale_up += 1;
        }
        if wanted {
            report
                .ran_created_after_scale_up
                .push(format!("{uid} (created at revision {born})"));
        }
    }
    report
}
