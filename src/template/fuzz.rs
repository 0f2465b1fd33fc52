//! Fuzz harness on stable Rust: parse, validate and render over generated annotations.
//!
//! Three generators run side by side: (a) arbitrary strings, (b) token soup of YAML and JSON
//! fragments (anchors, aliases, merge keys, tags, deep brackets, document markers), (c) mutations
//! of valid templates. For every input: no panic, an error maps to a template `Reason` and has a
//! short message, success renders an object under the size cap that carries the confirm gate once.
//! At the end the process's peak RSS must stay under [`MAX_PEAK_RSS_MIB`].
//!
//! `FUZZ_CASES` sets the total number of inputs (default [`DEFAULT_CASES`]); `make fuzz` runs a
//! million. A failure prints the minimal input; `PROPTEST_RNG_SEED` replays a run.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::tests::{GOOD, selector, target, templates};
use super::*;
use crate::reason::Reason;

/// Inputs per `cargo test` run, split over the three generators.
const DEFAULT_CASES: u32 = 100_000;
/// Peak resident memory of the whole test process allowed after the run.
const MAX_PEAK_RSS_MIB: u64 = 512;

/// What one generator saw.
#[derive(Default)]
struct Tally {
    inputs: u64,
    valid: u64,
    errors: BTreeMap<Reason, u64>,
    slowest: Duration,
    /// Time spent in parse and render (the rest is generating inputs).
    busy: Duration,
    /// Time of the whole run of this generator.
    wall: Duration,
    largest_input: usize,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.inputs += other.inputs;
        self.valid += other.valid;
        for (reason, n) in &other.errors {
            *self.errors.entry(*reason).or_default() += n;
        }
        self.slowest = self.slowest.max(other.slowest);
        self.busy += other.busy;
        self.largest_input = self.largest_input.max(other.largest_input);
    }
}

/// The properties every input must satisfy.
fn check(raw: &str, tally: &RefCell<Tally>) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let outcome = parse(raw, &templates(), Some(&selector()))
        .map(|t| t.render(&target()))
        .map(|rendered| rendered.map(|pod| (json_size(&pod), pod)));
    let elapsed = started.elapsed();
    let mut tally = tally.borrow_mut();
    tally.inputs += 1;
    tally.slowest = tally.slowest.max(elapsed);
    tally.busy += elapsed;
    tally.largest_input = tally.largest_input.max(raw.len());
    match outcome {
        Ok(Ok((size, pod))) => {
            tally.valid += 1;
            prop_assert!(pod.is_object(), "not an object: {pod}");
            prop_assert!(size <= MAX_POD_BYTES, "rendered {size} bytes");
            let ours = pod["spec"]["schedulingGates"]
                .as_array()
                .map(|gates| {
                    gates
                        .iter()
                        .filter(|g| g["name"] == naming::CONFIRM_GATE)
                        .count()
                })
                .unwrap_or_default();
            prop_assert_eq!(ours, 1, "confirm gate count");
        }
        Ok(Err(e)) => {
            return Err(TestCaseError::fail(format!(
                "parsed but did not render: {e}"
            )));
        }
        Err(e) => {
            let reason = e.reason();
            *tally.errors.entry(reason).or_default() += 1;
            prop_assert!(
                reason.is_warning() && reason.as_str().starts_with("CleanupTemplate"),
                "{reason} is not a template reason"
            );
            let message = e.to_string();
            prop_assert!(message.len() <= 300, "{} bytes: {message}", message.len());
        }
    }
    Ok(())
}

/// Runs `strategy` for `cases` inputs; the failure (after shrinking), if any, as text.
fn run<S>(name: &str, cases: u32, strategy: S) -> Result<Tally, String>
where
    S: Strategy,
    S::Value: AsRef<str>,
{
    let mut config = Config::with_cases(cases);
    config.failure_persistence = None;
    config.max_shrink_iters = 2_000;
    let tally = RefCell::new(Tally::default());
    let started = Instant::now();
    TestRunner::new(config)
        .run(&strategy, |raw| check(raw.as_ref(), &tally))
        .map_err(|e| format!("{name}: {e}"))?;
    let mut tally = tally.into_inner();
    tally.wall = started.elapsed();
    Ok(tally)
}

