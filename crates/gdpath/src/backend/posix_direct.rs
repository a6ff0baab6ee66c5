//! `PosixDirect`: O_DIRECT reads and writes through io_uring, the preferred file ↔ host path.
//!
//! One thread owns the ring. Each descriptor pair is cut into pieces:
//! - the aligned middle, in chunks of `chunk` bytes, through the O_DIRECT descriptor, straight
//!   into registered memory when its address meets the file system's memory alignment, else
//!   through an aligned bounce buffer (at most `bounce_budget` bytes of them);
//! - an unaligned head and tail (each shorter than the page-cache block,
//!   [`FileRegion::cache_block`](crate::region::FileRegion::cache_block), 4 KiB on ext4) through
//!   the file's buffered descriptor, in the same ring. Linux keeps the two coherent per page: an
//!   O_DIRECT read first writes back dirty page-cache pages of its range, and an O_DIRECT write
//!   invalidates them; so no page is ever shared between a buffered piece and an O_DIRECT
//!   piece (see `Worker::cut`). This avoids read-modify-write of partial blocks and writes past
//!   EOF.
//!
//! Up to `queue_depth` requests are in flight. A short read or write is resubmitted for the rest
//! (through the buffered descriptor when the rest is no longer aligned). New work arrives through
//! a channel plus an eventfd read kept armed in the ring, so the thread only ever waits on the
//! ring.

use super::bounce::{BouncePool, Wait};
use super::{Backend, Capability, PlanChoice, Preference, Refusal, SplitItem};
use crate::config::StorageConfig;
use crate::error::Error;
use crate::finding::ids;
use crate::memory::{host_alloc_error, MemoryClass, HOST_ALIGN};
use crate::os::mem::{AlignedBuf, HostMem, RangeError};
use crate::os::uring::{Dir, Done, IoMem, Ring};
use crate::path::DataPath;
use crate::region::{Descriptor, DirectStatus, Region};
use crate::transfer::{Op, WorkItem};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

/// True when `[off, off + len)` holds a whole block of `block` bytes (block-aligned start and
/// end inside the range): the only pairs with a part `submit` moves through O_DIRECT.
fn holds_whole_block(off: u64, len: u64, block: u64) -> bool {
    off.checked_next_multiple_of(block)
        .and_then(|s| s.checked_add(block))
        .is_some_and(|e| e <= off.saturating_add(len))
}

/// Backend name.
pub const NAME: &str = "posix-direct";

/// The O_DIRECT + io_uring storage backend.
pub struct PosixDirect {
    tx: Option<Sender<Vec<WorkItem>>>,
    wake: Option<Arc<EventFd>>,
    thread: Option<JoinHandle<()>>,
    /// Why the ring could not be set up; every pair is then refused.
    unavailable: Option<String>,
}

impl PosixDirect {
    /// Sets up the ring and its thread. When io_uring is not available the backend still exists
    /// and refuses every pair with `storage.io-uring-unavailable`, so the buffered path is used
    /// and says why.
    pub fn new(cfg: &StorageConfig) -> Self {
        match Self::start(cfg) {
            Ok(b) => b,
            Err(e) => PosixDirect {
                tx: None,
                wake: None,
                thread: None,
                unavailable: Some(e),
            },
        }
    }

    fn start(cfg: &StorageConfig) -> Result<Self, String> {
        let entries = (cfg.queue_depth + 1).next_power_of_two();
        let ring = Ring::new(entries).map_err(|e| format!("io_uring_setup: {e}"))?;
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
            .map_err(|e| format!("eventfd: {e}"))?;
        let wake = Arc::new(wake);
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut w = Worker::new(ring, rx, wake.clone(), cfg);
        let thread = std::thread::Builder::new()
            .name("gdpath-uring".into())
            .spawn(move || w.run())
            .map_err(|e| format!("spawning the ring thread: {e}"))?;
        Ok(PosixDirect {
            tx: Some(tx),
            wake: Some(wake),
            thread: Some(thread),
            unavailable: None,
        })
    }

    fn poke(&self) {
        if let Some(w) = &self.wake {
            let _ = w.write(1);
        }
    }
}

