//! StatefulSet scale-down controller.
//!
//! When a StatefulSet that opted in (annotation `statefulsets.kubernetes.io/scaledown-pod-template`)
//! scales down, the claims of the removed ordinals stay behind. This controller runs the user's
//! cleanup pod on them and, once it succeeded, deletes the pod and the claims.
//!
//! Data flows one way, and so do the modules:
//!
//! ```text
//! apiserver ──watch──▶ caches: StatefulSets · claims (metadata) · pods (metadata) · cleanup pods
//!                         │ a change to any of them → the StatefulSet it concerns    (watch)
//!                         ▼
//! reconcile(set) ─▶ observe(set, caches) → Observed   plain facts, no IO             (observe)
//!                ─▶ decide(&Observed) → Plan          pure, deterministic            (decide)
//!                ─▶ confirm dangerous steps on a live read, decide again             (reconcile)
//!                ─▶ act(Plan)                         the only writes to the API     (act)
//! ```

pub mod act;
pub mod api_metrics;
pub mod app;
pub mod cli;
pub mod decide;
pub mod error;
pub mod http;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod naming;
pub mod observe;
pub mod plugin;
pub mod process;
pub mod reason;
pub mod reconcile;
pub mod template;
pub mod watch;

#[cfg(test)]
mod mock_api;