// --- (a) arbitrary strings ---

/// Any characters, printable ASCII with newlines, and arbitrary bytes made UTF-8 (byte vectors
/// are the cheapest to generate, which matters in a debug build).
fn strings() -> impl Strategy<Value = String> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..100).prop_map(String::from_iter),
        bytes().prop_map(|b| {
            b.iter()
                .map(|x| match x % 97 {
                    95 => '\n',
                    96 => '\t',
                    printable => char::from(b' ' + printable),
                })
                .collect()
        }),
        bytes().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

// --- (b) token soup ---

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ": ",
    ",",
    " ",
    "\n",
    "\n  ",
    "\n    ",
    "- ",
    "\t",
    "&a ",
    "&b ",
    "&c ",
    "*a",
    "*b",
    "*c",
    "<<: *a",
    "<<: [*a, *b]",
    "<<: ",
    "!!merge <<: ",
    "---\n",
    "...\n",
    "\"",
    "'",
    "\\",
    "#",
    "? ",
    "|\n",
    ">-\n",
    "!!str ",
    "!!map ",
    "!!seq ",
    "!!binary ",
    "!custom ",
    "!<tag:x> ",
    "%YAML 1.2\n",
    "%TAG !e! tag:example.com,2000:\n",
    "!e!x ",
    "null",
    "~",
    "1e400",
    "-0",
    "0x1F",
    "0o17",
    ".inf",
    ".nan",
    "true",
    "yes",
    "1_000",
    "\\u0000",
    "\u{feff}",
    "\u{0}",
    "é",
    "x",
    "spec",
    "metadata",
    "containers",
    "initContainers",
    "name",
    "image",
    "env",
    "labels",
    "annotations",
    "volumes",
    "schedulingGates",
    "restartPolicy",
    "Never",
    "Always",
    "kind",
    "Pod",
    "apiVersion",
    "v1",
    "app",
    "web",
    "data",
    "emptyDir",
    "persistentVolumeClaim",
    "ownerReferences",
    "finalizers",
    "{\"name\":\"m\"}",
    "containers: [{name: m}]",
    "spec: {containers: [{name: m, image: x}]}",
    "statefulsets.kubernetes.io/scaledown-confirm",
];

fn token() -> impl Strategy<Value = String> {
    // Alias chains cost the most (each can replay up to the limit): about one input in five.
    prop_oneof![
        200 => proptest::sample::select(TOKENS).prop_map(str::to_string),
        5 => (0usize..80, 0usize..80).prop_map(|(open, close)| {
            format!("{}{}", "[".repeat(open), "]".repeat(close))
        }),
        5 => (0usize..80).prop_map(|n| "{a: ".repeat(n) + &"}".repeat(n)),
        1 => (1usize..12, 1usize..12).prop_map(|(levels, width)| alias_chain(levels, width)),
    ]
}

/// An alias bomb of any shape: `levels` anchors, each holding `width` aliases of the one before.
fn alias_chain(levels: usize, width: usize) -> String {
    let mut yaml = String::from("\nl0: &l0 [x]\n");
    for level in 1..levels {
        let items = vec![format!("*l{}", level - 1); width].join(", ");
        yaml.push_str(&format!("l{level}: &l{level} [{items}]\n"));
    }
    yaml
}

fn token_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(token(), 0..100).prop_map(|tokens| tokens.concat())
}

// --- (c) mutations of valid templates ---

const VALID: &[&str] = &[
    GOOD,
    "metadata:\n  labels: {app: c}\nspec:\n  containers:\n  - name: m\n    image: x\n    env: [{name: A, value: \"1\"}]\n",
    "base: &c {name: m, image: x}\nspec:\n  restartPolicy: Never\n  containers: [*c]\n  initContainers: [{<<: *c, name: i}]\n",
    r#"{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{"a":"b"}},"spec":{"schedulingGates":[{"name":"x"}],"containers":[{"name":"m","image":"x","volumeMounts":[{"name":"data","mountPath":"/d"}]}],"volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"c"}}]}}"#,
];

