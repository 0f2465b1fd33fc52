//! The OCI image of `make image` (target/image/oci, hack/image.sh): its layout, config and labels,
//! the Dockerfile describing the same layout, the SBOM beside it, and the image itself run on the
//! local control plane. `make e2e` builds the image first.
//!
//! Running it: the image is unpacked into an OCI runtime bundle with umoci and run with runc (both
//! pinned, from hack/build-tools.sh) as a kubelet would run it in a pod: its own root file system,
//! read-only, as user 65532 with no capabilities, with in-cluster configuration (the API server's
//! address in KUBERNETES_SERVICE_HOST/PORT and a ServiceAccount token, CA and namespace mounted at
//! /var/run/secrets/kubernetes.io/serviceaccount), `--localOnly`. It shares the host's network
//! namespace, because the control plane listens on 127.0.0.1. runc needs root here; without root,
//! the test runs the image's unpacked binary directly with a token kubeconfig instead, and says so.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::Kubeconfig;
use serde_json::{Value, json};
use support::deploy::*;
use support::fixtures::Controller;
use support::{Cluster, repo_dir};

const BINARY: &str = "/statefulset-scaledown-controller";

fn image_dir() -> PathBuf {
    repo_dir().join("target/image")
}

fn tag() -> String {
    support::makefile_image()
        .rsplit_once(':')
        .map(|(_, t)| t.to_string())
        .expect("IMAGE has a tag")
}

fn blob(digest: &str) -> PathBuf {
    let (algo, hex) = digest.split_once(':').expect("digest");
    image_dir().join("oci/blobs").join(algo).join(hex)
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}): build the image first with `make image` (make e2e does)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("JSON")
}

/// The manifest of IMAGE's tag in the layout.
fn manifest() -> (String, Value) {
    let index = read_json(&image_dir().join("oci/index.json"));
    let tag = tag();
    let digest = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag.as_str())
        .and_then(|m| m["digest"].as_str())
        .unwrap_or_else(|| panic!("no tag {tag} in target/image/oci/index.json: {index}"))
        .to_string();
    let manifest = read_json(&blob(&digest));
    (digest, manifest)
}

fn cargo_repository() -> String {
    let cargo = std::fs::read_to_string(repo_dir().join("Cargo.toml")).expect("Cargo.toml");
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .map(|s| s.trim_matches('"').to_string())
        .expect("repository in Cargo.toml")
}

