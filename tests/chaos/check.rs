//! The invariant checker over the recording (pure: records in, violations out).
//!
//! (1) No claim of a wanted ordinal is deleted: when its deletion begins, the ordinal lies outside
//!     `[0, replicas)` of its set, or the set is being deleted. The one exception is the race the
//!     safety contract allows: some state of the set between a genuine cleanup pod's Succeeded and
//!     the deletion showed the ordinal orphaned (the controller's read), and a scale-up came after.
//!     A scale-up while the cleanup ran keeps the claims.
//! (2) No claim is deleted unless a genuine (not forged) cleanup pod of its ordinal, listing this
//!     claim's UID, was seen Succeeded before.
//! (3) and (4) are checked on the live cluster by the runner (nothing left after quiescing; every
//!     set deletable).
//!
//! Times are revisions of the one etcd (see `record`), each change known within `(after, rv]`;
//! a violation is reported only if it holds at every revision the change may have happened at.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use super::plan::SetDef;
use super::record::{How, Kind, Obs};

#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: u8,
    pub round: String,
    pub at: Duration,
    pub text: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VIOLATION ({}) round {} t={:.1}s: {}",
            self.invariant,
            self.round,
            self.at.as_secs_f64(),
            self.text
        )
    }
}

/// Where the sets live: `namespaces[set.ns]`.
pub struct Layout<'a> {
    pub sets: &'a [SetDef],
    pub namespaces: &'a [String],
}

impl Layout<'_> {
    /// The set and ordinal a claim belongs to (`<template>-<set>-<ordinal>`).
    fn claim_owner(&self, ns: &str, claim: &str) -> Option<(usize, u32)> {
        self.sets.iter().enumerate().find_map(|(i, s)| {
            if self.namespaces.get(s.ns).map(String::as_str) != Some(ns) {
                return None;
            }
            s.claim_templates.iter().find_map(|t| {
                let rest = claim.strip_prefix(t)?.strip_prefix('-')?;
                let n = rest.strip_prefix(s.name)?.strip_prefix('-')?;
                let canonical = n == "0" || !n.starts_with('0');
                let ordinal = n.parse::<u32>().ok().filter(|_| canonical)?;
                Some((i, ordinal))
            })
        })
    }
}

/// The life of one pod, from its records.
struct PodLife<'a> {
    uid: &'a str,
    forged: bool,
    looks_cleanup: bool,
    created: (u64, u64),
    succeeded: Option<u64>,
    last_rv: u64,
    last_phase: Option<&'a str>,
    gone: Option<(u64, u64)>,
    vanished_unseen: bool,
    claims: BTreeSet<&'a str>,
}

#[derive(Clone, Copy)]
struct SetState {
    after: u64,
    rv: u64,
    replicas: i32,
    deleting: bool,
}

impl SetState {
    fn wants(&self, ordinal: u32) -> bool {
        !self.deleting && i64::from(ordinal) < i64::from(self.replicas)
    }
}

/// A claim's deletion: the first record that shows it deleting or gone.
struct Deletion<'a> {
    index: usize,
    obs: &'a Obs,
    set: usize,
    ordinal: u32,
}

/// What one check found, besides violations.
#[derive(Default, Debug)]
pub struct Stats {
    pub claims_deleted: usize,
    pub cleanup_pods: usize,
    pub forged_pods: usize,
}

struct History<'a> {
    pods: HashMap<(&'a str, &'a str), Vec<PodLife<'a>>>,
    sets: HashMap<(&'a str, &'a str), Vec<SetState>>,
}

