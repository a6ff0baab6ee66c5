//! `gdpath bench p2p | h2d | d2h`: GPU copy bandwidth and latency, after cuda-samples'
//! `p2pBandwidthLatencyTest` and `nvbandwidth`.
//!
//! What is timed, and how:
//! - Copy-engine copies (P2P, pinned H2D/D2H): the same call the `cuda` backend makes
//!   (`cuMemcpyPeerAsync`, `cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`), `reps` back-to-back copies
//!   between two CUDA events on one stream; one run = one event pair. `reps` grows for small
//!   sizes so each run lasts long enough to time (at most [`MAX_REPS`]). For sizes up to 4 KiB
//!   the row's `latency_us` is the event time per copy (as p2pBandwidthLatencyTest reports it).
//! - Bidirectional P2P: two streams, one per direction, each on its source GPU, timed by wall
//!   clock from the first enqueue to both synchronizes (events of two GPUs cannot be compared).
//! - Engine pipelines (pageable H2D/D2H, staged GPU↔GPU): `Agent::post` → `wait`, wall clock,
//!   through an agent with the default [`GpuConfig`] (P2P forced off for staged).
//! - The driver's own pageable copy (`cuMemcpyHtoDAsync` from unpinned memory), for comparison.
//!
//! Every row is verified: the destination is cleared before the runs and checked against the
//! source's pattern after them, on the GPU (verify kernel) or on the host after copy-back.
//! `limit_gbps` is the link's physical limit per direction: NVLink count × per-link rate (NVML),
//! or PCIe generation × width after line encoding (NVML's maximum link, since idle GPUs train
//! down); twice that for bidirectional rows.

use crate::BenchRow;
use gdpath::backend::cuda::gpu_buffer;
use gdpath::finding::{ids, FindingId};
use gdpath::topo::facts::DriverFacts;
use gdpath::topo::PcieLink;
use gdpath::units::gbps;
use gdpath::{
    Agent, AgentConfig, DataPath, Error, GpuConfig, HostBuffer, Memory, Region, Result,
    TransferRequest,
};
use gdpath_cuda::{
    enable_peer_access, pattern, Context, Cuda, CudaError, DeviceBuffer, Event, PinnedHostBuffer,
    Stream,
};
use std::time::Instant;

/// Most copies in one timed run.
pub const MAX_REPS: usize = 200;
/// Bytes a timed run aims to move (reps = this / size, clamped to 1..=MAX_REPS).
const RUN_BYTES: u64 = 256 << 20;
/// Sizes up to this report a per-copy latency.
const LATENCY_MAX: u64 = 4096;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBenchKind {
    /// Every ordered GPU pair: P2P uni- and bidirectional, staged (P2P off).
    P2p,
    /// Every GPU: host → GPU, pinned, pageable through gdpath, pageable through the driver.
    H2d,
    /// Every GPU: GPU → host, as `H2d`.
    D2h,
}

/// Settings of [`run`].
#[derive(Debug, Clone)]
pub struct GpuBenchConfig {
    /// Which copies to measure (P2P between GPU pairs, host → GPU or GPU → host).
    pub kind: GpuBenchKind,
    /// Bytes per copy, each a row.
    pub sizes: Vec<u64>,
    /// Timed runs per row (min/median/max are over runs); at least 1.
    pub runs: usize,
    /// Only these GPU ordinals (all when `None`).
    pub gpus: Option<Vec<u32>>,
}

/// Rows and what explains the degraded ones.
#[derive(Debug, Clone, Default)]
pub struct GpuBenchReport {
    /// One row per (GPU or pair, size, path) measured.
    pub rows: Vec<BenchRow>,
    /// Findings reported by the engine for its rows (`p2p.disabled`, `system.host-pageable`,
    /// `p2p.unsupported`).
    pub findings: Vec<FindingId>,
    /// Rows that could not be run, and why.
    pub notes: Vec<String>,
}

impl GpuBenchReport {
    fn finding(&mut self, id: &str) {
        let id = FindingId::from(id);
        if !self.findings.contains(&id) {
            self.findings.push(id);
        }
    }
}

fn cu(what: &str) -> impl Fn(CudaError) -> Error + '_ {
    move |source| Error::Cuda {
        backend: "cuda",
        what: format!("bench {what}"),
        source,
    }
}

fn reps_for(size: u64) -> usize {
    (RUN_BYTES / size.max(1)).clamp(1, MAX_REPS as u64) as usize
}

