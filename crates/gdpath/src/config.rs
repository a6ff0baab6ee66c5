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

/// Most threads a transfer gets by default or from the storage chooser (32): the page-cache
/// `memcpy` is memory-bound past it on the machines measured (docs/gds.md, "Storage defaults:
/// the chooser").
pub const MAX_THREADS: usize = 32;

/// Fewest threads a transfer of many chunks gets by default or from the storage chooser (4): a
/// thread waits on its copy to the GPU between reads, so even a two-core machine keeps more
/// reads in flight than cores.
pub const MIN_THREADS: usize = 4;

/// One thread per core, within [`MIN_THREADS`] ..= [`MAX_THREADS`]: the threads of a transfer
/// served from memory (the page cache or tmpfs), where each is a memory-bound `memcpy` and more
/// threads than cores only contend, and of a cold O_DIRECT read from a local disk, where one
/// 16 MiB request per core keeps enough bytes queued (docs/gds.md, "Storage defaults: the
/// chooser"). The default of [`GdsConfig::threads`] and [`StorageConfig::buffered_threads`]
/// (with [`cores`]), where no file is known; the storage chooser applies it per file.
pub fn core_threads(cores: usize) -> usize {
    cores.max(1).clamp(MIN_THREADS, MAX_THREADS)
}

/// The CPUs this process may use (`std::thread::available_parallelism`, which counts the
/// affinity mask and a cgroup CPU quota), at least 1.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

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
            buffered_threads: core_threads(cores()),
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

/// GPU path settings (the `cuda` backend).
///
/// Memory bound: the staging paths (pageable host memory, staged GPU ↔ GPU) hold pinned bounce
/// buffers of `chunk` bytes, at most `2 * copy_threads` per pageable copy and `staging_buffers`
/// per staged copy in flight; buffers are kept in a pool for reuse (at most 64). The pool holds
/// at most `(workers + 1) × max(2 × copy_threads, staging_buffers) × chunk` bytes (every
/// worker's copy at its widest, and as much again for small copies run on posting threads); a
/// copy that finds it spent waits up to 10 s for buffers, then fails with
/// [`Error::BounceExhausted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuConfig {
    /// Use GPUDirect P2P between GPUs that allow it. `false` forces the staged path (GPU →
    /// pinned bounce buffers → GPU), which is then reported with `p2p.disabled`.
    pub p2p: bool,
    /// Bytes per pinned bounce buffer and per pipelined copy (1 KiB ..= 1 GiB).
    pub chunk: u64,
    /// Bounce buffers (and streams per side) of one staged GPU ↔ GPU copy; at least 2.
    pub staging_buffers: usize,
    /// CPU threads copying between pageable memory and pinned bounce buffers, per descriptor
    /// pair, each with two bounce buffers on two streams.
    pub copy_threads: usize,
    /// Threads executing GPU work items (each waits on its own streams).
    pub workers: usize,
    /// Move GPU memory ↔ a peer agent's GPU region on this node with the `cuda` backend,
    /// through the CUDA IPC handle the peer sent (`docs/gpu.md`, "GPU memory of another
    /// process"). `false` leaves every remote pair to the network backend (UCX's own
    /// `cuda_ipc`, what `gdpath bench net` measures).
    pub ipc: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        GpuConfig {
            p2p: true,
            chunk: 4 << 20,
            staging_buffers: 6,
            copy_threads: (cores / 2).clamp(2, 16),
            workers: 4,
            ipc: true,
        }
    }
}

impl GpuConfig {
    /// Checks the values; errors name the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.chunk < 1024 || self.chunk > 1 << 30 {
            return Err(Error::Config(format!(
                "GPU chunk must be 1 KiB ..= 1 GiB, got {} bytes",
                self.chunk
            )));
        }
        if !(2..=64).contains(&self.staging_buffers) {
            return Err(Error::Config(format!(
                "staging buffers must be 2..=64, got {}",
                self.staging_buffers
            )));
        }
        if !(1..=256).contains(&self.copy_threads) {
            return Err(Error::Config(format!(
                "copy threads must be 1..=256, got {}",
                self.copy_threads
            )));
        }
        if !(1..=256).contains(&self.workers) {
            return Err(Error::Config(format!(
                "GPU workers must be 1..=256, got {}",
                self.workers
            )));
        }
        Ok(())
    }
}

