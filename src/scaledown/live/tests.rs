//! The rival sets a live read names, and the order and overlap of a namespace's lists (on a
//! paused clock over a scripted API server).

use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::mock_api::{self, Answer};

/// Every list answers empty after `LIST_TAKES`.
const LIST_TAKES: Duration = Duration::from_secs(1);

/// The kind of list a path asks for.
fn kind(path: &str) -> &'static str {
    ["persistentvolumeclaims", "pods", "statefulsets"]
        .into_iter()
        .find(|k| path.ends_with(k))
        .unwrap_or("other")
}

fn empty_list(path: &str) -> Answer {
    let (api_version, list) = match kind(path) {
        "persistentvolumeclaims" => ("meta.k8s.io/v1", "PartialObjectMetadataList"),
        "pods" => ("v1", "PodList"),
        _ => ("apps/v1", "StatefulSetList"),
    };
    let body = json!({"apiVersion": api_version, "kind": list, "metadata": {"resourceVersion": "7"}, "items": []});
    (200, body)
}

/// When each kind of list arrived, since the start.
type Arrivals = Arc<Mutex<Vec<(&'static str, Duration)>>>;

/// A client whose lists each take `LIST_TAKES`, and when each list arrived.
fn slow_lists() -> (Client, Arrivals) {
    let start = tokio::time::Instant::now();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let (client, _) = mock_api::serve_slow(move |sent| {
        let at = start.elapsed();
        seen.lock().expect("arrivals").push((kind(&sent.path), at));
        (empty_list(&sent.path), LIST_TAKES)
    });
    (client, arrivals)
}

#[tokio::test(start_paused = true)]
async fn claims_are_listed_first_then_pods_and_sets_at_once() {
    let (client, arrivals) = slow_lists();
    let started = tokio::time::Instant::now();
    let listed = list_namespace(&client, "ns").await.expect("listed");
    assert!(listed.claims.is_empty() && listed.pods.is_empty() && listed.sets.is_empty());
    let arrivals = arrivals.lock().expect("arrivals").clone();
    let at = |k: &str| {
        arrivals
            .iter()
            .find(|(kind, _)| *kind == k)
            .map(|(_, at)| *at)
            .expect("listed")
    };
    assert_eq!(arrivals.len(), 3, "{arrivals:?}");
    assert_eq!(at("persistentvolumeclaims"), Duration::ZERO);
    // Sent once the claims were answered, both at once: never before the claim list ended.
    assert_eq!(at("pods"), LIST_TAKES, "{arrivals:?}");
    assert_eq!(at("statefulsets"), LIST_TAKES, "{arrivals:?}");
    assert_eq!(
        started.elapsed(),
        2 * LIST_TAKES,
        "two lists' time, not three"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shared_list_is_timed_by_kind_and_counts_its_callers() {
    let (client, _) = slow_lists();
    let metrics = Arc::new(Metrics::default());
    let lists = NamespaceLists::new(client, metrics.clone(), false);
    lists.list("ns").await.expect("listed");
    let text = metrics.encode();
    let line = |start: &str| {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_default()
            .to_string()
    };
    for kind in ["claims", "pods", "statefulsets", "all"] {
        let count = format!("scaledown_namespace_list_duration_seconds_count{{kind=\"{kind}\"}}");
        assert_eq!(line(&count), format!("{count} 1"), "{text}");
    }
    let all = "scaledown_namespace_list_duration_seconds_sum{kind=\"all\"}";
    assert_eq!(line(all), format!("{all} 2.0"));
    assert_eq!(
        line("scaledown_namespace_list_callers_sum"),
        "scaledown_namespace_list_callers_sum 1.0"
    );
    assert_eq!(
        line("scaledown_namespace_list_wait_seconds_sum"),
        "scaledown_namespace_list_wait_seconds_sum 2.0"
    );
}

fn set(name: &str, template: &str, app: &str) -> Arc<StatefulSet> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": app}}, "template": {},
                     "serviceName": name,
                     "volumeClaimTemplates": [{"metadata": {"name": template}}]}
        }))
        .expect("statefulset"),
    )
}

fn claim(
    name: &str,
    app: Option<&str>,
) -> Arc<kube::core::PartialObjectMeta<PersistentVolumeClaim>> {
    let labels = app.map(|a| json!({"app": a})).unwrap_or(json!({}));
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns", "labels": labels}
        }))
        .expect("claim"),
    )
}

fn names(sets: Vec<Arc<StatefulSet>>) -> Vec<String> {
    sets.iter().map(|s| s.name_any()).collect()
}

