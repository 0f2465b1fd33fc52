//! The seeded part of the chaos run: a small PRNG and the plan of each round. A plan is drawn from
//! the seed alone, never from the cluster's state, so the same seed always gives the same actions;
//! what an action finds on the cluster (which ordinal is orphaned, who leads) only changes its effect.

use std::fmt;

pub use crate::support::rng::Rng;

/// One StatefulSet of the run.
#[derive(Clone, Debug)]
pub struct SetDef {
    /// Index of its namespace (0 or 1).
    pub ns: usize,
    pub name: &'static str,
    pub claim_templates: &'static [&'static str],
    pub parallel: bool,
    /// Its cleanup template carries `sim.scaledown.io/outcome: Failed`: every cleanup pod fails.
    pub failing: bool,
    /// It carries the cleanup template annotation. A set that does not keeps the claims of a
    /// scale-down on purpose (to scale up again later): nobody may delete them.
    pub opted_in: bool,
    pub max: i32,
    pub initial: i32,
}

/// The sets of every run: OrderedReady and Parallel, one and two claim templates, one whose
/// cleanup always fails, spread over two namespaces; and two whose claim names collide
/// (`data` + `my-db` and `data-my` + `db` both give `data-my-db-N`), the second not opted in.
pub fn sets() -> Vec<SetDef> {
    let set = |ns, name, claim_templates, parallel, failing, max, initial| SetDef {
        ns,
        name,
        claim_templates,
        parallel,
        failing,
        opted_in: true,
        max,
        initial,
    };
    let mut kept = set(1, "db", &["data-my"][..], true, false, 3, 2);
    kept.opted_in = false;
    vec![
        set(0, "alpha", &["data"][..], false, false, 4, 3),
        set(0, "beta", &["data", "logs"][..], true, false, 4, 3),
        set(0, "omega", &["data"][..], true, true, 3, 2),
        set(1, "gamma", &["data"][..], true, false, 4, 3),
        set(1, "delta", &["data", "logs"][..], false, false, 3, 2),
        set(1, "my-db", &["data"][..], true, false, 4, 1),
        kept,
    ]
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Patch `spec.replicas` of a set.
    Scale { set: usize, replicas: i32 },
    /// Scale a set down by `by` and race the controller for the name of the lowest orphaned
    /// ordinal with a forged cleanup pod over that ordinal's claims.
    ForgeOrphan { set: usize, by: i32 },
    /// Delete the stateful pod of a wanted ordinal (`pick` modulo replicas) and put a forged
    /// cleanup pod over that ordinal's claims in its place.
    ForgeWanted { set: usize, pick: u32 },
    /// A user deletes a (genuine) cleanup pod of the set, if one exists.
    DeleteCleanup { set: usize },
    /// SIGKILL one controller instance and start it again.
    KillController { instance: usize },
    /// SIGTERM the leader (it releases the Lease, the other instance takes over), start it again.
    Failover,
    /// `hack/cluster.sh restart-apiserver 1`.
    RestartApiserver,
    /// Delete a set with propagation `how` and, once it is gone, create it again with the same
    /// name and size (a new UID). With `Orphan` the new set adopts the pods and claims
    /// (`kubectl delete sts --cascade=orphan`, the way to change an immutable field).
    Recreate { set: usize, how: Propagation },
    /// Scale a set to 0, and `back_after` ms later back to its size.
    ZeroAndBack { set: usize, back_after: u64 },
    /// A claim made by hand for ordinal `ordinal` (pre-provisioned: the name fits, no owner, no
    /// labels): the controller may clean it when the ordinal is orphaned.
    HandMadeClaim { set: usize, ordinal: i32 },
    /// A claim whose name fits ordinal `ordinal` of the set but that a ConfigMap owns: never
    /// to be deleted.
    ForeignClaim { set: usize, ordinal: i32 },
    /// A namespace of its own with an opted-in set of `replicas`, deleted whole right away.
    DeleteNamespace { replicas: i32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Foreground,
    Background,
}

/// What one round's controllers see of the cluster, through their Sieve proxies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Perturbation {
    None,
    /// Every event of one resource's watch is delivered `ms` late.
    DelayWatch {
        resource: &'static str,
        ms: u64,
    },
    /// MODIFIED events of one object within `ms` are coalesced into the last.
    Coalesce {
        resource: &'static str,
        ms: u64,
    },
    /// SIGKILL the instance right after its `n`-th `verb` of `resource` in the round was
    /// answered (later writes are held until then), and start it again.
    StopAfterWrite {
        verb: &'static str,
        resource: &'static str,
        n: usize,
    },
}

/// The resources whose watches a perturbation delays or coalesces.
pub const WATCHED: [&str; 3] = ["pods", "persistentvolumeclaims", "statefulsets"];
/// The writes after which a perturbation stops the controller.
pub const STOP_WRITES: [(&str, &str); 4] = [
    ("create", "pods"),
    ("patch", "statefulsets"),
    ("delete", "persistentvolumeclaims"),
    ("delete", "pods"),
];

