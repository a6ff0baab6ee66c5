//! Saving tensors as a safetensors checkpoint: the header as the `safetensors` package writes
//! it, the data moved by the engine from GPU or host memory, the file replaced whole.
//!
//! Order and header (what `safetensors`' (0.4 to 0.8) `serialize_to_file` does, so the files read
//! back the same with it): tensors sorted by dtype, largest alignment first, then by name; data
//! laid out in that order without gaps; the JSON header compact, `__metadata__` first (its keys
//! sorted here; the package's order is a hash map's), then the tensors in data order, padded
//! with spaces to a multiple of 8 bytes.
//!
//! Data: one transfer of one descriptor pair per run of tensors that lie back to back in one
//! region in data order (a checkpoint loaded by [`super::load`] and saved again is one pair),
//! on the path the planner picks per pair — GDS (`gds-native`) where cuFile registers the
//! file, else the pinned staging path with parallel writers (`posix-direct` /
//! `posix-buffered`) for GPU memory, and the storage backends for host memory.
//!
//! Safety: through [`gdpath::file::AtomicFile`]: a temporary in the target's directory, space
//! reserved first (a full file system fails before a byte is written), `fsync` of the file,
//! rename over the target, `fsync` of the directory. A crash or a kill at any point leaves the
//! old file or the new one; the temporary of a killed run is removed by the next save of the
//! same target.

use super::{tensor_bytes, Dtype};
use gdpath::error::Error;
use gdpath::file::{AtomicFile, AtomicFileExt, ReplaceOptions};
use gdpath::memory::MemoryKind;
use gdpath::path::DataPath;
use gdpath::Agent;
use gdpath::Region;
use gdpath::TransferRequest;
use serde::ser::{SerializeMap, Serializer};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One tensor to save: `bytes` bytes at `offset` of a registered region (GPU or host memory),
/// row-major, of `dtype` and `shape`.
#[derive(Debug, Clone)]
pub struct SaveTensor {
    /// The name the header gives it (any UTF-8 but `__metadata__`).
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Shape, row-major (C order); `[]` is a scalar.
    pub shape: Vec<u64>,
    /// The memory holding its bytes: `Memory::Gpu`, host memory (pageable or pinned), or
    /// borrowed GPU/host memory (a PyTorch or CuPy tensor's).
    pub region: Region,
    /// Byte offset of its first byte in `region`.
    pub offset: u64,
    /// Its length in bytes: must be `product(shape) × dtype size`.
    pub bytes: u64,
}

impl SaveTensor {
    /// A tensor of `product(shape) × dtype size` bytes ([`tensor_bytes`]) at `offset` of
    /// `region` (`u64::MAX` bytes for a shape that overflows, which [`save`] refuses).
    pub fn new(
        name: impl Into<String>,
        dtype: Dtype,
        shape: Vec<u64>,
        region: &Region,
        offset: u64,
    ) -> SaveTensor {
        let bytes = tensor_bytes(dtype, shape.iter().copied()).unwrap_or(u64::MAX);
        SaveTensor {
            name: name.into(),
            dtype,
            shape,
            region: region.clone(),
            offset,
            bytes,
        }
    }
}

/// How [`save`] treats an existing file, durability, and what it writes besides the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveOptions {
    /// Replace a file that exists (default `false`: [`SaveError::Engine`] with
    /// [`Error::Exists`], nothing written).
    pub overwrite: bool,
    /// `fsync` the file before it takes its name and the directory after (default `true`).
    /// Off for scratch data: a process kill still never leaves a torn file, a power loss may
    /// leave the old or an empty one. The report says which was done.
    pub fsync: bool,
    /// The header's `__metadata__` string map (none written when empty).
    pub metadata: BTreeMap<String, String>,
    /// O_DIRECT policy of the file (default `Auto`: where the file system allows it).
    pub direct: gdpath::DirectIo,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            overwrite: false,
            fsync: true,
            metadata: BTreeMap::new(),
            direct: gdpath::DirectIo::Auto,
        }
    }
}

