//! The safetensors header: parsing (through the `safetensors` crate's types) and validation
//! against the file it came from.
//!
//! Format (huggingface/safetensors, "Format" in its README): an 8-byte little-endian `u64` `N`,
//! then `N` bytes of UTF-8 JSON mapping tensor names to `{dtype, shape, data_offsets: [begin,
//! end]}` (plus an optional `__metadata__` string map), then the data section. Offsets are
//! relative to the data section's start (`8 + N`); the ranges must tile the data section
//! without holes or overlaps, and `end - begin` must equal `product(shape) × dtype size`.
//!
//! The header is read with two `pread`s (the length, then the JSON): a 4 GiB checkpoint is
//! never read, mapped or hashed to validate it. Every length and offset comes from an untrusted
//! file and is checked (overflow-safe) before it is used.

use super::CheckpointError;
use safetensors::tensor::TensorInfo;
use safetensors::Dtype;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Largest JSON header accepted, in bytes: 100 MB, the limit of the `safetensors` crate
/// (`MAX_HEADER_SIZE` in its `tensor.rs`) and of the Python loader. Larger is an attack or
/// corruption; a real header is ~100 bytes per tensor.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A tensor's length in bytes: `product(shape) × dtype bits / 8`, the dims multiplied in order
/// and the dtype's width last; `None` when a product overflows 64 bits (a zero dim after an
/// overflowing prefix still overflows) or when the bits are not whole bytes (an odd count of
/// 4-bit `F4` elements; the `safetensors` crate refuses those as misaligned too). The one rule of the format's size that [`Header::read`]
/// checks `data_offsets` against and [`crate::save()`] checks its tensors against, so that a
/// save writes only what a load accepts.
pub fn tensor_bytes(dtype: Dtype, shape: impl IntoIterator<Item = u64>) -> Option<u64> {
    let elements = shape.into_iter().try_fold(1u64, u64::checked_mul)?;
    let bits = elements.checked_mul(dtype.bitsize() as u64)?;
    (bits % 8 == 0).then_some(bits / 8)
}

/// One tensor of a checkpoint, as its header describes it, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The tensor's name (the header key).
    pub name: String,
    /// Element type (`F32`, `BF16`, `I64`, …).
    pub dtype: Dtype,
    /// Shape, row-major (C order); `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Absolute byte range in the file: `data_start + begin .. data_start + end`.
    pub file_range: std::ops::Range<u64>,
}

impl TensorEntry {
    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.file_range.end - self.file_range.start
    }
}

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `N`, the JSON length in bytes.
    pub header_len: u64,
    /// File offset of the data section: `8 + N`.
    pub data_start: u64,
    /// Length of the data section in bytes (the end of the last tensor's range).
    pub data_len: u64,
    /// The file's length in bytes when it was validated.
    pub file_len: u64,
    /// Tensors in file order (ascending offsets; ties between empty tensors by name).
    pub tensors: Vec<TensorEntry>,
    /// The `__metadata__` map, sorted by key (e.g. `format = pt`).
    pub metadata: Vec<(String, String)>,
}

