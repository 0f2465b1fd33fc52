//! OBSERVE: plain facts about one opted-in claim, the pod it names, the pods that mount it and the
//! StatefulSets that could make it, from the shared caches or read live ([`Fresh`]).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;

use std::sync::Arc;

use crate::caches::makes_claim;

use crate::naming::{BOUND_TO_POD_ANNOTATION, WAITING_SINCE_ANNOTATION};

/// When the controller first saw a claim wait for pod `pod` ([`WAITING_SINCE_ANNOTATION`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The pod it waits for.
    pub pod: String,
    /// When it was first seen waiting.
    pub since: Timestamp,
}

impl Waiting {
    /// `<pod>@<time>`; `None` for anything else (a pod name has no `@`).
    pub fn parse(raw: &str) -> Option<Waiting> {
        let (pod, since) = raw.trim().rsplit_once('@')?;
        Some(Waiting {
            pod: pod.to_string(),
            since: since.parse().ok()?,
        })
    }

    /// `<pod>@<time>`, the time to the second.
    pub fn format(&self) -> String {
        let since = Timestamp::from_second(self.since.as_second()).unwrap_or(self.since);
        format!("{}@{since}", self.pod)
    }
}

/// Facts about one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFacts {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The claim's resourceVersion (the owner patch tests it).
    pub resource_version: String,
    /// The pod named by the annotation (`None`: not opted in; empty: opted in without a name).
    pub pod: Option<String>,
    /// When the controller first saw the claim wait for a pod of this name, as it recorded it.
    pub waiting: Option<Waiting>,
    /// The claim is being deleted.
    pub deleting: bool,
    /// Its ownerReferences as (kind, name, uid).
    pub owners: Vec<(String, String, String)>,
    /// Its creationTimestamp (the API server's clock).
    pub created: Option<Timestamp>,
}

impl ClaimFacts {
    /// Whether the claim is bound: it has an ownerReference to some pod (ours, or one its creator
    /// set), so the garbage collector deletes it once every owner is gone.
    pub fn bound(&self) -> bool {
        self.owners.iter().any(|(kind, _, _)| kind == "Pod")
    }

    /// Whether the pod with `uid` is one of the claim's owners.
    pub fn owned_by(&self, uid: &str) -> bool {
        self.owners
            .iter()
            .any(|(kind, _, u)| kind == "Pod" && u == uid)
    }
}

/// A pod by name and UID (an owner to add).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
}

/// The pod the annotation names, as a read found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPod {
    /// The pod's UID.
    pub uid: String,
    /// Owned by a StatefulSet: its claims are the scale-down controller's business.
    pub stateful: bool,
}

/// What a read of the claim's pods and StatefulSets showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodRead {
    /// Not read yet: the plan asks for a read.
    NotRead,
    /// Read, from the caches or live (see [`Fresh`]).
    Read {
        /// The pod of the annotated name, if one exists.
        named: Option<NamedPod>,
        /// Pods that mount the claim and have not finished (the named one too, if it does).
        users: Vec<PodRef>,
        /// The StatefulSet whose volumeClaimTemplate gives a claim this name, if any.
        statefulset: Option<String>,
    },
}

/// The facts of `claim`, from its metadata alone.
pub fn observe(claim: &PartialObjectMeta<PersistentVolumeClaim>) -> ClaimFacts {
    ClaimFacts {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        uid: claim.uid().unwrap_or_default(),
        resource_version: claim.resource_version().unwrap_or_default(),
        pod: claim
            .annotations()
            .get(BOUND_TO_POD_ANNOTATION)
            .map(|p| p.trim().to_string()),
        waiting: claim
            .annotations()
            .get(WAITING_SINCE_ANNOTATION)
            .and_then(|w| Waiting::parse(w)),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        owners: claim
            .owner_references()
            .iter()
            .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
            .collect(),
        created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
    }
}

/// Whether `pod` has a volume of claim `claim`.
pub fn mounts(pod: &Pod, claim: &str) -> bool {
    claims_of(pod).any(|c| c == claim)
}

