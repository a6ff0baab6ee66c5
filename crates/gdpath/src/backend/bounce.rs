//! The bounce-buffer pool of every backend that moves data through host memory: the O_DIRECT
//! path (`posix-direct`, aligned pageable buffers), the staging paths of the `cuda` backend and
//! of `file-gpu` (pinned buffers, `cuMemHostAlloc` through the cuda layer), and the network
//! backend's staging of GPU memory (pinned buffers registered with UCX).
//!
//! A pool hands out buffers of at least the asked length (at least its minimum), allocated with
//! the caller's allocator on first need and reused afterwards, so a transfer allocates nothing
//! once the pool is warm. It never holds more than its budget (bytes of buffers out and kept
//! together); when the budget is spent, [`BouncePool::take`] waits for buffers to come back, as
//! long as its [`Wait`] allows, then fails with [`Exhausted`] (`Error::BounceExhausted`). A
//! request that could never fit the budget fails at once. Buffers come back when their
//! [`Pooled`] handle drops; the pool keeps at most `keep` of them and frees the rest, and frees
//! at once a buffer that something (a stream's copy) still uses.

use crate::error::Error;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A buffer a pool can hold.
pub(crate) trait Bounce: Send + 'static {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when nothing (no stream, no DMA) still uses the buffer, so it may be handed out
    /// again.
    fn idle(&mut self) -> bool {
        true
    }
}

impl Bounce for crate::os::mem::AlignedBuf {
    fn len(&self) -> usize {
        crate::os::mem::AlignedBuf::len(self)
    }
}

impl Bounce for gdpath_cuda::PinnedHostBuffer {
    fn len(&self) -> usize {
        gdpath_cuda::PinnedHostBuffer::len(self)
    }
    fn idle(&mut self) -> bool {
        // Writable only when no stream holds it.
        self.as_mut_slice().is_ok()
    }
}

/// How long [`BouncePool::take`] may wait for buffers to come back when the budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not at all: the caller has other work (a ring thread whose completions return buffers).
    Never,
    /// At most this long.
    For(Duration),
}

/// A pool's budget could not serve a request (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    pub pool: &'static str,
    /// Bytes the request needed.
    pub wanted: u64,
    pub budget: u64,
}

impl From<Exhausted> for Error {
    fn from(e: Exhausted) -> Self {
        Error::BounceExhausted {
            pool: e.pool,
            wanted: e.wanted,
            budget: e.budget,
        }
    }
}

struct State<B> {
    free: Vec<B>,
    /// Bytes of buffers allocated and not freed: out, kept, or being allocated.
    allocated: u64,
}

struct Inner<B> {
    name: &'static str,
    min_len: usize,
    budget: u64,
    keep: usize,
    /// A kept buffer more than this many times the size asked is not handed out (0: any size).
    oversize: usize,
    state: Mutex<State<B>>,
    back: Condvar,
}

impl<B> Inner<B> {
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // Only buffers and counters are behind the lock; a panic elsewhere leaves them sound.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Bounce> Inner<B> {
    fn give(&self, mut b: B) {
        let idle = b.idle();
        let mut st = self.lock();
        let freed = if idle && st.free.len() < self.keep {
            st.free.push(b);
            None
        } else {
            st.allocated = st.allocated.saturating_sub(b.len() as u64);
            Some(b)
        };
        drop(st);
        // Freeing pinned memory takes milliseconds: not under the lock.
        drop(freed);
        self.back.notify_all();
    }
}

