//! The slots a runner's passes run in, and the hand-back of a slot while a pass waits for a read
//! shared with other passes.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

tokio::task_local! {
    /// The slot of the pass being polled, when its runner has slots.
    static SLOT: Arc<Slot>;
}

/// One pass's hold on a slot of its runner.
pub(super) struct Slot {
    semaphore: Arc<Semaphore>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Slot {
    /// Waits for a slot of `semaphore` (in turn), for one pass.
    pub(super) async fn take(semaphore: &Arc<Semaphore>) -> Option<Arc<Slot>> {
        // The semaphore is never closed.
        let permit = semaphore.clone().acquire_owned().await.ok()?;
        Some(Arc::new(Slot {
            semaphore: semaphore.clone(),
            permit: Mutex::new(Some(permit)),
        }))
    }

    /// Runs `pass` holding this slot; [`parked`] inside it hands the slot back while it waits.
    pub(super) async fn hold<F: Future>(self: Arc<Self>, pass: F) -> F::Output {
        SLOT.scope(self, pass).await
    }

    fn permit(&self) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
        self.permit.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Awaits `wait` with the running pass's slot handed back meanwhile, and takes a slot again (in
/// turn behind the passes already waiting for one) before returning. For waits that send nothing
/// of their own, such as a read shared with other passes (`scaledown::live::NamespaceLists`): the
/// slots bound the passes doing work, and a pass parked on a shared read does none. Outside a
/// runner with slots, just awaits `wait`.
pub async fn parked<F: Future>(wait: F) -> F::Output {
    let Ok(slot) = SLOT.try_with(Arc::clone) else {
        return wait.await;
    };
    drop(slot.permit().take());
    let out = wait.await;
    // The semaphore is never closed.
    if let Ok(permit) = slot.semaphore.clone().acquire_owned().await {
        *slot.permit() = Some(permit);
    }
    out
}
