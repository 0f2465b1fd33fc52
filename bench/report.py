#!/usr/bin/env python3
"""Turns the bench results (bench/results/*.json, written by `make bench`) into BENCHMARKS.md and
the plots in bench/plots/. Nothing in BENCHMARKS.md is written by hand.

    bench/report.py            rewrite BENCHMARKS.md and the plots (needs matplotlib)
    bench/report.py --check    only the standard library: fail if BENCHMARKS.md is not what the
                               JSON gives, or a plot it names is missing (run by `make unit`)

The table of each scenario shows its newest run; "before" columns and dashed plot lines show the
oldest run of the same scenario made on another controller commit, when there is one.
"""

import argparse
import difflib
import glob
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PLOTS = os.path.join(ROOT, "bench", "plots")
MARKDOWN = os.path.join(ROOT, "BENCHMARKS.md")

SCENARIOS = ["single", "sets20", "sets500", "sets5000", "corpus", "idle", "podbound", "realnode"]
# kube-controller-manager work queues on the path of a scale-down's claims.
QUEUES = ["statefulset", "garbage_collector_attempt_to_delete", "pvcprotection"]
NOTES = os.path.join(ROOT, "bench", "notes.md")
TITLES = {
    "single": "1 set of 2 → 1, rounds one after another (latency floor)",
    "sets20": "20 sets of 3 → 2 at once",
    "sets500": "500 sets of 2 → 1 at once, one namespace",
    "sets5000": "5,000 sets of 2 → 1 at once, 10 namespaces of 500",
    "corpus": "100 sets of 2 → 1 at once, each with its own shell-heavy cleanup template "
              "(`&&`, `||`, `|`, `<`, `>`, `2>&1`, here-docs, non-ASCII, U+2028, CRLF, YAML block scalars)",
    "idle": "idle: background pods and annotated sets, nothing changes",
    "podbound": "claims bound to pods (`--pod-bound-claims`): claims and their pods created among background pods, "
                "then the pods deleted",
    "realnode": "10 sets of 3 → 1 at once, pods and cleanup pods real containers on the real node",
}
# Latencies of the podbound rounds: (round, key in latency_ms, label).
PODBOUND_LATENCIES = {
    "bind": ("pod_created_to_owner_added", "pod created → ownerReference on its claim"),
    "delete": ("pod_gone_to_claim_gone", "pod gone → claim gone"),
}
# (key, label, from event, to event)
LATENCIES = [
    ("created", "stateful pod gone → cleanup pod created", "pod_gone_ms", "cleanup_created_ms"),
    ("deletion", "cleanup Succeeded → claim deletion seen", "cleanup_succeeded_ms", "claim_deleting_ms"),
    ("deleting", "stateful pod gone → claim deletion seen", "pod_gone_ms", "claim_deleting_ms"),
    ("gone", "stateful pod gone → claim gone", "pod_gone_ms", "claim_gone_ms"),
    ("released", "cleanup pod created → released (confirm gate removed)", "released_pod_created_ms",
     "cleanup_released_ms"),
    ("allowed", "release allowed (set status caught up, or pod created if later) → released", "release_allowed_ms",
     "cleanup_released_ms"),
]


def load_runs():
    runs = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        for key in ("schema", "scenario", "started_at", "phases", "versions", "machine"):
            if key not in run:
                raise SystemExit(f"{path}: missing key {key!r}")
        run["_file"] = os.path.relpath(path, ROOT)
        runs.append(run)
    return runs


def quantile(values, q):
    """Nearest rank, as the bench runner computes it."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(q * len(s)))
    return s[min(rank, len(s)) - 1]


def phase(run, mode):
    for p in run["phases"]:
        if p.get("mode") == mode:
            return p
    return None


def ordinals(p):
    return [o for r in (p or {}).get("rounds", []) for o in r.get("ordinals", [])]


def event(o, key):
    """An ordinal's event time; `release_allowed_ms` is when the release rule first held: the
    released pod existed and the set's status showed the StatefulSet controller done."""
    if key == "release_allowed_ms":
        created, caught_up = o.get("released_pod_created_ms"), o.get("set_caught_up_ms")
        return None if created is None or caught_up is None else max(created, caught_up)
    return o.get(key)


def latencies(p, start, end):
    pairs = ((event(o, start), event(o, end)) for o in ordinals(p))
    return [b - a for a, b in pairs if a is not None and b is not None]


def ms(v):
    if v is None:
        return "–"
    if abs(v) >= 10000:
        return f"{v / 1000:.1f} s"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}"


def ms_unit(v):
    return ms(v) + ("" if v is None or abs(v) >= 10000 else " ms")


def num(v, digits=1):
    return "–" if v is None else f"{v:.{digits}f}"


def latest(runs, scenario):
    own = [r for r in runs if r["scenario"] == scenario]
    return max(own, key=lambda r: r["started_at"]) if own else None


def baseline(runs, scenario, newest):
    """The oldest run of the scenario with the same parameters on another controller commit, if any."""
    commit = newest["versions"]["controller_commit"]
    older = [r for r in runs if r["scenario"] == scenario and r["versions"]["controller_commit"] != commit
             and r["started_at"] < newest["started_at"] and same_setup(r, newest)]
    return min(older, key=lambda r: r["started_at"]) if older else None


def requests_line(requests):
    by_verb = requests.get("by_verb", {})
    parts = [f"{verb} {int(n)}" for verb, n in sorted(by_verb.items())]
    return ", ".join(parts) if parts else "none"


def pod_creates(requests):
    return sum(n for k, n in requests.get("by_verb_resource_code", {}).items() if k.startswith("create pods "))


# The kinds of request a cleanup costs, by (verb, resource); what is not listed counts as "other".
REQUEST_KINDS = [
    ("pod creates", {("create", "pods")}),
    ("pod patches (release, next-attempt marks)", {("patch", "pods"), ("patch", "persistentvolumeclaims")}),
    ("set patches (finalizer, record, status, guard)", {("patch", "statefulsets")}),
    ("set reads", {("get", "statefulsets")}),
    ("lists", {("list", "pods"), ("list", "persistentvolumeclaims"), ("list", "statefulsets")}),
    ("deletes", {("delete", "pods"), ("delete", "persistentvolumeclaims")}),
    ("Events", {("create", "events"), ("patch", "events")}),
]


def requests_by_kind(requests):
    """(kind -> count) of the requests besides watches, from `by_verb_resource_code`."""
    out = {kind: 0.0 for kind, _ in REQUEST_KINDS}
    out["other"] = 0.0
    for key, n in requests.get("by_verb_resource_code", {}).items():
        verb, resource = key.split(" ")[:2]
        kind = next((k for k, members in REQUEST_KINDS if (verb, resource) in members), "other")
        out[kind] += n
    return out


def refused_creates(requests):
    """The pod creates the API server did not answer 201 to, as 'N code'."""
    refused = [(k.split(" ")[2], int(n)) for k, n in requests.get("by_verb_resource_code", {}).items()
               if k.startswith("create pods ") and not k.endswith(" 201")]
    return ", ".join(f"{n} answered {code}" + (" (AlreadyExists: the name was still held)" if code == "409" else "")
                     for code, n in sorted(refused))


