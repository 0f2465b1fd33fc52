//! The cleanup templates of the `corpus` scenario: what users write into the template annotation,
//! with everything that once broke the record's compare-and-swap or could break a parser. Every
//! set gets its own template (one of [`VARIANTS`] kinds by index, details drawn from the seed),
//! and together they hold `&&`, `||`, `|`, `>`, `<`, `2>&1`, here-docs, non-ASCII text, U+2028 and
//! U+2029, CRLF (inside a JSON string and as the line ends of a whole YAML template), YAML block
//! scalars (literal and folded), anchors and aliases, and quotes of every kind.
//!
//! The cleanup pods run `after` under KWOK (annotation `sim.scaledown.io/after`) and succeed.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use statefulset_scaledown_controller::template;

use crate::world::Rng;

/// Kinds of template; set `i` gets kind `i % VARIANTS`.
pub const VARIANTS: usize = 8;

/// The random source of a run's templates (apart from the one that orders the scale-downs).
pub fn rng(seed: u64) -> Rng {
    Rng::new(seed ^ 0x00c0_4b05)
}

/// The templates of `n` sets named `s-0000`...
pub fn templates(n: usize, after: &str, seed: u64) -> Vec<String> {
    let mut rng = rng(seed);
    (0..n)
        .map(|i| template(&format!("s-{i:04}"), i, after, &mut rng))
        .collect()
}

/// Creates a pod of each of the first [`VARIANTS`] templates with `dryRun=All` (the claim volume
/// as an emptyDir): the API server's validation, which the controller's template check does not
/// do. The refusals, as text.
pub async fn preflight(api: &Api<Pod>, templates: &[String]) -> Vec<String> {
    let mut refused = Vec::new();
    for (i, raw) in templates.iter().take(VARIANTS).enumerate() {
        let mut pod = match template::decode::decode(raw) {
            Ok(v) => v,
            Err(e) => {
                refused.push(format!("template {i}: {e}"));
                continue;
            }
        };
        pod["metadata"]["name"] = json!(format!("corpus-preflight-{i}"));
        pod["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
        let result = match serde_json::from_value::<Pod>(pod) {
            Ok(pod) => api
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &pod,
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = result {
            refused.push(format!("template {i}: {e}"));
        }
    }
    refused
}

/// The cleanup template of set `name`, the `index`th of the phase.
pub fn template(name: &str, index: usize, after: &str, rng: &mut Rng) -> String {
    let token = format!("{:08x}", rng.next_u64() as u32);
    let keep = 1 + rng.index(30);
    match index % VARIANTS {
        0 => one_liner(name, after, &token),
        1 => here_doc(name, after, &token),
        2 => yaml_literal(name, after, &token, keep),
        3 => yaml_crlf(name, after, &token),
        4 => separators(name, after, &token),
        5 => yaml_folded(after, &token, keep),
        6 => non_ascii(name, after, &token),
        _ => yaml_anchors(name, after, &token),
    }
}

/// A JSON template: labels, annotations, one container running `command` with `args`, `env`.
fn json_pod(after: &str, annotations: Value, command: Value, args: Value, env: Value) -> String {
    let mut annotations = annotations;
    annotations["sim.scaledown.io/after"] = json!(after);
    json!({
        "metadata": {"labels": {"app": "cleanup"}, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main", "image": "busybox:1.36",
                "command": command, "args": args, "env": env,
                "volumeMounts": [{"name": "data", "mountPath": "/var/data"}],
            }],
        },
    })
    .to_string()
}

/// `sh -c` with a one-line pipeline: `&&`, `||`, `|`, `>&2`, `2>&1`, a brace group.
fn one_liner(name: &str, after: &str, token: &str) -> String {
    let script = format!(
        "set -eu; cd /var/data && tar -czf - . 2>&1 | split -b 512M - \"/backup/{name}-$SCALEDOWN_ORDINAL-{token}.tgz.\" || {{ echo \"backup of {name} failed\" >&2; exit 1; }}"
    );
    json_pod(
        after,
        json!({}),
        json!(["/bin/sh", "-c"]),
        json!([script]),
        json!([]),
    )
}

