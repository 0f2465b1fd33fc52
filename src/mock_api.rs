//! A scripted API server for the tests of the IO layer (`act`, `reconcile`): kube's `Client` over
//! a `tower-test` mock service. Every request is recorded; each is answered by the test's rule.
//! Only the thin layer that turns plans into requests is tested this way; behaviour against a real
//! API server is what the e2e tests are for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request the code under test sent.
#[derive(Clone, Debug)]
pub struct Sent {
    pub method: String,
    /// The path without the query, e.g. `/api/v1/namespaces/ns/pods/web-1`.
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
}

impl Sent {
    /// `"DELETE /api/v1/namespaces/ns/persistentvolumeclaims/data-web-1"`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    pub fn is_event(&self) -> bool {
        self.path.contains("/events")
    }
}

/// The answer to one request: status code and JSON body.
pub type Answer = (u16, Value);

/// The requests recorded so far, in order.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Sent>>>);

impl Log {
    pub fn all(&self) -> Vec<Sent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The requests that are not Events, as `METHOD path` lines.
    pub fn lines(&self) -> Vec<String> {
        self.writes_and_reads().iter().map(Sent::line).collect()
    }

    pub fn writes_and_reads(&self) -> Vec<Sent> {
        self.all().into_iter().filter(|s| !s.is_event()).collect()
    }

    /// The Events published: `(type, reason, note)`.
    pub fn events(&self) -> Vec<(String, String, String)> {
        let field = |s: &Sent, k: &str| s.body[k].as_str().unwrap_or_default().to_string();
        self.all()
            .iter()
            .filter(|s| s.is_event() && s.method == "POST")
            .map(|s| (field(s, "type"), field(s, "reason"), field(s, "note")))
            .collect()
    }
}

impl Log {
    /// The Events published, as `Type Reason: note`, with ` (series N)` when kube's Recorder sent
    /// it as a repeat of an Event of the same reason on the same object.
    pub fn published(&self) -> Vec<String> {
        let field = |s: &Sent, k: &str| s.body[k].as_str().unwrap_or_default().to_string();
        self.all()
            .iter()
            .filter(|s| s.is_event() && matches!(s.method.as_str(), "POST" | "PATCH"))
            .map(|s| {
                let (kind, reason, note) = (field(s, "type"), field(s, "reason"), field(s, "note"));
                let series = match s.method.as_str() {
                    "PATCH" => format!(" (series {})", s.body["series"]["count"]),
                    _ => String::new(),
                };
                format!("{kind} {reason}: {note}{series}")
            })
            .collect()
    }
}

/// A client whose requests `answer` answers. Events are accepted (201, echoed) without asking it.
pub fn serve<F>(answer: F) -> (Client, Log)
where
    F: Fn(&Sent) -> Answer + Send + Sync + 'static,
{
    serve_slow(move |sent| (answer(sent), Duration::ZERO))
}

/// As [`serve`], but each answer is sent after its delay (on tokio's clock, which a test may pause),
/// while later requests are recorded and answered meanwhile. A request is recorded when it arrives.
pub fn serve_slow<F>(answer: F) -> (Client, Log)
where
    F: Fn(&Sent) -> (Answer, Duration) + Send + Sync + 'static,
{
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log = Log::default();
    let recorded = log.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let sent = record(request).await;
            let ((code, body), delay) = if sent.is_event() {
                ((201, sent.body.clone()), Duration::ZERO)
            } else {
                answer(&sent)
            };
            recorded
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sent);
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                .expect("a response from a status code and bytes");
            if delay.is_zero() {
                respond.send_response(response);
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    respond.send_response(response);
                });
            }
        }
    });
    (Client::new(service, "default"), log)
}

async fn record(request: Request<Body>) -> Sent {
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    Sent {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: header("content-type"),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// A `Status` failure as the API server sends it.
pub fn status(code: u16, reason: &str, message: &str) -> Answer {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    (code, body)
}

/// The `Status` a successful delete answers with.
pub fn deleted() -> Answer {
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
    )
}
