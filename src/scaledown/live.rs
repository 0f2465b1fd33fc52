//! Live reads of a namespace, straight from the API server: what a confirmed pass over a set
//! needs besides the set itself (`reconcile`), and what `kubectl scaledown status` shows.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};
use crate::naming;

/// The claims, pods and cleanup pods of a namespace, read from the API server just now.
pub struct Listed {
    /// The claims of the namespace (metadata).
    pub claims: Vec<Arc<kube::core::PartialObjectMeta<PersistentVolumeClaim>>>,
    /// Pruned as the pod cache is (`caches::prune_pod`).
    pub pods: Vec<Arc<Pod>>,
    /// Whole, as the cleanup-pod cache keeps them.
    pub cleanup_pods: Vec<Arc<Pod>>,
}

/// Lists the claims (metadata) and pods of `ns`: what a live observation of a set needs besides
/// the set itself. Used before the finalizer is released, and by `kubectl scaledown status`.
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
    Ok(Listed {
        claims: arcs(claims),
        pods: arcs(pods),
        cleanup_pods: arcs(cleanup),
    })
}

fn arcs<T>(items: Vec<T>) -> Vec<Arc<T>> {
    items.into_iter().map(Arc::new).collect()
}
