//! The storage chooser: threads, chunk size, O_DIRECT or buffered, and whether to open cuFile,
//! for file ↔ GPU and file ↔ host transfers, picked from the machine and the files.
//!
//! [`Facts::gather`] observes (cores, each file's size, file system and page-cache residency,
//! whether `nvidia_fs` is loaded); [`rule`] is the pure decision over those facts (tested with
//! table inputs);
//! [`choose`] is both, with the caller's explicit values ([`Overrides`]) winning. The result, a
//! [`Tuning`], carries the chosen values and one sentence saying why, which the load and bench
//! reports print (`chosen: 16 threads × 16 MiB, O_DIRECT: ...`). [`Tuning::apply`] writes it
//! into an [`AgentConfig`] before the agent is made (the backends size their threads and
//! bounce buffers at start).
//!
//! The rules and the measurements they rest on are in docs/gds.md, "Storage defaults: the
//! chooser"; the constants here name the section they come from.

use gdpath::config::AgentConfig;
use gdpath::error::{Error, Result};
use gdpath::memory::DirectIo;
use gdpath::units::format_size;
use serde::Serialize;
use std::path::Path;

/// The engine's thread rule, which the chooser applies to the files it is given.
pub use gdpath::config::{core_threads, cores, MAX_THREADS, MIN_THREADS};

/// Bytes per request the chooser picks (4 MiB): the engine's default file ↔ GPU chunk
/// ([`gdpath::config::DEFAULT_GDS_CHUNK`], where its measurements are named).
pub const CHUNK: u64 = gdpath::config::DEFAULT_GDS_CHUNK;

/// Bytes per read the chooser picks for files in memory going to a GPU (2 MiB), where the reads
/// fill slabs ([`SLABS`]) rather than a buffer per copy: the CPU copies out of the page cache
/// faster in smaller pieces (docs/gds.md, "Slabs"; figures in docs/benchmarks.md, "Measurements
/// behind the defaults").
pub const SLAB_CHUNK: u64 = 2 << 20;

/// Slabs the chooser gives a read from memory into a GPU (3): `threads × SLAB_CHUNK` bytes each,
/// one H2D copy per slab; three keep a slab filling while one copies and one waits
/// (docs/gds.md, "Slabs").
pub const SLABS: usize = 3;

/// A file counts as in the page cache (hot) from this fraction of its bytes resident (0.9):
/// the rest is read from the device at its speed, but a few cold pages should not make the
/// whole file take the cold path.
pub const HOT_FRACTION: f64 = 0.9;

/// Bytes per request of a cold read from a local disk (16 MiB): large requests keep the disk's
/// queue full with few system calls, and this size beat the smaller ones tried, buffered or
/// direct (docs/gds.md, "Storage defaults: the chooser"; the rounds are in docs/benchmarks.md,
/// "Measurements behind the defaults", the `COLD_CHUNK` row).
pub const COLD_CHUNK: u64 = 16 << 20;

/// A cold file on a local file system is read with O_DIRECT only below this fraction of its
/// bytes in the page cache (0.1): O_DIRECT reads every byte from the device, while a buffered
/// read takes the cached ones from memory and reads the rest nearly as fast as O_DIRECT, so
/// buffered pays once a small part is cached. The fraction is derived from the cold-read
/// figures, not measured itself (docs/gds.md; docs/benchmarks.md, "Measurements behind the
/// defaults", the `DIRECT_BELOW` row).
pub const DIRECT_BELOW: f64 = 0.1;

/// Threads for a cold transfer of [`CHUNK`] requests through cuFile or from a network file
/// system (neither measured here): two per core, within [`MIN_THREADS`] ..= [`MAX_THREADS`]: a
/// reader mostly waits on the device, and more requests in flight keep its queue full
/// (docs/gds.md, "Cold reads").
pub fn device_threads(cores: usize) -> usize {
    (cores.max(1) * 2).clamp(MIN_THREADS, MAX_THREADS)
}

