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
//! (6) No pod that was never a cleanup pod (a stateful pod) is deleted by the controller, unless
//!     the set that owned it was deleted with background propagation: in particular no pod of an
//!     orphan-deleted set. Who deleted is known from the controllers' Sieve proxies, which log
//!     every write of the controllers (a delete with its UID precondition and the answer).
//! (7) No claim that is not proven a taking-part set's is deleted, by anyone: a claim owned by
//!     another object (an ownerReference to a ConfigMap), or one carrying the labels of a set that
//!     does not take part (claims kept on purpose after a scale-down), whatever its name.
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
    /// The set and ordinal a claim belongs to (`<template>-<set>-<ordinal>`): the set whose `app`
    /// label it carries if that set's names fit, else the first whose names fit.
    fn claim_owner(&self, ns: &str, claim: &str, app: Option<&str>) -> Option<(usize, u32)> {
        self.name_owner(ns, claim, app)
            .or_else(|| self.name_owner(ns, claim, None))
    }

    fn name_owner(&self, ns: &str, claim: &str, only: Option<&str>) -> Option<(usize, u32)> {
        self.name_owners(ns, claim, only).into_iter().next()
    }

    /// Every set of `ns` (or only the one named `only`) whose names fit `claim`, with the ordinal.
    fn name_owners(&self, ns: &str, claim: &str, only: Option<&str>) -> Vec<(usize, u32)> {
        let sets = self.sets.iter().enumerate();
        sets.filter_map(|(i, s)| {
            if self.namespaces.get(s.ns).map(String::as_str) != Some(ns)
                || only.is_some_and(|app| app != s.name)
            {
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
        .collect()
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
    /// The UID of the StatefulSet its ownerReference last named.
    owner_set: Option<&'a str>,
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
    /// Claims by UID: the last `app` label and ownerReference seen on them.
    claims: HashMap<&'a str, (Option<&'a str>, Option<&'a (String, String)>)>,
}

fn build<'a>(records: &'a [Obs], forged: &HashSet<String>) -> History<'a> {
    let mut pods: HashMap<&str, PodLife<'a>> = HashMap::new();
    let mut pod_names: Vec<(&str, &str, &str)> = Vec::new();
    let mut sets: HashMap<(&str, &str), Vec<SetState>> = HashMap::new();
    let mut claims = HashMap::new();
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
                        owner_set: None,
                    }
                });
                if let Some((kind, uid)) = &obs.owner_ref
                    && kind == "StatefulSet"
                {
                    life.owner_set = Some(uid);
                }
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
            Kind::Claim => {
                // Labels and owners are kept from the last record that had them (a claim missing
                // from a relist is known by its UID only).
                let facts: &mut (Option<&str>, Option<&(String, String)>) =
                    claims.entry(obs.uid.as_str()).or_default();
                facts.0 = obs.app.as_deref().or(facts.0);
                facts.1 = obs.owner_ref.as_ref().or(facts.1);
            }
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
        claims,
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
        let (app, owner_ref) = history
            .claims
            .get(obs.uid.as_str())
            .copied()
            .unwrap_or_default();
        if let Some(why) = not_proven(app, owner_ref, layout) {
            stats.claims_deleted += 1;
            violations.push(Violation {
                invariant: 7,
                round: round.to_string(),
                at: obs.at,
                text: format!(
                    "claim {}/{} (uid {}) deleted at rv {} [record #{index}]: {why}",
                    obs.ns,
                    obs.name,
                    short(&obs.uid),
                    obs.rv
                ),
            });
            continue;
        }
        let Some((set, ordinal)) = layout.claim_owner(&obs.ns, &obs.name, app) else {
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
        // Every other set whose names fit the claim must not have wanted it either.
        for rival in layout.name_owners(&obs.ns, &obs.name, None) {
            if rival.0 != set {
                violations.extend(check_rival(&history, &deletion, rival, layout, round));
            }
        }
    }
    (violations, stats)
}

