//! The file descriptor asyncio watches: an eventfd that completion hooks write, with the tokens
//! of what completed. Hooks run on the engine's threads without the GIL; they only push a token
//! and write 8 bytes, so they never wait for the interpreter (`gdpath._aio` drains them on the
//! event loop's thread after `loop.add_reader` fires).

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The shared part: the eventfd and the tokens signalled since the last drain.
pub struct Inner {
    fd: OwnedFd,
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
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our own eventfd (non-blocking).
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
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
        // SAFETY: eventfd(2) with flags only; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Waker {
            inner: Arc::new(Inner {
                // SAFETY: a fresh descriptor that nothing else owns.
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
                ready: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The eventfd, for `loop.add_reader`.
    fn fileno(&self) -> i32 {
        self.inner.fd.as_raw_fd()
    }

    /// Clears the eventfd and returns the tokens signalled since the last drain, in order.
    fn drain(&self) -> Vec<u64> {
        let mut buf = [0u8; 8];
        // SAFETY: reads into a live 8-byte buffer from our non-blocking eventfd; EAGAIN (nothing
        // to read) is fine.
        let _ = unsafe { libc::read(self.inner.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        std::mem::take(&mut *self.inner.ready.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Signals `token` now (from Python: a cancel, a deadline).
    fn signal(&self, token: u64) {
        self.inner.signal(token);
    }
}
