//! The seeded part of the chaos run: a small PRNG and the plan of each round. A plan is drawn from
//! the seed alone, never from the cluster's state, so the same seed always gives the same actions;
//! what an action finds on the cluster (which ordinal is orphaned, who leads) only changes its effect.

use std::fmt;

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and its output for a seed never changes,
/// which a crate's generator does not promise across versions.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`; the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into a collection of `n` elements.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// A number in `0..=max`.
    pub fn upto(&mut self, max: i32) -> i32 {
        self.below(max.max(0) as u64 + 1) as i32
    }
}

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
    pub max: i32,
    pub initial: i32,
}

/// The sets of every run: OrderedReady and Parallel, one and two claim templates, one whose
/// cleanup always fails, spread over two namespaces.
pub fn sets() -> Vec<SetDef> {
    let set = |ns, name, claim_templates, parallel, failing, max, initial| SetDef {
        ns,
        name,
        claim_templates,
        parallel,
        failing,
        max,
        initial,
    };
    vec![
        set(0, "alpha", &["data"][..], false, false, 4, 3),
        set(0, "beta", &["data", "logs"][..], true, false, 4, 3),
        set(0, "omega", &["data"][..], true, true, 3, 2),
        set(1, "gamma", &["data"][..], true, false, 4, 3),
        set(1, "delta", &["data", "logs"][..], false, false, 3, 2),
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
}

/// What one round does: actions with a pause before each, then the size every set settles at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundPlan {
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
    let count = 3 + rng.index(4);
    // About one round in five restarts the API server: each restart costs several seconds.
    let every = restart_every();
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
        let set = rng.index(sets.len());
        let action = match rng.below(100) {
            0..=39 => Action::Scale {
                set,
                replicas: rng.upto(sets[set].max),
            },
            40..=51 => Action::ForgeOrphan {
                set,
                by: 1 + rng.upto(1),
            },
            52..=63 => Action::ForgeWanted {
                set,
                pick: rng.below(8) as u32,
            },
            64..=71 => Action::DeleteCleanup { set },
            72..=89 => Action::KillController {
                instance: rng.index(INSTANCES),
            },
            _ => Action::Failover,
        };
        actions.push((pause, action));
    }
    let finals = sets.iter().map(|s| rng.upto(s.max)).collect();
    RoundPlan { actions, finals }
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
        }
    }
}

pub fn instance_name(i: usize) -> String {
    format!("chaos-{}", (b'a' + i as u8) as char)
}