/// (1) for another set `rival` whose names fit the deleted claim: it wanted the claim's ordinal at
/// every revision the deletion may have happened at, and from the Succeeded of every genuine
/// cleanup pod listing the claim up to the deletion there was no revision at which it did not
/// exist or did not want the ordinal (the controller's read before the delete saw it wanting it).
fn check_rival(
    h: &History,
    d: &Deletion,
    (rival, ordinal): (usize, u32),
    layout: &Layout,
    round: &str,
) -> Option<Violation> {
    let (def, other) = (&layout.sets[d.set], &layout.sets[rival]);
    let ns = d.obs.ns.as_str();
    let states = h.sets.get(&(ns, other.name))?;
    let (lo, hi) = (d.obs.after, d.obs.rv);
    let at_deletion = states_in(states, lo, hi);
    if at_deletion.is_empty() || !at_deletion.iter().all(|s| s.wants(ordinal)) {
        return None;
    }
    let pod_name = format!("{}-{}", def.name, d.ordinal);
    let pods: &[PodLife] = h
        .pods
        .get(&(ns, pod_name.as_str()))
        .map_or(&[], Vec::as_slice);
    let absent_or_orphaned_after = |done: u64| {
        states.first().is_some_and(|s| s.after > done)
            || states_in(states, done, hi)
                .iter()
                .any(|s| !s.wants(ordinal))
    };
    let raced = pods
        .iter()
        .filter(|p| !p.forged && p.looks_cleanup && p.claims.contains(d.obs.uid.as_str()))
        .filter_map(|p| p.succeeded.or(p.vanished_unseen.then_some(p.last_rv)))
        .any(|done| done < hi && absent_or_orphaned_after(done));
    (!raced).then(|| Violation {
        invariant: 1,
        round: round.to_string(),
        at: d.obs.at,
        text: format!(
            "claim {ns}/{} (uid {}) deleted at rv {hi} [record #{}] while StatefulSet {}, whose claim of ordinal {ordinal} has that name, wanted it ({}); {}",
            d.obs.name,
            short(&d.obs.uid),
            d.index,
            other.name,
            describe(&at_deletion),
            pods_before(pods, hi, &pod_name),
        ),
    })
}

/// Why a claim is not any taking-part set's to delete, if it is not.
fn not_proven(
    app: Option<&str>,
    owner_ref: Option<&(String, String)>,
    layout: &Layout,
) -> Option<String> {
    if let Some((kind, uid)) = owner_ref
        && kind != "StatefulSet"
    {
        return Some(format!("it is owned by {kind} {}", short(uid)));
    }
    let app = app?;
    layout
        .sets
        .iter()
        .find(|s| s.name == app && !s.opted_in)
        .map(|s| {
            format!(
                "it carries the labels of set {}, which does not take part and keeps its claims",
                s.name
            )
        })
}

/// A pod delete the controller sent (through its Sieve proxy) and the API server answered.
#[derive(Clone, Debug)]
pub struct PodDelete {
    pub at: Duration,
    pub instance: String,
    pub ns: String,
    pub name: String,
    /// The delete's UID precondition.
    pub uid: Option<String>,
    pub status: u16,
}

