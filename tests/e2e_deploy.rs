//! The deployment manifests (`artifacts/*.yaml`) on the real API server: they pass a server-side dry
//! run and apply cleanly, their pods are admitted under the `restricted` Pod Security profile, and
//! their RBAC is enough for the controller binary, run on the host with nothing but a TokenRequest
//! token of the manifest's ServiceAccount, to do its work: a scale-down, a failed cleanup that is
//! retried, a deletion with background propagation, and holding the leader Lease. Any refusal in
//! the controller's log fails the test at once. Per namespace, the token must also be refused
//! everywhere else.
//!
//! Only `cluster_scoped_manifest_installs_and_its_rbac_suffices` touches the fixed namespace
//! `statefulset-scaledown-controller` and the cluster-scoped objects; it deletes them at the end.
//! Its controller watches all namespaces, so the tests that run a controller take turns.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use support::deploy::*;
use support::{Cluster, repo_dir};

// === tests ===

/// Static checks: both files parse, use rbac/v1, grant the same rules, and differ only where the
/// mode needs it.
#[test]
fn manifests_grant_the_same_rules_in_both_modes() {
    let cluster = read_manifest("cluster-scoped.yaml");
    let local = read_manifest("per-namespace.yaml");
    for o in cluster.iter().chain(&local) {
        let api = o["apiVersion"].as_str().unwrap_or_default();
        if api.starts_with("rbac.authorization.k8s.io") {
            assert_eq!(api, "rbac.authorization.k8s.io/v1", "{}", o["kind"]);
        }
    }
    assert_eq!(
        object(&cluster, "ClusterRole", SERVICE_ACCOUNT)["rules"],
        object(&local, "Role", SERVICE_ACCOUNT)["rules"],
        "the per-namespace Role grants what the ClusterRole grants"
    );
    let lease_role = "statefulset-scaledown-controller-leader-election";
    assert_eq!(
        object(&cluster, "Role", lease_role)["rules"],
        object(&local, "Role", lease_role)["rules"]
    );
    for o in &local {
        assert!(
            o["metadata"].get("namespace").is_none(),
            "per-namespace.yaml: {} {} names a namespace",
            o["kind"],
            o["metadata"]["name"]
        );
        assert!(
            !matches!(
                o["kind"].as_str(),
                Some("Namespace" | "ClusterRole" | "ClusterRoleBinding")
            ),
            "per-namespace.yaml holds a cluster-scoped {}",
            o["kind"]
        );
        for s in o["subjects"].as_array().into_iter().flatten() {
            assert!(
                s.get("namespace").is_none(),
                "subject with a namespace: {s}"
            );
        }
    }
    let args = |objects: &[Value]| -> Vec<String> {
        object(objects, "Deployment", SERVICE_ACCOUNT)["spec"]["template"]["spec"]["containers"][0]
            ["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect()
    };
    assert_eq!(
        args(&cluster),
        ["--leader-elect", "--log-format=json"],
        "cluster-scoped args"
    );
    assert_eq!(
        args(&local),
        ["--localOnly", "--leader-elect", "--log-format=json"],
        "per-namespace args"
    );
}

/// Every image in artifacts/*.yaml is the Makefile's `IMAGE`.
#[test]
fn manifest_images_match_the_makefile() {
    let image = support::makefile_image();
    let image = image.as_str();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_dir().join("artifacts"))
        .expect("artifacts/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "manifests in artifacts/: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let mut found = Vec::new();
        for o in yaml_objects(&text) {
            images(&o, &mut found);
        }
        assert!(!found.is_empty(), "{}: no image", file.display());
        for i in found {
            assert_eq!(
                i,
                image,
                "{}: image differs from the Makefile",
                file.display()
            );
        }
    }
}

/// per-namespace.yaml: server-side dry run, apply, re-apply unchanged, pods admitted under the
/// restricted profile (the test labels its namespace as a cautious user would).
#[tokio::test(flavor = "multi_thread")]
async fn per_namespace_manifest_applies_and_is_admitted() {
    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("deploy-per-namespace").await;
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &ns.name,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ])
        .await;
    assert_restricted_enforced(&cluster, &ns.name).await;
    let file = manifest_str("per-namespace.yaml");
    let kc = &cluster.kubeconfig;
    kubectl_ok(
        kc,
        &["apply", "--dry-run=server", "-n", &ns.name, "-f", &file],
    )
    .await;
    let applied = kubectl_ok(kc, &["apply", "-n", &ns.name, "-f", &file]).await;
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        9,
        "9 objects created:\n{applied}"
    );
    wait_deployment_ready(&cluster, &ns.name).await;
    assert_reapply_changes_nothing(kc, &ns.name, &file).await;
}