def kinds_table(runs, scenarios):
    """Requests per cleanup by kind, one column per scenario (its latest controller run)."""
    cols = []
    for s in scenarios:
        r = latest(runs, s)
        p = phase(r, "controller") if r else None
        if not p or not p.get("controller"):
            continue
        cleanups = sum(x.get("orphans", 0) for x in p.get("rounds", []))
        if cleanups:
            cols.append((s, requests_by_kind(p["controller"]["requests_in_window"]), cleanups))
    if not cols:
        return []
    out = ["| Requests per cleanup | " + " | ".join(f"`{s}`{reduced_label(latest(runs, s))} ({int(c)} cleanups)"
                                               for s, _, c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for kind in [k for k, _ in REQUEST_KINDS] + ["other"]:
        if all(by[kind] == 0 for _, by, _ in cols):
            continue
        out.append(f"| {kind} | " + " | ".join(f"{by[kind] / c:.2f}" for _, by, c in cols) + " |")
    out.append("| **besides Events** | " + " | ".join(
        f"**{(sum(by.values()) - by['Events']) / c:.2f}**" for _, by, c in cols) + " |")
    return out


def all_done_ms(p):
    rounds = (p or {}).get("rounds", [])
    return max((r["all_done_ms"] for r in rounds if "all_done_ms" in r), default=None)


def complete(p):
    return p is not None and p.get("setup_ok") and all(r.get("complete") for r in p.get("rounds", []))


def commit_of(run):
    v = run["versions"]
    return v["controller_commit"] + ("+dirty" if v.get("controller_dirty") else "")


def cleanup_stats(p):
    """The cleanup pods of a controller phase over all its rounds. Runs before the audit log was
    read (no `cleanup_pods` per round) have None for what only it tells."""
    if not p or not p.get("rounds") or not ordinals(p):
        return None
    ords = ordinals(p)
    counts = [o.get("cleanup_pods", 0) for o in ords]
    summaries = [r.get("cleanup_pods") for r in p["rounds"]]
    audited = all(isinstance(x, dict) and x.get("audit") for x in summaries)

    def total(key):
        return sum(x.get(key) or 0 for x in summaries) if audited else None

    by = {}
    for x in summaries if audited else []:
        for k, v in (x.get("late_deletes_by") or {}).items():
            by[k] = by.get(k, 0) + v
    audit = p.get("audit") or {}
    records = audit.get("record_patches") if audit.get("available") else None
    errors = (p.get("controller") or {}).get("reconcile_errors_in_window")
    return {
        "ordinals": len(ords),
        "creates": sum(counts),
        "per_ordinal": sum(counts) / len(ords) if ords else None,
        "max": max(counts) if counts else None,
        "late": total("late_deletes"),
        "late_gated": total("late_deletes_gated"),
        "late_by": by,
        "controller_early": total("deleted_by_controller_before_start"),
        "after_start": total("deleted_by_others_after_start"),
        "records": records["total"] if records else None,
        "records_failed": records["failed"] if records else None,
        "records_failed_by_code": (records or {}).get("failed_by_code") or {},
        "contended": None if errors is None else errors.get("contended", 0),
    }


def record_failures(stats):
    """Refused record patches from the audit log, else failed `contended` passes from the metric."""
    if not stats:
        return None
    return stats["records_failed"] if stats["records_failed"] is not None else stats["contended"]


def cluster_of(run):
    """How the run's cluster was shared, from its phases (None: not recorded)."""
    infos = [p.get("cluster") for p in run["phases"] if p.get("cluster")]
    if not infos:
        return None
    return {
        "shared": any(i["shared"] for i in infos),
        "others": max(max(i["other_namespaces_at_start"], i["other_namespaces_at_end"]) for i in infos),
        "scoped": any(i.get("controller_scope") == "namespace" for i in infos),
    }


# === run sizes, regressions, growth (issue 25) ===

# Parameters that do not change what a run measures, only when it gives up.
NOT_SIZE = {"timeout"}
# Scale-down scenarios of the growth plot, by number of sets.
GROWTH = ["single", "sets20", "sets500", "sets5000"]
# Regression rule: worse by more than this fraction AND by more than the absolute amount.
NOISE_FRACTION = 0.25
NOISE_MS = 50.0
NOISE_CPU_S = 1.0


def reductions(run):
    """The parameters in which a run differs from its scenario's preset, as (name, value, preset).
    Results written before the preset was recorded ran the preset (all committed ones did)."""
    preset = run.get("preset") or {}
    params = run.get("params") or {}
    return [(k, params.get(k), v) for k, v in sorted(preset.items())
            if k not in NOT_SIZE and params.get(k) != v]


def reduced_label(run):
    """'' for a run of the preset; else ' (reduced: sets 300 of 5000, set-namespaces 3 of 10)'."""
    diffs = reductions(run)
    if not diffs:
        return ""
    return " (reduced: " + ", ".join(f"{k} {num(v, 0)} of {num(w, 0)}" for k, v, w in diffs) + ")"


def latest_full(runs, scenario):
    """The newest run of the scenario at its preset's size (None: none yet)."""
    own = [r for r in runs if r["scenario"] == scenario and not reductions(r)]
    return max(own, key=lambda r: r["started_at"]) if own else None


def same_setup(a, b):
    """Two runs of the same scenario, parameters and controller flags (timeouts aside)."""
    def size(r):
        return {k: v for k, v in (r.get("params") or {}).items() if k not in NOT_SIZE}
    return (a["scenario"] == b["scenario"] and size(a) == size(b)
            and (a.get("controller_args") or []) == (b.get("controller_args") or []))


def previous(runs, newest):
    """The run before `newest` of the same scenario, parameters and flags (None: none)."""
    older = [r for r in runs if same_setup(r, newest) and r["started_at"] < newest["started_at"]]
    return max(older, key=lambda r: r["started_at"]) if older else None


def cleanups_of(p):
    return sum(r.get("orphans", 0) for r in (p or {}).get("rounds", []))


def measures(run):
    """The measures a regression is judged on: (name, value, unit) with unit 'ms' or 's' (CPU)."""
    p = phase(run, "controller")
    if not p:
        return []
    out = []
    if run["scenario"] == "podbound":
        for rnd in p.get("rounds", []):
            key, label = PODBOUND_LATENCIES.get(rnd["name"], (None, rnd["name"]))
            out.append((f"{rnd['name']}: {label}, p99", ((rnd.get("latency_ms") or {}).get(key) or {}).get("p99"),
                        "ms"))
            out.append((f"{rnd['name']}: controller CPU", rnd.get("cpu_s"), "s"))
        return out
    for _key, label, start, end in LATENCIES:
        values = latencies(p, start, end)
        if values:
            out.append((f"{label}, p99", quantile(values, 0.99), "ms"))
    cpu = ((p.get("controller") or {}).get("cpu_s") or {}).get("window")
    out.append(("controller CPU in the window", cpu, "s"))
    return out


def worse(old, new, unit):
    """Worse beyond noise: more than NOISE_FRACTION up and more than NOISE_MS / NOISE_CPU_S."""
    if old is None or new is None:
        return False
    floor = NOISE_MS if unit == "ms" else NOISE_CPU_S
    return new > old * (1 + NOISE_FRACTION) and new - old > floor


def flags(runs, new):
    """The rows of `new` against the run before it of the same setup, and that run (None: none)."""
    old = previous(runs, new)
    if not old:
        return [], None
    before = {name: v for name, v, _unit in measures(old)}
    return [regression_row(new["scenario"], name, unit, (old, before.get(name)), (new, v))
            for name, v, unit in measures(new) if worse(before.get(name), v, unit)], old


def regressions(runs):
    """The Regressions section: each scenario's newest run against the run before it of the same
    setup, a row per measure that got worse beyond noise; then the same for every earlier run, so a
    regression stays on record after a later run."""
    rows, compared, earlier = [], [], []
    for s in SCENARIOS:
        new = latest(runs, s)
        if not new:
            continue
        found, old = flags(runs, new)
        rows += found
        if old:
            compared.append(f"`{s}` {os.path.basename(new['_file'])} (`{commit_of(new)}`) against "
                            f"{os.path.basename(old['_file'])} (`{commit_of(old)}`)")
        for r in sorted((r for r in runs if r["scenario"] == s and r is not new), key=lambda r: r["started_at"]):
            earlier += flags(runs, r)[0]
    head = ["| Scenario | Measure | previous run | newer run | change | native phase, control-plane CPU |",
            "|---|---|---|---|---|---|"]
    out = [f"Each scenario's newest run against the run before it with the same parameters and controller flags; "
           f"a p99 latency or the controller's CPU is flagged when it got worse by more than "
           f"{NOISE_FRACTION:.0%} **and** by more than {NOISE_MS:.0f} ms (latencies) or {NOISE_CPU_S:.0f} s (CPU) "
           f"(bench/README.md). The last column is the yardstick for the machine: the control plane's CPU "
           f"in the native phase of the same two runs, the same workload without the controller; where it "
           f"rose as much, the machine was slower, not the controller. Compared: " + ("; ".join(compared) if compared else "none") + ".", ""]
    out += head + rows if rows else ["No regressions beyond noise."]
    if earlier:
        out += ["", "Earlier runs, each against the run before it (the same rule; a later run may have answered "
                "them):", ""] + head + earlier
    return out


def native_cp_cpu(run):
    """The control plane's CPU seconds (all its processes) in the native phase: the same workload
    without the controller, so its change between two runs is the machine's, not the controller's."""
    cpu = ((phase(run, "native") or {}).get("control_plane") or {}).get("cpu_s") or {}
    return sum(cpu.values()) or None


def yardstick(old_run, new_run):
    """The native phase's control-plane CPU of the newer run against the older one ('–': no native
    phase in one of them)."""
    old, new = native_cp_cpu(old_run), native_cp_cpu(new_run)
    return f"× {new / old:.2f} ({num(old, 1)} → {num(new, 1)} s)" if old and new else "–"


def regression_row(scenario, name, unit, old, new):
    """A row of the Regressions table; `old` and `new` are (run, value)."""
    def cell(run, v):
        text = ms_unit(v) if unit == "ms" else f"{v:.2f} s"
        return f"{text} (`{commit_of(run)}`, load {num((run.get('loadavg_start') or [None])[0], 1)})"
    ratio = f"× {new[1] / old[1]:.1f}" if old[1] else "from 0"
    return (f"| `{scenario}`{reduced_label(new[0])} | {name} | {cell(*old)} | {cell(*new)} | {ratio} | "
            f"{yardstick(old[0], new[0])} |")


def growth_points(runs):
    """Per scale-down scenario of GROWTH, its newest run: (scenario, label, sets, requests per
    cleanup besides watches, controller CPU ms per cleanup, p99 pod gone → cleanup created, p99
    cleanup Succeeded → claim deletion seen)."""
    out = []
    for s in GROWTH:
        r = latest(runs, s)
        p = phase(r, "controller") if r else None
        c = (p or {}).get("controller")
        n = cleanups_of(p)
        if not c or not n:
            continue
        out.append({
            "scenario": s,
            "label": s + reduced_label(r),
            "sets": int(r["params"]["sets"]),
            "cleanups": n,
            "requests": c["requests_in_window"]["non_watch_total"] / n,
            "cpu_ms": c["cpu_s"]["window"] * 1000 / n,
            "created_p99": quantile(latencies(p, "pod_gone_ms", "cleanup_created_ms"), 0.99),
            "deletion_p99": quantile(latencies(p, "cleanup_succeeded_ms", "claim_deleting_ms"), 0.99),
            "commit": commit_of(r),
        })
    return out


def growth_section(runs):
    points = growth_points(runs)
    if not points:
        return []
    out = ["The newest run of each scale-down scenario, by the number of sets scaled down at once "
           "(requests and CPU per cleanup from the controller's counters in the scale-down window).", "",
           "| Run | Sets | Cleanups | Requests per cleanup (besides watches) | Controller CPU per cleanup | "
           "p99 pod gone → cleanup created | p99 cleanup Succeeded → claim deletion seen |",
           "|---|---|---|---|---|---|---|"]
    for x in points:
        out.append(f"| `{x['scenario']}`{x['label'][len(x['scenario']):]} `{x['commit']}` | {x['sets']} | "
                   f"{x['cleanups']} | {x['requests']:.2f} | {x['cpu_ms']:.1f} ms | {ms_unit(x['created_p99'])} | "
                   f"{ms_unit(x['deletion_p99'])} |")
    return out + ["", "![cost and latency against the number of sets](bench/plots/growth.png)"]


def reduced_lines(run):
    """A warning under a section whose newest run is not at its preset's size, or whose phases
    were refused (several namespaces on a shared cluster)."""
    refused = [f"**Phase {p['mode']} not run**: {p['setup_refused']}." for p in run["phases"]
               if p.get("setup_refused")]
    if refused:
        refused.append("")
    if not reductions(run):
        return refused
    sizes = ", ".join(f"{k} {num(v, 0)} of {num(w, 0)}" for k, v, w in reductions(run))
    return [f"**Reduced run** ({sizes}): not the scenario at full size; its targets count only full-size runs.",
            ""] + refused


def time_lines(run):
    """Where the time of a scale-down went, per phase: kube-controller-manager's own lag (scale-down
    issued → the set's status shows it done), the API server's queues (APF waits by priority
    level), and the controller's own steps (its queue has no metric: the latencies that are its
    work alone)."""
    out = []
    for p in run["phases"]:
        caught = [o["set_caught_up_ms"] for o in ordinals(p) if o.get("set_caught_up_ms") is not None]
        parts = []
        if caught:
            parts.append(f"kube-controller-manager's status lag (scale-down issued → set status caught up) "
                         f"p50 {ms_unit(quantile(caught, 0.5))}, p99 {ms_unit(quantile(caught, 0.99))} "
                         f"({len(caught)} ordinals)")
        levels = ((p.get("apiserver_queues") or {}).get("apf_queue_wait_by_priority_level") or {})
        if levels:
            busiest = sorted(levels.items(), key=lambda kv: -kv[1]["wait_s"])[:3]
            parts.append("API server queues (APF), mean wait: " + ", ".join(
                f"{k} {ms_unit(v['mean_wait_ms'])} over {int(v['requests'])} requests" for k, v in busiest))
        if p.get("mode") == "controller" and ordinals(p):
            mine = [quantile(latencies(p, a, b), 0.99) for _, _, a, b in (LATENCIES[0], LATENCIES[5])]
            parts.append(f"the controller's own steps, p99: pod gone → cleanup created {ms_unit(mine[0])}, "
                         f"release allowed → released {ms_unit(mine[1])}")
        if parts:
            out.append(f"- Where the time went, {p['mode']} phase: " + "; ".join(parts) + ".")
    return out


# The controller's own waits (tests/bench/probe.rs LATENCY_HISTOGRAMS), as the result names them.
WAIT_HISTOGRAMS = [
    ("waited for a pass slot", "scaledown_pass_start_wait_seconds", "passes"),
    ("waited for its namespace list", "scaledown_namespace_list_wait_seconds", "asks"),
    ("one namespace list took", 'scaledown_namespace_list_duration_seconds{kind="all"}', "lists"),
]
LIST_KINDS = ("claims", "pods", "statefulsets")


# The last finite bucket bound of the controller's histograms, for results written before the
# bench recorded it (`last_bound`): `wait_buckets` reached 65,536 ms from their start (`3d09754`)
# to `3cd001f`, the callers' buckets 1,024.
OLD_LAST_BOUND = {"scaledown_namespace_list_callers": 1024.0}
OLD_WAIT_BOUND_MS = 65536.0


def last_bound(key, series):
    """The largest finite bucket bound of a histogram: a quantile at or above it lies in the open
    top bucket, so it is only known to be above."""
    if series.get("last_bound") is not None:
        return series["last_bound"]
    return OLD_LAST_BOUND.get(key, OLD_WAIT_BOUND_MS if series.get("unit") == "ms" else None)


def hq(key, series, which, fmt=None):
    """A quantile of a histogram as text, "> bound" when it lies in the open top bucket."""
    fmt = fmt or ms_unit
    value, bound = series[which], last_bound(key, series)
    if value is not None and bound is not None and value >= bound:
        return f"> {fmt(bound)}"
    return fmt(value)


def wait_lines(run):
    """Where a pass of the controller waited during the scale-down, from its histograms (the
    results since issue 25 carry them; quantiles interpolated within Prometheus buckets)."""
    p = phase(run, "controller")
    h = ((p or {}).get("controller") or {}).get("latency_histograms_in_window")
    if not h:
        return []

    def q(key, series):
        return f"p50 {hq(key, series, 'p50')}, p99 {hq(key, series, 'p99')}"

    parts = []
    for label, key, what in WAIT_HISTOGRAMS:
        series = h.get(key)
        if series and series["count"]:
            parts.append(f"{label} {q(key, series)} ({int(series['count'])} {what})")
    kinds = [f'scaledown_namespace_list_duration_seconds{{kind="{k}"}}' for k in LIST_KINDS]
    kinds = [(k, key, h.get(key)) for k, key in zip(LIST_KINDS, kinds)]
    kinds = [f"{k} {q(key, v)}" for k, key, v in kinds if v and v["count"]]
    if kinds:
        parts.append("by kind: " + ", ".join(kinds))
    key = "scaledown_namespace_list_callers"
    callers = h.get(key)
    if callers and callers["count"]:
        whole = lambda v: num(v, 0)
        parts.append(f"passes served per list: mean {num(callers['mean'], 1)}, "
                     f"p50 {hq(key, callers, 'p50', whole)}, p99 {hq(key, callers, 'p99', whole)}")
    if not parts:
        return []
    return ["- The controller's waits during the scale-down (its histograms, quantiles within buckets): "
            + "; ".join(parts) + "."]


def sets5000_targets(runs):
    """The rows of issue 25's `sets5000` targets, from its newest full-size run only."""
    r = latest_full(runs, "sets5000")
    names = ["pod gone → cleanup created, p99, `sets5000` (≤ 1 s)",
             "cleanup Succeeded → claim deletion seen, p99, `sets5000` (≤ 200 ms)",
             "scale-down issued → last ordinal done, `sets5000` (≤ 1.5 × native)",
             "cleanup pods created per ordinal, `sets5000` (exactly 1)",
             "RSS after the 5,000-set run (≤ 60 MiB)",
             "start → ready with 10,000 pods cached, `sets5000` (≤ 5 s)",
             "requests per cleanup besides watches and Events, `sets5000` (≤ 7)",
             "Events per cleanup, `sets5000` (≤ 4)"]
    p = phase(r, "controller") if r else None
    if not p or not p.get("controller"):
        if r:
            why = f"the newest full-size run ({os.path.basename(r['_file'])}) has no controller numbers"
        elif any(x["scenario"] == "sets5000" for x in runs):
            why = "no full-size run yet (reduced runs only)"
        else:
            why = "no run yet"
        return [f"| {n} | {why} | – |" for n in names]
    rows = []

    def row(name, value, text, limit, why=None):
        met = "–" if value is None else ("yes" if value <= limit else "no")
        if met == "no" and why:
            met = f"no ({why})"
        rows.append(f"| {name} | {text} | {met} |")

    created = quantile(latencies(p, "pod_gone_ms", "cleanup_created_ms"), 0.99)
    deletion = quantile(latencies(p, "cleanup_succeeded_ms", "claim_deleting_ms"), 0.99)
    row(names[0], created, ms_unit(created), 1000, why_created(r))
    row(names[1], deletion, ms_unit(deletion), 200, why_deletion(r))
    done, native = all_done_ms(p), all_done_ms(phase(r, "native"))
    ratio = done / native if done is not None and native else None
    row(names[2], ratio, f"{ms_unit(done)} vs native {ms_unit(native)} (× {num(ratio, 2)})", 1.5,
        why_slower_than_native(r))
    rows.append(per_ordinal_row(names[3], p))
    rss = p["controller"]["rss_mib"]
    row(names[4], rss["after"], f"{num(rss['after'])} MiB", 60,
        joined(f"peak {num(rss['peak_in_window'])} MiB in the window, from {num(rss['at_window_start'])} MiB at its "
               "start", rss_parts(rss)))
    ready = p["controller"].get("start_to_ready_ms")
    load = ((p.get("loadavg") or {}).get("before") or [None])[0]
    row(names[5], ready, ms_unit(ready), 5000,
        f"1-minute load {num(load, 1)} on the machine's 2 cores right after" if load is not None else None)
    by, n = requests_by_kind(p["controller"]["requests_in_window"]), cleanups_of(p) or 1
    besides = (sum(by.values()) - by["Events"]) / n
    row(names[6], besides, f"{besides:.2f}", 7, why_requests(by, n))
    row(names[7], by["Events"] / n, f"{by['Events'] / n:.2f}", 4)
    return rows


def why_slower_than_native(run):
    """Where a controller phase slower than the native one lost its time: kube-controller-manager's
    StatefulSet queue in both phases, and its status lag that the release waits for."""
    parts = []
    for mode in ("controller", "native"):
        q = ((phase(run, mode) or {}).get("control_plane") or {}).get("kcm_work_queues", {}).get("statefulset")
        if q:
            parts.append(f"{mode}: kcm's StatefulSet queue mean wait {ms_unit(q['mean_wait_ms'])} over "
                         f"{int(q['adds'])} adds")
    caught = [o["set_caught_up_ms"] for o in ordinals(phase(run, "controller"))
              if o.get("set_caught_up_ms") is not None]
    if caught:
        parts.append(f"the releases wait for the set's status: kcm's status lag p99 {ms_unit(quantile(caught, 0.99))}")
    return "; ".join(parts) or None


def per_ordinal_row(name, p):
    """'N for M' cleanup pods seen per orphaned ordinal (exactly 1 asked), with why any extra came,
    from the watches and the audit log."""
    x = cleanup_stats(p)
    if x is None:
        return f"| {name} | – | – |"
    extra = x["creates"] - x["ordinals"]
    if extra == 0:
        return f"| {name} | {x['creates']} for {x['ordinals']} | yes |"
    why = []
    if x["late"]:
        why.append(f"{x['late']} deleted by others before they ran ("
                   + ", ".join(f"{k} {v}" for k, v in sorted(x["late_by"].items())) + ")")
    if x["controller_early"]:
        why.append(f"{x['controller_early']} deleted by the controller before they ran")
    missing = sum(1 for o in ordinals(p) if not o.get("cleanup_pods"))
    if missing:
        why.append(f"{missing} ordinals without any")
    reason = ": " + "; ".join(why) if why else ""
    return f"| {name} | {x['creates']} for {x['ordinals']} | no ({extra:+d}{reason}) |"


# === markdown ===

def runs_table(runs):
    out = ["| Scenario | Date (UTC) | Commit | Seed | Command | Cluster | Load (1 min) at start | Took |",
           "|---|---|---|---|---|---|---|---|"]
    for s in SCENARIOS:
        r = latest(runs, s)
        if r is None:
            continue
        load = r.get("loadavg_start") or [None]
        c = cluster_of(r)
        cluster = "–" if c is None else (
            f"shared ({c['others']} other namespace{'' if c['others'] == 1 else 's'})" if c["shared"] else "fresh")
        out.append(f"| `{s}`{reduced_label(r)} | {r['started_at']} | `{commit_of(r)}` | {r['seed']} | `{r['command']}` | {cluster} | "
                   f"{num(load[0], 2)} | {num(r.get('duration_s', 0) / 60, 1)} min |")
    return out


def machine_lines(runs):
    newest = max(runs, key=lambda r: r["started_at"])
    m, v = newest["machine"], newest["versions"]
    cp = v.get("control_plane", {})
    return [
        f"- Machine: {m['cpus']} × {m['cpu_model']}, {num(m['memory_gib'], 1)} GiB, Linux {m['kernel']} "
        "(shared with other engineers' builds: see the load column).",
        f"- Versions: controller {v['controller_profile']} build ({v['rustc']}); Kubernetes {cp.get('k8s', '?')}, "
        f"KWOK {cp.get('kwok', '?')}, etcd {cp.get('etcd', '?')} (the local control plane of `hack/cluster.sh`).",
    ]


def latency_table(run, before):
    c, n = phase(run, "controller"), phase(run, "native")
    b = phase(before, "controller") if before else None
    head = "| Latency (ms) | controller n | p50 | p99 | max | native n | p50 | p99 | max |"
    sep = "|---|---|---|---|---|---|---|---|---|"
    if b:
        head += f" before (`{commit_of(before)}`) p50 | p99 | max |"
        sep += "---|---|---|"
    out = [head, sep]
    for _key, label, start, end in LATENCIES:
        row = f"| {label} |"
        for p in (c, n) + ((b,) if b else ()):
            values = latencies(p, start, end)
            cells = [ms(quantile(values, 0.5)), ms(quantile(values, 0.99)), ms(max(values) if values else None)]
            if p is not b:
                cells.insert(0, str(len(values)) if p else "–")
            row += " " + " | ".join(cells) + " |"
        out.append(row)
    row = "| scale-down issued → last ordinal done |"
    for p in (c, n) + ((b,) if b else ()):
        blanks = 2 if p is b else 3
        row += " " + " | ".join([""] * blanks + [ms(all_done_ms(p))]) + " |"
    out.append(row)
    return out


def cleanup_table(run, before):
    c = cleanup_stats(phase(run, "controller"))
    if c is None:
        return []
    b = cleanup_stats(phase(before, "controller")) if before else None
    head = f"| Cleanup pods | `{commit_of(run)}` |"
    sep = "|---|---|"
    if before:
        head += f" before (`{commit_of(before)}`) |"
        sep += "---|"

    def count(v):
        return "–" if v is None else str(v)

    def late(x):
        if x["late"] is None:
            return "–"
        by = ", ".join(f"{k} {v}" for k, v in sorted(x["late_by"].items()))
        return f"{x['late']}" + (f" ({by})" if by else "")

    def records(x):
        if x["records_failed"] is None:
            return "–"
        codes = ", ".join(f"{v} × {k}" for k, v in sorted(x["records_failed_by_code"].items()))
        return f"{x['records_failed']} of {x['records']}" + (f" ({codes})" if codes else "")

    rows = [
        ("orphaned ordinals", lambda x: count(x["ordinals"])),
        ("cleanup pods created (distinct UIDs seen): total, per ordinal",
         lambda x: f"{x['creates']}, {num(x['per_ordinal'], 2)}"),
        ("most cleanup pods under one ordinal", lambda x: count(x["max"])),
        ("deleted by someone else before they started (late deletes), by sender", late),
        ("… of them still gated", lambda x: count(x["late_gated"])),
        ("deleted by the controller before they started", lambda x: count(x["controller_early"])),
        ("deleted by someone else after they started", lambda x: count(x["after_start"])),
        ("record patches the API server refused (audit log)", records),
        ("failed passes, `contended` (`scaledown_reconcile_errors_total`)", lambda x: count(x["contended"])),
    ]
    out = [head, sep]
    for label, cell in rows:
        row = f"| {label} | {cell(c)} |"
        if before:
            row += f" {cell(b) if b else '–'} |"
        out.append(row)
    return out


def cluster_lines(run):
    def namespaces(n):
        return f"{n} other namespace" + ("" if n == 1 else "s")

    out = []
    for p in run["phases"]:
        info = p.get("cluster")
        if not info:
            continue
        audit = p.get("audit") or {}
        if info["shared"]:
            writes = audit.get("other_namespaces_lines")
            text = (f"shared with other runs: {namespaces(info['other_namespaces_at_start'])} at the start, "
                    f"{info['other_namespaces_at_end']} at the end"
                    + (f", {writes} writes of pods, claims and sets in them during the phase (audit log)"
                       if writes is not None else ""))
            if info.get("controller_scope") == "namespace":
                text += "; the controller watched only its own namespace (`--namespace`)"
        else:
            text = "fresh (no other namespaces)"
        out.append(f"- Cluster during the {p['mode']} phase: {text}.")
    return out


def controller_lines(run):
    p = phase(run, "controller")
    if not p or not p.get("controller"):
        return ["- Controller: no numbers (phase missing)."]
    c = p["controller"]
    rss, cpu = c["rss_mib"], c["cpu_s"]
    window = c["requests_in_window"]
    cleanups = sum(r["orphans"] for r in p.get("rounds", []))
    per = window["non_watch_total"] / cleanups if cleanups else None
    creates = pod_creates(window)
    most = max((r.get("max_cleanup_pods_per_ordinal") or 0 for r in p.get("rounds", [])), default=0)
    lines = [
        f"- Controller: ready {c['start_to_ready_ms']} ms after start; RSS {num(rss['at_window_start'])} MiB before the "
        f"scale-down, peak {num(rss['peak_in_window'])} MiB, {num(rss['after'])} MiB after; CPU {num(cpu['window'], 2)} s "
        f"during the scale-down ({num(cpu['since_start'], 2)} s since start).",
        f"- Requests during the scale-down: {requests_line(window)}; {int(window['non_watch_total'])} besides watches "
        f"for {cleanups} cleanups ({num(per, 1)} per cleanup); {int(creates)} pod creates "
        f"(most cleanup pods seen under one ordinal: {most}).",
    ]
    if not complete(p):
        lines.append("- **Incomplete**: a wait timed out (see the JSON).")
    return lines


def control_plane_lines(run):
    out = []
    for p in run["phases"]:
        cp = p.get("control_plane") or {}
        cpu = ", ".join(f"{k} {num(v, 1)}" for k, v in sorted((cp.get("cpu_s") or {}).items()))
        t = cp.get("client_throttling", {}).get("kube-controller-manager", {})
        ts = cp.get("client_throttling", {}).get("kube-scheduler", {})
        queues = cp.get("kcm_work_queues") or {}
        waits = ", ".join(f"{q} {ms_unit(queues[q]['mean_wait_ms'])} ({int(queues[q]['adds'])} adds)"
                          for q in QUEUES if q in queues)
        out.append(f"- Control plane during the {p['mode']} phase: CPU seconds {cpu}. Client rate limiter waits: "
                   f"kube-controller-manager {num(t.get('rate_limiter_wait_s'), 2)} s over "
                   f"{int(t.get('requests', 0))} requests, kube-scheduler {num(ts.get('rate_limiter_wait_s'), 2)} s over "
                   f"{int(ts.get('requests', 0))}. kcm work queues, mean wait: {waits or '–'}.")
    return out


def idle_section(run):
    p = run["phases"][0]
    c = p["controller"]
    prm = run["params"]
    rss = c["rss_mib"]
    window = c["requests_in_window"]
    return [
        "| Background pods | Annotated sets | Start → ready | Start → every set finalized | RSS idle | RSS peak | "
        "CPU idle | Requests idle (besides watches) | Idle window |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {int(prm['pods'])} | {int(prm['sets'])} | {c['start_to_ready_ms']} ms | "
        f"{ms_unit(p.get('startup_to_all_finalized_ms'))} | {num(rss['after'])} MiB | "
        f"{num(rss['peak_since_start'])} MiB | {num(c['cpu_s']['window'], 2)} s | "
        f"{int(window['non_watch_total'])} ({requests_line(window)}) | {num(c['window_s'], 0)} s |",
        "",
        f"- Startup: {requests_line(c['requests_since_start'])} requests from start to the end of the window; "
        f"CPU {num(c['cpu_s']['since_start'], 2)} s.",
    ] + control_plane_lines(run)


def podbound_section(run, before):
    out = ["| Run | Round | Claims | Latency | p50 | p90 | p99 | max | Passes | Requests besides watches | "
           "per pass | per claim | CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in (("latest", run), ("before", before)):
        p = phase(r, "controller") if r else None
        for rnd in (p or {}).get("rounds", []):
            key, name = PODBOUND_LATENCIES.get(rnd["name"], (None, rnd["name"]))
            lat = rnd.get("latency_ms", {}).get(key) or {}
            req = rnd["requests"]
            out.append(f"| {label} `{commit_of(r)}` | {rnd['name']} | {rnd['claims']} | {name} | "
                       f"{ms_unit(lat.get('p50'))} | {ms_unit(lat.get('p90'))} | {ms_unit(lat.get('p99'))} | "
                       f"{ms_unit(lat.get('max'))} | {num(rnd.get('passes'), 0)} | "
                       f"{int(req['non_watch_total'])} ({requests_line(req)}) | {num(rnd.get('requests_per_pass'), 2)} | "
                       f"{num(rnd.get('requests_per_claim'), 2)} | {num(rnd.get('cpu_s'), 2)} s |")
    p = phase(run, "controller")
    c = p["controller"]
    rss = c["rss_mib"]
    by_key = ", ".join(f"{k} {int(v)}" for k, v in sorted(p["rounds"][0]["requests"]["by_verb_resource_code"].items()))
    out += [
        "",
        f"- Controller (`--pod-bound-claims`{' ' + ' '.join(run['controller_args']) if run['controller_args'] else ''}): "
        f"ready {c['start_to_ready_ms']} ms after start; RSS {num(rss['at_window_start'])} MiB before the bind round, "
        f"peak {num(rss['peak_in_window'])} MiB, {num(rss['after'])} MiB after the delete round; "
        f"CPU {num(c['cpu_s']['since_start'], 2)} s since start.",
        f"- Requests of the bind round by verb, resource and code: {by_key or 'none'}.",
    ]
    if not complete(p):
        out.append("- **Incomplete**: a wait timed out (see the JSON).")
    return out


def histogram(run, key):
    """One of the controller's histograms over the scale-down window, if the run recorded it."""
    p = phase(run, "controller") if run else None
    h = ((p or {}).get("controller") or {}).get("latency_histograms_in_window") or {}
    series = h.get(key)
    return series if series and series["count"] else None


def why_created(run):
    """What a late cleanup pod create waited for: a pass slot (measured reason of a missed target)."""
    slot = histogram(run, "scaledown_pass_start_wait_seconds")
    if not slot:
        return None
    key = "scaledown_pass_start_wait_seconds"
    return f"a pass waited for a slot p99 {hq(key, slot, 'p99')} ({int(slot['count'])} passes in the window)"


def why_deletion(run):
    """What a claim delete waited for: the shared live list of the namespace."""
    wait = histogram(run, "scaledown_namespace_list_wait_seconds")
    took = histogram(run, 'scaledown_namespace_list_duration_seconds{kind="all"}')
    if not wait or not took:
        return None
    waited = hq("scaledown_namespace_list_wait_seconds", wait, "p99")
    one = hq('scaledown_namespace_list_duration_seconds{kind="all"}', took, "p99")
    return (f"the wait for a live list of the namespace p99 {waited}, one list p99 {one} "
            f"({int(took['count'])} lists for {int(wait['count'])} asks)")


# What the safety contract needs per cleanup, by kind (issue 25): the create, the release, the
# record, two fresh reads (before the release and after Succeeded, docs/usage.md: a GET of the set,
# or a share of a live read of the namespace, which is three lists: claims, pods and sets), and the
# deletes of the claim and the pod.
CONTRACT_PER_CLEANUP = {"pod creates": (1, "the create"), "pod patches": (1, "the release"),
                        "set patches": (1, "the record; the others: the status annotation's "
                                           "CleaningUp and Idle, the test-only guard before a release"),
                        "fresh reads": (2, "before the release and after Succeeded; a live read of a "
                                           "namespace is 3 lists, shared by the passes waiting for it"),
                        "deletes": (2, "claim and pod")}


def why_requests(by, cleanups):
    """The kinds above what the safety contract needs per cleanup: where requests per cleanup go
    over the target. Set GETs and namespace lists count together as fresh reads."""
    kinds = {}
    for kind, n in by.items():
        short = kind.split(" (")[0]
        if short in ("set reads", "lists"):
            short = "fresh reads"
        kinds[short] = kinds.get(short, 0.0) + n
    over = []
    for short, n in kinds.items():
        if short in ("Events", "other"):
            continue
        need, what = CONTRACT_PER_CLEANUP.get(short, (0, "none"))
        if n / cleanups > need + 0.05:
            over.append(f"{short} {n / cleanups:.2f} ({need}: {what})")
    return ("above the contract's need per cleanup: " + ", ".join(over)) if over else None


def rss_parts(rss):
    """The RSS after a run in its parts, where the run measured them (runs since 2026-11-28)."""
    anon, file = rss.get("after_anonymous"), rss.get("after_file")
    if anon is None or file is None:
        return None
    return f"anonymous {anon:.1f} MiB (heap, stacks), file-backed {file:.1f} MiB (the binary's code)"


def joined(*parts):
    return "; ".join(x for x in parts if x) or None


def targets(runs):
    def p99(scenario, start, end):
        r = latest(runs, scenario)
        values = latencies(phase(r, "controller"), start, end) if r else []
        return quantile(values, 0.99)

    rows = []

    def with_ms(v):
        return f"{v / 1000:.1f} s" if abs(v) >= 10000 else f"{v:.1f} ms"

    def row(target, value, limit, fmt=with_ms, why=None):
        if value is None:
            rows.append(f"| {target} | – | – |")
            return
        reason = f"; {why}" if why else ""
        met = "yes" if value <= limit else f"no ({fmt(value - limit)} over{reason})"
        rows.append(f"| {target} | {fmt(value)} | {met} |")

    row("pod gone → cleanup created, p99, 1 set (≤ 100 ms)", p99("single", "pod_gone_ms", "cleanup_created_ms"), 100)
    row("pod gone → cleanup created, p99, 500 sets (≤ 1 s)", p99("sets500", "pod_gone_ms", "cleanup_created_ms"), 1000,
        why=why_created(latest(runs, "sets500")))
    for s in ("single", "sets20", "sets500"):
        row(f"cleanup Succeeded → claim deletion seen, p99, `{s}` (≤ 200 ms)",
            p99(s, "cleanup_succeeded_ms", "claim_deleting_ms"), 200, why=why_deletion(latest(runs, s)))
    for s in ("single", "sets20", "sets500"):
        r = latest(runs, s)
        p = phase(r, "controller") if r else None
        if not p or not p.get("controller"):
            continue
        window = p["controller"]["requests_in_window"]
        cleanups = int(sum(x["orphans"] for x in p["rounds"])) or 1
        # Counts, not a ratio: 501 creates for 500 cleanups rounds to 1.00 and is still one too many.
        creates = int(pod_creates(window))
        refused = refused_creates(window)
        met = "yes" if creates == cleanups else f"no ({creates - cleanups:+d}{': ' + refused if refused else ''})"
        rows.append(f"| pod create requests per cleanup, `{s}` (exactly 1) | {creates} for {cleanups} | {met} |")
        rows.append(per_ordinal_row(f"cleanup pods created per ordinal (distinct UIDs seen), `{s}` (exactly 1)", p))
        by = requests_by_kind(window)
        row(f"requests per cleanup besides watches and Events, `{s}` (≤ 7)",
            (sum(by.values()) - by["Events"]) / cleanups, 7, lambda v: f"{v:.2f}", why=why_requests(by, cleanups))
        row(f"Events per cleanup, `{s}` (≤ 4)", by["Events"] / cleanups, 4, lambda v: f"{v:.2f}")
    r = latest(runs, "sets500")
    if r and phase(r, "controller") and phase(r, "controller").get("controller"):
        rss = phase(r, "controller")["controller"]["rss_mib"]
        row("RSS after the 500-set run (≤ 40 MiB)", rss["after"], 40, lambda v: f"{v:.1f} MiB",
            why=joined(f"peak {rss['peak_in_window']:.1f} MiB in the window, from {rss['at_window_start']:.1f} MiB at "
                       "its start: what the allocator kept of the namespace lists decoded at the peak", rss_parts(rss)))
    rows += sets5000_targets(runs)
    r = latest(runs, "idle")
    if r:
        c = r["phases"][0]["controller"]
        row(f"RSS idle at {int(r['params']['pods'])} pods (≤ 30 MiB)", c["rss_mib"]["after"], 30,
            lambda v: f"{v:.1f} MiB",
            why=joined(rss_parts(c["rss_mib"]),
                       "jemalloc's thread caches hold about 3 MiB of it and are kept: without them a "
                       "burst costs a quarter more CPU (bench/notes.md, 2026-11-28)"))
        row(f"requests while idle besides watches, {num(c['window_s'], 0)} s (0)",
            abs(c["requests_in_window"]["non_watch_total"]), 0, lambda v: f"{v:.0f}")
    return ["| Target (issues 9, 25) | Measured | Met |", "|---|---|---|"] + rows + realnode_targets(runs)


def history(runs):
    out = ["| File | Scenario | Date (UTC) | Commit | p99 pod gone → cleanup created | p99 Succeeded → claim deletion | "
           "p99 created → released | last ordinal done | most cleanup pods under one ordinal | late deletes | "
           "refused records | RSS after | CPU (window) | Requests besides watches |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: r["started_at"]):
        p = phase(r, "controller")
        c = (p or {}).get("controller") or {}
        created = quantile(latencies(p, "pod_gone_ms", "cleanup_created_ms"), 0.99)
        deletion = quantile(latencies(p, "cleanup_succeeded_ms", "claim_deleting_ms"), 0.99)
        rss = (c.get("rss_mib") or {}).get("after")
        cpu = (c.get("cpu_s") or {}).get("window")
        req = (c.get("requests_in_window") or {}).get("non_watch_total")
        released = quantile(latencies(p, "released_pod_created_ms", "cleanup_released_ms"), 0.99)
        stats = cleanup_stats(p)

        def cell(v):
            return "–" if v is None else str(v)

        out.append(f"| [{os.path.basename(r['_file'])}]({r['_file']}) | `{r['scenario']}`{reduced_label(r)} | {r['started_at']} | "
                   f"`{commit_of(r)}` | {ms(created)} | {ms(deletion)} | {ms(released)} | {ms(all_done_ms(p))} | "
                   f"{cell(stats and stats['max'])} | {cell(stats and stats['late'])} | "
                   f"{cell(record_failures(stats))} | "
                   f"{num(rss)} MiB | {num(cpu, 2)} s | {'–' if req is None else int(req)} |")
    return out


def markdown(runs):
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by bench/report.py from bench/results/*.json; `make unit` fails if this file differs. -->",
        "",
        "`make bench` runs every scenario on the local control plane (`hack/cluster.sh`) and rewrites this page "
        "and its plots; `make bench SCENARIO=sets500` runs one. What is measured and how: "
        "[Development, Benchmarks](docs/development.md#benchmarks) and `tests/bench.rs`. Latencies are measured per orphaned ordinal "
        "from watch events (arrival times at the bench's own watches); the controller's cleanup pods run "
        "`cleanup-seconds` under KWOK, so \"pod gone → claim gone\" includes that run time for the controller and "
        "not for the native baseline (`persistentVolumeClaimRetentionPolicy.whenScaled: Delete`, no controller).",
        "",
    ]
    if not runs:
        return "\n".join(out + ["No results yet: run `make bench`.", ""])
    out += runs_table(runs) + [""] + machine_lines(runs) + [""]
    out += ["## Targets", ""] + targets(runs) + [""]
    out += ["## Regressions", ""] + regressions(runs) + [""]
    kinds = kinds_table(runs, ("single", "sets20", "sets500", "sets5000"))
    if kinds:
        out += ["## Requests per cleanup, by kind", "",
                "Besides watches, from the controller's own request counter during the scale-down window "
                "(`scaledown_api_requests_total` by verb, resource and code). Set patches carry the finalizer, "
                "the record, the status annotations and the test-only guard before a release; they are one "
                "resource to the counter.", ""] + kinds + [""]
    growth = growth_section(runs)
    if growth:
        out += ["## How cost grows with the number of sets", ""] + growth + [""]
    for s in SCENARIOS:
        r = latest(runs, s)
        if r is None:
            continue
        out += [f"## `{s}`{reduced_label(r)}: {TITLES[s]}", ""] + reduced_lines(r)
        if s == "idle":
            out += idle_section(r) + [""]
            continue
        if s == "podbound":
            out += podbound_section(r, baseline(runs, s, r)) + [""]
            continue
        if s == "realnode":
            out += realnode_section(r, baseline(runs, s, r)) + [""]
            continue
        before = baseline(runs, s, r)
        out += latency_table(r, before) + [""]
        cleanup = cleanup_table(r, before)
        if cleanup:
            out += cleanup + [""]
        out += controller_lines(r) + cluster_lines(r) + control_plane_lines(r) + time_lines(r) + wait_lines(r) + [""]
        out += [f"![latency CDFs of {s}](bench/plots/latency-{s}.png)", ""]
    out += ["## Memory over time", "", "![controller RSS over time](bench/plots/memory.png)", ""]
    if os.path.exists(NOTES):
        notes = open(NOTES, encoding="utf-8").read().strip()
        out += ["## Notes", "", "<!-- Included from bench/notes.md, written by hand. -->", "", notes, ""]
    out += ["## All runs", ""] + history(runs) + [""]
    return "\n".join(out)


# === realnode (the real node's containers) ===

# (label, from event, to event, in the native table too). From the cleanup pod whose container
# started first: when it was first seen scheduled, reported on by the kubelet, running, exited.
REALNODE_LATENCIES = [
    ("**stateful pod gone → cleanup container running**", "pod_gone_ms", "cleanup_running_ms", False),
    ("**cleanup container exited → claim deletion seen**", "cleanup_exited_ms", "claim_deleting_ms", False),
    ("stateful pod gone → claim deletion seen", "pod_gone_ms", "claim_deleting_ms", True),
    ("stateful pod gone → claim gone", "pod_gone_ms", "claim_gone_ms", True),
    ("… pod gone → cleanup pod created", "pod_gone_ms", "cleanup_created_ms", False),
    ("… created → released (confirm gate removed)", "released_pod_created_ms", "cleanup_released_ms", False),
    ("… released → scheduled (`nodeName` seen)", "cleanup_released_ms", "cleanup_scheduled_ms", False),
    ("… scheduled → the kubelet's first status", "cleanup_scheduled_ms", "cleanup_reported_ms", False),
    ("… the kubelet's first status → container running", "cleanup_reported_ms", "cleanup_running_ms", False),
    ("cleanup container running → exited (it sleeps `cleanup-seconds`)", "cleanup_running_ms",
     "cleanup_exited_ms", False),
]
REALNODE_TARGET_MS = 2000


def realnode_section(run, before):
    """Latencies per orphaned ordinal on the real node, controller and native, with the steps from
    the stateful pod gone to the cleanup container running."""
    c, n = phase(run, "controller"), phase(run, "native")
    b = phase(before, "controller") if before else None
    head = "| Latency (ms) | controller n | p50 | p99 | max | native n | p50 | p99 | max |"
    sep = "|---|---|---|---|---|---|---|---|---|"
    if b:
        head += f" before (`{commit_of(before)}`) p50 | p99 |"
        sep += "---|---|"
    out = [head, sep]
    for label, start, end, native in REALNODE_LATENCIES:
        row = f"| {label} |"
        for p in (c, n if native else None):
            values = latencies(p, start, end) if p else []
            row += (f" {len(values) if p else '–'} | {ms(quantile(values, 0.5))} | {ms(quantile(values, 0.99))} | "
                    f"{ms(max(values) if values else None)} |")
        if b:
            values = latencies(b, start, end)
            row += f" {ms(quantile(values, 0.5))} | {ms(quantile(values, 0.99))} |"
        out.append(row)
    done = [ms(all_done_ms(p)) for p in (c, n)]
    out.append(f"| scale-down issued → last ordinal done | | | | {done[0]} | | | | {done[1]} |"
               + (f" | {ms(all_done_ms(b))} |" if b else ""))
    ords = ordinals(c)
    missed = sum(1 for o in ords if o.get("running_missed"))
    out += ["", f"- Cleanup containers first seen already exited (their running state fell between two kubelet "
                f"status updates; counted at that update): {missed} of {len(ords)}."]
    for p in (c, n):
        node = (p or {}).get("real_node") or {}
        if node:
            out.append(f"- Node during the {p['mode']} phase: `{node['node']}` (kubelet {node.get('kubelet') or '?'}, "
                       f"{node.get('container_runtime') or '?'}); pods seen on it {node['pods_on_real_node']}, "
                       f"elsewhere {node['pods_elsewhere']}.")
    cleanup = cleanup_table(run, before)
    out += [""] + (cleanup + [""] if cleanup else [])
    out += controller_lines(run) + cluster_lines(run) + control_plane_lines(run) + [""]
    out += ["![latency CDFs of realnode](bench/plots/latency-realnode.png)"]
    return out


def realnode_targets(runs):
    """The realnode target row: pod gone → cleanup container running, p99 ≤ 2 s."""
    r = latest(runs, "realnode")
    values = latencies(phase(r, "controller"), "pod_gone_ms", "cleanup_running_ms") if r else []
    v = quantile(values, 0.99)
    target = "stateful pod gone → cleanup container running, p99, `realnode` (≤ 2 s)"
    if v is None:
        return [f"| {target} | – | – |"]
    met = "yes" if v <= REALNODE_TARGET_MS else f"no ({(v - REALNODE_TARGET_MS) / 1000:.2f} s over{why_realnode(r)})"
    return [f"| {target} | {v / 1000:.2f} s | {met} |"]


def why_realnode(run):
    """The slowest ordinal's time split between the controller (pod gone → cleanup pod released,
    which includes waiting for kube-controller-manager to let go) and the node (released →
    container running: scheduler, kubelet, containerd)."""
    timed = [o for o in ordinals(phase(run, "controller"))
             if all(event(o, k) is not None for k in ("pod_gone_ms", "cleanup_released_ms", "cleanup_running_ms"))]
    if not timed:
        return ""
    o = max(timed, key=lambda o: event(o, "cleanup_running_ms") - event(o, "pod_gone_ms"))
    ours = event(o, "cleanup_released_ms") - event(o, "pod_gone_ms")
    node = event(o, "cleanup_running_ms") - event(o, "cleanup_released_ms")
    caught_up = event(o, "set_caught_up_ms")
    kcm = (f", of which {max(caught_up - event(o, 'pod_gone_ms'), 0) / 1000:.2f} s until the set's status showed "
           "kube-controller-manager done with the scale-down") if caught_up is not None else ""
    return (f"; the slowest ordinal: pod gone → released {ours / 1000:.2f} s (the controller{kcm}), "
            f"released → running {node / 1000:.2f} s (scheduler, kubelet, containerd)")


def plot_realnode(plt, runs):
    from matplotlib.ticker import NullFormatter

    r = latest(runs, "realnode")
    c, n = phase(r, "controller"), phase(r, "native")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    # Seconds-long container latencies span less than a decade: a linear axis; the third panel sets
    # the native baseline's milliseconds beside them: log.
    panels = [(REALNODE_LATENCIES[0], False), (REALNODE_LATENCIES[1], False), (REALNODE_LATENCIES[2], True)]
    for ax, ((label, start, end, native), log) in zip(axes, panels):
        for p, name in ((c, "controller"), (n if native else None, "native (whenScaled: Delete)")):
            if p:
                cdf(ax, [max(v, 0.1) for v in latencies(p, start, end)], label=f"{name} @{commit_of(r)}")
        if start == "pod_gone_ms" and end == "cleanup_running_ms":
            ax.axvline(REALNODE_TARGET_MS, color="grey", linestyle=":", label="target p99")
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xlim(left=0)
        ax.set_xlabel("ms (log)" if log else "ms")
        ax.set_ylabel("fraction of ordinals")
        ax.set_title(label.replace("*", ""), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"realnode: {TITLES['realnode']} ({r['started_at']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "latency-realnode.png"), dpi=90, metadata={"Software": None})
    plt.close(fig)


# === plots ===

def cdf(ax, values, **kw):
    if not values:
        return
    s = sorted(values)
    ax.step(s, [(i + 1) / len(s) for i in range(len(s))], where="post", **kw)


def plot_latencies(plt, runs, scenario):
    from matplotlib.ticker import NullFormatter

    r = latest(runs, scenario)
    before = baseline(runs, scenario, r)
    c, n = phase(r, "controller"), phase(r, "native")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        (LATENCIES[3], [(c, "controller", "-"), (n, "native (whenScaled: Delete)", "-")]),
        (LATENCIES[0], [(c, "controller", "-")]),
        (LATENCIES[1], [(c, "controller", "-")]),
    ]
    for ax, ((_, label, start, end), series) in zip(axes, panels):
        for p, name, style in series:
            cdf(ax, [max(v, 0.1) for v in latencies(p, start, end)], label=f"{name} @{commit_of(r)}", linestyle=style)
        if before:
            cdf(ax, [max(v, 0.1) for v in latencies(phase(before, "controller"), start, end)],
                label=f"controller before @{commit_of(before)}", linestyle="--")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("fraction of ordinals")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{scenario}{reduced_label(r)}: {TITLES[scenario]} ({r['started_at']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, f"latency-{scenario}.png"), dpi=90, metadata={"Software": None})
    plt.close(fig)


def plot_memory(plt, runs):
    present = [s for s in SCENARIOS if latest(runs, s)]
    fig, axes = plt.subplots(1, max(len(present), 1), figsize=(4.2 * max(len(present), 1), 3.8), squeeze=False)
    for ax, s in zip(axes[0], present):
        r = latest(runs, s)
        before = baseline(runs, s, r)
        for run, style, name in ((r, "-", "latest"), (before, "--", "before")):
            p = phase(run, "controller") if run else None
            series = ((p or {}).get("controller") or {}).get("rss_series") or []
            if series:
                line, = ax.plot([t for t, _ in series], [m for _, m in series], linestyle=style,
                                label=f"{name} @{commit_of(run)}")
                start = p["controller"].get("window_start_s")
                if start is not None:
                    ax.axvline(start, color=line.get_color(), linestyle=":", linewidth=1)
        ax.set_title(f"{s}", fontsize=10)
        ax.set_xlabel("s since controller start")
        ax.set_ylabel("RSS MiB")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("controller RSS, sampled from /proc every 200 ms (dotted: the measured window starts)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "memory.png"), dpi=90, metadata={"Software": None})
    plt.close(fig)


def plot_growth(plt, runs):
    """bench/plots/growth.png: requests and CPU per cleanup, and two p99 latencies, against the
    number of sets (log x), one point per scale-down scenario's newest run."""
    points = sorted(growth_points(runs), key=lambda x: x["sets"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    xs = [x["sets"] for x in points]
    panels = [
        (axes[0], [("requests", "requests besides watches")], "requests per cleanup", False),
        (axes[1], [("cpu_ms", "controller CPU")], "CPU ms per cleanup", False),
        (axes[2], [("created_p99", "p99 pod gone → cleanup created"),
                   ("deletion_p99", "p99 cleanup Succeeded → claim deletion seen")], "ms (log)", True),
    ]
    for ax, series, ylabel, logy in panels:
        for key, label in series:
            ys = [x[key] for x in points]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
        for x in points:
            name = x["scenario"] + (f"\n(reduced: {x['sets']} sets)" if x["label"] != x["scenario"] else "")
            note = ax.annotate(name, (x["sets"], x[series[0][0]] or 0), textcoords="offset points", xytext=(4, 4),
                               fontsize=7)
            note.set_in_layout(False)
        ax.set_xscale("log")
        ax.set_xlim(0.5, max(xs) * 4)
        if logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("sets scaled down at once (log)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("how cost and latency grow with the number of sets (newest run of each scenario)", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "growth.png"), dpi=90, metadata={"Software": None})
    plt.close(fig)


def plots(runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(PLOTS, exist_ok=True)
    for s in SCENARIOS:
        if s not in ("idle", "podbound", "realnode") and latest(runs, s):
            plot_latencies(plt, runs, s)
    if latest(runs, "realnode"):
        plot_realnode(plt, runs)
    if runs:
        plot_memory(plt, runs)
    if growth_points(runs):
        plot_growth(plt, runs)


def referenced_plots(text):
    return [line.split("](", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare BENCHMARKS.md with the JSON; write nothing")
    args = parser.parse_args()
    runs = load_runs()
    text = markdown(runs)
    if args.check:
        current = open(MARKDOWN, encoding="utf-8").read() if os.path.exists(MARKDOWN) else ""
        problems = []
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "BENCHMARKS.md", "from the JSON",
                                        lineterm="", n=1)
            problems.append("BENCHMARKS.md is not what bench/report.py makes of bench/results/*.json "
                            "(run bench/report.py):\n" + "\n".join(list(diff)[:40]))
        for plot in referenced_plots(text):
            if not os.path.exists(os.path.join(ROOT, plot)):
                problems.append(f"plot {plot} is missing (run bench/report.py)")
        if problems:
            print("\n".join(problems))
            return 1
        print(f"bench report: BENCHMARKS.md matches {len(runs)} result files; {len(referenced_plots(text))} plots present")
        return 0
    with open(MARKDOWN, "w", encoding="utf-8") as f:
        f.write(text)
    plots(runs)
    print(f"bench report: wrote BENCHMARKS.md and the plots from {len(runs)} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
