//! `make chaos ROUNDS=N SEED=S`: a seeded chaos run against the local control plane, with an
//! invariant checker over a recording of everything that happened.
//!
//! Seven StatefulSets in two namespaces (OrderedReady and Parallel, one and two claim templates,
//! one whose cleanup always fails, and two whose claim names collide, `data` + `my-db` and
//! `data-my` + `db`, the second not taking part) and two controller instances with leader
//! election, each talking to the API server through a Sieve proxy of its own (`chaos/perturb.rs`).
//! Each round runs under a perturbation drawn from the seed (none, one resource's watch delayed or
//! coalesced, or the writer SIGKILLed right after its n-th write of a kind) and does a seeded mix
//! of scale-downs and scale-ups, SIGKILLed instances, leader failovers, API server restarts,
//! user-deleted cleanup pods, forged pods (made by this runner to look like cleanup pods, on
//! orphaned and on wanted ordinals), and routine operations (`chaos/routine.rs`): a set deleted
//! with orphan, foreground or background propagation and created again under the same name, scale
//! to zero and back, claims made by hand or owned by a ConfigMap, a namespace deleted whole.
//! Then it scales every set to a final size and waits until the controllers are idle.
//! Watches record every pod, claim and set change during the whole run, and the proxies every
//! write of the controllers; after each round the checker looks at the claims deleted and the
//! pods the controllers deleted in it (see `chaos/check.rs` for invariants 1, 2, 6 and 7), and
//! the round fails invariant 3 if it did not settle with no cleanup pod left. At the end every set
//! is deleted (invariant 4).
//!
//! Output: the seed first, per round its perturbation (`round 3: perturbation: pod watch delayed
//! 2000 ms`) and one line when it is done (violations on their own lines before it), the counts
//! of perturbations, and last `chaos: N rounds, seed S, V violations`; the exit code is 0 only without violations. The same
//! seed gives the same perturbations and actions (`--plan-only` prints them without a cluster). Arguments:
//! `--rounds N --seed S [--quiesce-timeout SECS] [--plan-only]`, or
//! `ROUNDS`, `SEED` in the environment. The recording is written to `target/chaos/seed-S.jsonl`,
//! the controllers' logs to `target/e2e-logs/chaos-{a,b}.log`.

mod support;

#[path = "chaos/actions.rs"]
mod actions;
#[path = "chaos/check.rs"]
mod check;
#[path = "chaos/perturb.rs"]
mod perturb;
#[path = "chaos/plan.rs"]
mod plan;
#[path = "chaos/record.rs"]
mod record;
#[path = "chaos/routine.rs"]
mod routine;
#[path = "chaos/settle.rs"]
mod settle;
#[path = "chaos/world.rs"]
mod world;

use std::collections::HashSet;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use check::{Layout, Violation};
use plan::{Named, Rng, plan_round};
use record::Recorder;
use world::World;

struct Options {
    plan_only: bool,
    rounds: usize,
    seed: u64,
    quiesce_timeout: Duration,
}