/// A quoted here-doc with non-ASCII text, then `sync && rm ... 2>&1 | tee`.
fn here_doc(name: &str, after: &str, token: &str) -> String {
    let script = format!(
        "cat > /var/data/.cleaned <<'EOF'\nordinal $SCALEDOWN_ORDINAL of $SCALEDOWN_STATEFULSET ({name}) — données effacées ✓ (Größe < 1 GiB && > 0)\nEOF\nsync && rm -rf /var/data/* 2>&1 | tee -a /tmp/cleanup-{token}.log >/dev/null\n"
    );
    json_pod(
        after,
        json!({"example.com/purpose": "wipe <data> of a removed replica & log it"}),
        json!(["/bin/sh", "-c", script]),
        json!([]),
        json!([]),
    )
}

/// YAML with a literal block scalar: `if [ ] && [ ]`, `-print0 | xargs`, `2>&1 >/dev/null`,
/// `< file`, `> file`.
fn yaml_literal(name: &str, after: &str, token: &str, keep: usize) -> String {
    format!(
        r#"metadata:
  labels:
    app: cleanup
  annotations:
    sim.scaledown.io/after: "{after}"
    example.com/contact: "Zoë & Søren <ops+{token}@example.com>"
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["/bin/sh", "-c"]
    args:
    - |
      set -eu
      # keep {keep} days of {name}'s WAL, then wipe the rest
      if [ -d /var/data/wal ] && [ "$(ls -A /var/data/wal | wc -l)" -gt 0 ]; then
        find /var/data/wal -type f -mtime +{keep} -print0 | xargs -0 rm -f -- 2>&1 >/dev/null || true
      fi
      while read -r f; do rm -f "/var/data/$f"; done < /var/data/MANIFEST
      echo "done: $SCALEDOWN_STATEFULSET/$SCALEDOWN_ORDINAL" > /dev/termination-log
    volumeMounts:
    - name: data
      mountPath: /var/data
"#
    )
}

/// YAML whose every line ends in CRLF, with a `|-` block scalar holding an unquoted here-doc piped
/// into `sed`, `>&2`, `&& exit 0 ||`.
fn yaml_crlf(name: &str, after: &str, token: &str) -> String {
    let lines = [
        format!("# cleanup of {name} (CRLF line ends, {token})"),
        "metadata:".into(),
        "  labels: {app: cleanup}".into(),
        "  annotations:".into(),
        format!("    sim.scaledown.io/after: '{after}'"),
        "spec:".into(),
        "  restartPolicy: Never".into(),
        "  containers:".into(),
        "    - name: main".into(),
        "      image: alpine:3.20".into(),
        "      command:".into(),
        "        - /bin/ash".into(),
        "        - -c".into(),
        "        - |-".into(),
        "          cat <<EOF | sed 's/^/[cleanup] /' >&2".into(),
        "          set=$SCALEDOWN_STATEFULSET ordinal=$SCALEDOWN_ORDINAL replicas=$SCALEDOWN_REPLICAS"
            .into(),
        "          EOF".into(),
        "          [ -f /var/data/lock ] && exit 0 || rm -rf /var/data/cache 2>/dev/null".into(),
        "      volumeMounts:".into(),
        "        - {name: data, mountPath: /var/data}".into(),
    ];
    lines.join("\r\n") + "\r\n"
}

/// JSON strings with U+2028 and U+2029 (which Go escapes and serde_json does not), CRLF, tabs,
/// backslashes and quotes; `>>`, `&&`, `<`, `|`.
fn separators(name: &str, after: &str, token: &str) -> String {
    let script = format!(
        "printf 'id\\t%s\\r\\n' \"$SCALEDOWN_ORDINAL\" >> /var/data/.log && awk -F'\\t' '$2 > 0 {{print $2}}' < /var/data/.log | sort -u\u{2028}# {token}\u{2029}exit 0"
    );
    json_pod(
        after,
        json!({"example.com/note": format!("line one\u{2028}line two\r\nline three — «{name}» \"json\" \\ back\u{2029}")}),
        json!(["/bin/sh", "-c"]),
        json!([script]),
        json!([{"name": "SEPARATORS", "value": "\u{2028}|\u{2029}|\r\n|\t"}]),
    )
}

