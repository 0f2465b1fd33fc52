//! Live reads of a namespace, straight from the API server: what a confirmed pass over a set
//! needs besides the set itself (`reconcile`), and what `kubectl scaledown status` shows.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::coalesce::Coalesce;
use crate::error::{Error, Result};
use crate::naming;
use crate::scaledown::watch::{labelled_by, lacks_own_labels};

/// Live lists of namespaces, each shared by the passes that asked for it before it was sent
/// (`crate::coalesce`): the claim deletes of many cleanups that end together in one namespace wait
/// for one list instead of sending one each.
pub struct NamespaceLists {
    client: Client,
    reads: Coalesce<String, Listed, Error>,
}

impl NamespaceLists {
    /// Lists read through `client`.
    pub fn new(client: Client) -> Self {
        NamespaceLists {
            client,
            reads: Coalesce::default(),
        }
    }

    /// The claims, pods and StatefulSets of `ns`, listed after this call began.
    pub async fn list(&self, ns: &str) -> Result<Arc<Listed>> {
        let client = self.client.clone();
        let owned = ns.to_string();
        self.reads
            .get(ns.to_string(), move || async move {
                list_namespace(&client, &owned).await
            })
            .await
            .map_err(Error::Shared)
    }
}

/// The claims, pods, cleanup pods and StatefulSets of a namespace, read from the API server just
/// now.
pub struct Listed {
    /// The claims of the namespace (metadata).
    pub claims: Vec<Arc<kube::core::PartialObjectMeta<PersistentVolumeClaim>>>,
    /// Pruned as the pod cache is (`caches::prune_pod`).
    pub pods: Vec<Arc<Pod>>,
    /// Whole, as the cleanup-pod cache keeps them.
    pub cleanup_pods: Vec<Arc<Pod>>,
    /// The StatefulSets of the namespace, pruned as the cache prunes them: whether another set
    /// still wants a claim's ordinal is a fact a claim delete depends on, so it is read live too.
    pub sets: Vec<Arc<StatefulSet>>,
}

impl Listed {
    /// The other sets `set`'s claims could belong to: those whose claim templates give one of
    /// its claims' names, and those whose selector labels one of them carries (what the cache's
    /// slice holds, from this read).
    pub fn rival_sets(&self, set: &StatefulSet) -> Vec<Arc<StatefulSet>> {
        let name = set.name_any();
        let own: Vec<_> = self
            .claims
            .iter()
            .filter(|c| crate::caches::makes_claim(set, &c.name_any()))
            .map(|c| &**c)
            .collect();
        // As in the cache's slice: sets by label only when a claim lacks this set's labels.
        let by_labels = lacks_own_labels(set, own.iter().copied());
        self.sets
            .iter()
            .filter(|other| other.name_any() != name)
            .filter(|other| {
                own.iter()
                    .any(|c| crate::caches::makes_claim(other, &c.name_any()))
                    || (by_labels && labelled_by(other, own.iter().copied()))
            })
            .cloned()
            .collect()
    }
}

/// Lists the claims (metadata), pods and StatefulSets of `ns`: what a live observation of a set
/// needs besides the set itself. Used before the finalizer is released, and by `kubectl scaledown status`.
pub async fn list_namespace(client: &Client, ns: &str) -> Result<Listed> {
    let all = ListParams::default();
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claims = claims_api
        .list_metadata(&all)
        .await
        .map_err(Error::kube("list claims", ns))?
        .items;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pods = pods_api
        .list(&all)
        .await
        .map_err(Error::kube("list pods", ns))?
        .items;
    let cleanup: Vec<Pod> = pods
        .iter()
        .filter(|p| p.labels().contains_key(naming::CLEANUP_LABEL))
        .cloned()
        .collect();
    pods.iter_mut().for_each(crate::caches::prune_pod);
    let sets_api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let mut sets = sets_api
        .list(&all)
        .await
        .map_err(Error::kube("list statefulsets", ns))?
        .items;
    sets.iter_mut().for_each(crate::caches::prune_set);
    Ok(Listed {
        claims: arcs(claims),
        pods: arcs(pods),
        cleanup_pods: arcs(cleanup),
        sets: arcs(sets),
    })
}

fn arcs<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set(name: &str, template: &str, app: &str) -> Arc<StatefulSet> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": app}}, "template": {},
                         "serviceName": name,
                         "volumeClaimTemplates": [{"metadata": {"name": template}}]}
            }))
            .expect("statefulset"),
        )
    }

    fn claim(
        name: &str,
        app: Option<&str>,
    ) -> Arc<kube::core::PartialObjectMeta<PersistentVolumeClaim>> {
        let labels = app.map(|a| json!({"app": a})).unwrap_or(json!({}));
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": "ns", "labels": labels}
            }))
            .expect("claim"),
        )
    }

    fn names(sets: Vec<Arc<StatefulSet>>) -> Vec<String> {
        sets.iter().map(|s| s.name_any()).collect()
    }

    /// Issue 23: the live read names the same rivals as the cache's slice: by claim name always,
    /// by selector labels only when one of the set's claims lacks its own labels.
    #[test]
    fn rival_sets_are_those_a_claim_could_belong_to() {
        let my_db = set("my-db", "data", "my-db");
        let listed = |claims| Listed {
            claims,
            pods: Vec::new(),
            cleanup_pods: Vec::new(),
            sets: vec![
                my_db.clone(),
                set("db", "data-my", "db"),
                set("other", "data", "other"),
                set("web", "data", "web"),
            ],
        };
        let own = listed(vec![claim("data-my-db-0", Some("my-db"))]);
        assert_eq!(names(own.rival_sets(&my_db)), ["db"], "by name only");
        let foreign = listed(vec![
            claim("data-my-db-0", Some("my-db")),
            claim("data-my-db-1", Some("other")),
        ]);
        assert_eq!(names(foreign.rival_sets(&my_db)), ["db", "other"]);
        let none = listed(vec![claim("data-web-0", Some("web"))]);
        assert!(
            none.rival_sets(&my_db).is_empty(),
            "claims of other sets only"
        );
    }
}