fn build<'a>(records: &'a [Obs], forged: &HashSet<String>) -> History<'a> {
    let mut pods: HashMap<&str, PodLife<'a>> = HashMap::new();
    let mut pod_names: Vec<(&str, &str, &str)> = Vec::new();
    let mut sets: HashMap<(&str, &str), Vec<SetState>> = HashMap::new();
    for obs in records {
        match obs.kind {
            Kind::Pod => {
                let life = pods.entry(&obs.uid).or_insert_with(|| {
                    pod_names.push((&obs.ns, &obs.name, &obs.uid));
                    PodLife {
                        uid: &obs.uid,
                        forged: forged.contains(&obs.uid),
                        looks_cleanup: false,
                        created: (obs.after, obs.rv),
                        succeeded: None,
                        last_rv: 0,
                        last_phase: None,
                        gone: None,
                        vanished_unseen: false,
                        claims: BTreeSet::new(),
                    }
                });
                life.looks_cleanup |= obs.looks_like_cleanup();
                life.claims.extend(obs.claims.values().map(String::as_str));
                if obs.phase.as_deref() == Some("Succeeded") && life.succeeded.is_none() {
                    life.succeeded = Some(obs.rv);
                }
                if matches!(obs.how, How::Deleted | How::Vanished) {
                    life.gone = Some((obs.after, obs.rv));
                    life.vanished_unseen = obs.how == How::Vanished
                        && !matches!(life.last_phase, Some("Succeeded" | "Failed"));
                } else {
                    life.last_rv = obs.rv;
                    life.last_phase = obs.phase.as_deref();
                }
            }
            Kind::Set => sets
                .entry((&obs.ns, &obs.name))
                .or_default()
                .push(SetState {
                    after: obs.after,
                    rv: obs.rv,
                    replicas: obs.replicas.unwrap_or(0),
                    deleting: obs.deleting,
                }),
            Kind::Claim => {}
        }
    }
    for states in sets.values_mut() {
        states.sort_by_key(|s| s.rv);
    }
    let mut by_name: HashMap<(&str, &str), Vec<PodLife<'a>>> = HashMap::new();
    for (ns, name, uid) in pod_names {
        if let Some(life) = pods.remove(uid) {
            by_name.entry((ns, name)).or_default().push(life);
        }
    }
    History {
        pods: by_name,
        sets,
    }
}

/// Every state the set may have had at some revision in `(lo, hi]`.
fn states_in(states: &[SetState], lo: u64, hi: u64) -> Vec<SetState> {
    let mut out: Vec<SetState> = states
        .iter()
        .rfind(|s| s.rv <= lo)
        .copied()
        .into_iter()
        .collect();
    out.extend(states.iter().filter(|s| s.rv > lo && s.after < hi).copied());
    out
}

/// Checks (1) and (2) for the claims whose deletion was first recorded at an index in `range`.
pub fn check_claims(
    records: &[Obs],
    range: std::ops::Range<usize>,
    forged: &HashSet<String>,
    layout: &Layout,
    round: &str,
) -> (Vec<Violation>, Stats) {
    let history = build(records, forged);
    let mut seen: HashSet<&str> = HashSet::new();
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    for (index, obs) in records.iter().enumerate() {
        if range.contains(&index) && obs.kind == Kind::Pod && !seen.contains(obs.uid.as_str()) {
            if forged.contains(&obs.uid) {
                stats.forged_pods += 1;
            } else if obs.looks_like_cleanup() {
                stats.cleanup_pods += 1;
            }
        }
        if obs.kind == Kind::Pod {
            seen.insert(&obs.uid);
        }
        if obs.kind != Kind::Claim || !obs.deleting || !seen.insert(&obs.uid) {
            continue;
        }
        if !range.contains(&index) {
            continue;
        }
        let Some((set, ordinal)) = layout.claim_owner(&obs.ns, &obs.name) else {
            continue;
        };
        stats.claims_deleted += 1;
        let deletion = Deletion {
            index,
            obs,
            set,
            ordinal,
        };
        violations.extend(check_deletion(&history, &deletion, layout, round));
    }
    (violations, stats)
}

