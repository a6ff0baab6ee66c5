//! The file descriptor asyncio watches: an eventfd that completion hooks write, with the tokens
//! of what completed. Hooks run on the engine's threads without the GIL; they only push a token
//! and write 8 bytes, so they never wait for the interpreter (`gdpath._aio` drains them on the
//! event loop's thread after `loop.add_reader` fires).

use nix::sys::eventfd::{EfdFlags, EventFd};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};

/// The shared part: the eventfd and the tokens signalled since the last drain.
pub struct Inner {
    fd: EventFd,
    ready: Mutex<Vec<u64>>,
}

impl Inner {
    /// Queues `token` and wakes the reader. Never blocks (the counter of an eventfd saturates
    /// only after 2^64 - 2 writes without a read).
    pub fn signal(&self, token: u64) {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(token);
        // Non-blocking: a full counter (EAGAIN) already wakes the reader.
        let _ = self.fd.write(1);
    }
}

/// An eventfd for one event loop and the tokens signalled through it.
#[pyclass(module = "gdpath._native", name = "Waker", frozen)]
pub struct Waker {
    inner: Arc<Inner>,
}

impl Waker {
    /// The handle a completion hook holds.
    pub fn handle(&self) -> Arc<Inner> {
        self.inner.clone()
    }
}

#[pymethods]
impl Waker {
    #[new]
    fn new() -> PyResult<Waker> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| PyOSError::new_err(format!("eventfd: {e}")))?;
        Ok(Waker {
            inner: Arc::new(Inner {
                fd,
                ready: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The eventfd, for `loop.add_reader`.
    fn fileno(&self) -> i32 {
        self.inner.fd.as_fd().as_raw_fd()
    }

    /// Clears the eventfd and returns the tokens signalled since the last drain, in order.
    fn drain(&self) -> Vec<u64> {
        // Non-blocking: EAGAIN (nothing signalled since the last drain) is fine.
        let _ = self.inner.fd.read();
        std::mem::take(&mut *self.inner.ready.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Signals `token` now (from Python: a cancel, a deadline).
    fn signal(&self, token: u64) {
        self.inner.signal(token);
    }
}
