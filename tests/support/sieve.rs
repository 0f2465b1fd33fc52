//! A perturbing HTTP proxy between a controller process and the API server, in the spirit of Sieve
//! (Sun et al., "Automatic Reliability Testing for Cluster Management Controllers", OSDI '22): the
//! controller sees the cluster through it, and a test shapes what it sees.
//!
//! The controller talks plain HTTP/1.1 to the proxy on 127.0.0.1 ([`Sieve::kubeconfig`] writes a
//! kubeconfig with `server: http://127.0.0.1:PORT` and no credentials); the proxy forwards every
//! request with a kube [`Client`] of the test (the admin credentials of target/cluster/kubeconfig,
//! TLS), through [`Client::send`]. The HTTP server is axum's (hyper), already a dependency of the
//! controller; nothing is added to the build.
//!
//! Per resource (`pods`, `persistentvolumeclaims`, `statefulsets`, ...; a subresource is written
//! `pods/status`), a test can:
//! - **delay** a watch ([`Sieve::delay_watch`]): every event (one JSON object per line of the watch
//!   stream) is delivered `d` after it arrived from the API server, in order. The controller's view
//!   of that resource lags by `d`; lists, gets and writes are not delayed, as with a slow watch.
//! - **coalesce** a watch ([`Sieve::coalesce_watch`]): events are gathered for a window, and of the
//!   MODIFIED events of one object in a window only the last is delivered (with no ADDED or
//!   DELETED of that object in between). The controller never observes the intermediate states.
//! - **stop after a write** ([`Sieve::stop_after_write`]): once the controller's `n`-th write of a
//!   kind (`create`, `update`, `patch`, `delete`, `deletecollection` of a resource) has been
//!   answered, every later write of the controller is held (never forwarded) until
//!   [`Sieve::resume`]. The returned [`StopHook`] fires at that moment, so the test can SIGKILL the
//!   controller in exactly that intermediate state. While a hook is armed, writes are forwarded one
//!   at a time, so "after the n-th" is exact even when the controller writes concurrently.
//!
//! Writes are counted per (verb, resource) ([`Sieve::writes`], [`Sieve::wait_writes`]) and logged
//! with a delete's UID precondition and the answer's status ([`Sieve::write_log`]). Requests
//! that are not watches pass through unchanged. Every perturbation is announced when set and
//! summed up (`[sieve] pods watch delayed 3s: 42 events in 2 watches`) by [`Sieve::summary`], which
//! is printed when the proxy is dropped.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use futures::StreamExt;
use kube::Client;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

// === parsing (pure; unit-tested below) ===

/// What a request is about, from its method, path and query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection (or the
    /// lowercased method for anything else).
    pub verb: String,
    /// The resource, with its subresource after a slash (`pods`, `pods/status`); empty for paths
    /// that name none (`/version`, `/api`, discovery).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Target {
    pub fn is_watch(&self) -> bool {
        self.verb == "watch"
    }

    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// The query parameter `key` of `query` (no percent-decoding: the values looked at are plain).
fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

/// Parses `method` and a request target (`/api/v1/namespaces/ns/pods?watch=true`).
pub fn parse_target(method: &str, path_and_query: &str) -> Target {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    let (namespace, rest): (Option<String>, &[&str]) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        other => (None, other),
    };
    let (resource, name) = match rest {
        [] => (String::new(), None),
        [r] => (r.to_string(), None),
        [r, n] => (r.to_string(), Some(n.to_string())),
        [r, n, sub, ..] => (format!("{r}/{sub}"), Some(n.to_string())),
    };
    let watch = matches!(query_param(query, "watch"), Some("true" | "1"));
    let verb = match (method, &name) {
        ("GET", _) if watch => "watch".to_string(),
        ("GET", Some(_)) => "get".to_string(),
        ("GET", None) => "list".to_string(),
        ("POST", _) => "create".to_string(),
        ("PUT", _) => "update".to_string(),
        ("PATCH", _) => "patch".to_string(),
        ("DELETE", Some(_)) => "delete".to_string(),
        ("DELETE", None) => "deletecollection".to_string(),
        (m, _) => m.to_ascii_lowercase(),
    };
    Target {
        verb,
        resource,
        namespace,
        name,
    }
}