#[derive(Clone, Debug)]
enum Mutation {
    Insert(usize, String),
    Delete(usize, usize),
    /// Copies a range to a position: repeated, this grows the input fast.
    Duplicate(usize, usize, usize),
    Replace(usize, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, token()).prop_map(|(at, t)| Mutation::Insert(at, t)),
        (at, 1usize..40).prop_map(|(at, n)| Mutation::Delete(at, n)),
        (at, 1usize..400, any::<usize>()).prop_map(|(at, n, to)| Mutation::Duplicate(at, n, to)),
        (at, any::<char>()).prop_map(|(at, c)| Mutation::Replace(at, c)),
    ]
}

/// The char boundary at or before `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut i = at % (text.len() + 1);
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(mut text: String, mutations: &[Mutation]) -> String {
    for m in mutations {
        match m {
            Mutation::Insert(at, t) => text.insert_str(boundary(&text, *at), t),
            Mutation::Delete(at, n) => {
                let start = boundary(&text, *at);
                let end = boundary(&text, start.saturating_add(*n).min(text.len()));
                text.replace_range(start..end, "");
            }
            Mutation::Duplicate(at, n, to) => {
                let start = boundary(&text, *at);
                let end = boundary(&text, start.saturating_add(*n).min(text.len()));
                let copy = text[start..end].to_string();
                text.insert_str(boundary(&text, *to), &copy);
            }
            Mutation::Replace(at, c) => {
                let start = boundary(&text, *at);
                let end = text[start..]
                    .chars()
                    .next()
                    .map_or(start, |c| start + c.len_utf8());
                text.replace_range(start..end, c.encode_utf8(&mut [0; 4]));
            }
        }
    }
    text
}

fn mutations() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(VALID),
        proptest::collection::vec(mutation(), 1..6),
    )
        .prop_map(|(base, ms)| mutate(base.to_string(), &ms))
}

/// The process's peak resident set size in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[test]
fn fuzz_parse_validate_render() {
    let total: u32 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let each = total.div_ceil(3);
    let started = Instant::now();
    // One thread per generator, so the run uses every core.
    let results = std::thread::scope(|scope| {
        let handles = [
            scope.spawn(move || run("(a) strings", each, strings())),
            scope.spawn(move || run("(b) token soup", each, token_soup())),
            scope.spawn(move || run("(c) mutations", each, mutations())),
        ];
        handles.map(|h| h.join().map_err(|_| "a fuzz thread panicked".to_string()))
    });
    let elapsed = started.elapsed();
    let mut sum = Tally::default();
    let mut failures = Vec::new();
    for (name, result) in ["strings", "token soup", "mutations"].iter().zip(results) {
        match result.and_then(|r| r) {
            Ok(tally) => {
                println!(
                    "fuzz {name}: {} inputs, {} valid, {:?}, {:.1} s in parse and render of {:.1} s",
                    tally.inputs,
                    tally.valid,
                    tally.errors,
                    tally.busy.as_secs_f64(),
                    tally.wall.as_secs_f64()
                );
                sum.add(&tally);
            }
            Err(e) => failures.push(e),
        }
    }
    let peak = peak_rss_mib().expect("VmHWM in /proc/self/status");
    // Straight to stderr, past the test harness's capture: the count shows in every run.
    let summary = format!(
        "fuzz: {} inputs, {} panics or failed properties, {} valid, {:.1} s, slowest input {:?}, largest input {} bytes, peak RSS {peak} MiB (bound {MAX_PEAK_RSS_MIB} MiB)\n",
        sum.inputs,
        failures.len(),
        sum.valid,
        elapsed.as_secs_f64(),
        sum.slowest,
        sum.largest_input,
    );
    std::io::stderr()
        .write_all(summary.as_bytes())
        .expect("writes to stderr");
    assert!(
        failures.is_empty(),
        "fuzz failures:\n{}",
        failures.join("\n")
    );
    assert!(
        sum.inputs >= u64::from(each) * 3,
        "ran {} inputs, wanted {}",
        sum.inputs,
        each * 3
    );
    assert!(
        sum.valid > 0 && sum.errors.len() >= 3,
        "the generators reach too little: {} valid, errors {:?}",
        sum.valid,
        sum.errors
    );
    assert!(
        peak < MAX_PEAK_RSS_MIB,
        "peak RSS {peak} MiB is over {MAX_PEAK_RSS_MIB} MiB"
    );
}
