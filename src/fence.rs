//! The write fence: the one place where the controllers' requests leave the process, so no write
//! of any controller is sent while this process may not write ([`Leadership::may_write`]: not the
//! leader, or its renew deadline passed without a renewal).
//!
//! Every client the controllers get is [`client`]: a kube `Client` over the process's client with
//! the [`Fence`] layer in front. Reads (`GET`: get, list, watch) always pass, so standbys keep their
//! caches warm. Writes (`POST`, `PUT`, `PATCH`, `DELETE`) pass only while `may_write()` holds, at
//! the instant the request would be sent; otherwise the request is not sent and the call fails with
//! [`Fenced`] (category `not_leader`). Events are writes like any other: a deposed leader publishes
//! nothing either (its Events would describe work it no longer does).
//!
//! The election's own requests do not go through the fence: [`crate::leader`] gets the process's
//! client itself, so a candidate can take the Lease and a leader past its deadline can still renew
//! or release it.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request};
use kube::Client;
use kube::client::Body;
use tower::{BoxError, Layer, Service};
use tracing::warn;

use crate::error::Fenced;
use crate::leader::Leadership;

/// A client that sends what `inner` sends, except writes while `leadership` may not write.
pub fn client(inner: &Client, leadership: &Arc<Leadership>) -> Client {
    let sender = inner.clone();
    let send = tower::service_fn(move |request: Request<Body>| {
        let sender = sender.clone();
        async move { sender.send(request).await }
    });
    let fence = Fence {
        leadership: leadership.clone(),
    };
    Client::new(fence.layer(send), inner.default_namespace())
}

/// Whether a request with this method changes something on the API server.
pub fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The tower layer that fences writes.
#[derive(Clone)]
pub struct Fence {
    /// Whether this process may write now.
    pub leadership: Arc<Leadership>,
}

impl<S> Layer<S> for Fence {
    type Service = Gated<S>;
    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            leadership: self.leadership.clone(),
        }
    }
}

/// The service of [`Fence`].
#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    leadership: Arc<Leadership>,
}

impl<S, B> Service<Request<B>> for Gated<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if is_write(request.method()) && !self.leadership.may_write() {
            let refused = Fenced {
                method: request.method().to_string(),
                path: request.uri().path().to_string(),
            };
            warn!(method = %refused.method, path = %refused.path, "write not sent: this process may not write now");
            return Box::pin(async move { Err(refused.into()) });
        }
        let sent = self.inner.call(request);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests;