fn check_deletion(h: &History, d: &Deletion, layout: &Layout, round: &str) -> Vec<Violation> {
    let def = &layout.sets[d.set];
    let ns = d.obs.ns.as_str();
    let pod_name = format!("{}-{}", def.name, d.ordinal);
    let no_states = Vec::new();
    let states = h.sets.get(&(ns, def.name)).unwrap_or(&no_states);
    let (lo, hi) = (d.obs.after, d.obs.rv);
    let at_deletion = states_in(states, lo, hi);
    let pods: &[PodLife] = h
        .pods
        .get(&(ns, pod_name.as_str()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let genuine_for_claim =
        |p: &&PodLife| !p.forged && p.looks_cleanup && p.claims.contains(d.obs.uid.as_str());
    let mut out = Vec::new();
    let violation = |invariant: u8, why: String| Violation {
        invariant,
        round: round.to_string(),
        at: d.obs.at,
        text: format!(
            "claim {ns}/{} (uid {}) deleted at rv {}{} [record #{}]: {why}; {}",
            d.obs.name,
            short(&d.obs.uid),
            hi,
            if d.obs.after + 1 == hi {
                String::new()
            } else {
                format!(" (somewhere after rv {lo}, seen {:?})", d.obs.how)
            },
            d.index,
            pods_before(pods, hi, &pod_name),
        ),
    };

    let always_wanted = !at_deletion.is_empty() && at_deletion.iter().all(|s| s.wants(d.ordinal));
    // The one race the contract allows: the read after the pod Succeeded showed the ordinal
    // orphaned, and a scale-up was saved between that read and the delete.
    let orphaned_after_success = pods.iter().filter(genuine_for_claim).any(|p| {
        let done = p.succeeded.or(p.vanished_unseen.then_some(p.last_rv));
        done.is_some_and(|done| {
            done < hi
                && states_in(states, done, hi)
                    .iter()
                    .any(|s| !s.wants(d.ordinal))
        })
    });
    if always_wanted && !orphaned_after_success {
        out.push(violation(
            1,
            format!(
                "ordinal {} of {} was wanted ({}), and no state after a genuine cleanup pod Succeeded showed it orphaned",
                d.ordinal,
                def.name,
                describe(&at_deletion)
            ),
        ));
    }

    let cleaned = pods
        .iter()
        .filter(genuine_for_claim)
        .any(|p| p.succeeded.is_some_and(|rv| rv < hi) || (p.vanished_unseen && p.last_rv < hi));
    if !cleaned {
        out.push(violation(
            2,
            format!(
                "no genuine cleanup pod {pod_name} listing this claim was seen Succeeded before"
            ),
        ));
    }
    out
}

fn describe(states: &[SetState]) -> String {
    let replicas: BTreeSet<i32> = states.iter().map(|s| s.replicas).collect();
    let list: Vec<String> = replicas.iter().map(i32::to_string).collect();
    let deleting = if states.iter().any(|s| s.deleting) {
        ", set being deleted"
    } else {
        ""
    };
    format!("spec.replicas {}{deleting}", list.join(" or "))
}

fn pods_before(pods: &[PodLife], hi: u64, name: &str) -> String {
    let seen: Vec<String> = pods
        .iter()
        .filter(|p| p.created.1 < hi)
        .map(|p| {
            let what = if p.forged {
                "FORGED"
            } else if p.looks_cleanup {
                "cleanup"
            } else {
                "stateful"
            };
            let phase = match p.succeeded {
                Some(rv) if rv < hi => format!("Succeeded at rv {rv}"),
                _ => p.last_phase.unwrap_or("no phase").to_string(),
            };
            format!(
                "{what} uid {} created rv {}, {phase}",
                short(p.uid),
                p.created.1
            )
        })
        .collect();
    match seen.len() {
        0 => format!("no pod {name} seen before"),
        n if n <= 4 => format!("pods {name} seen before: {}", seen.join("; ")),
        n => format!(
            "pods {name} seen before (last 4 of {n}): {}",
            seen[n - 4..].join("; ")
        ),
    }
}

pub fn short(uid: &str) -> &str {
    uid.get(..8).unwrap_or(uid)
}

/// Runs the checker on synthetic recordings with known answers; returns the number of cases, or
/// what went wrong. Guards against a checker that cannot fail (or always fails).
pub fn self_test() -> Result<usize, String> {
    let sets = vec![SetDef {
        ns: 0,
        name: "web",
        claim_templates: &["data"],
        parallel: true,
        failing: false,
        max: 4,
        initial: 3,
    }];
    let namespaces = vec!["ns".to_string()];
    let layout = Layout {
        sets: &sets,
        namespaces: &namespaces,
    };
    let cases = self_test_cases();
    for (name, records, forged, want) in &cases {
        let forged: HashSet<String> = forged.iter().map(|s| s.to_string()).collect();
        let (found, _) = check_claims(records, 0..records.len(), &forged, &layout, "self-test");
        let got: Vec<u8> = found.iter().map(|v| v.invariant).collect();
        if got != *want {
            let texts: Vec<String> = found.iter().map(ToString::to_string).collect();
            return Err(format!(
                "case '{name}': expected violations {want:?}, got {got:?}: {texts:?}"
            ));
        }
    }
    Ok(cases.len())
}

type Case = (&'static str, Vec<Obs>, Vec<&'static str>, Vec<u8>);

/// A set at revision `rv` in the self-test's recordings.
fn set(rv: u64, replicas: i32, deleting: bool) -> Obs {
    let mut o = synthetic(Kind::Set, "web", "set-uid", rv - 1, rv);
    o.replicas = Some(replicas);
    o.deleting = deleting;
    o
}

/// A cleanup-looking pod of ordinal `ordinal`, listing claim `claim-<ordinal>`.
fn pod(uid: &str, ordinal: u32, rv: u64, phase: &str) -> Obs {
    let mut o = synthetic(Kind::Pod, &format!("web-{ordinal}"), uid, rv - 1, rv);
    o.phase = Some(phase.to_string());
    o.cleanup_label = true;
    o.owner = Some("web".into());
    o.claims = [(format!("data-web-{ordinal}"), format!("claim-{ordinal}"))].into();
    o
}

/// Claim `claim-<ordinal>` seen deleting, the change somewhere in `(after, rv]`.
fn claim_deleted(ordinal: u32, after: u64, rv: u64) -> Obs {
    let name = format!("data-web-{ordinal}");
    let mut o = synthetic(Kind::Claim, &name, &format!("claim-{ordinal}"), after, rv);
    o.deleting = true;
    o
}

/// A genuine pod of ordinal 2 that Succeeded, but listed a claim of the same name and another UID.
fn older_claims_pod() -> Obs {
    let mut o = pod("g", 2, 25, "Succeeded");
    o.claims = [("data-web-2".to_string(), "older-claim".to_string())].into();
    o
}

fn self_test_cases() -> Vec<Case> {
    vec![
        (
            "forged pod on a wanted ordinal",
            vec![
                set(10, 3, false),
                pod("f", 0, 20, "Running"),
                pod("f", 0, 25, "Succeeded"),
                claim_deleted(0, 29, 30),
            ],
            vec!["f"],
            vec![1, 2],
        ),
        (
            "scale-down cleaned by a genuine pod",
            vec![
                set(10, 3, false),
                set(15, 2, false),
                pod("g", 2, 20, "Running"),
                pod("g", 2, 25, "Succeeded"),
                claim_deleted(2, 29, 30),
            ],
            vec![],
            vec![],
        ),
        (
            "scale-up during a genuine cleanup, claim deleted anyway",
            vec![
                set(15, 2, false),
                pod("g", 2, 20, "Running"),
                set(22, 3, false),
                pod("g", 2, 25, "Succeeded"),
                claim_deleted(2, 29, 30),
            ],
            vec![],
            vec![1],
        ),
        (
            "scale-up after the Succeeded pod was confirmed, before the delete",
            vec![
                set(15, 2, false),
                pod("g", 2, 20, "Running"),
                pod("g", 2, 25, "Succeeded"),
                set(28, 3, false),
                claim_deleted(2, 29, 30),
            ],
            vec![],
            vec![],
        ),
        (
            "cleanup pod created after the scale-up",
            vec![
                set(15, 2, false),
                set(18, 3, false),
                pod("g", 2, 20, "Running"),
                pod("g", 2, 25, "Succeeded"),
                claim_deleted(2, 29, 30),
            ],
            vec![],
            vec![1],
        ),
        (
            "orphaned claim deleted without any cleanup pod",
            vec![set(15, 2, false), claim_deleted(2, 29, 30)],
            vec![],
            vec![2],
        ),
        (
            "genuine cleanup pod still running when the claim went",
            vec![
                set(15, 2, false),
                pod("g", 2, 20, "Running"),
                claim_deleted(2, 29, 30),
                pod("g", 2, 35, "Succeeded"),
            ],
            vec![],
            vec![2],
        ),
        (
            "genuine cleanup pod of an older claim of the ordinal",
            vec![
                set(15, 2, false),
                older_claims_pod(),
                claim_deleted(2, 29, 30),
            ],
            vec![],
            vec![2],
        ),
        (
            "forged pod created while orphaned, then a scale-up",
            vec![
                set(15, 2, false),
                pod("f", 2, 20, "Running"),
                set(22, 3, false),
                pod("f", 2, 25, "Succeeded"),
                claim_deleted(2, 29, 30),
            ],
            vec!["f"],
            vec![1, 2],
        ),
        (
            "forged pod on an orphaned ordinal",
            vec![
                set(15, 2, false),
                pod("f", 2, 20, "Running"),
                pod("f", 2, 25, "Succeeded"),
                claim_deleted(2, 29, 30),
            ],
            vec!["f"],
            vec![2],
        ),
        (
            "deletion seen only after a relist, scale-down inside the window",
            vec![
                set(10, 3, false),
                set(20, 2, false),
                pod("g", 2, 22, "Running"),
                pod("g", 2, 25, "Succeeded"),
                claim_deleted(2, 12, 40),
            ],
            vec![],
            vec![],
        ),
        (
            "set being deleted",
            vec![
                set(10, 3, false),
                set(50, 3, true),
                pod("g", 0, 52, "Running"),
                pod("g", 0, 55, "Succeeded"),
                claim_deleted(0, 59, 60),
            ],
            vec![],
            vec![],
        ),
    ]
}

fn synthetic(kind: Kind, name: &str, uid: &str, after: u64, rv: u64) -> Obs {
    let mut obs = super::record::Obs::synthetic(kind, "ns", name, uid, after, rv);
    obs.at = Duration::from_millis(rv);
    obs
}
