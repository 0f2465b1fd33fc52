//! Fresh reads shared between callers: one read serves every caller that asked for it before the
//! read was sent, and never a caller that asked after.
//!
//! A destructive step is decided on a read that must be at least as new as the decision (the
//! safety contract's "fresh read"). Five hundred cleanups finishing together in one namespace each
//! listed its pods and claims: 500 lists of 1,000 pods, each decoded whole, which is where the
//! `sets500` claim-deletion latency and memory went (bench/notes.md). Here a caller joins the read
//! that is queued but not yet sent; if a read is already on its way (it may have been answered
//! from a state older than the caller's decision), the caller waits for the next one, which is
//! sent as soon as the one on its way ends. So at most two reads per key are alive at once, and
//! each answer is newer than every decision it serves.
//!
//! Keys are dropped as soon as no read for them is alive: the memory is bounded by the keys being
//! read right now.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

/// The shared answer of one read.
pub type Answer<T, E> = Result<Arc<T>, Arc<E>>;

type Read<T, E> = Shared<BoxFuture<'static, Answer<T, E>>>;

/// One read: its id, the shared future, and how many callers it serves (final once it is sent).
type Entry<T, E> = (u64, Read<T, E>, Arc<AtomicUsize>);

/// The reads of one key: the one on its way, and the one waiting to be sent after it.
struct Slot<T, E> {
    sent: Option<Entry<T, E>>,
    queued: Option<Entry<T, E>>,
}

type Slots<K, T, E> = Arc<Mutex<HashMap<K, Slot<T, E>>>>;

/// Reads by key, each shared by the callers that asked before it was sent.
pub struct Coalesce<K, T, E> {
    slots: Slots<K, T, E>,
    next_id: AtomicU64,
}

impl<K, T, E> Default for Coalesce<K, T, E> {
    fn default() -> Self {
        Coalesce {
            slots: Arc::default(),
            next_id: AtomicU64::new(0),
        }
    }
}

impl<K, T, E> Coalesce<K, T, E>
where
    K: Clone + Eq + Hash + Send + 'static,
    T: Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// An answer read after this call: the queued read of `key` if there is one, else a new read
    /// made by `read`, sent once the read of `key` already on its way (if any) has ended. The
    /// caller is counted in when this is called, not when the answer is awaited.
    pub fn get<F, Fut>(
        &self,
        key: K,
        read: F,
    ) -> impl Future<Output = Answer<T, E>> + use<K, T, E, F, Fut>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.get_counted(key, move |_| read())
    }

    /// [`Coalesce::get`], with `read` told how many callers the read serves: nobody joins a read
    /// once it is sent, so the count is final when `read` is called.
    pub fn get_counted<F, Fut>(
        &self,
        key: K,
        read: F,
    ) -> impl Future<Output = Answer<T, E>> + use<K, T, E, F, Fut>
    where
        F: FnOnce(usize) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let id = self.id();
        let mut slots = lock(&self.slots);
        let slot = slots.entry(key.clone()).or_insert(Slot {
            sent: None,
            queued: None,
        });
        match (&slot.queued, &slot.sent) {
            (Some((_, queued, callers)), _) => {
                callers.fetch_add(1, Ordering::Relaxed);
                queued.clone()
            }
            (None, before) => {
                let before = before.as_ref().map(|(_, r, _)| r.clone());
                let first = before.is_none();
                let callers = Arc::new(AtomicUsize::new(1));
                let counted = Arc::clone(&callers);
                let read = move || read(counted.load(Ordering::Relaxed));
                let fut = Self::read(Arc::clone(&self.slots), key, id, before, read);
                if first {
                    slot.sent = Some((id, fut.clone(), callers));
                } else {
                    slot.queued = Some((id, fut.clone(), callers));
                }
                fut
            }
        }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The read `id` of `key`: waits for `before`, moves itself from queued to sent, reads, and
    /// leaves the slot.
    fn read<F, Fut>(
        slots: Slots<K, T, E>,
        key: K,
        id: u64,
        before: Option<Read<T, E>>,
        read: F,
    ) -> Read<T, E>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        async move {
            if let Some(before) = before {
                let _ = before.await;
                let mut all = lock(&slots);
                if let Some(slot) = all.get_mut(&key)
                    && slot.queued.as_ref().is_some_and(|(q, _, _)| *q == id)
                {
                    slot.sent = slot.queued.take();
                }
            }
            let answer = read().await.map(Arc::new).map_err(Arc::new);
            let mut all = lock(&slots);
            if let Some(slot) = all.get_mut(&key) {
                if slot.sent.as_ref().is_some_and(|(s, _, _)| *s == id) {
                    slot.sent = None;
                }
                if slot.sent.is_none() && slot.queued.is_none() {
                    all.remove(&key);
                }
            }
            answer
        }
        .boxed()
        .shared()
    }

    /// How many keys have a read alive (for tests and gauges).
    pub fn keys(&self) -> usize {
        lock(&self.slots).len()
    }
}

fn lock<K, T, E>(slots: &Slots<K, T, E>) -> std::sync::MutexGuard<'_, HashMap<K, Slot<T, E>>> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
