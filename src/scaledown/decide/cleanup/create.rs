//! The cleanup pods to create: which orphaned ordinals get one now (OrderedReady one at a time,
//! Parallel all; under the cap; after a refusal's backoff), and the gated pod rendered for each.

use serde_json::Value;

use crate::naming;
use crate::reason::Reason;
use crate::scaledown::decide::plan::{Confirm, Plan, Step};
use crate::scaledown::decide::view::View;
use crate::scaledown::observe::{OrdinalFacts, SetRead};
use crate::template::{self, Target};

pub fn create_cleanup_pods(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    pending: &[u32],
    set_has_cleanup_pod: bool,
    plan: &mut Plan,
) {
    let (o, set) = (view.o, &view.o.set);
    let ready = |ordinal: &&u32| o.ordinals.get(ordinal).is_some_and(|f| f.pod.is_none());
    let chosen: Vec<u32> = if set.parallel {
        pending.iter().filter(ready).copied().collect()
    } else if set_has_cleanup_pod {
        Vec::new()
    } else {
        // Highest first, one at a time: only the highest pending ordinal, once its pod is gone.
        pending.first().filter(ready).copied().into_iter().collect()
    };
    let room = view
        .policy
        .max_in_flight
        .map_or(usize::MAX, |cap| cap.saturating_sub(o.cleanups_in_flight));
    let eligible: Vec<u32> = chosen
        .into_iter()
        .filter(|n| !refused_too_recently(view, *n, plan) && !disputed(view, *n, plan))
        .collect();
    if eligible.len() > room {
        // Held back by `--max-concurrent-cleanups`: woken when a cleanup pod frees room, as no
        // event of this set says when another set's cleanup ends.
        plan.waits_for_room = true;
    }
    for ordinal in eligible.into_iter().take(room) {
        if let Some(facts) = o.ordinals.get(&ordinal) {
            create_one(view, template, ordinal, facts, plan);
        }
    }
}

/// Whether a live read of the namespace found a claim of this ordinal another set's, and this
/// view is not such a read: the caches may lag (a new set the StatefulSet cache does not show
/// yet), so the plan asks for one, on which the ordinal is judged again.
fn disputed(view: &View<'_>, ordinal: u32, plan: &mut Plan) -> bool {
    let o = view.o;
    if o.read == SetRead::LiveAll || !o.disputed.contains(&ordinal) {
        return false;
    }
    plan.confirm(Confirm::SetAndNamespace);
    true
}

/// Whether an earlier refusal by the API server holds this ordinal back (backoff, or given up).
fn refused_too_recently(view: &View<'_>, ordinal: u32, plan: &mut Plan) -> bool {
    let (o, policy) = (view.o, view.policy);
    let Some(refusal) = o.rejections.get(&ordinal) else {
        return false;
    };
    let pod = naming::pod_name(&o.set.name, ordinal);
    if refusal.count >= policy.max_attempts {
        plan.event(
            Reason::CleanupGaveUp,
            format!("refused-{ordinal}"),
            format!(
                "the API server refused cleanup pod {pod} {} times (last: {} {}); giving up until the template annotation (or the scheduling the pod inherits) changes or the controller restarts",
                refusal.count, refusal.code, refusal.message
            ),
        );
        return true;
    }
    let retry_at = refusal
        .last
        .checked_add(policy.backoff(refusal.count))
        .unwrap_or(refusal.last);
    if retry_at > o.now {
        plan.requeue(crate::scaledown::observe::until(o.now, retry_at));
        return true;
    }
    false
}

fn create_one(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    ordinal: u32,
    facts: &OrdinalFacts,
    plan: &mut Plan,
) {
    let set = &view.o.set;
    let volumes: Vec<(&str, Option<(&str, &str)>)> = set
        .claim_templates
        .iter()
        .map(|t| {
            let claim = facts.claims.iter().find(|c| c.template == *t && c.live());
            (t.as_str(), claim.map(|c| (c.name.as_str(), c.uid.as_str())))
        })
        .collect();
    for (t, claim) in &volumes {
        if claim.is_none() {
            let name = naming::claim_name(t, &set.name, ordinal);
            plan.event(
                Reason::ClaimMissing,
                name.clone(),
                format!("claim {name} of ordinal {ordinal} does not exist or is being deleted; the cleanup pod gets an empty directory as volume {t}"),
            );
        }
    }
    let attempt = facts
        .claims
        .iter()
        .filter_map(|c| c.next_attempt)
        .max()
        .unwrap_or(1);
    let target = Target {
        namespace: &set.namespace,
        set: &set.name,
        ordinal,
        replicas: set.replicas,
        attempt,
        volumes,
    };
    if let Some(pod) = render(view, template, &target, plan) {
        let claims = target
            .volumes
            .iter()
            .filter_map(|(_, c)| c.map(|(n, u)| (n.to_string(), u.to_string())))
            .collect();
        plan.steps.push(Step::CreateCleanupPod {
            ordinal,
            attempt,
            pod,
            claims,
        });
    }
}

/// The cleanup pod for `target`, with the set's scheduling fields if it inherits them; a pod
/// over the size limit is a Warning and no pod (not a request the API server refuses every pass).
fn render(
    view: &View<'_>,
    template: &template::CleanupTemplate,
    target: &Target<'_>,
    plan: &mut Plan,
) -> Option<Value> {
    let (rendered, fix) = match view.inherited {
        Some(inherited) if !inherited.is_empty() => (
            template.render_inheriting(target, inherited),
            "the annotation or the StatefulSet's scheduling fields are fixed (or the set opts out of inheriting them)",
        ),
        _ => (template.render(target), "the annotation is fixed"),
    };
    rendered
        .map_err(|e| {
            plan.event(
                e.reason(),
                e.to_string(),
                format!("{e}; no cleanup pod is created until {fix}"),
            )
        })
        .ok()
}