/// Splits a byte stream into lines (each with its `\n`).
#[derive(Default)]
pub struct LineBuffer {
    partial: Vec<u8>,
}

impl LineBuffer {
    /// The complete lines that `chunk` finishes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Bytes> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..=i]);
            lines.push(Bytes::from(std::mem::take(&mut self.partial)));
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        lines
    }

    /// What is left without a final newline, if anything.
    pub fn finish(self) -> Option<Bytes> {
        (!self.partial.is_empty()).then(|| Bytes::from(self.partial))
    }
}

/// The type (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`) of a watch event line and the
/// `namespace/name` of its object (None for BOOKMARK and ERROR, or a line that is not JSON).
pub fn event_of(line: &[u8]) -> (String, Option<String>) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
        return (String::new(), None);
    };
    let kind = v["type"].as_str().unwrap_or_default().to_string();
    let meta = &v["object"]["metadata"];
    let key = match (kind.as_str(), meta["name"].as_str()) {
        ("BOOKMARK" | "ERROR", _) | (_, None) => None,
        (_, Some(name)) => Some(format!(
            "{}/{name}",
            meta["namespace"].as_str().unwrap_or_default()
        )),
    };
    (kind, key)
}

/// Of `batch` (event lines in arrival order), drops every MODIFIED event of an object that a later
/// MODIFIED of the same object in the batch supersedes, with no other event of that object in
/// between. Returns what is kept, in order, and how many were dropped.
pub fn coalesce<T>(batch: Vec<(T, Bytes)>) -> (Vec<(T, Bytes)>, usize) {
    // From the end: `superseded[key]` says a later MODIFIED of key is kept and nothing else of key
    // came between it and here.
    let mut superseded: HashMap<String, bool> = HashMap::new();
    let mut keep = vec![true; batch.len()];
    for (i, (_, line)) in batch.iter().enumerate().rev() {
        let (kind, key) = event_of(line);
        let Some(key) = key else { continue };
        if kind == "MODIFIED" {
            let later = superseded.insert(key, true).unwrap_or(false);
            keep[i] = !later;
        } else {
            superseded.insert(key, false);
        }
    }
    let dropped = keep.iter().filter(|k| !**k).count();
    let kept = batch
        .into_iter()
        .zip(keep)
        .filter_map(|(item, k)| k.then_some(item))
        .collect();
    (kept, dropped)
}

// === the proxy ===

#[derive(Clone, Copy, Default, Debug)]
struct WatchRule {
    delay: Duration,
    coalesce: Option<Duration>,
}

#[derive(Default, Debug)]
struct WatchStats {
    watches: usize,
    events: usize,
    delayed: usize,
    /// The longest delay applied.
    max_delay: Duration,
    /// MODIFIED events that reached a coalescing stage, and how many of them were dropped.
    modified: usize,
    dropped: usize,
}

struct Hook {
    verb: String,
    resource: String,
    /// Fires on the `n`-th write of its kind, or with `needle` on the first whose body holds it.
    n: usize,
    needle: Option<String>,
    fired: watch::Sender<bool>,
}

impl Hook {
    fn hit(&self, target: &Target, count: usize, body: &[u8]) -> bool {
        let holds = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
        self.verb == target.verb
            && self.resource == target.resource
            && match &self.needle {
                Some(needle) => holds(needle),
                None => self.n == count,
            }
    }
}

#[derive(Default)]
struct Shared {
    rules: HashMap<String, WatchRule>,
    stats: BTreeMap<String, WatchStats>,
    writes: BTreeMap<(String, String), usize>,
    log: Vec<WriteRecord>,
    hooks: Vec<Hook>,
    /// Writes held because a hook fired (`verb resource name`), and the hook that stopped them.
    held: Vec<String>,
    stopped_by: Option<String>,
}

