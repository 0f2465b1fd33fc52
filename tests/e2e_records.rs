//! Property test of the record patch against the real API server (docs/usage.md, "Safety contract"): the
//! `test` ops of [`record_ops`], encoded by [`apijson`], must apply when the StatefulSet is
//! unchanged and must be refused when its template annotation changed, for any text a user can put
//! in that annotation.
//!
//! kube-apiserver compares a `test` op's string with its own (Go) encoding of the stored object,
//! byte for byte. Go writes `&`, `<`, `>`, U+2028 and U+2029 as `\u0026`, `\u003c`, `\u003e`,
//! `\u2028`, `\u2029`; serde_json does not. So the generated annotations are drawn heavily from the
//! characters JSON encoders treat differently (those five, `"`, `\`, `/`, control characters, DEL,
//! non-ASCII, U+FFFD, literal `\u0026` text) and from shell fragments (`&&`, `2>&1`, here-docs).
//!
//! Each case, on a StatefulSet of its own namespace (one set per [`CASES_PER_SET`] cases, the
//! annotation changed through the typed API in between):
//! 1. the annotation `S` is written through kube's typed API (as kubectl would), read back, and
//!    must be exactly `S`;
//! 2. when `S` (or the record) holds one of Go's five escapes, the record patch sent as plain
//!    serde_json (`Api::patch` with `Patch::Json`) must be refused: proof that the escape matters;
//! 3. the record patch sent through `apijson::patch_request` must apply (2xx);
//! 4. a record patch built from the read returned by step 3 is kept; the annotation is changed to
//!    `S'` (random, or `S` with one special character swapped, `&` for `<` and the like); the stale
//!    patch must be refused (422); the API server does not say which op failed, so the same patch
//!    without its `test` op on the template must apply as a dry run;
//! 5. `S'` is read back and a fresh record patch for it must apply (after the control of step 2).
//!
//! `RECORD_CASES` sets the number of cases (default 300), `RECORD_SEED` the seed (decimal or
//! `0x` hex; default fixed, printed). No controller runs here.
//!
//! Run with `hack/with-cluster.sh cargo test --test e2e_records -- --nocapture`.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use statefulset_scaledown_controller::apijson;
use statefulset_scaledown_controller::naming::{RECORD_ANNOTATION, TEMPLATE_ANNOTATION};
use statefulset_scaledown_controller::scaledown::act::record_ops;
use statefulset_scaledown_controller::scaledown::observe::{Record, format_records, set_facts};
use support::{Cluster, from_json};

const DEFAULT_CASES: usize = 300;
const DEFAULT_SEED: u64 = 0x2028_2029_0026;
/// Cases run side by side, each worker on StatefulSets of its own.
const WORKERS: usize = 4;
/// A worker creates a new StatefulSet every this many cases (the first annotation then goes in
/// through a create, the others through updates).
const CASES_PER_SET: usize = 10;
/// Failures described in full (all are counted).
const MAX_REPORTED: usize = 12;

