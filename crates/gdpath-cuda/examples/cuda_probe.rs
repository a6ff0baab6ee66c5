//! Print `gather_facts()` as JSON, then quick bandwidths: H2D and D2H from pinned memory, H2D
//! from pageable memory, D2D on GPU 0 and P2P between GPUs 0 and 1 both ways. Each figure is the
//! median of 10 copies of 1 GiB timed with CUDA events (pageable: wall clock), in GB/s = 1e9 B/s.
//! Finally the cuFile driver's properties, if libcufile is present.
//!
//! `cargo run --release -p gdpath-cuda --example cuda_probe`

use gdpath_cuda::{
    enable_peer_access, gather_facts, Context, CuFileDriver, Cuda, CudaError, DeviceBuffer, Event,
    PinnedHostBuffer, Stream,
};

const SIZE: usize = 1 << 30;
const ITERS: usize = 10;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median GB/s of `ITERS` runs of `op` on `stream`, timed with events.
fn timed(
    ctx: &Context,
    stream: &Stream,
    mut op: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    op()?; // warm-up
    stream.synchronize()?;
    let (t0, t1) = (Event::new(ctx, true)?, Event::new(ctx, true)?);
    let mut rates = Vec::new();
    for _ in 0..ITERS {
        t0.record(stream)?;
        op()?;
        t1.record(stream)?;
        t1.synchronize()?;
        rates.push(SIZE as f64 / (t0.elapsed_ms(&t1)? as f64 / 1e3) / 1e9);
    }
    stream.synchronize()?;
    Ok(median(rates))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let facts = gather_facts()?;
    println!("{}", serde_json::to_string_pretty(&facts)?);

    let cuda = Cuda::load()?;
    let n = cuda.device_count()?;
    if n == 0 {
        println!("no GPU: no bandwidth figures");
        return Ok(());
    }
    let g0 = Context::new(&cuda, 0)?;
    let s0 = Stream::new(&g0)?;
    let mut host = PinnedHostBuffer::new(&g0, SIZE)?;
    let d0 = DeviceBuffer::new(&g0, SIZE)?;
    let d0b = DeviceBuffer::new(&g0, SIZE)?;
    let h2d = timed(&g0, &s0, || s0.copy_h2d(&d0, 0, &host, 0, SIZE))?;
    println!("bandwidth H2D pinned GPU0: {h2d:.2} GB/s (median of {ITERS} x 1 GiB)");
    let mut rates = Vec::new();
    for _ in 0..ITERS {
        s0.copy_d2h(&mut host, 0, &d0, 0, SIZE)?;
        s0.synchronize()?;
    }
    let (t0, t1) = (Event::new(&g0, true)?, Event::new(&g0, true)?);
    for _ in 0..ITERS {
        t0.record(&s0)?;
        s0.copy_d2h(&mut host, 0, &d0, 0, SIZE)?;
        t1.record(&s0)?;
        t1.synchronize()?;
        rates.push(SIZE as f64 / (t0.elapsed_ms(&t1)? as f64 / 1e3) / 1e9);
    }
    s0.synchronize()?;
    println!(
        "bandwidth D2H pinned GPU0: {:.2} GB/s (median of {ITERS} x 1 GiB)",
        median(rates)
    );
    let pageable = vec![1u8; SIZE];
    let mut rates = Vec::new();
    s0.write_from_slice(&d0, 0, &pageable)?;
    for _ in 0..ITERS {
        let t = std::time::Instant::now();
        s0.write_from_slice(&d0, 0, &pageable)?;
        rates.push(SIZE as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    println!(
        "bandwidth H2D pageable GPU0: {:.2} GB/s (median of {ITERS} x 1 GiB, wall clock)",
        median(rates)
    );
    let registered = gdpath_cuda::HostRegistration::new(&g0, pageable)?;
    let reg = timed(&g0, &s0, || s0.copy_h2d(&d0, 0, &registered, 0, SIZE))?;
    println!("bandwidth H2D registered (cuMemHostRegister) GPU0: {reg:.2} GB/s (median of {ITERS} x 1 GiB)");
    drop(registered);
    let d2d = timed(&g0, &s0, || s0.copy_d2d(&d0b, 0, &d0, 0, SIZE))?;
    println!("bandwidth D2D GPU0: {d2d:.2} GB/s (median of {ITERS} x 1 GiB; read+write = 2x this in memory traffic)");
    if n >= 2 {
        let g1 = Context::new(&cuda, 1)?;
        let s1 = Stream::new(&g1)?;
        let d1 = DeviceBuffer::new(&g1, SIZE)?;
        println!(
            "peer access 0->1: {:?}, 1->0: {:?}",
            enable_peer_access(&g0, &g1)?,
            enable_peer_access(&g1, &g0)?
        );
        let p01 = timed(&g0, &s0, || s0.copy_peer(&d1, 0, &d0, 0, SIZE))?;
        println!("bandwidth P2P GPU0->GPU1: {p01:.2} GB/s (median of {ITERS} x 1 GiB)");
        let p10 = timed(&g1, &s1, || s1.copy_peer(&d0, 0, &d1, 0, SIZE))?;
        println!("bandwidth P2P GPU1->GPU0: {p10:.2} GB/s (median of {ITERS} x 1 GiB)");
    }
    match CuFileDriver::open(&g0) {
        Ok(d) => println!(
            "cuFile from {} version {:?}: {:?}",
            d.loaded_from(),
            d.version(),
            d.properties()
        ),
        Err(e) => println!("cuFile unavailable: {e}"),
    }
    Ok(())
}
