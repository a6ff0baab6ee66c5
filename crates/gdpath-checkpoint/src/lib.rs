//! Checkpoints in the safetensors format: header validation and the plan that loads every
//! tensor with one read into one GPU allocation.
//!
//! [`Header::read`] validates a file's header (see [`header`] for the format and the checks);
//! [`LoadPlan::new`] turns it into one file range and one allocation with each tensor's offset
//! in it. Loading onto a GPU is [`load`] (needs the CUDA backend). A checkpoint of several files
//! (a sharded checkpoint, listed by its `model.safetensors.index.json`: [`index`]) is a
//! [`Checkpoint`]; [`Checkpoint::load`] loads all of it, or the tensors named, into one
//! allocation on a GPU or in host memory ([`Destination`]) with one transfer
//! ([`CheckpointPlan`]). Saving tensors of GPU or host memory as a checkpoint, crash-safe, is
//! [`save`] ([`save()`]). The storage chooser ([`chooser`]) picks threads, chunk and O_DIRECT or
//! buffered reads for the files of a load; [`LoadSetup`] makes the agent from its choice, as
//! `gdpath load` and the Python module's `load_file` do.
//!
//! Built on the engine's public API (`gdpath`: the agent, regions, transfers, the checked file
//! opening and crash-safe writer of [`gdpath::file`]) and, for a loaded GPU tensor's address,
//! the backend-author interface ([`gdpath::backend::cuda::gpu_buffer`]); the engine knows
//! nothing of checkpoints.

pub mod chooser;
pub mod header;
pub mod index;
pub mod load;
pub mod plan;
pub mod save;
pub mod setup;

pub use header::{tensor_bytes, Header, TensorEntry, MAX_HEADER_BYTES};
pub use index::Index;
pub use load::{
    load, Checkpoint, Destination, LoadError, LoadedCheckpoint, LoadedTensor, Verified,
    VERIFY_WINDOW,
};
pub use plan::{CheckpointPlan, LoadPlan, PlacedTensor, PlannedRead, PlannedTensor};
pub use safetensors::Dtype;
pub use save::{compare_files, save, SaveError, SaveOptions, SaveReport, SaveTensor};
pub use setup::{GpuPrestart, LoadSetup};

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An error of the engine's file opening ([`gdpath::file`]) for checkpoint file `path`:
/// [`CheckpointError::Open`] / [`CheckpointError::Io`] with the OS error where there is one,
/// `EISDIR` for a directory, else (another file that is not regular, more bytes than read)
/// `Open` with the error's text.
pub(crate) fn file_error(path: &Path, e: impl Into<gdpath::Error>) -> CheckpointError {
    match e.into() {
        gdpath::Error::Open { source, .. } => CheckpointError::Open {
            path: path.to_owned(),
            source,
        },
        gdpath::Error::Io { op, source, .. } => CheckpointError::Io {
            op,
            path: path.to_owned(),
            source,
        },
        // A directory is what open(2) for writing calls EISDIR: say so with that errno, so
        // callers that map errnos (Python's IsADirectoryError) see it.
        gdpath::Error::NotAFile {
            what: "a directory",
            ..
        } => CheckpointError::Open {
            path: path.to_owned(),
            source: Arc::new(std::io::Error::from_raw_os_error(libc::EISDIR)),
        },
        other => CheckpointError::Open {
            path: path.to_owned(),
            source: Arc::new(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                other.to_string(),
            )),
        },
    }
}