/// The five characters Go's encoder escapes and serde_json does not.
const GO_ESCAPED: [char; 5] = ['&', '<', '>', '\u{2028}', '\u{2029}'];
/// Characters a one-character change swaps among.
const SPECIAL: [char; 12] = [
    '&', '<', '>', '\u{2028}', '\u{2029}', '"', '\\', '/', '\n', '\u{0}', '\u{7f}', 'é',
];
const ESCAPED_BY_BOTH: [char; 3] = ['"', '\\', '/'];
const NON_ASCII: [char; 22] = [
    'é',
    'ü',
    'ß',
    'Ω',
    '✓',
    '→',
    '€',
    '😀',
    '🦀',
    '漢',
    '字',
    'ア',
    '한',
    'ع',
    '\u{301}',
    '\u{fffd}',
    '\u{fffe}',
    '\u{ffff}',
    '\u{10ffff}',
    '\u{1d11e}',
    '\u{e000}',
    '\u{2027}',
];
/// Invisible or unusual whitespace: kept only next to visible text (a blank template is no
/// template, see `set_facts`).
const ODD_SPACE: [char; 9] = [
    ' ', '\u{85}', '\u{a0}', '\u{feff}', '\u{200b}', '\u{200d}', '\u{202e}', '\u{3000}', '\u{2060}',
];
const FRAGMENTS: [&str; 52] = [
    "&&",
    "||",
    "2>&1",
    ">/dev/null",
    "2>/dev/null",
    "&>/dev/null",
    "<<'EOF'\nrm -rf /data/*\nEOF\n",
    "cat <<EOF > /tmp/x\n$HOME & <stuff>\nEOF",
    "cat <<-END\n\techo \"a < b\"\n\tEND\n",
    "$(ls -1 /data | wc -l)",
    "`date +%s`",
    "${DATA_DIR:-/data}",
    "a | b",
    "; ",
    "if [ \"$n\" -lt 3 ] && [ -d /data ]; then echo ok; fi",
    "echo \"<done>\" >&2",
    "sh -c 'exec 3<>/dev/tcp/host/80'",
    "</script>",
    "<!-- -->",
    "&amp;",
    "&lt;",
    "&gt;",
    "&#x2028;",
    "\\u0026",
    "\\u003c",
    "\\u003e",
    "\\u003C",
    "\\u2028",
    "\\u2029",
    "\\u0000",
    "\\n",
    "\\t",
    "\\\"",
    "\\\\",
    "\\/",
    "\\ud83d\\ude00",
    "\"\"",
    "{\"a\":\"<b>\",\"c\":\"d&e\"}",
    "key: |\n  line & more\n  <tag>\n",
    "- \"quoted < text\"",
    "command: [\"sh\", \"-c\", \"test -d /data && rm -rf /data/* || exit 1\"]",
    "e\u{301}",
    "\r\n",
    "🏳\u{fe0f}\u{200d}🌈",
    "漢字テスト",
    "Ωmega ✓ café",
    "\u{feff}BOM",
    "%s %d %% %n",
    "'single' \"double\"",
    "a\u{2028}b\u{2029}c",
    "\u{1b}[31mred\u{1b}[0m",
    "\u{0}\u{1}\u{2}\u{3}",
];

/// Cases that always run first, whatever the seed.
fn fixed_cases() -> Vec<String> {
    let mut cases: Vec<String> = [
        "a&b",
        "<",
        ">",
        "&",
        "\u{2028}x",
        "x\u{2029}",
        "x && y || z 2>&1",
        "\\u0026",
        "&amp;",
        "\u{0}",
        "\u{7f}",
        "\"\\/",
        "\u{8}\u{c}\u{b}\u{1f}",
        "é",
        "😀",
        "\u{fffd}",
        "\t\r\nx",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cases.push(
        "metadata:\n  labels: {app: cleanup}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: cleanup\n    image: busybox\n    command: [\"sh\", \"-c\", \"test -d /data && find /data -mindepth 1 -delete 2>&1 || echo 'nothing <to> do' >&2\"]\n    volumeMounts: [{name: data, mountPath: /data}]\n"
            .to_string(),
    );
    cases.push(
        json!({
            "metadata": {"labels": {"app": "cleanup"}, "annotations": {"note": "x < y & z > w\u{2028}"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "args": ["sh", "-c", "cat <<EOF >/data/log\n$(date) && done\nEOF"]}]}
        })
        .to_string(),
    );
    cases
}

use support::rng::Rng;

/// One random piece of an annotation: a character or a fragment.
fn piece(rng: &mut Rng, out: &mut String) {
    match rng.index(100) {
        0..=29 => out.push(rng.pick(&GO_ESCAPED)),
        30..=39 => out.push(rng.pick(&ESCAPED_BY_BOTH)),
        40..=51 => {
            // C0 controls 0x00-0x1f (\t \n \r \b \f among them), DEL, C1 controls 0x80-0x9f.
            let c = match rng.index(65) as u32 {
                c @ 0..=31 => c,
                32 => 0x7f,
                c => 0x80 + (c - 33),
            };
            out.push(char::from_u32(c).unwrap_or('\u{7f}'));
        }
        52..=58 => out.push(rng.pick(&ODD_SPACE)),
        59..=70 => out.push(rng.pick(&NON_ASCII)),
        71..=84 => {
            const ASCII: &[u8] =
                b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.:;=+$#%`'{}[]()|!?*~^,@u";
            for _ in 0..rng.range(1, 9) {
                out.push(char::from(rng.pick(ASCII)));
            }
        }
        _ => out.push_str(rng.pick(&FRAGMENTS)),
    }
}