/// The kind of file system a file lives on, from `statfs`'s magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// tmpfs or ramfs: the bytes are memory; no device behind them.
    Tmpfs,
    /// ext4 (`statfs` magic `0xEF53`): a local file system on a block device.
    Ext4,
    /// XFS (`statfs` magic `0x58465342`): a local file system on a block device.
    Xfs,
    /// Btrfs (`statfs` magic `0x9123683E`): a local file system on a block device.
    Btrfs,
    /// overlayfs (containers): the bytes are on the upper or lower file system's device.
    Overlay,
    /// NFS, CIFS/SMB, Ceph, Lustre, GPFS, FUSE: the bytes come over a network or a daemon.
    Network,
    /// Any other magic number.
    Other,
}

impl FsKind {
    /// The kind of `statfs.f_type` magic `m`.
    pub fn from_magic(m: u64) -> FsKind {
        match m {
            0x0102_1994 | 0x8584_58f6 => FsKind::Tmpfs,
            0xEF53 => FsKind::Ext4,
            0x5846_5342 => FsKind::Xfs,
            0x9123_683E => FsKind::Btrfs,
            0x794c_7630 => FsKind::Overlay,
            // nfs, smb2, cifs, ceph, lustre, gpfs, fuse
            0x6969 | 0xFE53_4D42 | 0xFF53_4D42 | 0x00c3_6400 | 0x0BD0_0BD0 | 0x4750_4653
            | 0x6573_5546 => FsKind::Network,
            _ => FsKind::Other,
        }
    }

    /// ext4, xfs or btrfs: the local kinds the chooser reads cold files from with O_DIRECT
    /// (overlayfs passes it down only on recent kernels; FUSE and 9p may take the flag and fail
    /// the reads).
    pub fn takes_direct(self) -> bool {
        matches!(self, FsKind::Ext4 | FsKind::Xfs | FsKind::Btrfs)
    }

    /// `tmpfs`, `ext4`, ... as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Tmpfs => "tmpfs",
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::Overlay => "overlay",
            FsKind::Network => "a network file system",
            FsKind::Other => "an unrecognised file system",
        }
    }
}

/// Where the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dest {
    /// GPU memory (the `file-gpu` staged path, or cuFile).
    Gpu,
    /// Host memory (the `posix-direct` / `posix-buffered` backends).
    Host,
}

/// What the chooser decides from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Facts {
    /// CPUs this process may use ([`cores`]).
    pub cores: usize,
    /// Bytes of all the files together.
    pub file_bytes: u64,
    /// The file system of the largest file (most bytes decide).
    pub fs: FsKind,
    /// Fraction (0 ..= 1) of the files' bytes in the page cache (`mincore`: counted for files
    /// up to 256 MiB, sampled above, [`gdpath::os::resident_bytes`]; a tmpfs file counts as
    /// resident without asking); `None` when it could not be asked (a file system that cannot
    /// be mapped).
    pub resident: Option<f64>,
    /// The `nvidia_fs` kernel module is loaded (GPUDirect Storage can DMA from the device).
    pub nvidia_fs: bool,
}

