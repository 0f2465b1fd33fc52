//! The scale-down controller: when an opted-in StatefulSet scales down, run its cleanup pod on the
//! orphaned claims and delete them once it succeeded. One pass over one set, in one direction:
//!
//! ```text
//! watch (caches, indexed per set) → observe (facts) → decide (pure plan) → confirm (live read)
//!   → act (the only writes) → settle (new cleanup pods: record and release, or delete)
//! ```

pub mod act;
pub mod decide;
pub mod observe;
pub mod reconcile;
pub mod watch;