/// What a save did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SaveReport {
    /// The file written: the path given, or, when that is a symbolic link, the real path of
    /// the file it leads to ([`crate::file::AtomicFile::target`]).
    pub path: PathBuf,
    /// Whether the path given was a symbolic link, followed to `path` (not serialised: `path`
    /// says which file was written).
    #[serde(skip)]
    pub through_link: bool,
    /// Tensors saved.
    pub tensors: usize,
    /// Bytes of tensor data (the data section).
    pub tensor_bytes: u64,
    /// Bytes of the header: 8 + the padded JSON.
    pub header_bytes: u64,
    /// The file's length in bytes (`header_bytes + tensor_bytes`).
    pub file_bytes: u64,
    /// Descriptor pairs of the data transfer (runs of tensors back to back in one region).
    pub pairs: usize,
    /// Distinct paths that moved the data, in first-use order (`gds-native`,
    /// `posix-direct`, `posix-buffered`, ...); empty when there was no data. Serialised as
    /// the names.
    #[serde(serialize_with = "path_names")]
    pub paths: Vec<DataPath>,
    /// Why the preferred path was not taken for the first pair, when it was not (e.g.
    /// `gds.handle-register-failed`).
    pub finding: Option<String>,
    /// The planner's evidence for `finding`.
    pub detail: Option<String>,
    /// Whether the file and its directory were fsynced ([`SaveOptions::fsync`]).
    pub fsync: bool,
    /// Whether an existing file was replaced.
    pub replaced: bool,
    /// Wall time of the whole save: checks, temporary, header, data, fsync and rename.
    #[serde(serialize_with = "secs")]
    pub elapsed: Duration,
    /// Time of the data transfer alone.
    #[serde(serialize_with = "secs")]
    pub transfer: Duration,
    /// Time of the commit: fsync of the file, rename, fsync of the directory.
    #[serde(serialize_with = "secs")]
    pub commit: Duration,
}

fn path_names<S: Serializer>(paths: &[DataPath], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(paths.iter().map(DataPath::name))
}

fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl SaveReport {
    /// File bytes per second of [`SaveReport::elapsed`] (fsync included when on), GB/s
    /// (1e9 B/s).
    pub fn gbps(&self) -> f64 {
        gdpath::units::gbps(self.file_bytes, self.elapsed)
    }
}

/// Why a save failed. Tensor variants name the tensor; nothing was created for them.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SaveError {
    /// Two tensors have the same name.
    #[error("tensor name {name:?} is given twice")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// `__metadata__` is the header's metadata key, not a tensor name.
    #[error("tensor name {name:?} is reserved for the header's metadata")]
    ReservedName {
        /// The name given (`__metadata__`).
        name: String,
    },
    /// `product(shape) × dtype size` overflows 64 bits.
    #[error("tensor {name:?}: shape {shape:?} overflows 64-bit byte counts or is not whole bytes")]
    ShapeOverflow {
        /// The tensor's name.
        name: String,
        /// Its shape, one extent per dimension.
        shape: Vec<u64>,
    },
    /// The tensor's byte count is not `product(shape) × dtype size`.
    #[error("tensor {name:?}: {dtype:?} {shape:?} needs {expected} bytes, {actual} given")]
    SizeMismatch {
        /// The tensor's name.
        name: String,
        /// Its element type.
        dtype: Dtype,
        /// Its shape, one extent per dimension.
        shape: Vec<u64>,
        /// Bytes the shape and dtype need.
        expected: u64,
        /// Bytes given ([`SaveTensor::bytes`]).
        actual: u64,
    },
    /// The tensor's bytes reach past the end of its region (or `offset + bytes` overflows).
    #[error(
        "tensor {name:?}: bytes [{offset}, {offset} + {bytes}) reach past its {region_len}-byte region"
    )]
    OutOfRange {
        /// The tensor's name.
        name: String,
        /// Byte offset of its first byte in its region.
        offset: u64,
        /// Its length in bytes.
        bytes: u64,
        /// The region's length in bytes.
        region_len: u64,
    },
    /// The tensor's region is not GPU or host memory (a file, a remote region).
    #[error("tensor {name:?}: its region is {kind}, not GPU or host memory")]
    NotMemory {
        /// The tensor's name.
        name: String,
        /// What the region is instead (its memory kind's name).
        kind: String,
    },
    /// The header would be larger than readers accept ([`super::MAX_HEADER_BYTES`]).
    #[error("the header would be {len} bytes, above the {max}-byte limit readers accept")]
    HeaderTooLarge {
        /// The header's length in bytes.
        len: u64,
        /// The limit in bytes, [`super::MAX_HEADER_BYTES`].
        max: u64,
    },
    /// Creating, writing, syncing or renaming the file failed, or the transfer did:
    /// [`Error::Exists`] (no `overwrite`), [`Error::NoSpace`] (a full file system, the figure
    /// needed and written), [`Error::Io`], [`Error::Open`], the engine's transfer errors. The
    /// target is as it was, and the temporary is removed. (`error` names the file already.)
    #[error("save: {error}")]
    Engine {
        /// The checkpoint file being written.
        path: PathBuf,
        /// The engine's error, with its kind.
        #[source]
        error: Box<Error>,
    },
}