/// A random annotation: mostly short, sometimes long, rarely tens of KiB.
fn random_text(rng: &mut Rng) -> String {
    let pieces = match rng.index(100) {
        0..=79 => rng.range(1, 24),
        80..=96 => rng.range(24, 200),
        _ => rng.range(2000, 5000),
    };
    let mut out = String::new();
    for _ in 0..pieces {
        piece(rng, &mut out);
    }
    non_blank(out)
}

/// `set_facts` reads a blank annotation as no template (no `test` op at all): keep text visible.
fn non_blank(mut text: String) -> String {
    if text.trim().is_empty() {
        text.push('x');
    }
    text
}

fn char_starts(text: &str) -> Vec<usize> {
    text.char_indices()
        .map(|(at, _)| at)
        .chain([text.len()])
        .collect()
}

/// A different annotation: a one-character change most of the time, else a new random text.
fn changed(rng: &mut Rng, before: &str) -> (String, &'static str) {
    for _ in 0..8 {
        let (after, how) = change_once(rng, before);
        let after = non_blank(after);
        if after != before {
            return (after, how);
        }
    }
    (format!("{before}&"), "append &")
}

fn change_once(rng: &mut Rng, before: &str) -> (String, &'static str) {
    let specials: Vec<(usize, char)> = before
        .char_indices()
        .filter(|(_, c)| SPECIAL.contains(c))
        .collect();
    let go_escaped: Vec<(usize, char)> = before
        .char_indices()
        .filter(|(_, c)| GO_ESCAPED.contains(c))
        .collect();
    let starts = char_starts(before);
    match rng.index(100) {
        // One special character swapped for another (`&` -> `<`, U+2028 -> U+2029, ...).
        0..=39 if !specials.is_empty() => {
            let (at, c) = rng.pick(&specials);
            let mut other = rng.pick(&SPECIAL);
            while other == c {
                other = rng.pick(&SPECIAL);
            }
            let mut after = before.to_string();
            after.replace_range(at..at + c.len_utf8(), other.encode_utf8(&mut [0; 4]));
            (after, "swap one special character")
        }
        // A character Go escapes replaced by the text of its escape (`&` -> `\u0026`).
        40..=49 if !go_escaped.is_empty() => {
            let (at, c) = rng.pick(&go_escaped);
            let mut after = before.to_string();
            after.replace_range(at..at + c.len_utf8(), &format!("\\u{:04x}", u32::from(c)));
            (after, "character -> text of its escape")
        }
        // The text of an escape replaced by the character (`\u0026` -> `&`).
        50..=54 if before.contains("\\u0026") => (
            before.replacen("\\u0026", "&", 1),
            "text of an escape -> character",
        ),
        // One character inserted somewhere.
        0..=64 => {
            let at = rng.pick(&starts);
            let mut inserted = String::new();
            if rng.chance(60) {
                inserted.push(rng.pick(&SPECIAL));
            } else {
                piece(rng, &mut inserted);
            }
            let mut after = before.to_string();
            after.insert_str(at, &inserted);
            (after, "insert")
        }
        // One character removed.
        65..=74 if starts.len() > 2 => {
            let i = rng.index(starts.len() - 1);
            let mut after = before.to_string();
            after.replace_range(starts[i]..starts[i + 1], "");
            (after, "remove one character")
        }
        // Line ends or accents that look alike: \n <-> \r\n, é <-> e + U+0301.
        75..=79 if before.contains('\n') || before.contains('é') => {
            if before.contains("\r\n") {
                (before.replacen("\r\n", "\n", 1), "\\r\\n -> \\n")
            } else if before.contains('\n') {
                (before.replacen('\n', "\r\n", 1), "\\n -> \\r\\n")
            } else {
                (before.replacen('é', "e\u{301}", 1), "é -> e + U+0301")
            }
        }
        80..=84 => {
            let edge = rng.pick(&[" ", "\n", "\u{2028}", "\u{0}", "&"]);
            if rng.chance(50) {
                (format!("{before}{edge}"), "append")
            } else {
                (format!("{edge}{before}"), "prepend")
            }
        }
        _ => (random_text(rng), "new random text"),
    }
}