impl Header {
    /// Total tensor bytes (equal to `data_len`: the ranges tile the data section).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorEntry::bytes).sum()
    }

    /// Bytes after the data section's end (the format has none; tolerated, never read).
    pub fn trailing_bytes(&self) -> u64 {
        self.file_len - self.data_start - self.data_len
    }

    /// Reads and validates the header of the file at `path`.
    ///
    /// Errors: [`CheckpointError::Open`] / [`CheckpointError::Io`], and every malformed-header
    /// variant of [`CheckpointError`].
    pub fn read(path: &Path) -> Result<Header, CheckpointError> {
        // Through the engine's type check: a FIFO would block this open for ever.
        let mut read = std::fs::OpenOptions::new();
        read.read(true);
        let file =
            gdpath::file::open_regular(path, read, 0).map_err(|e| super::file_error(path, e))?;
        Self::read_from(&file, path)
    }

    /// As [`Header::read`], from an open file (`path` names it in errors).
    pub fn read_from(file: &File, path: &Path) -> Result<Header, CheckpointError> {
        let io = |op: &'static str| {
            let path = path.to_owned();
            move |e: std::io::Error| CheckpointError::Io {
                op,
                path,
                source: e.into(),
            }
        };
        let file_len = file.metadata().map_err(io("fstat"))?.len();
        if file_len < 8 {
            return Err(CheckpointError::TooShort { file_len });
        }
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0).map_err(io("read"))?;
        let header_len = u64::from_le_bytes(n);
        if header_len > MAX_HEADER_BYTES {
            return Err(CheckpointError::HeaderTooLarge {
                header_len,
                max: MAX_HEADER_BYTES,
            });
        }
        if header_len > file_len - 8 {
            return Err(CheckpointError::HeaderPastEof {
                header_len,
                file_len,
            });
        }
        let mut json = vec![0u8; header_len as usize];
        file.read_exact_at(&mut json, 8).map_err(io("read"))?;
        Self::parse(&json, file_len)
    }

    /// Validates the JSON header bytes `json` of a file of `file_len` bytes.
    pub fn parse(json: &[u8], file_len: u64) -> Result<Header, CheckpointError> {
        let header_len = json.len() as u64;
        let text = std::str::from_utf8(json).map_err(|e| CheckpointError::NotUtf8 {
            offset: 8 + e.valid_up_to() as u64,
        })?;
        if !text.trim_start().starts_with('{') {
            return Err(CheckpointError::NotJsonObject);
        }
        // Duplicate keys are an error (a JSON map keeps the last one silently, so two tensors
        // with one name would hide one of them): read the top-level keys in order first.
        let entries: UniqueKeys = serde_json::from_str(text).map_err(CheckpointError::json)?;
        if let Some(name) = entries.duplicate {
            return Err(CheckpointError::DuplicateName { name });
        }
        let raw: serde_json::Map<String, serde_json::Value> = entries.map;
        for (name, v) in &raw {
            if name != "__metadata__" && !v.is_object() {
                return Err(CheckpointError::BadEntry {
                    name: name.clone(),
                    message: "not an object".into(),
                });
            }
        }
        // The `safetensors` crate's types give the dtype names and the entry schema, entry by
        // entry: its whole-header type checks the offsets itself (since 0.6) with an untyped
        // message, where the checks below name the tensors and the fault.
        let bad = |name: &String, e: serde_json::Error| CheckpointError::BadEntry {
            name: name.clone(),
            message: e.to_string(),
        };
        let mut infos = Vec::with_capacity(raw.len());
        let mut metadata: Vec<(String, String)> = Vec::new();
        for (name, v) in &raw {
            if name == "__metadata__" {
                // `null` is no metadata, as the `safetensors` crate reads it (an `Option`).
                let m: Option<std::collections::BTreeMap<String, String>> =
                    serde_json::from_value(v.clone()).map_err(|e| bad(name, e))?;
                metadata = m.unwrap_or_default().into_iter().collect();
            } else {
                let info: TensorInfo =
                    serde_json::from_value(v.clone()).map_err(|e| bad(name, e))?;
                infos.push((name.clone(), info));
            }
        }

        let data_start = 8 + header_len;
        let data_avail = file_len.saturating_sub(data_start);
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, info) in infos {
            let (begin, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
            if end < begin {
                return Err(CheckpointError::ReversedRange { name, begin, end });
            }
            let expected = tensor_bytes(info.dtype, info.shape.iter().map(|&d| d as u64));
            let Some(expected) = expected else {
                return Err(CheckpointError::ShapeOverflow {
                    name,
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                });
            };
            if end - begin != expected {
                return Err(CheckpointError::SizeMismatch {
                    name,
                    dtype: info.dtype,
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    expected,
                    actual: end - begin,
                });
            }
            if end > data_avail {
                return Err(CheckpointError::PastEof {
                    name,
                    begin,
                    end,
                    data_start,
                    file_len,
                });
            }
            tensors.push(TensorEntry {
                name,
                dtype: info.dtype,
                shape: info.shape.iter().map(|&d| d as u64).collect(),
                file_range: data_start + begin..data_start + end,
            });
        }
        tensors.sort_by(|a, b| {
            (a.file_range.start, a.file_range.end, &a.name).cmp(&(
                b.file_range.start,
                b.file_range.end,
                &b.name,
            ))
        });
        // The ranges must tile the data section: each begins where the previous ended.
        let mut cursor = data_start;
        let mut prev: Option<&TensorEntry> = None;
        for t in &tensors {
            if t.file_range.start < cursor {
                let p = prev.expect("cursor only moves past data_start after a tensor");
                return Err(CheckpointError::Overlap {
                    first: p.name.clone(),
                    first_range: (
                        p.file_range.start - data_start,
                        p.file_range.end - data_start,
                    ),
                    second: t.name.clone(),
                    second_range: (
                        t.file_range.start - data_start,
                        t.file_range.end - data_start,
                    ),
                });
            }
            if t.file_range.start > cursor {
                return Err(CheckpointError::Hole {
                    begin: cursor - data_start,
                    end: t.file_range.start - data_start,
                    before: t.name.clone(),
                });
            }
            cursor = t.file_range.end;
            prev = Some(t);
        }
        Ok(Header {
            header_len,
            data_start,
            data_len: cursor - data_start,
            file_len,
            tensors,
            metadata,
        })
    }
}

/// The top-level object of the header, with the first duplicated key if any.
struct UniqueKeys {
    map: serde_json::Map<String, serde_json::Value>,
    duplicate: Option<String>,
}

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<UniqueKeys, A::Error> {
                let mut out = UniqueKeys {
                    map: serde_json::Map::new(),
                    duplicate: None,
                };
                while let Some((k, v)) = access.next_entry::<String, serde_json::Value>()? {
                    if out.map.contains_key(&k) && out.duplicate.is_none() {
                        out.duplicate = Some(k.clone());
                    }
                    out.map.insert(k, v);
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}
