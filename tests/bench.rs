//! `make bench [SCENARIO=...] [SEED=...]`: the controller's benchmark on the local control plane.
//!
//! Scenarios (each a preset of the parameters below; any parameter can be overridden):
//! - `single`: 1 set of 2 scaled to 1, ten rounds one after another (the latency floor);
//! - `sets20`: 20 sets of 3 scaled to 2 at once;
//! - `sets500`: 500 sets of 2 scaled to 1 at once, in one namespace;
//! - `sets5000`: 5,000 sets of 2 scaled to 1 at once, in 10 namespaces of 500 (`--set-namespaces`
//!   spreads the sets of any scale-down scenario over that many namespaces); the controller starts
//!   once the 10,000 pods run (`--start-after-setup 1`), so its start → ready lists them all. Not
//!   in `make bench`'s default list (setup alone takes many minutes): `make bench SCENARIO=sets5000`;
//! - `corpus`: 100 sets of 2 scaled to 1 at once, each with its own cleanup template full of shell
//!   operators, here-docs, non-ASCII text, U+2028, CRLF and YAML block scalars (`bench/corpus.rs`;
//!   `--corpus 1` gives any scale-down scenario those templates). Not in `make bench`'s default
//!   list: `make bench SCENARIO=corpus`;
//! - `idle`: 10,000 background pods in 20 namespaces and 1,000 annotated sets of one pod in 10
//!   namespaces; the controller starts on that and then sits idle;
//! - `podbound`: claims bound to pods (`--pod-bound-claims`, `bench/podbound.rs`): 1,000 annotated
//!   claims and their pods created among 9,000 background pods in 10 namespaces, then the pods
//!   deleted; per round the controller's requests and passes, pod created → owner added on its
//!   claim, pod gone → claim gone. Not in `make bench`'s default list: `make bench SCENARIO=podbound`.
//! - `realnode`: 10 sets of 3 scaled to 1 at once, their pods and the cleanup pods (2 s of sleep)
//!   real containers on the real node (`--real-node 1`, `bench/realnode.rs`); per ordinal also
//!   stateful pod gone → cleanup container running and cleanup container exited → claim deleted.
//!   Needs the real node (`make bench SCENARIO=realnode` starts the cluster with it; the run fails
//!   at once without it). Not in `make bench`'s default list.
//!
//! The scale-down scenarios run twice: with the controller (`controller`), and with Kubernetes
//! deleting the claims itself (`native`: `persistentVolumeClaimRetentionPolicy.whenScaled:
//! Delete`, no controller), each phase in its own namespace, the second after the first's
//! namespace is gone. Watches record every pod and claim change; per orphaned ordinal the run
//! reports when the stateful pod was gone, the cleanup pod created, released (its scheduling gate
//! removed) and Succeeded, and the claim deleted and gone; and every cleanup pod that went away
//! before it started, with who sent the DELETE (the API server's audit log, `bench/audit.rs`), as
//! well as the controller's refused record patches. The controller's RSS (sampled from /proc every 200 ms), CPU seconds, its
//! own request counters (`scaledown_api_requests_total` on /metrics) and start-to-ready time
//! are recorded too, as are the control plane's CPU and client-side throttling.
//!
//! Output: `bench/results/<scenario>-<UTC time>.json` (see bench/README.md for the fields);
//! `bench/report.py` turns the results into BENCHMARKS.md and the plots.
//!
//! On a cluster that other runs use at the same time (namespaces besides the system ones), the
//! controller watches only the phase's namespace (`--namespace`), so it neither acts on their sets
//! nor they on its; the result records that (`phases[].cluster`). The controller takes one
//! namespace or all of them, so a phase of several namespaces (`--set-namespaces` above 1) runs
//! only on a cluster of its own: on a shared one it is refused (`phases[].setup_refused`).
//!
//! A result records its scenario's preset (`preset`) beside the parameters it ran with
//! (`params`): a run whose parameters differ from the preset (say `--sets 300` for `sets5000`)
//! is a reduced run, and `bench/report.py` labels it with the differences.
//!
//! Arguments: `--scenario NAME --seed N [--sets N --claims N --replicas N --to N --rounds N --pods N
//! --pod-namespaces N --set-namespaces N --start-after-setup 0|1 --idle-seconds N --cleanup-seconds X
//! --timeout SECS --corpus 0|1 --real-node 0|1 --modes controller,native --controller-arg FLAG ...
//! --out DIR]`, or `--self-test`.

mod support;

#[path = "bench/audit.rs"]
mod audit;
#[path = "bench/corpus.rs"]
mod corpus;
#[path = "bench/idle.rs"]
mod idle;
#[path = "bench/podbound.rs"]
mod podbound;
#[path = "bench/probe.rs"]
mod probe;
#[path = "bench/realnode.rs"]
mod realnode;
#[path = "bench/scaledown.rs"]
mod scaledown;
#[path = "bench/timeline.rs"]
mod timeline;
#[path = "bench/under_test.rs"]
mod under_test;
#[path = "bench/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use scaledown::Mode;

