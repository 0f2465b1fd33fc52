//! What `kubectl scaledown status` shows about one StatefulSet, computed from the same facts and
//! rules as the controller (`observe`, `decide`), and its rendering. Pure: no IO.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::reason::Reason;
use crate::scaledown::act::describe;
use crate::scaledown::decide::status;
use crate::scaledown::decide::{Plan, Step};
use crate::scaledown::observe::{Observed, Phase, PodRole};

/// `status -o`: how the statuses are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)] // clap would print a variant's doc comment in --help
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

/// The state of one opted-in StatefulSet, as the controller sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetStatus {
    /// The set's namespace.
    pub namespace: String,
    /// The set's name.
    pub name: String,
    /// The one-word status (`Idle`, `CleaningUp`, `Stalled`, `Paused`), computed by the
    /// controller's own rule (`decide::status`) from this read.
    pub status: String,
    /// Why, when `Stalled` or `Paused`.
    pub status_reason: Option<String>,
    /// The status annotation the controller last wrote on the set, if any. It can also name
    /// causes only the controller's memory holds (creations the API server refused, records that
    /// lost every race).
    pub status_annotation: Option<String>,
    /// `spec.replicas`.
    pub replicas: u32,
    /// The ordinals the set wants, e.g. `0..2` (empty when none).
    pub wanted: String,
    /// Claims of ordinals the set does not want (the ones the controller cleans up).
    pub orphaned_claims: Vec<String>,
    /// The cleanup pods in the set's record.
    pub cleanups: Vec<Cleanup>,
    /// Pods that look like cleanup pods but are not in the controller's record.
    pub unproven_pods: Vec<String>,
    /// Ordinals whose cleanup failed every attempt; their claims are kept.
    pub gave_up: Vec<u32>,
    /// The set asks Kubernetes itself to delete claims on scale-down.
    pub native_policy_conflict: bool,
    /// What the controller would write next, in order.
    pub next: Vec<String>,
    /// Problems the controller reports on this set now (Warning reasons and notes).
    pub warnings: Vec<String>,
    /// The newest Warning Event on the set, if any is left (Events expire).
    pub last_warning: Option<String>,
    /// The set is being deleted and waits for our finalizer.
    pub deleting: bool,
    /// The set carries the controller's finalizer.
    pub has_finalizer: bool,
}

/// A cleanup pod of the controller (its UID is in the set's record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cleanup {
    /// The pod's name.
    pub pod: String,
    /// The ordinal it cleans up.
    pub ordinal: u32,
    /// Its phase (`Pending`, `Running`, `Succeeded`, `Failed`).
    pub phase: String,
    /// Which attempt it is (1 for the first).
    pub attempt: u32,
}

impl SetStatus {
    /// The status of the set observed in `o`, given the plan `decide` made from it.
    pub fn new(o: &Observed, plan: &Plan, last_warning: Option<String>) -> Self {
        let set = &o.set;
        let line = status::line(o, plan, &Default::default());
        let mut status = SetStatus {
            namespace: set.namespace.clone(),
            name: set.name.clone(),
            status: line
                .as_ref()
                .map_or("-".into(), |l| l.status.as_str().into()),
            status_reason: line.and_then(|l| l.reason),
            status_annotation: set.status.clone(),
            replicas: set.replicas,
            wanted: wanted(set.start, set.replicas, set.deleting),
            orphaned_claims: Vec::new(),
            cleanups: Vec::new(),
            unproven_pods: Vec::new(),
            gave_up: Vec::new(),
            native_policy_conflict: set.when_scaled_delete,
            next: Vec::new(),
            warnings: Vec::new(),
            last_warning,
            deleting: set.deleting,
            has_finalizer: set.has_finalizer(),
        };
        for (ordinal, facts) in &o.ordinals {
            if !set.wants(*ordinal) {
                let live = facts.claims.iter().filter(|c| !c.deleting);
                status.orphaned_claims.extend(live.map(|c| c.name.clone()));
            }
            match facts.pod.as_ref().map(|p| (&p.name, &p.role)) {
                Some((name, PodRole::Cleanup(c))) => status.cleanups.push(Cleanup {
                    pod: name.clone(),
                    ordinal: *ordinal,
                    phase: phase(c.phase, c.gated).into(),
                    attempt: c.attempt,
                }),
                Some((name, PodRole::Unproven { .. })) => status.unproven_pods.push(name.clone()),
                _ => {}
            }
        }
        for step in &plan.steps {
            match step {
                Step::Event(e) if e.reason == Reason::CleanupGaveUp => {
                    status.gave_up.extend(status::event_ordinal(o, e));
                    status.warnings.push(format!("{}: {}", e.reason, e.note));
                }
                Step::Event(e) if e.reason.is_warning() => {
                    status.warnings.push(format!("{}: {}", e.reason, e.note))
                }
                Step::Event(_) => {}
                other => status.next.push(describe(other)),
            }
        }
        status
    }
}

