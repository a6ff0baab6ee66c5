//! Agent and storage configuration.

use crate::error::{Error, Result};
use crate::memory::DirectIo;

/// 1 MiB, the default chunk: large enough to reach a disk's sequential bandwidth, small enough
/// for cancellation and deadlines to act quickly (same default block as `gdsio`).
pub const DEFAULT_CHUNK: u64 = 1 << 20;
/// Default number of storage requests in flight per backend.
pub const DEFAULT_QUEUE_DEPTH: u32 = 32;
/// Default bounce-buffer budget of the O_DIRECT path: 64 MiB.
pub const DEFAULT_BOUNCE_BUDGET: u64 = 64 << 20;

/// Storage path settings.
///
/// Memory bound: the O_DIRECT path holds at most `bounce_budget` bytes of bounce buffers
/// (allocated on first use, `max(1, bounce_budget / chunk)` buffers of `chunk` bytes), whatever
/// the file size; the buffered path reads and writes registered memory directly and allocates
/// none. Other per-request state is a few dozen bytes per chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// Largest single I/O in bytes; descriptors are split into chunks of this size. Rounded up
    /// to the file's O_DIRECT alignment; at most 1 GiB.
    pub chunk: u64,
    /// I/O requests in flight in the io_uring backend (its ring size), and jobs queued per
    /// thread in the buffered backend.
    pub queue_depth: u32,
    /// Bytes of aligned bounce buffers the O_DIRECT path may hold (for registered memory that is
    /// not aligned as O_DIRECT needs).
    pub bounce_budget: u64,
    /// Threads of the buffered (page cache) backend.
    pub buffered_threads: usize,
    /// O_DIRECT policy for files registered with [`DirectIo::Auto`]: `Off` forces every file
    /// onto the buffered path (the knob to test the fallback).
    pub direct: DirectIo,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            chunk: DEFAULT_CHUNK,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            bounce_budget: DEFAULT_BOUNCE_BUDGET,
            buffered_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(2, 8),
            direct: DirectIo::Auto,
        }
    }
}

impl StorageConfig {
    /// Checks the values; errors name the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.chunk == 0 || self.chunk > 1 << 30 {
            return Err(Error::Config(format!(
                "chunk must be 1 byte ..= 1 GiB, got {} bytes",
                self.chunk
            )));
        }
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return Err(Error::Config(format!(
                "queue depth must be 1..=4096, got {}",
                self.queue_depth
            )));
        }
        if self.bounce_budget < 4096 {
            return Err(Error::Config(format!(
                "bounce budget must be at least 4 KiB, got {} bytes",
                self.bounce_budget
            )));
        }
        if self.buffered_threads == 0 || self.buffered_threads > 256 {
            return Err(Error::Config(format!(
                "buffered threads must be 1..=256, got {}",
                self.buffered_threads
            )));
        }
        Ok(())
    }
}

/// Agent settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentConfig {
    /// The agent's name (peers see it as `Remote { agent }`); empty means `"local"`.
    pub name: String,
    pub storage: StorageConfig,
}