impl SaveError {
    /// The error's kind for scripts: `checkpoint` for the tensor variants (the tensors do not
    /// make a valid checkpoint), the engine's [`Error::kind`] for the rest (`exists`,
    /// `no_space`, `io`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            SaveError::Engine { error, .. } => error.kind(),
            _ => "checkpoint",
        }
    }
}

/// A tensor in file order, with its data-section range.
struct Placed<'a> {
    t: &'a SaveTensor,
    begin: u64,
}

/// The header bytes (8-byte length, padded JSON) and the tensors in file order.
fn layout<'a>(
    tensors: &'a [SaveTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<Placed<'a>>), SaveError> {
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    for t in tensors {
        if t.name == "__metadata__" {
            return Err(SaveError::ReservedName {
                name: t.name.clone(),
            });
        }
        if !seen.insert(t.name.as_str()) {
            return Err(SaveError::DuplicateName {
                name: t.name.clone(),
            });
        }
        let expected =
            tensor_bytes(t.dtype, t.shape.iter().copied()).filter(|&n| usize::try_from(n).is_ok());
        let Some(expected) = expected else {
            return Err(SaveError::ShapeOverflow {
                name: t.name.clone(),
                shape: t.shape.clone(),
            });
        };
        if expected != t.bytes {
            return Err(SaveError::SizeMismatch {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                expected,
                actual: t.bytes,
            });
        }
        match t.region.kind() {
            MemoryKind::Gpu { .. } | MemoryKind::Host { .. } => {}
            k => {
                return Err(SaveError::NotMemory {
                    name: t.name.clone(),
                    kind: k.to_string(),
                })
            }
        }
        let region_len = t.region.len().unwrap_or(0);
        if t.offset.checked_add(t.bytes).is_none_or(|e| e > region_len) {
            return Err(SaveError::OutOfRange {
                name: t.name.clone(),
                offset: t.offset,
                bytes: t.bytes,
                region_len,
            });
        }
    }
    let mut order: Vec<&SaveTensor> = tensors.iter().collect();
    order.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
    let mut placed = Vec::with_capacity(order.len());
    let mut at = 0u64;
    for t in order {
        let end = at.checked_add(t.bytes).ok_or(SaveError::ShapeOverflow {
            name: t.name.clone(),
            shape: t.shape.clone(),
        })?;
        placed.push(Placed { t, begin: at });
        at = end;
    }
    let json = header_json(&placed, metadata);
    let len = json.len() as u64;
    if len > super::MAX_HEADER_BYTES {
        return Err(SaveError::HeaderTooLarge {
            len,
            max: super::MAX_HEADER_BYTES,
        });
    }
    let mut header = Vec::with_capacity(8 + json.len());
    header.extend_from_slice(&len.to_le_bytes());
    header.extend_from_slice(&json);
    Ok((header, placed))
}

/// The JSON header, compact, padded with spaces to a multiple of 8 bytes.
fn header_json(placed: &[Placed<'_>], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Entry<'a> {
        dtype: Dtype,
        shape: &'a [u64],
        data_offsets: (u64, u64),
    }
    let mut out = Vec::with_capacity(64 + 96 * placed.len());
    let mut ser = serde_json::Serializer::new(&mut out);
    // Serialising strings, integers and a known enum into a Vec cannot fail.
    let mut map = ser
        .serialize_map(Some(placed.len() + usize::from(!metadata.is_empty())))
        .expect("in-memory JSON");
    if !metadata.is_empty() {
        map.serialize_entry("__metadata__", metadata)
            .expect("in-memory JSON");
    }
    for p in placed {
        let e = Entry {
            dtype: p.t.dtype,
            shape: &p.t.shape,
            data_offsets: (p.begin, p.begin + p.t.bytes),
        };
        map.serialize_entry(&p.t.name, &e).expect("in-memory JSON");
    }
    map.end().expect("in-memory JSON");
    out.resize(out.len().next_multiple_of(8), b' ');
    out
}

/// One descriptor pair: region bytes `[src, src + len)` to data-section bytes
/// `[dst, dst + len)`.
struct Run<'a> {
    region: &'a Region,
    src: u64,
    dst: u64,
    len: u64,
}

