//! StatefulSet scale-down controller, and its companions for the rest of a claim's life.
//!
//! When a StatefulSet that opted in (annotation `statefulsets.kubernetes.io/scaledown-pod-template`)
//! scales down, the claims of the removed ordinals stay behind. The controller in `scaledown` runs
//! the user's cleanup pod on them and, once it succeeded, deletes the pod and the claims.
//!
//! Each controller has a folder of its own (`scaledown`); what they share sits beside them:
//! wiring and shutdown (`app`), flags (`cli`), leader election (`leader`), HTTP (`http`), metrics
//! (`metrics`, `api_metrics`, `process`), outcomes (`reason`), errors (`error`), indexed caches
//! (`index`), compatibility strings (`naming`) and pod templates (`template`).

pub mod api_metrics;
pub mod apijson;
pub mod app;
pub mod cli;
pub mod error;
pub mod http;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod naming;
pub mod pass;
pub mod plugin;
pub mod podbound;
pub mod process;
pub mod reason;
pub mod releaser;
pub mod report;
pub mod resuming;
pub mod scaledown;
pub mod template;

#[cfg(test)]
mod docs;
#[cfg(test)]
mod mock_api;