/// File ↔ GPU path settings (the `cufile` and `file-gpu` backends).
///
/// Memory bound: each pair on the staged path holds `2 × threads` pinned bounce buffers of
/// `chunk` bytes (plus 128 KiB each for O_DIRECT realignment), or with `slabs`, that many slabs
/// of `threads × chunk` bytes, kept in a pool for reuse (at most `2 × threads` buffers kept):
/// about 264 MiB per pair with 32 threads of 4 MiB, 96 MiB with 16 threads of 2 MiB in 3 slabs.
/// Four pairs run at once, so the pool holds at most four times the larger of the two; a pair
/// that finds it spent waits up to 10 s for buffers, then fails with [`Error::BounceExhausted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdsConfig {
    /// Use cuFile (GdsNative, GdsCompat) when it can register the file. `false` skips cuFile
    /// entirely (no driver open, no handle registration).
    pub cufile: bool,
    /// Bytes per I/O request and per H2D/D2H copy (64 KiB ..= 1 GiB, a multiple of 4 KiB).
    pub chunk: u64,
    /// Threads per descriptor pair, each with two bounce buffers on two streams: its read of
    /// chunk k+1 overlaps the copy of chunk k, and the threads' reads overlap each other
    /// (several requests in flight: the queue depth is `threads`).
    pub threads: usize,
    /// Buffered reads into GPU memory: 0 for the two buffers per thread above; `n` (2 ..= 16)
    /// to gather the threads' chunks into `n` shared pinned slabs of `threads × chunk` bytes,
    /// each sent with one H2D copy (fewer, larger copies and a smaller working set: the
    /// storage chooser's pick for files in memory, `gdpath_checkpoint::chooser::SLABS`).
    pub slabs: usize,
}

/// Most slabs a staged read may use ([`GdsConfig::slabs`]): each holds `threads × chunk` pinned
/// bytes, and beyond a few the working set only grows (docs/gds.md, "Slabs").
pub const MAX_SLABS: usize = 16;

/// Whether `n` is a valid [`GdsConfig::slabs`]: 0 (a buffer pair per thread) or 2 ..=
/// [`MAX_SLABS`] (one slab cannot fill while another copies).
pub fn valid_slabs(n: usize) -> bool {
    n == 0 || (2..=MAX_SLABS).contains(&n)
}

/// Bytes per request of the file ↔ GPU paths where no file is known (4 MiB), and the storage
/// chooser's chunk: the best task size of the file ↔ GPU sweeps from the page cache, and large
/// enough for a disk's sequential bandwidth (docs/gds.md, "Storage defaults: the chooser").
pub const DEFAULT_GDS_CHUNK: u64 = 4 << 20;

impl Default for GdsConfig {
    fn default() -> Self {
        // The chooser's values for a file served from memory into host memory, where no file
        // is known yet (slabs need their 2 MiB chunk, which O_DIRECT reads would also take);
        // the storage chooser (`gdpath_checkpoint::chooser::choose`) decides per file (`gdpath
        // load`, `load_file`, `bench storage`).
        GdsConfig {
            cufile: true,
            chunk: DEFAULT_GDS_CHUNK,
            threads: core_threads(cores()),
            slabs: 0,
        }
    }
}

impl GdsConfig {
    /// Checks the values; errors name the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.chunk < 64 << 10 || self.chunk > 1 << 30 || self.chunk % 4096 != 0 {
            return Err(Error::Config(format!(
                "GDS chunk must be a multiple of 4 KiB in 64 KiB ..= 1 GiB, got {} bytes",
                self.chunk
            )));
        }
        if !(1..=256).contains(&self.threads) {
            return Err(Error::Config(format!(
                "GDS threads must be 1..=256, got {}",
                self.threads
            )));
        }
        if !valid_slabs(self.slabs) {
            return Err(Error::Config(format!(
                "staged-path slabs must be 0 (a buffer pair per thread) or 2..={MAX_SLABS}, got {}",
                self.slabs
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
    /// Storage paths: O_DIRECT, chunking and bounce-buffer budgets.
    pub storage: StorageConfig,
    /// GPU paths.
    pub gpu: GpuConfig,
    /// File ↔ GPU paths.
    pub gds: GdsConfig,
}
