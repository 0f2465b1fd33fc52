//! The install commands of the README and of docs/operations.md, run as written against the local
//! cluster: every fenced `sh` block of their `## Install` sections is read from the page itself, so
//! a page that drifts from the manifests, the chart or kubectl fails here.
//!
//! A block runs if every command in it can run here (kubectl, helm, sed over the repository's
//! files); otherwise the whole block is listed as not run, with the reason, and the test checks
//! that the reason is one it knows: a command no rule covers fails the test, so a new kind of
//! install step gets a decision. The controller pods land on KWOK nodes (they are Ready without
//! pulling), so `kubectl rollout status` completes whatever image a command names. The blocks of
//! a page run one after another on the same cluster (their objects do not collide: the Helm
//! release's names differ from the manifests', and re-applying a manifest is what an upgrade
//! does); after each page everything an install creates is removed (a namespace deletion takes
//! about 5 s, so not after every block). The test runs alone (`make e2e` runs it after the
//! parallel tests, beside tests/e2e_incluster.rs): the manifests' names are fixed and
//! tests/e2e_deploy.rs installs the same ones.

mod support;

use support::output_text as text;

use std::path::Path;
use std::time::{Duration, Instant};

use support::Cluster;

/// The namespaces and the Helm release the install commands use.
const NAMESPACES: [&str; 2] = ["statefulset-scaledown-controller", "my-apps"];
const RELEASE: &str = "scaledown";
/// A digest in the place of the docs' `sha256:...` (any well-formed one: nothing is pulled).
const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
const COMMAND_TIMEOUT: Duration = Duration::from_secs(150);

/// Commands that cannot run here, by their start, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "make image-push",
        "pushes to a remote registry (none is reachable here; tests/e2e_incluster.rs pushes the image to the real node's registry)",
    ),
    (
        "make image",
        "builds the image: `make e2e` runs it first, tests/e2e_image.rs checks it",
    ),
    ("make docker-image", "needs a container engine"),
    ("crane auth", "logs in to a remote registry"),
    (
        "skopeo ",
        "converts the image for kind or minikube (not installed by the project)",
    ),
    ("kind ", "needs a kind cluster"),
    ("minikube ", "needs a minikube cluster"),
    ("oc ", "needs OpenShift"),
    (
        "make krew",
        "the static release build of the plugin; tests/e2e_krew.rs packs and installs it with krew",
    ),
    (
        "kubectl krew",
        "tests/e2e_krew.rs installs the plugin with krew",
    ),
    (
        "make plugin",
        "the release build of the plugin; tests/e2e_plugin.rs runs it",
    ),
    (
        "install target/release/kubectl-scaledown",
        "the release build of the plugin; tests/e2e_plugin.rs runs it",
    ),
];

/// Commands that run here, by their start.
const RUN: &[&str] = &["kubectl ", "helm ", "sed "];

