//! From watch recordings to per-ordinal timelines and latency summaries. Pure functions over
//! plain records, so `--self-test` can check them on synthetic recordings without a cluster.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// One recorded change, reduced to what the timelines need. `at_ms` counts from the scale-down.
#[derive(Clone, Debug)]
pub struct Change {
    pub at_ms: f64,
    pub name: String,
    pub uid: String,
    pub gone: bool,
    pub deleting: bool,
    /// Pods: carries the `scaledown-pod` label (a cleanup pod).
    pub cleanup: bool,
    /// Pods: the phase ("Succeeded", ...).
    pub phase: String,
}

/// An ordinal the scale-down orphaned: its stateful pod and claim as they were before.
#[derive(Clone, Debug)]
pub struct Orphan {
    pub round: usize,
    pub set: String,
    pub ordinal: i32,
    pub pod: String,
    pub pod_uid: String,
    pub claim: String,
    pub claim_uid: String,
}

/// When things happened to one orphaned ordinal, in ms since the scale-down (None: not seen).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub pod_gone: Option<f64>,
    pub cleanup_created: Option<f64>,
    pub cleanup_succeeded: Option<f64>,
    pub claim_deleting: Option<f64>,
    pub claim_gone: Option<f64>,
    /// Distinct cleanup pods (UIDs) seen under the ordinal's name.
    pub cleanup_pods: usize,
}

/// The timeline of `orphan` from the pod and claim changes recorded since its round began.
pub fn timeline(orphan: &Orphan, pods: &[Change], claims: &[Change]) -> Timeline {
    let pod_gone = pods
        .iter()
        .find(|c| c.uid == orphan.pod_uid && c.gone)
        .map(|c| c.at_ms);
    let cleanups: Vec<&Change> = pods
        .iter()
        .filter(|c| c.name == orphan.pod && c.cleanup && c.uid != orphan.pod_uid)
        .collect();
    let uids: BTreeSet<&str> = cleanups.iter().map(|c| c.uid.as_str()).collect();
    Timeline {
        pod_gone,
        cleanup_created: cleanups.first().map(|c| c.at_ms),
        cleanup_succeeded: cleanups
            .iter()
            .find(|c| c.phase == "Succeeded")
            .map(|c| c.at_ms),
        claim_deleting: claims
            .iter()
            .find(|c| c.uid == orphan.claim_uid && (c.deleting || c.gone))
            .map(|c| c.at_ms),
        claim_gone: claims
            .iter()
            .find(|c| c.uid == orphan.claim_uid && c.gone)
            .map(|c| c.at_ms),
        cleanup_pods: uids.len(),
    }
}

/// The latencies the bench reports, each from one event of an ordinal to a later one.
pub const LATENCIES: [(&str, &str, &str); 4] = [
    ("pod_gone_to_cleanup_created", "pod_gone", "cleanup_created"),
    (
        "cleanup_succeeded_to_claim_deleting",
        "cleanup_succeeded",
        "claim_deleting",
    ),
    ("pod_gone_to_claim_deleting", "pod_gone", "claim_deleting"),
    ("pod_gone_to_claim_gone", "pod_gone", "claim_gone"),
];

impl Timeline {
    pub fn get(&self, event: &str) -> Option<f64> {
        match event {
            "pod_gone" => self.pod_gone,
            "cleanup_created" => self.cleanup_created,
            "cleanup_succeeded" => self.cleanup_succeeded,
            "claim_deleting" => self.claim_deleting,
            "claim_gone" => self.claim_gone,
            _ => None,
        }
    }
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// n, p50, p90, p99, max and mean of `values` (ms, rounded to 0.1 ms).
pub fn summary(values: &[f64]) -> Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let r = |v: Option<f64>| v.map(|x| (x * 10.0).round() / 10.0);
    let mean = (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64);
    json!({
        "n": sorted.len(),
        "p50": r(quantile(&sorted, 0.5)),
        "p90": r(quantile(&sorted, 0.9)),
        "p99": r(quantile(&sorted, 0.99)),
        "max": r(sorted.last().copied()),
        "mean": r(mean),
    })
}

/// Per latency name, the summary over every timeline that has both of its events.
pub fn latency_summaries(timelines: &[Timeline]) -> BTreeMap<&'static str, Value> {
    LATENCIES
        .iter()
        .map(|(name, from, to)| {
            let values: Vec<f64> = timelines
                .iter()
                .filter_map(|t| Some(t.get(to)? - t.get(from)?))
                .collect();
            (*name, summary(&values))
        })
        .collect()
}

