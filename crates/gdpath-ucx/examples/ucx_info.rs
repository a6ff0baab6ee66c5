//! Prints what the loaded UCX offers (version, transports and devices, memory types, CUDA)
//! and a quick put bandwidth between two workers of this process over 127.0.0.1.
//!
//! Usage: `cargo run --release -p gdpath-ucx --example ucx_info [SIZE_BYTES] [ITERATIONS]`
//! (defaults 1048576 and 500). Bandwidth is GB/s = 1e9 bytes/s of "put SIZE, then flush",
//! one operation in flight, the target worker progressed by a second thread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdpath_ucx::{
    Context, Endpoint, ErrorMode, Features, Listener, MemHandle, MemType, RemoteRegion, UcxCfg,
    Worker,
};

const T: Duration = Duration::from_secs(20);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(1 << 20), |a| a.parse())?;
    let iters: usize = args.next().map_or(Ok(500), |a| a.parse())?;

    let ctx = Context::new(&UcxCfg {
        devices: Some("lo".into()),
        ..UcxCfg::default()
    })?;
    let f = ctx.facts()?;
    println!("library       {}", f.library);
    println!("version       {} ({})", f.version, f.version_string);
    println!("memory types  {:?}", f.memory_types);
    println!(
        "cuda memory   {}",
        if f.cuda_supported {
            "supported"
        } else {
            "not supported"
        }
    );
    println!(
        "ep transports {}",
        if f.ep_transport_query {
            "ucp_ep_query"
        } else {
            "ucp_ep_print_info"
        }
    );
    println!(
        "thread mode   {}",
        if f.thread_multi {
            "multi"
        } else {
            "serialized by gdpath"
        }
    );
    println!("resources (UCX_NET_DEVICES=lo):");
    for r in &f.resources {
        println!("  {r}");
    }
    drop(ctx);

    println!("\nput {size} B + flush, {iters} iterations, two workers of one process:");
    for (tls, mode) in [
        (Some("tcp"), ErrorMode::Peer),
        (None, ErrorMode::Peer),
        (None, ErrorMode::None),
    ] {
        let (gbps, lanes) = put_bw(tls, mode, size, iters)?;
        println!(
            "  UCX_TLS={:<8} error mode {:<5} {:>7.2} GB/s  via {}",
            tls.unwrap_or("default"),
            format!("{mode:?}"),
            gbps,
            lanes
        );
    }
    Ok(())
}

fn put_bw(
    tls: Option<&str>,
    mode: ErrorMode,
    size: usize,
    iters: usize,
) -> Result<(f64, String), Box<dyn std::error::Error>> {
    let ctx = Context::new(&UcxCfg {
        features: Features::RMA | Features::AM,
        transports: tls.map(str::to_string),
        devices: Some("lo".into()),
        ..UcxCfg::default()
    })?;
    let server = Worker::new(&ctx)?;
    let client = Worker::new(&ctx)?;
    let listener = Listener::bind_with(&server, "127.0.0.1:0".parse::<SocketAddr>()?, mode)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let bg = {
        let (w, s) = (server.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                w.progress();
            }
        })
    };
    let ep = Endpoint::connect_with(&client, addr, mode)?;
    let start = Instant::now();
    let server_ep = loop {
        client.progress();
        if let Some(ep) = listener.try_accept()? {
            break ep;
        }
        if start.elapsed() > T {
            return Err("no connection".into());
        }
    };
    ep.wait_connected(T)?;
    let target = MemHandle::alloc(&ctx, size, MemType::Host)?;
    let src = MemHandle::from_vec(&ctx, vec![0xA5; size])?;
    let region = RemoteRegion::new(&ep, &target.describe()?)?;
    // The background thread now yields the server worker to this thread: one thread
    // progressing both workers avoids two spinning threads fighting over 2 cores.
    stop.store(true, Ordering::Relaxed);
    bg.join().map_err(|_| "progress thread panicked")?;
    let both = |r: &mut gdpath_ucx::Request| -> Result<(), gdpath_ucx::UcxError> {
        let t0 = Instant::now();
        while !r.test()? {
            client.progress();
            server.progress();
            if t0.elapsed() > T {
                return Err(gdpath_ucx::UcxError::Timeout {
                    op: "put",
                    timeout: T,
                });
            }
        }
        Ok(())
    };
    let round = || -> Result<(), gdpath_ucx::UcxError> {
        both(&mut ep.put(&src, 0, &region, 0, size)?)?;
        both(&mut ep.flush_nb()?)
    };
    for _ in 0..iters.div_ceil(10) {
        round()?;
    }
    let start = Instant::now();
    for _ in 0..iters {
        round()?;
    }
    let secs = start.elapsed().as_secs_f64();
    let lanes = ep
        .rma_transports(MemType::Host)?
        .lanes
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(",");
    drop(region);
    drop(ep);
    drop(server_ep);
    Ok(((size * iters) as f64 / secs / 1e9, lanes))
}