/// The scenarios. `make bench` runs all but `sets5000`, `corpus`, `podbound` and `realnode` by
/// default (the Makefile's list), in this order; `make bench SCENARIO=corpus` runs that one.
const SCENARIOS: [&str; 8] = [
    "single", "sets20", "sets500", "sets5000", "corpus", "idle", "podbound", "realnode",
];

struct Options {
    scenario: String,
    seed: u64,
    values: BTreeMap<&'static str, String>,
    /// The scenario's preset, before the overrides.
    preset: BTreeMap<&'static str, String>,
    modes: Vec<Mode>,
    controller_args: Vec<String>,
    out: PathBuf,
    self_test: bool,
}

/// The preset of a scenario: (parameter, value).
fn preset(scenario: &str) -> Option<Vec<(&'static str, &'static str)>> {
    let common = [("timeout", "900"), ("cleanup-seconds", "1")];
    let own: &[(&str, &str)] = match scenario {
        "single" => &[
            ("sets", "1"),
            ("replicas", "2"),
            ("to", "1"),
            ("rounds", "10"),
        ],
        "sets20" => &[
            ("sets", "20"),
            ("replicas", "3"),
            ("to", "2"),
            ("rounds", "1"),
        ],
        "sets500" => &[
            ("sets", "500"),
            ("replicas", "2"),
            ("to", "1"),
            ("rounds", "1"),
        ],
        "sets5000" => &[
            ("sets", "5000"),
            ("set-namespaces", "10"),
            ("replicas", "2"),
            ("to", "1"),
            ("rounds", "1"),
            ("start-after-setup", "1"),
            // Per wait: 10,000 pods to start, 5,000 cleanups, 10 namespaces to delete.
            ("timeout", "2400"),
        ],
        "corpus" => &[
            ("sets", "100"),
            ("replicas", "2"),
            ("to", "1"),
            ("rounds", "1"),
            ("corpus", "1"),
        ],
        "idle" => &[
            ("pods", "10000"),
            ("pod-namespaces", "20"),
            ("sets", "1000"),
            ("set-namespaces", "10"),
            ("idle-seconds", "90"),
        ],
        "podbound" => &[
            ("claims", "1000"),
            ("pods", "10000"),
            ("pod-namespaces", "10"),
        ],
        // The cleanup container sleeps 2 s, so that the kubelet (which looks at its containers
        // every second) reports it running before it exits.
        "realnode" => &[
            ("sets", "10"),
            ("replicas", "3"),
            ("to", "1"),
            ("rounds", "1"),
            ("real-node", "1"),
            ("cleanup-seconds", "2"),
        ],
        _ => return None,
    };
    // A scenario's own value overrides the common one (the later entry wins in `options`).
    Some(common.iter().chain(own).copied().collect())
}

const PARAMETERS: [&str; 15] = [
    "sets",
    "claims",
    "replicas",
    "to",
    "rounds",
    "pods",
    "pod-namespaces",
    "set-namespaces",
    "start-after-setup",
    "idle-seconds",
    "cleanup-seconds",
    "timeout",
    "corpus",
    "real-node",
    "seed",
];

