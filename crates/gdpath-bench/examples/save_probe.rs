//! How fast one new file on a file system takes bytes from host memory, by method (an experiment
//! behind the checkpoint saver's write path; `docs/benchmarks.md` holds what it found).
//!
//! ```text
//! save_probe FILE SIZE MODE...     MODE: pwrite:T | mmap:T | mmapnp:T | falloc:T
//! ```
//! `pwrite:T`: T threads `pwrite` 4 MiB chunks (round robin) of a new file. `mmap:T`: the file is
//! sized with `ftruncate`, mapped shared, and T threads each populate their chunks
//! (`MADV_POPULATE_WRITE`, which fails with an error where a store would raise SIGBUS) and copy
//! into them. `mmapnp:T`: the same without populating (page faults on the stores). `falloc:T`:
//! `fallocate` the whole file, then `pwrite:T`. Every run creates the file anew, ends with
//! `fsync`, and checks eight 1 MiB ranges of the file. SIZE in MiB. Three runs, min / median /
//! max GB/s (1e9 B/s).
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

const CHUNK: usize = 4 << 20;

fn fill(buf: &mut [u8], seed: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    }
}

fn run(path: &str, size: usize, mode: &str, t: usize, src: &[u8]) -> f64 {
    let _ = std::fs::remove_file(path);
    let t0 = Instant::now();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .expect("create");
    let chunks = size.div_ceil(CHUNK);
    let piece = |i: usize| (i * CHUNK, CHUNK.min(size - i * CHUNK));
    match mode {
        "pwrite" | "falloc" => {
            if mode == "falloc" {
                // SAFETY: plain syscall on an open descriptor.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as i64) };
                assert!(r == 0, "fallocate: {}", std::io::Error::last_os_error());
            }
            std::thread::scope(|s| {
                for w in 0..t {
                    let f = &f;
                    s.spawn(move || {
                        for i in (w..chunks).step_by(t) {
                            let (off, l) = piece(i);
                            f.write_all_at(&src[off % src.len()..][..l], off as u64)
                                .expect("pwrite");
                        }
                    });
                }
            });
        }
        "mmap" | "mmapnp" => {
            f.set_len(size as u64).expect("ftruncate");
            // SAFETY: a new shared mapping of the file we just sized; unmapped below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert!(p != libc::MAP_FAILED, "mmap");
            let base = p as usize;
            std::thread::scope(|s| {
                for w in 0..t {
                    s.spawn(move || {
                        for i in (w..chunks).step_by(t) {
                            let (off, l) = piece(i);
                            let dst = (base + off) as *mut u8;
                            if mode == "mmap" {
                                // SAFETY: inside the mapping. 23 is MADV_POPULATE_WRITE.
                                let r = unsafe { libc::madvise(dst as *mut _, l, 23) };
                                assert!(
                                    r == 0,
                                    "MADV_POPULATE_WRITE: {}",
                                    std::io::Error::last_os_error()
                                );
                            }
                            // SAFETY: inside the mapping; chunks are disjoint between threads.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src[off % src.len()..].as_ptr(),
                                    dst,
                                    l,
                                )
                            };
                        }
                    });
                }
            });
            // SAFETY: our mapping; the threads are done.
            unsafe { libc::munmap(p, size) };
        }
        m => panic!("unknown mode {m}"),
    }
    f.sync_all().expect("fsync");
    let dt = t0.elapsed().as_secs_f64();
    let mut a = vec![0u8; 1 << 20];
    for i in 0..8 {
        // Whole MiB, so that the range's source bytes are one slice of the 64 MiB source.
        let off = (((size - a.len()) / 7 * i) >> 20) << 20;
        f.read_exact_at(&mut a, off as u64).expect("read back");
        assert!(
            a == src[off % src.len()..][..a.len()],
            "{mode}: bytes at {off} differ"
        );
    }
    size as f64 / dt / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let size = args[2].parse::<usize>().expect("SIZE in MiB") << 20;
    // Chunks start at multiples of 4 MiB, so chunk bytes [off, off + l) come from source bytes
    // [off mod 64 MiB, + l), always inside it.
    let mut src = vec![0u8; 64 << 20];
    fill(&mut src, 7);
    for m in &args[3..] {
        let (mode, t) = m.split_once(':').expect("MODE:T");
        let t = t.parse().expect("T");
        let mut v: Vec<f64> = (0..3).map(|_| run(path, size, mode, t, &src)).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{m:<12} {:.2} / {:.2} / {:.2}", v[0], v[1], v[2]);
    }
    let _ = std::fs::remove_file(path);
}
