//! Where the staged file → GPU path's time goes, on a GPU machine (an experiment, not a bench of
//! the engine: `docs/benchmarks.md`, "Measurements behind the defaults", holds what it found).
//!
//! ```text
//! staged_probe FILE MODE...      MODE: read:T:C[:F] | dma | readdma:T:C[:F] | pipe:T:C:D[:F]
//!                                       | alloc:N:C[:F] | dmac:C:S:T | slab:T:C:N
//! ```
//! `alloc:N:C`: the time to allocate N pinned buffers of C bytes one after another, from N
//! threads at once, and as one allocation of N × C (printed in ms, not GB/s).
//! F, flags: `h` bounce buffers are transparent huge pages registered with `cuMemHostRegister`
//! (else `cuMemHostAlloc`, 4 KiB pages); `m` the file is read through a shared mapping and
//! `memcpy` (else `pread`); `p` each mapped chunk is populated first (`MADV_POPULATE_READ`);
//! `f` the GPU copy goes to a new allocation each run; `z` the same, cleared by a GPU memset first;
//! `u` the copy starts 20 KiB into the file (a safetensors data section), chunk boundaries staying
//! aligned in the file, so that the GPU offsets are not (as the engine cuts such a pair).
//!
//! `dmac:C:S:T`: H2D of 4 GiB in C-byte copies from T threads, each with S streams (nothing
//! read): the copy engine's rate for copies of that size. `slab:T:C:N`: T threads `pread` C-byte
//! pieces into N pinned slabs of T × C bytes, and whichever thread reads a slab's last piece
//! posts one H2D copy of the whole slab (checked as `pipe` is).
//!
//! FILE must hold at least 4 GiB. `read:T:C`: T threads `pread` C-byte chunks of FILE (round
//! robin) into one pinned buffer each, nothing sent to the GPU: the CPU's copy rate out of the
//! page cache. `dma`: H2D of 4 GiB in 64 MiB copies from one pinned buffer, each waited for (the
//! PCIe limit). `readdma:T:C`: `read:T:C` while a second thread keeps such copies running; the
//! copies' rate counts those done while the reads ran. `pipe:T:C:D`: the staged pipeline with D
//! bounce buffers per thread (the engine's is D = 2); the GPU copy is cleared before each run and
//! eight 1 MiB ranges of it are compared with the file after. Sizes take K/M suffixes (KiB, MiB).
//! Each mode runs three times; min / median / max GB/s (1e9 B/s).
use gdpath_cuda::{
    Context, Cuda, DeviceBuffer, HostRegistration, PinnedHostBuffer, RawHostMemory, Stream,
};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

