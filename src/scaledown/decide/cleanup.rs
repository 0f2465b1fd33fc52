//! The life of one cleanup, one ordinal at a time. Every transition is decided here, purely, from
//! facts; `act` makes the writes and `reconcile` only runs the steps in order.
//!
//! ```text
//!  orphaned ordinal, its claims live and the set's, no pod under its name
//!     │ create the cleanup pod, gated (it cannot start)                     create.rs
//!     ▼
//!  created ── the record on the set is refused, or the ordinal is wanted ──► delete it (never ran)
//!     │ the record (a compare-and-swap on the set) names its UID            record.rs
//!     ▼
//!  Gated ── wanted again ──► delete it (never ran)
//!     │ released once kube-controller-manager let go of the condemned pod   run.rs
//!     │ and a live read of the set still shows the ordinal orphaned
//!     ▼
//!  Starting → Running (Pending too long, or restarted in place: reported)   run.rs
//!     │ (gated, or not scheduled yet, with its claims gone: delete it, never ran)
//!     │
//!     ├─ Succeeded: on a live read (set and namespace), delete the recorded  finish.rs
//!     │  claims by UID, then the pod; wanted again: keep the claims, delete the pod
//!     └─ Failed: after a backoff, mark the next attempt and delete the pod
//!        (a new create follows); at --cleanup-attempts, give up and keep it
//! ```
//! A pod under the name that the record does not prove ours is never a cleanup (`pods`).

mod create;
mod finish;
mod record;
mod run;
mod stage;

pub(super) use create::create_cleanup_pods;
pub use record::{Admission, admit, confirm_created, runs, verdicts};
pub use run::may_release;
pub use stage::Stage;
pub(super) use stage::{CleanupStep, clear_marks};
