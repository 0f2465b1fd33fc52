//! StatefulSet scale-down controller, and its companions for the rest of a claim's life.
//!
//! When a StatefulSet that opted in (annotation `statefulsets.kubernetes.io/scaledown-pod-template`)
//! scales down, the claims of the removed ordinals stay behind. The controller in `scaledown` runs
//! the user's cleanup pod on them and, once it succeeded, deletes the pod and the claims.
//!
//! Two companions look after the rest of a claim's life: `releaser` makes a Released PV of a pool
//! Available again, `podbound` ties a claim to a plain pod's life.
//!
//! Each controller has a folder of its own (`scaledown`, `releaser`, `podbound`) with its watch,
//! observe, decide, act and reconcile, its pass context and its Controller, and the scrape-time
//! gauges of its caches. What they share sits beside them: the shared watches of StatefulSets,
//! claims and pods (`caches`, on the indexed caches of `index`, restored after errors by
//! `resuming`), the pass runner and the reporter of every controller (`pass`, `report`), the
//! wiring (`app`, and nothing else), flags (`cli`) and their checks (`settings`),
//! logs (`telemetry`), signals and the bounded shutdown (`shutdown`), leader election (`leader`) and
//! the write fence on the client (`fence`), fresh reads shared between callers (`coalesce`),
//! HTTP (`http`), metrics (`metrics`, `api_metrics`, `process`), outcomes (`reason`), errors
//! (`error`), compatibility strings (`naming`), JSON patches (`apijson`), pod templates
//! (`template`) and `kubectl scaledown` (`plugin`).

#![warn(missing_docs)]

pub mod api_metrics;
pub mod apijson;
pub mod app;
pub mod caches;
pub mod cli;
pub mod coalesce;
pub mod error;
pub mod fence;
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
pub mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod template;

#[cfg(test)]
mod docs;
#[cfg(test)]
mod layering;
#[cfg(test)]
mod mock_api;
