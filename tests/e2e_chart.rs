//! The Helm chart (`charts/statefulset-scaledown-controller`) with the pinned Helm
//! (`target/cluster/bin/helm`, linked by `hack/cluster.sh up`): `helm lint`; the plain manifests
//! are its output (no drift); every controller flag is reachable through its values; the
//! dashboard and the alerts use only exported metrics; its output in both scopes passes a
//! server-side dry run and applies; and its RBAC is enough for the controller binary run with
//! nothing but a token of the chart's ServiceAccount (namespace scope installed by `helm install`,
//! cluster scope by `helm template | kubectl apply`).
//!
//! The cluster-scope test's controller watches all namespaces, so the tests that run a controller
//! take turns (`CONTROLLER_LOCK`).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{Value, json};
use support::deploy::*;
use support::pool::{annotate_class, bind, delete_claim, wait_released};
use support::recorder::Recorder;
use support::{Cluster, Reclaim, repo_dir};

const CHART: &str = "charts/statefulset-scaledown-controller";

fn chart() -> String {
    repo_dir().join(CHART).to_string_lossy().into_owned()
}

fn helm_binary() -> PathBuf {
    let helm = support::cluster_state_dir().join("bin").join("helm");
    assert!(
        helm.exists(),
        "no {}: `hack/cluster.sh up` links the pinned Helm there (hack/build-tools.sh helm)",
        helm.display()
    );
    helm
}

/// Runs helm with `args` and `kubeconfig`.
fn run_helm(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(helm_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run helm")
}

/// Runs helm with `args` (and the cluster's kubeconfig); panics unless it succeeds; returns stdout.
fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    let out = run_helm(kubeconfig, args);
    assert!(
        out.status.success(),
        "helm {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template RELEASE chart` with `values` (a JSON object) as a values file.
fn template(release: &str, namespace: &str, values: &Value) -> String {
    let file = scratch_file(
        &format!("values-{release}-{namespace}.json"),
        &values.to_string(),
    );
    let kubeconfig = support::cluster_state_dir().join("kubeconfig");
    helm(
        &kubeconfig,
        &[
            "template",
            release,
            &chart(),
            "--namespace",
            namespace,
            "-f",
            &file,
        ],
    )
}

fn deployment_args(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str().map(String::from))
        .collect()
}

/// The flag names (without `--`) in the controller's `--help`, and whether each takes a value.
fn help_flags() -> Vec<(String, bool)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_statefulset-scaledown-controller"))
        .arg("--help")
        .output()
        .expect("run --help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-")
                .filter(|r| r.len() > 2 && &r[1..3] == ", ")
                .map_or(l, |r| &r[3..]);
            let rest = l.strip_prefix("--")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let takes_value = rest[name.len()..].trim_start().starts_with('<');
            Some((name, takes_value))
        })
        .filter(|(name, _)| name != "help" && name != "version")
        .collect()
}

fn camel_case(flag: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in flag.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Metric names of the metrics table in docs/reference.md, with their types.
fn documented_metrics() -> Vec<(String, String)> {
    let reference =
        std::fs::read_to_string(repo_dir().join("docs/reference.md")).expect("docs/reference.md");
    reference
        .lines()
        .filter(|l| l.starts_with("| `scaledown_") || l.starts_with("| `process_"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.trim_matches('`').to_string();
            Some((name, cells.get(2)?.to_string()))
        })
        .collect()
}

/// The metric names an expression uses (identifiers starting with `scaledown_` or `process_`).
fn metrics_in(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("scaledown_") || t.starts_with("process_"))
        .map(String::from)
        .collect()
}

/// `name` is exported: in the docs/reference.md table, or a histogram's `_bucket`/`_sum`/`_count`.
fn is_exported(name: &str, documented: &[(String, String)]) -> bool {
    documented.iter().any(|(n, kind)| {
        n == name
            || (kind == "histogram"
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(n.as_str())))
    })
}

/// Every expression under `value` (key `expr`).
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

fn all_optional() -> Value {
    json!({
        "metrics": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true},
                    "grafanaDashboard": {"enabled": true}},
        "networkPolicy": {"enabled": true, "apiServer": {"cidrs": ["10.96.0.1/32"]}},
    })
}

// === static checks (helm, no cluster objects) ===

