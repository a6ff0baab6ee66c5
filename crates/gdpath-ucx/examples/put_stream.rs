//! Streams small puts from one process to another with gdpath-ucx alone (no engine), to tell
//! UCX's own cost from the engine's: `ucx_perftest -t ucp_put_bw`-like, N puts of SIZE bytes
//! with at most W in flight, one flush at the end, rate = N / (last flush done − first post).
//!
//! Usage (two shells, or `&`):
//!   put_stream serve PORT                      # target: maps 64 MiB, serves until killed
//!   put_stream put HOST:PORT sockaddr|address SIZE N W [F]
//! With F, an endpoint flush is posted after every F puts and waited for before the window
//! moves past it (as the engine confirms each transfer of F puts).
//!   put_stream amput HOST:PORT SIZE N W G
//! `amput` is the prototype of a different protocol, for comparison: no UCX put at all; the
//! N writes of SIZE bytes go as active messages carrying G writes each (a header of (offset,
//! length) records, then their bytes), which the target bounds-checks and copies into a buffer
//! of its own, checks (each write's bytes carry its slot number) and acknowledges with one small
//! active message; at most W writes (W / G messages) are unacknowledged at a time. Over UCX
//! 1.13's tcp, whose puts are all emulated with an acknowledgement each, this is what an engine
//! could do for a transfer of many small writes; it is the protocol gdpath's packed writes use
//! (docs/network.md, "Packed writes over tcp").
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
/// Active-message ids of the `amput` prototype: writes to the target, acknowledgements back.
const WRITES_AM: u16 = 0x7701;
const ACK_AM: u16 = 0x7702;
/// The target's buffer for `amput` writes.
const AM_REGION: usize = 64 << 20;

/// The byte an `amput` write to `offset` carries (its slot number, mod 251).
fn slot_byte(offset: u64, size: u64) -> u8 {
    ((offset / size) % 251) as u8
}

/// Applies one `amput` message to `region`: a header of `count: u32` then `count` records
/// `(offset: u64, len: u32)`, little-endian, and the records' bytes back to back. Returns the
/// number of writes whose bytes were not their slot's, or an error naming what is malformed
/// (the sender is another process: nothing is trusted).
fn apply_writes(region: &mut [u8], header: &[u8], data: &[u8]) -> Result<u32, String> {
    let count = u32::from_le_bytes(header.get(..4).ok_or("short header")?.try_into().unwrap());
    let mut bad = 0;
    let mut at = 0usize;
    for k in 0..count as usize {
        let rec = header.get(4 + 12 * k..16 + 12 * k).ok_or("short record")?;
        let off = u64::from_le_bytes(rec[..8].try_into().unwrap());
        let len = u32::from_le_bytes(rec[8..].try_into().unwrap()) as usize;
        let src = data
            .get(at..at + len)
            .ok_or("data shorter than its records")?;
        let dst = usize::try_from(off)
            .ok()
            .and_then(|o| region.get_mut(o..o.checked_add(len)?))
            .ok_or("write out of the region")?;
        dst.copy_from_slice(src);
        let want = slot_byte(off, len.max(1) as u64);
        if len > 0 && (src[0] != want || src[len - 1] != want) {
            bad += 1;
        }
        at += len;
    }
    if at != data.len() {
        return Err("data longer than its records".into());
    }
    Ok(bad)
}

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
            worker.am_register(WRITES_AM)?;
            let mut region = vec![0u8; AM_REGION];
            let oob = TcpListener::bind(("127.0.0.1", port + 1))?;
            oob.set_nonblocking(true)?;
            let mut eps: Vec<Endpoint> = Vec::new();
            loop {
                worker.progress();
                if let Some(ep) = listener.try_accept()? {
                    eps.push(ep);
                }
                while let Some(m) = worker.am_try_recv(WRITES_AM) {
                    let bad = apply_writes(&mut region, &m.header, &m.data)
                        .unwrap_or_else(|e| panic!("malformed amput message: {e}"));
                    if let Some(ep) = eps.iter().find(|e| Some(e.id()) == m.reply_ep) {
                        // Dropping the request leaves it to complete on its own.
                        drop(ep.am_send(ACK_AM, &bad.to_le_bytes(), &[])?);
                    }
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
        Some("amput") => {
            let peer: SocketAddr = args.get(1).ok_or("HOST:PORT")?.parse()?;
            let size: usize = args.get(2).ok_or("SIZE")?.parse()?;
            let n: usize = args.get(3).ok_or("N")?.parse()?;
            let w: usize = args.get(4).ok_or("W")?.parse()?;
            let g: usize = args.get(5).ok_or("G")?.parse()?;
            if size == 0 || g == 0 || w < g || size * w > AM_REGION {
                return Err("need SIZE > 0, 0 < G <= W and SIZE * W <= 64 MiB".into());
            }
            worker.am_register(ACK_AM)?;
            let ep = Endpoint::connect(&worker, peer)?;
            ep.wait_connected(T)?;
            // Slot k holds the bytes every write to offset k·SIZE carries.
            let mut local = vec![0u8; size * w];
            for (k, slot) in local.chunks_mut(size).enumerate() {
                slot.fill(slot_byte((k * size) as u64, size as u64));
            }
            let msgs = n.div_ceil(g);
            let window = (w / g).max(1);
            let (mut acked, mut bad) = (0usize, 0u64);
            let mut reqs = std::collections::VecDeque::new();
            let take_acks = |acked: &mut usize, bad: &mut u64| {
                while let Some(a) = worker.am_try_recv(ACK_AM) {
                    *acked += 1;
                    *bad += u64::from(u32::from_le_bytes(a.header[..4].try_into().unwrap()));
                }
            };
            let (mut header, mut data) = (Vec::new(), Vec::new());
            let t0 = Instant::now();
            for m in 0..msgs {
                while m - acked >= window {
                    worker.progress();
                    take_acks(&mut acked, &mut bad);
                }
                header.clear();
                data.clear();
                let writes = m * g..((m + 1) * g).min(n);
                header.extend_from_slice(&(writes.len() as u32).to_le_bytes());
                for i in writes {
                    let off = (i % w) * size;
                    header.extend_from_slice(&(off as u64).to_le_bytes());
                    header.extend_from_slice(&(size as u32).to_le_bytes());
                    data.extend_from_slice(&local[off..off + size]);
                }
                reqs.push_back(ep.am_send(WRITES_AM, &header, &data)?);
                while reqs.len() > window {
                    let mut r: gdpath_ucx::Request = reqs.pop_front().unwrap();
                    r.wait_mut(T)?;
                }
            }
            while acked < msgs {
                worker.progress();
                take_acks(&mut acked, &mut bad);
            }
            let el = t0.elapsed().as_secs_f64();
            if bad > 0 {
                return Err(format!("{bad} writes arrived with the wrong bytes").into());
            }
            println!(
                "amput: {n} writes of {size} B in messages of {g}, {w} in flight: {:.0} writes/s, \
                 {:.5} GB/s, all acknowledged and checked at the target",
                n as f64 / el,
                (n * size) as f64 / el / 1e9
            );
        }
        _ => {
            return Err(
                "usage: put_stream serve PORT | put HOST:PORT sockaddr|address SIZE N W \
                 [F] | amput HOST:PORT SIZE N W G"
                    .into(),
            )
        }
    }
    Ok(())
}
