//! Decisions on the cleanup pods one pass creates: which of the plan's creates may be sent now
//! (admission), and, once they hold their names, which may run (verdicts). Pure like the rest of
//! decide: the waits are facts the caller worked out from its clock and its memory of creates.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::naming;
use crate::scaledown::decide::plan::{Plan, Step, Verdict};
use crate::scaledown::observe::{Created, Record, SetFacts};

/// Whether the cleanup pod just created for `ordinal` may run, given a read of the set made after
/// the pod was created (so it already holds the name: the StatefulSet cannot recreate the ordinal).
pub fn confirm_created(set: &SetFacts, ordinal: u32) -> Verdict {
    if set.template.is_none() || set.claim_templates.is_empty() {
        Verdict::Cancel("the StatefulSet no longer asks for cleanups".into())
    } else if set.wants(ordinal) {
        Verdict::Cancel(format!("ordinal {ordinal} is wanted again"))
    } else if set.when_scaled_delete && !set.deleting {
        Verdict::Cancel("the claim retention policy deletes the claims".into())
    } else {
        Verdict::Run
    }
}

/// Slack added to the shortest wait before the set looks again, so it wakes after the wait ended.
const WAKE_SLACK: Duration = Duration::from_millis(100);

/// What is known about creates when a plan's creates are admitted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// Cleanup pods in flight everywhere we watch: those the cache shows plus creates of this
    /// process it does not show yet (counted only under a cap).
    pub in_flight: usize,
    /// `--max-concurrent-cleanups`.
    pub cap: Option<usize>,
    /// Cleanup pod names of this set that may not be created yet, with the time left: created
    /// again and again (the backoff of one name's creates), or created by this process and not
    /// yet in the cache (the API would answer 409, one request for nothing).
    pub waits: BTreeMap<String, Duration>,
}

/// The plan keeping only the creates that may be sent now, and their names (the caller enters
/// them as in flight before it sends them, so concurrent passes share the cap). A create that must
/// wait makes the set look again when the shortest wait is over; one held back by the cap marks
/// the plan as waiting for room ([`Plan::waits_for_room`]). Every other step is kept.
pub fn admit(set: &SetFacts, mut plan: Plan, admission: &Admission) -> (Plan, Vec<String>) {
    let mut free = admission
        .cap
        .map_or(usize::MAX, |cap| cap.saturating_sub(admission.in_flight));
    let (mut admitted, mut held_back, mut shortest) = (Vec::new(), false, None::<Duration>);
    plan.steps.retain(|step| {
        let Step::CreateCleanupPod { ordinal, .. } = step else {
            return true;
        };
        let name = naming::pod_name(&set.name, *ordinal);
        if let Some(left) = admission.waits.get(&name) {
            shortest = Some(shortest.map_or(*left, |s| s.min(*left)));
            return false;
        }
        if free == 0 {
            held_back = true;
            return false;
        }
        free -= 1;
        admitted.push(name);
        true
    });
    if held_back {
        plan.waits_for_room = true;
    }
    if let Some(wait) = shortest {
        plan.requeue(wait + WAKE_SLACK);
    }
    (plan, admitted)
}

/// The verdict on each pod in `pending` given a read of its set made after the creates (`None`:
/// the set is gone or was replaced).
pub fn verdicts(facts: Option<&SetFacts>, pending: &[Created]) -> Vec<(Created, Verdict)> {
    pending
        .iter()
        .map(|c| {
            let verdict = facts.map_or_else(
                || Verdict::Cancel("the StatefulSet is gone".into()),
                |f| confirm_created(f, c.ordinal),
            );
            (c.clone(), verdict)
        })
        .collect()
}