/// Runs the benchmark. Errors: no driver or GPU ([`Error::Unsupported`]), driver failures
/// ([`Error::Backend`]), engine errors.
pub fn run(cfg: &GpuBenchConfig) -> Result<GpuBenchReport> {
    let cuda = Cuda::load().map_err(|e| Error::Unsupported {
        what: format!("GPU benchmarks ({e})"),
        backend: "cuda",
    })?;
    let count = cuda.device_count().map_err(cu("device count"))?;
    let gpus: Vec<u32> = match &cfg.gpus {
        Some(v) => v.clone(),
        None => (0..count).collect(),
    };
    if let Some(&bad) = gpus.iter().find(|&&g| g >= count) {
        return Err(Error::Config(format!(
            "GPU {bad} does not exist ({count} visible)"
        )));
    }
    if gpus.is_empty() {
        return Err(Error::Unsupported {
            what: "GPU benchmarks (the CUDA driver sees no GPU)".into(),
            backend: "cuda",
        });
    }
    if cfg.runs == 0 || cfg.sizes.is_empty() || cfg.sizes.contains(&0) {
        return Err(Error::Config("runs and sizes must be at least 1".into()));
    }
    let facts = gdpath_cuda::gather_facts().ok();
    let mut ctxs = Vec::new();
    for &g in &gpus {
        ctxs.push(Context::new(&cuda, g).map_err(cu("context"))?);
    }
    let mut rep = GpuBenchReport::default();
    match cfg.kind {
        GpuBenchKind::P2p => {
            if gpus.len() < 2 {
                rep.notes
                    .push(format!("P2P needs two GPUs; {} visible", gpus.len()));
            }
            for a in &ctxs {
                for b in &ctxs {
                    if a.ordinal() != b.ordinal() {
                        p2p_pair(cfg, &cuda, facts.as_ref(), a, b, &mut rep)?;
                    }
                }
            }
        }
        GpuBenchKind::H2d | GpuBenchKind::D2h => {
            for c in &ctxs {
                host_gpu(cfg, facts.as_ref(), c, &mut rep)?;
            }
        }
    }
    Ok(rep)
}

/// NVLink limit of the pair per direction (count × per-link GB/s), if joined by NVLink.
fn nvlink_limit(facts: Option<&DriverFacts>, a: u32, b: u32) -> Option<f64> {
    let f = facts?;
    let n = f.nvlink_count(a, b);
    let per = f.gpu(a)?.nvlinks.iter().find_map(|l| l.gbps)?;
    (n > 0).then_some(f64::from(n) * per)
}

/// PCIe limit of one GPU per direction, from NVML's maximum generation and width.
fn pcie_limit(facts: Option<&DriverFacts>, g: u32) -> Option<f64> {
    let p = facts?.gpu(g)?.pcie?;
    let gts = match p.max_gen {
        1 => 2.5,
        2 => 5.0,
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        6 => 64.0,
        _ => return None,
    };
    PcieLink::bandwidth_gbps(gts, p.max_width)
}

fn gpu_name(o: u32) -> String {
    format!("GPU{o}")
}

#[allow(clippy::too_many_arguments)]
fn row(
    path: &str,
    op: &str,
    src: String,
    dst: String,
    bytes: u64,
    qd: u32,
    run_gbps: &[f64],
    latency_us: Option<f64>,
    limit: Option<f64>,
    verified: bool,
) -> BenchRow {
    let mut r = BenchRow::from_runs(path, op, bytes, bytes, qd, run_gbps, &[], verified);
    r.src = Some(src);
    r.dst = Some(dst);
    r.latency_us = latency_us;
    r.limit_gbps = limit;
    r
}

/// Runs `runs` timed runs of `reps` copies enqueued by `enqueue` on `stream`; per-run seconds.
fn time_events(
    stream: &Stream,
    runs: usize,
    reps: usize,
    mut enqueue: impl FnMut() -> std::result::Result<(), CudaError>,
) -> std::result::Result<Vec<f64>, CudaError> {
    let ctx = stream.context();
    let (e0, e1) = (Event::new(ctx, true)?, Event::new(ctx, true)?);
    enqueue()?; // warm-up
    stream.synchronize()?;
    let mut secs = Vec::with_capacity(runs);
    for _ in 0..runs {
        e0.record(stream)?;
        for _ in 0..reps {
            enqueue()?;
        }
        e1.record(stream)?;
        e1.synchronize()?;
        secs.push(f64::from(e0.elapsed_ms(&e1)?) / 1e3);
        stream.synchronize()?;
    }
    Ok(secs)
}