struct Inner {
    upstream: Client,
    shared: Mutex<Shared>,
    /// Changes whenever a write is counted (for [`Sieve::wait_writes`]).
    written: watch::Sender<u64>,
    /// True while writes are held (a hook fired, no [`Sieve::resume`] yet).
    frozen: watch::Sender<bool>,
    /// Serialises writes while a hook is armed.
    write_lock: tokio::sync::Mutex<()>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rule(&self, resource: &str) -> WatchRule {
        self.lock().rules.get(resource).copied().unwrap_or_default()
    }

    fn stat(&self, resource: &str, f: impl FnOnce(&mut WatchStats)) {
        f(self.lock().stats.entry(resource.to_string()).or_default());
    }
}

/// Fires when the write that a [`Sieve::stop_after_write`] waits for has been answered.
pub struct StopHook {
    fired: watch::Receiver<bool>,
    what: String,
}

impl StopHook {
    /// Waits until the hook fired; panics after `timeout`.
    pub async fn fired(&mut self, timeout: Duration) {
        let what = self.what.clone();
        tokio::time::timeout(timeout, self.fired.wait_for(|f| *f))
            .await
            .unwrap_or_else(|_| panic!("sieve: {what} did not happen within {timeout:?}"))
            .expect("sieve: the proxy is gone");
    }

    pub fn has_fired(&self) -> bool {
        *self.fired.borrow()
    }

    /// Waits until the hook fired, with no deadline; false if the proxy is gone first.
    pub async fn wait(&mut self) -> bool {
        self.fired.wait_for(|f| *f).await.is_ok()
    }

    /// `write #n (verb resource)`.
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// One write of the controller that the proxy forwarded and the API server answered.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub at: std::time::Instant,
    pub target: Target,
    /// `preconditions.uid` of a delete's body, if any.
    pub uid: Option<String>,
    pub status: u16,
}

/// The UID precondition of a delete's body (`DeleteOptions`), if it has one.
pub fn precondition_uid(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["preconditions"]["uid"].as_str().map(str::to_string)
}

/// The proxy; it stops serving new connections when dropped, and prints its summary then.
pub struct Sieve {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sieve {
    fn drop(&mut self) {
        self.task.abort();
        for line in self.summary() {
            eprintln!("{line}");
        }
    }
}

impl Sieve {
    /// Starts the proxy on 127.0.0.1 (a free port), forwarding with `upstream`.
    pub async fn start(upstream: Client) -> Sieve {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("sieve: bind");
        let addr = listener.local_addr().expect("sieve: address");
        let inner = Arc::new(Inner {
            upstream,
            shared: Mutex::new(Shared::default()),
            written: watch::channel(0).0,
            frozen: watch::channel(false).0,
            write_lock: tokio::sync::Mutex::new(()),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("[sieve] server stopped: {e}");
            }
        });
        eprintln!("[sieve] listening on http://{addr}");
        Sieve { addr, inner, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for the controller: the proxy as its server, no credentials (the proxy adds
    /// them upstream), written to target/e2e-tokens/<name>.kubeconfig.
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sieve", "cluster": {"server": self.server()}}],
            "users": [{"name": "sieve", "user": {}}],
            "contexts": [{"name": "sieve", "context": {"cluster": "sieve", "user": "sieve"}}],
            "current-context": "sieve",
        });
        let dir = super::repo_dir().join("target/e2e-tokens");
        std::fs::create_dir_all(&dir).expect("token dir");
        let path = dir.join(format!("{name}-sieve.kubeconfig"));
        std::fs::write(&path, config.to_string()).expect("write the sieve kubeconfig");
        path
    }

    /// Delivers every watch event of `resource` `delay` after it arrived (zero: undelayed). Applies
    /// to watches already open as well, from their next event on.
    pub fn delay_watch(&self, resource: &str, delay: Duration) {
        eprintln!("[sieve] rule: {resource} watch delayed {delay:?}");
        self.inner
            .lock()
            .rules
            .entry(resource.to_string())
            .or_default()
            .delay = delay;
    }

