//! `gdpath copy`: a file into host memory and (optionally) out to another file, streaming
//! through two registered host windows so memory stays bounded whatever the file size.
//!
//! Pipeline: window `w` is read into buffer `w % 2`, then written out while window `w + 1` is
//! read into the other buffer. Memory held: 2 × `window` bytes of host memory plus the engine's
//! bounce budget.
//!
//! The destination is written whole or not at all ([`gdpath::file::AtomicFile`]): into a
//! temporary of its directory, with the space reserved first, renamed over the destination when
//! every byte is written (and, with `verify`, checked); an existing destination is replaced only
//! with [`ReplaceOptions::overwrite`]. A failure or an interrupt leaves the old file as it was.
//!
//! Sources whose `stat` size is not their length (procfs and sysfs files say 0 or 4096 and read
//! shorter) are read with `read(2)` to their end, at most [`PSEUDO_FILE_MAX`] bytes, and the
//! report says so ([`CopyReport::note`]).

use crate::files::temporary_checksum;
use crate::{Checksum, Progress};
use gdpath::file::{AtomicFile, AtomicFileExt, ReplaceOptions};
use gdpath::{
    Agent, DataPath, DirectIo, Error, FileSpec, FindingId, HostBuffer, Memory, Op, Region, Result,
    Transfer, TransferReport, TransferRequest,
};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Default window: 32 MiB (two are held).
pub const DEFAULT_WINDOW: u64 = 32 << 20;

/// Copy settings.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Bytes per window (at least [`MIN_WINDOW`]); two windows are allocated.
    pub window: u64,
    /// O_DIRECT policy for both files.
    pub direct: DirectIo,
    /// Checksum the data read from the source (in host memory) and the destination read back;
    /// a destination that does not match is not committed.
    pub verify: bool,
    /// Copy only the first `size` bytes of the source (`None`: all of it).
    pub size: Option<u64>,
    /// Whether an existing destination may be replaced, and `fsync` before it is.
    pub replace: ReplaceOptions,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            window: DEFAULT_WINDOW,
            direct: DirectIo::Auto,
            verify: false,
            size: None,
            replace: ReplaceOptions::default(),
        }
    }
}

/// The path one leg (file → host, or host → file) took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leg {
    /// The path the leg's first transfer took.
    pub path: DataPath,
    /// Why the preferred path was not used.
    pub finding: Option<FindingId>,
}

/// The result of a copy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyReport {
    /// Bytes copied.
    pub bytes: u64,
    /// Wall time from the first read posted to the last write completed.
    pub elapsed: Duration,
    /// GB/s (1e9 B/s) end to end.
    pub gbps: f64,
    /// Source file → host memory.
    pub read: Option<Leg>,
    /// Host memory → destination file (absent when copying into memory only).
    pub write: Option<Leg>,
    /// Checksums matched (`None` when not verified). When they did not, the destination was
    /// left as it was.
    pub verified: Option<bool>,
    /// How the source was read when not as its `stat` size said (a procfs or sysfs file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// When the destination given is a symbolic link: the real path of the file it leads to,
    /// the one written (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_file: Option<PathBuf>,
}

impl CopyReport {
    fn new(
        bytes: u64,
        elapsed: Duration,
        [read, write]: [Option<Leg>; 2],
        verified: Option<bool>,
        note: Option<String>,
    ) -> CopyReport {
        CopyReport {
            bytes,
            elapsed,
            gbps: gdpath::units::gbps(bytes, elapsed),
            read,
            write,
            verified,
            note,
            dst_file: None,
        }
    }
}

fn leg(r: &TransferReport, into: &mut Option<Leg>) {
    if into.is_none() {
        if let Some(p) = r.pairs.first() {
            *into = Some(Leg {
                path: p.path.clone(),
                finding: p.finding.clone(),
            });
        }
    }
}

fn wait(t: Transfer) -> Result<TransferReport> {
    t.wait().map_err(|e| e.error)
}

/// Smallest accepted [`CopyOptions::window`], in bytes: one page.
pub const MIN_WINDOW: u64 = 4096;

/// Refuses a copy whose destination is the source itself (same device and inode, through any
/// path or link): replacing a file with itself copies nothing. A destination that does not
/// exist yet cannot be the source.
fn refuse_same_file(src: &std::path::Path, dst: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(s), Ok(d)) = (std::fs::metadata(src), std::fs::metadata(dst)) else {
        return Ok(());
    };
    if (s.dev(), s.ino()) == (d.dev(), d.ino()) {
        return Err(Error::Config(format!(
            "{} and {} are the same file: there is nothing to copy",
            src.display(),
            dst.display()
        )));
    }
    Ok(())
}