/// A pool of bounce buffers; clones share it.
pub(crate) struct BouncePool<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for BouncePool<B> {
    fn clone(&self) -> Self {
        BouncePool {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Bounce> BouncePool<B> {
    /// A pool named `name` (in errors) of buffers of at least `min_len` bytes, holding at most
    /// `budget` bytes and keeping at most `keep` buffers for reuse.
    pub(crate) fn new(name: &'static str, min_len: usize, budget: u64, keep: usize) -> Self {
        BouncePool {
            inner: Arc::new(Inner {
                name,
                min_len,
                budget,
                keep,
                oversize: 0,
                state: Mutex::new(State {
                    free: Vec::new(),
                    allocated: 0,
                }),
                back: Condvar::new(),
            }),
        }
    }

    /// The same pool, whose requests never take a kept buffer more than `factor` times the size
    /// asked (a pool of several sizes, where a small request must not tie up a large buffer).
    /// Only before the pool is shared (clones made later share the setting).
    pub(crate) fn oversize(mut self, factor: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.oversize = factor;
        }
        self
    }

    /// `n` buffers of at least `len` bytes (at least the pool's minimum): kept ones first (the
    /// smallest that fit), the rest allocated with `alloc(size)`. All or none: on an error
    /// nothing stays taken.
    ///
    /// Errors: [`Exhausted`] (converted into `E`) when `n` such buffers exceed the budget, or
    /// the budget stayed spent for as long as `wait` allows; `alloc`'s error.
    pub(crate) fn take<E: From<Exhausted>>(
        &self,
        n: usize,
        len: usize,
        wait: Wait,
        mut alloc: impl FnMut(usize) -> Result<B, E>,
    ) -> Result<Vec<Pooled<B>>, E> {
        let p = &*self.inner;
        let size = len.max(p.min_len);
        let exhausted = || Exhausted {
            pool: p.name,
            wanted: (n as u64).saturating_mul(size as u64),
            budget: p.budget,
        };
        if (n as u64).saturating_mul(size as u64) > p.budget {
            return Err(exhausted().into());
        }
        let until = match wait {
            Wait::Never => None,
            Wait::For(d) => Instant::now().checked_add(d),
        };
        // The largest kept buffer this request may take (the pool's oversize limit).
        let cap = match p.oversize {
            0 => usize::MAX,
            f => size.saturating_mul(f),
        };
        let mut st = p.lock();
        // Kept buffers freed to make room, dropped after the lock (freeing pinned memory takes
        // milliseconds).
        let mut evicted = Vec::new();
        let (got, missing) = loop {
            let mut got = Vec::with_capacity(n);
            while got.len() < n {
                // The smallest kept buffer that fits.
                let fit = st
                    .free
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.len() >= len && b.len() <= cap)
                    .min_by_key(|(_, b)| b.len())
                    .map(|(i, _)| i);
                match fit {
                    Some(i) => got.push(st.free.swap_remove(i)),
                    None => break,
                }
            }
            let missing = n - got.len();
            let extra = missing as u64 * size as u64;
            // Kept buffers too small for this request may go to make room.
            let kept: u64 = st.free.iter().map(|b| b.len() as u64).sum();
            if st.allocated - kept + extra <= p.budget {
                while st.allocated + extra > p.budget {
                    match st.free.pop() {
                        Some(b) => {
                            st.allocated -= b.len() as u64;
                            evicted.push(b);
                        }
                        None => break,
                    }
                }
                st.allocated += extra;
                break (got, missing);
            }
            st.free.extend(got);
            let left = until.and_then(|u| u.checked_duration_since(Instant::now()));
            match left {
                Some(d) if !d.is_zero() => {
                    st = p
                        .back
                        .wait_timeout(st, d)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                _ => return Err(exhausted().into()),
            }
        };
        drop(st);
        drop(evicted);
        let mut out: Vec<Pooled<B>> = got.into_iter().map(|b| self.pooled(b)).collect();
        for k in 0..missing {
            match alloc(size) {
                // Counted at `size`; give back the real length when it differs.
                Ok(b) => {
                    if b.len() as u64 != size as u64 {
                        let mut st = p.lock();
                        st.allocated = st.allocated - size as u64 + b.len() as u64;
                    }
                    out.push(self.pooled(b));
                }
                Err(e) => {
                    let mut st = p.lock();
                    st.allocated -= (missing - k) as u64 * size as u64;
                    drop(st);
                    p.back.notify_all();
                    return Err(e); // `out` goes back to the pool
                }
            }
        }
        Ok(out)
    }

    fn pooled(&self, b: B) -> Pooled<B> {
        Pooled {
            buf: Some(b),
            pool: self.inner.clone(),
        }
    }

    /// Takes back a buffer that left the pool with [`Pooled::into_inner`].
    pub(crate) fn give(&self, b: B) {
        self.inner.give(b)
    }

    /// Bytes allocated now (buffers out and kept).
    #[cfg(test)]
    fn allocated(&self) -> u64 {
        self.inner.lock().allocated
    }
}

/// A buffer taken from a [`BouncePool`]; back to the pool when dropped.
pub(crate) struct Pooled<B: Bounce> {
    buf: Option<B>,
    pool: Arc<Inner<B>>,
}

impl<B: Bounce> Pooled<B> {
    /// The buffer itself, still counted against the pool's budget until it is given back with
    /// [`BouncePool::give`] (a buffer never given back stays counted: one leaked with I/O the
    /// kernel never completed).
    pub(crate) fn into_inner(mut self) -> B {
        self.buf.take().expect("present until dropped")
    }
}

impl<B: Bounce> Deref for Pooled<B> {
    type Target = B;
    fn deref(&self) -> &B {
        self.buf.as_ref().expect("present until dropped")
    }
}

impl<B: Bounce> DerefMut for Pooled<B> {
    fn deref_mut(&mut self) -> &mut B {
        self.buf.as_mut().expect("present until dropped")
    }
}

impl<B: Bounce> Drop for Pooled<B> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer that counts its allocations, and can be marked busy (a stream still on it).
    struct Buf {
        len: usize,
        busy: bool,
    }

    impl Bounce for Buf {
        fn len(&self) -> usize {
            self.len
        }
        fn idle(&mut self) -> bool {
            !self.busy
        }
    }

    fn alloc(count: &std::cell::Cell<usize>) -> impl FnMut(usize) -> Result<Buf, Error> + '_ {
        move |len| {
            count.set(count.get() + 1);
            Ok(Buf { len, busy: false })
        }
    }

