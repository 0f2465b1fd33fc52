//! The StatefulSets whose cleanup pods wait for room under `--max-concurrent-cleanups`. Room frees
//! up when a cleanup pod of any set ends, which no event of the waiting set announces; instead of
//! looking again on a timer, a waiting set is queued here and woken by the cleanup pod watch when
//! there is room (first come, first woken; one entry per set).

use std::collections::{HashSet, VecDeque};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::reflector::ObjectRef;

/// Sets waiting for room, in the order they started waiting.
#[derive(Debug, Default)]
pub struct Waiting {
    queue: VecDeque<ObjectRef<StatefulSet>>,
    queued: HashSet<ObjectRef<StatefulSet>>,
}

impl Waiting {
    /// Queues `set` (once, however often it is added).
    pub fn add(&mut self, set: ObjectRef<StatefulSet>) {
        if self.queued.insert(set.clone()) {
            self.queue.push_back(set);
        }
    }

    /// Takes the `room` sets that have waited longest.
    pub fn take(&mut self, room: usize) -> Vec<ObjectRef<StatefulSet>> {
        let n = room.min(self.queue.len());
        let woken: Vec<_> = self.queue.drain(..n).collect();
        for set in &woken {
            self.queued.remove(set);
        }
        woken
    }

    /// How many sets wait for room.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no set waits for room.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str) -> ObjectRef<StatefulSet> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn woken_in_order_once_each() {
        let mut w = Waiting::default();
        for name in ["a", "b", "a", "c"] {
            w.add(set(name));
        }
        assert_eq!(w.len(), 3, "one entry per set");
        assert_eq!(w.take(0), Vec::new());
        assert_eq!(w.take(2), vec![set("a"), set("b")]);
        w.add(set("a"));
        assert_eq!(w.take(5), vec![set("c"), set("a")]);
        assert!(w.is_empty());
    }
}