fn to_gbps(bytes: u64, reps: usize, secs: &[f64]) -> Vec<f64> {
    secs.iter()
        .map(|s| bytes as f64 * reps as f64 / s / 1e9)
        .collect()
}

fn latency(size: u64, reps: usize, secs: &[f64]) -> Option<f64> {
    if size > LATENCY_MAX {
        return None;
    }
    let mut per: Vec<f64> = secs.iter().map(|s| s / reps as f64 * 1e6).collect();
    per.sort_by(f64::total_cmp);
    Some(crate::percentile_sorted(&per, 50.0))
}

fn verify_dev(s: &Stream, buf: &DeviceBuffer, len: u64, seed: u64) -> Result<bool> {
    Ok(s.verify_pattern(buf, 0, len as usize, seed, 0)
        .map_err(cu("verify"))?
        .is_ok())
}

fn p2p_pair(
    cfg: &GpuBenchConfig,
    cuda: &Cuda,
    facts: Option<&DriverFacts>,
    a: &Context,
    b: &Context,
    rep: &mut GpuBenchReport,
) -> Result<()> {
    let (oa, ob) = (a.ordinal(), b.ordinal());
    let max = *cfg.sizes.iter().max().expect("sizes checked non-empty") as usize;
    let (da, db) = (
        cuda.device(oa).map_err(cu("device"))?,
        cuda.device(ob).map_err(cu("device"))?,
    );
    let possible = da.can_access_peer(&db).map_err(cu("peer query"))?
        && db.can_access_peer(&da).map_err(cu("peer query"))?;
    let nv = nvlink_limit(facts, oa, ob);
    let pcie = match (pcie_limit(facts, oa), pcie_limit(facts, ob)) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    let (sa, sb) = (
        Stream::new(a).map_err(cu("stream"))?,
        Stream::new(b).map_err(cu("stream"))?,
    );
    let seed = 0xb3c4 ^ u64::from(oa) << 8 ^ u64::from(ob);
    let src = DeviceBuffer::new(a, max).map_err(cu("alloc"))?;
    let dst = DeviceBuffer::new(b, max).map_err(cu("alloc"))?;
    let back_src = DeviceBuffer::new(b, max).map_err(cu("alloc"))?;
    let back_dst = DeviceBuffer::new(a, max).map_err(cu("alloc"))?;
    sa.fill_pattern(&src, 0, max, seed, 0).map_err(cu("fill"))?;
    sb.fill_pattern(&back_src, 0, max, seed ^ 1, 0)
        .map_err(cu("fill"))?;
    sa.synchronize().map_err(cu("fill"))?;
    sb.synchronize().map_err(cu("fill"))?;
    let (name_a, name_b) = (gpu_name(oa), gpu_name(ob));
    if possible {
        enable_peer_access(a, b).map_err(cu("peer access"))?;
        enable_peer_access(b, a).map_err(cu("peer access"))?;
        let path = if nv.is_some() {
            DataPath::P2pNvlink
        } else {
            DataPath::P2pPcie
        };
        let limit = nv.or(pcie);
        for &size in &cfg.sizes {
            let n = size as usize;
            let reps = reps_for(size);
            sb.memset(&dst, 0, n, 0).map_err(cu("clear"))?;
            sb.synchronize().map_err(cu("clear"))?;
            let secs = time_events(&sa, cfg.runs, reps, || sa.copy_peer(&dst, 0, &src, 0, n))
                .map_err(cu("p2p"))?;
            let ok = verify_dev(&sb, &dst, size, seed)?;
            rep.rows.push(row(
                &path.name(),
                "copy",
                name_a.clone(),
                name_b.clone(),
                size,
                1,
                &to_gbps(size, reps, &secs),
                latency(size, reps, &secs),
                limit,
                ok,
            ));
            // Bidirectional: both directions at once, one stream per source GPU.
            sa.memset(&back_dst, 0, n, 0).map_err(cu("clear"))?;
            sb.memset(&dst, 0, n, 0).map_err(cu("clear"))?;
            sa.synchronize().map_err(cu("clear"))?;
            sb.synchronize().map_err(cu("clear"))?;
            let mut runs = Vec::new();
            for i in 0..=cfg.runs {
                let t = Instant::now();
                for _ in 0..reps {
                    sa.copy_peer(&dst, 0, &src, 0, n).map_err(cu("p2p"))?;
                    sb.copy_peer(&back_dst, 0, &back_src, 0, n)
                        .map_err(cu("p2p"))?;
                }
                sa.synchronize().map_err(cu("p2p"))?;
                sb.synchronize().map_err(cu("p2p"))?;
                if i > 0 {
                    runs.push(gbps(2 * size * reps as u64, t.elapsed()));
                }
            }
            let ok =
                verify_dev(&sb, &dst, size, seed)? && verify_dev(&sa, &back_dst, size, seed ^ 1)?;
            rep.rows.push(row(
                &format!("{}-bidir", path.name()),
                "copy-bidir",
                format!("{name_a}<->{name_b}"),
                format!("{name_b}<->{name_a}"),
                size,
                2,
                &runs,
                None,
                limit.map(|l| 2.0 * l),
                ok,
            ));
        }
    } else {
        rep.finding(ids::P2P_UNSUPPORTED);
        rep.notes.push(format!(
            "{name_a}->{name_b}: cuDeviceCanAccessPeer = 0: no P2P rows, staged only"
        ));
    }
    drop((src, dst, back_src, back_dst));
    staged_pair(cfg, pcie, a, b, rep)
}

