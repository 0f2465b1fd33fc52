//! The passes running now: how many, and since when each.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

/// Counts one running pass for as long as it lives (also when it is dropped half-way).
/// The passes running now: how many (shutdown waits for none), and since when each (by start
/// order, so the first is the oldest: the liveness probe looks at it).
#[derive(Default)]
pub(super) struct Passes {
    pub(super) count: watch::Sender<usize>,
    started: Mutex<(u64, BTreeMap<u64, Instant>)>,
}

impl Passes {
    pub(super) fn started(&self) -> std::sync::MutexGuard<'_, (u64, BTreeMap<u64, Instant>)> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One running pass, counted in [`Passes`] until it is dropped.
pub(super) struct Running<'a>(&'a Passes, u64);

impl<'a> Running<'a> {
    pub(super) fn new(passes: &'a Passes) -> Self {
        let id = {
            let mut started = passes.started();
            started.0 += 1;
            let id = started.0;
            started.1.insert(id, Instant::now());
            id
        };
        passes.count.send_modify(|n| *n += 1);
        Running(passes, id)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.started().1.remove(&self.1);
        self.0.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}
