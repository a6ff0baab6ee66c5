//! Streams small puts from one process to another with gdpath-ucx alone (no engine), to tell
//! UCX's own cost from the engine's: `ucx_perftest -t ucp_put_bw`-like, N puts of SIZE bytes
//! with at most W in flight, one flush at the end, rate = N / (last flush done − first post).
//!
//! Usage (two shells, or `&`):
//!   put_stream serve PORT                      # target: maps 64 MiB, serves until killed
//!   put_stream put HOST:PORT sockaddr|address SIZE N W [F]
//! With F, an endpoint flush is posted after every F puts and waited for before the window
//! moves past it (as the engine confirms each transfer of F puts).
//! The target hands its worker address, region and packed rkey over a plain TCP socket on
//! PORT+1; the initiator then connects either through UCX's listener (`sockaddr`, as gdpath's
//! agents do) or by the worker address (`address`, as ucx_perftest does). Host memory, UCX's
//! default transports (set UCX_TLS/UCX_NET_DEVICES to choose), peer error handling.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use gdpath_ucx::{
    Context, Endpoint, Listener, MemHandle, MemType, PackedRkey, RegionDesc, RemoteRegion, UcxCfg,
    Worker, WorkerAddress,
};

const T: Duration = Duration::from_secs(30);
fn send_blob(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u64).to_le_bytes())?;
    s.write_all(b)
}

fn recv_blob(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 8];
    s.read_exact(&mut n)?;
    let mut v = vec![0u8; u64::from_le_bytes(n) as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ctx = Context::new(&UcxCfg::default())?;
    let worker = Worker::new(&ctx)?;
    match args.first().map(String::as_str) {
        Some("serve") => {
            let port: u16 = args.get(1).ok_or("PORT")?.parse()?;
            let mem = MemHandle::alloc(&ctx, 64 << 20, MemType::Host)?;
            let desc = mem.describe()?;
            let listener = Listener::bind(&worker, SocketAddr::from(([127, 0, 0, 1], port)))?;
            let oob = TcpListener::bind(("127.0.0.1", port + 1))?;
            oob.set_nonblocking(true)?;
            // Accepted endpoints are kept so that they stay open while their initiators put.
            let mut eps: Vec<Endpoint> = Vec::new();
            loop {
                worker.progress();
                if let Some(ep) = listener.try_accept()? {
                    eps.push(ep);
                }
                if let Ok((mut s, _)) = oob.accept() {
                    s.set_nonblocking(false)?;
                    send_blob(&mut s, &worker.address()?.0)?;
                    send_blob(&mut s, &desc.base.to_le_bytes())?;
                    send_blob(&mut s, &desc.len.to_le_bytes())?;
                    send_blob(&mut s, desc.rkey.as_bytes())?;
                }
            }
        }
        Some("put") => {
            let peer: SocketAddr = args.get(1).ok_or("HOST:PORT")?.parse()?;
            let how = args.get(2).ok_or("sockaddr|address")?.as_str();
            let size: usize = args.get(3).ok_or("SIZE")?.parse()?;
            let n: usize = args.get(4).ok_or("N")?.parse()?;
            let w: usize = args.get(5).ok_or("W")?.parse()?;
            let f: usize = args.get(6).map_or(Ok(0), |a| a.parse())?;
            let mut s = TcpStream::connect((peer.ip(), peer.port() + 1))?;
            let addr = WorkerAddress(recv_blob(&mut s)?);
            let base = u64::from_le_bytes(recv_blob(&mut s)?.try_into().map_err(|_| "base")?);
            let len = u64::from_le_bytes(recv_blob(&mut s)?.try_into().map_err(|_| "len")?);
            let rkey = PackedRkey(recv_blob(&mut s)?);
            let ep = match how {
                "address" => Endpoint::connect_address(&worker, &addr)?,
                _ => Endpoint::connect(&worker, peer)?,
            };
            ep.wait_connected(T)?;
            let remote = RemoteRegion::new(&ep, &RegionDesc { base, len, rkey })?;
            let local = MemHandle::alloc(&ctx, size * w, MemType::Host)?;
            let mut inflight = std::collections::VecDeque::new();
            let t0 = Instant::now();
            for i in 0..n {
                let slot = i % w;
                while inflight.len() >= w {
                    let mut r: gdpath_ucx::Request = inflight.pop_front().unwrap();
                    r.wait_mut(T)?;
                }
                let off = (slot * size) as u64;
                inflight.push_back(ep.put(&local, slot * size, &remote, off, size)?);
                if f > 0 && (i + 1) % f == 0 {
                    inflight.push_back(ep.flush_nb()?);
                }
            }
            for mut r in inflight {
                r.wait_mut(T)?;
            }
            ep.flush(T)?;
            let el = t0.elapsed().as_secs_f64();
            println!(
                "{how}: {n} puts of {size} B, {w} in flight, flush every {f}: {:.0} puts/s, {:.5} GB/s, lanes {:?}",
                n as f64 / el,
                (n * size) as f64 / el / 1e9,
                ep.transports()
                    .map(|t| t
                        .lanes
                        .iter()
                        .map(|l| l.transport.clone())
                        .collect::<Vec<_>>())
                    .unwrap_or_default()
            );
        }
        _ => {
            return Err(
                "usage: put_stream serve PORT | put HOST:PORT sockaddr|address SIZE N W [F]".into(),
            )
        }
    }
    Ok(())
}
