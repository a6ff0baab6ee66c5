//! `gdpath copy`: a file into host memory and (optionally) out to another file, streaming
//! through two registered host windows so memory stays bounded whatever the file size.
//!
//! Pipeline: window `w` is read into buffer `w % 2`, then written out while window `w + 1` is
//! read into the other buffer. Memory held: 2 × `window` bytes of host memory plus the engine's
//! bounce budget.

use crate::{Checksum, Progress};
use gdpath::{
    Agent, DirectIo, Error, FileAccess, FileSpec, FindingId, HostBuffer, Memory, Op, Path, Region,
    Result, Transfer, TransferReport, TransferRequest,
};
use serde::Serialize;
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
    /// Checksum the data read from the source (in host memory) and the destination read back.
    pub verify: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            window: DEFAULT_WINDOW,
            direct: DirectIo::Auto,
            verify: false,
        }
    }
}

/// The path one leg (file → host, or host → file) took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leg {
    pub path: Path,
    /// Why the preferred path was not used.
    pub finding: Option<FindingId>,
}

/// The result of a copy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyReport {
    pub bytes: u64,
    pub elapsed: Duration,
    /// GB/s (1e9 B/s) end to end.
    pub gbps: f64,
    /// Source file → host memory.
    pub read: Option<Leg>,
    /// Host memory → destination file (absent when copying into memory only).
    pub write: Option<Leg>,
    /// Checksums matched (`None` when not verified).
    pub verified: Option<bool>,
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
/// path or link): opening the destination truncates it, which would destroy the source before a
/// byte is read. A destination that does not exist yet cannot be the source.
fn refuse_same_file(src: &std::path::Path, dst: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(s), Ok(d)) = (std::fs::metadata(src), std::fs::metadata(dst)) else {
        return Ok(());
    };
    if (s.dev(), s.ino()) == (d.dev(), d.ino()) {
        return Err(Error::Config(format!(
            "{} and {} are the same file: copying it onto itself would truncate it first",
            src.display(),
            dst.display()
        )));
    }
    Ok(())
}

/// Copies `src` into host memory and, when `dst` is given, out to `dst` (created or truncated).
/// Errors: typed file errors ([`Error::Open`], [`Error::NotAFile`], [`Error::Io`], ...).
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
        refuse_same_file(src, d)?;
    }
    let src_r = agent.register(Memory::File(FileSpec::read(src).direct(opts.direct)))?;
    let size = src_r.len()?;
    if size == 0 && reads_data(src) {
        // procfs/sysfs files report size 0 but have contents: copying "0 bytes" would lose
        // them silently.
        return Err(Error::Config(format!(
            "{} reports a size of 0 but has contents (a procfs or sysfs file?): its size is \
             not known in advance, so it cannot be copied by descriptors; use cat or cp",
            src.display()
        )));
    }
    let dst_r = match dst {
        Some(d) => Some(
            agent.register(Memory::File(
                FileSpec::write(d)
                    .access(FileAccess::Create { truncate: true })
                    .direct(opts.direct),
            ))?,
        ),
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
                let r = wait(t)?;
                leg(&r, &mut write_leg);
                progress.advance(r.bytes);
            }
            reading = Some(post(Op::Read, &bufs[nb], &src_r, i + 1)?);
        }
    }
    for t in writes.iter_mut().filter_map(Option::take) {
        let r = wait(t)?;
        leg(&r, &mut write_leg);
        progress.advance(r.bytes);
    }
    let elapsed = t0.elapsed();
    progress.finish();
    let verified = match (opts.verify, dst) {
        (false, _) => None,
        (true, None) => {
            // Into memory only: compare with a plain read of the source.
            Some(plain_hash(src)? == src_hash.digest())
        }
        (true, Some(d)) => {
            Some(plain_hash(d)? == src_hash.digest() && plain_hash(src)? == src_hash.digest())
        }
    };
    Ok(CopyReport {
        bytes: size,
        elapsed,
        gbps: gdpath::units::gbps(size, elapsed),
        read: read_leg,
        write: write_leg,
        verified,
    })
}

fn plain_hash(path: &std::path::Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::Open {
        path: path.to_owned(),
        source: e.into(),
    })?;
    let mut h = Checksum::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io("read", path, 0, e))?;
        if n == 0 {
            return Ok(h.digest());
        }
        h.update(&buf[..n]);
    }
}

/// Whether reading `path` yields at least one byte (for files whose stat size is 0).
fn reads_data(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut b = [0u8; 1];
    std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut b))
        .is_ok_and(|n| n > 0)
}