/// Issue 23: the live read names the same rivals as the cache's slice: by claim name always,
/// by selector labels only when one of the set's claims lacks its own labels.
#[test]
fn rival_sets_are_those_a_claim_could_belong_to() {
    let my_db = set("my-db", "data", "my-db");
    let listed = |claims| Listed {
        claims,
        pods: Vec::new(),
        cleanup_pods: Vec::new(),
        sets: vec![
            my_db.clone(),
            set("db", "data-my", "db"),
            set("other", "data", "other"),
            set("web", "data", "web"),
        ],
    };
    let own = listed(vec![claim("data-my-db-0", Some("my-db"))]);
    assert_eq!(names(own.rival_sets(&my_db)), ["db"], "by name only");
    let foreign = listed(vec![
        claim("data-my-db-0", Some("my-db")),
        claim("data-my-db-1", Some("other")),
    ]);
    assert_eq!(names(foreign.rival_sets(&my_db)), ["db", "other"]);
    let none = listed(vec![claim("data-web-0", Some("web"))]);
    assert!(
        none.rival_sets(&my_db).is_empty(),
        "claims of other sets only"
    );
}

fn pod(name: &str, claims: &[&str], cleanup: bool) -> Arc<Pod> {
    let mut pod = pod_json(name, cleanup);
    pod["spec"]["volumes"] = (claims.iter().enumerate())
        .map(|(i, c)| json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    Arc::new(serde_json::from_value(pod).expect("pod"))
}

fn pod_names(pods: &[Arc<Pod>]) -> Vec<String> {
    pods.iter().map(|p| p.name_any()).collect()
}

/// Issue 25 (`sets5000`: peak RSS 6,730 MiB): a pass keeps only its set's part of a namespace's list, chosen
/// as the cache's slice chooses it, so the list is freed once the passes it served have sliced it.
#[test]
fn a_slice_of_a_list_holds_only_what_the_set_looks_at() {
    let web = set("web", "data", "web");
    let cleanup = pod("web-1-scaledown", &["data-web-1"], true);
    let listed = Listed {
        claims: vec![
            claim("data-web-0", Some("web")),
            claim("data-web-1", Some("web")),
            claim("data-db-0", Some("db")),
            claim("logs-web-0", Some("web")),
        ],
        pods: vec![
            pod("web-0", &["data-web-0"], false),
            pod("db-0", &["data-db-0"], false),
            pod("backup", &["data-web-1", "data-db-0"], false),
            pod("reader", &["logs-web-0"], false),
            cleanup.clone(),
        ],
        cleanup_pods: vec![cleanup, pod("db-0-scaledown", &["data-db-0"], true)],
        sets: vec![web.clone(), set("db", "data", "db")],
    };
    let slice = listed.slice(&web);
    let claims: Vec<String> = slice.claims.iter().map(|c| c.name_any()).collect();
    assert_eq!(
        claims,
        ["data-web-0", "data-web-1"],
        "claims of its templates"
    );
    assert_eq!(
        pod_names(&slice.pods),
        ["web-0", "backup", "web-1-scaledown"],
        "its pods and the users of its claims"
    );
    assert_eq!(pod_names(&slice.cleanup_pods), ["web-1-scaledown"]);
    assert_eq!(slice.ordinals, listed.ordinals(&web), "the same ordinals");
}

fn pod_json(name: &str, cleanup: bool) -> serde_json::Value {
    let labels = if cleanup {
        json!({naming::CLEANUP_LABEL: "true"})
    } else {
        json!({})
    };
    json!({"metadata": {"name": name, "namespace": "ns", "labels": labels,
                        "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

/// Issue 25: the pods of a namespace are listed in pages of `LIVE_PAGE_SIZE`, each pruned as it
/// arrives; the cleanup pods are kept whole.
#[tokio::test]
async fn the_pods_of_a_namespace_are_listed_in_pages() {
    let (client, log) = mock_api::serve(|sent| {
        if kind(&sent.path) != "pods" {
            return empty_list(&sent.path);
        }
        let (items, next) = if sent.query.contains("continue=page2") {
            (vec![pod_json("web-1-scaledown", true)], "")
        } else {
            (vec![pod_json("web-0", false)], "page2")
        };
        let meta = json!({"resourceVersion": "7", "continue": next});
        (
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items}),
        )
    });
    let listed = list_namespace(&client, "ns").await.expect("listed");
    let queries: Vec<String> = (log.all().into_iter())
        .filter(|s| kind(&s.path) == "pods")
        .map(|s| s.query)
        .collect();
    assert_eq!(queries.len(), 2, "{queries:?}");
    assert!(
        queries
            .iter()
            .all(|q| q.contains(&format!("limit={LIVE_PAGE_SIZE}")))
    );
    assert!(queries[1].contains("continue=page2"), "{queries:?}");
    assert_eq!(pod_names(&listed.pods), ["web-0", "web-1-scaledown"]);
    assert!(
        listed
            .pods
            .iter()
            .all(|p| p.metadata.managed_fields.is_none()),
        "pruned"
    );
    assert_eq!(pod_names(&listed.cleanup_pods), ["web-1-scaledown"]);
    assert!(
        listed.cleanup_pods[0].metadata.managed_fields.is_some(),
        "whole"
    );
}