/// The text of `## heading` up to the next `## ` heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let line = format!("## {heading}\n");
    let start = if text.starts_with(&line) {
        0
    } else {
        1 + text
            .find(&format!("\n{line}"))
            .unwrap_or_else(|| panic!("no `## {heading}`"))
    };
    let rest = &text[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The commands of each fenced `sh` block: continuation lines joined, comment lines dropped.
fn sh_blocks(text: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    let mut pending = String::new();
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(commands), line) => {
                let line = line.trim_start();
                if pending.is_empty() && (line.is_empty() || line.starts_with('#')) {
                    continue;
                }
                match line.strip_suffix('\\') {
                    Some(head) => pending.push_str(head),
                    None => {
                        pending.push_str(line);
                        commands.push(std::mem::take(&mut pending));
                    }
                }
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Why `command` cannot run here, if it cannot; panics if no rule covers it.
fn not_run_reason(command: &str) -> Option<&'static str> {
    if let Some((_, why)) = NOT_RUN.iter().find(|(start, _)| command.starts_with(start)) {
        return Some(why);
    }
    assert!(
        RUN.iter().any(|start| command.starts_with(start)),
        "an install command tests/e2e_docs.rs has no rule for (add it to RUN or NOT_RUN): {command}"
    );
    None
}

fn page_blocks(page: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(support::repo_dir().join(page))
        .unwrap_or_else(|e| panic!("read {page}: {e}"));
    sh_blocks(section(&text, "Install"))
}

/// Runs one command as a user's shell would, from the repository's root, with the cluster's
/// kubectl and helm first on PATH.
fn run(cluster: &Cluster, command: &str) -> std::process::Output {
    let bin = support::cluster_state_dir().join("bin");
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    std::process::Command::new("timeout")
        .arg(COMMAND_TIMEOUT.as_secs().to_string())
        .args(["bash", "-euo", "pipefail", "-c"])
        .arg(command.replace("sha256:...", DIGEST))
        .current_dir(support::repo_dir())
        .env("PATH", path)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run {command}: {e}"))
}

/// Removes what the install commands create: the Helm releases, the namespaces (and all in
/// them), the cluster-scoped RBAC objects of the manifests and of the chart.
fn remove_installs(cluster: &Cluster) {
    for ns in NAMESPACES {
        run(
            cluster,
            &format!("helm uninstall {RELEASE} -n {ns} --wait --ignore-not-found >/dev/null"),
        );
    }
    let out = run(
        cluster,
        &format!(
            "kubectl delete clusterrole,clusterrolebinding -l app.kubernetes.io/name=statefulset-scaledown-controller --ignore-not-found \
             && kubectl delete namespace {} --ignore-not-found --wait --timeout=120s",
            NAMESPACES.join(" ")
        ),
    );
    assert!(out.status.success(), "cleanup: {}", text(&out));
}

/// The Deployments of the controller installed so far, as `namespace/name=available replicas`,
/// once each is Available (a block need not end with `rollout status`).
fn installed(cluster: &Cluster) -> Vec<String> {
    let out = run(
        cluster,
        "kubectl wait deployments -A -l app.kubernetes.io/name=statefulset-scaledown-controller \
         --for=condition=Available --timeout=90s",
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = run(
        cluster,
        "kubectl get deployments -A -l app.kubernetes.io/name=statefulset-scaledown-controller \
         -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}={.status.availableReplicas}{\"\\n\"}{end}'",
    );
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_install_commands_of_the_readme_and_operations_run_as_written() {
    let cluster = Cluster::connect().await;
    assert!(
        Path::new(&support::cluster_state_dir().join("bin/helm")).exists(),
        "no target/cluster/bin/helm: `hack/cluster.sh up` links it unless SCALEDOWN_HELM=0"
    );
    remove_installs(&cluster);
    let mut ran = 0;
    let mut not_run = Vec::new();
    for page in ["README.md", "docs/operations.md"] {
        let blocks = page_blocks(page);
        assert!(
            blocks.len() >= 4,
            "{page}: only {} sh blocks found",
            blocks.len()
        );
        let mut ran_here = 0;
        for block in blocks {
            let reasons: Vec<&str> = block.iter().filter_map(|c| not_run_reason(c)).collect();
            if let Some(why) = reasons.first() {
                not_run.push(format!("{page}: {} ({why})", block.join(" && ")));
                continue;
            }
            let started = Instant::now();
            for command in &block {
                let out = run(&cluster, command);
                assert!(
                    out.status.success(),
                    "{page}: `{command}` failed: {}",
                    text(&out)
                );
            }
            let deployments = installed(&cluster);
            assert!(
                !deployments.is_empty()
                    && deployments.iter().all(|d| {
                        // 3 in the middle of a rolling update (a re-applied manifest).
                        d.rsplit('=').next().and_then(|n| n.parse::<u32>().ok()) >= Some(2)
                    }),
                "{page}: after {block:?}, the controller's Deployments (each with 2 available replicas): {deployments:?}"
            );
            eprintln!(
                "e2e_docs: {page}: ran {} command(s) in {} ms; installed {deployments:?}",
                block.len(),
                started.elapsed().as_millis()
            );
            ran_here += 1;
        }
        remove_installs(&cluster);
        assert!(ran_here >= 3, "{page}: only {ran_here} install blocks ran");
        ran += ran_here;
    }
    eprintln!("e2e_docs: {ran} blocks ran; not run here:");
    for line in &not_run {
        eprintln!("  {line}");
    }
}

#[test]
fn blocks_are_read_as_a_shell_would() {
    let text = "## Install\n```sh\n# a comment\nhelm install a \\\n  b  # trailing\n\nkubectl get x\n```\n\
                ```yaml\nnot: sh\n```\n## Next\n```sh\nkubectl nope\n```\n";
    let blocks = sh_blocks(section(text, "Install"));
    assert_eq!(blocks, [["helm install a b  # trailing", "kubectl get x"]]);
    assert_eq!(
        not_run_reason("make image"),
        NOT_RUN.iter().find(|r| r.0 == "make image").map(|r| r.1)
    );
    assert!(not_run_reason("make image-push IMAGE=x").is_some_and(|w| w.contains("registry")));
    assert!(not_run_reason("sed s/a/b/ f | kubectl apply -f -").is_none());
}

#[test]
#[should_panic(expected = "has no rule for")]
fn an_unknown_install_command_fails() {
    not_run_reason("curl -L https://example.com/install.sh | sh");
}