/// cluster-scoped.yaml: dry run, apply, pods admitted in the restricted namespace; then the
/// controller binary, with only the ServiceAccount's token, manages a scale-down and a deletion
/// in another namespace (cluster-wide watches) and holds its Lease. The install is deleted at
/// the end.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_manifest_installs_and_its_rbac_suffices() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let file = manifest_str("cluster-scoped.yaml");
    // A previous run that was interrupted may have left the install (or its namespace Terminating).
    kubectl_ok(
        &kc,
        &[
            "delete",
            "-f",
            &file,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    let _install = ClusterScopedInstall {
        kubeconfig: kc.clone(),
    };

    // A server-side dry run of namespaced objects needs their namespace to exist: apply the
    // manifest's own Namespace first, then dry-run everything, then apply everything.
    let objects = read_manifest("cluster-scoped.yaml");
    let namespace = scratch_file(
        "install-namespace.json",
        &object(&objects, "Namespace", INSTALL_NS).to_string(),
    );
    kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &namespace]).await;
    kubectl_ok(&kc, &["apply", "-f", &namespace]).await;
    kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &file]).await;
    let applied = kubectl_ok(&kc, &["apply", "-f", &file]).await;
    assert_eq!(
        applied.lines().filter(|l| l.ends_with(" created")).count(),
        9,
        "9 objects created besides the namespace:\n{applied}"
    );
    assert_restricted_enforced(&cluster, INSTALL_NS).await;
    wait_deployment_ready(&cluster, INSTALL_NS).await;

    let token = token_kubeconfig(&cluster, INSTALL_NS).await;
    let ns = cluster.namespace("deploy-cluster-rbac").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: ns.name.clone(),
    };
    let identity = format!("e2e-{}", ns.name);
    let mut controller = start_controller(
        &token,
        &identity,
        INSTALL_NS,
        &["--leader-elect", "--leader-election-namespace", INSTALL_NS],
    );
    rbac_scenarios(&ns, &identity, &controller).await;
    controller.assert_alive();
    let forbidden = forbidden_lines(&controller);
    assert!(
        forbidden.is_empty(),
        "the controller was refused with the ClusterRole's rights:\n{}",
        forbidden.join("\n")
    );
    assert_lease_held(&cluster, INSTALL_NS, &identity).await;
}

/// per-namespace.yaml in namespace A: the binary with `--localOnly` and only the ServiceAccount's
/// token manages a scale-down and a deletion in A, keeps running without cluster-wide rights, and
/// the token is refused in namespace B and at the cluster scope.
#[tokio::test(flavor = "multi_thread")]
async fn per_namespace_rbac_suffices_and_stays_in_its_namespace() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let a = cluster.namespace("deploy-ns-a").await;
    let b = cluster.namespace("deploy-ns-b").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: a.name.clone(),
    };
    kubectl_ok(
        &kc,
        &[
            "apply",
            "-n",
            &a.name,
            "-f",
            &manifest_str("per-namespace.yaml"),
        ],
    )
    .await;
    let token = token_kubeconfig(&cluster, &a.name).await;
    let identity = format!("e2e-{}", a.name);
    let mut controller = start_controller(
        &token,
        &identity,
        &a.name,
        &[
            "--localOnly",
            "--leader-elect",
            "--leader-election-namespace",
            &a.name,
        ],
    );

    assert_scoped_to(&token, &a.name, &b.name).await;

    rbac_scenarios(&a, &identity, &controller).await;

    // No crash loop for lack of cluster-wide rights: 10 s after its start the controller is alive
    // and still at work (it reconciles `flaky` once more: the resync is 10 s), and its log up to
    // that reconcile shows no refusal.
    let settle = Duration::from_secs(10).saturating_sub(controller.started.elapsed());
    tokio::time::sleep(settle).await;
    controller.assert_alive();
    controller.wait_reconciles(&a.name, "flaky", 1).await;
    controller.assert_alive();
    let forbidden = forbidden_lines(&controller);
    assert!(
        forbidden.is_empty(),
        "the --localOnly controller was refused (cluster-scope request?):\n{}",
        forbidden.join("\n")
    );
    let log = controller.log_text();
    assert!(
        !log.contains("cluster scope"),
        "cluster-scope requests in the log:\n{log}"
    );
    assert_lease_held(&cluster, &a.name, &identity).await;
}