/// Staged GPU → GPU through the engine with P2P forced off.
fn staged_pair(
    cfg: &GpuBenchConfig,
    pcie: Option<f64>,
    a: &Context,
    b: &Context,
    rep: &mut GpuBenchReport,
) -> Result<()> {
    let agent = Agent::new(AgentConfig {
        name: "bench".into(),
        gpu: GpuConfig {
            p2p: false,
            ..GpuConfig::default()
        },
        ..AgentConfig::default()
    })?;
    let max = *cfg.sizes.iter().max().expect("sizes checked non-empty");
    let src = agent.register(Memory::Gpu {
        ordinal: a.ordinal(),
        len: max,
    })?;
    let dst = agent.register(Memory::Gpu {
        ordinal: b.ordinal(),
        len: max,
    })?;
    let seed = 0x57a9 ^ u64::from(a.ordinal());
    let (sa, sb) = (
        Stream::new(a).map_err(cu("stream"))?,
        Stream::new(b).map_err(cu("stream"))?,
    );
    let (src_buf, dst_buf) = (
        gpu_buffer(&src).expect("GPU"),
        gpu_buffer(&dst).expect("GPU"),
    );
    sa.fill_pattern(src_buf, 0, max as usize, seed, 0)
        .map_err(cu("fill"))?;
    sa.synchronize().map_err(cu("fill"))?;
    for &size in &cfg.sizes {
        sb.memset(dst_buf, 0, size as usize, 0)
            .map_err(cu("clear"))?;
        sb.synchronize().map_err(cu("clear"))?;
        let runs = engine_runs(&agent, cfg.runs, &src, &dst, size, rep)?;
        let ok = verify_dev(&sb, dst_buf, size, seed)?;
        rep.rows.push(row(
            &DataPath::Staged.name(),
            "copy",
            gpu_name(a.ordinal()),
            gpu_name(b.ordinal()),
            size,
            1,
            &runs,
            None,
            pcie,
            ok,
        ));
    }
    Ok(())
}

/// Warm-up plus `runs` timed engine transfers of `size` bytes from `src` to `dst` (a Write);
/// records the findings the engine attached.
fn engine_runs(
    agent: &Agent,
    runs: usize,
    src: &Region,
    dst: &Region,
    size: u64,
    rep: &mut GpuBenchReport,
) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for i in 0..=runs {
        let t = Instant::now();
        let r = agent
            .post(TransferRequest::write(
                vec![src.desc(0, size)],
                vec![dst.desc(0, size)],
            ))?
            .wait()
            .map_err(|e| e.error)?;
        let el = t.elapsed();
        if let Some(f) = &r.pairs[0].finding {
            rep.finding(f.as_str());
        }
        if i > 0 {
            out.push(gbps(size, el));
        }
    }
    Ok(out)
}

