//! `gdpath copy FILE gpu:N[@offset]` and `gdpath copy gpu:N[@offset] FILE`: one file ↔ GPU
//! transfer on the path the planner picks, with the path, the finding and GB/s.

use crate::files::checksum_file;
use crate::gds::{gpu_checksum, gpu_fill_pattern};
use gdpath::file::{AtomicFile, AtomicFileExt, ReplaceOptions};
use gdpath::{
    Agent, DataPath, Error, FileSpec, FindingId, Memory, PlannedPair, Result, TransferRequest,
};
use serde::Serialize;
use std::time::{Duration, Instant};

/// `gpu:N` or `gpu:N@OFFSET` (offset in bytes, with the units of [`gdpath::units::parse_size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuEndpoint {
    /// CUDA ordinal of the GPU.
    pub ordinal: u32,
    /// Bytes from the start of the GPU buffer.
    pub offset: u64,
}

impl GpuEndpoint {
    /// `None` when `s` does not start with `gpu:`; `Some(Err)` when it does but is malformed.
    pub fn parse(s: &str) -> Option<std::result::Result<GpuEndpoint, String>> {
        let rest = s.strip_prefix("gpu:")?;
        let (n, off) = match rest.split_once('@') {
            Some((n, o)) => (n, Some(o)),
            None => (rest, None),
        };
        let ordinal = match n.parse::<u32>() {
            Ok(v) => v,
            Err(_) => {
                return Some(Err(format!(
                    "{s}: expected gpu:N[@offset], N a GPU ordinal"
                )))
            }
        };
        let offset = match off.map(gdpath::units::parse_size) {
            None => 0,
            Some(Ok(v)) => v,
            Some(Err(e)) => return Some(Err(format!("{s}: offset: {e}"))),
        };
        Some(Ok(GpuEndpoint { ordinal, offset }))
    }
}

/// The result of a file ↔ GPU copy.
#[derive(Debug, Clone, Serialize)]
pub struct GpuCopyReport {
    /// Bytes copied.
    pub bytes: u64,
    /// Transfer time (first I/O to last completion).
    pub elapsed: Duration,
    /// GB/s (1e9 B/s) of `elapsed`.
    pub gbps: f64,
    /// The path the transfer took (GDS, cuFile's compatibility mode, or staged through host
    /// memory).
    pub path: DataPath,
    /// Why the preferred path was not taken.
    pub finding: Option<FindingId>,
    /// The planner's evidence (e.g. cuFile's refusal).
    pub detail: Option<String>,
    /// Checksums of source and destination matched (`None`: not verified).
    pub verified: Option<bool>,
    /// When the destination file given is a symbolic link: the real path of the file it leads
    /// to, the one written (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_file: Option<std::path::PathBuf>,
}

fn report(
    bytes: u64,
    elapsed: Duration,
    plan: Option<PlannedPair>,
    verified: Option<bool>,
) -> GpuCopyReport {
    let plan = plan.expect("one pair planned");
    GpuCopyReport {
        bytes,
        elapsed,
        gbps: gdpath::units::gbps(bytes, elapsed),
        path: plan.path,
        finding: plan.finding,
        detail: plan.detail,
        verified,
        dst_file: None,
    }
}

/// XXH3 of the first `len` bytes of `file`.
fn file_checksum(file: &std::path::Path, len: u64) -> Result<u64> {
    checksum_file(file, Some(len), &crate::NoProgress)
}