impl Perturbation {
    /// The kind, for the run's summary.
    pub fn kind(&self) -> String {
        match self {
            Perturbation::None => "none".into(),
            Perturbation::DelayWatch { resource, .. } => {
                format!("{} watch delayed", noun(resource))
            }
            Perturbation::Coalesce { resource, .. } => {
                format!("{} watch coalesced", noun(resource))
            }
            Perturbation::StopAfterWrite { verb, resource, .. } => {
                format!("stop after {verb} {resource}")
            }
        }
    }
}

fn noun(resource: &str) -> &str {
    match resource {
        "pods" => "pod",
        "persistentvolumeclaims" => "claim",
        "statefulsets" => "statefulset",
        other => other,
    }
}

impl fmt::Display for Perturbation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Perturbation::None => write!(f, "none"),
            Perturbation::DelayWatch { ms, .. } => write!(f, "{} {ms} ms", self.kind()),
            Perturbation::Coalesce { ms, .. } => write!(f, "{} (window {ms} ms)", self.kind()),
            Perturbation::StopAfterWrite { verb, resource, n } => write!(
                f,
                "SIGKILL the writer right after its write #{n} ({verb} {resource}), start it again"
            ),
        }
    }
}

pub fn draw_perturbation(rng: &mut Rng) -> Perturbation {
    match rng.below(6) {
        0 => Perturbation::None,
        k @ 1..=3 => Perturbation::DelayWatch {
            resource: WATCHED[k as usize - 1],
            ms: 1000 + 500 * rng.below(5),
        },
        4 => Perturbation::Coalesce {
            resource: WATCHED[rng.index(WATCHED.len())],
            ms: 500 + 500 * rng.below(4),
        },
        _ => {
            let (verb, resource) = STOP_WRITES[rng.index(STOP_WRITES.len())];
            Perturbation::StopAfterWrite {
                verb,
                resource,
                n: 1 + rng.index(3),
            }
        }
    }
}

/// What one round does: under a perturbation, actions with a pause before each, then the size
/// every set settles at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundPlan {
    pub perturbation: Perturbation,
    pub actions: Vec<(u64, Action)>,
    pub finals: Vec<i32>,
}

/// Instances of the controller that run (with leader election) during the whole run.
pub const INSTANCES: usize = 2;

/// One round in `CHAOS_RESTART_EVERY` (default 5; 0: never) restarts the API server.
fn restart_every() -> u64 {
    std::env::var("CHAOS_RESTART_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

pub fn plan_round(rng: &mut Rng, sets: &[SetDef]) -> RoundPlan {
    plan_round_with(rng, sets, restart_every())
}

/// [`plan_round`] with the API server restarted in one round in `every` (0: never).
pub fn plan_round_with(rng: &mut Rng, sets: &[SetDef], every: u64) -> RoundPlan {
    let perturbation = draw_perturbation(rng);
    let count = 3 + rng.index(4);
    // About one round in five restarts the API server: each restart costs several seconds.
    let restart_at = (rng.below(every.max(1)) == 0 && every > 0).then(|| rng.index(count + 1));
    let mut actions = Vec::new();
    for i in 0..=count {
        if restart_at == Some(i) {
            actions.push((rng.below(1000), Action::RestartApiserver));
        }
        if i == count {
            break;
        }
        let pause = rng.below(1500);
        actions.push((pause, draw_action(rng, sets)));
    }
    let finals = sets.iter().map(|s| rng.upto(s.max)).collect();
    RoundPlan {
        perturbation,
        actions,
        finals,
    }
}

fn draw_action(rng: &mut Rng, sets: &[SetDef]) -> Action {
    let set = rng.index(sets.len());
    // Sets that can be deleted (the failing set's cleanups never succeed, so its finalizer stays)
    // and sets whose orphaned claims the controller cleans.
    let pick = |rng: &mut Rng, keep: &dyn Fn(&SetDef) -> bool| {
        let eligible: Vec<usize> = (0..sets.len()).filter(|&i| keep(&sets[i])).collect();
        eligible[rng.index(eligible.len())]
    };
    match rng.below(100) {
        0..=29 => Action::Scale {
            set,
            replicas: rng.upto(sets[set].max),
        },
        30..=37 => Action::ForgeOrphan {
            set,
            by: 1 + rng.upto(1),
        },
        38..=45 => Action::ForgeWanted {
            set,
            pick: rng.below(8) as u32,
        },
        46..=50 => Action::DeleteCleanup { set },
        51..=62 => Action::KillController {
            instance: rng.index(INSTANCES),
        },
        63..=67 => Action::Failover,
        68..=80 => {
            let how = [
                Propagation::Orphan,
                Propagation::Foreground,
                Propagation::Background,
            ][rng.index(3)];
            let set = if how == Propagation::Orphan {
                set
            } else {
                pick(rng, &|s| !s.failing)
            };
            Action::Recreate { set, how }
        }
        81..=85 => Action::ZeroAndBack {
            set,
            back_after: rng.below(4000),
        },
        86..=90 => {
            let set = pick(rng, &|s| s.opted_in && s.name != "my-db");
            Action::HandMadeClaim {
                set,
                ordinal: rng.upto(sets[set].max),
            }
        }
        91..=95 => {
            let set = pick(rng, &|s| s.opted_in);
            Action::ForeignClaim {
                set,
                ordinal: rng.upto(sets[set].max),
            }
        }
        _ => Action::DeleteNamespace {
            replicas: 1 + rng.upto(1),
        },
    }
}

/// `Display` of an action with set names, for the round lines.
pub struct Named<'a>(pub &'a Action, pub &'a [SetDef]);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |i: &usize| self.1[*i].name;
        match self.0 {
            Action::Scale { set, replicas } => write!(f, "scale {}={replicas}", name(set)),
            Action::ForgeOrphan { set, by } => write!(f, "forge-orphan {}-{by}", name(set)),
            Action::ForgeWanted { set, pick } => write!(f, "forge-wanted {}#{pick}", name(set)),
            Action::DeleteCleanup { set } => write!(f, "delete-cleanup {}", name(set)),
            Action::KillController { instance } => write!(f, "kill {}", instance_name(*instance)),
            Action::Failover => write!(f, "failover"),
            Action::RestartApiserver => write!(f, "restart-apiserver"),
            Action::Recreate { set, how } => {
                write!(f, "recreate {} ({how:?} deletion)", name(set))
            }
            Action::ZeroAndBack { set, back_after } => {
                write!(f, "zero-and-back {} ({back_after} ms)", name(set))
            }
            Action::HandMadeClaim { set, ordinal } => {
                write!(f, "hand-made-claim {}#{ordinal}", name(set))
            }
            Action::ForeignClaim { set, ordinal } => {
                write!(f, "foreign-claim {}#{ordinal}", name(set))
            }
            Action::DeleteNamespace { replicas } => write!(f, "delete-namespace ({replicas})"),
        }
    }
}