#[test]
fn chart_lints_in_both_scopes() {
    let kc = support::cluster_state_dir().join("kubeconfig");
    let chart = chart();
    for set in [
        "scope=cluster",
        "scope=namespace",
        "replicas=1",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true,networkPolicy.enabled=true",
    ] {
        let out = helm(&kc, &["lint", "--strict", &chart, "--set", set]);
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{set}: {out}"
        );
    }
}

/// artifacts/*.yaml are exactly what hack/manifests.sh renders from the chart.
#[test]
fn manifests_are_rendered_from_the_chart() {
    let out = std::process::Command::new(repo_dir().join("hack/manifests.sh"))
        .arg("--check")
        .env("HELM", helm_binary())
        .output()
        .expect("run hack/manifests.sh --check");
    assert!(
        out.status.success(),
        "artifacts/*.yaml differ from the chart (run `make manifests`):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every flag of `--help` is reachable: the ones the chart manages from their values
/// (scope, leaderElection, ports), every other one from a documented key of `controller` in
/// values.yaml (camelCase of the flag).
#[test]
fn every_controller_flag_is_reachable_through_values() {
    let values = chart_values();
    let schema = chart_schema();
    let documented: BTreeSet<String> = values["controller"]
        .as_object()
        .expect("controller map")
        .keys()
        .cloned()
        .collect();
    let managed = [
        "localOnly",
        "leaderElect",
        "leaderElectionId",
        "leaderElectionNamespace",
        "leaderElectLeaseDuration",
        "leaderElectRenewDeadline",
        "leaderElectRetryPeriod",
        "metricsBindAddress",
        "healthProbeBindAddress",
    ];
    let flags = help_flags();
    assert!(flags.len() > 15, "too few flags in --help: {flags:?}");
    let mut controller = serde_json::Map::new();
    for (flag, takes_value) in &flags {
        let key = camel_case(flag);
        if managed.contains(&key.as_str()) {
            continue;
        }
        assert!(
            documented.contains(&key),
            "--{flag} has no key `controller.{key}` in values.yaml"
        );
        // A value the schema allows: the first of its choices (--log-format), else "7".
        let choice = schema["properties"]["controller"]["properties"][&key]["enum"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v.as_str().is_some_and(|v| !v.is_empty())))
            .cloned();
        let value = match takes_value {
            true => choice.unwrap_or(json!("7")),
            false => json!(true),
        };
        controller.insert(key, value);
    }
    let mut rendered = BTreeSet::new();
    for scope in ["cluster", "namespace"] {
        let mut controller = controller.clone();
        if scope == "namespace" {
            // The PV releaser needs cluster scope; the chart refuses it in namespace scope.
            controller.remove("pvReleaserId");
        }
        let values = json!({
            "scope": scope, "controller": controller,
            "leaderElection": {"id": "lease-x", "namespace": "lease-ns", "leaseDuration": "20s",
                               "renewDeadline": "15s", "retryPeriod": "3s"},
            "metrics": {"port": 9090}, "health": {"port": 9091},
        });
        for arg in deployment_args(&yaml_objects(&template("flags", "ns", &values))) {
            let name = arg.trim_start_matches("--");
            rendered.insert(name.split('=').next().unwrap_or(name).to_string());
        }
    }
    let wanted: BTreeSet<String> = flags.into_iter().map(|(f, _)| f).collect();
    assert_eq!(rendered, wanted, "flags rendered by the chart vs --help");
}

/// The chart's image is the one `make image` tags: repository and tag of the Makefile's IMAGE,
/// and the chart's appVersion and version are the crate's.
#[test]
fn chart_image_and_versions_match_the_crate_and_the_makefile() {
    let image = support::makefile_image();
    let image = image.as_str();
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_dir().join(CHART).join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["appVersion"], version);
    assert_eq!(chart["version"], version);
    assert_eq!(image.rsplit_once(':').map(|(_, t)| t), Some(version));
    let objects = yaml_objects(&template("img", "ns", &json!({})));
    let mut found = Vec::new();
    for o in &objects {
        images(o, &mut found);
    }
    assert_eq!(found, [image.to_string()]);
    let pinned = yaml_objects(&template(
        "img",
        "ns",
        &json!({"image": {"digest": "sha256:0123"}}),
    ));
    let mut found = Vec::new();
    for o in &pinned {
        images(o, &mut found);
    }
    let repository = image.rsplit_once(':').map(|(r, _)| r).unwrap_or(image);
    assert!(
        found.contains(&format!("{repository}@sha256:0123")),
        "{found:?}"
    );
}

