//! The plugin as a user of Krew gets it: `hack/krew.sh` (what `make krew` runs) packs the archive
//! and writes the plugin manifest, krew (built from its Go module, `hack/build-tools.sh krew`)
//! installs it from the local archive into a KREW_ROOT of the test's own, and `kubectl scaledown`
//! — found by kubectl in KREW_ROOT/bin — reads the local cluster through a KUBECONFIG list.
//!
//! The archive holds the debug build the tests already have, not `make krew`'s static release
//! build (a fat-LTO link that `make test` does not need): packing, manifest and install are the
//! same. No network: krew installs from `--archive`, and KREW_NO_UPGRADE_CHECK (and the unstamped
//! build) keep it from asking GitHub for a newer krew.

mod support;

use support::output_text as text;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::json;
use support::fixtures::*;
use support::{Cluster, OUTCOME_LABEL};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-scaledown");

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = support::repo_dir()
            .join("target")
            .join("e2e-krew")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a script of hack/ and returns the lines of its stdout; panics unless it succeeds.
fn hack(script: &str, args: &[&str]) -> Vec<String> {
    let out = std::process::Command::new(support::repo_dir().join("hack").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run hack/{script}: {e}"));
    assert!(
        out.status.success(),
        "hack/{script} {args:?}: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A user's shell with Krew set up: KREW_ROOT, `kubectl-krew` and KREW_ROOT/bin on PATH (first),
/// then kubectl's directory; KUBECONFIG as given.
struct Shell {
    krew_root: PathBuf,
    path: std::ffi::OsString,
    kubeconfig: std::ffi::OsString,
}

impl Shell {
    fn new(dir: &Path, krew: &Path, kubeconfig: std::ffi::OsString) -> Shell {
        let krew_root = dir.join("krew-root");
        let tools = dir.join("tools");
        std::fs::create_dir_all(&tools).expect("tools dir");
        std::os::unix::fs::symlink(krew, tools.join("kubectl-krew")).expect("link kubectl-krew");
        let kubectl = support::kubectl_binary();
        let mut dirs = vec![krew_root.join("bin"), tools];
        dirs.extend(kubectl.parent().map(Path::to_path_buf));
        dirs.extend(["/usr/bin", "/bin"].map(PathBuf::from));
        Shell {
            krew_root,
            path: std::env::join_paths(dirs).expect("PATH"),
            kubeconfig,
        }
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        std::process::Command::new(support::kubectl_binary())
            .env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.krew_root.parent().expect("dir"))
            .env("KREW_ROOT", &self.krew_root)
            .env("KREW_NO_UPGRADE_CHECK", "1")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run kubectl {args:?}: {e}"))
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A second kubeconfig whose only context points nowhere; listed after the cluster's, it must
/// not win (kubectl's rule: the first file to set a value wins).
fn decoy_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("decoy-kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: decoy\nclusters:\n- name: decoy\n  cluster: {server: \"https://127.0.0.1:1\"}\n\
         users:\n- name: decoy\n  user: {token: x}\ncontexts:\n- name: decoy\n  context: {cluster: decoy, user: decoy}\n",
    )
    .expect("write decoy kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn krew_installs_the_archive_and_kubectl_scaledown_reads_the_cluster() {
    let env = Env::new("krew-status", 3, &[]).await;
    let mut spec = SetSpec::new("web", 2, &env.class);
    spec.template = Some(template(json!({OUTCOME_LABEL: "Running"}), json!({}), ""));
    env.create_running(&spec).await;
    env.scale("web", 1).await;
    env.wait_cleanup_pod("web-1").await;

    let dir = TempDir::new("install");
    let krew = hack("build-tools.sh", &["krew"]).pop().expect("krew path");
    let out_dir = dir.0.join("release");
    let made = hack(
        "krew.sh",
        &["--bin", PLUGIN, "--out", out_dir.to_str().expect("utf-8")],
    );
    let [archive, manifest] = [&made[0], &made[1]];
    assert!(
        archive.ends_with(".tar.gz") && manifest.ends_with("scaledown.yaml"),
        "{made:?}"
    );

    let cluster_kubeconfig = env.cluster.kubeconfig.clone();
    let list = std::env::join_paths([
        dir.0.join("missing-kubeconfig"),
        cluster_kubeconfig.clone(),
        decoy_kubeconfig(&dir.0),
    ])
    .expect("KUBECONFIG list");
    let shell = Shell::new(&dir.0, Path::new(&krew), list);
    let manifest_arg = format!("--manifest={manifest}");
    let archive_arg = format!("--archive={archive}");
    shell.kubectl_ok(&["krew", "install", &manifest_arg, &archive_arg]);
    let installed = shell.krew_root.join("bin").join("kubectl-scaledown");
    assert!(installed.exists(), "krew linked {}", installed.display());
    // Krew's receipt of the install and the version it unpacked (`krew list` would want the
    // index, a git clone from GitHub).
    let receipt = std::fs::read_to_string(shell.krew_root.join("receipts/scaledown.yaml"))
        .expect("krew's receipt");
    assert!(receipt.contains("name: scaledown"), "{receipt}");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    let target = std::fs::canonicalize(&installed).expect("the link's target");
    assert_eq!(
        target,
        std::fs::canonicalize(
            shell
                .krew_root
                .join("store/scaledown")
                .join(&version)
                .join("kubectl-scaledown")
        )
        .expect("the unpacked binary"),
    );
    // kubectl finds the plugin krew installed (and no other).
    let plugins = shell.kubectl_ok(&["plugin", "list", "--name-only"]);
    assert!(
        plugins.lines().any(|l| l.trim() == "kubectl-scaledown"),
        "{plugins}"
    );

    let ns = env.ns.name.as_str();
    let table = shell.kubectl_ok(&["scaledown", "status", "-n", ns, "--no-headers"]);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 1, "one set, no header line:\n{table}");
    assert_eq!(
        lines[0][..6],
        [
            ns,
            "web",
            "CleaningUp",
            "0",
            "data-web-1",
            "web-1:Running#1"
        ],
        "{table}"
    );
    let yaml = shell.kubectl_ok(&["scaledown", "status", "-n", ns, "-o", "yaml"]);
    let sets: serde_json::Value = serde_yaml_ng::from_str(&yaml).expect("YAML");
    assert_eq!(sets[0]["name"], "web", "{yaml}");
    assert_eq!(sets[0]["cleanups"][0]["pod"], "web-1", "{yaml}");
    assert_eq!(sets[0]["orphaned_claims"], json!(["data-web-1"]), "{yaml}");
}

#[tokio::test(flavor = "multi_thread")]
async fn krew_refuses_an_archive_that_is_not_the_manifests() {
    let cluster = Cluster::connect().await;
    let dir = TempDir::new("tampered");
    let krew = hack("build-tools.sh", &["krew"]).pop().expect("krew path");
    let made = hack(
        "krew.sh",
        &[
            "--bin",
            PLUGIN,
            "--out",
            dir.0.join("release").to_str().expect("utf-8"),
        ],
    );
    // Another archive (the LICENSE alone) under the manifest's sha256.
    let other = dir.0.join("other.tar.gz");
    let status = std::process::Command::new("tar")
        .args(["-czf", other.to_str().expect("utf-8"), "-C"])
        .arg(support::repo_dir())
        .arg("LICENSE")
        .status()
        .expect("tar");
    assert!(status.success());
    let shell = Shell::new(&dir.0, Path::new(&krew), cluster.kubeconfig.clone().into());
    let out = shell.kubectl(&[
        "krew",
        "install",
        &format!("--manifest={}", made[1]),
        &format!("--archive={}", other.display()),
    ]);
    assert!(
        !out.status.success(),
        "installed a foreign archive: {}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checksum does not match"),
        "{}",
        text(&out)
    );
    assert!(
        !shell
            .krew_root
            .join("bin")
            .join("kubectl-scaledown")
            .exists()
    );
}
