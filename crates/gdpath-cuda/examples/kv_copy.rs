//! Block-list copies of KV-cache shapes, both methods, against one contiguous copy of the same
//! bytes: min / median / max GB/s (1e9 B/s) over `--runs` runs timed with
//! CUDA events, the ratio of the medians, the CPU time to post the list, and a byte-exact check
//! of the destination after the runs of each method.
//!
//! Shapes (random layouts: source and destination slots are two fixed permutations):
//! - `d2h`:  100,000 blocks of 16 KiB, GPU 0 → pinned host (KV offload)
//! - `h2d`:  100,000 blocks of 16 KiB, pinned host → GPU 0 (KV reload)
//! - `d2d`:  40,000 blocks of 64 KiB within GPU 0
//! - `peer`: 40,000 blocks of 64 KiB, GPU 0 → GPU 1 (skipped with one GPU)
//!
//! `cargo build --release -p gdpath-cuda --example kv_copy`, then
//! `kv_copy [--runs N] [--shapes d2h,h2d,d2d,peer] [--methods driver-batch,kernel]
//! [--blocks N] [--block-size BYTES] [--layout random|sequential] [--hide-post]
//! [--threads T] [--blocks-per-sm B] [--min-piece BYTES] [--prefer-overlap]`.
//!
//! The timed interval starts before the list is posted, so it includes the CPU's posting, as a
//! caller sees it. `--hide-post` enqueues a device memset of 8 GiB (about 3 ms) ahead of each
//! timed run, so that posting overlaps it and the figure is the GPU's time alone whenever the
//! post takes less than the memset. `--blocks` and `--block-size` replace every selected
//! shape's; `--layout sequential` puts block i at slot i on both sides (it coalesces into one
//! descriptor, which the kernel splits again). The tuning flags change the kernel's launch
//! shape (see `KernelTuning`) or the batch's flags, to compare against the defaults.

use std::time::Instant;

use gdpath_cuda::{
    enable_peer_access, pattern, BlockCopier, BlockCopy, BlockMethod, BlockRegion, Context, Cuda,
    CudaError, DeviceBuffer, Event, KernelTuning, PinnedHost, PinnedHostBuffer, Stream,
};

const SEED: u64 = 0x6b76_636f_7079; // "kvcopy"

#[derive(Clone, Copy, PartialEq)]
enum Mem {
    Gpu(u32),
    Host,
}

struct Shape {
    name: &'static str,
    blocks: u32,
    block: u64,
    src: Mem,
    dst: Mem,
}

const SHAPES: [Shape; 4] = [
    Shape {
        name: "d2h",
        blocks: 100_000,
        block: 16 << 10,
        src: Mem::Gpu(0),
        dst: Mem::Host,
    },
    Shape {
        name: "h2d",
        blocks: 100_000,
        block: 16 << 10,
        src: Mem::Host,
        dst: Mem::Gpu(0),
    },
    Shape {
        name: "d2d",
        blocks: 40_000,
        block: 64 << 10,
        src: Mem::Gpu(0),
        dst: Mem::Gpu(0),
    },
    Shape {
        name: "peer",
        blocks: 40_000,
        block: 64 << 10,
        src: Mem::Gpu(0),
        dst: Mem::Gpu(1),
    },
];

enum Buf {
    Dev(DeviceBuffer),
    Host(PinnedHostBuffer),
}

impl Buf {
    fn new(ctxs: &[Context], m: Mem, len: usize) -> Result<Buf, CudaError> {
        Ok(match m {
            Mem::Gpu(g) => Buf::Dev(DeviceBuffer::new(&ctxs[g as usize], len)?),
            Mem::Host => Buf::Host(PinnedHostBuffer::new(&ctxs[0], len)?),
        })
    }

    fn addr(&self) -> u64 {
        match self {
            Buf::Dev(d) => d.device_ptr(),
            Buf::Host(h) => h.host_ptr() as u64,
        }
    }