/// A record to write: usually what the controller writes, sometimes with odd text in it, so the
/// `test` op on the previous record sees the same characters.
fn random_records(rng: &mut Rng, set: &str) -> BTreeMap<u32, Record> {
    let mut records = BTreeMap::new();
    for _ in 0..rng.range(1, 4) {
        let ordinal = rng.range(0, 100) as u32;
        let pod = if rng.chance(20) {
            let mut odd = String::new();
            for _ in 0..rng.range(1, 6) {
                piece(rng, &mut odd);
            }
            odd
        } else {
            format!("{set}-{ordinal}")
        };
        let claims = BTreeMap::from([(
            format!("data-{set}-{ordinal}"),
            format!("{:016x}-{:04x}", rng.next_u64(), rng.index(0x10000)),
        )]);
        records.insert(ordinal, Record { pod, claims });
    }
    records
}

fn has_go_escape(text: &str) -> bool {
    text.contains(GO_ESCAPED)
}

fn statefulset(name: &str, template: &str) -> StatefulSet {
    from_json(json!({
        "metadata": {"name": name, "annotations": {TEMPLATE_ANNOTATION: template}},
        "spec": {
            "replicas": 0,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/never-pulled:1"}]},
            },
        },
    }))
}

fn annotation<'a>(set: &'a StatefulSet, key: &str) -> Option<&'a str> {
    set.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The text, its UTF-8 bytes and both encodings, for a failure report.
fn describe(label: &str, text: &str) -> String {
    const SHOWN: usize = 300;
    let bytes = text.as_bytes();
    let mut hex = String::new();
    for b in bytes.iter().take(SHOWN) {
        let _ = write!(hex, "{b:02x} ");
    }
    let cut = |s: String| -> String {
        if s.chars().count() > SHOWN {
            format!(
                "{}… ({} chars)",
                s.chars().take(SHOWN).collect::<String>(),
                s.chars().count()
            )
        } else {
            s
        }
    };
    let go = apijson::to_vec(&text).map(|v| String::from_utf8_lossy(&v).into_owned());
    let plain = serde_json::to_string(&text);
    format!(
        "  {label} ({} bytes): {}\n    bytes: {}{}\n    apijson:    {}\n    serde_json: {}\n",
        bytes.len(),
        cut(format!("{text:?}")),
        hex.trim_end(),
        if bytes.len() > SHOWN { " …" } else { "" },
        cut(go.unwrap_or_else(|e| format!("<error {e}>"))),
        cut(plain.unwrap_or_else(|e| format!("<error {e}>"))),
    )
}

#[derive(Default)]
struct Tally {
    applied: usize,
    refused: usize,
    controls: usize,
    failures: Vec<String>,
}

struct Worker {
    client: Client,
    sets: Api<StatefulSet>,
    namespace: String,
}

enum Sent {
    Applied(Box<StatefulSet>),
    Refused(String),
    Other(String),
}

impl Worker {
    /// Sends `ops` as `apijson` encodes them (`dry_run`: validated and tested, not stored).
    async fn send_go(&self, name: &str, ops: &[Value], dry_run: bool) -> Sent {
        let params = if dry_run {
            PatchParams::default().dry_run()
        } else {
            PatchParams::default()
        };
        let request =
            match apijson::patch_request::<StatefulSet>(Some(&self.namespace), name, &ops, &params)
            {
                Ok(r) => r,
                Err(e) => return Sent::Other(format!("cannot build the request: {e}")),
            };
        classify(self.client.request::<StatefulSet>(request).await)
    }