pub fn instance_name(i: usize) -> String {
    format!("chaos-{}", (b'a' + i as u8) as char)
}

/// Pure checks of the planner (run before every chaos run, also with `--plan-only`): the same
/// seed gives the same plans, another seed others; over a few hundred rounds every perturbation
/// and every kind of action is drawn; drawn values stay within the sets' bounds. Returns how
/// many rounds were checked, or what is wrong.
pub fn self_test() -> Result<usize, String> {
    const ROUNDS: usize = 400;
    let sets = sets();
    let draw = |seed| {
        let mut rng = Rng::new(seed);
        (0..ROUNDS)
            .map(|_| plan_round_with(&mut rng, &sets, 5))
            .collect::<Vec<_>>()
    };
    let plans = draw(42);
    if plans != draw(42) {
        return Err("seed 42 gave two different plans".into());
    }
    if plans[..5] == draw(43)[..5] {
        return Err("seeds 42 and 43 gave the same plans".into());
    }
    let mut perturbations = std::collections::BTreeSet::new();
    let mut actions = std::collections::BTreeSet::new();
    for plan in &plans {
        perturbations.insert(plan.perturbation.kind());
        for (_, action) in &plan.actions {
            check_action(action, &sets)?;
            actions.insert(action_kind(action));
        }
        if plan
            .finals
            .iter()
            .zip(&sets)
            .any(|(n, s)| *n < 0 || *n > s.max)
        {
            return Err(format!("finals out of bounds: {:?}", plan.finals));
        }
    }
    let kinds = 1 + 2 * WATCHED.len() + STOP_WRITES.len();
    if perturbations.len() != kinds {
        return Err(format!(
            "{ROUNDS} rounds drew {} perturbation kinds of {kinds}: {perturbations:?}",
            perturbations.len()
        ));
    }
    if actions.len() != 14 {
        return Err(format!(
            "{ROUNDS} rounds drew {} action kinds of 14: {actions:?}",
            actions.len()
        ));
    }
    Ok(ROUNDS)
}

/// An action's kind (a deletion's propagation counts as a kind of its own).
fn action_kind(action: &Action) -> String {
    let text = format!("{action:?}");
    match action {
        Action::Recreate { how, .. } => format!("Recreate {how:?}"),
        _ => text
            .split([' ', '{'])
            .next()
            .unwrap_or_default()
            .to_string(),
    }
}

fn check_action(action: &Action, sets: &[SetDef]) -> Result<(), String> {
    let ok = match action {
        Action::Scale { set, replicas } => (0..=sets[*set].max).contains(replicas),
        Action::Recreate { set, how } => *how == Propagation::Orphan || !sets[*set].failing,
        Action::HandMadeClaim { set, ordinal } => {
            sets[*set].opted_in && sets[*set].name != "my-db" && *ordinal <= sets[*set].max
        }
        Action::ForeignClaim { set, ordinal } => sets[*set].opted_in && *ordinal <= sets[*set].max,
        Action::DeleteNamespace { replicas } => (1..=2).contains(replicas),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("action out of bounds: {action:?}"))
    }
}
