//! Watches that restore themselves, shared by every controller of the process: after an error a
//! watch waits a short, capped backoff (none after 410 Gone) and starts over with a full list, so a
//! controller is back within seconds of the API server.

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

/// A watch that restores itself. `start` makes a fresh kube watcher (which begins with a full
/// list). After an error the watch is started anew: at once after 410 Gone, else after
/// [`WatchBackoff`] (reset by the first object or list the new watch delivers). Errors are logged
/// here (a warning for the first of a series) and never passed on, so kube's Controller never adds
/// its own, much longer, backoff on top.
pub fn restarting<K, S, F>(
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
                    } else {
                        warn!(watch = what, error = %e, "watch failed; restarting it with a new list");
                    }
                    st.failing = true;
                    if !gone {
                        let wait = st.backoff.next().unwrap_or(WATCH_BACKOFF_MAX);
                        tokio::time::sleep(wait).await;
                    }
                }
                // A kube watcher does not end; should one ever, start a new one.
                None => debug!(watch = what, "watch ended; starting a new one"),
            }
            st.stream = Box::pin((st.start)());
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn script(start: usize) -> Vec<watcher::Result<watcher::Event<u32>>> {
        let gone = kube::core::Status {
            code: code::GONE,
            ..Default::default()
        };
        match start {
            0 => vec![Err(watcher::Error::WatchError(Box::new(gone)))],
            1 => vec![
                Ok(watcher::Event::Init),
                Err(watcher::Error::NoResourceVersion),
            ],
            2 => vec![Err(watcher::Error::NoResourceVersion)],
            _ => vec![
                Ok(watcher::Event::Init),
                Ok(watcher::Event::InitApply(7)),
                Ok(watcher::Event::InitDone),
            ],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_starts_again_at_once_after_410_else_after_a_short_wait() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = restarting("test", move || {
            let start = counted.fetch_add(1, Ordering::SeqCst);
            futures::stream::iter(script(start)).chain(futures::stream::pending())
        });
        tokio::pin!(stream);
        let t0 = tokio::time::Instant::now();
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let event = stream.next().await.expect("the stream never ends");
            let event = event.expect("errors are not passed on");
            let kind = match event {
                watcher::Event::Init => "init".to_string(),
                watcher::Event::InitApply(n) => format!("apply {n}"),
                watcher::Event::InitDone => "done".to_string(),
                _ => "other".to_string(),
            };
            seen.push((kind, t0.elapsed()));
        }
        // 410: started again at once; then two waits, 250 ms and 500 ms, each cut by up to a quarter.
        assert_eq!(seen[0], ("init".to_string(), Duration::ZERO), "{seen:?}");
        let relisted = seen[2].1;
        assert_eq!(seen[2].0, "apply 7");
        assert!(
            relisted >= Duration::from_micros(562_500) && relisted <= Duration::from_millis(750),
            "{seen:?}"
        );
        assert_eq!(starts.load(Ordering::SeqCst), 4);
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
        let status = |code| kube::core::Status {
            code,
            ..Default::default()
        };
        let api = |code| kube::Error::Api(Box::new(status(code)));
        assert!(is_gone(&watcher::Error::WatchError(Box::new(status(410)))));
        assert!(is_gone(&watcher::Error::InitialListFailed(api(410))));
        assert!(is_gone(&watcher::Error::WatchStartFailed(api(410))));
        assert!(is_gone(&watcher::Error::WatchFailed(api(410))));
        assert!(!is_gone(&watcher::Error::WatchFailed(api(500))));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }
}
