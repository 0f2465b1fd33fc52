//! The release as a user gets it (issue 26, item 1): `hack/release.sh` (what `make release` runs
//! after `make image`) publishes the image, its SBOM as a signed CycloneDX attestation, the
//! signatures and the digest-pinned chart to the registry the real node pulls from; cosign checks
//! them with the release's public key (and refuses another key, a tag whose image was changed and
//! its attestation); `helm install oci://…` installs the chart by its version, the controller pod
//! runs the pinned image on the real node and cleans a scale-down there.
//!
//! Every registry client (crane, cosign, helm) runs in the real node's network namespace
//! (`hack/real-node.sh exec`), where the registry is 127.0.0.1:5000 and nothing outside the
//! machine has a route: whatever a tool might try beyond the registry cannot leave. The
//! signatures are the key pair's (no transparency log); keyless signing and the two
//! architectures only run in the release workflow (.github/workflows/release.yml, linted by `make
//! lint`; docs/operations.md#releases).
//!
//! `make image` first (`make e2e` does), then
//! `hack/with-cluster.sh cargo test --locked --test e2e_release -- --nocapture`.

mod support;

use support::output_text as text;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::deploy::{FINALIZER, OWNER, scale};
use support::fixtures::record;
use support::recorder::{self, Recorder};
use support::repo_dir;
use support::{
    Cluster, REAL_NODE, TestNamespace, from_json, real_node_ready, real_node_selector,
    real_node_skipped, real_node_toleration, wait_for, wait_for_gone,
};

const NAME: &str = "statefulset-scaledown-controller";
/// The node's registry as seen from its network namespace. Each run publishes under a path of its
/// own (its namespace's name): signatures of earlier runs are not counted.
const NODE_REGISTRY: &str = "127.0.0.1:5000";
/// The Helm release, in the test's namespace (scope `namespace`: it acts on that namespace only,
/// beside the other tests' controllers).
const HELM_RELEASE: &str = "rel";
const SET: &str = "web";
const SLOW: Duration = Duration::from_secs(180);

/// Runs `args` in the real node's network namespace with `env` added.
fn in_node(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(repo_dir().join("hack/real-node.sh"))
        .arg("exec")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run hack/real-node.sh exec {args:?}: {e}"))
}