fn tool(name: &str) -> PathBuf {
    let out = std::process::Command::new(repo_dir().join("hack/build-tools.sh"))
        .arg(name)
        .output()
        .expect("hack/build-tools.sh");
    assert!(
        out.status.success(),
        "hack/build-tools.sh {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(path.lines().last().expect("a path").trim())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        .unwrap_or(false)
}

/// Layout, config, labels, the single layer's files (no shell), the Dockerfile's final stage and
/// the SBOM.
#[test]
fn image_has_the_documented_layout_labels_and_sbom() {
    let (digest, manifest) = manifest();
    assert!(digest.starts_with("sha256:"));
    let recorded =
        std::fs::read_to_string(image_dir().join("digest")).expect("target/image/digest");
    assert_eq!(recorded.trim(), digest);
    let config = read_json(&blob(
        manifest["config"]["digest"].as_str().expect("config"),
    ));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], json!([BINARY]));
    let ports: BTreeSet<&String> = config["config"]["ExposedPorts"]
        .as_object()
        .expect("ports")
        .keys()
        .collect();
    assert_eq!(
        ports.into_iter().cloned().collect::<Vec<_>>(),
        ["8080/tcp", "8081/tcp"]
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.source"],
        cargo_repository().as_str()
    );
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .expect("revision");
    assert!(revision.len() >= 40, "revision {revision}");
    assert_eq!(
        manifest["annotations"], *labels,
        "manifest annotations = config labels"
    );
    assert_eq!(
        labels["org.opencontainers.image.created"],
        config["created"]
    );

    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer");
    let list = std::process::Command::new("tar")
        .arg("-tzf")
        .arg(blob(layers[0]["digest"].as_str().expect("layer")))
        .output()
        .expect("tar");
    let files: BTreeSet<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| l.trim_start_matches('/').trim_end_matches('/').to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let expected: BTreeSet<String> = [
        "etc",
        "etc/group",
        "etc/passwd",
        "statefulset-scaledown-controller",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        files, expected,
        "the image holds the binary and /etc/passwd, /etc/group only (no shell)"
    );

    // The Dockerfile's final stage: the same files, user, entrypoint and ports.
    let dockerfile = std::fs::read_to_string(repo_dir().join("Dockerfile")).expect("Dockerfile");
    let last = dockerfile.rsplit("\nFROM ").next().expect("a final stage");
    assert!(
        last.starts_with("scratch"),
        "the final stage is FROM scratch"
    );
    let copied: BTreeSet<String> = last
        .lines()
        .filter(|l| l.starts_with("COPY "))
        .filter_map(|l| l.split_whitespace().last())
        .map(|d| d.trim_start_matches('/').to_string())
        .collect();
    let expected_files: BTreeSet<String> =
        expected.iter().filter(|f| *f != "etc").cloned().collect();
    assert_eq!(copied, expected_files, "Dockerfile COPY destinations");
    assert!(last.lines().any(|l| l.trim() == "USER 65532:65532"));
    assert!(
        last.lines()
            .any(|l| l.trim() == format!("ENTRYPOINT [\"{BINARY}\"]"))
    );
    assert!(last.lines().any(|l| l.trim() == "EXPOSE 8080/tcp 8081/tcp"));
    assert!(last.contains(&format!(
        "org.opencontainers.image.version=\"{}\"",
        env!("CARGO_PKG_VERSION")
    )));
    assert!(last.contains(&format!(
        "org.opencontainers.image.source=\"{}\"",
        cargo_repository()
    )));
    assert!(
        dockerfile.contains("hack/build-static.sh"),
        "both build the binary with hack/build-static.sh"
    );

    // SBOM: CycloneDX, the crate and its locked dependencies, no path of the build machine.
    let sbom_path = image_dir().join("statefulset-scaledown-controller.cdx.json");
    let text = std::fs::read_to_string(&sbom_path).expect("SBOM beside the image");
    assert!(
        !text.contains(repo_dir().to_string_lossy().as_ref()),
        "the SBOM names the checkout's path"
    );
    let sbom: Value = serde_json::from_str(&text).expect("SBOM is JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(
        sbom["metadata"]["component"]["version"],
        env!("CARGO_PKG_VERSION")
    );
    let lock = std::fs::read_to_string(repo_dir().join("Cargo.lock")).expect("Cargo.lock");
    let kube_version = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"kube\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .expect("kube in Cargo.lock");
    let components = sbom["components"].as_array().expect("components");
    assert!(
        components
            .iter()
            .any(|c| c["name"] == "kube" && c["version"] == kube_version.as_str()),
        "kube {kube_version} missing from the SBOM"
    );
    assert!(components.len() > 100, "{} components", components.len());
}