    /// Gathers the watch events of `resource` for `window` and delivers, of the MODIFIED events of
    /// one object, only the last ([`coalesce`]); `None` turns it off.
    pub fn coalesce_watch(&self, resource: &str, window: Option<Duration>) {
        eprintln!("[sieve] rule: {resource} watch coalesces MODIFIED events within {window:?}");
        self.inner
            .lock()
            .rules
            .entry(resource.to_string())
            .or_default()
            .coalesce = window;
    }

    /// Removes every watch rule: new events flow at once (events already held keep their delay).
    pub fn clear_rules(&self) {
        eprintln!("[sieve] rule: every watch rule cleared");
        self.inner.lock().rules.clear();
    }

    /// Arms a hook: once the controller's `n`-th `verb` of `resource` (counted from the start of
    /// the proxy) has been answered, every later write is held until [`Sieve::resume`]. Writes are
    /// forwarded one at a time from now until [`Sieve::resume`].
    pub fn stop_after_write(&self, verb: &str, resource: &str, n: usize) -> StopHook {
        let what = format!("write #{n} ({verb} {resource})");
        let done = self.writes(verb, resource);
        assert!(done < n, "sieve: {what} is already past ({done} answered)");
        self.arm(verb, resource, n, None, what)
    }

    /// As [`Sieve::stop_after_write`], on the first `verb` of `resource` whose body holds `needle`.
    pub fn stop_after_write_of(&self, verb: &str, resource: &str, needle: &str) -> StopHook {
        let what = format!("{verb} {resource} with {needle:?}");
        self.arm(verb, resource, 0, Some(needle.to_string()), what)
    }

    fn arm(
        &self,
        verb: &str,
        resource: &str,
        n: usize,
        needle: Option<String>,
        what: String,
    ) -> StopHook {
        eprintln!("[sieve] rule: stop after {what}");
        let (fired, rx) = watch::channel(false);
        self.inner.lock().hooks.push(Hook {
            verb: verb.to_string(),
            resource: resource.to_string(),
            n,
            needle,
            fired,
        });
        StopHook { fired: rx, what }
    }

    /// Forwards writes again (and drops every armed hook).
    pub fn resume(&self) {
        let mut shared = self.inner.lock();
        shared.hooks.clear();
        if let Some(by) = &shared.stopped_by {
            eprintln!(
                "[sieve] writes resumed after {by}; {} were held",
                shared.held.len()
            );
        }
        drop(shared);
        self.inner.frozen.send_replace(false);
    }