/// Why a checkpoint cannot be loaded. Offsets in tensor variants (`begin`, `end`) are relative
/// to the data section, as the header writes them; `data_start` and `file_len` are absolute.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The file could not be opened.
    #[error("cannot open {}: {source}", gdpath_text::escape(.path))]
    Open {
        /// The file asked for.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A read or `fstat` failed.
    #[error("{op} {}: {source}", gdpath_text::escape(.path))]
    Io {
        /// The operation that failed (`read`, `fstat`, ...).
        op: &'static str,
        /// The file it failed on.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Fewer than the 8 bytes of the header length.
    #[error(
        "file of {file_len} bytes is too short for a safetensors header (8-byte length first)"
    )]
    TooShort {
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header length is absurd (above [`MAX_HEADER_BYTES`]).
    #[error("header length {header_len} bytes is above the {max}-byte limit: not a safetensors file, or corrupt")]
    HeaderTooLarge {
        /// The header length the file states, in bytes.
        header_len: u64,
        /// The limit, [`MAX_HEADER_BYTES`].
        max: u64,
    },
    /// The header length reaches past the end of the file.
    #[error("header length {header_len} bytes reaches past the end of the {file_len}-byte file")]
    HeaderPastEof {
        /// The header length the file states, in bytes.
        header_len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header is not UTF-8.
    #[error("header is not UTF-8 (first bad byte at file offset {offset})")]
    NotUtf8 {
        /// Absolute file offset of the first byte that is not UTF-8.
        offset: u64,
    },
    /// The header does not start with a JSON object.
    #[error("header is not a JSON object")]
    NotJsonObject,
    /// The header is not valid JSON.
    #[error("header JSON, line {line} column {column}: {source}")]
    Json {
        /// 1-based line of the header JSON where parsing stopped.
        line: usize,
        /// 1-based column of that line.
        column: usize,
        /// The JSON parser's reason.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// Two entries have the same name.
    #[error("tensor name {name:?} appears twice in the header")]
    DuplicateName {
        /// The repeated tensor name.
        name: String,
    },
    /// An entry is not `{dtype, shape, data_offsets}` with a known dtype.
    #[error("tensor {name:?}: bad entry: {message}")]
    BadEntry {
        /// The entry's tensor name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// `data_offsets` end before they begin.
    #[error("tensor {name:?}: data_offsets [{begin}, {end}] end before they begin")]
    ReversedRange {
        /// The tensor's name.
        name: String,
        /// Start of its byte range, relative to the data section.
        begin: u64,
        /// End of its byte range (exclusive), relative to the data section.
        end: u64,
    },
    /// The product of the shape (times the dtype size) overflows 64 bits.
    #[error("tensor {name:?}: shape {shape:?} overflows 64-bit byte counts or is not whole bytes")]
    ShapeOverflow {
        /// The tensor's name.
        name: String,
        /// Its shape, one extent per dimension.
        shape: Vec<u64>,
    },
    /// The byte range's length is not `product(shape) × dtype size`.
    #[error(
        "tensor {name:?}: {dtype:?} {shape:?} needs {expected} bytes, data_offsets give {actual}"
    )]
    SizeMismatch {
        /// The tensor's name.
        name: String,
        /// Its element type.
        dtype: Dtype,
        /// Its shape, one extent per dimension.
        shape: Vec<u64>,
        /// Bytes the shape and dtype need.
        expected: u64,
        /// Bytes its `data_offsets` span.
        actual: u64,
    },
    /// The tensor's bytes reach past the end of the file.
    #[error("tensor {name:?}: data_offsets [{begin}, {end}] reach past the end of the file (data starts at byte {data_start}, file is {file_len} bytes)")]
    PastEof {
        /// The tensor's name.
        name: String,
        /// Start of its byte range, relative to the data section.
        begin: u64,
        /// End of its byte range (exclusive), relative to the data section.
        end: u64,
        /// Absolute file offset of the data section (8 + header length), in bytes.
        data_start: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("tensors {first:?} {first_range:?} and {second:?} {second_range:?} overlap")]
    Overlap {
        /// The first tensor's name.
        first: String,
        /// Its byte range `[begin, end)`, relative to the data section.
        first_range: (u64, u64),
        /// The second tensor's name.
        second: String,
        /// Its byte range `[begin, end)`, relative to the data section.
        second_range: (u64, u64),
    },
    /// Bytes of the data section belong to no tensor (the format forbids holes).
    #[error("bytes [{begin}, {end}) of the data section belong to no tensor (before {before:?})")]
    Hole {
        /// Start of the unclaimed bytes, relative to the data section.
        begin: u64,
        /// End of the unclaimed bytes (exclusive), relative to the data section.
        end: u64,
        /// The tensor that starts after the hole.
        before: String,
    },
    /// Two files of one checkpoint hold a tensor of the same name.
    #[error("tensor {name:?} is in both {first} and {second}")]
    DuplicateAcrossFiles {
        /// The tensor's name.
        name: String,
        /// The first file that holds it.
        first: PathBuf,
        /// The second file that holds it.
        second: PathBuf,
    },
    /// A tensor asked for by name is in none of the checkpoint's files.
    #[error("no tensor named {name:?} in the checkpoint")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
    /// A sharded checkpoint's index (`model.safetensors.index.json`) is malformed or does not
    /// describe its files (`message` says how).
    #[error("index: {message}")]
    BadIndex {
        /// What is wrong with the index.
        message: String,
    },
    /// A checkpoint of no files.
    #[error("a checkpoint needs at least one file")]
    NoFiles,
}

impl CheckpointError {
    /// [`CheckpointError::Json`] of a parse error, with its line and column.
    pub(crate) fn json(e: serde_json::Error) -> Self {
        CheckpointError::Json {
            line: e.line(),
            column: e.column(),
            source: Arc::new(e),
        }
    }
}

impl CheckpointError {
    /// The error's kind for scripts: `open` and `io` when the file could not be opened or read
    /// (as [`gdpath::Error::Open`] and [`gdpath::Error::Io`] for any other file), `checkpoint`
    /// for the rest (the file is not a valid safetensors checkpoint; the message says which
    /// check failed). A contract as [`gdpath::Error::kind`]: `gdpath load --json` prints it.
    pub fn kind(&self) -> &'static str {
        match self {
            CheckpointError::Open { .. } => "open",
            CheckpointError::Io { .. } => "io",
            _ => "checkpoint",
        }
    }
}
