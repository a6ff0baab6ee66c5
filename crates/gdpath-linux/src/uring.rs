//! An io_uring whose reads and writes own the memory they point to until the kernel completes
//! them: [`Ring::start`] takes an [`IoMem`] (registered host memory, which it
//! keeps alive, or an owned bounce buffer) and [`Ring::reap`] hands it back with the result. So
//! the one `unsafe` of io_uring — the kernel writes into a submission's buffer at any time until
//! its completion is reaped — is upheld by ownership, not by the caller.

use super::mem::{AlignedBuf, HostMem, RangeError};
use io_uring::{opcode, squeue, types, IoUring};
use std::os::fd::RawFd;

/// `user_data` of the eventfd read ([`Ring::arm_wake`]).
const WAKE: u64 = u64::MAX;

/// The memory of one read or write.
#[derive(Debug)]
pub enum IoMem {
    /// `len` bytes at `off` of registered host memory.
    Host {
        /// The registered memory, kept alive until the completion is reaped.
        mem: HostMem,
        /// Offset of the I/O's first byte in `mem` (bytes).
        off: usize,
        /// Bytes to read or write.
        len: u32,
    },
    /// The first `len` bytes of an owned buffer (a bounce buffer).
    Owned {
        /// The buffer, owned by the request until its completion is reaped.
        buf: AlignedBuf,
        /// Bytes to read or write from the buffer's start.
        len: u32,
    },
}

impl IoMem {
    /// `len` bytes at `off` of `mem`, for a request of direction `dir`. Errors: the range is
    /// outside `mem` or longer than one request can be (4 GiB − 1); a read (the kernel writes
    /// the memory) into read-only memory.
    pub fn host(dir: Dir, mem: HostMem, off: usize, len: u64) -> Result<IoMem, RangeError> {
        let bad = RangeError {
            off,
            len: len as usize,
            mem_len: mem.len(),
            read_only: dir == Dir::Read && !mem.writable(),
        };
        if bad.read_only {
            return Err(bad);
        }
        let len32 = u32::try_from(len).map_err(|_| bad)?;
        match off.checked_add(len as usize) {
            Some(end) if end <= mem.len() => Ok(IoMem::Host {
                mem,
                off,
                len: len32,
            }),
            _ => Err(bad),
        }
    }

    /// The first `len` bytes of `buf`. Errors: `len` is longer than `buf` (or than 4 GiB − 1);
    /// the buffer is handed back with the error.
    pub fn owned(buf: AlignedBuf, len: u64) -> Result<IoMem, (AlignedBuf, RangeError)> {
        match u32::try_from(len) {
            Ok(l) if len as usize <= buf.len() => Ok(IoMem::Owned { buf, len: l }),
            _ => {
                let e = RangeError {
                    off: 0,
                    len: len as usize,
                    mem_len: buf.len(),
                    read_only: false,
                };
                Err((buf, e))
            }
        }
    }

    /// Start and length of the memory.
    fn raw(&self) -> (*mut u8, u32) {
        match self {
            IoMem::Host { mem, off, len } => {
                // Inside the memory: checked by `IoMem::host`.
                (mem.as_ptr().wrapping_add(*off), *len)
            }
            IoMem::Owned { buf, len } => (buf.as_ptr(), *len),
        }
    }
}

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// File → memory.
    Read,
    /// Memory → file.
    Write,
}

/// One reaped completion.
#[derive(Debug)]
pub enum Done<T> {
    /// The eventfd read armed by [`Ring::arm_wake`] completed.
    Wake,
    /// A read or write completed: its tag, its memory, and the kernel's result (bytes moved, or
    /// a negated errno).
    Io {
        /// The tag given to [`Ring::start`].
        tag: T,
        /// The request's memory, handed back now that the kernel no longer writes it.
        mem: IoMem,
        /// Bytes moved (≥ 0), or a negated errno.
        res: i32,
    },
}

/// An io_uring with the memory and a tag of every request in flight. Dropped with requests in
/// flight (after a failed `io_uring_enter`), it leaks their memory rather than free what the
/// kernel may still write.
pub struct Ring<T> {
    ring: IoUring,
    slots: Vec<Option<(T, IoMem)>>,
    free: Vec<usize>,
    in_flight: usize,
    wake_buf: Box<u64>,
    wake_armed: bool,
}

impl<T> Ring<T> {
    /// A ring of `entries` submission entries (rounded up to a power of two by the kernel).
    ///
    /// Errors: `io_uring_setup`'s (ENOSYS without io_uring, EPERM where it is disabled).
    pub fn new(entries: u32) -> std::io::Result<Self> {
        Ok(Ring {
            ring: IoUring::new(entries)?,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            wake_buf: Box::new(0),
            wake_armed: false,
        })
    }

    /// Reads and writes submitted and not reaped yet (the eventfd read not counted).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Arms an 8-byte read of the eventfd `efd`, reaped as [`Done::Wake`]; nothing when one is
    /// armed already.
    pub fn arm_wake(&mut self, efd: RawFd) {
        if self.wake_armed {
            return;
        }
        let e = opcode::Read::new(types::Fd(efd), (&mut *self.wake_buf as *mut u64).cast(), 8)
            .build()
            .user_data(WAKE);
        self.wake_armed = true;
        self.push(&e);
    }

    /// Queues a read of `mem`'s bytes from `fd` at `file_off` ([`Dir::Read`]), or a write of
    /// them there; `tag` comes back with the completion.
    pub fn start(&mut self, dir: Dir, fd: RawFd, file_off: u64, mem: IoMem, tag: T) {
        let (ptr, len) = mem.raw();
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let entry = match dir {
            Dir::Read => opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(file_off)
                .build(),
            Dir::Write => opcode::Write::new(types::Fd(fd), ptr, len)
                .offset(file_off)
                .build(),
        }
        .user_data(slot as u64);
        // The memory moves into the slot before the kernel sees the entry, and stays there
        // until `reap` takes it out with the completion.
        self.slots[slot] = Some((tag, mem));
        self.in_flight += 1;
        self.push(&entry);
    }

