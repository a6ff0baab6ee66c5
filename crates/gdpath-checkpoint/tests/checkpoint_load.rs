//! Loading checkpoints into host memory (`Destination::Host`, what `gdpath.safetensors.load_file(
//! device="cpu")` uses): whole files, several shards as one plan (an index written as
//! `transformers` writes it), a selection of tensors, and the typed errors. Files are written by
//! the `safetensors` crate; bytes are compared with the files'.

use gdpath::{Agent, AgentConfig};
use gdpath_checkpoint::{Checkpoint, CheckpointError, Destination, LoadError, LoadedCheckpoint};
use std::path::{Path, PathBuf};

/// Writes a safetensors file of `n` tensors named `{prefix}{i}` of dtypes cycling through a
/// few, shapes including an empty one; returns its path.
fn shard(dir: &Path, name: &str, prefix: &str, n: usize, seed: u8) -> PathBuf {
    use safetensors::Dtype::*;
    let dtypes = [BF16, F32, I64, U8, F8_E4M3, BOOL, F16];
    let specs: Vec<(String, safetensors::Dtype, Vec<usize>)> = (0..n)
        .map(|i| {
            let shape = if i % 5 == 4 {
                vec![0, 3]
            } else {
                vec![i + 1, 3]
            };
            (format!("{prefix}{i}"), dtypes[i % dtypes.len()], shape)
        })
        .collect();
    let bufs: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| {
            let len = s.iter().product::<usize>() * (d.bitsize() / 8);
            (0..len)
                .map(|k| (k as u8).wrapping_mul(31) ^ seed ^ i as u8)
                .collect()
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = specs
        .iter()
        .zip(&bufs)
        .map(|((n, d, s), b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let p = dir.join(name);
    let meta = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(meta), &p).unwrap();
    p
}

/// Every loaded tensor's bytes equal its range in its file.
fn check_bytes(ck: &Checkpoint, c: &LoadedCheckpoint) {
    let files: Vec<Vec<u8>> = ck.files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let all = c.region.host_view().unwrap();
    let base = c.region.host_ptr().unwrap() as u64;
    for t in &c.tensors {
        assert_eq!(t.addr, base + t.offset);
        let r = t.file_range.start as usize..t.file_range.end as usize;
        assert_eq!(
            &all[t.offset as usize..t.offset as usize + r.len()],
            &files[t.file][r],
            "{}",
            t.name
        );
    }
}

fn agent() -> Agent {
    Agent::new(AgentConfig::default()).unwrap()
}

#[test]
fn several_shards_load_into_one_host_allocation_with_one_read_each() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        shard(dir.path(), "m-00001-of-00003.safetensors", "a.", 9, 1),
        shard(dir.path(), "m-00002-of-00003.safetensors", "b.", 4, 2),
        shard(dir.path(), "m-00003-of-00003.safetensors", "c.", 1, 3),
    ];
    let ck = Checkpoint::open(&files).unwrap();
    let a = agent();
    let c = ck
        .load(&a, Destination::Host { pinned: false }, None)
        .unwrap();
    assert_eq!(c.tensors.len(), 14);
    assert_eq!(c.plan.reads.len(), 3, "one read per file");
    assert_eq!(c.pairs.len(), 3);
    for (r, p) in c.plan.reads.iter().zip(&c.pairs) {
        assert_eq!(p.bytes, r.len);
        assert_eq!(r.at % 4096, 0);
    }
    assert_eq!(c.region.host_ptr().unwrap() as usize % 4096, 0);
    let sum: u64 = ck.headers.iter().map(|h| h.data_len).sum();
    assert_eq!(c.tensor_bytes, sum);
    assert!(c.path.is_some());
    check_bytes(&ck, &c);
}