    fn src_region(&self) -> BlockRegion<'_> {
        match self {
            Buf::Dev(d) => BlockRegion::device(d),
            Buf::Host(h) => BlockRegion::host(h),
        }
    }

    fn dst_region(&mut self) -> BlockRegion<'_> {
        match self {
            Buf::Dev(d) => BlockRegion::device(d),
            Buf::Host(h) => BlockRegion::host_mut(h),
        }
    }

    /// Fill with the pattern from position 0.
    fn fill(&mut self, s: &Stream) -> Result<(), CudaError> {
        match self {
            Buf::Dev(d) => {
                s.fill_pattern(d, 0, d.len(), SEED, 0)?;
                s.synchronize()
            }
            Buf::Host(h) => {
                pattern::fill(h.as_mut_slice()?, SEED, 0);
                Ok(())
            }
        }
    }

    /// Zero the whole buffer, so that a method that writes nothing cannot pass the check.
    fn clear(&mut self, s: &Stream) -> Result<(), CudaError> {
        match self {
            Buf::Dev(d) => {
                s.memset(d, 0, d.len(), 0)?;
                s.synchronize()
            }
            Buf::Host(h) => {
                h.as_mut_slice()?.fill(0);
                Ok(())
            }
        }
    }

    /// The contents, on the host.
    fn read(&self, s: &Stream) -> Result<Vec<u8>, CudaError> {
        match self {
            Buf::Dev(d) => {
                let mut v = vec![0u8; d.len()];
                s.read_into_slice(&mut v, d, 0)?;
                Ok(v)
            }
            Buf::Host(h) => {
                s.synchronize()?;
                Ok(h.as_slice()?.to_vec())
            }
        }
    }
}

/// One contiguous copy of `len` bytes from `src` to `dst`.
fn contiguous(s: &Stream, dst: &mut Buf, src: &Buf, len: usize) -> Result<(), CudaError> {
    match (dst, src) {
        (Buf::Host(h), Buf::Dev(d)) => s.copy_d2h(h, 0, d, 0, len),
        (Buf::Dev(d), Buf::Host(h)) => s.copy_h2d(d, 0, h, 0, len),
        (Buf::Dev(a), Buf::Dev(b)) if a.ordinal() == b.ordinal() => s.copy_d2d(a, 0, b, 0, len),
        (Buf::Dev(a), Buf::Dev(b)) => s.copy_peer(a, 0, b, 0, len),
        (Buf::Host(_), Buf::Host(_)) => Err(CudaError::InvalidArgument("host to host".into())),
    }
}

struct Stats {
    min: f64,
    median: f64,
    max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    Stats {
        min: v[0],
        median: v[v.len() / 2],
        max: v[v.len() - 1],
    }
}

/// GB/s of `runs` runs of `op`, timed with events on `s` (after one warm-up run). With
/// `ahead`, that buffer is memset before each run's start event, so that the CPU's work in `op`
/// overlaps GPU work rather than the timed interval.
fn timed(
    ctx: &Context,
    s: &Stream,
    runs: usize,
    bytes: u64,
    ahead: Option<&DeviceBuffer>,
    mut op: impl FnMut() -> Result<(), CudaError>,
) -> Result<Stats, CudaError> {
    op()?;
    s.synchronize()?;
    let (t0, t1) = (Event::new(ctx, true)?, Event::new(ctx, true)?);
    let mut rates = Vec::with_capacity(runs);
    for _ in 0..runs {
        if let Some(b) = ahead {
            s.memset(b, 0, b.len(), 0)?;
        }
        t0.record(s)?;
        op()?;
        t1.record(s)?;
        t1.synchronize()?;
        rates.push(bytes as f64 / (t0.elapsed_ms(&t1)? as f64 / 1e3) / 1e9);
        s.synchronize()?;
    }
    Ok(stats(rates))
}

struct Opts {
    runs: usize,
    shapes: Vec<String>,
    methods: Vec<BlockMethod>,
    blocks: Option<u32>,
    block_size: Option<u64>,
    sequential: bool,
    hide_post: bool,
    tuning: KernelTuning,
    prefer_overlap: bool,
}