impl Drop for PosixDirect {
    fn drop(&mut self) {
        self.tx.take();
        self.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Backend for PosixDirect {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::both(
            MemoryClass::Host,
            MemoryClass::File,
            DataPath::PosixDirect,
            Preference::Preferred,
        )]
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> Result<PlanChoice, Refusal> {
        if let Some(why) = &self.unavailable {
            return Err(Refusal::because(
                ids::STORAGE_IO_URING_UNAVAILABLE,
                why.clone(),
            ));
        }
        let file = super::host_and_file(local, target)?;
        match file.direct_status() {
            // `submit` cuts heads and tails at the page-cache block: a pair holding no whole
            // block has no O_DIRECT part and goes entirely through the page cache. Its plan says
            // so, so strict mode (`accept`) and the report see the path really taken.
            DirectStatus::Enabled => Ok(PlanChoice::on(
                if target.len == 0
                    || holds_whole_block(target.offset, target.len, file.cache_block())
                {
                    DataPath::PosixDirect
                } else {
                    DataPath::PosixBuffered
                },
            )),
            DirectStatus::Refused => Err(Refusal::because(
                ids::STORAGE_ODIRECT_UNSUPPORTED,
                format!(
                    "open({}, O_DIRECT) returned EINVAL: the file system refuses O_DIRECT",
                    file.path().display()
                ),
            )),
            DirectStatus::Disabled => Err(Refusal::because(
                ids::STORAGE_ODIRECT_DISABLED,
                format!("O_DIRECT switched off for {}", file.path().display()),
            )),
        }
    }

    fn submit(&self, items: Vec<WorkItem>) {
        match &self.tx {
            Some(tx) => {
                if let Err(e) = tx.send(items) {
                    for item in e.0 {
                        item.complete(Err(Error::Backend {
                            backend: NAME,
                            detail: "ring thread stopped".into(),
                        }));
                    }
                }
                self.poke();
            }
            None => {
                for item in items {
                    item.complete(Err(Error::Backend {
                        backend: NAME,
                        detail: self.unavailable.clone().unwrap_or_default(),
                    }));
                }
            }
        }
    }
}

/// One I/O request (or the rest of one after a short transfer).
struct Piece {
    split: Arc<SplitItem>,
    op: Op,
    file: Region,
    direct: bool,
    file_off: u64,
    /// The registered host memory and the piece's offset in it.
    mem: HostMem,
    mem_off: usize,
    len: u64,
    /// Bytes of this piece already done by earlier (short) completions.
    done: u64,
}

impl Piece {
    /// Reports this piece to its pair, after letting go of the pair's memory: the pair may
    /// complete now, and its caller may then take the memory back (`Region::into_host_buffer`).
    fn report(self, r: crate::Result<u64>) {
        let Piece {
            split, mem, file, ..
        } = self;
        drop((mem, file));
        split.part_done(r);
    }
}

struct Worker {
    ring: Ring<Piece>,
    rx: Receiver<Vec<WorkItem>>,
    wake: Arc<EventFd>,
    chunk: u64,
    qd: usize,
    bounces: BouncePool<AlignedBuf>,
    /// Bounce buffers in flight (taken out of the pool).
    bounces_out: usize,
    pending: VecDeque<Piece>,
    open: bool,
}

impl Worker {
    fn new(
        ring: Ring<Piece>,
        rx: Receiver<Vec<WorkItem>>,
        wake: Arc<EventFd>,
        cfg: &StorageConfig,
    ) -> Self {
        let chunk = cfg.chunk.next_multiple_of(HOST_ALIGN as u64);
        // Allocated on first use, kept for the ring's life.
        let max_bounce = (cfg.bounce_budget / chunk).max(1) as usize;
        Worker {
            ring,
            rx,
            wake,
            chunk,
            qd: cfg.queue_depth as usize,
            bounces: BouncePool::new(NAME, chunk as usize, max_bounce as u64 * chunk, max_bounce),
            bounces_out: 0,
            pending: VecDeque::new(),
            open: true,
        }
    }

    fn run(&mut self) {
        self.arm_wake();
        loop {
            self.fill();
            if !self.open && self.ring.in_flight() == 0 && self.pending.is_empty() {
                break;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                self.fail_all(format!("io_uring_enter: {e}"));
                return;
            }
            for done in self.ring.reap() {
                match done {
                    Done::Wake => {
                        self.drain_channel();
                        if self.open {
                            self.arm_wake();
                        }
                    }
                    Done::Io { tag, mem, res } => self.complete(tag, mem, res),
                }
            }
        }
    }

    fn arm_wake(&mut self) {
        // The ring has qd + 1 entries rounded up; `fill` leaves one free for this.
        self.ring.arm_wake(self.wake.as_raw_fd());
    }