/// Tensors back to back in one region, in file order, merged into runs (empty tensors need
/// none).
fn runs<'a>(placed: &[Placed<'a>]) -> Vec<Run<'a>> {
    let mut out: Vec<Run<'a>> = Vec::new();
    for p in placed.iter().filter(|p| p.t.bytes > 0) {
        if let Some(last) = out.last_mut() {
            if last.region.id() == p.t.region.id()
                && last.src + last.len == p.t.offset
                && last.dst + last.len == p.begin
            {
                last.len += p.t.bytes;
                continue;
            }
        }
        out.push(Run {
            region: &p.t.region,
            src: p.t.offset,
            dst: p.begin,
            len: p.t.bytes,
        });
    }
    out
}

/// Saves `tensors` as the safetensors file `file` (see the module docs for order, paths and
/// crash safety): checks every tensor first (nothing is created for a bad one), writes the
/// header and then the data with one engine transfer, syncs (unless `opts.fsync` is off) and
/// renames over `file`.
///
/// Errors: the tensor variants of [`SaveError`] naming the tensor; [`SaveError::Engine`] for
/// the file and the transfer (`Error::Exists` without `opts.overwrite`, `Error::NoSpace` for a
/// full file system, checked before any data is written) — the target is then as it was.
pub fn save(
    agent: &Agent,
    tensors: &[SaveTensor],
    file: &std::path::Path,
    opts: &SaveOptions,
) -> Result<SaveReport, SaveError> {
    let t0 = Instant::now();
    let (header, placed) = layout(tensors, &opts.metadata)?;
    let eng = |error: Error| SaveError::Engine {
        path: file.to_owned(),
        error: Box::new(error),
    };
    let tensor_bytes: u64 = placed.iter().map(|p| p.t.bytes).sum();
    let header_bytes = header.len() as u64;
    let file_bytes = header_bytes.checked_add(tensor_bytes).ok_or_else(|| {
        let last = placed.last().map(|p| p.t);
        SaveError::ShapeOverflow {
            name: last.map(|t| t.name.clone()).unwrap_or_default(),
            shape: last.map(|t| t.shape.clone()).unwrap_or_default(),
        }
    })?;
    let replace = ReplaceOptions {
        overwrite: opts.overwrite,
        fsync: opts.fsync,
    };
    let mut out = AtomicFile::create(file, replace).map_err(|e| eng(e.into()))?;
    out.reserve(file_bytes).map_err(|e| eng(e.into()))?;
    out.write_all(&header)
        .map_err(|e| eng(out.write_error(e).into()))?;
    let runs = runs(&placed);
    let (mut paths, mut finding, mut detail) = (Vec::new(), None, None);
    let mut transfer = Duration::ZERO;
    if !runs.is_empty() {
        let f = agent
            .register(out.memory(opts.direct).map_err(eng)?)
            .map_err(|e| eng(out.explain(e, header_bytes)))?;
        let local = runs.iter().map(|r| r.region.desc(r.src, r.len)).collect();
        let target = runs
            .iter()
            .map(|r| f.desc(header_bytes + r.dst, r.len))
            .collect();
        let t1 = Instant::now();
        let t = agent
            .post(TransferRequest::write(local, target))
            .map_err(|e| eng(out.explain(e, header_bytes)))?;
        if let Some(p) = t.plan().first() {
            finding = p.finding.as_ref().map(|f| f.as_str().to_owned());
            detail = p.detail.clone();
        }
        let report = t
            .wait()
            .map_err(|e| eng(out.explain(e.error, header_bytes)))?;
        transfer = t1.elapsed();
        paths = report.paths();
        drop(f);
    }
    // Every byte was written by a transfer that completed; a short file here is a bug or a
    // file system that lost writes, and must not take the target's name.
    let len = out
        .file()
        .metadata()
        .map_err(|e| eng(Error::io("fstat", out.temp_path(), 0, e)))?
        .len();
    if len != file_bytes {
        return Err(eng(Error::Backend {
            backend: "checkpoint",
            detail: format!(
                "the written file is {len} bytes, {file_bytes} expected: not replacing the target"
            ),
        }));
    }
    let path = out.target().to_owned();
    let through_link = out.through_link();
    let replaced = out.replaces();
    let t2 = Instant::now();
    out.commit().map_err(|e| eng(e.into()))?;
    let commit = t2.elapsed();
    Ok(SaveReport {
        path,
        through_link,
        tensors: placed.len(),
        tensor_bytes,
        header_bytes,
        file_bytes,
        pairs: runs.len(),
        paths,
        finding,
        detail,
        fsync: opts.fsync,
        replaced,
        elapsed: t0.elapsed(),
        transfer,
        commit,
    })
}

