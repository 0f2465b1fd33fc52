//! `kubectl scaledown` on the local control plane, run through kubectl's own plugin discovery
//! (the binary's directory on PATH): `status` during a cleanup, in every output form, and
//! `release-finalizers` letting a namespace go after the controller is gone.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::fixtures::*;
use support::{Cluster, OUTCOME_LABEL, wait_for, wait_for_gone};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-scaledown");

/// `kubectl scaledown ARGS` with the plugin found on PATH, as a user runs it.
async fn kubectl_scaledown(cluster: &Cluster, args: &[&str]) -> (bool, String, String) {
    let dir = Path::new(PLUGIN).parent().expect("plugin directory");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = vec![dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let out = tokio::process::Command::new(support::kubectl_binary())
        .env("PATH", std::env::join_paths(dirs).expect("PATH"))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .arg("scaledown")
        .args(args)
        .output()
        .await
        .expect("run kubectl scaledown");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn status_json(env: &Env) -> Value {
    let ns = env.ns.name.as_str();
    let (ok, out, err) = kubectl_scaledown(&env.cluster, &["status", "-n", ns, "-o", "json"]).await;
    assert!(ok, "status -o json failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn status_shows_the_cleanup_in_flight_and_what_comes_next() {
    let env = Env::new("plugin-status", 5, &[]).await;
    let mut spec = SetSpec::new("web", 3, &env.class);
    spec.template = Some(template(json!({OUTCOME_LABEL: "Running"}), json!({}), ""));
    env.create_running(&spec).await;
    // A second set whose template is broken: its last Warning shows in the wide view.
    let mut broken = SetSpec::new("db", 2, &env.class);
    broken.template = Some("{not json".into());
    env.create_running(&broken).await;
    env.scale("db", 1).await;
    env.scale("web", 1).await;
    env.wait_event("db", "CleanupTemplateInvalid").await;
    env.wait_cleanup_pod("web-2").await;
    wait_for_pod_phase_running(&env, "web-2").await;

    let ns = env.ns.name.as_str();
    // The positional SET: only that set, though `db` is annotated too.
    let (ok, table, err) = kubectl_scaledown(&env.cluster, &["status", "-n", ns, "web"]).await;
    assert!(ok, "status failed: {err}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a header and the one set asked for:\n{table}"
    );
    assert!(lines[0].starts_with("NAMESPACE"), "{table}");
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &cells[..6],
        [
            ns,
            "web",
            "CleaningUp",
            "0",
            "data-web-1,data-web-2",
            "web-2:Running#1"
        ],
        "{table}"
    );

    let status = status_json(&env).await;
    let names: Vec<&str> = status
        .as_array()
        .expect("a list of sets")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["db", "web"], "both annotated sets without SET");
    let web = &status[1];
    assert_eq!(web["wanted"], "0");
    assert_eq!(web["orphaned_claims"], json!(["data-web-1", "data-web-2"]));
    assert_eq!(web["cleanups"][0]["phase"], "Running");
    assert_eq!(web["has_finalizer"], true);
    assert_eq!(web["gave_up"], json!([]));
    assert_eq!(web["status"], "CleaningUp");
    assert_eq!(
        web["status_annotation"], "CleaningUp",
        "the plugin shows the value the controller wrote"
    );

    let (ok, all, err) = kubectl_scaledown(&env.cluster, &["status", "-A", "-o", "wide"]).await;
    assert!(ok, "status -A failed: {err}");
    assert!(
        all.lines()
            .any(|l| l.starts_with(&format!("{ns} ")) && l.contains("web-2:Running#1")),
        "-A lists the set among all namespaces:\n{all}"
    );
    assert!(
        all.lines()
            .next()
            .is_some_and(|h| h.ends_with("LAST-WARNING")),
        "{all}"
    );
    assert!(
        all.lines()
            .any(|l| l.split_whitespace().take(2).eq([ns, "db"])
                && l.contains("CleanupTemplateInvalid: ")),
        "the last Warning of db in the wide view:\n{all}"
    );
    assert_eq!(
        status[0]["last_warning"]
            .as_str()
            .map(|w| w.starts_with("CleanupTemplateInvalid: ")),
        Some(true),
        "{status:#}"
    );
}

async fn wait_for_pod_phase_running(env: &Env, name: &str) {
    support::wait_for_pod_phase(&env.pods(), name, "Running", LONG).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_finalizers_lets_a_namespace_go_after_uninstall() {
    let mut env = Env::new("plugin-release", 2, &[]).await;
    env.create_running(&SetSpec::new("web", 2, &env.class))
        .await;
    // Uninstalled: the controller is gone, its finalizer stays on the set.
    env.controller().terminate(Duration::from_secs(5)).await;
    let ns = env.ns.name.clone();
    let namespaces: Api<Namespace> = Api::all(env.cluster.client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete namespace");
    // The namespace controller deletes the set's pods and marks the set; the finalizer holds it.
    wait_for("the set marked for deletion", LONG, || async {
        let set = env.sets().get_opt("web").await.expect("get set");
        set.is_some_and(|s| s.metadata.deletion_timestamp.is_some())
    })
    .await;
    let held = env.sets().get("web").await.expect("the set is still there");
    assert!(
        held.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );

    let (ok, out, err) = kubectl_scaledown(
        &env.cluster,
        &["release-finalizers", "-n", &ns, "--dry-run"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        format!("{ns}/web: would release finalizer {FINALIZER}")
    );
    let still = env
        .sets()
        .get("web")
        .await
        .expect("dry-run changed nothing");
    assert!(
        still
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );

    let (ok, out, err) = kubectl_scaledown(&env.cluster, &["release-finalizers", "-n", &ns]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        format!("{ns}/web: released finalizer {FINALIZER}")
    );
    wait_for_gone(&namespaces, &ns, LONG).await;
}