impl Facts {
    /// Observes this machine and `files` (each opened for reading, then closed).
    ///
    /// Errors: [`Error::Open`] when a file cannot be opened; [`Error::Io`] (op `fstat` or
    /// `fstatfs`) when its size or file system cannot be read. A residency the kernel will not
    /// give is `resident: None`, not an error.
    pub fn gather<P: AsRef<Path>>(files: &[P]) -> Result<Facts> {
        let mut total = 0u64;
        let mut resident = Some(0u64);
        let mut largest = (0u64, FsKind::Other);
        for p in files {
            let p = p.as_ref();
            let f = std::fs::File::open(p).map_err(|e| Error::Open {
                path: p.to_owned(),
                source: std::sync::Arc::new(e),
            })?;
            let len = f.metadata().map_err(|e| Error::io("fstat", p, 0, e))?.len();
            let fs = FsKind::from_magic(
                gdpath::os::fs_magic(&f).map_err(|e| Error::io("fstatfs", p, 0, e))?,
            );
            if len >= largest.0 {
                largest = (len, fs);
            }
            // A tmpfs file's pages are its memory: asking `mincore` would cost a load of a
            // large file about 5 ms and could only answer "resident".
            let here = if fs == FsKind::Tmpfs {
                Ok(len)
            } else {
                gdpath::os::resident_bytes(&f, len)
            };
            resident = match (resident, here) {
                (Some(r), Ok(b)) => Some(r + b),
                _ => None,
            };
            total += len;
        }
        let gds = gdpath::gds::GdsFacts::gather(&gdpath::topo::DirView::live(), None);
        Ok(Facts {
            cores: cores(),
            file_bytes: total,
            fs: largest.1,
            resident: resident.map(|r| {
                if total == 0 {
                    1.0
                } else {
                    r as f64 / total as f64
                }
            }),
            nvidia_fs: gds.nvidia_fs_loaded(),
        })
    }

    /// The files are served from memory: on tmpfs, or at least [`HOT_FRACTION`] resident.
    pub fn in_memory(&self) -> bool {
        self.fs == FsKind::Tmpfs || self.resident.is_some_and(|r| r >= HOT_FRACTION)
    }
}

/// Values the caller gave explicitly (flags); each one set wins over the rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Reader threads.
    pub threads: Option<usize>,
    /// Bytes per request.
    pub chunk: Option<u64>,
    /// `Some(true)`: O_DIRECT where the file system allows; `Some(false)`: buffered.
    pub direct: Option<bool>,
    /// Whether to open cuFile.
    pub cufile: Option<bool>,
    /// Slabs of a buffered read into a GPU (0: a buffer pair per thread).
    pub slabs: Option<usize>,
}

/// The chooser's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tuning {
    /// Threads per transfer (requests in flight of the staged path; buffered readers).
    pub threads: usize,
    /// Bytes per request.
    pub chunk: u64,
    /// Buffered reads into a GPU gather the threads' chunks into this many slabs, one H2D copy
    /// each (`GdsConfig::slabs`); 0: each thread copies its own chunks.
    pub slabs: usize,
    /// O_DIRECT (where the file system allows it) rather than the page cache.
    pub direct: bool,
    /// Open cuFile and try to register the files (GDS). `false` spares its driver open
    /// (≈ 0.6 s, docs/gds.md) where it would only fall back.
    pub cufile: bool,
    /// One sentence: why these values.
    pub reason: String,
    /// The flags that overrode the rule (`threads`, `chunk`, `slabs`, `direct`, `cufile`).
    pub overridden: Vec<&'static str>,
    /// What it was decided from.
    pub facts: Facts,
}

impl Tuning {
    /// `32 threads × 4 MiB, buffered: <reason>` (`16 threads × 2 MiB in 3 slabs, ...` with
    /// slabs, which only buffered reads take), as the reports print after `chosen: `.
    pub fn summary(&self) -> String {
        let mode = mode(self.direct);
        let gds = if self.cufile { ", cuFile tried" } else { "" };
        let flags = if self.overridden.is_empty() {
            String::new()
        } else {
            format!(" (given: {})", self.overridden.join(", "))
        };
        let threads = match self.threads {
            1 => "1 thread".to_owned(),
            n => format!("{n} threads"),
        };
        let slabs = match self.slabs {
            n if n > 0 && !self.direct => format!(" in {n} slabs"),
            _ => String::new(),
        };
        format!(
            "{threads} × {}{slabs}, {mode}{gds}: {}{flags}",
            format_size(self.chunk),
            self.reason
        )
    }