/// Check (6) for the pod deletes of the controllers in `deletes`: a successful delete of a pod
/// that never looked like a cleanup pod, whose set (last named by its ownerReference) is not one
/// of `background` (UIDs of the sets deleted with background propagation), is a violation.
pub fn check_pod_deletes(
    records: &[Obs],
    deletes: &[PodDelete],
    forged: &HashSet<String>,
    background: &HashSet<String>,
    round: &str,
) -> Vec<Violation> {
    let history = build(records, forged);
    let mut out = Vec::new();
    for d in deletes.iter().filter(|d| (200..300).contains(&d.status)) {
        let lives = history
            .pods
            .get(&(d.ns.as_str(), d.name.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        // The pod it names, or (no precondition) the last one of that name.
        let life = match &d.uid {
            Some(uid) => lives.iter().find(|p| p.uid == uid),
            None => lives.last(),
        };
        let Some(life) = life else { continue };
        if life.looks_cleanup || life.forged {
            continue;
        }
        if life.owner_set.is_some_and(|set| background.contains(set)) {
            continue;
        }
        let owner = match life.owner_set {
            Some(set) => format!(
                "owned by set uid {}, not deleted in the background",
                short(set)
            ),
            None => "owned by no set (orphaned)".to_string(),
        };
        out.push(Violation {
            invariant: 6,
            round: round.to_string(),
            at: d.at,
            text: format!(
                "{} deleted stateful pod {}/{} uid {} ({owner}){}",
                d.instance,
                d.ns,
                d.name,
                short(life.uid),
                if d.uid.is_none() {
                    ", with no UID precondition"
                } else {
                    ""
                }
            ),
        });
    }
    out
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
    let sets = self_test_sets();
    let namespaces = vec!["ns".to_string()];
    let layout = Layout {
        sets: &sets,
        namespaces: &namespaces,
    };
    let mut cases = self_test_cases();
    cases.extend(ownership_cases());
    for (name, records, forged, want) in &cases {
        let forged: HashSet<String> = forged.iter().map(|s| s.to_string()).collect();
        let (found, _) = check_claims(records, 0..records.len(), &forged, &layout, "self-test");
        expect(name, &found, want)?;
    }
    Ok(cases.len() + self_test_pod_deletes()?)
}

fn expect(case: &str, found: &[Violation], want: &[u8]) -> Result<(), String> {
    let got: Vec<u8> = found.iter().map(|v| v.invariant).collect();
    if got == want {
        return Ok(());
    }
    let texts: Vec<String> = found.iter().map(ToString::to_string).collect();
    Err(format!(
        "case '{case}': expected violations {want:?}, got {got:?}: {texts:?}"
    ))
}

/// `web` takes part; `kept` does not (its claims are kept on purpose).
fn self_test_sets() -> Vec<SetDef> {
    let def = |name, opted_in| SetDef {
        ns: 0,
        name,
        claim_templates: &["data"],
        parallel: true,
        failing: false,
        opted_in,
        max: 4,
        initial: 3,
    };
    let mut rivals = [def("my-db", true), def("db", true)];
    rivals[1].claim_templates = &["data-my"];
    let mut all = vec![def("web", true), def("kept", false)];
    all.extend(rivals);
    all
}

/// Check (6) on a synthetic recording: stateful pod `web-0` of set `set-uid`, cleanup pod `web-2`.
fn self_test_pod_deletes() -> Result<usize, String> {
    let mut stateful = synthetic(Kind::Pod, "web-0", "s0", 9, 10);
    stateful.phase = Some("Running".into());
    stateful.owner_ref = Some(("StatefulSet".into(), "set-uid".into()));
    let mut orphaned = stateful.clone();
    (orphaned.after, orphaned.rv, orphaned.owner_ref) = (11, 12, None);
    let records = vec![stateful, orphaned, pod("c2", 2, 20, "Succeeded")];
    let delete = |name: &str, uid: Option<&str>, status| PodDelete {
        at: Duration::ZERO,
        instance: "chaos-a".into(),
        ns: "ns".into(),
        name: name.into(),
        uid: uid.map(str::to_string),
        status,
    };
    let cases: Vec<(&str, PodDelete, Vec<&str>, Vec<u8>)> = vec![
        (
            "stateful pod of an orphan-deleted set",
            delete("web-0", Some("s0"), 200),
            vec![],
            vec![6],
        ),
        (
            "stateful pod of a background-deleted set",
            delete("web-0", Some("s0"), 200),
            vec!["set-uid"],
            vec![],
        ),
        (
            "stateful pod, no UID precondition",
            delete("web-0", None, 200),
            vec![],
            vec![6],
        ),
        (
            "stateful pod, refused",
            delete("web-0", Some("s0"), 409),
            vec![],
            vec![],
        ),
        (
            "a cleanup pod",
            delete("web-2", Some("c2"), 200),
            vec![],
            vec![],
        ),
    ];
    for (name, d, background, want) in &cases {
        let background: HashSet<String> = background.iter().map(|s| s.to_string()).collect();
        let found = check_pod_deletes(
            &records,
            std::slice::from_ref(d),
            &HashSet::new(),
            &background,
            "self-test",
        );
        expect(name, &found, want)?;
    }
    Ok(cases.len())
}

/// A claim seen with `app` and `owner_ref`, then deleted.
fn labelled_claim_deleted(name: &str, app: Option<&str>, owner: Option<&str>) -> Vec<Obs> {
    let mut seen = synthetic(Kind::Claim, name, "claim-x", 19, 20);
    seen.app = app.map(str::to_string);
    seen.owner_ref = owner.map(|o| ("ConfigMap".to_string(), o.to_string()));
    let mut gone = synthetic(Kind::Claim, name, "claim-x", 29, 30);
    gone.how = How::Deleted;
    gone.deleting = true;
    vec![set(10, 3, false), seen, gone]
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

/// `my-db` (template `data`) cleans ordinal 0, whose claim `data-my-db-0` is also the name of
/// ordinal 0's claim of `db` (template `data-my`); `db` is created at revision `db_at`.
fn rival_case(db_at: u64) -> Vec<Obs> {
    let named = |kind, name: &str, uid: &str, rv: u64| synthetic(kind, name, uid, rv - 1, rv);
    let mut my_db = named(Kind::Set, "my-db", "my-db-uid", 10);
    my_db.replicas = Some(0);
    let mut db = named(Kind::Set, "db", "db-uid", db_at);
    db.replicas = Some(1);
    let mut cleanup = named(Kind::Pod, "my-db-0", "g", 25);
    cleanup.phase = Some("Succeeded".into());
    cleanup.cleanup_label = true;
    cleanup.owner = Some("my-db".into());
    cleanup.claims = [("data-my-db-0".to_string(), "claim-r".to_string())].into();
    let mut claim = named(Kind::Claim, "data-my-db-0", "claim-r", 5);
    claim.app = Some("my-db".into());
    let mut gone = named(Kind::Claim, "data-my-db-0", "claim-r", 30);
    gone.deleting = true;
    let mut records = vec![my_db, claim, cleanup, db, gone];
    records.sort_by_key(|o| o.rv);
    records
}

/// Claims whose names fit but that are not a taking-part set's (7), and one that is.
fn ownership_cases() -> Vec<Case> {
    vec![
        (
            "claim cleaned for one set while another set wanted it by name",
            rival_case(12),
            vec![],
            vec![1],
        ),
        (
            "the other set created after the cleanup pod Succeeded, before the delete",
            rival_case(28),
            vec![],
            vec![],
        ),
        (
            "foreign-owned claim named like an orphaned ordinal",
            labelled_claim_deleted("data-web-7", None, Some("cm-uid")),
            vec![],
            vec![7],
        ),
        (
            "kept claim of a set that does not take part",
            labelled_claim_deleted("data-kept-1", Some("kept"), None),
            vec![],
            vec![7],
        ),
        (
            "kept claim whose name also fits a set that takes part",
            labelled_claim_deleted("data-web-5", Some("kept"), None),
            vec![],
            vec![7],
        ),
        (
            "hand-made claim of an orphaned ordinal, no cleanup pod",
            labelled_claim_deleted("data-web-5", None, None),
            vec![],
            vec![2],
        ),
    ]
}

fn synthetic(kind: Kind, name: &str, uid: &str, after: u64, rv: u64) -> Obs {
    let mut obs = super::record::Obs::synthetic(kind, "ns", name, uid, after, rv);
    obs.at = Duration::from_millis(rv);
    obs
}