/// YAML with a folded block scalar (`>-`) whose lines start with `2>&1 |` and `&&`, env values
/// with `&`, `<`, `>` and `<>`.
fn yaml_folded(after: &str, token: &str, keep: usize) -> String {
    format!(
        r#"metadata:
  labels:
    app: cleanup
  annotations: {{sim.scaledown.io/after: "{after}"}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: postgres:16
    env:
    - name: PGURL
      value: "postgres://cleanup@db-{token}:5432/app?sslmode=require&connect_timeout=5"
    - name: FILTER
      value: 'size > 10M && age < {keep}d || owner <> "root"'
    command: [sh, -c]
    args:
    - >-
      psql "$PGURL" -v ON_ERROR_STOP=1 -c "DELETE FROM shards WHERE ordinal >= $SCALEDOWN_REPLICAS AND note <> '';"
      2>&1 | grep -v '^NOTICE' > /var/data/psql.out
      && echo ok || echo "psql failed: $(tail -n1 /var/data/psql.out)" >&2
    volumeMounts:
    - name: data
      mountPath: /var/data
"#
    )
}

/// bash with `exec 2>&1`, a `<<-EOF` here-doc indented by tabs, CJK, emoji, Arabic and a
/// combining accent, `>>`, `|&`, `|| :`.
fn non_ascii(name: &str, after: &str, token: &str) -> String {
    let script = format!(
        "#!/bin/bash\nexec 2>&1\ncat <<-EOF >> /var/data/清理.log\n\t🧹 清理 $SCALEDOWN_STATEFULSET-$SCALEDOWN_ORDINAL — تنظيف — Ñandu\u{301} {token}\n\tEOF\ndu -sh /var/data |& tail -n 1 && rm -rf /var/data/{{tmp,cache}} || :\n"
    );
    json_pod(
        after,
        json!({"example.com/description-ja": format!("データ削除 ({name}) — 🧹")}),
        json!(["/bin/bash", "-c", script]),
        json!([]),
        json!([{"name": "LANG", "value": "ja_JP.UTF-8"}]),
    )
}

/// YAML with an anchor and an alias (`&dir`, `*dir`), a comment full of operators, HTML-ish text
/// and a single-quoted string with `''`.
fn yaml_anchors(name: &str, after: &str, token: &str) -> String {
    format!(
        r#"# a && b || c < d > e | f 2>&1: comments are not the template's business
metadata:
  labels: {{app: cleanup}}
  annotations:
    sim.scaledown.io/after: "{after}"
    example.com/html: '<b>wipe</b> &amp; <i>rebuild</i> — it''s {name}'
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    volumeMounts:
    - name: data
      mountPath: &dir /var/data
    workingDir: *dir
    command: ["sh", "-c", "test -n \"$SCALEDOWN_ORDINAL\" && rm -rf ./* > /dev/null 2>&1; echo '{token}' | md5sum | cut -c1-8 > /dev/termination-log"]
"#
    )
}

/// What a template must hold for the corpus to be what it claims: the raw text, and the decoded
/// strings of the pod.
const FEATURES: [(&str, &str); 12] = [
    ("&&", "&&"),
    ("||", "||"),
    (" | ", " | "),
    (">", ">"),
    ("<", "<"),
    ("2>&1", "2>&1"),
    ("here-doc", "<<"),
    ("non-ASCII", "清理"),
    ("U+2028", "\u{2028}"),
    ("U+2029", "\u{2029}"),
    ("CRLF", "\r\n"),
    ("YAML block scalar", "- |\n"),
];

/// Every template of the first `n` sets of a run with `seed` parses as the controller parses it (for a set with one
/// claim template `data`), and together they hold every feature of [`FEATURES`]. The number of
/// checks, or what failed.
pub fn self_test(n: usize, seed: u64) -> Result<usize, String> {
    let mut all = String::new();
    let mut checks = 0;
    for (i, raw) in templates(n.max(VARIANTS), "1000ms", seed)
        .into_iter()
        .enumerate()
    {
        template::parse(&raw, &["data".to_string()], None)
            .map_err(|e| format!("corpus template {i} (kind {}): {e}", i % VARIANTS))?;
        let decoded = template::decode::decode(&raw).map_err(|e| format!("corpus {i}: {e}"))?;
        let after = &decoded["metadata"]["annotations"]["sim.scaledown.io/after"];
        if after != "1000ms" {
            return Err(format!(
                "corpus template {i}: sim.scaledown.io/after is {after}"
            ));
        }
        all.push_str(&raw);
        all.push_str(&decoded.to_string());
        checks += 1;
    }
    for (feature, needle) in FEATURES {
        if !all.contains(needle) {
            return Err(format!("the corpus has no {feature}"));
        }
        checks += 1;
    }
    Ok(checks)
}