/// The dashboard is valid JSON with unique panel ids, every query uses only metrics of the
/// table in docs/reference.md, and it shows what an operator looks for; the alerts use only exported
/// metrics too.
#[test]
fn dashboard_and_alerts_use_only_exported_metrics() {
    let documented = documented_metrics();
    assert!(documented.len() > 15, "{documented:?}");
    let path = repo_dir()
        .join(CHART)
        .join("dashboards/statefulset-scaledown-controller.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard"))
            .expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let ids: BTreeSet<i64> = panels.iter().filter_map(|p| p["id"].as_i64()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= panels.len());
    let used: BTreeSet<String> = queries.iter().flat_map(|e| metrics_in(e)).collect();
    for name in &used {
        assert!(
            is_exported(name, &documented),
            "dashboard uses {name}, which /metrics does not export"
        );
    }
    assert_dashboard_covers(&used, &queries, &documented);

    let rules = yaml_objects(&template("alerts", "ns", &all_optional()));
    let rule = rules
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let mut alert_exprs = Vec::new();
    exprs(rule, &mut alert_exprs);
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(
        alerts,
        [
            "StatefulSetScaledownCleanupGaveUp",
            "StatefulSetScaledownOrphanedClaims",
            "StatefulSetScaledownNoLeader",
            "StatefulSetScaledownAPIErrors"
        ]
    );
    for expr in &alert_exprs {
        assert!(!metrics_in(expr).is_empty(), "{expr}");
        for name in metrics_in(expr) {
            assert!(is_exported(&name, &documented), "alert uses {name}: {expr}");
        }
    }
    assert_runbooks(rule);
    // The dashboard ConfigMap carries the file as is.
    let cm = rules
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("dashboard ConfigMap");
    let embedded: Value = serde_json::from_str(
        cm["data"]["statefulset-scaledown-controller.json"]
            .as_str()
            .expect("data"),
    )
    .expect("embedded dashboard parses");
    assert_eq!(embedded, dashboard);
}

/// The dashboard shows what an operator looks for (the status gauge and the companions among
/// them), and every exported family but those named as not shown.
fn assert_dashboard_covers(
    used: &BTreeSet<String>,
    queries: &[String],
    documented: &[(String, String)],
) {
    for needed in [
        "scaledown_leader",
        "scaledown_cleanups_running",
        "scaledown_cleanups_given_up_total",
        "scaledown_orphaned_claims",
        "scaledown_reconcile_errors_total",
        "scaledown_cleanup_duration_seconds_bucket",
        "process_resident_memory_bytes",
        "scaledown_statefulsets",
        "scaledown_pv_released_total",
        "scaledown_pv_scrubs_total",
        "scaledown_pv_pool_volumes",
        "scaledown_build_info",
    ] {
        assert!(used.contains(needed), "the dashboard shows no {needed}");
    }
    // Every exported family is on the dashboard, but those an operator does not watch there.
    let not_shown = [
        "scaledown_release_window_seconds",
        "scaledown_api_requests_total",
    ];
    for (name, kind) in documented {
        let shown = used
            .iter()
            .any(|u| is_exported(u, &[(name.clone(), kind.clone())]));
        assert!(
            shown || not_shown.contains(&name.as_str()),
            "the dashboard shows no {name} (add a panel, or list it as not shown)"
        );
    }
    // The companions' passes: one query per companion controller names it.
    let joined = queries.join("\n");
    for controller in statefulset_scaledown_controller::naming::Controller::ALL {
        let name = controller.as_str();
        if name != "scaledown" {
            assert!(
                joined.contains(name),
                "no query names the {name} controller"
            );
        }
    }
}

