//! Completion without a blocked waiter: `Transfer::on_complete` hooks (what the Python binding's
//! `await` rests on) and the non-consuming `Transfer::wait_shared` and `wait_shared_for`, on real
//! file transfers.

mod common;

use common::*;
use gdpath::TransferRequest;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A read of `pairs` pieces of `len` bytes of a fresh file into host memory, posted.
fn posted_read(
    agent: &gdpath::Agent,
    dir: &std::path::Path,
    len: usize,
    pairs: usize,
) -> (gdpath::Transfer, gdpath::Region, Vec<u8>) {
    posted_read_until(agent, dir, len, pairs, None)
}

/// [`posted_read`] with a deadline.
fn posted_read_until(
    agent: &gdpath::Agent,
    dir: &std::path::Path,
    len: usize,
    pairs: usize,
    deadline: Option<Instant>,
) -> (gdpath::Transfer, gdpath::Region, Vec<u8>) {
    let data = pattern(len * pairs, len as u64);
    let file = readable_file(agent, dir, "src", &data);
    let dst = host_zeroed(agent, len * pairs);
    let l = len as u64;
    let mut req = TransferRequest::read(
        (0..pairs as u64).map(|i| dst.desc(i * l, l)).collect(),
        (0..pairs as u64).map(|i| file.desc(i * l, l)).collect(),
    );
    if let Some(at) = deadline {
        req = req.deadline(at);
    }
    (agent.post(req).unwrap(), dst, data)
}

#[test]
fn a_hook_runs_once_when_the_last_pair_completes_and_the_result_is_final() {
    let dir = disk_dir();
    let agent = agent();
    let (t, dst, data) = posted_read(&agent, dir.path(), 4 << 20, 8);
    assert!(
        !t.needs_progress(),
        "storage backends complete on their own threads"
    );
    let t = std::sync::Arc::new(t);
    let (tx, rx) = mpsc::channel();
    for k in 0..3 {
        let (tx, t2) = (tx.clone(), t.clone());
        t.on_complete(move || {
            // The result is final: a wait of zero returns it instead of timing out.
            let r = t2.wait_shared(Some(Duration::ZERO)).map(|r| r.bytes);
            tx.send((k, r.map_err(|e| e.to_string()))).unwrap();
        });
    }
    let mut got: Vec<_> = (0..3)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).expect("hook ran"))
        .collect();
    got.sort();
    for (k, (i, r)) in got.into_iter().enumerate() {
        assert_eq!((i, r), (k, Ok(32 << 20)));
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "ran twice"
    );
    // Added after the end: runs at once, on this thread.
    let here = std::thread::current().id();
    let (tx2, rx2) = mpsc::channel();
    t.on_complete(move || tx2.send(std::thread::current().id()).unwrap());
    assert_eq!(rx2.try_recv().unwrap(), here);
    // `wait_shared` again: the same report; then the consuming `wait` still has it.
    let a = t.wait_shared(None).unwrap();
    let b = t.wait_shared(Some(Duration::from_secs(1))).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.pairs.len(), 8);
    let t = std::sync::Arc::into_inner(t).expect("last handle");
    assert_eq!(t.wait().unwrap(), a);
    assert_eq!(bytes_of(&dst), data);
}

#[test]
fn a_cancelled_transfer_runs_its_hooks_once_its_pairs_have_drained() {
    let dir = disk_dir();
    let agent = agent();
    let (t, _dst, _) = posted_read(&agent, dir.path(), 1 << 20, 64);
    let t = std::sync::Arc::new(t);
    let (tx, rx) = mpsc::channel();
    t.on_complete(move || tx.send(()).unwrap());
    // Another thread waits while this one cancels: the waiter returns with `Cancelled` at once.
    let t2 = t.clone();
    let waiter = std::thread::spawn(move || {
        t2.wait_shared(None)
            .map(|r| r.pairs.len())
            .map_err(|e| e.error.kind())
    });
    t.cancel();
    let r = waiter.join().unwrap();
    // Every pair may have completed before the cancel was seen.
    assert!(matches!(r, Ok(64) | Err("cancelled")), "{r:?}");
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the hook ran once the pairs ended");
}

#[test]
fn a_transfer_of_no_pairs_is_complete_at_once() {
    let agent = agent();
    let t = agent.post(TransferRequest::read(vec![], vec![])).unwrap();
    let (tx, rx) = mpsc::channel();
    t.on_complete(move || tx.send(()).unwrap());
    rx.try_recv().expect("ran at once");
    assert_eq!(t.wait_shared(Some(Duration::ZERO)).unwrap().bytes, 0);
}

#[test]
fn a_transfer_ended_by_its_deadline_says_so_to_every_later_wait() {
    let dir = disk_dir();
    let agent = agent();
    let pairs = 64;
    let (t, _, _) = posted_read_until(&agent, dir.path(), 1 << 20, pairs, Some(Instant::now()));
    // The first wait ends it past its deadline (cancelling what has not started); every later
    // wait, and the consuming one, says the same rather than `cancelled`.
    for _ in 0..3 {
        let e = t.wait_shared(None).unwrap_err();
        assert_eq!(e.error.kind(), "deadline_exceeded", "{e}");
        assert_eq!(e.outcomes.len(), pairs);
    }
    assert_eq!(t.wait().unwrap_err().error.kind(), "deadline_exceeded");
}

#[test]
fn a_pause_returns_without_ending_the_transfer_and_a_deadline_still_ends_it() {
    let dir = disk_dir();
    let agent = agent();
    // 256 MiB cannot be read in the first millisecond (it would take 256 GB/s).
    let (t, dst, data) = posted_read(&agent, dir.path(), 4 << 20, 64);
    assert!(t
        .wait_shared_for(Duration::from_millis(1))
        .unwrap()
        .is_none());
    let start = Instant::now();
    let report = loop {
        if let Some(r) = t.wait_shared_for(Duration::from_millis(10)).unwrap() {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never ended");
    };
    assert_eq!(report.bytes, 256 << 20);
    assert_eq!(t.wait().unwrap(), report);
    assert_eq!(bytes_of(&dst), data);

    // A request past its deadline ends at the first slice, not after the pause.
    let dir = disk_dir();
    let (t, _, _) = posted_read_until(&agent, dir.path(), 1 << 20, 8, Some(Instant::now()));
    let start = Instant::now();
    let e = t.wait_shared_for(Duration::from_secs(10)).unwrap_err();
    assert_eq!(e.error.kind(), "deadline_exceeded", "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}
