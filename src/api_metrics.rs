//! Counts the Kubernetes API requests the controller sends, by verb, resource and status code
//! (`scaledown_api_requests_total`): a tower layer on the client, outside kube's own retry layer,
//! so one call of the controller counts once whatever kube retried underneath.
//!
//! The verb is the Kubernetes verb (`get`, `list`, `watch`, `create`, `patch`, `update`, `delete`,
//! `deletecollection`), derived from the HTTP method, whether the path names one object, and the
//! `watch` query parameter. Labels are bounded: the resources are the ones the controller's code
//! touches, and the code is the HTTP status (or `error` when no response came).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::Client;
use kube::client::ClientBuilder;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::Instant;

/// The labels of `scaledown_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The request's verb (`get`, `list`, `watch`, `create`, `patch`, `delete`, ...).
    pub verb: &'static str,
    /// The resource, plural (`pods`, `persistentvolumeclaims`, ...).
    pub resource: String,
    /// The HTTP status code of the answer, or `error` when none came.
    pub code: String,
}

/// The process-wide counter family: the client exists before the metrics registry, and every
/// registry (one per `Metrics`) exports this same family.
pub fn requests() -> &'static Family<RequestLabels, Counter> {
    static REQUESTS: LazyLock<Family<RequestLabels, Counter>> = LazyLock::new(Family::default);
    &REQUESTS
}

/// When each resource was last watched: the instant the latest WATCH request for it was sent, by
/// resource label. kube-runtime's watcher sends one at least every `timeoutSeconds` (290 s: the API
/// server ends every watch then, and the watcher starts it again), and every ≤ 2 s while the API
/// server fails (`crate::resuming`); an idle cluster changes neither. A resource whose entry grows
/// old is a watch that is no longer polled: `/healthz` reports it ([`crate::http`]).
pub fn watched() -> &'static Mutex<HashMap<String, Instant>> {
    static WATCHED: LazyLock<Mutex<HashMap<String, Instant>>> = LazyLock::new(Default::default);
    &WATCHED
}

/// A client from `config` whose requests are counted in [`requests`].
pub fn client(config: kube::Config) -> kube::Result<Client> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&CountRequests)
        .build())
}

/// The tower layer that counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountRequests;

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner }
    }
}

/// The client's service wrapped by the counting layer: it counts each request once answered.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query());
        if verb == "watch" {
            watched()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(resource.clone(), Instant::now());
        }
        let future = self.inner.call(req);
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            requests()
                .get_or_create(&RequestLabels {
                    verb,
                    resource,
                    code,
                })
                .inc();
            result
        })
    }
}

/// The Kubernetes verb and resource (`pods`, `pods/status`, ...) of a request; `nonresource` for
/// paths such as `/version`. An object's name never reaches the resource label.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    // `namespaces/NS/<resource>...` is a namespaced resource; `namespaces[/NS]` is the namespace.
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("nonresource".to_string(), true),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (subresource_label(resource, sub), true),
    };
    (verb(method, named, query), resource)
}

/// `resource/subresource` for the subresources we know, else the resource alone (bounded).
fn subresource_label(resource: &str, sub: &str) -> String {
    match (resource, sub) {
        ("pods" | "statefulsets" | "persistentvolumeclaims", "status")
        | ("pods", "eviction" | "binding")
        | ("statefulsets", "scale") => format!("{resource}/{sub}"),
        _ => resource.to_string(),
    }
}

fn verb(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch"))
    });
    match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_and_resources_of_the_requests_the_controller_sends() {
        let cases = [
            (
                Method::GET,
                "/apis/apps/v1/statefulsets",
                Some("&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=12"),
                ("watch", "statefulsets"),
            ),
            (
                Method::GET,
                "/api/v1/pods",
                Some("labelSelector=scaledown-pod"),
                ("list", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/persistentvolumeclaims",
                None,
                ("list", "persistentvolumeclaims"),
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/ns/statefulsets/web",
                None,
                ("get", "statefulsets"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/pods",
                Some("fieldManager=x"),
                ("create", "pods"),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/web-2",
                None,
                ("patch", "pods"),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/web-2/status",
                None,
                ("patch", "pods/status"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/persistentvolumeclaims/data-web-2",
                None,
                ("delete", "persistentvolumeclaims"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods",
                None,
                ("deletecollection", "pods"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                None,
                ("create", "events"),
            ),
            (
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/id",
                None,
                ("get", "leases"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/id",
                None,
                ("update", "leases"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns",
                None,
                ("get", "namespaces"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                None,
                ("list", "namespaces"),
            ),
            (Method::GET, "/version", None, ("get", "nonresource")),
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods/p/weird",
                None,
                ("get", "pods"),
            ),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                classify(&method, path, query),
                (verb, resource.to_string()),
                "{method} {path}"
            );
        }
    }

    /// The layer counts a request once its response arrives, under the response's status.
    #[tokio::test]
    async fn the_layer_counts_by_verb_resource_and_code() {
        use tower::{Layer, Service};
        let mut svc = CountRequests.layer(tower::service_fn(|req: Request<()>| async move {
            let status = if req.method() == Method::DELETE {
                404
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(())
                    .expect("response"),
            )
        }));
        let labels = |verb, code: &str| RequestLabels {
            verb,
            resource: "persistentvolumeclaims".into(),
            code: code.into(),
        };
        let before_get = requests().get_or_create(&labels("get", "200")).get();
        let before_delete = requests().get_or_create(&labels("delete", "404")).get();
        for (method, n) in [(Method::GET, 2), (Method::DELETE, 1)] {
            for _ in 0..n {
                let req = Request::builder()
                    .method(method.clone())
                    .uri("/api/v1/namespaces/bench-counted/persistentvolumeclaims/data-x-1")
                    .body(())
                    .expect("request");
                svc.call(req).await.expect("response");
            }
        }
        assert_eq!(
            requests().get_or_create(&labels("get", "200")).get(),
            before_get + 2
        );
        assert_eq!(
            requests().get_or_create(&labels("delete", "404")).get(),
            before_delete + 1
        );
        let watched_at = || {
            watched()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get("persistentvolumeclaims/status")
                .copied()
        };
        assert_eq!(watched_at(), None, "a GET is not a watch");
        let watch = Request::builder()
            .uri("/api/v1/namespaces/bench-counted/persistentvolumeclaims/x/status?watch=true")
            .body(())
            .expect("request");
        let before = Instant::now();
        svc.call(watch).await.expect("response");
        assert!(
            watched_at().is_some_and(|at| at >= before),
            "a WATCH is recorded"
        );
    }
}