/// Every alert's `runbook_url` is the chart's runbook base (this repository's docs/operations.md)
/// with the anchor of a section of docs/operations.md named after the alert, which says what the
/// alert means, how to check and what to do.
fn assert_runbooks(rule: &Value) {
    let values = chart_values();
    let base = values["metrics"]["prometheusRule"]["runbookBaseUrl"]
        .as_str()
        .expect("metrics.prometheusRule.runbookBaseUrl");
    assert_eq!(
        base,
        format!(
            "{}/blob/main/docs/operations.md",
            env!("CARGO_PKG_REPOSITORY")
        )
    );
    let operations =
        std::fs::read_to_string(repo_dir().join("docs/operations.md")).expect("docs/operations.md");
    let rules = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules");
    for r in rules {
        let alert = r["alert"].as_str().expect("alert");
        let url = r["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
        let (at, anchor) = url.split_once('#').expect("an anchor");
        assert_eq!(at, base, "{alert}");
        // The section's heading is the alert's name, so GitHub's anchor is that in lower case.
        assert_eq!(anchor, alert.to_lowercase(), "{alert}");
        let section = operations
            .split("\n#### ")
            .find(|s| s.lines().next() == Some(alert))
            .unwrap_or_else(|| panic!("{alert}: no section `#### {alert}` in docs/operations.md"));
        // Up to the next heading (a `#` line of a code block is not one).
        let section = section.split("\n## ").next().unwrap_or(section);
        let section = section.split("\n### ").next().unwrap_or(section);
        for part in ["**Means:**", "**Check:**", "**Do:**"] {
            assert!(section.contains(part), "{alert}: #{anchor} has no {part}");
        }
    }
}

fn chart_schema() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(repo_dir().join(CHART).join("values.schema.json"))
            .expect("schema"),
    )
    .expect("values.schema.json parses")
}

fn chart_values() -> Value {
    serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_dir().join(CHART).join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses")
}

/// Every object the chart renders (every optional one, both scopes, the Namespace and the
/// companions' rules) and the controller's pods carry the standard labels: helm.sh/chart and
/// app.kubernetes.io/ name, instance, version, component and managed-by.
#[test]
fn every_object_carries_the_standard_labels() {
    let version = env!("CARGO_PKG_VERSION");
    let wanted = json!({
        "helm.sh/chart": format!("statefulset-scaledown-controller-{version}"),
        "app.kubernetes.io/name": "statefulset-scaledown-controller",
        "app.kubernetes.io/instance": "lbl",
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/component": "controller",
        "app.kubernetes.io/managed-by": "Helm",
    });
    let mut cluster = all_optional();
    cluster["namespace"] = json!({"create": true});
    cluster["controller"] = json!({"pvReleaserId": "pool", "podBoundClaims": true});
    let mut namespaced = all_optional();
    namespaced["scope"] = json!("namespace");
    let mut kinds = BTreeSet::new();
    for values in [cluster, namespaced] {
        for o in yaml_objects(&template("lbl", "ns", &values)) {
            let kind = o["kind"].as_str().unwrap_or("").to_string();
            let labels = &o["metadata"]["labels"];
            let pods = &o["spec"]["template"]["metadata"]["labels"];
            for (what, labels) in [(&kind, labels), (&format!("{kind}'s pods"), pods)] {
                if what.ends_with("pods") && kind != "Deployment" {
                    continue;
                }
                for (key, value) in wanted.as_object().expect("map") {
                    assert_eq!(
                        &labels[key], value,
                        "{what} {}: {key}",
                        o["metadata"]["name"]
                    );
                }
            }
            kinds.insert(kind);
        }
    }
    assert_eq!(kinds.len(), 14, "every kind the chart renders: {kinds:?}");
}