fn size(s: &str) -> usize {
    let (n, m) = match s.as_bytes().last() {
        Some(b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<usize>().expect("a size") * m
}

/// A bounce buffer: `cuMemHostAlloc`, or an anonymous mapping advised huge and registered.
enum Buf {
    Alloc(PinnedHostBuffer),
    Huge(Option<HostRegistration<RawHostMemory>>, *mut u8, usize),
}

// SAFETY: the pointer is to a mapping this value owns alone (as `PinnedHostBuffer` owns its
// memory); nothing else refers to it.
unsafe impl Send for Buf {}

impl Buf {
    fn new(ctx: &Context, len: usize, huge: bool) -> Buf {
        if !huge {
            return Buf::Alloc(PinnedHostBuffer::new(ctx, len).expect("pinned"));
        }
        let map = len.div_ceil(2 << 20) * (2 << 20);
        // SAFETY: a fresh private anonymous mapping, unmapped in Drop after the registration.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                map,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert!(p != libc::MAP_FAILED, "mmap");
            if libc::madvise(p, map, libc::MADV_HUGEPAGE) != 0 {
                eprintln!(
                    "MADV_HUGEPAGE refused ({}): small pages",
                    std::io::Error::last_os_error()
                );
            }
            std::ptr::write_bytes(p as *mut u8, 0, map);
            let r = HostRegistration::from_raw(ctx, p as *mut u8, map).expect("register");
            Buf::Huge(Some(r), p as *mut u8, map)
        }
    }
    fn slice(&mut self) -> &mut [u8] {
        match self {
            Buf::Alloc(b) => b.as_mut_slice().expect("buffer"),
            Buf::Huge(r, _, _) => r
                .as_mut()
                .expect("registered")
                .as_mut_slice()
                .expect("buffer"),
        }
    }
    fn h2d(&self, st: &Stream, dev: &DeviceBuffer, off: usize, l: usize) {
        match self {
            Buf::Alloc(b) => st.copy_h2d(dev, off, b, 0, l),
            Buf::Huge(r, _, _) => st.copy_h2d(dev, off, r.as_ref().expect("registered"), 0, l),
        }
        .expect("h2d")
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Buf::Huge(r, p, len) = self {
            // Unregistered before the memory goes; if a stream still held it, the mapping is
            // leaked rather than unmapped under a copy.
            if let Some(Ok(_)) = r.take().map(|r| r.into_inner()) {
                // SAFETY: the mapping made in `new`, no longer registered or referenced.
                unsafe { libc::munmap(*p as *mut _, *len) };
            }
        }
    }
}

/// A read-only shared mapping of a whole file.
struct Map(*mut libc::c_void, usize);

impl Map {
    fn new(f: &std::fs::File, len: usize) -> Map {
        use std::os::fd::AsRawFd;
        // SAFETY: a new mapping of the open file; unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap FILE");
        Map(p, len)
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as self.
        unsafe { std::slice::from_raw_parts(self.0 as *const u8, self.1) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our mapping, no borrows left (they borrow self).
        unsafe { libc::munmap(self.0, self.1) };
    }
}

/// Where chunks come from: `pread`, or a shared mapping of the file.
struct Src<'a> {
    f: &'a std::fs::File,
    map: Option<&'a [u8]>,
    populate: bool,
}

impl Src<'_> {
    fn read(&self, dst: &mut [u8], off: usize) {
        let l = dst.len();
        if let Some(m) = self.map {
            if self.populate {
                let a = off / 4096 * 4096;
                // SAFETY: inside the mapping. 22 is MADV_POPULATE_READ (Linux 5.14).
                let r = unsafe { libc::madvise(m.as_ptr().add(a) as *mut _, off + l - a, 22) };
                assert!(
                    r == 0,
                    "MADV_POPULATE_READ: {}",
                    std::io::Error::last_os_error()
                );
            }
            dst.copy_from_slice(&m[off..off + l]);
            return;
        }
        let mut got = 0;
        while got < l {
            let n = self
                .f
                .read_at(&mut dst[got..l], (off + got) as u64)
                .expect("pread");
            assert!(n > 0, "short file");
            got += n;
        }
    }
}

/// Reads chunks `w, w + t, ...` of `[0, len)` into `buf` (and, when `dev` is given, sends each to
/// the GPU through `d` buffers on `d` streams).
#[allow(clippy::too_many_arguments)]
fn worker(
    src: &Src<'_>,
    len: usize,
    base: usize,
    c: usize,
    w: usize,
    t: usize,
    bufs: &mut [Buf],
    gpu: Option<(&DeviceBuffer, &[Stream])>,
) {
    // Chunk i is file bytes [max(i·c, base), min((i+1)·c, len)), at GPU offset (start − base):
    // boundaries aligned in the file, as the engine cuts a pair that starts at `base`.
    let mut k = 0;
    let mut i = w;
    while i * c < len {
        let start = (i * c).max(base);
        let end = ((i + 1) * c).min(len);
        if start < end {
            let l = end - start;
            let s = k % bufs.len();
            if let Some((_, streams)) = gpu {
                streams[s].synchronize().expect("sync");
            }
            src.read(&mut bufs[s].slice()[..l], start);
            if let Some((dev, streams)) = gpu {
                bufs[s].h2d(&streams[s], dev, start - base, l);
            }
            k += 1;
        }
        i += t;
    }
    if let Some((_, streams)) = gpu {
        for st in streams {
            st.synchronize().expect("sync");
        }
    }
}