    /// Writes the choice into `cfg`: the staged file ↔ GPU path's threads, chunk, slabs and
    /// cuFile switch; the host backends' chunk and buffered threads; O_DIRECT off (every file
    /// registered with [`DirectIo::Auto`] goes buffered) when `direct` is false.
    pub fn apply(&self, cfg: &mut AgentConfig) {
        cfg.gds.threads = self.threads;
        cfg.gds.chunk = self.chunk;
        cfg.gds.slabs = self.slabs;
        cfg.gds.cufile = self.cufile;
        cfg.storage.chunk = self.chunk;
        cfg.storage.buffered_threads = self.threads;
        cfg.storage.direct = if self.direct {
            DirectIo::Auto
        } else {
            DirectIo::Off
        };
    }
}

/// `O_DIRECT` or `buffered`, as the reports name the mode.
fn mode(direct: bool) -> &'static str {
    if direct {
        "O_DIRECT"
    } else {
        "buffered"
    }
}

/// The rule: the choice for moving `facts`' files to (or from) `dest`, before overrides.
///
/// - From memory (tmpfs, or the files [`HOT_FRACTION`] in the page cache): buffered (an
///   O_DIRECT read of a cached file goes to the device instead), [`core_threads`] threads of
///   [`CHUNK`]; no cuFile (it has nothing to DMA from the device). Into a GPU, the threads read
///   [`SLAB_CHUNK`] into [`SLABS`] slabs.
/// - Cold, for a GPU, on ext4 or xfs with `nvidia_fs` loaded: cuFile (GDS), O_DIRECT,
///   [`device_threads`] threads of [`CHUNK`].
/// - Cold, on a network file system: buffered (the client's readahead), [`device_threads`]
///   threads of [`CHUNK`].
/// - Cold, on a local file system: [`core_threads`] threads of [`COLD_CHUNK`], with O_DIRECT on
///   ext4, xfs or btrfs when less than [`DIRECT_BELOW`] of the files is in the page cache (or
///   residency is unknown), buffered otherwise (partly cached files; overlayfs and file systems
///   not recognised, where O_DIRECT may be refused or unsupported).
///
/// Threads never exceed the chunks there are (a small file gets one thread per chunk).
pub fn rule(facts: &Facts, dest: Dest) -> Tuning {
    let resident = facts.resident.map_or_else(
        || "residency unknown".to_owned(),
        |r| format!("{:.0}% in page cache", r * 100.0),
    );
    let fs = facts.fs.name();
    let (threads, chunk, slabs, direct, cufile, reason) = if facts.in_memory() {
        let why = if facts.fs == FsKind::Tmpfs {
            "files on tmpfs (memory)".to_owned()
        } else {
            format!("files {resident} on {fs}")
        };
        let (chunk, slabs) = if dest == Dest::Gpu {
            (SLAB_CHUNK, SLABS)
        } else {
            (CHUNK, 0)
        };
        (
            core_threads(facts.cores),
            chunk,
            slabs,
            false,
            false,
            format!("{why}: reads are memory copies, one per thread"),
        )
    } else if dest == Dest::Gpu && facts.nvidia_fs && matches!(facts.fs, FsKind::Ext4 | FsKind::Xfs)
    {
        (
            device_threads(facts.cores),
            CHUNK,
            0,
            true,
            true,
            format!("cold files ({resident}) on {fs} with nvidia_fs loaded: GPUDirect Storage DMA"),
        )
    } else if facts.fs == FsKind::Network {
        (
            device_threads(facts.cores),
            CHUNK,
            0,
            false,
            false,
            format!("cold files ({resident}) on {fs}: the client's readahead"),
        )
    } else {
        let direct_fs = facts.fs.takes_direct();
        let nearly_none = facts.resident.is_none_or(|r| r < DIRECT_BELOW);
        let (direct, why) = match (direct_fs, nearly_none) {
            (true, true) => (
                true,
                "large requests straight from the device (the page cache keeps no copy)",
            ),
            (true, false) => (
                false,
                "large requests through the page cache, which serves the part it holds",
            ),
            (false, _) => (
                false,
                "large requests through the page cache (O_DIRECT is chosen on ext4, xfs and btrfs)",
            ),
        };
        (
            core_threads(facts.cores),
            COLD_CHUNK,
            0,
            direct,
            false,
            format!("cold files ({resident}) on {fs}: {why}"),
        )
    };
    let chunks = facts.file_bytes.div_ceil(chunk).max(1);
    Tuning {
        threads: threads.min(usize::try_from(chunks).unwrap_or(usize::MAX)),
        chunk,
        slabs,
        direct,
        cufile,
        reason,
        overridden: Vec::new(),
        facts: facts.clone(),
    }
}

