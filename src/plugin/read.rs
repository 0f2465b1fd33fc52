//! The plugin's reads and its one write (the finalizer release). Each namespace is listed once;
//! every set in it is then observed and decided on exactly as the controller does on a live read.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::status::SetStatus;
use crate::error::{Error, Result, code, is_status};
use crate::naming;
use crate::scaledown::decide::{Policy, decide};
use crate::scaledown::observe::{self, SetRead, Sources};
use crate::scaledown::reconcile::list_namespace;

/// Where to look: one namespace, or all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace.
    All,
}

/// Tries of the finalizer release when the set keeps changing.
const RELEASE_TRIES: usize = 5;

/// The status of every opted-in set in `scope` (or only `only`), sorted by namespace and name.
pub async fn statuses(
    client: &Client,
    scope: &Scope,
    only: Option<&str>,
    policy: &Policy,
) -> Result<Vec<SetStatus>> {
    let mut out = Vec::new();
    for (ns, sets) in sets_by_namespace(client, scope).await? {
        let chosen: Vec<&Arc<StatefulSet>> = sets
            .iter()
            .filter(|s| opted_in(s) && only.is_none_or(|o| s.name_any() == o))
            .collect();
        if chosen.is_empty() {
            continue;
        }
        let listed = list_namespace(client, &ns).await?;
        let warnings = warning_events(client, &ns).await?;
        let now = Timestamp::now();
        for set in chosen {
            let observed = observe::observe(
                set,
                &Sources {
                    sets: &sets,
                    claims: &listed.claims,
                    pods: &listed.pods,
                    cleanup_pods: &listed.cleanup_pods,
                    ordinals: &listed.ordinals(set),
                    cleanups_in_flight: 0,
                    rejections: BTreeMap::new(),
                    disputed: Default::default(),
                    read: SetRead::LiveAll,
                    now,
                },
            );
            let plan = decide(&observed, policy);
            let last = last_warning(&warnings, set, now);
            out.push(SetStatus::new(&observed, &plan, last));
        }
    }
    Ok(out)
}

/// Removes our finalizer from the sets in `scope` (or only `only`) that have it; one line each.
pub async fn release_finalizers(
    client: &Client,
    scope: &Scope,
    only: Option<&str>,
    dry_run: bool,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for (ns, sets) in sets_by_namespace(client, scope).await? {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        for set in sets
            .iter()
            .filter(|s| only.is_none_or(|o| s.name_any() == o))
        {
            if !has_finalizer(set) {
                continue;
            }
            let name = set.name_any();
            let line = if dry_run {
                format!("{ns}/{name}: would release finalizer {}", naming::FINALIZER)
            } else {
                release(&api, set).await?
            };
            lines.push(line);
        }
    }
    if lines.is_empty() {
        lines.push(format!(
            "no StatefulSet has finalizer {}",
            naming::FINALIZER
        ));
    }
    Ok(lines)
}

/// One set's release, as a compare-and-swap on its resourceVersion, read again on a conflict.
async fn release(api: &Api<StatefulSet>, set: &StatefulSet) -> Result<String> {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let mut current = set.clone();
    for _ in 0..RELEASE_TRIES {
        let rest: Vec<&String> = current
            .finalizers()
            .iter()
            .filter(|f| *f != naming::FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": rest,
                                         "resourceVersion": current.resource_version()}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let note = if opted_in(&current) && current.metadata.deletion_timestamp.is_none() {
                    " (it still has the template annotation: a running controller adds it again)"
                } else {
                    ""
                };
                return Ok(format!(
                    "{ns}/{name}: released finalizer {}{note}",
                    naming::FINALIZER
                ));
            }
            Err(e) if is_status(&e, &[code::CONFLICT]) => {}
            Err(e) if is_status(&e, &[code::NOT_FOUND]) => return Ok(format!("{ns}/{name}: gone")),
            Err(e) => return Err(Error::kube("release finalizer of statefulset", &name)(e)),
        }
        match api
            .get_opt(&name)
            .await
            .map_err(Error::kube("get statefulset", &name))?
        {
            Some(fresh) if has_finalizer(&fresh) => current = fresh,
            _ => return Ok(format!("{ns}/{name}: released meanwhile")),
        }
    }
    Err(Error::Contended {
        set: name,
        answer: "the finalizer patch kept conflicting".into(),
    })
}

/// Every StatefulSet in `scope`, grouped by namespace.
async fn sets_by_namespace(
    client: &Client,
    scope: &Scope,
) -> Result<BTreeMap<String, Vec<Arc<StatefulSet>>>> {
    let api: Api<StatefulSet> = match scope {
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        Scope::All => Api::all(client.clone()),
    };
    let sets = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list statefulsets", scope_name(scope)))?;
    let mut by_ns: BTreeMap<String, Vec<Arc<StatefulSet>>> = BTreeMap::new();
    for set in sets.items {
        let ns = set.namespace().unwrap_or_default();
        by_ns.entry(ns).or_default().push(Arc::new(set));
    }
    for sets in by_ns.values_mut() {
        sets.sort_by_key(|s| s.name_any());
    }
    Ok(by_ns)
}

fn scope_name(scope: &Scope) -> String {
    match scope {
        Scope::Namespace(ns) => ns.clone(),
        Scope::All => "(all namespaces)".into(),
    }
}

fn opted_in(set: &StatefulSet) -> bool {
    set.annotations().contains_key(naming::TEMPLATE_ANNOTATION) || has_finalizer(set)
}

fn has_finalizer(set: &StatefulSet) -> bool {
    set.finalizers().iter().any(|f| f == naming::FINALIZER)
}

/// Warning Events on StatefulSets of `ns` (the controller's and anyone else's).
async fn warning_events(client: &Client, ns: &str) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default().fields("type=Warning,involvedObject.kind=StatefulSet");
    Ok(api
        .list(&params)
        .await
        .map_err(Error::kube("list events", ns))?
        .items)
}

/// The newest Warning Event about `set`: `Reason: message (age)`.
fn last_warning(events: &[Event], set: &StatefulSet, now: Timestamp) -> Option<String> {
    let uid = set.uid();
    events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(set.name_any().as_str()))
        .filter(|e| uid.is_none() || e.involved_object.uid == uid)
        .filter_map(|e| Some((event_time(e)?, e)))
        .max_by_key(|(at, _)| *at)
        .map(|(at, e)| {
            let age = now.duration_since(at).as_secs().max(0);
            format!(
                "{}: {} ({age}s ago)",
                e.reason.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or_default()
            )
        })
}

fn event_time(e: &Event) -> Option<Timestamp> {
    let series = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref());
    series
        .map(|t| t.0)
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}