/// `helm` with `args`, expected to fail; returns its stderr.
fn helm_refuses(args: &[&str]) -> String {
    let out = run_helm(&support::cluster_state_dir().join("kubeconfig"), args);
    assert!(!out.status.success(), "helm {args:?} accepted it");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// values.schema.json: an unknown key (at the top, nested, a flag's name misspelt) and a wrong
/// type fail `helm template` and `helm install` with the key named; the defaults, values.yaml
/// given explicitly and every `--set` example of the docs and of hack/manifests.sh pass.
#[test]
fn values_schema_rejects_typos_and_wrong_types() {
    let chart = chart();
    let refused = [
        ("replica=3", "replica"),
        ("controller.maxConcurentCleanups=2", "maxConcurentCleanups"),
        ("metrics.serviceMonitor.enable=true", "enable"),
        ("replicas=two", "/replicas"),
        ("metrics.port=http", "/metrics/port"),
        ("controller.dryRun=yes", "/controller/dryRun"),
        ("scope=cluster-wide", "/scope"),
    ];
    for (set, named) in refused {
        let err = helm_refuses(&["template", "bad", &chart, "--set", set]);
        assert!(err.contains(named), "--set {set}: {err}");
    }
    let err = helm_refuses(&[
        "install",
        "bad",
        &chart,
        "-n",
        "default",
        "--set",
        "replica=3",
    ]);
    assert!(err.contains("additional properties 'replica'"), "{err}");
    let values_file = repo_dir().join(CHART).join("values.yaml");
    template("schema", "ns", &json!({}));
    let kc = support::cluster_state_dir().join("kubeconfig");
    helm(
        &kc,
        &[
            "template",
            "schema",
            &chart,
            "-f",
            &values_file.to_string_lossy(),
        ],
    );
    let examples = documented_sets();
    assert!(examples.len() >= 8, "{examples:?}");
    for set in &examples {
        helm(&kc, &["template", "schema", &chart, "--set", set]);
    }
}

/// The `--set KEY=VALUE` of README.md, docs/*.md and hack/manifests.sh, and the `KEY=VALUE`
/// examples of the values table in docs/operations.md.
fn documented_sets() -> Vec<String> {
    let mut sets = BTreeSet::new();
    let files = [
        "README.md",
        "docs/operations.md",
        "docs/usage.md",
        "hack/manifests.sh",
    ];
    for file in files {
        let text = std::fs::read_to_string(repo_dir().join(file)).expect(file);
        let mut words = text.split(|c: char| c.is_whitespace() || c == '`');
        while let Some(word) = words.next() {
            if word == "--set"
                && let Some(set) = words.find(|w| !w.is_empty())
            {
                sets.insert(set.trim_end_matches([')', ';']).to_string());
            } else if let Some(set) = word.strip_prefix("controller.").filter(|w| w.contains('=')) {
                sets.insert(format!("controller.{}", set.trim_end_matches([',', ')'])));
            }
        }
    }
    sets.into_iter().collect()
}

/// values.schema.json and values.yaml name the same keys, at every level the schema closes
/// (`additionalProperties: false`): a new value needs its type, a removed one leaves no schema.
#[test]
fn values_schema_names_every_key_of_values_yaml() {
    let schema = chart_schema();
    let mut missing = Vec::new();
    compare_keys("", &chart_values(), &schema, &mut missing);
    assert!(
        missing.is_empty(),
        "values.yaml vs values.schema.json: {missing:?}"
    );
}

fn compare_keys(at: &str, values: &Value, schema: &Value, diff: &mut Vec<String>) {
    if schema["additionalProperties"] != json!(false) {
        return;
    }
    let props = schema["properties"].as_object().expect("properties");
    let keys = values.as_object().expect("a map in values.yaml");
    for (key, value) in keys {
        match props.get(key) {
            Some(sub) => compare_keys(&format!("{at}.{key}"), value, sub, diff),
            None => diff.push(format!("{at}.{key} has no schema")),
        }
    }
    for key in props.keys() {
        // `global` is Helm's (a parent chart's values), not one of values.yaml.
        let helms_own = at.is_empty() && key == "global";
        if !keys.contains_key(key) && !helms_own {
            diff.push(format!("{at}.{key} is not in values.yaml"));
        }
    }
}

/// Chart.yaml's Artifact Hub annotations: the license is Cargo.toml's, the image the Makefile's
/// IMAGE, every link a file of this repository, the changes well-formed.
#[test]
fn chart_has_artifact_hub_annotations() {
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_dir().join(CHART).join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let annotations = &chart["annotations"];
    let cargo = std::fs::read_to_string(repo_dir().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        cargo.contains(&format!(
            "license = \"{}\"",
            annotations["artifacthub.io/license"]
                .as_str()
                .expect("license")
        )),
        "artifacthub.io/license differs from Cargo.toml's"
    );
    let list = |key: &str| -> Vec<Value> {
        serde_yaml_ng::from_str(annotations[key].as_str().unwrap_or_else(|| panic!("{key}")))
            .unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let images = list("artifacthub.io/images");
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["image"], support::makefile_image().as_str());
    let home = env!("CARGO_PKG_REPOSITORY");
    assert_eq!(chart["home"], home);
    let links = list("artifacthub.io/links");
    assert!(links.len() >= 2, "{links:?}");
    for link in &links {
        let url = link["url"].as_str().expect("url");
        let file = url
            .strip_prefix(&format!("{home}/blob/main/"))
            .unwrap_or_else(|| panic!("{url} is not a file of {home}"));
        assert!(repo_dir().join(file).exists(), "{url}: no {file}");
        assert!(link["name"].is_string(), "{link}");
    }
    for change in list("artifacthub.io/changes") {
        let kind = change["kind"].as_str().expect("kind");
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&kind)
        );
        assert!(change["description"].is_string(), "{change}");
    }
    assert_eq!(annotations["artifacthub.io/operator"], "true");
}