/// [`Facts::gather`] of `files`, [`rule`] for `dest`, then `over`'s values in place of the
/// rule's (named in [`Tuning::overridden`]). Errors: those of [`Facts::gather`].
pub fn choose<P: AsRef<Path>>(files: &[P], dest: Dest, over: &Overrides) -> Result<Tuning> {
    Ok(with_overrides(rule(&Facts::gather(files)?, dest), over))
}

/// `t` with `over`'s values in place (each named in [`Tuning::overridden`]); a chunk given
/// without slabs turns slabs off.
pub fn with_overrides(mut t: Tuning, over: &Overrides) -> Tuning {
    if let Some(v) = over.threads {
        t.threads = v;
        t.overridden.push("threads");
    }
    if let Some(v) = over.chunk {
        t.chunk = v;
        t.overridden.push("chunk");
        if over.slabs.is_none() {
            // Slabs were measured with their own chunk: another chunk alone means the
            // per-thread pipeline, as before slabs (docs/gds.md, "Slabs").
            t.slabs = 0;
        }
    }
    if let Some(v) = over.slabs {
        t.slabs = v;
        t.overridden.push("slabs");
    }
    if let Some(v) = over.direct {
        if v != t.direct {
            // The rule's reason argued for the other mode: keep only the facts it decided on.
            let facts = t.reason.split(": ").next().unwrap_or_default();
            t.reason = format!("the rule chose {} for {facts}", mode(t.direct));
        }
        t.direct = v;
        t.overridden.push("direct");
    }
    if let Some(v) = over.cufile {
        t.cufile = v;
        t.overridden.push("cufile");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const GIB: u64 = 1 << 30;

    fn facts(cores: usize, fs: FsKind, resident: Option<f64>, bytes: u64, nvfs: bool) -> Facts {
        Facts {
            cores,
            file_bytes: bytes,
            fs,
            resident,
            nvidia_fs: nvfs,
        }
    }

    #[test]
    fn the_rule_over_a_table_of_machines_and_files() {
        use Dest::{Gpu, Host};
        use FsKind::*;
        const MIB: u64 = 1 << 20;
        // (cores, fs, resident, bytes, nvidia_fs, dest) → (threads, chunk, slabs, direct, cufile)
        #[rustfmt::skip]
        let table = [
            // From memory: one thread per core; into a GPU 2 MiB reads into slabs.
            (16, Tmpfs, Some(1.0), 4 * GIB, false, Gpu, (16, SLAB_CHUNK, SLABS, false, false)),
            (32, Tmpfs, None, 4 * GIB, true, Gpu, (32, SLAB_CHUNK, SLABS, false, false)),
            (2, Tmpfs, Some(1.0), 4 * GIB, false, Host, (4, CHUNK, 0, false, false)),
            (8, Ext4, Some(1.0), 9 * GIB, false, Gpu, (8, SLAB_CHUNK, SLABS, false, false)),
            (16, Ext4, Some(0.95), 9 * GIB, true, Gpu, (16, SLAB_CHUNK, SLABS, false, false)),
            // Cold, local: one 16 MiB request per core; O_DIRECT on ext4/xfs/btrfs when
            // (nearly) nothing is cached, buffered for partly cached files and other kinds.
            (16, Ext4, Some(0.0), 9 * GIB, false, Gpu, (16, COLD_CHUNK, 0, true, false)),
            (16, Ext4, Some(0.05), 9 * GIB, false, Host, (16, COLD_CHUNK, 0, true, false)),
            (16, Ext4, None, 9 * GIB, false, Gpu, (16, COLD_CHUNK, 0, true, false)),
            (16, Ext4, Some(0.0), 40 * GIB, false, Gpu, (16, COLD_CHUNK, 0, true, false)),
            (2, Btrfs, Some(0.0), 9 * GIB, false, Host, (4, COLD_CHUNK, 0, true, false)),
            (64, Xfs, Some(0.0), 9 * GIB, false, Gpu, (32, COLD_CHUNK, 0, true, false)),
            (16, Ext4, Some(0.1), 9 * GIB, false, Gpu, (16, COLD_CHUNK, 0, false, false)),
            (16, Ext4, Some(0.5), 9 * GIB, false, Host, (16, COLD_CHUNK, 0, false, false)),
            (16, Overlay, None, 9 * GIB, false, Gpu, (16, COLD_CHUNK, 0, false, false)),
            (16, Other, Some(0.0), 9 * GIB, false, Gpu, (16, COLD_CHUNK, 0, false, false)),
            // Cold with nvidia_fs: GDS into a GPU (ext4/xfs only), two 4 MiB readers per core.
            (16, Xfs, Some(0.0), 9 * GIB, true, Gpu, (32, CHUNK, 0, true, true)),
            (16, Xfs, Some(0.0), 9 * GIB, true, Host, (16, COLD_CHUNK, 0, true, false)),
            (16, Btrfs, Some(0.0), 9 * GIB, true, Gpu, (16, COLD_CHUNK, 0, true, false)),
            // Cold on a network file system: the client's readahead.
            (16, Network, Some(0.0), 40 * GIB, false, Gpu, (32, CHUNK, 0, false, false)),
            // Small files: one thread per chunk.
            (16, Ext4, Some(1.0), 10 * MIB, false, Gpu, (5, SLAB_CHUNK, SLABS, false, false)),
            (16, Ext4, Some(1.0), 10 * MIB, false, Host, (3, CHUNK, 0, false, false)),
            (16, Ext4, Some(0.0), 40 * MIB, false, Gpu, (3, COLD_CHUNK, 0, true, false)),
            (16, Ext4, Some(1.0), 0, false, Gpu, (1, SLAB_CHUNK, SLABS, false, false)),
        ];
        for (cores, fs, res, bytes, nvfs, dest, want) in table {
            let t = rule(&facts(cores, fs, res, bytes, nvfs), dest);
            assert_eq!(
                (t.threads, t.chunk, t.slabs, t.direct, t.cufile),
                want,
                "{cores} cores, {fs:?}, {res:?}, {bytes} B, nvfs {nvfs}, {dest:?}: {}",
                t.summary()
            );
            assert!(!t.reason.is_empty() && t.overridden.is_empty());
        }
    }

    #[test]
    fn the_reason_names_what_decided() {
        let t = rule(&facts(16, FsKind::Tmpfs, Some(1.0), GIB, false), Dest::Gpu);
        assert_eq!(
            t.summary(),
            "16 threads × 2 MiB in 3 slabs, buffered: files on tmpfs (memory): reads are \
             memory copies, one per thread"
        );
        let t = rule(&facts(16, FsKind::Tmpfs, Some(1.0), GIB, false), Dest::Host);
        assert!(
            t.summary().starts_with("16 threads × 4 MiB, buffered: "),
            "{}",
            t.summary()
        );
        let t = rule(&facts(16, FsKind::Ext4, Some(0.0), GIB, false), Dest::Gpu);
        assert!(
            t.summary().contains("(0% in page cache) on ext4"),
            "{}",
            t.summary()
        );
        let t = rule(
            &facts(16, FsKind::Ext4, Some(0.0), 40 * GIB, false),
            Dest::Gpu,
        );
        assert!(
            t.summary().starts_with("16 threads × 16 MiB, O_DIRECT: "),
            "{}",
            t.summary()
        );
    }

    #[test]
    fn explicit_values_win_and_are_named() {
        let t = rule(&facts(16, FsKind::Tmpfs, Some(1.0), GIB, false), Dest::Gpu);
        let o = with_overrides(
            t,
            &Overrides {
                threads: Some(12),
                chunk: Some(1 << 20),
                direct: Some(true),
                cufile: None,
                slabs: Some(0),
            },
        );
        assert_eq!(
            (o.threads, o.chunk, o.slabs, o.direct, o.cufile),
            (12, 1 << 20, 0, true, false)
        );
        assert_eq!(o.overridden, ["threads", "chunk", "slabs", "direct"]);
        assert!(
            o.summary()
                .ends_with("(given: threads, chunk, slabs, direct)"),
            "{}",
            o.summary()
        );
        // A mode given against the rule's: the reason says the rule chose the other one, not
        // argue for it under the mode given (the trial saw "buffered: ... straight from the
        // device").
        assert!(
            o.summary()
                .starts_with("12 threads × 1 MiB, O_DIRECT: the rule chose buffered for files on tmpfs (memory) (given: "),
            "{}",
            o.summary()
        );
        let cold = rule(&facts(16, FsKind::Ext4, Some(0.0), GIB, false), Dest::Host);
        let buffered = Overrides {
            direct: Some(false),
            ..Overrides::default()
        };
        let o = with_overrides(cold.clone(), &buffered);
        assert!(
            o.summary().starts_with(
                "16 threads × 16 MiB, buffered: the rule chose O_DIRECT for cold files (0% in page cache) on ext4 (given: direct)"
            ),
            "{}",
            o.summary()
        );
        // The same mode given: the rule's reason stands.
        let same = Overrides {
            direct: Some(true),
            ..Overrides::default()
        };
        assert_eq!(with_overrides(cold.clone(), &same).reason, cold.reason);
    }

    #[test]
    fn a_chunk_given_alone_turns_slabs_off_and_o_direct_prints_none() {
        let t = rule(&facts(16, FsKind::Tmpfs, Some(1.0), GIB, false), Dest::Gpu);
        assert_eq!((t.chunk, t.slabs), (SLAB_CHUNK, SLABS));
        let chunk_only = Overrides {
            chunk: Some(CHUNK),
            ..Overrides::default()
        };
        let o = with_overrides(t.clone(), &chunk_only);
        assert_eq!((o.chunk, o.slabs), (CHUNK, 0));
        assert!(
            o.summary().starts_with("16 threads × 4 MiB, buffered"),
            "{}",
            o.summary()
        );
        let both = Overrides {
            chunk: Some(1 << 20),
            slabs: Some(4),
            ..Overrides::default()
        };
        let o = with_overrides(t.clone(), &both);
        assert_eq!((o.chunk, o.slabs), (1 << 20, 4));
        let direct = Overrides {
            direct: Some(true),
            ..Overrides::default()
        };
        let o = with_overrides(t, &direct);
        assert!(
            !o.summary().contains("slabs"),
            "O_DIRECT reads take no slabs: {}",
            o.summary()
        );
    }

    #[test]
    fn apply_sets_both_paths_and_the_direct_policy() {
        let t = rule(&facts(16, FsKind::Tmpfs, Some(1.0), GIB, false), Dest::Gpu);
        let mut cfg = AgentConfig::default();
        t.apply(&mut cfg);
        assert_eq!(
            (
                cfg.gds.threads,
                cfg.gds.chunk,
                cfg.gds.slabs,
                cfg.gds.cufile
            ),
            (16, SLAB_CHUNK, SLABS, false)
        );
        assert_eq!(
            (cfg.storage.buffered_threads, cfg.storage.chunk),
            (16, SLAB_CHUNK)
        );
        assert_eq!(cfg.storage.direct, DirectIo::Off);
        cfg.gds.validate().unwrap();
        cfg.storage.validate().unwrap();
    }

    #[test]
    fn magic_numbers_map_to_kinds() {
        assert_eq!(FsKind::from_magic(0x0102_1994), FsKind::Tmpfs);
        assert_eq!(FsKind::from_magic(0xEF53), FsKind::Ext4);
        assert_eq!(FsKind::from_magic(0x5846_5342), FsKind::Xfs);
        assert_eq!(FsKind::from_magic(0x6969), FsKind::Network);
        assert_eq!(FsKind::from_magic(0x794c_7630), FsKind::Overlay);
        assert_eq!(FsKind::from_magic(1), FsKind::Other);
    }

    /// Writes `len` bytes to `path`, flushed to the device (so DONTNEED can drop them).
    fn write_synced(path: &Path, len: usize) {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(&vec![0x5au8; len]).unwrap();
        f.sync_all().unwrap();
    }

    #[test]
    fn a_real_disk_file_hot_then_evicted_is_read_buffered_then_direct() {
        // The repository's disk (ext4 or overlay here), not tmpfs: the target dir is on it.
        let dir = tempfile::tempdir_in(gdpath_testkit::repo_root()).unwrap();
        let p = dir.path().join("ckpt");
        write_synced(&p, 16 << 20);
        let hot = choose(&[&p], Dest::Gpu, &Overrides::default()).unwrap();
        eprintln!("hot: {}", hot.summary());
        assert_ne!(
            hot.facts.fs,
            FsKind::Tmpfs,
            "the test dir should be on a disk"
        );
        if hot.facts.fs == FsKind::Tmpfs {
            return;
        }
        assert_eq!(hot.facts.file_bytes, 16 << 20);
        assert!(
            hot.facts.resident.unwrap() >= HOT_FRACTION,
            "{:?}",
            hot.facts
        );
        assert!(hot.reason.contains("in page cache"), "{}", hot.reason);
        assert!(!hot.direct && !hot.cufile);
        gdpath::os::evict_page_cache(&p).unwrap();
        let cold = choose(&[&p], Dest::Gpu, &Overrides::default()).unwrap();
        eprintln!("cold: {}", cold.summary());
        let r = cold.facts.resident.unwrap();
        if r >= HOT_FRACTION {
            eprintln!("skipped the cold half: the kernel kept {r} of the file after DONTNEED");
            return;
        }
        assert!(r < 0.5, "{r}");
        assert!(cold.reason.starts_with("cold files"), "{}", cold.reason);
        // cuFile where nvidia_fs is loaded (4 MiB requests, O_DIRECT), else one 16 MiB request,
        // O_DIRECT on the kinds that take it when (nearly) nothing is cached.
        let want = if cold.cufile {
            (4, CHUNK, true)
        } else {
            (
                1,
                COLD_CHUNK,
                cold.facts.fs.takes_direct() && r < DIRECT_BELOW,
            )
        };
        assert_eq!(
            (cold.threads, cold.chunk, cold.direct),
            want,
            "{}",
            cold.summary()
        );
    }

    #[test]
    fn a_real_tmpfs_file_is_memory_whatever_its_residency() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            eprintln!("skipped: /dev/shm is not writable here");
            return;
        };
        let p = dir.path().join("f");
        write_synced(&p, 64 << 20);
        // DONTNEED cannot drop tmpfs pages: they are the file.
        gdpath::os::evict_page_cache(&p).unwrap();
        let t = choose(&[&p], Dest::Gpu, &Overrides::default()).unwrap();
        eprintln!("tmpfs: {}", t.summary());
        assert_eq!(t.facts.fs, FsKind::Tmpfs);
        assert!(!t.direct && !t.cufile);
        assert_eq!(
            t.threads,
            core_threads(cores()).min(((64 << 20) / SLAB_CHUNK) as usize)
        );
        assert_eq!(t.facts.resident, Some(1.0), "tmpfs counts as resident");
        assert!(t.reason.contains("tmpfs"), "{}", t.reason);
    }

    #[test]
    fn a_missing_file_is_an_open_error_naming_it() {
        let p = PathBuf::from("/nonexistent/ckpt.safetensors");
        match choose(&[&p], Dest::Host, &Overrides::default()) {
            Err(Error::Open { path, .. }) => assert_eq!(path, p),
            other => panic!("{other:?}"),
        }
    }
}