    /// Writes answered so far: `verb` of `resource`.
    pub fn writes(&self, verb: &str, resource: &str) -> usize {
        self.inner
            .lock()
            .writes
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The writes held since a hook fired, oldest first: `verb resource name`.
    pub fn held_writes(&self) -> Vec<String> {
        self.inner.lock().held.clone()
    }

    /// Waits until a write held after the first `since` is one of `any` (`verb resource name`),
    /// and returns it; panics after `timeout`.
    pub async fn wait_held(&self, since: usize, any: &[&str], timeout: Duration) -> String {
        let mut changed = self.inner.written.subscribe();
        let found = tokio::time::timeout(timeout, async {
            loop {
                let held = self.held_writes();
                if let Some(hit) = held.iter().skip(since).find(|h| any.contains(&h.as_str())) {
                    return Some(hit.clone());
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        found.ok().flatten().unwrap_or_else(|| {
            panic!(
                "sieve: none of {any:?} held within {timeout:?} (held: {:?})",
                self.held_writes()
            )
        })
    }

    /// Every write answered so far, in the order of the answers.
    pub fn write_log(&self) -> Vec<WriteRecord> {
        self.inner.lock().log.clone()
    }

    /// Every write answered so far, per (verb, resource).
    pub fn write_counts(&self) -> BTreeMap<(String, String), usize> {
        self.inner.lock().writes.clone()
    }

    /// Waits until at least `n` writes `verb` of `resource` have been answered; panics after
    /// `timeout`.
    pub async fn wait_writes(&self, verb: &str, resource: &str, n: usize, timeout: Duration) {
        let mut written = self.inner.written.subscribe();
        let reached = tokio::time::timeout(timeout, async {
            loop {
                if self.writes(verb, resource) >= n {
                    return;
                }
                if written.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        assert!(
            reached.is_ok(),
            "sieve: {n} x {verb} {resource} not answered within {timeout:?} (counts: {:?})",
            self.write_counts()
        );
    }

    /// The perturbations applied so far, one line each.
    pub fn summary(&self) -> Vec<String> {
        let shared = self.inner.lock();
        let mut lines = Vec::new();
        for (resource, s) in &shared.stats {
            if s.delayed > 0 {
                lines.push(format!(
                    "[sieve] {resource} watch delayed (up to) {:?}: {} events in {} watches",
                    s.max_delay, s.delayed, s.watches
                ));
            }
            if s.modified > 0 {
                lines.push(format!(
                    "[sieve] {resource} watch coalesced: dropped {} of {} MODIFIED events ({} events in {} watches)",
                    s.dropped, s.modified, s.events, s.watches
                ));
            }
        }
        if let Some(by) = &shared.stopped_by {
            lines.push(format!(
                "[sieve] writes stopped after {by}: {} held",
                shared.held.len()
            ));
        }
        if lines.is_empty() {
            lines.push("[sieve] no perturbation applied".into());
        }
        lines
    }
}

fn status(code: u16, text: String) -> Response {
    let mut res = Response::new(Body::from(text));
    *res.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_GATEWAY);
    res
}

/// Hop-by-hop and length headers, which the server side sets again.
fn forwardable(name: &http::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host" | "connection" | "transfer-encoding" | "content-length" | "keep-alive" | "upgrade"
    )
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let target = parse_target(parts.method.as_str(), &path);
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return status(400, format!("sieve: cannot read the request body: {e}")),
    };
    let mut upstream = http::Request::builder()
        .method(parts.method.clone())
        .uri(path.as_str());
    for (name, value) in parts.headers.iter().filter(|(n, _)| forwardable(n)) {
        upstream = upstream.header(name, value);
    }
    let upstream = match upstream.body(kube::client::Body::from(body.to_vec())) {
        Ok(r) => r,
        Err(e) => return status(400, format!("sieve: bad request: {e}")),
    };
    if target.is_write() {
        let uid = (target.verb == "delete")
            .then(|| precondition_uid(&body))
            .flatten();
        return write(&inner, &target, &body, uid, upstream).await;
    }
    let res = match inner.upstream.send(upstream).await {
        Ok(r) => r,
        Err(e) => return status(502, format!("sieve: upstream: {e}")),
    };
    if target.is_watch() && res.status().is_success() {
        return shaped_watch(inner, target.resource, res);
    }
    passthrough(res).await
}

/// Copies status, headers and the whole body of an upstream answer.
async fn passthrough(res: http::Response<kube::client::Body>) -> Response {
    let (parts, body) = res.into_parts();
    let bytes = match body.collect_bytes().await {
        Ok(b) => b,
        Err(e) => return status(502, format!("sieve: upstream body: {e}")),
    };
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = parts.status;
    for (name, value) in parts.headers.iter().filter(|(n, _)| forwardable(n)) {
        out.headers_mut().append(name, value.clone());
    }
    out
}

/// Counts `target` among the held writes (and wakes [`Sieve::wait_held`]).
fn hold(inner: &Inner, target: &Target) {
    let what = format!(
        "{} {} {}",
        target.verb,
        target.resource,
        target.name.as_deref().unwrap_or("")
    );
    inner.lock().held.push(what.trim_end().to_string());
    inner.written.send_modify(|n| *n += 1);
}

async fn write(
    inner: &Inner,
    target: &Target,
    body: &[u8],
    uid: Option<String>,
    upstream: http::Request<kube::client::Body>,
) -> Response {
    // Held while a hook fired (until resume); one at a time while a hook is armed.
    let mut frozen = inner.frozen.subscribe();
    if *frozen.borrow() {
        hold(inner, target);
    }
    if frozen.wait_for(|f| !*f).await.is_err() {
        return status(503, "sieve: stopped".into());
    }
    let armed = !inner.lock().hooks.is_empty();
    let _serial = if armed {
        Some(inner.write_lock.lock().await)
    } else {
        None
    };
    if *inner.frozen.borrow() {
        // A hook fired while this write waited for its turn.
        hold(inner, target);
        if frozen.wait_for(|f| !*f).await.is_err() {
            return status(503, "sieve: stopped".into());
        }
    }
    let res = match inner.upstream.send(upstream).await {
        Ok(r) => passthrough(r).await,
        Err(e) => return status(502, format!("sieve: upstream: {e}")),
    };
    let key = (target.verb.clone(), target.resource.clone());
    let mut shared = inner.lock();
    shared.log.push(WriteRecord {
        at: std::time::Instant::now(),
        target: target.clone(),
        uid,
        status: res.status().as_u16(),
    });
    let count = {
        let c = shared.writes.entry(key).or_default();
        *c += 1;
        *c
    };
    let mut fired = None;
    shared.hooks.retain(|h| {
        let hit = h.hit(target, count, body);
        if hit {
            fired = Some(h.fired.clone());
        }
        !hit
    });
    if let Some(hook) = fired {
        let by = format!(
            "write #{count} ({} {} {}, answered {})",
            target.verb,
            target.resource,
            target.name.as_deref().unwrap_or(""),
            res.status()
        );
        eprintln!("[sieve] stop: {by}; later writes are held");
        shared.stopped_by = Some(by);
        inner.frozen.send_replace(true);
        hook.send_replace(true);
    }
    drop(shared);
    inner.written.send_modify(|n| *n += 1);
    res
}

/// A watch answer whose event lines are coalesced and delayed by the rules of `resource`.
fn shaped_watch(
    inner: Arc<Inner>,
    resource: String,
    res: http::Response<kube::client::Body>,
) -> Response {
    let (parts, body) = res.into_parts();
    inner.stat(&resource, |s| s.watches += 1);
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel::<(Instant, Bytes)>();
    // Reads the upstream stream as fast as it comes, stamping each line with its arrival.
    tokio::spawn(async move {
        let mut stream = Body::new(body).into_data_stream();
        let mut lines = LineBuffer::default();
        while let Some(Ok(chunk)) = stream.next().await {
            for line in lines.push(&chunk) {
                if arrived_tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        }
        if let Some(rest) = lines.finish() {
            let _ = arrived_tx.send((Instant::now(), rest));
        }
    });
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    // Applies the rules, then hands the lines to the client's stream.
    tokio::spawn(async move {
        let mut carry: Option<(Instant, Bytes)> = None;
        loop {
            let first = match carry.take() {
                Some(item) => item,
                None => match arrived.recv().await {
                    Some(item) => item,
                    None => return,
                },
            };
            let mut batch = vec![first];
            if let Some(window) = inner.rule(&resource).coalesce {
                let until = batch[0].0 + window;
                loop {
                    tokio::select! {
                        biased;
                        item = arrived.recv() => match item {
                            Some(item) if item.0 <= until => batch.push(item),
                            Some(item) => { carry = Some(item); break; }
                            None => break,
                        },
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
                let modified = batch
                    .iter()
                    .filter(|(_, l)| event_of(l).0 == "MODIFIED")
                    .count();
                let (kept, dropped) = coalesce(batch);
                inner.stat(&resource, |s| {
                    s.modified += modified;
                    s.dropped += dropped;
                });
                batch = kept;
            }
            for (at, line) in batch {
                let delay = inner.rule(&resource).delay;
                inner.stat(&resource, |s| {
                    s.events += 1;
                    if !delay.is_zero() {
                        s.delayed += 1;
                        s.max_delay = s.max_delay.max(delay);
                    }
                });
                tokio::time::sleep_until(at + delay).await;
                if out_tx.send(line).is_err() {
                    return;
                }
            }
        }
    });
    let stream = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx))
    });
    let mut out = Response::new(Body::from_stream(stream));
    *out.status_mut() = parts.status;
    for (name, value) in parts.headers.iter().filter(|(n, _)| forwardable(n)) {
        out.headers_mut().append(name, value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = parse_target(
            "GET",
            "/api/v1/namespaces/ns/pods?labelSelector=a&watch=true&resourceVersion=5",
        );
        assert_eq!(
            t,
            Target {
                verb: "watch".into(),
                resource: "pods".into(),
                namespace: Some("ns".into()),
                name: None
            }
        );
        assert!(parse_target("GET", "/api/v1/pods?watch=1").is_watch());
        assert!(!parse_target("GET", "/api/v1/pods?watch=false").is_watch());
        assert!(!parse_target("GET", "/api/v1/pods?watchy=true").is_watch());
        let t = parse_target("GET", "/apis/apps/v1/statefulsets?watch=true");
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str()),
            ("watch", "statefulsets")
        );
        assert_eq!(t.namespace, None);
        let t = parse_target(
            "PATCH",
            "/apis/apps/v1/namespaces/ns/statefulsets/web/status",
        );
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str(), t.name.as_deref()),
            ("patch", "statefulsets/status", Some("web"))
        );
        assert!(t.is_write());
        let t = parse_target(
            "DELETE",
            "/api/v1/namespaces/ns/persistentvolumeclaims/data-web-2",
        );
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str()),
            ("delete", "persistentvolumeclaims")
        );
        assert_eq!(
            parse_target("DELETE", "/api/v1/namespaces/ns/pods").verb,
            "deletecollection"
        );
        assert_eq!(
            parse_target("POST", "/api/v1/namespaces/ns/pods").verb,
            "create"
        );
        let t = parse_target("GET", "/api/v1/namespaces/ns");
        assert_eq!(
            (t.verb.as_str(), t.resource.as_str(), t.name.as_deref()),
            ("get", "namespaces", Some("ns"))
        );
        assert_eq!(parse_target("GET", "/api/v1/namespaces").verb, "list");
        let t = parse_target("GET", "/version");
        assert_eq!((t.verb.as_str(), t.resource.as_str()), ("list", ""));
        assert!(!t.is_write());
    }

    #[test]
    fn lines() {
        let mut b = LineBuffer::default();
        assert!(b.push(b"{\"a\":").is_empty());
        let l = b.push(b"1}\n{\"b\":2}\n{\"c\"");
        assert_eq!(
            l,
            vec![Bytes::from("{\"a\":1}\n"), Bytes::from("{\"b\":2}\n")]
        );
        assert_eq!(b.finish(), Some(Bytes::from("{\"c\"")));
    }

    fn ev(kind: &str, name: &str, rv: u32) -> (u32, Bytes) {
        let line = json!({"type": kind, "object": {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv.to_string()}}});
        (rv, Bytes::from(format!("{line}\n")))
    }

    #[test]
    fn events_and_coalescing() {
        assert_eq!(
            event_of(&ev("MODIFIED", "a", 1).1),
            ("MODIFIED".into(), Some("ns/a".into()))
        );
        let bookmark = Bytes::from(
            json!({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
                .to_string(),
        );
        assert_eq!(event_of(&bookmark), ("BOOKMARK".into(), None));
        let batch = vec![
            ev("MODIFIED", "a", 1),
            ev("MODIFIED", "b", 2),
            ev("MODIFIED", "a", 3),
            ev("DELETED", "b", 4),
            ev("MODIFIED", "a", 5),
            ev("ADDED", "c", 6),
            ev("MODIFIED", "c", 7),
            ev("MODIFIED", "c", 8),
        ];
        let (kept, dropped) = coalesce(batch);
        let rvs: Vec<u32> = kept.iter().map(|(rv, _)| *rv).collect();
        // a: only the last MODIFIED; b: its MODIFIED before DELETED stays; c: ADDED, last MODIFIED.
        assert_eq!(rvs, vec![2, 4, 5, 6, 8]);
        assert_eq!(dropped, 3);
    }

    #[test]
    fn delete_preconditions() {
        let body = json!({"preconditions": {"uid": "u-1"}, "gracePeriodSeconds": 0});
        assert_eq!(
            precondition_uid(body.to_string().as_bytes()),
            Some("u-1".into())
        );
        assert_eq!(precondition_uid(b"{}"), None);
        assert_eq!(precondition_uid(b""), None);
    }
}
