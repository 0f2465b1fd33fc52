use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

use super::*;

type Reads = Coalesce<&'static str, usize, String>;

/// A read that counts itself and answers with its number once `gate` opens.
fn gated(
    count: &Arc<AtomicUsize>,
    gate: oneshot::Receiver<()>,
) -> impl FnOnce() -> BoxFuture<'static, Result<usize, String>> + Send + use<> {
    let count = Arc::clone(count);
    move || {
        async move {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = gate.await;
            Ok(n)
        }
        .boxed()
    }
}

fn open(
    count: &Arc<AtomicUsize>,
) -> impl FnOnce() -> BoxFuture<'static, Result<usize, String>> + Send + use<> {
    let count = Arc::clone(count);
    move || async move { Ok(count.fetch_add(1, Ordering::SeqCst) + 1) }.boxed()
}

#[tokio::test]
async fn callers_during_a_read_share_the_next_one_and_never_the_one_on_its_way() {
    let reads = Reads::default();
    let count = Arc::new(AtomicUsize::new(0));
    let (release_first, gate) = oneshot::channel();
    let first = tokio::spawn(reads.get("ns", gated(&count, gate)));
    while count.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // The first read is on its way: ten callers ask now.
    let later: Vec<_> = (0..10)
        .map(|_| tokio::spawn(reads.get("ns", open(&count))))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "nothing is sent before the first read ends"
    );
    release_first.send(()).expect("the first read waits");
    assert_eq!(*first.await.expect("joined").expect("answered"), 1);
    for caller in later {
        assert_eq!(
            *caller.await.expect("joined").expect("answered"),
            2,
            "every later caller gets read 2"
        );
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "ten callers, one read");
    assert_eq!(reads.keys(), 0, "no key is kept once its reads ended");
}

#[tokio::test]
async fn a_caller_after_a_read_ended_gets_a_read_of_its_own() {
    let reads = Reads::default();
    let count = Arc::new(AtomicUsize::new(0));
    assert_eq!(*reads.get("ns", open(&count)).await.expect("answered"), 1);
    assert_eq!(*reads.get("ns", open(&count)).await.expect("answered"), 2);
    assert_eq!(reads.keys(), 0);
}

#[tokio::test]
async fn keys_are_read_apart() {
    let reads = Reads::default();
    let count = Arc::new(AtomicUsize::new(0));
    let (release, gate) = oneshot::channel::<()>();
    let held = tokio::spawn(reads.get("a", gated(&count, gate)));
    while count.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // "b" is read at once although "a" is still on its way.
    assert_eq!(*reads.get("b", open(&count)).await.expect("answered"), 2);
    release.send(()).expect("the read waits");
    assert_eq!(*held.await.expect("joined").expect("answered"), 1);
}

#[tokio::test]
async fn an_error_is_the_answer_of_every_caller_of_that_read_only() {
    let reads = Reads::default();
    let failed = reads
        .get("ns", || async { Err::<usize, _>("refused".to_string()) })
        .await;
    assert_eq!(failed.expect_err("refused").as_str(), "refused");
    let count = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        *reads.get("ns", open(&count)).await.expect("answered"),
        1,
        "the next caller reads again"
    );
}

#[tokio::test]
async fn a_read_whose_callers_all_left_is_finished_by_the_next_caller() {
    let reads = Reads::default();
    let count = Arc::new(AtomicUsize::new(0));
    let (release, gate) = oneshot::channel();
    let abandoned = tokio::spawn(reads.get("ns", gated(&count, gate)));
    while count.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    abandoned.abort();
    let _ = abandoned.await;
    release.send(()).expect("the read waits");
    // The next caller drives the abandoned read to its end, then gets a read of its own.
    assert_eq!(*reads.get("ns", open(&count)).await.expect("answered"), 2);
    assert_eq!(reads.keys(), 0);
}

#[tokio::test]
async fn a_read_is_told_how_many_callers_share_it() {
    let reads = Reads::default();
    let count = Arc::new(AtomicUsize::new(0));
    let (release_first, gate) = oneshot::channel();
    let first = tokio::spawn(reads.get("ns", gated(&count, gate)));
    while count.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // Seven callers ask while the first read is on its way: the next read serves all seven.
    let later: Vec<_> = (0..7)
        .map(|_| {
            tokio::spawn(reads.get_counted("ns", |callers| async move { Ok::<_, String>(callers) }))
        })
        .collect();
    release_first.send(()).expect("the first read waits");
    first.await.expect("joined").expect("answered");
    for caller in later {
        assert_eq!(*caller.await.expect("joined").expect("answered"), 7);
    }
    // Alone, a caller's read serves one.
    let alone = reads.get_counted("ns", |callers| async move { Ok::<_, String>(callers) });
    assert_eq!(*alone.await.expect("answered"), 1);
}