fn in_node_ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = in_node(args, env);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The path of a tool of hack/build-tools.sh.
fn tool(name: &str) -> String {
    let out = Command::new(repo_dir().join("hack/build-tools.sh"))
        .arg(name)
        .output()
        .expect("run hack/build-tools.sh");
    assert!(
        out.status.success(),
        "hack/build-tools.sh {name}: {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().expect("a path").to_string()
}

/// What hack/release.sh printed (its target/dist/release.env).
struct Release {
    fields: BTreeMap<String, String>,
}

impl Release {
    fn get(&self, key: &str) -> &str {
        self.fields
            .get(key)
            .unwrap_or_else(|| panic!("hack/release.sh printed no {key}: {:?}", self.fields))
    }

    /// The image by digest: what is signed and what the chart pins.
    fn image(&self) -> String {
        format!(
            "{}/{NAME}@{}",
            self.get("REGISTRY"),
            self.get("IMAGE_DIGEST")
        )
    }
}

/// `make release`'s script, to `registry` on the node's registry.
fn release(registry: &str) -> Release {
    let image = repo_dir().join("target/image/oci/index.json");
    assert!(
        image.exists(),
        "no {}: run `make image` first",
        image.display()
    );
    let started = Instant::now();
    let release = repo_dir().join("hack/release.sh");
    let stdout = in_node_ok(
        &[release.to_str().expect("utf-8")],
        &[("REGISTRY", registry), ("RELEASE_PLAIN_HTTP", "1")],
    );
    let ms = started.elapsed().as_millis();
    eprintln!("e2e_release: hack/release.sh took {ms} ms");
    record(
        "release: hack/release.sh to the node's registry",
        format!("{ms} ms"),
    );
    let mut fields: BTreeMap<String, String> = stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    fields.insert("REGISTRY".into(), registry.into());
    Release { fields }
}

/// cosign against the node's plain-HTTP registry.
fn cosign(args: &[&str]) -> Output {
    let cosign = tool("cosign");
    let mut all = vec![cosign.as_str()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--allow-http-registry", "--allow-insecure-registry"]);
    in_node(&all, &[])
}

/// The trusted root without any authority that hack/release.sh wrote (key pairs only; cosign
/// asks for no public one).
fn trusted_root() -> String {
    let path = repo_dir().join("target/signing/trusted-root.json");
    assert!(path.exists(), "hack/release.sh wrote no {}", path.display());
    path.to_str().expect("utf-8").to_string()
}

/// `cosign verify --key` of a key-pair signature (no transparency log): the verified payloads.
fn verify(public_key: &str, reference: &str) -> Output {
    let root = trusted_root();
    cosign(&[
        "verify",
        "--key",
        public_key,
        "--insecure-ignore-tlog=true",
        "--trusted-root",
        &root,
        "--output",
        "json",
        reference,
    ])
}

fn verify_sbom(public_key: &str, reference: &str) -> Output {
    let root = trusted_root();
    cosign(&[
        "verify-attestation",
        "--key",
        public_key,
        "--insecure-ignore-tlog=true",
        "--trusted-root",
        &root,
        "--type",
        "cyclonedx",
        "--output",
        "json",
        reference,
    ])
}

/// cosign's signature of an image (a Sigstore bundle); `cosign verify` also lists the other bundles
/// it verified, such as the SBOM attestation.
const SIGNATURE: &str = "https://sigstore.dev/cosign/sign/v1";

/// The image's signature verifies with the release's key, names the image's digest and carries
/// the version annotation hack/release.sh signs.
fn assert_image_signed(release: &Release) {
    let out = verify(release.get("COSIGN_PUB"), &release.image());
    assert!(
        out.status.success(),
        "cosign verify of the image: {}",
        text(&out)
    );
    let payloads: Vec<Value> = serde_json::from_slice(&out.stdout).expect("cosign verify's JSON");
    for p in &payloads {
        assert_eq!(
            p["critical"]["image"]["docker-manifest-digest"],
            release.get("IMAGE_DIGEST"),
            "{p}"
        );
    }
    let signatures: Vec<&Value> = payloads
        .iter()
        .filter(|p| p["critical"]["type"] == SIGNATURE)
        .collect();
    assert_eq!(
        signatures.len(),
        1,
        "one signature of the image: {payloads:?}"
    );
    assert_eq!(
        signatures[0]["optional"]["org.opencontainers.image.version"],
        release.get("VERSION"),
        "{payloads:?}"
    );
}

/// The SBOM attestation verifies; its statement is about the image's digest and carries the SBOM
/// `make image` wrote.
fn assert_sbom_attested(release: &Release) {
    let out = verify_sbom(release.get("COSIGN_PUB"), &release.image());
    assert!(
        out.status.success(),
        "cosign verify-attestation: {}",
        text(&out)
    );
    let sbom: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_dir().join(format!("target/image/{NAME}.cdx.json")))
            .expect("the SBOM of make image"),
    )
    .expect("SBOM JSON");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let envelope: Value = serde_json::from_str(stdout.lines().next().expect("an attestation"))
        .expect("the DSSE envelope");
    let payload = base64_decode(envelope["payload"].as_str().expect("payload"));
    let statement: Value = serde_json::from_slice(&payload).expect("in-toto statement");
    assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
    let digest = release.get("IMAGE_DIGEST");
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"].as_str(),
        digest.strip_prefix("sha256:"),
        "the attestation is about the image"
    );
    assert_eq!(
        statement["predicate"], sbom,
        "the attested SBOM is make image's"
    );
}

