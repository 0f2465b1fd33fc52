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

/// What to write, in order. `act` carries the steps out one by one and stops at the first error.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The writes, in order.
    pub steps: Vec<Step>,
    /// Look again after this long even if nothing changes (a retry backoff is running).
    pub requeue_after: Option<Duration>,
    /// A create is held back by `--max-concurrent-cleanups`: look again when a cleanup pod
    /// anywhere frees room (no event of this set says when).
    pub waits_for_room: bool,
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

/// One write of a plan (or an Event to publish).
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add our finalizer (a merge into the list, UID-guarded) or remove it (the whole new list,
    /// guarded by the resourceVersion it was read at).
    SetFinalizers {
        /// The whole new list (what the set carries after the write).
        finalizers: Vec<String>,
        /// The resourceVersion the list was read at.
        resource_version: String,
        /// Our finalizer is added (`false`: removed).
        adding: bool,
    },
    /// Leave our mark on a set being deleted: how it is being deleted, proven now, for the passes
    /// after the finalizer or pods that prove it are gone (UID-guarded).
    MarkDeletion {
        /// How the set is being deleted.
        propagation: Propagation,
    },
    /// Delete a stateful pod of a set deleted with background propagation.
    DeleteStatefulPod {
        /// The pod's name.
        name: String,
        /// The pod's UID (the delete's precondition).
        uid: String,
    },
    /// Create the cleanup pod (gated); `confirm_created` decides afterwards whether it may run.
    CreateCleanupPod {
        /// The ordinal it cleans up.
        ordinal: u32,
        /// Which attempt (1 for the first).
        attempt: u32,
        /// The pod, rendered from the template.
        pod: Value,
        /// The claims it mounts (name -> UID), for our record.
        claims: BTreeMap<String, String>,
    },
    /// Remove the confirm gate of a recorded cleanup pod (the process stopped in between).
    Release {
        /// The pod's name.
        name: String,
        /// The pod's UID.
        uid: String,
    },
    /// Delete an orphaned claim after its cleanup succeeded (UID precondition).
    DeleteClaim {
        /// The claim's name.
        name: String,
        /// The claim's UID (the delete's precondition).
        uid: String,
    },
    /// Delete a cleanup pod (UID precondition).
    DeleteCleanupPod {
        /// The pod's name.
        name: String,
        /// The pod's UID (the delete's precondition).
        uid: String,
        /// Why it goes.
        why: PodDeletion,
        /// How long the cleanup took, from the pod's creation (for the duration metric).
        ran_for: Option<Duration>,
    },
    /// Set (or with `None` remove) the next-attempt mark on a claim.
    MarkNextAttempt {
        /// The claim's name.
        claim: String,
        /// The claim's UID (the patch tests it).
        uid: String,
        /// The attempt to create next.
        attempt: Option<u32>,
    },
    /// Publish an Event on the set.
    Event(Event),
}

/// Why a cleanup pod is deleted.
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
    /// What happened.
    pub reason: Reason,
    /// The Event's note.
    pub note: String,
    /// Tells occurrences apart.
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

    /// Look again after `after` at the latest (the soonest of the requeues asked for wins).
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
    /// Every status, in the order of the gauge's label values.
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

    /// The status an annotation value names, if any.
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
    /// The status.
    pub status: Status,
    /// Why (`Stalled` and `Paused` only).
    pub reason: Option<String>,
}

/// What to write to the status annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Write this status and reason.
    Set(Line),
    /// The set opted out: remove both annotations.
    Remove,
}

/// A change of the status annotations, and the Event that goes with it (pause, resume), published
/// once the write went through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// What to write.
    pub write: Write,
    /// The Event to publish once written.
    pub event: Option<Event>,
}
