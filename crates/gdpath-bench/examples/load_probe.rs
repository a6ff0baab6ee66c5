//! Where `Checkpoint::load`'s time goes against the same bytes read into a buffer kept between
//! runs (an experiment on a GPU machine, not a bench: `docs/benchmarks.md`, "Measurements behind
//! the defaults", holds what it found).
//!
//! ```text
//! load_probe CKPT [RUNS]
//! ```
//! CKPT is one safetensors file (not a sharded checkpoint). With the chooser's agent for CKPT,
//! after its warm-up, RUNS times each (GB/s of post → last byte, 1e9 B/s; max / median / min):
//! `load` the engine's load (a new allocation each, the previous one freed just before); `kept` the
//! load's reads into one allocation kept between runs; `fresh` the same reads into a new allocation
//! each run (allocated outside the timing, the previous one freed just before); `nofree` the same
//! with every earlier allocation kept until the mode ends; `memset` a new allocation cleared by a
//! GPU memset first (outside the timing; `memset+` inside it); `free+N ms` a new allocation N ms
//! after the previous one was freed; `aligned` the file's first bytes from offset 0, rounded down
//! to 2 MiB, into the kept allocation; `shifted` as many bytes from the load's first file offset.
use gdpath::{AgentConfig, FileSpec, Memory, TransferRequest};
use gdpath_checkpoint::chooser::Overrides;
use gdpath_checkpoint::{Checkpoint, Destination};
use std::time::{Duration, Instant};

fn stats(name: &str, bytes: u64, mut v: Vec<Duration>) {
    v.sort();
    let g = |d: &Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    println!(
        "{name:<12} {:>12} B  {:.2} / {:.2} / {:.2} GB/s (max / median / min time)",
        bytes,
        g(&v[v.len() - 1]),
        g(&v[v.len() / 2]),
        g(&v[0])
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(args.get(1).expect("usage: load_probe CKPT [RUNS]"));
    let runs: usize = args.get(2).map_or(5, |r| r.parse().expect("RUNS"));
    assert!(runs > 0, "RUNS: at least 1");
    let ck = Checkpoint::open(&[&path]).expect("open");
    let mut setup = ck
        .setup(
            Destination::Gpu(0),
            &Overrides::default(),
            AgentConfig::default(),
        )
        .expect("setup");
    println!("chosen: {}", setup.tuning.summary());
    setup.warm_up(&ck).expect("warm-up");
    let agent = setup.agent.clone();
    let plan = ck.plan(None).expect("plan");
    let bytes: u64 = plan.reads.iter().map(|r| r.len).sum();
    println!(
        "reads {} (first at file {} into {}), allocation {} B",
        plan.reads.len(),
        plan.reads[0].offset,
        plan.reads[0].at,
        plan.len
    );

    let mut t = Vec::new();
    for _ in 0..runs {
        let c = setup.load(&ck, None).expect("load");
        t.push(c.transfer);
    }
    stats("load", bytes, t);

    let file = agent
        .register(Memory::File(FileSpec::read(&path)))
        .expect("file");
    let gpu = |len| {
        agent
            .register(Memory::Gpu { ordinal: 0, len })
            .expect("gpu")
    };
    let time = |dst: &gdpath::Region, reads: &[(u64, u64, u64)]| {
        let (l, r) = reads
            .iter()
            .map(|&(off, at, len)| (dst.desc(at, len), file.desc(off, len)))
            .unzip();
        let t = Instant::now();
        agent
            .post(TransferRequest::read(l, r))
            .expect("post")
            .wait()
            .map_err(|e| e.error)
            .expect("read");
        t.elapsed()
    };
    let load_reads: Vec<_> = plan.reads.iter().map(|r| (r.offset, r.at, r.len)).collect();
    let kept = gpu(plan.len);
    time(&kept, &load_reads);
    stats(
        "kept",
        bytes,
        (0..runs).map(|_| time(&kept, &load_reads)).collect(),
    );
    stats(
        "fresh",
        bytes,
        (0..runs)
            .map(|_| {
                let g = gpu(plan.len);
                time(&g, &load_reads)
            })
            .collect(),
    );
    // Fresh allocations whose predecessors stay allocated: is it the new memory, or the free?
    let mut keep = Vec::new();
    stats(
        "nofree",
        bytes,
        (0..runs)
            .map(|_| {
                let g = gpu(plan.len);
                let t = time(&g, &load_reads);
                keep.push(g);
                t
            })
            .collect(),
    );
    drop(keep);
    let memset = |g: &gdpath::Region| {
        let b = gdpath::backend::cuda::memory::gpu_buffer(g).expect("a device buffer");
        let s = gdpath_cuda::Stream::new(b.context()).expect("stream");
        s.memset(b, 0, b.len(), 0).expect("memset");
        s.synchronize().expect("sync");
    };
    stats(
        "memset",
        bytes,
        (0..runs)
            .map(|_| {
                let g = gpu(plan.len);
                memset(&g);
                time(&g, &load_reads)
            })
            .collect(),
    );
    stats(
        "memset+",
        bytes,
        (0..runs)
            .map(|_| {
                let g = gpu(plan.len);
                let t = Instant::now();
                memset(&g);
                time(&g, &load_reads);
                t.elapsed()
            })
            .collect(),
    );
    // A new allocation some time after the previous one was freed.
    for ms in [0u64, 50, 150, 300, 600, 1000] {
        stats(
            &format!("free+{ms}ms"),
            bytes,
            (0..runs)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(ms));
                    let g = gpu(plan.len);
                    time(&g, &load_reads)
                })
                .collect(),
        );
    }
    let n = bytes / (2 << 20) * (2 << 20);
    stats(
        "aligned",
        n,
        (0..runs).map(|_| time(&kept, &[(0, 0, n)])).collect(),
    );
    let off = plan.reads[0].offset;
    stats(
        "shifted",
        n,
        (0..runs).map(|_| time(&kept, &[(off, 0, n)])).collect(),
    );
}