    async fn send_plain(&self, name: &str, ops: &[Value]) -> Sent {
        let patch: json_patch::Patch = match serde_json::from_value(Value::Array(ops.to_vec())) {
            Ok(p) => p,
            Err(e) => return Sent::Other(format!("not a JSON patch: {e}")),
        };
        classify(
            self.sets
                .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await,
        )
    }

    /// Writes `template` through the typed API: a create for a new set, else a merge patch.
    async fn put_template(&self, name: &str, template: &str, create: bool) -> Result<(), String> {
        let result = if create {
            self.sets
                .create(&PostParams::default(), &statefulset(name, template))
                .await
        } else {
            let patch = json!({"metadata": {"annotations": {TEMPLATE_ANNOTATION: template}}});
            self.sets
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        };
        result
            .map(|_| ())
            .map_err(|e| format!("the API server did not take the annotation: {e}"))
    }

    /// Reads the set back; its annotation must be exactly `template`.
    async fn read(&self, name: &str, template: &str) -> Result<StatefulSet, String> {
        let set = self
            .sets
            .get(name)
            .await
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        match annotation(&set, TEMPLATE_ANNOTATION) {
            Some(seen) if seen == template => Ok(set),
            seen => Err(format!(
                "read back a different annotation\n{}",
                describe("read back", seen.unwrap_or("<absent>"))
            )),
        }
    }

    /// Steps 2 and 3 for the set as `live` shows it: the plain serde_json control (only when a
    /// tested string holds a character Go escapes), then the apijson patch, which must apply.
    async fn check_applies(
        &self,
        tally: &mut Tally,
        live: &StatefulSet,
        records: &BTreeMap<u32, Record>,
    ) -> Result<StatefulSet, String> {
        let name = live.name_any();
        let facts = set_facts(live);
        if facts.template.is_none() {
            return Err("set_facts saw no template (blank?)".into());
        }
        let ops = record_ops(&facts, records);
        let template = facts.template.as_deref().unwrap_or_default();
        if has_go_escape(template) || facts.record_raw.as_deref().is_some_and(has_go_escape) {
            match self.send_plain(&name, &ops).await {
                Sent::Refused(_) => tally.controls += 1,
                Sent::Applied(_) => {
                    return Err(
                        "control: the same patch as plain serde_json was applied, though a tested \
                         string holds a character Go escapes"
                            .into(),
                    );
                }
                Sent::Other(e) => return Err(format!("control: {e}")),
            }
        }
        match self.send_go(&name, &ops, false).await {
            Sent::Applied(after) => {
                tally.applied += 1;
                let want = format_records(records);
                if annotation(&after, RECORD_ANNOTATION) != Some(want.as_str()) {
                    return Err("the applied patch did not leave the new record".into());
                }
                if annotation(&after, TEMPLATE_ANNOTATION) != Some(template) {
                    return Err("the applied patch changed the template annotation".into());
                }
                Ok(*after)
            }
            Sent::Refused(message) => Err(format!(
                "ENCODING MISMATCH: the record patch of an unchanged set was refused: {message}{}",
                facts
                    .record_raw
                    .as_deref()
                    .map(|r| format!("\n{}", describe("previous record", r)))
                    .unwrap_or_default()
            )),
            Sent::Other(e) => Err(format!("the record patch failed: {e}")),
        }
    }

