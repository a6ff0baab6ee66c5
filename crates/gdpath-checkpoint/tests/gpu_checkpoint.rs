//! GPU suite for checkpoints: the real MiniLM checkpoint loaded onto a GPU and checked tensor
//! by tensor against a CPU read, a corrupted copy refused before any GPU allocation, and GPU
//! tensors saved as a checkpoint (`save`) byte-exact.
//!
//! Run with `cargo test -p gdpath-checkpoint --test gpu_checkpoint -- --ignored` on a machine
//! with a GPU (`scripts/build-gpu-suite.sh` builds it as `gpu_checkpoint`).
//! `GDPATH_GDS_DIRS` (colon-separated) overrides the directories saved to (default `/dev/shm`
//! and `/var/tmp`).

use gdpath::{Agent, HostBuffer, Memory};
use gdpath_checkpoint::{load, Header};
use gdpath_testkit::gpu::{gds_agent as agent, gpu_bytes, gpu_put};
use std::path::PathBuf;

/// The real MiniLM checkpoint: every tensor's bytes on the GPU equal a CPU read of its range;
/// a corrupted copy is refused before any GPU allocation.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn minilm_loads_byte_exact() {
    let path = match std::env::var("GDPATH_MINILM") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let out = std::process::Command::new("bash")
                .arg(gdpath_testkit::repo_path("scripts/fetch-minilm.sh"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "fetch-minilm.sh: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let a = agent(4 << 20, 8);
    let c = load(&a, &path, 0).unwrap();
    let h = Header::read(&path).unwrap();
    assert_eq!(c.tensors.len(), h.tensors.len());
    let cpu = std::fs::read(&path).unwrap();
    let all = gpu_bytes(&a, &c.region, 0, c.read_bytes);
    let base = gdpath::backend::cuda::gpu_buffer(&c.region)
        .unwrap()
        .device_ptr();
    for t in &c.tensors {
        assert_eq!(t.addr, base + t.offset);
        let r = t.file_range.start as usize..t.file_range.end as usize;
        assert_eq!(
            &all[t.offset as usize..t.offset as usize + r.len()],
            &cpu[r],
            "tensor {}",
            t.name
        );
    }
    eprintln!(
        "MiniLM: {} tensors, {} bytes, {:.2} GB/s via {:?} {:?}",
        c.tensors.len(),
        c.tensor_bytes,
        c.gbps(),
        c.path,
        c.finding
    );
    // Corrupted (truncated) copy: a checkpoint error, no GPU memory kept.
    let td = tempfile::tempdir().unwrap();
    let bad = td.path().join("bad.safetensors");
    std::fs::write(&bad, &cpu[..cpu.len() - 100]).unwrap();
    let free_before = free_gpu_memory(&a);
    let e = load(&a, &bad, 0).unwrap_err();
    assert!(
        matches!(e, gdpath_checkpoint::LoadError::Checkpoint { .. }),
        "{e}"
    );
    // The header is refused before any allocation (2 MiB slack for driver bookkeeping).
    assert!(
        free_gpu_memory(&a) + (2 << 20) >= free_before,
        "GPU memory left allocated"
    );
}

fn free_gpu_memory(_a: &Agent) -> u64 {
    let cuda = gdpath_cuda::Cuda::load().unwrap();
    let ctx = gdpath_cuda::Context::new(&cuda, 0).unwrap();
    ctx.memory_info().unwrap().0
}

/// A checkpoint saved from GPU memory must read back exactly as the tensors were: tensors in GPU memory (several dtypes, sizes around 4 KiB and the staged chunk,
/// zero-size, two regions with a host tensor between them) saved with
/// `gdpath_checkpoint::save` to each test directory, replacing an old file, read back
/// byte-exact by a plain CPU read and by our loader; and what the report says (path, fsync).
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn gpu_tensors_save_byte_exact() {
    use gdpath_checkpoint::{save, Checkpoint, Destination, Dtype, SaveOptions, SaveTensor};
    let a = agent(64 << 10, 4);
    let sizes: [(Dtype, Vec<u64>); 6] = [
        (Dtype::F32, vec![1024, 257]),
        (Dtype::BF16, vec![4097]),
        (Dtype::U8, vec![(64 << 10) + 1]),
        (Dtype::I64, vec![0, 8]),
        (Dtype::F16, vec![3, 5, 7]),
        (Dtype::F8_E4M3, vec![3 << 20]),
    ];
    let total: u64 = sizes
        .iter()
        .map(|(d, s)| s.iter().product::<u64>() * (d.bitsize() / 8) as u64)
        .sum();
    let (g1, g2) = (
        a.register(Memory::Gpu {
            ordinal: 0,
            len: total + 4096,
        })
        .unwrap(),
        a.register(Memory::Gpu {
            ordinal: 0,
            len: total + 4096,
        })
        .unwrap(),
    );
    let mut want = vec![0u8; (total + 4096) as usize];
    gdpath_cuda::pattern::fill(&mut want, 24, 0);
    gpu_put(&a, &g1, 0, &want);
    gpu_put(&a, &g2, 0, &want);
    let host = a
        .register(Memory::host(HostBuffer::from_slice(&want[..4096])))
        .unwrap();
    let mut tensors = Vec::new();
    let mut expect = Vec::new();
    let mut off = 3u64; // unaligned in the GPU region on purpose
    for (i, (d, s)) in sizes.iter().enumerate() {
        let n = s.iter().product::<u64>() * (d.bitsize() / 8) as u64;
        let g = if i % 2 == 0 { &g1 } else { &g2 };
        tensors.push(SaveTensor::new(format!("t{i}"), *d, s.clone(), g, off));
        expect.push((
            format!("t{i}"),
            want[off as usize..(off + n) as usize].to_vec(),
        ));
        off += n;
    }
    tensors.push(SaveTensor::new("host", Dtype::U8, vec![4096], &host, 0));
    expect.push(("host".into(), want[..4096].to_vec()));
    for dir in gdpath_testkit::gds_dirs() {
        let td = tempfile::tempdir_in(&dir).unwrap();
        let f = td.path().join("saved.safetensors");
        std::fs::write(&f, b"old").unwrap();
        let opts = SaveOptions {
            overwrite: true,
            ..SaveOptions::default()
        };
        let r = save(&a, &tensors, &f, &opts).unwrap();
        assert!(r.fsync && r.replaced);
        eprintln!(
            "{}: {} bytes in {:.3} s, {:.2} GB/s via {:?} ({:?})",
            f.display(),
            r.file_bytes,
            r.elapsed.as_secs_f64(),
            r.gbps(),
            r.paths,
            r.finding
        );
        let bytes = std::fs::read(&f).unwrap();
        let h = Header::read(&f).unwrap();
        for (name, w) in &expect {
            let t = h.tensors.iter().find(|t| &t.name == name).unwrap();
            let r = t.file_range.start as usize..t.file_range.end as usize;
            assert!(bytes[r] == w[..], "{}: tensor {name}", f.display());
        }
        let back = Checkpoint::open(&[&f])
            .unwrap()
            .load(&a, Destination::Gpu(0), None)
            .unwrap();
        for (name, w) in &expect {
            let t = back.tensors.iter().find(|t| &t.name == name).unwrap();
            assert!(
                w.is_empty() || gpu_bytes(&a, &back.region, t.offset, w.len() as u64) == *w,
                "{}: tensor {name} through the loader",
                f.display()
            );
        }
    }
}