/// The claims `pod` mounts.
pub fn claims_of(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// Whether the pod has finished (its containers will not run again).
pub fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The StatefulSet of `sets` that makes a claim named `claim` from one of its volumeClaimTemplates
/// (`<template>-<set>-<ordinal>`, any ordinal: a claim the set left behind is still its own).
pub fn statefulset_of(claim: &str, sets: &[Arc<StatefulSet>]) -> Option<String> {
    sets.iter()
        .find(|set| makes_claim(set, claim))
        .map(|set| set.name_any())
}

/// How fresh a read of the pods and StatefulSets is, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fresh {
    /// From the shared caches (no request).
    Cached,
    /// The named pod and the StatefulSets that could make the claim read live; the pods that
    /// mount the claim from the cache.
    Named,
    /// Also every pod of the namespace read live (before a deletion).
    Namespace,
}

/// The read of pod `name` (`named`: the pod of that name, if one exists), of the pods that mount
/// `claim` (`users`: at least those; others are left out) and of the StatefulSets that could make
/// it (`sets`).
pub fn read_pods(
    name: &str,
    claim: &str,
    named: Option<&Pod>,
    users: &[Arc<Pod>],
    sets: &[Arc<StatefulSet>],
) -> PodRead {
    let named = named.filter(|p| p.name_any() == name).map(|pod| NamedPod {
        uid: pod.uid().unwrap_or_default(),
        stateful: pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "StatefulSet" && o.controller == Some(true)),
    });
    let users = users
        .iter()
        .filter(|p| !finished(p) && mounts(p, claim))
        .map(|p| PodRef {
            name: p.name_any(),
            uid: p.uid().unwrap_or_default(),
        })
        .collect();
    PodRead::Read {
        named,
        users,
        statefulset: statefulset_of(claim, sets),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set(name: &str, templates: &[&str]) -> Arc<StatefulSet> {
        let claims: Vec<_> = templates
            .iter()
            .map(|t| json!({"metadata": {"name": t}}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"selector": {}, "serviceName": name, "template": {},
                         "volumeClaimTemplates": claims}
            }))
            .expect("set"),
        )
    }

    fn pod(name: &str, claim: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "uid": format!("uid-{name}")},
                "spec": {"containers": [],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
            .expect("pod"),
        )
    }

    #[test]
    fn statefulset_claims_are_known_by_the_sets_own_names() {
        let sets = [set("web", &["data", "logs"]), set("db-2", &["data"])];
        let cases = [
            ("data-web-0", Some("web")),
            ("logs-web-17", Some("web")),
            ("data-db-2-0", Some("db-2")),
            // a plain claim that only looks alike
            ("data-web", None),
            ("data-web-x", None),
            ("cache-web-0", None),
            ("data-api-0", None),
        ];
        for (claim, want) in cases {
            assert_eq!(statefulset_of(claim, &sets).as_deref(), want, "{claim}");
        }
    }

    #[test]
    fn users_are_the_pods_that_mount_the_claim_and_have_not_finished() {
        let pods = [
            pod("runner", "cache", "Running"),
            pod("reader", "cache", "Pending"),
            pod("done", "cache", "Succeeded"),
            pod("failed", "cache", "Failed"),
            pod("elsewhere", "other", "Running"),
        ];
        let PodRead::Read {
            named,
            users,
            statefulset,
        } = read_pods("runner", "cache", Some(&pods[0]), &pods, &[])
        else {
            panic!("read");
        };
        assert_eq!(named.map(|n| n.uid).as_deref(), Some("uid-runner"));
        let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["runner", "reader"]);
        assert_eq!(statefulset, None);
        // Another pod than the one of that name (a wrong lookup) is never taken for it.
        let PodRead::Read { named, .. } = read_pods("runner", "cache", Some(&pods[1]), &pods, &[])
        else {
            panic!("read");
        };
        assert_eq!(named, None);
    }
}