/// The record entries of the pods that may run.
pub fn runs(verdicts: &[(Created, Verdict)]) -> Vec<(u32, Record)> {
    verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Run)
        .map(|(c, _)| {
            let record = Record {
                pod: c.uid.clone(),
                claims: c.claims.clone(),
            };
            (c.ordinal, record)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set() -> SetFacts {
        let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "generation": 2,
                         "annotations": {naming::TEMPLATE_ANNOTATION: "{}"}},
            "spec": {"replicas": 1, "selector": {}, "template": {},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
            "status": {"replicas": 1, "observedGeneration": 2}
        }))
        .expect("statefulset");
        crate::scaledown::observe::set_facts(&set)
    }

    fn create(ordinal: u32) -> Step {
        Step::CreateCleanupPod {
            ordinal,
            attempt: 1,
            pod: json!({}),
            claims: BTreeMap::new(),
        }
    }

    fn plan(steps: Vec<Step>) -> Plan {
        Plan {
            steps,
            ..Plan::default()
        }
    }

    fn ordinals(plan: &Plan) -> Vec<u32> {
        plan.steps
            .iter()
            .filter_map(|s| match s {
                Step::CreateCleanupPod { ordinal, .. } => Some(*ordinal),
                _ => None,
            })
            .collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn admission_table() {
        let waits = |names: &[(&str, u64)]| -> BTreeMap<String, Duration> {
            names
                .iter()
                .map(|(n, s)| (n.to_string(), secs(*s)))
                .collect()
        };
        type Case = (
            usize,
            Option<usize>,
            BTreeMap<String, Duration>,
            Vec<u32>,
            (Option<Duration>, bool),
        );
        const ROOM: (Option<Duration>, bool) = (None, true);
        const NONE: (Option<Duration>, bool) = (None, false);
        // (in flight, cap, waits) -> (admitted ordinals, (requeue, waits for room))
        let cases: Vec<Case> = vec![
            (0, None, waits(&[]), vec![3, 2, 1], NONE),
            (100, None, waits(&[]), vec![3, 2, 1], NONE),
            (0, Some(2), waits(&[]), vec![3, 2], ROOM),
            (1, Some(2), waits(&[]), vec![3], ROOM),
            (2, Some(2), waits(&[]), vec![], ROOM),
            (5, Some(2), waits(&[]), vec![], ROOM),
            (
                0,
                None,
                waits(&[("web-3", 4), ("web-1", 8)]),
                vec![2],
                (Some(secs(4) + WAKE_SLACK), false),
            ),
            // A waiting name takes no place under the cap: the next one gets it.
            (
                0,
                Some(1),
                waits(&[("web-3", 30)]),
                vec![2],
                (Some(secs(30) + WAKE_SLACK), true),
            ),
            (0, Some(5), waits(&[("web-9", 1)]), vec![3, 2, 1], NONE),
        ];
        for (in_flight, cap, waits, admitted, requeue) in cases {
            let admission = Admission {
                in_flight,
                cap,
                waits: waits.clone(),
            };
            let steps = vec![create(3), create(2), create(1)];
            let (out, names) = admit(&set(), plan(steps), &admission);
            assert_eq!(ordinals(&out), admitted, "{admission:?}");
            let expected: Vec<String> = admitted.iter().map(|n| format!("web-{n}")).collect();
            assert_eq!(names, expected, "{admission:?}");
            assert_eq!(
                (out.requeue_after, out.waits_for_room),
                requeue,
                "{admission:?}"
            );
        }
    }

    #[test]
    fn steps_other_than_creates_are_always_kept() {
        let admission = Admission {
            in_flight: 9,
            cap: Some(1),
            waits: BTreeMap::new(),
        };
        let steps = vec![
            Step::Release {
                name: "web-2".into(),
                uid: "u".into(),
            },
            create(1),
        ];
        let (out, names) = admit(&set(), plan(steps), &admission);
        assert_eq!(out.steps.len(), 1);
        assert!(matches!(out.steps[0], Step::Release { .. }));
        assert!(names.is_empty());
        // Without creates the plan is untouched.
        let untouched = plan(vec![Step::Release {
            name: "web-2".into(),
            uid: "u".into(),
        }]);
        let (out, _) = admit(&set(), untouched.clone(), &admission);
        assert_eq!(out, untouched);
    }

    fn created(ordinal: u32) -> Created {
        Created {
            ordinal,
            name: format!("web-{ordinal}"),
            uid: format!("uid-{ordinal}"),
            attempt: 1,
            claims: [(format!("data-web-{ordinal}"), format!("uid-data-{ordinal}"))].into(),
        }
    }

    #[test]
    fn verdicts_follow_the_read_made_after_the_creates() {
        let pending = [created(1), created(0)];
        // Gone: nothing runs.
        let gone = verdicts(None, &pending);
        assert!(
            gone.iter().all(|(_, v)| matches!(v, Verdict::Cancel(_))),
            "{gone:?}"
        );
        assert!(runs(&gone).is_empty());
        // Replicas 1: ordinal 0 is wanted, ordinal 1 is orphaned and runs.
        let read = verdicts(Some(&set()), &pending);
        assert_eq!(read[0].1, Verdict::Run);
        assert!(matches!(&read[1].1, Verdict::Cancel(why) if why.contains("wanted again")));
        let records = runs(&read);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].0, 1);
        assert_eq!(records[0].1.pod, "uid-1");
        assert_eq!(records[0].1.claims["data-web-1"], "uid-data-1");
    }
}