/// Copies `src` (its first `opts.size` bytes when given) into host memory and, when `dst` is
/// given, out to `dst`, created or (with `opts.replace.overwrite`) replaced whole.
///
/// Errors, all before the destination is touched unless said: [`Error::Config`] (a window
/// below [`MIN_WINDOW`], source and destination the same file, a pseudo file longer than
/// [`PSEUDO_FILE_MAX`]); [`Error::NotAFile`] (either end a directory, device, FIFO or socket);
/// [`Error::Exists`]; [`Error::ShortFile`] (`opts.size` beyond the source's end);
/// [`Error::NoSpace`] (the destination's file system too small: when reserving, or while
/// writing, with the bytes needed and written); [`Error::Open`], [`Error::Io`].
pub fn copy_file(
    agent: &Agent,
    src: &std::path::Path,
    dst: Option<&std::path::Path>,
    opts: &CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyReport> {
    // Each window is one transfer per leg: below a page the per-transfer cost dominates and a
    // large file takes minutes (a 3-byte window was seen to run for minutes).
    if opts.window < MIN_WINDOW {
        return Err(Error::Config(format!(
            "copy window of {} bytes is below the minimum of {MIN_WINDOW} bytes (4 KiB)",
            opts.window
        )));
    }
    if let Some(d) = dst {
        gdpath::file::check_regular(d)?;
        refuse_same_file(src, d)?;
    }
    let src_r = agent.register(Memory::File(FileSpec::read(src).direct(opts.direct)))?;
    let stat_size = src_r.len()?;
    if is_pseudo_file(src, stat_size) {
        drop(src_r);
        return copy_pseudo_file(agent, src, stat_size, dst, opts, progress);
    }
    let size = match opts.size {
        Some(n) if n > stat_size => {
            return Err(Error::ShortFile {
                path: src.to_owned(),
                offset: 0,
                wanted: n,
                available: stat_size,
            })
        }
        Some(n) => n,
        None => stat_size,
    };
    let mut out = match dst {
        Some(d) => {
            let mut f = AtomicFile::create(d, opts.replace)?;
            f.reserve(size)?;
            Some(f)
        }
        None => None,
    };
    let dst_r = match &out {
        Some(f) => Some(agent.register(f.memory(opts.direct)?)?),
        None => None,
    };
    let w = opts.window.min(size.max(1));
    let bufs = [
        agent.register(Memory::host(HostBuffer::zeroed(w as usize)))?,
        agent.register(Memory::host(HostBuffer::zeroed(w as usize)))?,
    ];
    let n = size.div_ceil(w);
    let span = |i: u64| (i * w, (size - i * w).min(w));
    let post = |op: Op, b: &Region, file: &Region, i: u64| {
        let (off, len) = span(i);
        agent.post(TransferRequest::new(
            op,
            vec![b.desc(0, len)],
            vec![file.desc(off, len)],
        ))
    };
    progress.start("copy", size);
    let mut read_leg = None;
    let mut write_leg = None;
    let mut src_hash = Checksum::new();
    let mut written = 0u64;
    // A failed write is said in terms of the destination: which file, bytes needed and written.
    let wrote = |t: Transfer, written: &mut u64, leg_of: &mut Option<Leg>| -> Result<()> {
        let r = wait(t).map_err(|e| match &out {
            Some(f) => f.explain(e, *written),
            None => e,
        })?;
        leg(&r, leg_of);
        *written += r.bytes;
        progress.advance(r.bytes);
        Ok(())
    };
    let t0 = Instant::now();
    let mut reading = if n > 0 {
        Some(post(Op::Read, &bufs[0], &src_r, 0)?)
    } else {
        None
    };
    let mut writes: [Option<Transfer>; 2] = [None, None];
    for i in 0..n {
        let b = (i % 2) as usize;
        let r = wait(reading.take().expect("a read is posted for every window"))?;
        leg(&r, &mut read_leg);
        let (_, len) = span(i);
        if opts.verify {
            src_hash.update(&bufs[b].host_view()?[..len as usize]);
        }
        if let Some(d) = &dst_r {
            writes[b] = Some(post(Op::Write, &bufs[b], d, i)?);
        } else {
            progress.advance(len);
        }
        if i + 1 < n {
            let nb = 1 - b;
            if let Some(t) = writes[nb].take() {
                wrote(t, &mut written, &mut write_leg)?;
            }
            reading = Some(post(Op::Read, &bufs[nb], &src_r, i + 1)?);
        }
    }
    for t in writes.iter_mut().filter_map(Option::take) {
        wrote(t, &mut written, &mut write_leg)?;
    }
    let elapsed = t0.elapsed();
    progress.finish();
    drop(dst_r);
    let verified = match (opts.verify, &out) {
        (false, _) => None,
        // Into memory only: compare with a plain read of the source.
        (true, None) => Some(plain_hash(src, size)? == src_hash.digest()),
        (true, Some(f)) => Some(
            temporary_checksum(f, size)? == src_hash.digest()
                && plain_hash(src, size)? == src_hash.digest(),
        ),
    };
    let mut report = CopyReport::new(size, elapsed, [read_leg, write_leg], verified, None);
    report.dst_file = out.as_ref().and_then(linked_file);
    if let Some(f) = out.take() {
        if verified != Some(false) {
            f.commit()?;
        }
    }
    Ok(report)
}

/// Largest pseudo file (procfs, sysfs: a `stat` size that is not the length) that
/// [`copy_file`] reads, in bytes: 64 MiB. Such files are generated on reading, so their length
/// is only known at their end; this bounds the memory that takes.
pub const PSEUDO_FILE_MAX: u64 = 64 << 20;

/// Whether `path` is a file whose `stat` size (`stat_size` bytes) does not give its length: on
/// procfs, sysfs, debugfs, tracefs, securityfs, configfs or a cgroup file system (file system
/// magic from `statfs`), or a file of size 0 that reads data (another generated file).
fn is_pseudo_file(path: &std::path::Path, stat_size: u64) -> bool {
    use nix::sys::statfs::{
        statfs, FsType, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC, DEBUGFS_MAGIC, PROC_SUPER_MAGIC,
        SECURITYFS_MAGIC, SYSFS_MAGIC, TRACEFS_MAGIC,
    };
    // configfs (linux/magic.h); nix names no constant for it.
    const CONFIGFS_MAGIC: FsType = FsType(0x6265_6570);
    let pseudo = statfs(path).is_ok_and(|s| {
        let t = s.filesystem_type();
        [
            PROC_SUPER_MAGIC,
            SYSFS_MAGIC,
            DEBUGFS_MAGIC,
            TRACEFS_MAGIC,
            SECURITYFS_MAGIC,
            CGROUP_SUPER_MAGIC,
            CGROUP2_SUPER_MAGIC,
        ]
        .contains(&t)
            || t == CONFIGFS_MAGIC
    });
    pseudo || (stat_size == 0 && reads_data(path))
}

/// [`copy_file`] of a pseudo file: `read(2)` to its end (at most `opts.size` bytes), into host
/// memory, then one engine write to the destination.
fn copy_pseudo_file(
    agent: &Agent,
    src: &std::path::Path,
    stat_size: u64,
    dst: Option<&std::path::Path>,
    opts: &CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyReport> {
    use std::io::Read;
    let limit = opts.size.unwrap_or(PSEUDO_FILE_MAX).min(PSEUDO_FILE_MAX);
    let t0 = Instant::now();
    gdpath::file::check_regular(src)?;
    let f = std::fs::File::open(src).map_err(|e| Error::Open {
        path: src.to_owned(),
        source: e.into(),
    })?;
    let mut data = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut data)
        .map_err(|e| Error::io("read", src, 0, e))?;
    if data.len() as u64 > limit {
        if opts.size.is_some() {
            data.truncate(limit as usize);
        } else {
            return Err(Error::Config(format!(
                "{} is a generated file (procfs, sysfs) longer than {} bytes: pass --size to                  copy its first bytes",
                src.display(),
                PSEUDO_FILE_MAX
            )));
        }
    }
    if let Some(n) = opts.size.filter(|&n| n > data.len() as u64) {
        return Err(Error::ShortFile {
            path: src.to_owned(),
            offset: 0,
            wanted: n,
            available: data.len() as u64,
        });
    }
    let size = data.len() as u64;
    progress.start("copy", size);
    let read_leg = Some(Leg {
        path: DataPath::PosixBuffered,
        finding: None,
    });
    let mut write_leg = None;
    // Into memory only there is one read, nothing to compare it with: not verified.
    let mut verified = None;
    let mut dst_file = None;
    if let Some(d) = dst {
        let mut out = AtomicFile::create(d, opts.replace)?;
        out.reserve(size)?;
        if size > 0 {
            let buf = agent.register(Memory::host(HostBuffer::from_slice(&data)))?;
            let file = agent.register(out.memory(opts.direct)?)?;
            let r = agent
                .post(TransferRequest::write(
                    vec![buf.desc(0, size)],
                    vec![file.desc(0, size)],
                ))?
                .wait()
                .map_err(|e| out.explain(e.error, 0))?;
            leg(&r, &mut write_leg);
        }
        if opts.verify {
            verified = Some(temporary_checksum(&out, size)? == Checksum::of(&data));
        }
        dst_file = linked_file(&out);
        if verified != Some(false) {
            out.commit()?;
        }
    }
    progress.advance(size);
    progress.finish();
    let elapsed = t0.elapsed();
    let note = Some(format!(
        "{} is a generated file (stat size {stat_size} bytes): read with read(2) to its \
         end, {size} bytes",
        src.display()
    ));
    let mut report = CopyReport::new(size, elapsed, [read_leg, write_leg], verified, note);
    report.dst_file = dst_file;
    Ok(report)
}

/// The real file `f` writes when its destination was given as a symbolic link.
pub(crate) fn linked_file(f: &AtomicFile) -> Option<PathBuf> {
    f.through_link().then(|| f.target().to_owned())
}

fn plain_hash(path: &std::path::Path, len: u64) -> Result<u64> {
    crate::files::checksum_file(path, Some(len), &crate::NoProgress)
}

/// Whether reading `path` yields at least one byte (for files whose stat size is 0).
fn reads_data(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut b = [0u8; 1];
    std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut b))
        .is_ok_and(|n| n > 0)
}