fn host_gpu(
    cfg: &GpuBenchConfig,
    facts: Option<&DriverFacts>,
    ctx: &Context,
    rep: &mut GpuBenchReport,
) -> Result<()> {
    let h2d = cfg.kind == GpuBenchKind::H2d;
    let o = ctx.ordinal();
    let limit = pcie_limit(facts, o);
    let max = *cfg.sizes.iter().max().expect("sizes checked non-empty") as usize;
    let seed = 0x4d2 ^ u64::from(o) ^ if h2d { 0 } else { 1 << 32 };
    let s = Stream::new(ctx).map_err(cu("stream"))?;
    let dev = DeviceBuffer::new(ctx, max).map_err(cu("alloc"))?;
    let g = gpu_name(o);
    // A copy's row: host memory of kind `k` (pinned, pageable) on the host side.
    let copy_row = |name: &str, k: &str, size, runs: &[f64], latency, ok| {
        let h = format!("host ({k})");
        let (src, dst) = if h2d { (h, g.clone()) } else { (g.clone(), h) };
        row(name, "copy", src, dst, size, 1, runs, latency, limit, ok)
    };

    // Pinned: one copy-engine copy per rep, timed by events.
    let mut pinned = PinnedHostBuffer::new(ctx, max).map_err(cu("pinned alloc"))?;
    if h2d {
        pattern::fill(pinned.as_mut_slice().map_err(cu("fill"))?, seed, 0);
    } else {
        s.fill_pattern(&dev, 0, max, seed, 0).map_err(cu("fill"))?;
        s.synchronize().map_err(cu("fill"))?;
    }
    let path = |pinned| {
        if h2d {
            DataPath::HostToDevice { pinned }
        } else {
            DataPath::DeviceToHost { pinned }
        }
    };
    for &size in &cfg.sizes {
        let n = size as usize;
        let reps = reps_for(size);
        let secs = if h2d {
            s.memset(&dev, 0, n, 0).map_err(cu("clear"))?;
            time_events(&s, cfg.runs, reps, || s.copy_h2d(&dev, 0, &pinned, 0, n))
        } else {
            pinned.as_mut_slice().map_err(cu("clear"))?[..n].fill(0);
            time_events(&s, cfg.runs, reps, || {
                s.copy_d2h(&mut pinned, 0, &dev, 0, n)
            })
        }
        .map_err(cu("copy"))?;
        let ok = if h2d {
            verify_dev(&s, &dev, size, seed)?
        } else {
            pattern::check(&pinned.as_slice().map_err(cu("read"))?[..n], seed, 0).is_ok()
        };
        rep.rows.push(copy_row(
            &path(true).name(),
            "pinned",
            size,
            &to_gbps(size, reps, &secs),
            latency(size, reps, &secs),
            ok,
        ));
    }
    drop(pinned);

    // Pageable through the engine's staging pipeline.
    let agent = Agent::new(AgentConfig {
        name: "bench".into(),
        ..AgentConfig::default()
    })?;
    let mut hb = HostBuffer::zeroed(max);
    if h2d {
        pattern::fill(hb.as_mut_slice(), seed, 0);
    } else {
        // Touch every page, so that the timed runs do not count first-touch faults.
        hb.as_mut_slice().fill(1);
    }
    let host = agent.register(Memory::host(hb))?;
    let gpu = agent.register(Memory::Gpu {
        ordinal: o,
        len: max as u64,
    })?;
    let gbuf = gpu_buffer(&gpu).expect("GPU region");
    if !h2d {
        s.fill_pattern(gbuf, 0, max, seed, 0).map_err(cu("fill"))?;
        s.synchronize().map_err(cu("fill"))?;
    }
    for &size in &cfg.sizes {
        let runs = if h2d {
            s.memset(gbuf, 0, size as usize, 0).map_err(cu("clear"))?;
            s.synchronize().map_err(cu("clear"))?;
            engine_runs(&agent, cfg.runs, &host, &gpu, size, rep)?
        } else {
            host.host_view()?[..size as usize].fill(0);
            engine_runs(&agent, cfg.runs, &gpu, &host, size, rep)?
        };
        let ok = if h2d {
            verify_dev(&s, gbuf, size, seed)?
        } else {
            pattern::check(&host.host_view()?[..size as usize], seed, 0).is_ok()
        };
        rep.rows.push(copy_row(
            &path(false).name(),
            "pageable",
            size,
            &runs,
            None,
            ok,
        ));
    }

    // The driver's own pageable copy, for comparison.
    let mut view = host.host_view()?;
    for &size in &cfg.sizes {
        let n = size as usize;
        let mut runs = Vec::new();
        for i in 0..=cfg.runs {
            let t = Instant::now();
            if h2d {
                s.write_from_slice(gbuf, 0, &view[..n])
            } else {
                s.read_into_slice(&mut view[..n], gbuf, 0)
            }
            .map_err(cu("driver pageable copy"))?;
            if i > 0 {
                runs.push(gbps(size, t.elapsed()));
            }
        }
        let ok = if h2d {
            verify_dev(&s, gbuf, size, seed)?
        } else {
            pattern::check(&view[..n], seed, 0).is_ok()
        };
        rep.rows.push(copy_row(
            &format!("{}-driver", path(false).name()),
            "pageable",
            size,
            &runs,
            None,
            ok,
        ));
    }
    Ok(())
}