pub fn timeline_json(orphan: &Orphan, t: &Timeline) -> Value {
    json!({
        "round": orphan.round,
        "set": orphan.set,
        "ordinal": orphan.ordinal,
        "pod_gone_ms": t.pod_gone,
        "cleanup_created_ms": t.cleanup_created,
        "cleanup_succeeded_ms": t.cleanup_succeeded,
        "claim_deleting_ms": t.claim_deleting,
        "claim_gone_ms": t.claim_gone,
        "cleanup_pods": t.cleanup_pods,
    })
}

/// Checks the functions above on synthetic recordings; the number of checks, or what failed.
pub fn self_test() -> Result<usize, String> {
    let mut checks = 0;
    let mut expect = |ok: bool, what: &str| -> Result<(), String> {
        checks += 1;
        if ok { Ok(()) } else { Err(what.to_string()) }
    };
    let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
    expect(quantile(&sorted, 0.5) == Some(50.0), "p50 of 1..=100 is 50")?;
    expect(
        quantile(&sorted, 0.99) == Some(99.0),
        "p99 of 1..=100 is 99",
    )?;
    expect(quantile(&sorted, 1.0) == Some(100.0), "p100 is the max")?;
    expect(
        quantile(&[7.0], 0.01) == Some(7.0),
        "any quantile of one value is it",
    )?;
    expect(quantile(&[], 0.5).is_none(), "no quantile of nothing")?;

    let change = |at_ms: f64,
                  name: &str,
                  uid: &str,
                  gone: bool,
                  deleting: bool,
                  cleanup: bool,
                  phase: &str| Change {
        at_ms,
        name: name.into(),
        uid: uid.into(),
        gone,
        deleting,
        cleanup,
        phase: phase.into(),
    };
    let orphan = Orphan {
        round: 0,
        set: "s".into(),
        ordinal: 1,
        pod: "s-1".into(),
        pod_uid: "p1".into(),
        claim: "data-s-1".into(),
        claim_uid: "c1".into(),
    };
    let pods = vec![
        change(5.0, "s-1", "p1", false, true, false, "Running"),
        change(10.0, "s-1", "p1", true, true, false, "Running"),
        // A look-alike of another ordinal and a cleanup pod of another set do not count.
        change(11.0, "s-2", "x", false, false, true, "Pending"),
        change(40.0, "s-1", "k1", false, false, true, "Pending"),
        change(60.0, "s-1", "k1", false, false, true, "Running"),
        change(90.0, "s-1", "k1", false, false, true, "Succeeded"),
        change(95.0, "s-1", "k1", false, true, true, "Succeeded"),
        change(96.0, "s-1", "k1", true, true, true, "Succeeded"),
        // A second create (after a 409 or a recreate) shows up as a second UID.
        change(97.0, "s-1", "k2", false, false, true, "Pending"),
    ];
    let claims = vec![
        change(1.0, "data-s-1", "c1", false, false, false, ""),
        change(120.0, "data-s-1", "c1", false, true, false, ""),
        change(130.0, "data-s-1", "c1", true, true, false, ""),
    ];
    let t = timeline(&orphan, &pods, &claims);
    let want = Timeline {
        pod_gone: Some(10.0),
        cleanup_created: Some(40.0),
        cleanup_succeeded: Some(90.0),
        claim_deleting: Some(120.0),
        claim_gone: Some(130.0),
        cleanup_pods: 2,
    };
    expect(t == want, &format!("timeline: got {t:?}, want {want:?}"))?;
    let s = latency_summaries(&[t]);
    expect(
        s["pod_gone_to_cleanup_created"]["p50"] == json!(30.0),
        "created - gone = 30",
    )?;
    expect(
        s["cleanup_succeeded_to_claim_deleting"]["max"] == json!(30.0),
        "deleting - succeeded = 30",
    )?;
    expect(s["pod_gone_to_claim_gone"]["n"] == json!(1), "one sample")?;
    // Native: no cleanup pod, the claim deleted by the garbage collector.
    let native = timeline(&orphan, &pods[..2], &claims);
    expect(
        native.cleanup_created.is_none() && native.cleanup_pods == 0,
        "no cleanup pod in a native run",
    )?;
    let s = latency_summaries(&[native]);
    expect(
        s["pod_gone_to_cleanup_created"]["n"] == json!(0)
            && s["pod_gone_to_claim_gone"]["p99"] == json!(120.0),
        "native latencies",
    )?;
    Ok(checks)
}
