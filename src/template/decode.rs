//! Bounded decoding of the template annotation into a JSON value.
//!
//! The annotation is written by whoever may edit the StatefulSet, and the controller parses it on
//! every pass, so its cost must be bounded by the input's size and not by its shape: a YAML alias
//! bomb of a few KiB must not grow the process by hundreds of MiB. Every limit below is far above
//! what a real pod template needs (a large one has a few hundred nodes, nesting under 15).

use serde_json::Value;
use serde_saphyr::budget::BudgetBreach;

use super::error::{TemplateError, clip};

/// Bytes of the annotation value, checked before any parsing (the API server allows 256 KiB for all
/// annotations of an object together).
pub const MAX_INPUT_BYTES: usize = 128 * 1024;
/// Bytes of the rendered pod as JSON. etcd refuses objects over 1.5 MiB, the API server bodies
/// over 3 MiB; a pod over this cap is a template mistake, not a workload.
pub const MAX_POD_BYTES: usize = 512 * 1024;
/// Nesting of YAML sequences and mappings (JSON: serde_json's own limit of 128).
pub const MAX_DEPTH: usize = 32;
/// YAML alias (`*name`) uses.
pub const MAX_ALIASES: usize = 32;
/// YAML anchor (`&name`) definitions.
pub const MAX_ANCHORS: usize = 32;
/// YAML merge keys (`<<`).
pub const MAX_MERGE_KEYS: usize = 32;
/// YAML nodes (mappings, sequences, scalars) as written.
pub const MAX_NODES: usize = 20_000;
/// YAML parser events (about two per node).
pub const MAX_EVENTS: usize = 2 * MAX_NODES + 16;
/// Events replayed by all aliases together: what aliases add to the document's size.
pub const MAX_REPLAYED_EVENTS: usize = MAX_NODES;
/// Bytes of all YAML scalars together.
pub const MAX_SCALAR_BYTES: usize = 128 * 1024;
/// YAML documents in the annotation.
pub const MAX_DOCUMENTS: usize = 1;

/// The parser options: the budget above, YAML 1.2 booleans (`yes` stays a string, as before), no
/// source snippets in messages.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: MAX_EVENTS,
            max_aliases: MAX_ALIASES,
            max_anchors: MAX_ANCHORS,
            max_merge_keys: MAX_MERGE_KEYS,
            max_depth: MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_total_scalar_bytes: MAX_SCALAR_BYTES,
            max_total_comment_bytes: MAX_INPUT_BYTES,
            max_documents: MAX_DOCUMENTS,
            max_recorded_anchor_events: 2 * MAX_EVENTS,
            max_recorded_anchor_bytes: 2 * MAX_SCALAR_BYTES,
            max_inclusion_depth: 0,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_REPLAYED_EVENTS,
            max_replay_stack_depth: MAX_DEPTH,
        },
        emit_comments: false,
        strict_booleans: true,
        with_snippet: false,
    }
}

/// `raw` as a JSON value: JSON first, then YAML, both within the limits above.
pub fn decode(raw: &str) -> Result<Value, TemplateError> {
    if raw.len() > MAX_INPUT_BYTES {
        return Err(TemplateError::TooLarge {
            what: "the template annotation",
            size: raw.len(),
            limit: MAX_INPUT_BYTES,
        });
    }
    let json_err = match serde_json::from_str(raw) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let yaml_err = match serde_saphyr::from_str_with_options::<Value>(raw, yaml_options()) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if let Some(breach) = over_budget(&yaml_err) {
        return Err(TemplateError::OverBudget(breach));
    }
    // YAML is a superset of JSON; keep the JSON error when both fail on JSON-looking input.
    Err(TemplateError::Unparseable(clip(
        &if raw.trim_start().starts_with('{') {
            json_err.to_string()
        } else {
            yaml_err.to_string()
        },
    )))
}

/// The limit a YAML error reports as breached, by name, with its value and the value reached.
fn over_budget(err: &serde_saphyr::Error) -> Option<String> {
    use serde_saphyr::Error as E;
    let (limit, value, reached) = match err {
        E::WithSnippet { error, .. } | E::AliasError { error, .. } => return over_budget(error),
        E::Budget { breach, .. } => match breach_limit(breach) {
            Some(named) => named,
            // Anchor retention, includes (disabled) and property expansion (not enabled) are
            // consequences of the limits above; show the breach as the parser names it.
            None => return Some(clip(&format!("a YAML parser budget: {breach:?}"))),
        },
        E::AliasReplayLimitExceeded {
            total_replayed_events,
            ..
        } => (
            "events replayed by YAML aliases",
            MAX_REPLAYED_EVENTS,
            *total_replayed_events,
        ),
        E::AliasReplayStackDepthExceeded { depth, .. } => ("YAML nesting depth", MAX_DEPTH, *depth),
        E::AliasReplayCounterOverflow { .. } => (
            "events replayed by YAML aliases",
            MAX_REPLAYED_EVENTS,
            MAX_REPLAYED_EVENTS + 1,
        ),
        E::MultipleDocuments { .. } => ("YAML documents", MAX_DOCUMENTS, MAX_DOCUMENTS + 1),
        _ => return None,
    };
    Some(format!("{limit}: {reached} is over the limit of {value}"))
}

fn breach_limit(breach: &BudgetBreach) -> Option<(&'static str, usize, usize)> {
    use BudgetBreach as B;
    Some(match breach {
        B::Events { events } => ("YAML parser events", MAX_EVENTS, *events),
        B::Aliases { aliases } => ("YAML aliases", MAX_ALIASES, *aliases),
        B::Anchors { anchors } => ("YAML anchors", MAX_ANCHORS, *anchors),
        B::Depth { depth } => ("YAML nesting depth", MAX_DEPTH, *depth),
        B::Documents { documents } => ("YAML documents", MAX_DOCUMENTS, *documents),
        B::Nodes { nodes } => ("YAML nodes", MAX_NODES, *nodes),
        B::ScalarBytes { total_scalar_bytes } => {
            ("YAML scalar bytes", MAX_SCALAR_BYTES, *total_scalar_bytes)
        }
        B::CommentBytes {
            total_comment_bytes,
        } => ("YAML comment bytes", MAX_INPUT_BYTES, *total_comment_bytes),
        B::MergeKeys { merge_keys } => ("YAML merge keys", MAX_MERGE_KEYS, *merge_keys),
        B::AliasAnchorRatio { aliases, .. } => ("YAML aliases", MAX_ALIASES, *aliases),
        _ => return None,
    })
}