/// The tensors of a loaded checkpoint ([`super::LoadedCheckpoint`]) as tensors to save, in
/// place in its allocation (what `gdpath resave` saves).
pub fn loaded_tensors(loaded: &super::LoadedCheckpoint) -> Vec<SaveTensor> {
    loaded
        .tensors
        .iter()
        .map(|t| SaveTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            region: loaded.region.clone(),
            offset: t.offset,
            bytes: t.bytes(),
        })
        .collect()
}

/// The dtype the safetensors format names `name` (`"F32"`, `"BF16"`, `"F8_E4M3"`, ...: the
/// header's spelling), or `None` for a name it does not know.
pub fn dtype_named(name: &str) -> Option<Dtype> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

/// Compares the tensors of two safetensors files: the same names, dtypes and shapes, and the
/// same bytes for each (read in 8 MiB pieces; the files' orders and headers may differ). `None`
/// when they are equal, else the first difference in words. `gdpath resave` checks what it
/// wrote with it.
///
/// Errors: [`CheckpointError`] for a file that cannot be read or is not a valid checkpoint.
pub fn compare_files(
    a: &std::path::Path,
    b: &std::path::Path,
) -> Result<Option<String>, super::CheckpointError> {
    use std::os::unix::fs::FileExt;
    let (ha, hb) = (super::Header::read(a)?, super::Header::read(b)?);
    let mut na: Vec<_> = ha.tensors.iter().collect();
    let mut nb: Vec<_> = hb.tensors.iter().collect();
    na.sort_by(|x, y| x.name.cmp(&y.name));
    nb.sort_by(|x, y| x.name.cmp(&y.name));
    if na.len() != nb.len() {
        return Ok(Some(format!("{} tensors against {}", na.len(), nb.len())));
    }
    let open = |p: &std::path::Path| {
        std::fs::File::open(p).map_err(|e| super::CheckpointError::Open {
            path: p.to_owned(),
            source: e.into(),
        })
    };
    let (fa, fb) = (open(a)?, open(b)?);
    let read = |f: &std::fs::File, p: &std::path::Path, buf: &mut [u8], at: u64| {
        f.read_exact_at(buf, at)
            .map_err(|e| super::CheckpointError::Io {
                op: "read",
                path: p.to_owned(),
                source: e.into(),
            })
    };
    const PIECE: u64 = 8 << 20;
    let (mut ba, mut bb) = (vec![0u8; PIECE as usize], vec![0u8; PIECE as usize]);
    for (x, y) in na.iter().zip(&nb) {
        if (&x.name, x.dtype, &x.shape) != (&y.name, y.dtype, &y.shape) {
            return Ok(Some(format!(
                "tensor {:?} {:?} {:?} against {:?} {:?} {:?}",
                x.name, x.dtype, x.shape, y.name, y.dtype, y.shape
            )));
        }
        let mut done = 0;
        while done < x.bytes() {
            let n = (x.bytes() - done).min(PIECE) as usize;
            read(&fa, a, &mut ba[..n], x.file_range.start + done)?;
            read(&fb, b, &mut bb[..n], y.file_range.start + done)?;
            if ba[..n] != bb[..n] {
                let i = ba[..n].iter().zip(&bb[..n]).position(|(p, q)| p != q);
                return Ok(Some(format!(
                    "tensor {:?} differs at byte {}",
                    x.name,
                    done + i.unwrap_or(0) as u64
                )));
            }
            done += n as u64;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Checkpoint, Destination, Header};
    use gdpath::{AgentConfig, HostBuffer, Memory};

    const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    fn agent() -> Agent {
        Agent::new(AgentConfig::default()).unwrap()
    }

    /// Tensors of every dtype and several shapes (scalar, zero-size, 3-D) in one host region,
    /// with the bytes each must have in the file.
    fn every_dtype(agent: &Agent) -> (Vec<SaveTensor>, Vec<(String, Vec<u8>)>) {
        let shapes: [&[u64]; 5] = [&[3, 5], &[], &[0, 4], &[2, 1, 3], &[2, 4]];
        let mut data = Vec::new();
        let mut specs = Vec::new();
        for (i, dt) in ALL.iter().enumerate() {
            for (j, s) in shapes.iter().enumerate() {
                // Sub-byte dtypes (F4, F6) take only the shapes that fill whole bytes.
                let Some(n) = tensor_bytes(*dt, s.iter().copied()) else {
                    continue;
                };
                let off = data.len() as u64;
                data.extend((0..n).map(|k| (k as usize * 31 + i * 7 + j) as u8 | 1));
                specs.push((format!("{dt:?}.{j}"), *dt, s.to_vec(), off, n));
            }
        }
        let region = agent
            .register(Memory::host(HostBuffer::from_slice(&data)))
            .unwrap();
        let ts = specs
            .iter()
            .map(|(name, dt, s, off, _)| SaveTensor::new(name, *dt, s.clone(), &region, *off))
            .collect();
        let want = specs
            .into_iter()
            .map(|(name, _, _, off, n)| (name, data[off as usize..(off + n) as usize].to_vec()))
            .collect();
        (ts, want)
    }

    #[test]
    fn every_dtype_and_zero_size_tensors_read_back_equal_with_our_loader() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("all.safetensors");
        let (ts, want) = every_dtype(&a);
        let mut opts = SaveOptions::default();
        opts.metadata.insert("format".into(), "pt".into());
        let r = save(&a, &ts, &f, &opts).unwrap();
        assert_eq!(r.tensors, ts.len());
        assert!(r.fsync && !r.replaced);
        assert_eq!(std::fs::metadata(&f).unwrap().len(), r.file_bytes);
        assert_eq!(r.header_bytes % 8, 0);
        let h = Header::read(&f).unwrap();
        assert_eq!(h.metadata, vec![("format".into(), "pt".into())]);
        let ck = Checkpoint::open(&[&f]).unwrap();
        let loaded = ck
            .load(&a, Destination::Host { pinned: false }, None)
            .unwrap();
        let bytes = loaded.region.host_view().unwrap().to_vec();
        assert_eq!(loaded.tensors.len(), want.len());
        for (name, w) in &want {
            let t = loaded.tensors.iter().find(|t| &t.name == name).unwrap();
            let o = t.offset as usize;
            assert_eq!(&bytes[o..o + w.len()], &w[..], "{name}");
            let src = ts.iter().find(|s| &s.name == name).unwrap();
            assert_eq!((t.dtype, &t.shape), (src.dtype, &src.shape), "{name}");
        }
        // Largest alignment first, then by name (the safetensors package's order).
        let order: Vec<_> = h
            .tensors
            .iter()
            .map(|t| (t.dtype, t.name.clone()))
            .collect();
        let mut sorted = order.clone();
        sorted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        assert_eq!(order, sorted);
    }

    /// Save and load take a tensor's size from one rule ([`tensor_bytes`]): a zero-size
    /// tensor whose dims before the zero fit 64 bits is saved, and the loader reads it back,
    /// although its dims times the dtype's size would not fit.
    #[test]
    fn save_accepts_the_sizes_the_loader_accepts() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("z.safetensors");
        let region = a.register(Memory::host(HostBuffer::zeroed(8))).unwrap();
        let shape = vec![1 << 62, 0];
        assert_eq!(tensor_bytes(Dtype::F32, shape.clone()), Some(0));
        let t = SaveTensor::new("z", Dtype::F32, shape.clone(), &region, 0);
        assert_eq!(t.bytes, 0);
        save(&a, &[t], &f, &SaveOptions::default()).unwrap();
        let h = Header::read(&f).unwrap();
        assert_eq!(
            (h.tensors[0].shape.clone(), h.tensors[0].bytes()),
            (shape, 0)
        );
        assert_eq!(tensor_bytes(Dtype::F32, [u64::MAX, 2]), None);
    }

    #[test]
    fn bad_tensors_are_refused_by_name_before_anything_is_created() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.safetensors");
        let region = a.register(Memory::host(HostBuffer::zeroed(64))).unwrap();
        let t = |name: &str, shape: Vec<u64>, off: u64| {
            SaveTensor::new(name, Dtype::F32, shape, &region, off)
        };
        let cases: Vec<(Vec<SaveTensor>, &str)> = vec![
            (
                vec![t("a", vec![2], 0), t("a", vec![2], 8)],
                "DuplicateName",
            ),
            (vec![t("__metadata__", vec![1], 0)], "ReservedName"),
            (vec![t("big", vec![u64::MAX, 2], 0)], "ShapeOverflow"),
            (vec![t("far", vec![4], 56)], "OutOfRange"),
            (vec![t("wrap", vec![1], u64::MAX - 1)], "OutOfRange"),
            (
                vec![SaveTensor {
                    bytes: 5,
                    ..t("odd", vec![2], 0)
                }],
                "SizeMismatch",
            ),
        ];
        for (ts, want) in cases {
            let e = save(&a, &ts, &f, &SaveOptions::default()).unwrap_err();
            assert!(format!("{e:?}").starts_with(want), "{want}: {e:?}");
            assert_eq!(e.kind(), "checkpoint");
            assert!(
                e.to_string()
                    .contains(&format!("{:?}", ts.last().unwrap().name)),
                "{e}"
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let spec = gdpath::FileSpec::write(dir.path().join("f"));
        let fr = a.register(Memory::File(spec)).unwrap();
        let e = save(
            &a,
            &[SaveTensor::new("f", Dtype::U8, vec![0], &fr, 0)],
            &f,
            &SaveOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, SaveError::NotMemory { .. }), "{e}");
    }

    #[test]
    fn an_existing_file_needs_overwrite_and_is_replaced_whole() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.safetensors");
        std::fs::write(&f, b"old").unwrap();
        let region = a
            .register(Memory::host(HostBuffer::from_slice(&[7u8; 4096])))
            .unwrap();
        let ts = [SaveTensor::new("w", Dtype::U8, vec![64, 64], &region, 0)];
        let e = save(&a, &ts, &f, &SaveOptions::default()).unwrap_err();
        assert_eq!(e.kind(), "exists");
        assert_eq!(std::fs::read(&f).unwrap(), b"old");
        let opts = SaveOptions {
            overwrite: true,
            fsync: false,
            ..SaveOptions::default()
        };
        let r = save(&a, &ts, &f, &opts).unwrap();
        assert!(r.replaced && !r.fsync);
        assert_eq!(r.pairs, 1);
        assert!(!r.paths.is_empty());
        let all = std::fs::read(&f).unwrap();
        assert_eq!(&all[r.header_bytes as usize..], &[7u8; 4096][..]);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary is left");
    }

    #[test]
    fn a_loaded_checkpoint_saves_back_byte_equal_in_one_pair() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let (ts, _) = every_dtype(&a);
        let first = dir.path().join("a.safetensors");
        save(&a, &ts, &first, &SaveOptions::default()).unwrap();
        let ck = Checkpoint::open(&[&first]).unwrap();
        let loaded = ck
            .load(&a, Destination::Host { pinned: false }, None)
            .unwrap();
        let second = dir.path().join("b.safetensors");
        let r = save(
            &a,
            &loaded_tensors(&loaded),
            &second,
            &SaveOptions::default(),
        )
        .unwrap();
        assert_eq!(r.pairs, 1, "back to back in the allocation: one pair");
        assert_eq!(
            std::fs::read(&first).unwrap(),
            std::fs::read(&second).unwrap()
        );
    }

    #[test]
    fn dtype_names_are_the_headers() {
        for d in ALL {
            assert_eq!(dtype_named(&format!("{d:?}")), Some(d));
        }
        assert_eq!(dtype_named("F33"), None);
    }

    #[test]
    fn no_tensors_is_a_valid_empty_checkpoint() {
        let a = agent();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.safetensors");
        let r = save(&a, &[], &f, &SaveOptions::default()).unwrap();
        assert_eq!(r.tensor_bytes, 0);
        assert!(r.paths.is_empty());
        assert_eq!(std::fs::read(&f).unwrap(), b"\x08\0\0\0\0\0\0\0{}      ");
    }
}