fn options() -> Result<Options, String> {
    let mut o = Options {
        scenario: String::new(),
        seed: 42,
        values: BTreeMap::new(),
        preset: BTreeMap::new(),
        modes: vec![Mode::Controller, Mode::Native],
        controller_args: Vec::new(),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results"),
        self_test: false,
    };
    let mut overrides = BTreeMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let flag = arg.trim_start_matches("--");
        if flag == "self-test" {
            o.self_test = true;
            continue;
        }
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match flag {
            "scenario" => o.scenario = value,
            "out" => o.out = PathBuf::from(value),
            "controller-arg" => o.controller_args.push(value),
            "modes" => {
                o.modes = value
                    .split(',')
                    .map(|m| match m {
                        "controller" => Ok(Mode::Controller),
                        "native" => Ok(Mode::Native),
                        _ => Err(format!("unknown mode {m:?}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => {
                let name = PARAMETERS
                    .iter()
                    .find(|p| **p == flag)
                    .ok_or(format!("unknown argument {arg:?}"))?;
                value
                    .parse::<f64>()
                    .map_err(|_| format!("{arg} must be a number, got {value:?}"))?;
                overrides.insert(*name, value);
            }
        }
    }
    if o.self_test {
        // `--self-test --corpus 1 --sets 100` checks the templates of a 100-set corpus run.
        o.values = overrides;
        return Ok(o);
    }
    let preset = preset(&o.scenario).ok_or(format!(
        "--scenario must be one of {SCENARIOS:?}, got {:?}",
        o.scenario
    ))?;
    o.preset = preset
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    o.values = o.preset.clone();
    o.values.extend(overrides);
    if let Some(seed) = o.values.remove("seed") {
        o.seed = seed.parse().map_err(|_| "--seed must be an integer")?;
    }
    Ok(o)
}

impl Options {
    fn number(&self, name: &str) -> f64 {
        self.values
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
    fn count(&self, name: &str) -> usize {
        self.number(name) as usize
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.number("timeout"))
    }
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "bench: {e}\nusage: bench --scenario {{{}}} [--seed N] [--PARAMETER VALUE ...] | --self-test",
                SCENARIOS.join("|")
            );
            return ExitCode::from(2);
        }
    };
    let corpus_sets = if options.number("corpus") > 0.0 {
        options.count("sets")
    } else {
        corpus::VARIANTS
    };
    let tests = [
        timeline::self_test(),
        audit::self_test(),
        corpus::self_test(corpus_sets, options.seed),
        scaledown::self_test(),
        probe::self_test(),
    ];
    match tests.into_iter().collect::<Result<Vec<usize>, String>>() {
        Ok(n) => println!(
            "bench: self-test: {} checks of the timeline, latency, audit-log, corpus, placement and histogram code passed",
            n.iter().sum::<usize>()
        ),
        Err(e) => {
            println!("bench: self-test FAILED: {e}");
            return ExitCode::from(2);
        }
    }
    if options.self_test {
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if options.number("real-node") > 0.0
        && let Err(e) = runtime.block_on(realnode::require())
    {
        println!("bench: FAILED before starting: {e}");
        return ExitCode::from(2);
    }
    let result = runtime.block_on(run(&options));
    let path = write(&options, &result);
    println!("bench: wrote {}", path.display());
    let complete = result["phases"]
        .as_array()
        .is_some_and(|phases| phases.iter().all(phase_complete));
    if complete {
        ExitCode::SUCCESS
    } else {
        println!("bench: some phase did not complete (see the JSON)");
        ExitCode::FAILURE
    }
}

fn phase_complete(phase: &Value) -> bool {
    phase["setup_ok"] == json!(true)
        && phase["rounds"]
            .as_array()
            .is_none_or(|rounds| rounds.iter().all(|r| r["complete"] == json!(true)))
}

async fn run(o: &Options) -> Value {
    let started_at = utc_now("%Y-%m-%dT%H:%M:%SZ");
    let load_start = probe::loadavg();
    // Read now, not when the result is written: a run of the size of `sets5000` lasts long enough
    // for commits to land meanwhile, and the binary under test is this one's.
    let versions = probe::versions();
    let t0 = Instant::now();
    let mut phases = Vec::new();
    if o.scenario == "idle" {
        let p = idle::Params {
            pods: o.count("pods"),
            pod_namespaces: o.count("pod-namespaces"),
            sets: o.count("sets"),
            set_namespaces: o.count("set-namespaces"),
            idle_seconds: o.count("idle-seconds") as u64,
            timeout: o.timeout(),
        };
        phases.push(idle::run(&p, o.seed, &o.controller_args).await);
    } else if o.scenario == "podbound" {
        let p = podbound::Params {
            claims: o.count("claims"),
            pods: o.count("pods"),
            namespaces: o.count("pod-namespaces"),
            timeout: o.timeout(),
        };
        phases.push(podbound::run(&p, o.seed, &o.controller_args).await);
    } else {
        let p = scaledown::Params {
            sets: o.count("sets"),
            replicas: o.count("replicas") as i32,
            to: o.count("to") as i32,
            rounds: o.count("rounds").max(1),
            set_namespaces: o.count("set-namespaces").max(1),
            start_after_setup: o.number("start-after-setup") > 0.0,
            cleanup_seconds: o.number("cleanup-seconds"),
            timeout: o.timeout(),
            corpus: o.number("corpus") > 0.0,
            real_node: o.number("real-node") > 0.0,
        };
        for mode in &o.modes {
            phases.push(scaledown::run(&o.scenario, &p, *mode, o.seed, &o.controller_args).await);
        }
    }
    let command = std::env::var("BENCH_COMMAND")
        .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" "));
    let params: BTreeMap<&str, f64> = o.values.keys().map(|k| (*k, o.number(k))).collect();
    let preset: BTreeMap<&str, f64> = o
        .preset
        .iter()
        .map(|(k, v)| (*k, v.parse().unwrap_or(0.0)))
        .collect();
    json!({
        "schema": 1,
        "scenario": o.scenario,
        "seed": o.seed,
        "params": params,
        "preset": preset,
        "controller_args": o.controller_args,
        "command": command,
        "started_at": started_at,
        "duration_s": probe::round3(t0.elapsed().as_secs_f64()),
        "machine": probe::machine(),
        "loadavg_start": load_start,
        "loadavg_end": probe::loadavg(),
        "versions": versions,
        "cluster_id": std::fs::read_to_string(support::cluster_state_dir().join("cluster-id")).unwrap_or_default().trim(),
        "phases": phases,
    })
}

fn utc_now(format: &str) -> String {
    std::process::Command::new("date")
        .args(["-u", &format!("+{format}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn write(o: &Options, result: &Value) -> PathBuf {
    std::fs::create_dir_all(&o.out).expect("create the results directory");
    let path = o
        .out
        .join(format!("{}-{}.json", o.scenario, utc_now("%Y%m%dT%H%M%SZ")));
    let text = serde_json::to_string_pretty(result).expect("JSON");
    std::fs::write(&path, text + "\n").expect("write the result");
    path
}