/// The Dockerfile's build stage, run without a container engine: its `COPY` instructions copy
/// their sources into a build context outside the checkout (so that no `.cargo/config.toml` of a
/// parent directory is found, as none is in the image's `/src`), and its `RUN` lines run there.
/// The binary it builds carries the allocator tuning of `.cargo/config.toml`, as the binary of
/// `make image` does (jemalloc reports its build-time `malloc_conf`). The first run is a full
/// release build (several minutes); later ones reuse the context's target directory.
#[test]
fn dockerfile_build_stage_builds_with_the_allocator_tuning() {
    let cargo_env = cargo_config_env();
    let wanted = cargo_env
        .iter()
        .find(|(k, _)| k == "JEMALLOC_SYS_WITH_MALLOC_CONF")
        .map(|(_, v)| v.clone())
        .expect("JEMALLOC_SYS_WITH_MALLOC_CONF in .cargo/config.toml");
    let binary = image_dir()
        .join("rootfs")
        .join(BINARY.trim_start_matches('/'));
    if binary.exists() {
        assert_eq!(malloc_conf(&binary), wanted, "make image's binary");
    }
    let dockerfile = std::fs::read_to_string(repo_dir().join("Dockerfile")).expect("Dockerfile");
    let stage = dockerfile
        .split("\nFROM ")
        .nth(1)
        .expect("a build stage after the first FROM");
    let context = std::env::temp_dir().join(format!(
        "statefulset-scaledown-dockerfile-{}",
        repo_dir().to_string_lossy().replace('/', "_")
    ));
    let src = context.join("src");
    // A fresh copy of the sources; the target directory is kept between runs.
    for entry in std::fs::read_dir(&src).into_iter().flatten().flatten() {
        if entry.file_name() != "target" {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
    std::fs::create_dir_all(&src).expect("context");
    for line in stage.lines().filter(|l| l.starts_with("COPY ")) {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        let (dest, sources) = words.split_last().expect("COPY SRC... DEST");
        if dest.ends_with('/') {
            std::fs::create_dir_all(src.join(dest)).expect("COPY's destination directory");
        }
        let status = std::process::Command::new("cp")
            .arg("-r")
            .args(sources.iter().map(|s| repo_dir().join(s)))
            .arg(src.join(dest))
            .status()
            .expect("cp");
        assert!(status.success(), "{line}");
    }
    let out = context.join("out");
    std::fs::create_dir_all(&out).expect("out");
    for run in stage.lines().filter_map(|l| l.strip_prefix("RUN ")) {
        let run = run.replace(BINARY, &out.join("binary").to_string_lossy());
        let mut command = std::process::Command::new("bash");
        command
            .args(["-euc", &run])
            .current_dir(&src)
            .env("GIT_COMMIT", "unknown")
            .env_remove("CARGO_TARGET_DIR");
        // `cargo test` passes the [env] of .cargo/config.toml to this test: not to the build.
        for (key, _) in &cargo_env {
            command.env_remove(key);
        }
        let status = command.status().expect("bash");
        assert!(status.success(), "RUN {run}");
    }
    assert_eq!(
        malloc_conf(&out.join("binary")),
        wanted,
        "the Dockerfile's binary lacks the allocator tuning of .cargo/config.toml"
    );
}

/// The `[env]` table of `.cargo/config.toml`: (key, value) of its `KEY = "value"` lines.
fn cargo_config_env() -> Vec<(String, String)> {
    let config = std::fs::read_to_string(repo_dir().join(".cargo/config.toml")).expect("config");
    let table = config.split("\n[env]\n").nth(1).expect("an [env] table");
    table
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// The `malloc_conf` jemalloc was built with, as the running binary reports it at exit.
fn malloc_conf(binary: &Path) -> String {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("run the binary");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("config.malloc_conf: "))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no config.malloc_conf in jemalloc's stats:\n{text}"))
}

/// Writes the in-cluster ServiceAccount files (token, ca.crt, namespace) into `dir`; returns the
/// API server's host and port.
async fn service_account_files(cluster: &Cluster, namespace: &str, dir: &Path) -> (String, u16) {
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            namespace,
            "--duration=1h",
        ])
        .await;
    let admin = Kubeconfig::read_from(&cluster.kubeconfig).expect("admin kubeconfig");
    let entry = admin.clusters[0].cluster.as_ref().expect("cluster");
    let server = entry.server.as_deref().expect("server");
    let ca = entry
        .certificate_authority
        .as_ref()
        .map(|p| std::fs::read(p).expect("CA file"))
        .expect("a CA file in the admin kubeconfig");
    std::fs::create_dir_all(dir).expect("sa dir");
    std::fs::write(dir.join("token"), token.trim()).expect("token");
    std::fs::write(dir.join("ca.crt"), ca).expect("ca");
    std::fs::write(dir.join("namespace"), namespace).expect("namespace");
    let hostport = server.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = hostport.rsplit_once(':').expect("host:port");
    (host.to_string(), port.parse().expect("port"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// GET http://127.0.0.1:port/path; returns (head, body).
fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

/// Kills and deletes the runc container when dropped.
struct RuncContainer {
    runc: PathBuf,
    state: PathBuf,
    id: String,
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        for args in [
            vec!["kill", &self.id, "KILL"],
            vec!["delete", "--force", &self.id],
        ] {
            let _ = std::process::Command::new(&self.runc)
                .arg("--root")
                .arg(&self.state)
                .args(args)
                .output();
        }
    }
}

/// The image, unpacked and run with runc as a pod would run it, manages a scale-down, a retried
/// cleanup and a deletion with the per-namespace manifest's RBAC; it runs as uid 65532, prints its
/// version and the image's revision, and serves OpenMetrics with process metrics.
#[tokio::test(flavor = "multi_thread")]
async fn image_runs_on_the_control_plane() {
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let ns = cluster.namespace("image-run").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: ns.name.clone(),
    };
    kubectl_ok(
        &kc,
        &[
            "apply",
            "-n",
            &ns.name,
            "-f",
            &manifest_str("per-namespace.yaml"),
        ],
    )
    .await;

    let work = repo_dir().join("target/e2e-image").join(&ns.name);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let bundle = work.join("bundle");
    let mut unpack = std::process::Command::new(tool("umoci"));
    unpack.arg("unpack");
    if !is_root() {
        unpack.arg("--rootless");
    }
    let status = unpack
        .arg("--image")
        .arg(format!("{}:{}", image_dir().join("oci").display(), tag()))
        .arg(&bundle)
        .status()
        .expect("umoci unpack");
    assert!(status.success(), "umoci unpack failed");
    let binary = bundle.join("rootfs").join(BINARY.trim_start_matches('/'));

    // --version: the crate's version and the commit of the image's revision label.
    let (_, manifest) = manifest();
    let config = read_json(&blob(
        manifest["config"]["digest"].as_str().expect("config"),
    ));
    let revision = config["config"]["Labels"]["org.opencontainers.image.revision"]
        .as_str()
        .expect("revision")
        .to_string();
    let version = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .expect("--version");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert_eq!(
        version.trim(),
        format!(
            "statefulset-scaledown-controller {} (commit {revision})",
            env!("CARGO_PKG_VERSION")
        )
    );

    let identity = format!("e2e-{}", ns.name);
    let (metrics_port, health_port) = (free_port(), free_port());
    let args = vec![
        BINARY.to_string(),
        "--localOnly".into(),
        "--leader-elect".into(),
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
        "--resync-period=10s".into(),
        "--cleanup-backoff=1s".into(),
        "--cleanup-attempts=2".into(),
    ];
    let (controller, _container) = if is_root() {
        let sa = work.join("serviceaccount");
        let (host, port) = service_account_files(&cluster, &ns.name, &sa).await;
        let config_path = bundle.join("config.json");
        let mut config = read_json(&config_path);
        config["process"]["terminal"] = json!(false);
        config["process"]["args"] = json!(args);
        let env = config["process"]["env"].as_array_mut().expect("env");
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", host),
            ("KUBERNETES_SERVICE_PORT", port.to_string()),
            ("POD_NAME", identity.clone()),
            ("POD_NAMESPACE", ns.name.clone()),
            ("NO_COLOR", "1".into()),
        ] {
            env.push(json!(format!("{k}={v}")));
        }
        config["root"]["readonly"] = json!(true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            config["process"]["capabilities"][set] = json!([]);
        }
        config["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({
                "destination": "/var/run/secrets/kubernetes.io/serviceaccount",
                "type": "bind", "source": sa, "options": ["rbind", "ro"]
            }));
        let namespaces = config["linux"]["namespaces"]
            .as_array_mut()
            .expect("namespaces");
        namespaces.retain(|n| n["type"] != "network");
        std::fs::write(&config_path, config.to_string()).expect("write config.json");
        let runc = tool("runc");
        let state = work.join("runc");
        let id = ns.name.clone();
        let mut command = tokio::process::Command::new(&runc);
        command
            .arg("--root")
            .arg(&state)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id);
        let controller = Controller::spawn_command(command, &format!("{}-runc", ns.name));
        (controller, Some(RuncContainer { runc, state, id }))
    } else {
        eprintln!(
            "e2e_image: not root, so runc cannot run the image here; running its unpacked binary directly"
        );
        let token = token_kubeconfig(&cluster, &ns.name).await;
        let mut command = tokio::process::Command::new(&binary);
        command
            .args(&args[1..])
            .arg("--kubeconfig")
            .arg(&token)
            .env("POD_NAME", &identity)
            .env("POD_NAMESPACE", &ns.name);
        (
            Controller::spawn_command(command, &format!("{}-binary", ns.name)),
            None,
        )
    };

    let mut controller = controller;
    rbac_scenarios(&ns, &identity, &controller).await;
    controller.assert_alive();
    assert_lease_held(&cluster, &ns.name, &identity).await;

    // The process serving the metrics port runs as uid 65532 (runc) and serves OpenMetrics.
    let (head, body) = http_get(metrics_port, "/metrics").expect("GET /metrics");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .expect("a Content-Type");
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    for line in ["scaledown_leader 1", "scaledown_cleanups_succeeded_total "] {
        assert!(
            body.lines().any(|l| l.starts_with(line)),
            "no `{line}` in /metrics:\n{body}"
        );
    }
    let rss: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("process_resident_memory_bytes");
    assert!(rss > 1e6, "RSS {rss}");
    support::fixtures::record(
        "image controller RSS after the scenario (MiB)",
        format!("{:.1}", rss / 1048576.0),
    );
    let (ready, _) = http_get(health_port, "/readyz").expect("GET /readyz");
    assert!(
        ready.starts_with("HTTP/1.0 200") || ready.starts_with("HTTP/1.1 200"),
        "{ready}"
    );
    if is_root() {
        let uid = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| {
                std::fs::read_to_string(e.path().join("cmdline"))
                    .ok()
                    .map(|c| (e.path(), c))
            })
            .find(|(_, c)| {
                c.starts_with(BINARY) && c.contains(&format!("127.0.0.1:{metrics_port}"))
            })
            .and_then(|(p, _)| std::fs::read_to_string(p.join("status")).ok())
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .map(|u| u.split_whitespace().next().unwrap_or("").to_string())
            });
        assert_eq!(
            uid.as_deref(),
            Some("65532"),
            "the container's process runs as 65532"
        );
    }
}