/// Compares eight 1 MiB ranges spread over the GPU copy of file bytes `[base, len)` with the file.
fn check(f: &std::fs::File, dev: &DeviceBuffer, len: usize, base: usize) {
    let st = Stream::new(dev.context()).expect("stream");
    let n = len - base;
    let l = (1usize << 20).min(n);
    let (mut a, mut b) = (vec![0u8; l], vec![0u8; l]);
    for i in 0..8 {
        let off = (n - l) / 7 * i;
        st.read_into_slice(&mut a, dev, off).expect("d2h");
        f.read_exact_at(&mut b, (base + off) as u64).expect("pread");
        assert!(
            a == b,
            "GPU bytes at {off} differ from the file's at {}",
            base + off
        );
    }
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "{:.2} / {:.2} / {:.2}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let f = std::fs::File::open(path).expect("open FILE");
    let len = f.metadata().expect("stat").len() as usize;
    let cuda = Cuda::load().expect("libcuda");
    let ctx = Context::new(&cuda, 0).expect("context");
    let dev = DeviceBuffer::new(&ctx, len).expect("device buffer");
    assert!(
        len >= 4 << 30,
        "FILE must hold at least 4 GiB (the DMA modes fill 4 GiB of the GPU copy)"
    );
    let dma_src = PinnedHostBuffer::new(&ctx, 64 << 20).expect("pinned");
    let dma_st = Stream::new(&ctx).expect("stream");
    // H2D copies of 64 MiB from one pinned buffer, each waited for, so that `moved` is exact
    // to one copy (≈ 1.2 ms) at any moment: 64 copies (4 GiB), or until `stop`.
    let dma_gb = |stop: Option<&AtomicBool>, moved: &AtomicU64| -> f64 {
        let (src, st) = (&dma_src, &dma_st);
        let t0 = Instant::now();
        for n in 0usize.. {
            st.copy_h2d(&dev, (n % 64) << 26, src, 0, 64 << 20)
                .expect("h2d");
            st.synchronize().expect("sync");
            moved.fetch_add(64 << 20, Ordering::Relaxed);
            match stop {
                Some(s) if s.load(Ordering::Relaxed) => break,
                None if n + 1 >= 64 => break,
                _ => {}
            }
        }
        t0.elapsed().as_secs_f64()
    };
    for mode in &args[2..] {
        let p: Vec<&str> = mode.split(':').collect();
        let mut rates = Vec::new();
        let mut side = Vec::new();
        for _ in 0..3 {
            match p[0] {
                "alloc" => {
                    let (n, c) = (p[1].parse::<usize>().expect("N"), size(p[2]));
                    let huge = p.get(3).is_some_and(|f| f.contains('h'));
                    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
                    let t0 = Instant::now();
                    let one: Vec<Buf> = (0..n).map(|_| Buf::new(&ctx, c, huge)).collect();
                    let seq = ms(t0);
                    let t1 = Instant::now();
                    drop(one);
                    let free = ms(t1);
                    let t0 = Instant::now();
                    let par: Vec<Buf> = std::thread::scope(|s| {
                        let hs: Vec<_> = (0..n)
                            .map(|_| s.spawn(|| Buf::new(&ctx, c, huge)))
                            .collect();
                        hs.into_iter()
                            .map(|h| h.join().expect("alloc thread"))
                            .collect()
                    });
                    let par_ms = ms(t0);
                    drop(par);
                    let t0 = Instant::now();
                    let big = Buf::new(&ctx, n * c, huge);
                    let big_ms = ms(t0);
                    drop(big);
                    side.push(seq);
                    rates.push(par_ms);
                    println!("{mode:<22} one by one {seq:.1} ms (freeing {free:.1}), from {n} threads {par_ms:.1} ms, one of {} MiB {big_ms:.1} ms", (n * c) >> 20);
                    continue;
                }
                "dma" => {
                    let moved = AtomicU64::new(0);
                    let dt = dma_gb(None, &moved);
                    rates.push(moved.load(Ordering::Relaxed) as f64 / dt / 1e9);
                }
                "dmac" => {
                    // H2D of 4 GiB in C-byte copies posted by T threads, each from one pinned
                    // buffer onto S streams of its own, nothing read: the copy engine's rate
                    // for copies of that size.
                    let (c, s_n, t) = (
                        size(p[1]),
                        p[2].parse::<usize>().expect("S"),
                        p[3].parse::<usize>().expect("T"),
                    );
                    let total = 4usize << 30;
                    let srcs: Vec<PinnedHostBuffer> = (0..t)
                        .map(|_| PinnedHostBuffer::new(&ctx, c).expect("pinned"))
                        .collect();
                    let streams: Vec<Vec<Stream>> = (0..t)
                        .map(|_| {
                            (0..s_n)
                                .map(|_| Stream::new(&ctx).expect("stream"))
                                .collect()
                        })
                        .collect();
                    let t0 = Instant::now();
                    std::thread::scope(|sc| {
                        for (w, (src, sts)) in srcs.iter().zip(&streams).enumerate() {
                            let dev = &dev;
                            sc.spawn(move || {
                                let mut i = w;
                                let mut k = 0;
                                while i * c < total {
                                    let l = c.min(total - i * c);
                                    let st = &sts[k % sts.len()];
                                    // At most S copies of this thread in flight, as in `pipe`.
                                    if k >= sts.len() {
                                        st.synchronize().expect("sync");
                                    }
                                    st.copy_h2d(dev, i * c, src, 0, l).expect("h2d");
                                    k += 1;
                                    i += t;
                                }
                                for st in sts {
                                    st.synchronize().expect("sync");
                                }
                            });
                        }
                    });
                    rates.push(total as f64 / t0.elapsed().as_secs_f64() / 1e9);
                }
                "slab" => {
                    // T threads read C-byte pieces into N pinned slabs of T × C bytes; the
                    // thread that finishes a slab's last piece posts one copy of the whole slab.
                    let (t, c, n) = (
                        p[1].parse::<usize>().expect("T"),
                        size(p[2]),
                        p[3].parse::<usize>().expect("N"),
                    );
                    let slab = t * c;
                    let mut slabs: Vec<PinnedHostBuffer> = (0..n)
                        .map(|_| PinnedHostBuffer::new(&ctx, slab).expect("pinned"))
                        .collect();
                    let ptrs: Vec<usize> = slabs
                        .iter_mut()
                        .map(|b| b.as_mut_slice().expect("slab").as_mut_ptr() as usize)
                        .collect();
                    let streams: Vec<Stream> =
                        (0..n).map(|_| Stream::new(&ctx).expect("stream")).collect();
                    dma_st.memset(&dev, 0, len, 0xA5).expect("memset");
                    dma_st.synchronize().expect("sync");
                    let groups = len.div_ceil(slab);
                    // Per group: pieces still to read; per slab: the last group posted + 1.
                    let left: Vec<AtomicU64> = (0..groups)
                        .map(|g| AtomicU64::new(t.min((len - g * slab).div_ceil(c)) as u64))
                        .collect();
                    let posted: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                    let t0 = Instant::now();
                    std::thread::scope(|sc| {
                        for w in 0..t {
                            let (left, posted, streams, ptrs, slabs, dev, f) =
                                (&left, &posted, &streams, &ptrs, &slabs, &dev, &f);
                            sc.spawn(move || {
                                for (g, left_g) in left.iter().enumerate() {
                                    let j = g % n;
                                    let start = g * slab + w * c;
                                    if start >= len {
                                        continue;
                                    }
                                    // The slab's previous group must be posted and copied.
                                    if g >= n {
                                        while posted[j].load(Ordering::Acquire) < (g - n + 1) as u64
                                        {
                                            std::hint::spin_loop();
                                        }
                                        streams[j].synchronize().expect("sync");
                                    }
                                    let l = c.min(len - start);
                                    // SAFETY: piece w of slab j, written by this thread alone
                                    // while no copy of the slab runs (waited for above).
                                    let dst = unsafe {
                                        std::slice::from_raw_parts_mut(
                                            (ptrs[j] + w * c) as *mut u8,
                                            l,
                                        )
                                    };
                                    let mut got = 0;
                                    while got < l {
                                        let r = f
                                            .read_at(&mut dst[got..], (start + got) as u64)
                                            .expect("pread");
                                        assert!(r > 0, "short file");
                                        got += r;
                                    }
                                    if left_g.fetch_sub(1, Ordering::AcqRel) == 1 {
                                        let gl = slab.min(len - g * slab);
                                        streams[j]
                                            .copy_h2d(dev, g * slab, &slabs[j], 0, gl)
                                            .expect("h2d");
                                        posted[j].store((g + 1) as u64, Ordering::Release);
                                    }
                                }
                            });
                        }
                    });
                    for st in &streams {
                        st.synchronize().expect("sync");
                    }
                    rates.push(len as f64 / t0.elapsed().as_secs_f64() / 1e9);
                    check(&f, &dev, len, 0);
                }
                "read" | "readdma" | "pipe" => {
                    let (t, c) = (p[1].parse::<usize>().expect("T"), size(p[2]));
                    let d = if p[0] == "pipe" {
                        p[3].parse::<usize>().expect("D")
                    } else {
                        1
                    };
                    let flags = p
                        .get(if p[0] == "pipe" { 4 } else { 3 })
                        .copied()
                        .unwrap_or("");
                    // A fresh mapping per run, so that every run faults its pages in.
                    let map = flags.contains('m').then(|| Map::new(&f, len));
                    let src = Src {
                        f: &f,
                        map: map.as_ref().map(|m| m.bytes()),
                        populate: flags.contains('p'),
                    };
                    let mut bufs: Vec<Vec<Buf>> = (0..t)
                        .map(|_| {
                            (0..d)
                                .map(|_| Buf::new(&ctx, c, flags.contains('h')))
                                .collect()
                        })
                        .collect();
                    let streams: Vec<Vec<Stream>> = (0..t)
                        .map(|_| (0..d).map(|_| Stream::new(&ctx).expect("stream")).collect())
                        .collect();
                    // `u`: the pair starts 20 KiB into the file, as a safetensors data section
                    // after its header does.
                    let base = if flags.contains('u') { 20 << 10 } else { 0 };
                    // `f`: a new device allocation for this run (outside the timing); `z`: the
                    // same, written once by a GPU memset first.
                    let fresh = flags.contains('f') || flags.contains('z');
                    let new_dev =
                        fresh.then(|| DeviceBuffer::new(&ctx, len).expect("device buffer"));
                    let dev = new_dev.as_ref().unwrap_or(&dev);
                    if p[0] == "pipe" && !flags.contains('f') {
                        // So that the check after the run sees this run's bytes, not a past one's.
                        dma_st.memset(dev, 0, len, 0xA5).expect("memset");
                        dma_st.synchronize().expect("sync");
                    }
                    let stop = AtomicBool::new(false);
                    let moved = AtomicU64::new(0);
                    let (dt, dma_t) = std::thread::scope(|sc| {
                        let bg =
                            (p[0] == "readdma").then(|| sc.spawn(|| dma_gb(Some(&stop), &moved)));
                        if bg.is_some() {
                            // Let the copies reach their rate first.
                            std::thread::sleep(std::time::Duration::from_millis(50));
                        }
                        let (t0, m0) = (Instant::now(), moved.load(Ordering::Relaxed));
                        std::thread::scope(|s2| {
                            for (w, (b, st)) in bufs.iter_mut().zip(&streams).enumerate() {
                                let src = &src;
                                let gpu = (p[0] == "pipe").then_some((dev, st.as_slice()));
                                s2.spawn(move || worker(src, len, base, c, w, t, b, gpu));
                            }
                        });
                        let dt = t0.elapsed().as_secs_f64();
                        // The copies done while the reads ran, not those before or after.
                        let during = moved.load(Ordering::Relaxed) - m0;
                        stop.store(true, Ordering::Relaxed);
                        if let Some(h) = bg {
                            h.join().expect("dma thread");
                        }
                        (dt, (p[0] == "readdma").then_some(during as f64 / dt / 1e9))
                    });
                    // Unmapping is part of reading through a mapping.
                    let t1 = Instant::now();
                    drop(map);
                    rates.push((len - base) as f64 / (dt + t1.elapsed().as_secs_f64()) / 1e9);
                    if p[0] == "pipe" {
                        check(&f, dev, len, base);
                    }
                    if let Some(g) = dma_t {
                        side.push(g);
                    }
                }
                m => panic!("unknown mode {m}"),
            }
        }
        if p[0] == "alloc" {
            continue; // printed per run above
        }
        let extra = if side.is_empty() {
            String::new()
        } else {
            format!("  (concurrent H2D {})", stats(side))
        };
        println!("{mode:<22} {}{extra}", stats(rates));
    }
}
