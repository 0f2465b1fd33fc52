//! One watch, many readers: a feed applies each event to its cache, then hands the object to
//! every subscriber of its [`Topic`] (a bounded channel each, so a slow reader slows the feed
//! instead of piling up changes; kube's Controller keeps reading its triggers while it is busy).

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

/// Changes a subscriber waits for at most before the feed waits for it.
const BUFFER: usize = 1024;

/// Which changes a subscriber gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wants {
    Applied,
    Touched,
    Deleted,
}

/// One subscriber: what it wants, and where it gets it.
type Subscriber<K> = (Wants, mpsc::Sender<Arc<K>>);

/// The subscribers to the changes of one kind.
pub struct Topic<K> {
    subscribers: Arc<Mutex<Vec<Subscriber<K>>>>,
}

impl<K> Clone for Topic<K> {
    fn clone(&self) -> Self {
        Topic {
            subscribers: self.subscribers.clone(),
        }
    }
}

impl<K> Default for Topic<K> {
    fn default() -> Self {
        Topic {
            subscribers: Arc::default(),
        }
    }
}

impl<K: Send + Sync + 'static> Topic<K> {
    /// Objects as they are added or changed, and with `deletes` as they are deleted.
    pub fn subscribe(&self, deletes: bool) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.add(if deletes {
            Wants::Touched
        } else {
            Wants::Applied
        })
    }

    /// Objects as they are deleted.
    pub fn subscribe_deletes(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.add(Wants::Deleted)
    }

    fn add(&self, wants: Wants) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let (tx, rx) = mpsc::channel(BUFFER);
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        subscribers.push((wants, tx));
        futures::stream::unfold(rx, |mut rx| async move {
            let next = rx.recv().await?;
            Some((next, rx))
        })
    }

    /// Hands `obj` to every subscriber that wants it; one that is gone is skipped.
    async fn publish(&self, obj: K, deleted: bool) {
        let to: Vec<mpsc::Sender<Arc<K>>> = {
            let subscribers = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
            subscribers
                .iter()
                .filter(|(wants, _)| match wants {
                    Wants::Touched => true,
                    Wants::Applied => !deleted,
                    Wants::Deleted => deleted,
                })
                .map(|(_, tx)| tx.clone())
                .collect()
        };
        if to.is_empty() {
            return;
        }
        let obj = Arc::new(obj);
        for tx in to {
            let _ = tx.send(obj.clone()).await;
        }
    }
}

/// Drives one watch: each event is applied (to the caches) and then published to `topic`. The
/// watches never end and never yield errors (`crate::resuming`).
pub async fn feed<K: Send + Sync + 'static>(
    events: impl Stream<Item = watcher::Result<Event<K>>>,
    mut apply: impl FnMut(&Event<K>),
    topic: Topic<K>,
) {
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let Ok(event) = event else { continue };
        apply(&event);
        match event {
            Event::Apply(obj) | Event::InitApply(obj) => topic.publish(obj, false).await,
            Event::Delete(obj) => topic.publish(obj, true).await,
            Event::Init | Event::InitDone => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each subscriber gets the changes it asked for, in order, and one event reaches all of them.
    #[tokio::test]
    async fn every_subscriber_gets_what_it_asked_for() {
        let topic: Topic<&'static str> = Topic::default();
        let applied = topic.subscribe(false);
        let touched = topic.subscribe(true);
        let deleted = topic.subscribe_deletes();
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Ok(Event::InitDone),
            Ok(Event::Apply("b")),
            Ok(Event::Delete("a")),
        ]);
        let mut seen = Vec::new();
        feed(events, |e| seen.push(format!("{e:?}")), topic).await;
        assert_eq!(seen.len(), 5, "every event applied: {seen:?}");
        let got = |s: std::pin::Pin<Box<dyn Stream<Item = Arc<&'static str>> + Send>>| async {
            s.map(|o| *o).collect::<Vec<_>>().await
        };
        assert_eq!(got(Box::pin(applied)).await, ["a", "b"]);
        assert_eq!(got(Box::pin(touched)).await, ["a", "b", "a"]);
        assert_eq!(got(Box::pin(deleted)).await, ["a"]);
    }
}