const USAGE: &str = "usage: kv_copy [--runs N] [--shapes d2h,h2d,d2d,peer] \
    [--methods driver-batch,kernel] [--blocks N] [--block-size BYTES] \
    [--layout random|sequential] [--hide-post] [--threads T] [--blocks-per-sm B] \
    [--min-piece BYTES] [--prefer-overlap]";

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        runs: 5,
        shapes: SHAPES.iter().map(|s| s.name.to_string()).collect(),
        methods: BlockMethod::ALL.to_vec(),
        blocks: None,
        block_size: None,
        sequential: false,
        hide_post: false,
        tuning: KernelTuning::default(),
        prefer_overlap: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        match a.as_str() {
            "--runs" => o.runs = num(val("--runs")?)?.max(1) as usize,
            "--shapes" => o.shapes = val("--shapes")?.split(',').map(str::to_string).collect(),
            "--methods" => {
                o.methods = val("--methods")?
                    .split(',')
                    .map(|m| {
                        BlockMethod::ALL
                            .into_iter()
                            .find(|x| x.name() == m)
                            .ok_or(format!("unknown method {m}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--blocks" => o.blocks = Some(num(val("--blocks")?)?.max(1) as u32),
            "--block-size" => o.block_size = Some(num(val("--block-size")?)?.max(1)),
            "--layout" => {
                o.sequential = match val("--layout")?.as_str() {
                    "random" => false,
                    "sequential" => true,
                    l => return Err(format!("unknown layout {l}")),
                }
            }
            "--hide-post" => o.hide_post = true,
            "--threads" => o.tuning.threads_per_block = num(val("--threads")?)? as u32,
            "--blocks-per-sm" => o.tuning.blocks_per_sm = num(val("--blocks-per-sm")?)? as u32,
            "--min-piece" => o.tuning.min_piece_bytes = num(val("--min-piece")?)?,
            "--prefer-overlap" => o.prefer_overlap = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(o)
}

/// What posting costs the CPU before any driver call, per descriptor (median of 5): the list
/// checks and coalescing (`check_list` + `coalesce`, the work `BlockCopier::copy` does in one
/// pass), and writing the list into pinned memory (what the kernel method's staging takes).
fn cpu_costs(ctx: &Context, name: &str, list: &[BlockCopy]) -> Result<(), CudaError> {
    let n = list.len();
    let mut out = Vec::with_capacity(n);
    let mut pinned = PinnedHostBuffer::new(ctx, std::mem::size_of_val(list))?;
    let (mut check, mut write) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        gdpath_cuda::blocks::check_list(list)?;
        gdpath_cuda::blocks::coalesce(list, &mut out);
        check.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        let dst = pinned.as_mut_slice()?;
        let t = Instant::now();
        for (chunk, b) in dst.chunks_exact_mut(24).zip(list) {
            chunk[..8].copy_from_slice(&b.dst.to_le_bytes());
            chunk[8..16].copy_from_slice(&b.src.to_le_bytes());
            chunk[16..].copy_from_slice(&b.len.to_le_bytes());
        }
        write.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    println!(
        "{name:<5} CPU per descriptor: check + coalesce {:.1} ns, write to pinned staging {:.1} ns",
        stats(check).median,
        stats(write).median
    );
    Ok(())
}

fn run_shape(
    ctxs: &[Context],
    sh: &Shape,
    o: &Opts,
    ahead: Option<&DeviceBuffer>,
) -> Result<(), CudaError> {
    let blocks = o.blocks.unwrap_or(sh.blocks);
    let block = o.block_size.unwrap_or(sh.block);
    let n = blocks as usize;
    let len = n * block as usize;
    let bytes = len as u64;
    let ctx = &ctxs[0];
    let s = Stream::new(ctx)?;
    let mut src = Buf::new(ctxs, sh.src, len)?;
    let mut dst = Buf::new(ctxs, sh.dst, len)?;
    src.fill(&s)?;
    let slots = |seed| -> Vec<u32> {
        if o.sequential {
            (0..blocks).collect()
        } else {
            pattern::shuffled(blocks, seed)
        }
    };
    let (src_slots, dst_slots) = (slots(1), slots(2));
    let list: Vec<BlockCopy> = (0..n)
        .map(|i| {
            BlockCopy::new(
                dst.addr() + dst_slots[i] as u64 * block,
                src.addr() + src_slots[i] as u64 * block,
                block,
            )
        })
        .collect();
    let c = timed(ctx, &s, o.runs, bytes, ahead, || {
        contiguous(&s, &mut dst, &src, len)
    })?;
    println!(
        "{:<5} {:>7} x {:>8} B  {:<13} {:>8.1} {:>8.1} {:>8.1}",
        sh.name, blocks, block, "contiguous", c.min, c.median, c.max
    );
    cpu_costs(ctx, sh.name, &list)?;
    let mut copier = BlockCopier::new(ctx);
    copier.set_kernel_tuning(o.tuning);
    copier.set_batch_prefer_overlap(o.prefer_overlap);
    for &method in &o.methods {
        if let Err(e) = copier.available(method) {
            println!("{:<5} {method}: SKIPPED: {e}", sh.name);
            continue;
        }
        dst.clear(&s)?;
        let mut post_us = Vec::new();
        let mut report = None;
        let m = timed(ctx, &s, o.runs, bytes, ahead, || {
            let t = Instant::now();
            let r = copier.copy(&s, &[dst.dst_region()], &[src.src_region()], &list, method)?;
            post_us.push(t.elapsed().as_secs_f64() * 1e6);
            report = Some(r);
            Ok(())
        })?;
        let host = dst.read(&s)?;
        let (bad, first) = pattern::check_copies(&host, dst.addr(), &list, src.addr(), SEED);
        let post = stats(post_us);
        let r = report.expect("at least one run");
        println!(
            "{:<5} {:>7} x {:>8} B  {:<13} {:>8.1} {:>8.1} {:>8.1}  {:>5.2}x  post {:>8.0} us \
             ({:.3} us/desc)  posted {} {}  {}",
            sh.name,
            blocks,
            block,
            method.name(),
            m.min,
            m.median,
            m.max,
            m.median / c.median,
            post.median,
            post.median / n as f64,
            r.posted,
            match (r.batch_abi, r.grid) {
                (Some(abi), _) => format!("{abi:?}"),
                (_, Some((g, t))) => format!("grid {g}x{t}"),
                _ => String::new(),
            },
            if bad == 0 {
                "verified".to_string()
            } else {
                format!("MISMATCH in {bad} blocks, first {first:?}")
            }
        );
        if bad != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "{} {method}: {bad} blocks differ",
                sh.name
            )));
        }
    }
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let r = (|| -> Result<bool, CudaError> {
        let cuda = Cuda::load()?;
        let count = cuda.device_count()?;
        if count == 0 {
            return Err(CudaError::NoSuchDevice { ordinal: 0, count });
        }
        let ctxs: Vec<Context> = (0..count.min(2))
            .map(|g| Context::new(&cuda, g))
            .collect::<Result<_, _>>()?;
        if ctxs.len() == 2 {
            enable_peer_access(&ctxs[0], &ctxs[1])?;
            enable_peer_access(&ctxs[1], &ctxs[0])?;
        }
        println!(
            "driver CUDA {}, GPU 0 {}, runs {}, layout {}, kernel {:?}{}{}",
            cuda.driver_version()?,
            ctxs[0].device().name()?,
            o.runs,
            if o.sequential { "sequential" } else { "random" },
            o.tuning,
            if o.prefer_overlap {
                ", batch prefers overlap"
            } else {
                ""
            },
            if o.hide_post {
                ", posting hidden behind an 8 GiB memset (GPU time only)"
            } else {
                ", timed from before posting"
            }
        );
        println!(
            "{:<5} {:>20}  {:<13} {:>8} {:>8} {:>8}  (GB/s = 1e9 B/s)",
            "shape", "blocks", "method", "min", "median", "max"
        );
        let ahead = if o.hide_post {
            Some(DeviceBuffer::new(&ctxs[0], 8 << 30)?)
        } else {
            None
        };
        let mut ok = true;
        for sh in SHAPES
            .iter()
            .filter(|s| o.shapes.iter().any(|n| n == s.name))
        {
            if [sh.src, sh.dst].contains(&Mem::Gpu(1)) && ctxs.len() < 2 {
                println!("{:<5} SKIPPED: one GPU", sh.name);
                continue;
            }
            if let Err(e) = run_shape(&ctxs, sh, &o, ahead.as_ref()) {
                println!("{:<5} FAILED: {e}", sh.name);
                ok = false;
            }
        }
        Ok(ok)
    })();
    match r {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("kv_copy: {e}");
            std::process::exit(1);
        }
    }
}