    #[test]
    fn buffers_are_reused_without_a_new_allocation() {
        let pool = BouncePool::new("test", 4096, 1 << 20, 8);
        let n = std::cell::Cell::new(0);
        let bufs = pool.take(4, 4096, Wait::Never, alloc(&n)).unwrap();
        assert_eq!((n.get(), pool.allocated()), (4, 4 * 4096));
        drop(bufs);
        for _ in 0..100 {
            let b = pool.take(4, 100, Wait::Never, alloc(&n)).unwrap();
            assert!(b.iter().all(|b| b.len() == 4096), "at least the minimum");
        }
        assert_eq!(n.get(), 4, "no allocation once warm");
        assert_eq!(pool.allocated(), 4 * 4096);
    }

    #[test]
    fn the_budget_is_never_exceeded_and_exhaustion_is_typed() {
        let pool = BouncePool::new("test", 4096, 3 * 4096, 8);
        let n = std::cell::Cell::new(0);
        let held = pool.take(2, 4096, Wait::Never, alloc(&n)).unwrap();
        let e: Error = pool.take(2, 4096, Wait::Never, alloc(&n)).err().unwrap();
        match e {
            Error::BounceExhausted {
                pool: "test",
                wanted,
                budget,
            } => assert_eq!((wanted, budget), (2 * 4096, 3 * 4096)),
            other => panic!("{other}"),
        }
        // All or none: the failed request left the one free buffer's worth of budget.
        assert_eq!(pool.allocated(), 2 * 4096);
        assert!(pool.take(1, 4096, Wait::Never, alloc(&n)).is_ok());
        // Never satisfiable: refused at once even when waiting is allowed.
        let t = Instant::now();
        let r = pool.take(4, 4096, Wait::For(Duration::from_secs(5)), alloc(&n));
        assert!(matches!(r, Err(Error::BounceExhausted { .. })));
        assert!(t.elapsed() < Duration::from_secs(1));
        drop(held);
    }