    /// One case (see the module doc). Errors describe what failed.
    async fn case(
        &self,
        tally: &mut Tally,
        rng: &mut Rng,
        name: &str,
        create: bool,
        before: &str,
    ) -> Result<(), String> {
        let fail = |step: &str, e: String, text: &str| -> String {
            format!("{step}: {e}\n{}", describe("annotation", text))
        };
        self.put_template(name, before, create)
            .await
            .map_err(|e| fail("write S", e, before))?;
        let live = self
            .read(name, before)
            .await
            .map_err(|e| fail("read S", e, before))?;
        let applied = self
            .check_applies(tally, &live, &random_records(rng, name))
            .await
            .map_err(|e| fail("apply S", e, before))?;

        // The stale patch: built from the read the apply returned, sent after the change.
        let stale_facts = set_facts(&applied);
        let stale = record_ops(&stale_facts, &random_records(rng, name));
        let (after, how) = changed(rng, before);
        let context = |e: String| {
            format!(
                "change ({how}): {e}\n{}{}",
                describe("S", before),
                describe("S'", &after)
            )
        };
        let patch = json!({"metadata": {"annotations": {TEMPLATE_ANNOTATION: &after}}});
        let updated = self
            .sets
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| context(format!("the API server did not take S': {e}")))?;
        if updated.metadata.generation != applied.metadata.generation
            || annotation(&updated, RECORD_ANNOTATION) != stale_facts.record_raw.as_deref()
        {
            return Err(context(
                "the generation or the record changed with the annotation; the stale patch \
                 would prove nothing"
                    .into(),
            ));
        }
        match self.send_go(name, &stale, false).await {
            Sent::Refused(_) => {}
            Sent::Applied(_) => {
                return Err(context(
                    "the stale record patch was APPLIED although the template changed".into(),
                ));
            }
            Sent::Other(e) => return Err(context(format!("the stale patch failed: {e}"))),
        }
        // The API server's 422 does not say which op failed: the same patch without the `test`
        // op on the template, as a dry run, must apply, so the template was the reason.
        let template_path = format!(
            "/metadata/annotations/{}",
            TEMPLATE_ANNOTATION.replace('~', "~0").replace('/', "~1")
        );
        let without: Vec<Value> = stale
            .iter()
            .filter(|op| !(op["op"] == "test" && op["path"] == template_path.as_str()))
            .cloned()
            .collect();
        if without.len() + 1 != stale.len() {
            return Err(context(format!(
                "the record patch has no single test op on {template_path}: {stale:?}"
            )));
        }
        match self.send_go(name, &without, true).await {
            Sent::Applied(_) => tally.refused += 1,
            Sent::Refused(m) | Sent::Other(m) => {
                return Err(context(format!(
                    "the stale patch was refused, but without its test on the template it is \
                     refused too (dry run): {m}"
                )));
            }
        }