fn options() -> Result<Options, String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut rounds = env("ROUNDS");
    let mut seed = env("SEED");
    let mut quiesce = env("CHAOS_QUIESCE_TIMEOUT");
    let mut plan_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--plan-only" => {
                plan_only = true;
                continue;
            }
            "--rounds" => &mut rounds,
            "--seed" => &mut seed,
            "--quiesce-timeout" => &mut quiesce,
            other => return Err(format!("unknown argument {other:?}")),
        };
        *slot = Some(args.next().ok_or(format!("{arg} needs a value"))?);
    }
    let number = |what: &str, v: Option<String>, default: u64| -> Result<u64, String> {
        v.map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("{what} must be a number, got {v:?}"))
        })
    };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1);
    Ok(Options {
        plan_only,
        rounds: number("ROUNDS", rounds, 3)? as usize,
        seed: number("SEED", seed, clock)?,
        quiesce_timeout: Duration::from_secs(number("quiesce timeout", quiesce, 120)?),
    })
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "chaos: {e}\nusage: chaos [--rounds N] [--seed S] [--quiesce-timeout SECS] [--plan-only]"
            );
            return ExitCode::from(2);
        }
    };
    println!(
        "chaos: seed {}, {} rounds (replay: make chaos ROUNDS={} SEED={})",
        options.seed, options.rounds, options.rounds, options.seed
    );
    match check::self_test() {
        Ok(n) => println!("chaos: checker self-test: {n} synthetic recordings judged as expected"),
        Err(e) => {
            println!("chaos: checker self-test FAILED: {e}");
            return ExitCode::from(2);
        }
    }
    match plan::self_test() {
        Ok(n) => println!(
            "chaos: plan self-test: {n} rounds drawn twice alike, every perturbation and action drawn, within bounds"
        ),
        Err(e) => {
            println!("chaos: plan self-test FAILED: {e}");
            return ExitCode::from(2);
        }
    }
    if options.plan_only {
        print_plans(&options);
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (rounds, violations) = runtime.block_on(run(&options));
    println!(
        "chaos: {rounds} rounds, seed {}, {violations} violations",
        options.seed
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--plan-only`: what the rounds of this seed will do, without a cluster.
fn print_plans(options: &Options) {
    let sets = plan::sets();
    let mut rng = Rng::new(options.seed);
    for round in 1..=options.rounds {
        let plan = plan_round(&mut rng, &sets);
        let actions: Vec<String> = plan
            .actions
            .iter()
            .map(|(pause, a)| format!("+{pause}ms {}", Named(a, &sets)))
            .collect();
        println!(
            "round {round}: perturbation: {} | {} | finals {:?}",
            plan.perturbation,
            actions.join(", "),
            plan.finals
        );
    }
}

/// Runs the rounds and the final deletion; returns the rounds run and the violations found.
async fn run(options: &Options) -> (usize, usize) {
    let start = Instant::now();
    let sets = plan::sets();
    let recorder = Recorder::new(start);
    let mut world = World::setup(sets.clone(), recorder.clone()).await;
    println!(
        "chaos: namespaces {} and {}, controllers {} and {} (Lease {}/{})",
        world.ns_names[0],
        world.ns_names[1],
        plan::instance_name(0),
        plan::instance_name(1),
        world.ns_names[0],
        world::LEASE
    );
    let initial: Vec<i32> = sets.iter().map(|s| s.initial).collect();
    let mut checker = Checker::default();
    if let Err(left) = world.quiesce(&initial, options.quiesce_timeout).await {
        println!("chaos: the initial sets never settled: {left:?}");
        checker.violations += 1;
        world.teardown(options.seed).await;
        return (0, checker.violations);
    }
    let mut rng = Rng::new(options.seed);
    let mut rounds_run = 0;
    let mut stuck = 0;
    for round in 1..=options.rounds {
        let end = guarded_round(&mut world, &mut rng, &mut checker, round, options).await;
        rounds_run = round;
        let settled = match end {
            RoundEnd::Ran(settled) => settled,
            RoundEnd::Broken(why) => {
                checker.report(&[Violation {
                    invariant: 0,
                    round: round.to_string(),
                    at: start.elapsed(),
                    text: format!("HARNESS: {why}"),
                }]);
                println!("chaos: the control plane is broken; stopping early, no final deletion");
                world.teardown(options.seed).await;
                return (rounds_run, checker.violations);
            }
        };
        stuck = if settled { 0 } else { stuck + 1 };
        if stuck == 3 {
            // Something that never settles is a stall, the failure chaos looks for: count it.
            checker.report(&[Violation {
                invariant: 3,
                round: round.to_string(),
                at: start.elapsed(),
                text: "three rounds in a row did not settle; stopping early".into(),
            }]);
            break;
        }
    }
    world.recorder.set_round(options.rounds + 1);
    let problems = world.delete_all(options.quiesce_timeout).await;
    let mut found: Vec<Violation> = problems
        .into_iter()
        .map(|text| Violation {
            invariant: 4,
            round: "final".into(),
            at: start.elapsed(),
            text,
        })
        .collect();
    found.extend(checker.claims(&world, "final"));
    found.extend(checker.pod_deletes(&mut world, "final"));
    checker.report(&found);
    println!(
        "chaos: control plane: {} claim(s) left Terminating by pvc-protection were touched",
        world.touched_claims.len()
    );
    print_perturbations(&world);
    world.teardown(options.seed).await;
    (rounds_run, checker.violations)
}

/// The perturbations of the run: rounds per kind, stops armed and fired, and the proxies' sums.
fn print_perturbations(world: &World) {
    let counts: Vec<String> = world
        .proxies
        .counts
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let (armed, fired) = world.proxies.stops;
    println!(
        "chaos: perturbations (rounds): {}; stop-after-write fired in {fired} of {armed} rounds",
        counts.join(", ")
    );
    for line in world.proxies.summary() {
        println!("chaos: {line}");
    }
}

/// How a round ended: it ran (and settled or not), or the harness gave up on the control plane.
enum RoundEnd {
    Ran(bool),
    Broken(String),
}

/// How long a control plane component may be seen dead before the round is abandoned: longer than
/// the gap of an API server restart (SIGKILL after 3 s, 1 s down, then a new pid).
const DEAD_FOR: Duration = Duration::from_secs(15);

/// [`run_round`], abandoned as soon as a control plane component has been dead for [`DEAD_FOR`]
/// (etcd on a full disk: every request would hang or fail until the quiesce timeouts, round after
/// round) or when the round overruns four quiesce timeouts plus two minutes. Either is a harness
/// failure that stops the run, with what was dead or how long the round took.
async fn guarded_round(
    world: &mut World,
    rng: &mut Rng,
    checker: &mut Checker,
    round: usize,
    options: &Options,
) -> RoundEnd {
    let budget = options.quiesce_timeout * 4 + Duration::from_secs(120);
    let end = tokio::select! {
        settled = run_round(world, rng, checker, round, options) => RoundEnd::Ran(settled),
        dead = dead_for(DEAD_FOR) => RoundEnd::Broken(format!(
            "control plane component(s) dead for {DEAD_FOR:?}: {}", dead.join("; ")
        )),
        _ = tokio::time::sleep(budget) => RoundEnd::Broken(format!(
            "round {round} still running after {budget:?}; control plane: {}",
            match support::dead_components() {
                dead if dead.is_empty() => "every component alive".to_string(),
                dead => dead.join("; "),
            }
        )),
    };
    if matches!(end, RoundEnd::Ran(_)) {
        let dead = support::dead_components();
        if !dead.is_empty() {
            return RoundEnd::Broken(format!(
                "control plane component(s) died: {}",
                dead.join("; ")
            ));
        }
    }
    end
}

/// Returns once the same control plane components have been dead in every check for `span`.
async fn dead_for(span: Duration) -> Vec<String> {
    let mut since: Option<(Instant, Vec<String>)> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let dead = support::dead_components();
        since = match since {
            _ if dead.is_empty() => None,
            Some((t0, seen)) if seen == dead => {
                if t0.elapsed() >= span {
                    return dead;
                }
                Some((t0, seen))
            }
            _ => Some((Instant::now(), dead)),
        };
    }
}

/// One round; returns whether it settled.
async fn run_round(
    world: &mut World,
    rng: &mut Rng,
    checker: &mut Checker,
    round: usize,
    options: &Options,
) -> bool {
    let t0 = Instant::now();
    world.recorder.set_round(round);
    let plan = plan_round(rng, &world.sets);
    println!("round {round}: perturbation: {}", plan.perturbation);
    let pids = world.pids.clone();
    world.proxies.apply(&plan.perturbation, &pids);
    world.top_up_pvs(true).await;
    let mut notes = Vec::new();
    let mut exits = Vec::new();
    let mut harness = Vec::new();
    for (pause, action) in &plan.actions {
        tokio::time::sleep(Duration::from_millis(*pause)).await;
        exits.extend(world.controllers.revive());
        let note = world.act(action).await;
        if note.starts_with("HARNESS") || note.starts_with("STALL") {
            harness.push(note.clone());
        }
        notes.push(format!("{} -> {note}", Named(action, &world.sets)));
    }
    let settled = world.quiesce(&plan.finals, options.quiesce_timeout).await;
    let perturbed = world.proxies.end();
    let label = round.to_string();
    let mut found = checker.claims(world, &label);
    found.extend(checker.pod_deletes(world, &label));
    let at = world.recorder_elapsed();
    let violation = |invariant: u8, text: String| Violation {
        invariant,
        round: label.clone(),
        at,
        text,
    };
    let quiesce = match &settled {
        Ok(took) => format!("settled in {:.1} s", took.as_secs_f64()),
        Err(left) => {
            found.extend(unsettled_violations(
                left,
                options.quiesce_timeout,
                &violation,
            ));
            "DID NOT SETTLE".to_string()
        }
    };
    found.extend(harness.into_iter().map(|text| {
        let invariant = if text.starts_with("STALL") { 4 } else { 0 };
        violation(invariant, text)
    }));
    for line in world.controllers.panics().into_iter().skip(checker.panics) {
        checker.panics += 1;
        found.push(violation(5, format!("controller panicked: {line}")));
    }
    checker.report(&found);
    let finals: Vec<String> = world
        .sets
        .iter()
        .zip(&plan.finals)
        .map(|(s, n)| format!("{}={n}", s.name))
        .collect();
    let stats = &checker.last;
    println!(
        "round {round}/{} {:.1} s: perturbation: {} ({perturbed}); [{}] finals [{}]; {quiesce}; {} claims deleted, {} cleanup pods, {} forged, unplanned controller exits [{}]; {} violations",
        options.rounds,
        t0.elapsed().as_secs_f64(),
        plan.perturbation,
        notes.join(", "),
        finals.join(" "),
        stats.claims_deleted,
        stats.cleanup_pods,
        stats.forged_pods,
        exits.join(", "),
        found.len()
    );
    let _ = std::io::stdout().flush();
    settled.is_ok()
}

/// Invariant (3): what was left when the round did not settle.
fn unsettled_violations(
    left: &settle::Unsettled,
    timeout: Duration,
    violation: &dyn Fn(u8, String) -> Violation,
) -> Vec<Violation> {
    let mut all: Vec<Violation> = left
        .cleanup_pods
        .iter()
        .map(|p| violation(3, format!("left after quiescing: {p}")))
        .collect();
    if !left.other.is_empty() {
        all.push(violation(
            3,
            format!(
                "not quiescent within {timeout:?}: {}",
                left.other.join("; ")
            ),
        ));
    }
    all
}

/// Runs the claim checks on what was recorded since the last check, and counts violations.
#[derive(Default)]
struct Checker {
    checked: usize,
    violations: usize,
    panics: usize,
    last: check::Stats,
}

impl Checker {
    fn claims(&mut self, world: &World, round: &str) -> Vec<Violation> {
        let records = world.recorder.snapshot();
        let layout = Layout {
            sets: &world.sets,
            namespaces: &world.ns_names,
        };
        let forged: &HashSet<String> = &world.forged;
        let (found, stats) = check::check_claims(
            &records,
            self.checked..records.len(),
            forged,
            &layout,
            round,
        );
        self.checked = records.len();
        self.last = stats;
        found
    }

    /// Check (6) on the pod deletes the controllers sent since the last check.
    fn pod_deletes(&mut self, world: &mut World, round: &str) -> Vec<Violation> {
        let deletes = world.proxies.take_pod_deletes();
        check::check_pod_deletes(
            &world.recorder.snapshot(),
            &deletes,
            &world.forged,
            &world.background_sets,
            round,
        )
    }

    fn report(&mut self, found: &[Violation]) {
        for v in found {
            println!("{v}");
        }
        self.violations += found.len();
    }
}

impl World {
    fn recorder_elapsed(&self) -> Duration {
        self.recorder
            .snapshot()
            .last()
            .map(|o| o.at)
            .unwrap_or_default()
    }

    /// Stops the watches and the controllers, writes the recording, and releases every set still
    /// held by our finalizer so the namespaces can go.
    async fn teardown(mut self, seed: u64) {
        for task in &self.watches {
            task.abort();
        }
        self.controllers.stop();
        let dir = support::repo_dir().join("target/chaos");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("seed-{seed}.jsonl"));
        if let Ok(mut file) = std::fs::File::create(&path) {
            for obs in self.recorder.snapshot() {
                let _ = writeln!(file, "{}", obs.to_json());
            }
            println!("chaos: recording in {}", path.display());
        }
        for ns in &self.ns_names {
            if let Ok(out) = std::process::Command::new(support::kubectl_binary())
                .arg("--kubeconfig")
                .arg(&self.cluster.kubeconfig)
                .arg("--request-timeout=10s")
                .args(["-n", ns, "get", "statefulsets", "-o", "name"])
                .output()
            {
                for set in String::from_utf8_lossy(&out.stdout).lines() {
                    let _ = std::process::Command::new(support::kubectl_binary())
                        .arg("--kubeconfig")
                        .arg(&self.cluster.kubeconfig)
                        .arg("--request-timeout=10s")
                        .args(["-n", ns, "patch", set, "--type=merge"])
                        .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
                        .output();
                }
            }
        }
        self.namespaces.clear();
    }
}