/// Standard base64 (the DSSE payload), padding and all; no crate for one decode.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {:?}", char::from(c)),
        }
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for chunk in text.trim_end_matches('=').as_bytes().chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// A failed verification that says why: no signature the key accepts.
fn assert_refused(out: &Output, what: &str) {
    assert!(!out.status.success(), "{what} must fail: {}", text(out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        [
            "no signatures found",
            "no matching signatures",
            "no matching attestations"
        ]
        .iter()
        .any(|m| stderr.contains(m)),
        "{what}: fails for another reason than a missing signature: {}",
        text(out)
    );
}

/// Another key does not verify the release; an image changed behind its tag (a label added,
/// pushed under a tag of its own) has no signature and no SBOM attestation the key accepts.
fn assert_tampering_refused(release: &Release, dir: &Path) {
    let other = dir.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    let out = Command::new(tool("cosign"))
        .args(["generate-key-pair", "--output-key-prefix", "other"])
        .current_dir(&other)
        .env("COSIGN_PASSWORD", "other")
        .output()
        .expect("cosign generate-key-pair");
    assert!(out.status.success(), "generate-key-pair: {}", text(&out));
    let other_pub = other.join("other.pub");
    let other_pub = other_pub.to_str().expect("utf-8");
    assert_refused(
        &verify(other_pub, &release.image()),
        "verify with another key",
    );

    let version = release.get("VERSION");
    let registry = release.get("REGISTRY");
    let tampered = format!("{registry}/{NAME}:{version}-tampered");
    let crane = tool("crane");
    let digest = in_node_ok(
        &[
            &crane,
            "mutate",
            "--insecure",
            "--label",
            "tampered=true",
            &format!("{registry}/{NAME}:{version}"),
            "-t",
            &tampered,
        ],
        &[],
    );
    assert!(
        !digest.contains(release.get("IMAGE_DIGEST")),
        "the changed image has a digest of its own: {digest}"
    );
    let public_key = release.get("COSIGN_PUB");
    assert_refused(
        &verify(public_key, &tampered),
        "verify of the changed image",
    );
    assert_refused(
        &verify_sbom(public_key, &tampered),
        "verify-attestation of the changed image",
    );
}

/// `helm install` of the pushed chart, by its version, with what placing the pod on the real node
/// needs; returns helm's stdout.
fn helm_install(release: &Release, namespace: &str, kubeconfig: &Path) -> String {
    let helm = tool("helm");
    let values = json!({
        "scope": "namespace", "replicas": 1,
        "tolerations": [real_node_toleration()], "nodeSelector": real_node_selector()
    });
    let file = support::deploy::scratch_file(
        &format!("release-values-{namespace}.json"),
        &values.to_string(),
    );
    in_node_ok(
        &[
            &helm,
            "install",
            HELM_RELEASE,
            release.get("CHART"),
            "--version",
            release.get("VERSION"),
            "--plain-http",
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "-n",
            namespace,
            "-f",
            &file,
        ],
        &[],
    )
}

/// The install's Deployment names the image by digest; its pod runs that image on the real node
/// under containerd and becomes Ready.
async fn assert_pinned_pod_ready(ns: &TestNamespace, release: &Release) -> Pod {
    let deployments: Api<Deployment> = ns.api();
    let deployment = deployments
        .get(&format!("{HELM_RELEASE}-{NAME}"))
        .await
        .expect("the chart's Deployment");
    let spec = deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec");
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some(release.image().as_str())
    );
    let pods: Api<Pod> = ns.api();
    let selector = format!("app.kubernetes.io/instance={HELM_RELEASE}");
    let pod = support::wait_for_some("the controller pod Ready", SLOW, || async {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items.into_iter().find(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    })
    .await;
    assert_eq!(
        recorder::node(&pod),
        Some(REAL_NODE),
        "the controller runs on the real node"
    );
    let status = &pod
        .status
        .as_ref()
        .expect("status")
        .container_statuses
        .as_ref()
        .expect("containers")[0];
    assert!(
        status
            .container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "runs under containerd: {:?}",
        status.container_id
    );
    assert!(
        status
            .image_id
            .ends_with(&format!("@{}", release.get("IMAGE_DIGEST"))),
        "runs {}, not the released image",
        status.image_id
    );
    pod
}

/// A pod spec for the real node running busybox `command`.
fn real_pod_spec(command: &str) -> Value {
    json!({
        "tolerations": [real_node_toleration()],
        "nodeSelector": real_node_selector(),
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", command],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
    })
}

/// [`SET`] of 2 on the real node whose cleanup pod (also there) lists the claim and exits 0.
fn app_set(class: &str) -> StatefulSet {
    let mut cleanup = real_pod_spec("ls -la /data && echo cleaned ordinal $SCALEDOWN_ORDINAL");
    cleanup["restartPolicy"] = json!("Never");
    let template = json!({"metadata": {"labels": {"app": "web-cleanup"}}, "spec": cleanup});
    from_json(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": SET, "annotations": {
            "statefulsets.kubernetes.io/scaledown-pod-template": template.to_string()}},
        "spec": {
            "replicas": 2, "serviceName": SET, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": SET}},
            "template": {"metadata": {"labels": {"app": SET}},
                         "spec": real_pod_spec("trap 'exit 0' TERM; sleep 100000 & wait")},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }))
}