/// replicas > 1: leader election (with the Lease itself among the objects, where
/// `leaderElection.*` puts it, and a Role without `create` on Leases), a PodDisruptionBudget and
/// anti-affinity; replicas = 1: none of them; no runAsUser unless asked.
#[test]
fn replicas_shape_the_deployment() {
    let two = yaml_objects(&template("r", "ns", &json!({})));
    let kinds = |o: &[Value]| {
        o.iter()
            .filter_map(|o| o["kind"].as_str().map(String::from))
            .collect::<Vec<_>>()
    };
    assert!(kinds(&two).contains(&"PodDisruptionBudget".to_string()));
    let lease_of = |objects: &[Value]| {
        let leases: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Lease").collect();
        assert!(leases.len() <= 1, "{leases:?}");
        leases.first().map(|l| {
            assert!(l.get("spec").is_none_or(Value::is_null), "{l}");
            (
                l["metadata"]["name"].as_str().unwrap_or("").to_string(),
                l["metadata"]["namespace"].as_str().map(String::from),
            )
        })
    };
    assert_eq!(
        lease_of(&two),
        Some((
            "r-statefulset-scaledown-controller".to_string(),
            Some("ns".to_string())
        ))
    );
    let elsewhere = yaml_objects(&template(
        "r",
        "ns",
        &json!({"leaderElection": {"id": "lease-x", "namespace": "lease-ns"}}),
    ));
    assert_eq!(
        lease_of(&elsewhere),
        Some(("lease-x".to_string(), Some("lease-ns".to_string())))
    );
    let lease_rules: Vec<&Value> = two
        .iter()
        .filter(|o| o["kind"] == "Role")
        .flat_map(|o| o["rules"].as_array().into_iter().flatten())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|x| x.contains(&json!("leases")))
        })
        .collect();
    assert!(!lease_rules.is_empty());
    assert!(
        lease_rules.iter().all(|r| r["resourceNames"].is_array()
            && !r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&json!("create")))),
        "the replicas may not create Leases: {lease_rules:?}"
    );
    let dep = two
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    assert!(pod["affinity"]["podAntiAffinity"].is_object(), "{pod}");
    assert!(pod["securityContext"].get("runAsUser").is_none());
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(deployment_args(&two).contains(&"--leader-elect".to_string()));

    let one = yaml_objects(&template(
        "r",
        "ns",
        &json!({"replicas": 1, "leaderElection": {"enabled": false}}),
    ));
    assert!(!kinds(&one).contains(&"PodDisruptionBudget".to_string()));
    assert_eq!(lease_of(&one), None, "no Lease without leader election");
    assert!(
        one.iter().all(|o| !o["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .ends_with("-leader-election")),
        "no Lease RBAC without leader election"
    );
    let dep = one
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    assert!(dep["spec"]["template"]["spec"].get("affinity").is_none());
    assert!(!deployment_args(&one).contains(&"--leader-elect".to_string()));

    let uid = yaml_objects(&template(
        "r",
        "ns",
        &json!({"podSecurityContext": {"runAsUser": 1000}}),
    ));
    let dep = uid
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    assert_eq!(
        dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"],
        1000
    );
}

// === on the cluster ===

/// Minimal CRDs of the Prometheus Operator's ServiceMonitor and PrometheusRule (any content), so
/// that the chart's optional objects can be checked by the API server.
async fn ensure_monitoring_crds(cluster: &Cluster) {
    let crd = |kind: &str, plural: &str| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        })
    };
    let file = scratch_file(
        "monitoring-crds.json",
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            crd("ServiceMonitor", "servicemonitors"), crd("PrometheusRule", "prometheusrules")]})
        .to_string(),
    );
    cluster.kubectl(&["apply", "-f", &file]).await;
    cluster
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "--timeout=60s",
        ])
        .await;
}