fn wanted(start: u32, replicas: u32, deleting: bool) -> String {
    if deleting || replicas == 0 {
        return "none".into();
    }
    let end = u64::from(start) + u64::from(replicas) - 1;
    if replicas == 1 {
        start.to_string()
    } else {
        format!("{start}..{end}")
    }
}

fn phase(phase: Phase, gated: bool) -> &'static str {
    match (phase, gated) {
        (_, true) => "Gated",
        (Phase::Pending, _) => "Pending",
        (Phase::Running, _) => "Running",
        (Phase::Succeeded, _) => "Succeeded",
        (Phase::Failed, _) => "Failed",
        (Phase::Unknown, _) => "Unknown",
    }
}

/// `sets` in the form `-o` asks for: a table (with its header line unless `headers` is false, as
/// kubectl's `--no-headers`), JSON or YAML (both a list of sets, with the same fields).
pub fn format(sets: &[SetStatus], output: Output, headers: bool) -> Result<String> {
    let encode = |source| Error::Encode {
        what: "status",
        source,
    };
    match output {
        Output::Table => Ok(render(sets, false, headers)),
        Output::Wide => Ok(render(sets, true, headers)),
        Output::Json => serde_json::to_string_pretty(sets)
            .map(|s| s + "\n")
            .map_err(encode),
        Output::Yaml => {
            serde_saphyr::to_string(&sets).map_err(|e| encode(serde::ser::Error::custom(e)))
        }
    }
}

/// A table, one line per set; `wide` adds the warnings and the last Warning Event; `headers`
/// puts the column names first.
pub fn render(sets: &[SetStatus], wide: bool, headers: bool) -> String {
    let mut header = vec![
        "NAMESPACE",
        "STATEFULSET",
        "STATUS",
        "WANTED",
        "ORPHANED",
        "CLEANUPS",
        "GAVE-UP",
        "NEXT",
    ];
    if wide {
        header.extend(["REASON", "UNPROVEN", "WARNINGS", "LAST-WARNING"]);
    }
    let mut rows = Vec::new();
    if headers {
        rows.push(header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    }
    for s in sets {
        rows.push(row(s, wide));
    }
    table(&rows)
}

fn row(s: &SetStatus, wide: bool) -> Vec<String> {
    let or_none = |items: Vec<String>| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(",")
        }
    };
    let cleanups = s
        .cleanups
        .iter()
        .map(|c| format!("{}:{}#{}", c.pod, c.phase, c.attempt))
        .collect();
    let mut next = s.next.clone();
    if s.native_policy_conflict {
        next.insert(0, "nothing: whenScaled is Delete".into());
    }
    let mut row = vec![
        s.namespace.clone(),
        s.name.clone(),
        s.status.clone(),
        s.wanted.clone(),
        or_none(s.orphaned_claims.clone()),
        or_none(cleanups),
        or_none(s.gave_up.iter().map(u32::to_string).collect()),
        if next.is_empty() {
            "wait".into()
        } else {
            next.join("; ")
        },
    ];
    if wide {
        row.push(s.status_reason.clone().unwrap_or_else(|| "-".into()));
        row.push(or_none(s.unproven_pods.clone()));
        row.push(or_none(s.warnings.clone()));
        row.push(s.last_warning.clone().unwrap_or_else(|| "-".into()));
    }
    row
}

/// Columns padded to their widest cell, two spaces apart, like kubectl's tables.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            let cells = rows.iter().filter_map(|r| r.get(c));
            cells.map(|s| s.chars().count()).max().unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