#[test]
fn a_selection_loads_only_the_tensors_named() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        shard(dir.path(), "x.safetensors", "x.", 12, 4),
        shard(dir.path(), "y.safetensors", "y.", 3, 5),
    ];
    let ck = Checkpoint::open(&files).unwrap();
    let a = agent();
    // Given out of order and with a repeat: placed once, in file order.
    let names = ["y.2", "x.7", "x.1", "x.2", "x.4", "x.7"];
    let c = ck
        .load(&a, Destination::Host { pinned: false }, Some(&names))
        .unwrap();
    let got: Vec<&str> = c.tensors.iter().map(|t| t.name.as_str()).collect();
    let in_file_order: Vec<&str> = ck
        .headers
        .iter()
        .flat_map(|h| &h.tensors)
        .map(|t| t.name.as_str())
        .filter(|n| names.contains(n))
        .collect();
    assert_eq!(got, in_file_order);
    // x.4 is empty: no read for it; the others one read each at most.
    assert!(c.plan.reads.len() <= 4, "{:?}", c.plan.reads);
    check_bytes(&ck, &c);
    // Two tensors next to each other in the file share one read.
    let h = &ck.headers[0];
    let w = h
        .tensors
        .windows(2)
        .find(|w| w[0].bytes() > 0 && w[1].bytes() > 0)
        .unwrap();
    let pair = [w[1].name.as_str(), w[0].name.as_str()];
    let c = ck
        .load(&a, Destination::Host { pinned: false }, Some(&pair))
        .unwrap();
    assert_eq!(c.plan.reads.len(), 1);
    assert_eq!(c.tensor_bytes, w[0].bytes() + w[1].bytes());
    check_bytes(&ck, &c);
    let e = ck.load(
        &a,
        Destination::Host { pinned: false },
        Some(&["x.1", "nope"]),
    );
    match e {
        Err(LoadError::Checkpoint {
            error: CheckpointError::NoSuchTensor { name },
            ..
        }) => assert_eq!(name, "nope"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_index_lists_the_shards_and_must_agree_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let s1 = shard(dir.path(), "model-00001-of-00002.safetensors", "l0.", 3, 6);
    let s2 = shard(dir.path(), "model-00002-of-00002.safetensors", "l1.", 2, 7);
    let map = |extra: &str| {
        format!(
            r#"{{"metadata": {{"total_size": 1}}, "weight_map": {{
            "l0.0": "model-00001-of-00002.safetensors", "l0.1": "model-00001-of-00002.safetensors",
            "l0.2": "model-00001-of-00002.safetensors", "l1.0": "model-00002-of-00002.safetensors"
            {extra}}}}}"#
        )
    };
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(
        &index,
        map(r#", "l1.1": "model-00002-of-00002.safetensors""#),
    )
    .unwrap();
    let ck = Checkpoint::open_index(&index).unwrap();
    assert_eq!(ck.files, vec![s1, s2]);
    let c = ck
        .load(&agent(), Destination::Host { pinned: false }, None)
        .unwrap();
    assert_eq!(c.tensors.len(), 5);
    check_bytes(&ck, &c);
    // A shard tensor the map does not list, and a listed tensor its shard lacks.
    for (extra, says) in [
        ("", "l1.1"),
        (
            r#", "l1.1": "model-00002-of-00002.safetensors", "l9": "model-00002-of-00002.safetensors""#,
            "l9",
        ),
    ] {
        std::fs::write(&index, map(extra)).unwrap();
        let e = Checkpoint::open_index(&index).unwrap_err();
        assert_eq!(e.kind(), "checkpoint");
        assert!(
            matches!(&e, LoadError::Checkpoint { error: CheckpointError::BadIndex { message }, .. } if message.contains(says)),
            "{e}"
        );
    }
}

#[test]
fn a_tensor_in_two_files_and_a_malformed_shard_are_refused_before_any_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let a = shard(dir.path(), "a.safetensors", "t.", 2, 8);
    let b = shard(dir.path(), "b.safetensors", "t.", 1, 9);
    match Checkpoint::open(&[&a, &b]) {
        Err(LoadError::Checkpoint {
            error:
                CheckpointError::DuplicateAcrossFiles {
                    name,
                    first,
                    second,
                },
            ..
        }) => assert_eq!((name.as_str(), first, second), ("t.0", a.clone(), b)),
        other => panic!("{other:?}"),
    }
    let bad = dir.path().join("bad.safetensors");
    let bytes = std::fs::read(&a).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() - 1]).unwrap();
    match Checkpoint::open(&[&a, &bad]) {
        Err(LoadError::Checkpoint { path, error }) => {
            assert_eq!(path, bad);
            assert!(matches!(error, CheckpointError::PastEof { .. }), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let none: [&Path; 0] = [];
    assert!(matches!(
        Checkpoint::open(&none),
        Err(LoadError::Checkpoint {
            error: CheckpointError::NoFiles,
            ..
        })
    ));
}

#[test]
fn a_gpu_destination_without_the_cuda_backend_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let f = shard(dir.path(), "g.safetensors", "g.", 2, 1);
    let ck = Checkpoint::open(&[f]).unwrap();
    // A bare agent has no cuda backend whatever the machine.
    let bare = Agent::bare(AgentConfig::default());
    let e = ck.load(&bare, Destination::Gpu(0), None).unwrap_err();
    assert_eq!(e.kind(), "unsupported", "{e}");
    let e = ck
        .load(&bare, Destination::Host { pinned: true }, None)
        .unwrap_err();
    assert_eq!(e.kind(), "unsupported", "{e}");
}

#[test]
fn verify_compares_the_loaded_bytes_with_the_files_and_finds_a_changed_byte() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        shard(dir.path(), "m-00001-of-00002.safetensors", "a.", 9, 1),
        shard(dir.path(), "m-00002-of-00002.safetensors", "b.", 4, 2),
    ];
    let ck = Checkpoint::open(&files).unwrap();
    let a = agent();
    let c = ck
        .load(&a, Destination::Host { pinned: false }, None)
        .unwrap();
    let v = c.verify(&a).unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.bytes, c.read_bytes);
    assert_eq!(v.first_difference, None);
    // One byte of the second file's last tensor changes after the load: found, and where.
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let at = bytes.len() - 1;
    bytes[at] ^= 0xff;
    std::fs::write(&files[1], &bytes).unwrap();
    let v = c.verify(&a).unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_difference, Some((1, at as u64)));
    // A file cut short since is an error naming it, not a verdict.
    std::fs::write(&files[1], &bytes[..100]).unwrap();
    match c.verify(&a) {
        Err(LoadError::Engine { path, error }) => {
            assert_eq!(path, files[1]);
            assert_eq!(
                error.kind(),
                gdpath::Error::ShortFile {
                    path: path.clone(),
                    offset: 0,
                    wanted: 0,
                    available: 0
                }
                .kind()
            );
        }
        other => panic!("{other:?}"),
    }
}