        let live = self.read(name, &after).await.map_err(&context)?;
        self.check_applies(tally, &live, &random_records(rng, name))
            .await
            .map_err(|e| fail("apply S'", e, &after))?;
        Ok(())
    }

    /// After a failed apply: which single characters of `text` fail alone, as `a<c>b`.
    async fn probe_chars(&self, name: &str, text: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for c in text.chars() {
            if !seen.contains(&c) && seen.len() < 64 {
                seen.push(c);
            }
        }
        let mut failing = Vec::new();
        for c in seen {
            let probe = format!("a{c}b");
            if self.put_template(name, &probe, false).await.is_err() {
                continue;
            }
            let Ok(live) = self.read(name, &probe).await else {
                continue;
            };
            let ops = record_ops(&set_facts(&live), &BTreeMap::new());
            if let Sent::Refused(_) = self.send_go(name, &ops, false).await {
                failing.push(format!("{c:?} (U+{:04X})", u32::from(c)));
            }
        }
        failing
    }

    async fn run(&self, index: usize, cases: &[(usize, String)], seed: u64) -> Tally {
        let mut tally = Tally::default();
        let mut failed = false;
        for (n, (case, before)) in cases.iter().enumerate() {
            let name = format!("rec-{index}-{}", n / CASES_PER_SET);
            // A new set every CASES_PER_SET cases; after a failure, again if the set is missing.
            let create = n % CASES_PER_SET == 0
                || (failed && matches!(self.sets.get_opt(&name).await, Ok(None)));
            let mut rng = Rng::new(seed ^ (*case as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
            rng.next_u64();
            failed = false;
            if let Err(e) = self.case(&mut tally, &mut rng, &name, create, before).await {
                failed = true;
                let mut report = format!("case {case} (StatefulSet {name}): {e}");
                if e.contains("ENCODING MISMATCH") && tally.failures.len() < MAX_REPORTED {
                    let chars = self.probe_chars(&name, before).await;
                    let _ = writeln!(report, "  characters refused alone as a<c>b: {chars:?}");
                }
                tally.failures.push(report);
            }
        }
        tally
    }
}

fn classify(result: kube::Result<StatefulSet>) -> Sent {
    match result {
        Ok(set) => Sent::Applied(Box::new(set)),
        Err(kube::Error::Api(s)) if s.code == 422 => Sent::Refused(s.message.clone()),
        Err(kube::Error::Api(s)) => Sent::Other(format!("HTTP {}: {}", s.code, s.message)),
        Err(e) => Sent::Other(e.to_string()),
    }
}

fn env_number(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    let raw = raw.trim();
    let parsed = match raw.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => raw.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={raw:?}: {e}")))
}

#[test]
fn encodings_differ_exactly_on_go_escapes() {
    // The premise of the control, checked offline over the same generator.
    let mut rng = Rng::new(DEFAULT_SEED);
    for _ in 0..2000 {
        let text = random_text(&mut rng);
        let go = apijson::to_vec(&text).expect("apijson encodes");
        let plain = serde_json::to_vec(&text).expect("serde_json encodes");
        assert_eq!(
            go != plain,
            has_go_escape(&text),
            "{}",
            describe("text", &text)
        );
        let back: String = serde_json::from_slice(&go).expect("apijson output is JSON");
        assert_eq!(back, text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn record_patches_match_the_api_servers_encoding() {
    let cases_wanted = env_number("RECORD_CASES").map_or(DEFAULT_CASES, |n| n as usize);
    let seed = env_number("RECORD_SEED").unwrap_or(DEFAULT_SEED);
    eprintln!(
        "records: seed {seed} (0x{seed:x}), {cases_wanted} cases; RECORD_SEED/RECORD_CASES to change"
    );

    let mut rng = Rng::new(seed);
    let mut cases: Vec<String> = fixed_cases();
    cases.truncate(cases_wanted);
    while cases.len() < cases_wanted {
        cases.push(random_text(&mut rng));
    }

    let cluster = Cluster::connect().await;
    let ns = cluster.namespace("e2e-records").await;
    let started = Instant::now();
    let workers: Vec<Worker> = (0..WORKERS)
        .map(|_| Worker {
            client: ns.client(),
            sets: ns.api(),
            namespace: ns.name.clone(),
        })
        .collect();
    let shares: Vec<Vec<(usize, String)>> = (0..WORKERS)
        .map(|w| {
            cases
                .iter()
                .enumerate()
                .filter(|(i, _)| i % WORKERS == w)
                .map(|(i, s)| (i, s.clone()))
                .collect()
        })
        .collect();
    let tallies = futures::future::join_all(
        workers
            .iter()
            .zip(&shares)
            .enumerate()
            .map(|(i, (worker, share))| worker.run(i, share, seed)),
    )
    .await;

    let mut total = Tally::default();
    for t in tallies {
        total.applied += t.applied;
        total.refused += t.refused;
        total.controls += t.controls;
        total.failures.extend(t.failures);
    }
    let elapsed = started.elapsed();
    println!(
        "records: {} cases, seed {seed}, {} applied, {} refused",
        cases.len(),
        total.applied,
        total.refused
    );
    println!(
        "records: {} plain serde_json controls refused, {} failures, {:.1} s",
        total.controls,
        total.failures.len(),
        elapsed.as_secs_f64()
    );
    if !total.failures.is_empty() {
        let shown: Vec<&str> = total
            .failures
            .iter()
            .take(MAX_REPORTED)
            .map(String::as_str)
            .collect();
        panic!(
            "{} of {} cases failed (seed {seed}; first {}):\n\n{}",
            total.failures.len(),
            cases.len(),
            shown.len(),
            shown.join("\n")
        );
    }
    assert_eq!(total.applied, 2 * cases.len());
    assert_eq!(total.refused, cases.len());
}