    fn drain_channel(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(items) => {
                    for item in items {
                        self.cut(item);
                    }
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.open = false;
                    return;
                }
            }
        }
    }

    /// Cuts a pair into head / aligned chunks / tail pieces.
    fn cut(&mut self, item: WorkItem) {
        let (Some(mem), Some(file)) = (
            item.local().region.host_mem().cloned(),
            item.target().region.file(),
        ) else {
            item.complete(Err(Error::Backend {
                backend: NAME,
                detail: "pair is not host memory and a file".into(),
            }));
            return;
        };
        // Cut at the page-cache block (page / file-system block, 4 KiB on ext4), not at the
        // O_DIRECT offset alignment (`stx_dio_offset_align`, 512 B on most disks). Linux keeps
        // O_DIRECT and the page cache coherent only per page: after an O_DIRECT write it
        // invalidates the cached pages of its range, and that fails for a page another
        // transfer's buffered head or tail has just dirtied (dmesg: "Page cache invalidation
        // failure on direct I/O"). The page then keeps the old bytes of the 512 B sectors
        // written directly, and its writeback (a whole 4 KiB block) puts them back on disk:
        // neighbouring transfers lost data (`concurrent_unaligned_slices_sharing_blocks_*`).
        // With cuts at this block every block is reached either only through the page cache
        // or only through O_DIRECT by non-overlapping transfers, so they never collide.
        let a = file.cache_block();
        let mem0 = item.local().offset as usize;
        let (off, len, op) = (item.target().offset, item.target().len, item.op());
        let file_region = item.target().region.clone();
        let end = off + len;
        let head_end = off.next_multiple_of(a).min(end);
        let tail_start = (end / a * a).max(head_end);
        let mut spans: Vec<(u64, u64, bool)> = Vec::new();
        if off < head_end {
            spans.push((off, head_end - off, false));
        }
        let mut p = head_end;
        while p < tail_start {
            let n = (tail_start - p).min(self.chunk);
            spans.push((p, n, true));
            p += n;
        }
        if tail_start < end {
            spans.push((tail_start, end - tail_start, false));
        }
        let split = SplitItem::new(item, spans.len());
        for (o, n, direct) in spans {
            self.pending.push_back(Piece {
                split: split.clone(),
                op,
                file: file_region.clone(),
                direct,
                file_off: o,
                mem: mem.clone(),
                mem_off: mem0 + (o - off) as usize,
                len: n,
                done: 0,
            });
        }
    }

    /// A bounce buffer of `chunk` bytes, or why none: the budget is in flight, or the
    /// allocation failed.
    fn bounce(&mut self) -> crate::Result<AlignedBuf> {
        let mut got = self
            .bounces
            .take(1, self.chunk as usize, Wait::Never, |len| {
                AlignedBuf::try_zeroed(len, HOST_ALIGN).ok_or_else(|| host_alloc_error(len))
            })?;
        self.bounces_out += 1;
        Ok(got.remove(0).into_inner())
    }

    fn give_bounce(&mut self, b: AlignedBuf) {
        self.bounces_out -= 1;
        self.bounces.give(b);
    }

    /// The bounce buffer `b` as the memory of `rest` bytes of `piece` at `at`, holding them
    /// already for a write; on an error `b` goes back to the pool.
    fn staged(
        &mut self,
        piece: &Piece,
        at: usize,
        rest: u64,
        mut b: AlignedBuf,
    ) -> Result<IoMem, RangeError> {
        if piece.op == Op::Write {
            // A bounce buffer holds `chunk` >= rest bytes.
            let copied = match b.as_mut_slice().get_mut(..rest as usize) {
                Some(dst) => piece.mem.copy_out(at, dst),
                None => Err(RangeError {
                    off: 0,
                    len: rest as usize,
                    mem_len: b.len(),
                    read_only: false,
                }),
            };
            if let Err(e) = copied {
                self.give_bounce(b);
                return Err(e);
            }
        }
        IoMem::owned(b, rest).map_err(|(b, e)| {
            self.give_bounce(b);
            e
        })
    }

    /// Submits pending pieces while there is room.
    fn fill(&mut self) {
        while self.ring.in_flight() < self.qd {
            let Some(piece) = self.pending.pop_front() else {
                return;
            };
            if piece.split.failed() {
                piece.report(Ok(0));
                continue;
            }
            if let Some(Some(stop)) = piece.split.with_item(|i| i.stop_reason()) {
                piece.report(Err(stop));
                continue;
            }
            let Some(file) = piece.file.file() else {
                piece.report(Err(Error::Backend {
                    backend: NAME,
                    detail: "target is not a file".into(),
                }));
                continue;
            };
            let rest = piece.len - piece.done;
            let foff = piece.file_off + piece.done;
            let at = piece.mem_off + piece.done as usize;
            let (fd, bounce): (RawFd, Option<AlignedBuf>) = match (piece.direct, file.direct_fd()) {
                (true, Some(dfd)) => {
                    if (piece.mem.as_ptr() as usize + at) as u64 % file.align().memory == 0 {
                        (dfd, None)
                    } else {
                        match self.bounce() {
                            Ok(b) => (dfd, Some(b)),
                            Err(_) if self.bounces_out > 0 => {
                                // All bounce buffers busy: wait for a completion.
                                self.pending.push_front(piece);
                                return;
                            }
                            // None in flight to wait for (the allocation failed).
                            Err(e) => {
                                piece.report(Err(e));
                                continue;
                            }
                        }
                    }
                }
                _ => (file.buffered_fd(), None),
            };
            let dir = match piece.op {
                Op::Read => Dir::Read,
                Op::Write => Dir::Write,
            };
            let io = match bounce {
                Some(b) => self.staged(&piece, at, rest, b),
                None => IoMem::host(dir, piece.mem.clone(), at, rest),
            };
            let io = match io {
                Ok(io) => io,
                Err(e) => {
                    piece.report(Err(super::range_err(NAME, e)));
                    continue;
                }
            };
            piece.split.with_item(|i| i.mark_started());
            self.ring.start(dir, fd, foff, io, piece);
        }
    }

    fn complete(&mut self, mut piece: Piece, io: IoMem, res: i32) {
        // Let go of registered memory now: the report below may complete the pair.
        let bounce = match io {
            IoMem::Owned { buf, .. } => Some(buf),
            IoMem::Host { mem, .. } => {
                drop(mem);
                None
            }
        };
        let rest = piece.len - piece.done;
        if res < 0 {
            if let Some(b) = bounce {
                self.give_bounce(b);
            }
            let errno = -res;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                self.pending.push_front(piece);
                return;
            }
            let Some(file) = piece.file.file() else {
                return;
            };
            let foff = piece.file_off + piece.done;
            let err = if errno == libc::EINVAL && piece.direct {
                Error::Misaligned {
                    path: file.path().to_owned(),
                    offset: foff,
                    len: rest,
                    align: file.align().offset,
                }
            } else {
                let op = if piece.op == Op::Read {
                    "read"
                } else {
                    "write"
                };
                Error::io(
                    op,
                    file.path(),
                    foff,
                    std::io::Error::from_raw_os_error(errno),
                )
            };
            piece.report(Err(err));
            return;
        }
        let n = (res as u64).min(rest);
        if let Some(b) = bounce {
            let copied = match piece.op {
                // The bounce buffer holds n valid bytes.
                Op::Read => piece.mem.copy_in(
                    piece.mem_off + piece.done as usize,
                    &b.as_slice()[..n as usize],
                ),
                Op::Write => Ok(()),
            };
            self.give_bounce(b);
            if let Err(e) = copied {
                piece.report(Err(super::range_err(NAME, e)));
                return;
            }
        }
        piece.done += n;
        if piece.done == piece.len {
            let len = piece.len;
            piece.report(Ok(len));
            return;
        }
        if n == 0 {
            let Some(file) = piece.file.file() else {
                return;
            };
            let foff = piece.file_off + piece.done;
            let err = match piece.op {
                Op::Read => Error::ShortFile {
                    path: file.path().to_owned(),
                    offset: piece.file_off,
                    wanted: piece.len,
                    available: piece.done,
                },
                Op::Write => Error::io(
                    "write",
                    file.path(),
                    foff,
                    std::io::Error::from(std::io::ErrorKind::WriteZero),
                ),
            };
            piece.report(Err(err));
            return;
        }
        // Short transfer: do the rest, through the page cache if no longer aligned.
        if let Some(file) = piece.file.file() {
            if (piece.file_off + piece.done) % file.align().offset != 0
                || (piece.len - piece.done) % file.align().offset != 0
            {
                piece.direct = false;
            }
        }
        self.pending.push_front(piece);
    }

    fn fail_all(&mut self, why: String) {
        for p in self.pending.drain(..) {
            p.report(Err(Error::Backend {
                backend: NAME,
                detail: why.clone(),
            }));
        }
        // In-flight pieces cannot be reaped any more: the ring leaks their memory (registered
        // memory stays alive through its leaked handle) rather than free what the kernel may
        // still write.
        for piece in self.ring.abandon() {
            piece.report(Err(Error::Backend {
                backend: NAME,
                detail: why.clone(),
            }));
        }
        while let Ok(items) = self.rx.try_recv() {
            for i in items {
                i.complete(Err(Error::Backend {
                    backend: NAME,
                    detail: why.clone(),
                }));
            }
        }
    }
}
