use std::fmt::Write as _;
use std::time::Instant;

use super::*;
use crate::reason::Reason;

pub(super) fn templates() -> Vec<String> {
    vec!["data".into(), "logs".into()]
}

pub(super) fn selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some([("app".to_string(), "web".to_string())].into()),
        ..Default::default()
    }
}

pub(super) const GOOD: &str = r#"{"metadata":{"labels":{"app":"web-cleanup"}},
    "spec":{"containers":[{"name":"main","image":"busybox","volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#;

pub(super) fn target<'a>() -> Target<'a> {
    Target {
        namespace: "ns",
        set: "web",
        ordinal: 2,
        replicas: 2,
        attempt: 1,
        volumes: vec![("data", Some(("data-web-2", "uid-d"))), ("logs", None)],
    }
}

fn render(raw: &str) -> Value {
    parse(raw, &templates(), Some(&selector()))
        .expect("valid")
        .render(&target())
        .expect("renders")
}

#[test]
fn validation_table() {
    let cases: &[(&str, Result<(), Reason>)] = &[
        (GOOD, Ok(())),
        // YAML is accepted
        (
            "metadata: {labels: {app: c}}\nspec:\n  containers:\n  - name: m\n    image: x\n",
            Ok(()),
        ),
        ("{not json", Err(Reason::CleanupTemplateInvalid)),
        ("- a\n- b\n", Err(Reason::CleanupTemplateInvalid)),
        (
            r#"{"spec":{"containers":"nope"}}"#,
            Err(Reason::CleanupTemplateInvalid),
        ),
        (r#"{"metadata":{}}"#, Err(Reason::CleanupTemplateInvalid)),
        (
            r#"{"spec":{"containers":[]}}"#,
            Err(Reason::CleanupTemplateInvalid),
        ),
        (
            r#"{"kind":"Deployment","spec":{"containers":[{"name":"m","image":"x"}]}}"#,
            Err(Reason::CleanupTemplateInvalid),
        ),
        (
            r#"{"spec":{"restartPolicy":"Always","containers":[{"name":"m","image":"x"}]}}"#,
            Err(Reason::CleanupTemplateRestartPolicy),
        ),
        (
            r#"{"spec":{"restartPolicy":"Never","containers":[{"name":"m","image":"x"}]}}"#,
            Ok(()),
        ),
        (
            r#"{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"m","image":"x"}]}}"#,
            Err(Reason::CleanupTemplateSelectorOverlap),
        ),
        (
            r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","emptyDir":{}}]}}"#,
            Err(Reason::CleanupTemplateVolumeClash),
        ),
        (
            r#"{"spec":{"containers":[{"name":"m","image":"x"}],"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"x"}}]}}"#,
            Ok(()),
        ),
        (
            r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"a","uid":"b"}]},"spec":{"containers":[{"name":"m","image":"x"}]}}"#,
            Err(Reason::CleanupTemplateForbiddenField),
        ),
        // YAML 1.2 booleans, as with the previous parser: `yes` is a string, so an env value works.
        (
            "spec:\n  containers:\n  - name: m\n    env: [{name: A, value: yes}]\n",
            Ok(()),
        ),
    ];
    for (raw, want) in cases {
        let got = parse(raw, &templates(), Some(&selector()))
            .map(|_| ())
            .map_err(|e| e.reason());
        assert_eq!(&got, want, "template {raw}");
    }
}

/// A YAML alias bomb: `levels` anchored lists, each holding `width` aliases of the one before.
/// Unbounded it expands to width^levels strings.
fn alias_bomb(levels: usize, width: usize) -> String {
    let mut yaml = String::from("a0: &a0 [\"lol\"]\n");
    for level in 1..levels {
        let items = vec![format!("*a{}", level - 1); width].join(", ");
        writeln!(yaml, "a{level}: &a{level} [{items}]").expect("writes to a string");
    }
    yaml
}