    #[test]
    fn a_waiting_take_gets_the_buffers_given_back_and_gives_up_after_its_wait() {
        let pool = BouncePool::new("test", 4096, 2 * 4096, 8);
        let n = std::cell::Cell::new(0);
        let held = pool.take(2, 4096, Wait::Never, alloc(&n)).unwrap();
        let t = Instant::now();
        let r = pool.take(1, 4096, Wait::For(Duration::from_millis(50)), alloc(&n));
        assert!(matches!(r, Err(Error::BounceExhausted { .. })));
        assert!(t.elapsed() >= Duration::from_millis(50));
        let p2 = pool.clone();
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
            drop(p2);
        });
        let got = pool
            .take(2, 4096, Wait::For(Duration::from_secs(10)), |len| {
                Ok::<_, Error>(Buf { len, busy: false })
            })
            .unwrap();
        giver.join().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            pool.allocated(),
            2 * 4096,
            "the given-back buffers were reused"
        );
    }

    #[test]
    fn busy_and_surplus_buffers_are_freed_not_kept() {
        let pool = BouncePool::new("test", 4096, 1 << 20, 1);
        let n = std::cell::Cell::new(0);
        let mut bufs = pool.take(3, 4096, Wait::Never, alloc(&n)).unwrap();
        bufs[0].busy = true;
        drop(bufs);
        // One kept (the keep limit), the busy one and the surplus freed.
        assert_eq!(pool.allocated(), 4096);
    }

    #[test]
    fn small_kept_buffers_make_room_for_a_larger_request() {
        let pool = BouncePool::new("test", 1024, 8192, 8);
        let n = std::cell::Cell::new(0);
        drop(pool.take(4, 2048, Wait::Never, alloc(&n)).unwrap());
        assert_eq!(pool.allocated(), 8192);
        let big = pool.take(1, 8192, Wait::Never, alloc(&n)).unwrap();
        assert_eq!(big[0].len(), 8192);
        assert_eq!(pool.allocated(), 8192);
    }

    #[test]
    fn a_request_takes_the_smallest_fitting_buffer_and_never_one_twice_its_size() {
        let pool = BouncePool::new("test", 1024, 1 << 20, 8).oversize(2);
        let n = std::cell::Cell::new(0);
        let big = pool.take(1, 64 << 10, Wait::Never, alloc(&n)).unwrap();
        let small = pool.take(1, 1024, Wait::Never, alloc(&n)).unwrap();
        drop((big, small));
        assert_eq!(n.get(), 2);
        // Two small ones: the kept small buffer, then a new one rather than the 64 KiB slab.
        let two = pool.take(2, 1024, Wait::Never, alloc(&n)).unwrap();
        assert!(two.iter().all(|b| b.len() == 1024));
        assert_eq!(n.get(), 3);
        drop(two);
        // The large one is still kept for a large request.
        let again = pool.take(1, 64 << 10, Wait::Never, alloc(&n)).unwrap();
        assert_eq!((again[0].len(), n.get()), (64 << 10, 3));
        drop(again);
        // Without the limit a small request takes the smallest kept buffer that fits.
        let any = BouncePool::new("test", 1024, 1 << 20, 8);
        let held: Vec<_> = [8192usize, 4096, 16384]
            .iter()
            .map(|&len| any.take(1, len, Wait::Never, alloc(&n)).unwrap())
            .collect();
        drop(held);
        let got = any.take(1, 3000, Wait::Never, alloc(&n)).unwrap();
        assert_eq!(
            got[0].len(),
            4096,
            "the smallest of 4, 8 and 16 KiB that fits 3000 bytes"
        );
        let big = any.take(1, 9000, Wait::Never, alloc(&n)).unwrap();
        assert_eq!(big[0].len(), 16384, "any size when the pool sets no limit");
    }

    #[test]
    fn a_failed_allocation_returns_the_budget() {
        let pool = BouncePool::<Buf>::new("test", 4096, 4 * 4096, 8);
        let mut calls = 0;
        let r = pool.take(3, 4096, Wait::Never, |len| {
            calls += 1;
            if calls == 2 {
                Err(Error::Config("refused".into()))
            } else {
                Ok(Buf { len, busy: false })
            }
        });
        assert!(matches!(r, Err(Error::Config(_))));
        // The one allocated before the failure is kept; nothing else counted.
        assert_eq!(pool.allocated(), 4096);
    }

    #[test]
    fn a_buffer_taken_out_stays_counted_until_given_back() {
        let pool = BouncePool::new("test", 4096, 4096, 8);
        let n = std::cell::Cell::new(0);
        let b = pool.take(1, 4096, Wait::Never, alloc(&n)).unwrap();
        let raw = b.into_iter().next().unwrap().into_inner();
        assert!(pool.take(1, 4096, Wait::Never, alloc(&n)).is_err());
        pool.give(raw);
        assert!(pool.take(1, 4096, Wait::Never, alloc(&n)).is_ok());
        assert_eq!(n.get(), 1);
    }
}