/// Namespace scope, installed for real with `helm install` into a restricted namespace: the pods
/// are admitted, the chart's ServiceAccount token is enough for the controller binary
/// (`--localOnly`, the chart's Lease) and is refused elsewhere; every optional object also
/// passes a server-side dry run; `helm uninstall` removes the release.
#[tokio::test(flavor = "multi_thread")]
async fn chart_namespace_scope_installs_and_its_rbac_suffices() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let a = cluster.namespace("chart-ns-a").await;
    let b = cluster.namespace("chart-ns-b").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: a.name.clone(),
    };
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &a.name,
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .await;
    ensure_monitoring_crds(&cluster).await;
    let optional = scratch_file(
        &format!("chart-optional-{}.yaml", a.name),
        &template("sd", &a.name, &{
            let mut v = all_optional();
            v["scope"] = json!("namespace");
            v
        }),
    );
    kubectl_ok(
        &kc,
        &["apply", "--dry-run=server", "-n", &a.name, "-f", &optional],
    )
    .await;

    let release = "sd";
    let full = "sd-statefulset-scaledown-controller";
    let out = helm(
        &kc,
        &[
            "install",
            release,
            &chart(),
            "-n",
            &a.name,
            "--set",
            "scope=namespace",
            "--wait",
            "--timeout",
            "90s",
        ],
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    wait_deployment_ready_named(&cluster, &a.name, full).await;
    // The chart's pods were admitted under "restricted"; the test's own StatefulSets (busybox
    // without a securityContext) would not be.
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &a.name,
            "pod-security.kubernetes.io/enforce-",
        ])
        .await;

    let token = token_kubeconfig_for(&cluster, &a.name, full).await;
    let identity = format!("e2e-{}", a.name);
    let mut controller = start_controller(
        &token,
        &identity,
        &a.name,
        &[
            "--localOnly",
            "--leader-elect",
            "--leader-election-id",
            full,
        ],
    );
    assert_scoped_to(&token, &a.name, &b.name).await;
    rbac_scenarios(&a, &identity, &controller).await;
    controller.assert_alive();
    assert!(forbidden_lines(&controller).is_empty());
    assert_lease_held_named(&cluster, &a.name, full, &identity).await;
    drop(controller);
    helm(&kc, &["uninstall", release, "-n", &a.name, "--wait"]);
    let left = cluster
        .kubectl(&[
            "get",
            "deployment,serviceaccount,role,rolebinding,lease",
            "-n",
            &a.name,
            "-o",
            "name",
        ])
        .await;
    assert!(!left.contains(full), "left after helm uninstall:\n{left}");
}

/// Cluster scope from `helm template | kubectl apply` (release `sd-chart`, its own namespace):
/// dry run, apply, pods admitted; the chart's ServiceAccount token is enough for the controller
/// binary to manage a scale-down in another namespace and hold the chart's Lease.
#[tokio::test(flavor = "multi_thread")]
async fn chart_cluster_scope_applies_and_its_rbac_suffices() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let home = cluster.namespace("chart-home").await;
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &home.name,
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .await;
    let release = "sd-chart";
    let full = "sd-chart-statefulset-scaledown-controller";
    let rendered = template(release, &home.name, &json!({}));
    let objects = yaml_objects(&rendered);
    assert!(objects.iter().any(|o| o["kind"] == "ClusterRole"));
    let file = scratch_file(&format!("chart-cluster-{}.yaml", home.name), &rendered);
    let _cleanup = ClusterObjects {
        kubeconfig: kc.clone(),
        file: file.clone(),
    };
    kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &file]).await;
    kubectl_ok(&kc, &["apply", "-f", &file]).await;
    wait_deployment_ready_named(&cluster, &home.name, full).await;

    let token = token_kubeconfig_for(&cluster, &home.name, full).await;
    let ns = cluster.namespace("chart-cluster-rbac").await;
    let _sweep = SetSweep {
        kubeconfig: kc.clone(),
        namespace: ns.name.clone(),
    };
    let identity = format!("e2e-{}", ns.name);
    let mut controller = start_controller(
        &token,
        &identity,
        &home.name,
        &["--leader-elect", "--leader-election-id", full],
    );
    let class = ns.create_static_pvs("pv", 5, Reclaim::Retain).await.class;
    tokio::select! {
        _ = scale_down_and_delete(&ns, &class, &identity) => {}
        _ = fail_on_refusal(&controller) => {}
    }
    controller.assert_alive();
    assert!(forbidden_lines(&controller).is_empty());
    assert_lease_held_named(&cluster, &home.name, full, &identity).await;
}