/// The installed controller serves 2 -> 1: seen by watches, the cleanup pod of ordinal 1 ran on the
/// real node and Succeeded, then the claim data-web-1 was deleted. Returns scale -> claim deleted.
async fn scale_down_cleaned(ns: &TestNamespace) -> Duration {
    let class = ns.create_real_pvs("real", 2).await.class;
    let sets: Api<StatefulSet> = ns.api();
    sets.create(&PostParams::default(), &app_set(&class))
        .await
        .expect("create the StatefulSet");
    for n in 0..2 {
        support::wait_for_pod_phase(&ns.api(), &format!("{SET}-{n}"), "Running", SLOW).await;
    }
    wait_for(
        &format!("the installed controller's finalizer on {SET}"),
        SLOW,
        || async {
            sets.get_opt(SET)
                .await
                .ok()
                .flatten()
                .is_some_and(|s| s.finalizers().iter().any(|f| f == FINALIZER))
        },
    )
    .await;
    let pods = Recorder::start(ns.api::<Pod>(), watcher::Config::default()).await;
    let claims = Recorder::start(
        ns.api::<PersistentVolumeClaim>(),
        watcher::Config::default(),
    )
    .await;
    let started = Instant::now();
    scale(ns, SET, 1).await;
    let name = format!("{SET}-1");
    let claim = format!("data-{name}");
    let deleted = claims
        .wait_for(&format!("claim {claim} deleted"), SLOW, |s| {
            s.name == claim && s.deleting
        })
        .await;
    let served = started.elapsed();
    let succeeded = pods
        .first(|s| {
            s.name == name
                && s.annotations.contains_key(OWNER)
                && recorder::phase(&s.object) == "Succeeded"
        })
        .unwrap_or_else(|| panic!("cleanup pod {name} never seen Succeeded"));
    assert_eq!(
        recorder::node(&succeeded.object),
        Some(REAL_NODE),
        "cleanup pod {name} ran on the real node"
    );
    assert!(
        succeeded.resource_version < deleted.resource_version,
        "claim {claim} deleted (rv {}) before its cleanup pod Succeeded (rv {})",
        deleted.resource_version,
        succeeded.resource_version
    );
    wait_for_gone(&ns.api::<Pod>(), &name, SLOW).await;
    assert!(
        ns.api::<PersistentVolumeClaim>()
            .get_opt("data-web-0")
            .await
            .expect("get")
            .is_some(),
        "the claim of ordinal 0 stays"
    );
    served
}

/// Releases the set (template annotation and finalizer off) and uninstalls the chart, so the
/// namespace's deletion is not held by a finalizer of a controller that is gone.
fn uninstall(namespace: &str, kubeconfig: &Path) {
    let patch = r#"{"metadata":{"finalizers":null,"annotations":{"statefulsets.kubernetes.io/scaledown-pod-template":null}}}"#;
    let _ = Command::new(support::kubectl_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "patch",
            "-n",
            namespace,
            "statefulset",
            SET,
            "--type=merge",
            "-p",
            patch,
        ])
        .output();
    let helm = tool("helm");
    let _ = in_node(
        &[
            &helm,
            "uninstall",
            HELM_RELEASE,
            "-n",
            namespace,
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "--ignore-not-found",
        ],
        &[],
    );
}

struct Uninstall(String, PathBuf);

impl Drop for Uninstall {
    fn drop(&mut self) {
        uninstall(&self.0, &self.1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn release_is_signed_and_installs_by_digest_from_oci() {
    let cluster = Cluster::connect().await;
    if !real_node_ready(&cluster.client).await {
        if let Some(why) = real_node_skipped() {
            eprintln!("e2e_release: SKIPPED, no real node in this cluster: {why}");
            return;
        }
        panic!("e2e: node {REAL_NODE} is not Ready (hack/real-node.sh status)");
    }
    let ns = cluster.namespace("release").await;
    let registry = format!("{NODE_REGISTRY}/{}", ns.name);
    let release = {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || release(&registry))
            .await
            .expect("release")
    };
    assert_eq!(
        release.get("IMAGE"),
        format!("{registry}/{NAME}:{}", release.get("VERSION"))
    );

    let started = Instant::now();
    let dir = repo_dir()
        .join("target/e2e-tmp")
        .join(format!("release-{}", ns.name));
    let checked = {
        let release_fields = release.fields.clone();
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            let release = Release {
                fields: release_fields,
            };
            assert_image_signed(&release);
            assert_sbom_attested(&release);
            let chart = format!(
                "{}@{}",
                release.get("CHART").trim_start_matches("oci://"),
                release.get("CHART_DIGEST")
            );
            let out = verify(release.get("COSIGN_PUB"), &chart);
            assert!(
                out.status.success(),
                "cosign verify of the chart: {}",
                text(&out)
            );
            assert_tampering_refused(&release, &dir);
        })
    };
    checked.await.expect("verifications");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "e2e_release: verifications took {} ms",
        started.elapsed().as_millis()
    );

    let _uninstall = Uninstall(ns.name.clone(), cluster.kubeconfig.clone());
    let installed = {
        let (name, kubeconfig) = (ns.name.clone(), cluster.kubeconfig.clone());
        let fields = release.fields.clone();
        tokio::task::spawn_blocking(move || helm_install(&Release { fields }, &name, &kubeconfig))
            .await
            .expect("helm install")
    };
    assert!(
        installed.contains("STATUS: deployed"),
        "helm install: {installed}"
    );
    let started = Instant::now();
    assert_pinned_pod_ready(&ns, &release).await;
    let ready_ms = started.elapsed().as_millis();
    let served = scale_down_cleaned(&ns).await;
    eprintln!(
        "e2e_release: controller pod installed -> Ready {ready_ms} ms; scale-down -> claim deleted {} ms",
        served.as_millis()
    );
    record(
        "release: helm install -> controller pod Ready",
        format!("{ready_ms} ms"),
    );
}