fn containers_json(count: usize, container: &str) -> String {
    let list = vec![container; count].join(",");
    format!(r#"{{"spec":{{"containers":[{list}]}}}}"#)
}

/// Each limit, with an input that breaks it: the error names the limit (and its value).
#[test]
fn limits_table() {
    let deep_flow = format!("spec: {}{}", "[".repeat(40), "]".repeat(40));
    let deep_block = (0..40).fold(String::new(), |mut s, i| {
        writeln!(s, "{}k{i}:", "  ".repeat(i)).expect("writes to a string");
        s
    });
    let many_nodes = format!("spec: [{}]", vec!["1"; MAX_NODES + 10].join(","));
    let many_anchors = (0..=MAX_ANCHORS).fold(String::new(), |mut s, i| {
        writeln!(s, "k{i}: &a{i} v").expect("writes to a string");
        s
    });
    let merge_keys = (0..=MAX_MERGE_KEYS).fold(String::from("base: &b {x: 1}\n"), |mut s, i| {
        writeln!(s, "m{i}: {{<<: *b}}").expect("writes to a string");
        s
    });
    // Within the alias and anchor counts, but each level replays all of the one before.
    let replay = alias_bomb(8, 4);
    // Scalars cannot outgrow the input, but tags can: a %TAG prefix is counted at each use.
    let scalars = format!(
        "%TAG !e! tag:example.com,2000:{}\n---\nspec: [{}]\n",
        "p".repeat(900),
        vec!["!e!a 1"; 200].join(", ")
    );
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "alias bomb",
            alias_bomb(9, 9),
            &["YAML aliases", "limit of 32"],
        ),
        (
            "alias replay",
            replay,
            &["events replayed by YAML aliases", "limit of 20000"],
        ),
        (
            "deep flow nesting",
            deep_flow,
            &["YAML nesting depth", "limit of 32"],
        ),
        (
            "deep block nesting",
            deep_block,
            &["YAML nesting depth", "limit of 32"],
        ),
        (
            "two documents",
            "spec: {}\n---\nspec: {}\n".into(),
            &["YAML documents", "limit of 1"],
        ),
        (
            "too many nodes",
            many_nodes,
            &["YAML nodes", "limit of 20000"],
        ),
        (
            "too many anchors",
            many_anchors,
            &["YAML anchors", "limit of 32"],
        ),
        (
            "too many merge keys",
            merge_keys,
            &["YAML merge keys", "limit of 32"],
        ),
        (
            "scalar bytes",
            scalars,
            &["YAML scalar bytes", "limit of 131072"],
        ),
        (
            "input over 128 KiB",
            format!("# {}\n{GOOD}", "x".repeat(MAX_INPUT_BYTES)),
            &["template annotation is 131", "limit of 131072 bytes"],
        ),
        (
            "8,500 full containers as JSON (314 KB)",
            containers_json(8_500, r#"{"name":"cleanup","image":"busybox"}"#),
            &["template annotation", "limit of 131072 bytes"],
        ),
        (
            "8,500 containers render a pod over 512 KiB",
            containers_json(8_500, r#"{"name":"c"}"#),
            &["rendered cleanup pod", "limit of 524288 bytes"],
        ),
    ];
    for (name, raw, wanted) in &cases {
        let started = Instant::now();
        let err = parse(raw, &templates(), None).expect_err(name);
        let message = err.to_string();
        assert_eq!(
            err.reason(),
            Reason::CleanupTemplateTooLarge,
            "{name}: {message}"
        );
        for part in *wanted {
            assert!(message.contains(part), "{name}: {message:?} lacks {part:?}");
        }
        assert!(message.len() <= 300, "{name}: message too long: {message}");
        println!(
            "{name}: {} bytes -> {message} ({:?})",
            raw.len(),
            started.elapsed()
        );
    }
}

/// Just under each limit still parses: the limits leave room for real templates.
#[test]
fn limits_leave_room() {
    let nested = format!(
        "spec:\n  containers:\n  - name: m\n    x: {}{}\n",
        "[".repeat(MAX_DEPTH - 5),
        "]".repeat(MAX_DEPTH - 5)
    );
    let anchors = "base: &c {name: m, image: x}\nspec:\n  containers: [*c]\n  initContainers: [{<<: *c, name: i}]\n";
    let containers = containers_json(300, r#"{"name":"c","image":"busybox:1.36"}"#);
    for raw in [nested.as_str(), anchors, containers.as_str()] {
        let template = parse(raw, &templates(), None).unwrap_or_else(|e| panic!("{raw:.80}: {e}"));
        template.render(&target()).expect("renders");
    }
}

#[test]
fn messages_stay_short_whatever_the_input() {
    let long = "z".repeat(10_000);
    let cases = [
        format!(r#"{{"spec":{{"restartPolicy":"{long}","containers":[{{"name":"m"}}]}}}}"#),
        format!(
            r#"{{"spec":{{"containers":[{{"name":"m"}}],"volumes":[{{"name":"data","hostPath":{{"path":"/{long}"}}}}]}}}}"#
        ),
        format!(r#"{{"kind":"{long}"}}"#),
        format!(r#"{{"spec":{{"containers":"{long}"}}}}"#),
        format!("{{\"{long}"),
        format!("a: b\n  c: \"{long}"),
    ];
    for raw in &cases {
        let err = parse(raw, &templates(), None).expect_err("invalid");
        let message = err.to_string();
        assert!(message.len() <= 300, "{} bytes: {message}", message.len());
    }
    // Volume names must match a claim template to clash, so use a long claim template.
    let templates = vec![long.clone()];
    let raw = format!(
        r#"{{"spec":{{"containers":[{{"name":"m"}}],"volumes":[{{"name":"{long}","emptyDir":{{}}}}]}}}}"#
    );
    let err = parse(&raw, &templates, None).expect_err("clash");
    assert_eq!(err.reason(), Reason::CleanupTemplateVolumeClash);
    assert!(err.to_string().len() <= 300, "{err}");
}

#[test]
fn render_sets_identity_volumes_env_and_keeps_unknown_fields() {
    let raw = r#"{"metadata":{"name":"ignored","generateName":"g-","labels":{"app":"c"},"annotations":{"a":"b"}},
        "spec":{"futureField":{"x":1},"containers":[{"name":"m","image":"x","env":[{"name":"SCALEDOWN_ORDINAL","value":"99"},{"name":"KEEP","value":"1"}]}],
        "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"wrong"}},{"name":"scratch","emptyDir":{}}]}}"#;
    let pod = render(raw);
    assert_eq!(pod["metadata"]["name"], "web-2");
    assert_eq!(pod["metadata"]["namespace"], "ns");
    assert!(pod["metadata"].get("generateName").is_none());
    assert_eq!(pod["metadata"]["labels"]["app"], "c");
    assert_eq!(pod["metadata"]["labels"]["scaledown-pod"], "web-2");
    assert_eq!(pod["metadata"]["annotations"]["a"], "b");
    assert_eq!(
        pod["metadata"]["annotations"][naming::OWNER_ANNOTATION],
        "web"
    );
    assert_eq!(
        pod["metadata"]["annotations"][naming::ATTEMPT_ANNOTATION],
        "1"
    );
    assert_eq!(
        pod["metadata"]["annotations"][naming::CLAIMS_ANNOTATION],
        r#"{"data-web-2":"uid-d"}"#
    );
    assert_eq!(pod["spec"]["restartPolicy"], "OnFailure");
    assert_eq!(
        pod["spec"]["futureField"]["x"], 1,
        "unknown fields pass through"
    );
    assert_eq!(
        pod["spec"]["volumes"],
        json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
            {"name": "logs", "emptyDir": {}},
        ])
    );
    assert_eq!(
        pod["spec"]["containers"][0]["env"],
        json!([
            {"name": "KEEP", "value": "1"},
            {"name": "SCALEDOWN_STATEFULSET", "value": "web"},
            {"name": "SCALEDOWN_NAMESPACE", "value": "ns"},
            {"name": "SCALEDOWN_ORDINAL", "value": "2"},
            {"name": "SCALEDOWN_REPLICAS", "value": "2"},
        ])
    );
    // The rendered pod is a valid Pod for our bindings too.
    let typed: Pod = serde_json::from_value(pod).expect("a pod");
    assert_eq!(
        typed.spec.and_then(|s| s.restart_policy).as_deref(),
        Some("OnFailure")
    );
}

/// Every container's log tail becomes its termination message when it wrote none (the cleanup's
/// own words in `CleanupFailed` and `Stalled`), unless the template chose a policy itself.
#[test]
fn the_log_tail_is_the_termination_message_unless_the_template_chose() {
    let raw = r#"{"spec":{"initContainers":[{"name":"i","image":"x"}],
        "containers":[{"name":"m","image":"x"},{"name":"f","image":"x","terminationMessagePolicy":"File"}]}}"#;
    let pod = render(raw);
    let policies: Vec<&Value> = [
        &pod["spec"]["initContainers"][0],
        &pod["spec"]["containers"][0],
        &pod["spec"]["containers"][1],
    ]
    .into_iter()
    .map(|c| &c["terminationMessagePolicy"])
    .collect();
    assert_eq!(
        policies,
        [
            &json!("FallbackToLogsOnError"),
            &json!("FallbackToLogsOnError"),
            &json!("File")
        ]
    );
}

#[test]
fn never_is_kept() {
    let raw = r#"{"spec":{"restartPolicy":"Never","containers":[{"name":"m","image":"x"}]}}"#;
    assert_eq!(render(raw)["spec"]["restartPolicy"], "Never");
}

/// The confirm gate is added once, after the template's own gates, whatever the template says.
#[test]
fn render_adds_the_confirm_gate_once() {
    let ours = json!({"name": naming::CONFIRM_GATE});
    let other = json!({"name": "example.com/other"});
    let cases: Vec<(&str, Value)> = vec![
        ("no gates", json!(null)),
        ("empty gates", json!([])),
        ("another gate", json!([other])),
        ("our gate already", json!([ours])),
        ("ours twice around another", json!([ours, other, ours])),
    ];
    for (name, gates) in cases {
        let mut template = serde_json::from_str::<Value>(GOOD).expect("json");
        if !gates.is_null() {
            template["spec"]["schedulingGates"] = gates.clone();
        }
        let pod = render(&template.to_string());
        let kept_others: Vec<Value> = gates
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| **g != ours)
            .cloned()
            .collect();
        let mut want = kept_others;
        want.push(ours.clone());
        assert_eq!(pod["spec"]["schedulingGates"], json!(want), "{name}");
        let typed: Pod = serde_json::from_value(pod).expect("a pod");
        let gates = typed
            .spec
            .and_then(|s| s.scheduling_gates)
            .unwrap_or_default();
        assert_eq!(
            gates
                .iter()
                .filter(|g| g.name == naming::CONFIRM_GATE)
                .count(),
            1,
            "{name}"
        );
    }
}

#[test]
fn render_refuses_a_pod_over_the_cap() {
    // Parse checks the largest legal target; a longer (illegal) namespace name still trips render.
    let template = parse(
        &containers_json(1_000, r#"{"name":"c"}"#),
        &templates(),
        None,
    )
    .expect("fits for legal names");
    let ns = "n".repeat(1_000);
    let big = Target {
        namespace: &ns,
        ..target()
    };
    let err = template.render(&big).expect_err("over the cap");
    assert_eq!(err.reason(), Reason::CleanupTemplateTooLarge);
    assert!(err.to_string().contains("rendered cleanup pod"), "{err}");
}

/// The "Template limits" table of docs/usage.md shows the limits the code enforces.
#[test]
fn documented_template_limits_match_the_code() {
    let usage = include_str!("../../docs/usage.md");
    let section = usage
        .split("### Template limits")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/usage.md section Template limits");
    let value = |limit: &str| -> String {
        section
            .lines()
            .find(|l| l.starts_with(&format!("| {limit} |")))
            .and_then(|l| l.split('|').nth(2))
            .unwrap_or_else(|| panic!("docs/usage.md Template limits: no row {limit}"))
            .trim()
            .to_string()
    };
    let kib = |bytes: usize| format!("{} KiB", bytes / 1024);
    let count = |n: usize| {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    assert_eq!(value("annotation size"), kib(decode::MAX_INPUT_BYTES));
    assert_eq!(value("YAML nesting depth"), count(decode::MAX_DEPTH));
    assert_eq!(value("YAML aliases (`*a`)"), count(decode::MAX_ALIASES));
    assert_eq!(value("YAML anchors (`&a`)"), count(decode::MAX_ANCHORS));
    assert_eq!(
        value("YAML merge keys (`<<`)"),
        count(decode::MAX_MERGE_KEYS)
    );
    assert_eq!(value("YAML nodes"), count(decode::MAX_NODES));
    assert_eq!(value("YAML parser events"), count(decode::MAX_EVENTS));
    assert_eq!(
        value("events replayed by aliases"),
        count(decode::MAX_REPLAYED_EVENTS)
    );
    assert_eq!(value("YAML scalar bytes"), kib(decode::MAX_SCALAR_BYTES));
    assert_eq!(value("YAML documents"), count(decode::MAX_DOCUMENTS));
    assert_eq!(
        value("rendered pod"),
        format!("{} of JSON", kib(decode::MAX_POD_BYTES))
    );
}