/// Reads `file` (its first `size` bytes when given, else all of it) into a new allocation of
/// `offset + len` bytes on GPU `ep.ordinal`, at `ep.offset`. `verify` compares XXH3 of the
/// file and of the GPU bytes read back. Errors: as registering and reading the file
/// ([`Error::NotAFile`], [`Error::Open`]), [`Error::ShortFile`] for a `size` beyond its end,
/// GPU allocation and transfer errors.
pub fn file_to_gpu(
    agent: &Agent,
    file: &std::path::Path,
    ep: GpuEndpoint,
    size: Option<u64>,
    verify: bool,
) -> Result<GpuCopyReport> {
    let f = agent.register(Memory::File(FileSpec::read(file)))?;
    let have = f.len()?;
    let len = match size {
        Some(n) if n > have => {
            return Err(Error::ShortFile {
                path: file.to_owned(),
                offset: 0,
                wanted: n,
                available: have,
            })
        }
        Some(n) => n,
        None => have,
    };
    let gpu = agent.register(Memory::Gpu {
        ordinal: ep.ordinal,
        len: ep
            .offset
            .checked_add(len)
            .ok_or_else(|| Error::Config("offset + file length overflows".into()))?
            .max(1),
    })?;
    let req = || TransferRequest::read(vec![gpu.desc(ep.offset, len)], vec![f.desc(0, len)]);
    let plan = agent.plan(&req())?.into_iter().next();
    let t = Instant::now();
    agent.post(req())?.wait().map_err(|e| e.error)?;
    let elapsed = t.elapsed();
    let verified = if verify {
        let g = {
            // Checksum of the copied range only: read it back from offset.
            let probe = agent.register(Memory::Gpu {
                ordinal: ep.ordinal,
                len: len.max(1),
            })?;
            agent
                .post(TransferRequest::write(
                    vec![gpu.desc(ep.offset, len)],
                    vec![probe.desc(0, len)],
                ))?
                .wait()
                .map_err(|e| e.error)?;
            gpu_checksum(agent, &probe, len)?
        };
        Some(g == file_checksum(file, len)?)
    } else {
        None
    };
    Ok(report(len, elapsed, plan, verified))
}

/// Writes `len` bytes of GPU memory (a new allocation on `ep.ordinal`, filled with a test
/// pattern at `ep.offset`) to `file`, created or (with `replace.overwrite`) replaced whole
/// through an [`AtomicFile`]. `verify` compares XXH3 of the pattern and of the file; a file that
/// does not match is not committed. Errors: [`Error::NotAFile`], [`Error::Exists`] and
/// [`Error::NoSpace`] before any GPU memory is allocated; GPU, transfer and file errors.
pub fn gpu_to_file(
    agent: &Agent,
    ep: GpuEndpoint,
    len: u64,
    file: &std::path::Path,
    verify: bool,
    replace: ReplaceOptions,
) -> Result<GpuCopyReport> {
    let mut out = AtomicFile::create(file, replace)?;
    out.reserve(len)?;
    let total = ep
        .offset
        .checked_add(len)
        .ok_or_else(|| Error::Config("offset + length overflows".into()))?;
    let gpu = agent.register(Memory::Gpu {
        ordinal: ep.ordinal,
        len: total.max(1),
    })?;
    let staged = agent.register(Memory::Gpu {
        ordinal: ep.ordinal,
        len: len.max(1),
    })?;
    let want = gpu_fill_pattern(agent, &staged, len, 0x5eed)?;
    agent
        .post(TransferRequest::write(
            vec![staged.desc(0, len)],
            vec![gpu.desc(ep.offset, len)],
        ))?
        .wait()
        .map_err(|e| e.error)?;
    drop(staged);
    let f = agent.register(out.memory(gdpath::DirectIo::Auto)?)?;
    let req = || TransferRequest::write(vec![gpu.desc(ep.offset, len)], vec![f.desc(0, len)]);
    let plan = agent.plan(&req())?.into_iter().next();
    let t = Instant::now();
    agent
        .post(req())?
        .wait()
        .map_err(|e| out.explain(e.error, 0))?;
    let elapsed = t.elapsed();
    drop(f);
    let verified = if verify {
        Some(crate::files::temporary_checksum(&out, len)? == want)
    } else {
        None
    };
    let mut r = report(len, elapsed, plan, verified);
    r.dst_file = crate::copy::linked_file(&out);
    if verified != Some(false) {
        out.commit()?;
    }
    Ok(r)
}