    fn push(&mut self, e: &squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to stays valid until its completion is
            // reaped: request memory is owned by its slot (a HostMem clone keeps registered
            // memory alive; an owned buffer moves only as a value, its heap bytes stay put),
            // the eventfd buffer is boxed in `self`; `Drop` leaks them while in flight.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return;
            }
            // Queue full: hand the entries to the kernel and try again.
            let _ = self.ring.submit();
        }
    }

    /// Submits what is queued and waits for at least `want` completions. `EINTR` and `EBUSY`
    /// (completions to reap first) are not errors.
    ///
    /// Errors: `io_uring_enter`'s other errors; the ring is then unusable.
    pub fn submit_and_wait(&mut self, want: usize) -> std::io::Result<()> {
        match self.ring.submit_and_wait(want) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The completions ready now, in the kernel's order.
    pub fn reap(&mut self) -> Vec<Done<T>> {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let mut out = Vec::with_capacity(cqes.len());
        for (ud, res) in cqes {
            if ud == WAKE {
                self.wake_armed = false;
                out.push(Done::Wake);
                continue;
            }
            let slot = ud as usize;
            if let Some((tag, mem)) = self.slots.get_mut(slot).and_then(Option::take) {
                self.free.push(slot);
                self.in_flight -= 1;
                out.push(Done::Io { tag, mem, res });
            }
        }
        out
    }

    /// Gives up on the requests in flight (after `submit_and_wait` failed): returns their tags
    /// and leaks their memory, which the kernel may still write.
    pub fn abandon(&mut self) -> Vec<T> {
        let mut tags = Vec::new();
        for (tag, mem) in self.slots.drain(..).flatten() {
            std::mem::forget(mem);
            tags.push(tag);
        }
        self.free.clear();
        self.in_flight = 0;
        tags
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        for (_, mem) in self.slots.drain(..).flatten() {
            std::mem::forget(mem);
        }
        if self.wake_armed {
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new(0)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn ring() -> Option<Ring<u32>> {
        // io_uring may be disabled (containers, kernel.io_uring_disabled): nothing to test then.
        match Ring::new(8) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("io_uring unavailable here, not tested: {e}");
                None
            }
        }
    }

    #[test]
    fn reads_and_writes_hand_back_their_memory_with_the_result() {
        let Some(mut r) = ring() else { return };
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello, ring").unwrap();
        let mem = HostMem::new(AlignedBuf::zeroed(16, 16));
        let fd = f.as_raw_fd();
        r.start(
            Dir::Read,
            fd,
            7,
            IoMem::host(Dir::Read, mem.clone(), 2, 4).unwrap(),
            1,
        );
        let mut buf = AlignedBuf::zeroed(8, 8);
        buf.as_mut_slice()[..3].copy_from_slice(b"XYZ");
        r.start(Dir::Write, fd, 0, IoMem::owned(buf, 3).unwrap(), 2);
        assert_eq!(r.in_flight(), 2);
        let mut done = Vec::new();
        while done.len() < 2 {
            r.submit_and_wait(1).unwrap();
            done.extend(r.reap());
        }
        assert_eq!(r.in_flight(), 0);
        for d in done {
            match d {
                Done::Io { tag: 1, res, .. } => assert_eq!(res, 4),
                Done::Io {
                    tag: 2,
                    res,
                    mem: IoMem::Owned { buf, .. },
                } => {
                    assert_eq!(res, 3);
                    assert_eq!(&buf.as_slice()[..3], b"XYZ");
                }
                other => panic!("unexpected completion {other:?}"),
            }
        }
        let mut out = [0u8; 16];
        mem.copy_out(0, &mut out).unwrap();
        assert_eq!(&out[2..6], b"ring");
        let mut file = [0u8; 11];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut file, 0).unwrap();
        assert_eq!(&file, b"XYZlo, ring");
    }

    #[test]
    fn ranges_outside_the_memory_are_refused_before_the_kernel_sees_them() {
        let mem = HostMem::new(AlignedBuf::zeroed(16, 16));
        assert!(IoMem::host(Dir::Write, mem.clone(), 8, 9).is_err());
        assert!(IoMem::host(Dir::Write, mem, usize::MAX, 2).is_err());
        // The kernel never reads a file into read-only memory; writing a file from it is fine.
        let mut backing = [7u8; 4];
        // SAFETY: `backing` outlives both handles, dropped in this test.
        let p = unsafe { super::super::mem::HostPointer::new(backing.as_mut_ptr(), 4, false) };
        let ro = HostMem::borrowed(p, None);
        assert!(
            IoMem::host(Dir::Read, ro.clone(), 0, 4)
                .unwrap_err()
                .read_only
        );
        assert!(IoMem::host(Dir::Write, ro, 0, 4).is_ok());
        let (buf, e) = IoMem::owned(AlignedBuf::zeroed(8, 8), 9).unwrap_err();
        assert_eq!((buf.len(), e.len), (8, 9));
    }

    #[test]
    fn the_eventfd_read_completes_as_a_wake() {
        let Some(mut r) = ring() else { return };
        let efd = nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
        )
        .unwrap();
        r.arm_wake(efd.as_raw_fd());
        r.arm_wake(efd.as_raw_fd()); // armed already: not a second read
        efd.write(1).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            r.submit_and_wait(1).unwrap();
            got = r.reap();
        }
        assert!(matches!(got.as_slice(), [Done::Wake]), "{got:?}");
    }
}