/// The PV releaser through the chart (`controller.pvReleaserId`): its ClusterRole has the PV and
/// StorageClass rules, the namespace scope refuses it, and the binary run with nothing but the
/// chart's ServiceAccount token releases a PV of its class.
#[tokio::test(flavor = "multi_thread")]
async fn chart_pv_releaser_rbac_suffices() {
    let _serial = CONTROLLER_LOCK.lock().await;
    let cluster = Cluster::connect().await;
    let kc = cluster.kubeconfig.clone();
    let home = cluster.namespace("chart-pv").await;
    let (release, full) = ("sd-pv", "sd-pv-statefulset-scaledown-controller");
    let id = home.name.clone();
    let values = json!({"controller": {"pvReleaserId": id, "disableScaledown": true}});
    // The namespace scope refuses the releaser.
    let chart = chart();
    let err = helm_refuses(&[
        "template",
        release,
        &chart,
        "--set",
        "scope=namespace",
        "--set",
        "controller.pvReleaserId=x",
    ]);
    assert!(err.contains("needs scope=cluster"), "{err}");
    let rendered = template(release, &home.name, &values);
    let objects = yaml_objects(&rendered);
    let rules = &object(&objects, "ClusterRole", full)["rules"];
    assert!(rules.to_string().contains("persistentvolumes"), "{rules}");
    assert!(deployment_args(&objects).contains(&format!("--pv-releaser-id={id}")));
    let file = scratch_file(&format!("chart-pv-{}.yaml", home.name), &rendered);
    let _cleanup = ClusterObjects {
        kubeconfig: kc.clone(),
        file: file.clone(),
    };
    kubectl_ok(&kc, &["apply", "-f", &file]).await;
    wait_deployment_ready_named(&cluster, &home.name, full).await;

    let token = token_kubeconfig_for(&cluster, &home.name, full).await;
    let pool = home.create_static_pvs("pool", 1, Reclaim::Retain).await;
    annotate_class(&cluster, &pool.class, &id).await;
    // With a scrub template, so the token must also cover the temporary claim and the scrub pod.
    let template = json!({"metadata": {"labels": {"scaledown-pod": "scrub"},
                                       "annotations": {"sim.scaledown.io/after": "1s"}},
                          "spec": {"containers": [{"name": "wipe", "image": "busybox"}]}});
    let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
        kube::Api::all(cluster.client.clone());
    let patch = json!({"metadata": {"annotations": {
        "reclaimable-pv-releaser.kubernetes.io/scrub-pod-template": template.to_string()}}});
    classes
        .patch(
            &pool.class,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("scrub template");
    let pvs = Recorder::start(
        kube::Api::<PersistentVolume>::all(cluster.client.clone()),
        kube::runtime::watcher::Config::default(),
    )
    .await;
    let identity = format!("e2e-{}", home.name);
    let args = [
        "--disable-scaledown",
        "--pv-releaser-id",
        &id,
        "--pv-scrub-namespace",
        &home.name,
    ];
    let mut controller = start_controller(&token, &identity, &home.name, &args);
    bind(&home, "cache", &pool.names[0], &pool.class).await;
    delete_claim(&home, "cache").await;
    tokio::select! {
        _ = wait_released(&pvs, &pool.names[0]) => {}
        _ = fail_on_refusal(&controller) => {}
    }
    controller.assert_alive();
    assert!(forbidden_lines(&controller).is_empty());
}

/// Deletes the cluster-scoped objects of a rendered file when dropped.
struct ClusterObjects {
    kubeconfig: PathBuf,
    file: String,
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        let _ = std::process::Command::new(support::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "-f",
                &self.file,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
    }
}
