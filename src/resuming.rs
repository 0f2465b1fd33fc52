//! Watches that resume, shared by every controller of the process. After an error a watch waits a
//! short, capped, jittered backoff and carries on from the last resourceVersion it saw (kube-runtime's
//! watcher keeps it), so a broken connection costs one new WATCH request, not a LIST of every
//! object. Only 410 Gone (that version is no longer served) makes the watcher list again, at once.
//! A controller is back within seconds of the API server either way.

use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use crate::error::{code, is_status};

/// First wait after a watch failed; it doubles per failure in a row up to [`WATCH_BACKOFF_MAX`].
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait between two attempts to restore a watch. Short, because a controller that
/// cannot watch cannot act; four watches retrying every 2 s cost a recovering API server little.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The waits between attempts to restore a watch: [`WATCH_BACKOFF_MIN`] doubling to
/// [`WATCH_BACKOFF_MAX`], each shortened by up to a quarter at random so that replicas do not retry
/// in step. Also usable as kube-runtime's `Backoff`.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_BACKOFF_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let full = self.next;
        self.next = (full * 2).min(WATCH_BACKOFF_MAX);
        // A random u64 from std alone: every RandomState is seeded anew.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let quarter = full / 4;
        let cut = quarter.mul_f64((random % 1024) as f64 / 1024.0);
        Some(full - cut)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// Whether a watch error is a 410 Gone: the resource version is too old, only a new list helps.
pub fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == code::GONE,
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => is_status(e, &[code::GONE]),
        watcher::Error::NoResourceVersion => false,
    }
}

/// A watch that resumes after errors. `start` makes a kube watcher (which begins with a full
/// list); it is polled again after an error, so it goes on from its last resourceVersion, or lists
/// again where the error was 410 Gone. The next poll comes at once after 410, else after
/// [`WatchBackoff`] (reset by the first object or list the watch delivers). Errors are logged here
/// (a warning for the first of a series) and never passed on, so kube's Controller never adds its
/// own, much longer, backoff on top. Should a watcher ever end, `start` makes a new one.
pub fn resuming<K, S, F>(
    what: &'static str,
    start: F,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    F: Fn() -> S + Send + 'static,
{
    struct State<S, F> {
        stream: Pin<Box<S>>,
        start: F,
        backoff: WatchBackoff,
        failing: bool,
    }
    let state = State {
        stream: Box::pin(start()),
        start,
        backoff: WatchBackoff::default(),
        failing: false,
    };
    futures::stream::unfold(state, move |mut st| async move {
        loop {
            match st.stream.next().await {
                Some(Ok(event)) => {
                    // `Init` comes before the list is even asked for: it proves nothing.
                    if !matches!(event, watcher::Event::Init) {
                        kube::runtime::utils::Backoff::reset(&mut st.backoff);
                        if std::mem::take(&mut st.failing) {
                            info!(watch = what, "watch restored");
                        }
                    }
                    return Some((Ok(event), st));
                }
                Some(Err(e)) => {
                    let gone = is_gone(&e);
                    if st.failing {
                        debug!(watch = what, error = %e, "watch still failing");
                    } else if gone {
                        warn!(watch = what, error = %e, "watch expired (410 Gone); listing again");
                    } else {
                        warn!(watch = what, error = %e, "watch failed; resuming it from its last resourceVersion");
                    }
                    st.failing = true;
                    if !gone {
                        let wait = st.backoff.next().unwrap_or(WATCH_BACKOFF_MAX);
                        tokio::time::sleep(wait).await;
                    }
                }
                // A kube watcher does not end; should one ever, start a new one.
                None => {
                    debug!(watch = what, "watch ended; starting a new one");
                    st.stream = Box::pin((st.start)());
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn status(code: u16) -> kube::core::Status {
        kube::core::Status {
            code,
            ..Default::default()
        }
    }

    /// What one watcher delivers: a failure, an object, 410 Gone, the relist.
    fn script() -> Vec<watcher::Result<watcher::Event<u32>>> {
        let refused = kube::Error::Api(Box::new(status(503)));
        vec![
            Ok(watcher::Event::Init),
            Err(watcher::Error::WatchFailed(refused)),
            Ok(watcher::Event::Apply(1)),
            Err(watcher::Error::WatchError(Box::new(status(code::GONE)))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(2)),
            Ok(watcher::Event::InitDone),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_is_polled_again_after_a_short_wait_and_at_once_after_410() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = resuming("test", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            futures::stream::iter(script()).chain(futures::stream::pending())
        });
        tokio::pin!(stream);
        let t0 = tokio::time::Instant::now();
        let mut seen = Vec::new();
        while seen.len() < 5 {
            let event = stream.next().await.expect("the stream never ends");
            let event = event.expect("errors are not passed on");
            let kind = match event {
                watcher::Event::Init => "init".to_string(),
                watcher::Event::Apply(n) => format!("apply {n}"),
                watcher::Event::InitApply(n) => format!("init apply {n}"),
                watcher::Event::InitDone => "done".to_string(),
                _ => "other".to_string(),
            };
            seen.push((kind, t0.elapsed()));
        }
        let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["init", "apply 1", "init", "init apply 2", "done"]);
        // After the 503: one wait of 250 ms, cut by up to a quarter; after 410 none.
        let resumed = seen[1].1;
        assert!(
            resumed >= Duration::from_micros(187_500) && resumed <= Duration::from_millis(250),
            "{seen:?}"
        );
        assert_eq!(seen[4].1, resumed, "{seen:?}");
        // The same watcher went on: it was never started again.
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_that_ends_is_started_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = resuming("test", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) as u32;
            futures::stream::iter([Ok(watcher::Event::Apply(n))])
        });
        let first: Vec<u32> = stream
            .take(3)
            .map(|e| match e {
                Ok(watcher::Event::Apply(n)) => n,
                other => panic!("{other:?}"),
            })
            .collect()
            .await;
        assert_eq!(first, [0, 1, 2]);
    }

    #[test]
    fn watch_backoff_doubles_to_its_cap_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::default();
        let waits: Vec<Duration> = backoff.by_ref().take(6).collect();
        let fulls = [250, 500, 1000, 2000, 2000, 2000].map(Duration::from_millis);
        for (wait, full) in waits.iter().zip(fulls) {
            assert!(*wait <= full && *wait >= full * 3 / 4, "{waits:?}");
        }
        backoff.reset();
        assert!(backoff.next().is_some_and(|w| w <= WATCH_BACKOFF_MIN));
    }

    #[test]
    fn gone_is_recognised_in_every_form() {
        let api = |code| kube::Error::Api(Box::new(status(code)));
        assert!(is_gone(&watcher::Error::WatchError(Box::new(status(410)))));
        assert!(is_gone(&watcher::Error::InitialListFailed(api(410))));
        assert!(is_gone(&watcher::Error::WatchStartFailed(api(410))));
        assert!(is_gone(&watcher::Error::WatchFailed(api(410))));
        assert!(!is_gone(&watcher::Error::WatchFailed(api(500))));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }
}
