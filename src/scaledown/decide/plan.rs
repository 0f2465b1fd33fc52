//! The typed output of `decide`: the plan of one pass (its steps, the Events it publishes, the live
//! read it needs first, when to look again), the verdict on a cleanup pod just created, and the
//! status the pass writes. Plain data: `decide` and its parts make it, `act` carries it out.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::deletion::Propagation;
use crate::reason::Reason;

/// How long a gated cleanup pod nobody recorded yet holds its ordinal: longer than any live writer
/// takes between its create and its record (a few requests), so a second writer never deletes the
/// first one's pod under it. Older, it is a crashed or failing writer's leftover and is deleted.
pub const RECORD_GRACE: Duration = Duration::from_secs(30);
/// How soon a recorded cleanup pod looks again when the StatefulSet controller has not yet seen
/// the ordinal's old pod go (its status changes wake the set up sooner).
pub const RELEASE_RECHECK: Duration = Duration::from_secs(2);

/// How soon a set whose cleanups wait for room under `--max-concurrent-cleanups` looks again.
pub const CAP_RECHECK: Duration = Duration::from_secs(2);

/// What to write, in order. `act` carries the steps out one by one and stops at the first error.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Look again after this long even if nothing changes (a retry backoff is running).
    pub requeue_after: Option<Duration>,
    /// Decided from the cache, and a step needs a live read: read, decide again, and carry out that
    /// plan instead (this one then has no steps).
    pub confirm: Option<Confirm>,
    /// The status annotations to write (`status::change`, added by the pass to the final plan):
    /// in the finalizer patch or the record patch of this pass if it makes one, else on its own.
    pub status: Option<Change>,
}

/// What the live read before acting must cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Confirm {
    /// The StatefulSet itself (its spec and our record).
    Set,
    /// The set, and the claims and pods of its namespace (before the finalizer is released).
    SetAndNamespace,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Replace the set's finalizer list, guarded by its resourceVersion.
    SetFinalizers {
        finalizers: Vec<String>,
        resource_version: String,
        adding: bool,
    },
    /// Leave our mark on a set being deleted: how it is being deleted, proven now, for the passes
    /// after the finalizer or pods that prove it are gone (UID-guarded).
    MarkDeletion {
        propagation: Propagation,
    },
    /// Delete a stateful pod of a set deleted with background propagation.
    DeleteStatefulPod {
        name: String,
        uid: String,
    },
    /// Create the cleanup pod (gated); `confirm_created` decides afterwards whether it may run.
    CreateCleanupPod {
        ordinal: u32,
        attempt: u32,
        pod: Value,
        /// The claims it mounts (name -> UID), for our record.
        claims: BTreeMap<String, String>,
    },
    /// Remove the confirm gate of a recorded cleanup pod (the process stopped in between).
    Release {
        name: String,
        uid: String,
    },
    DeleteClaim {
        name: String,
        uid: String,
    },
    DeleteCleanupPod {
        name: String,
        uid: String,
        why: PodDeletion,
        /// How long the cleanup took, from the pod's creation (for the duration metric).
        ran_for: Option<Duration>,
    },
    /// Set (or with `None` remove) the next-attempt mark on a claim.
    MarkNextAttempt {
        claim: String,
        uid: String,
        attempt: Option<u32>,
    },
    Event(Event),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDeletion {
    /// The cleanup succeeded and its claims are deleted.
    Completed,
    /// The cleanup succeeded but the ordinal is wanted again: the claims are kept.
    ScaledUp,
    /// The cleanup failed; a new attempt follows.
    Retry,
    /// A gated pod that never ran: not confirmed (ordinal wanted again) or not ours.
    NeverRan,
}

/// An Event on the StatefulSet. `key` identifies the occurrence: the same problem seen on every
/// reconcile is published once, and distinct occurrences (ordinals, messages) are distinct series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub reason: Reason,
    pub note: String,
    pub key: String,
}

/// The verdict on a cleanup pod just created, from a read of the set made after the create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still orphaned: record the pod and let it run.
    Run,
    /// Do not run it; delete it (it never ran). The reason says why.
    Cancel(String),
}

impl Plan {
    pub(super) fn event(&mut self, reason: Reason, key: impl Into<String>, note: String) {
        self.steps.push(Step::Event(Event {
            reason,
            note,
            key: key.into(),
        }));
    }

    pub fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }

    /// Marks the plan as needing a live read of this depth before anything is carried out.
    pub(super) fn confirm(&mut self, depth: Confirm) {
        self.confirm = Some(self.confirm.map_or(depth, |d| d.max(depth)));
    }
}

impl Step {
    /// Steps that destroy data or let a cleanup run: decided on a set being deleted, they need a
    /// live read of its pods (see [`super::propagation`]).
    /// A background mark counts: it lets later passes clean every ordinal.
    pub fn destructive(&self) -> bool {
        matches!(
            self,
            Step::MarkDeletion {
                propagation: Propagation::Background
            } | Step::DeleteStatefulPod { .. }
                | Step::CreateCleanupPod { .. }
                | Step::Release { .. }
                | Step::DeleteClaim { .. }
        )
    }
}

/// The status of one opted-in StatefulSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Nothing of ours to do: no claim of an unwanted ordinal, no cleanup pod.
    Idle,
    /// Claims of unwanted ordinals are being cleaned (or wait for their turn or the old pod).
    CleaningUp,
    /// A cleanup cannot go on without a human (see the reason).
    Stalled,
    /// The set carries `statefulsets.kubernetes.io/scaledown-paused: "true"`.
    Paused,
}

impl Status {
    pub const ALL: [Status; 4] = [
        Status::Idle,
        Status::CleaningUp,
        Status::Stalled,
        Status::Paused,
    ];

    /// The annotation's value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "Idle",
            Status::CleaningUp => "CleaningUp",
            Status::Stalled => "Stalled",
            Status::Paused => "Paused",
        }
    }

    pub fn parse(value: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == value)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status and its reason (`Stalled` and `Paused` only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    pub reason: Option<String>,
}

/// What to write to the status annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Set(Line),
    /// The set opted out: remove both annotations.
    Remove,
}

/// A change of the status annotations, and the Event that goes with it (pause, resume), published
/// once the write went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub write: Write,
    pub event: Option<Event>,
}
