//! A peer process killed with SIGKILL must surface as a typed error, not a hang.
//!
//! Runs without the libtest harness: the binary re-executes itself as the peer (a server
//! holding a registered region) when GDPATH_UCX_PEER_CHILD is set, connects to it over
//! 127.0.0.1 `tcp`, checks cross-process get/put, kills it, and checks the errors.
//! Prints `peer_kill: N passed, 0 failed` on success; panics (non-zero exit) on failure.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, T};
use gdpath_ucx::{
    Context, Endpoint, Listener, MemHandle, MemType, PackedRkey, RegionDesc, RemoteRegion,
    UcxError, Worker,
};

const CHILD_ENV: &str = "GDPATH_UCX_PEER_CHILD";
const LEN: usize = 1 << 20;
const AM_DESC: u16 = 1;

fn child() {
    let ctx = Context::new(&common::cfg(Some("tcp"))).unwrap();
    let w = Worker::new(&ctx).unwrap();
    let l = Listener::bind(&w, "127.0.0.1:0".parse().unwrap()).unwrap();
    println!("PORT {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let ep = l.accept(T).unwrap();
    let mem = MemHandle::from_vec(&ctx, pattern(LEN, 42)).unwrap();
    let desc = mem.describe().unwrap();
    let mut header = desc.base.to_le_bytes().to_vec();
    header.extend_from_slice(&desc.len.to_le_bytes());
    ep.am_send(AM_DESC, &header, desc.rkey.as_bytes())
        .unwrap()
        .wait(T)
        .unwrap();
    // Serve the parent's puts and gets until killed (bounded in case the parent dies).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if w.progress() == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let mut passed = 0;
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer process");
    let mut line = String::new();
    BufReader::new(peer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("peer said {line:?}"));

    let ctx = Context::new(&common::cfg(Some("tcp"))).unwrap();
    let w = Worker::new(&ctx).unwrap();
    w.am_register(AM_DESC).unwrap();
    let ep = Endpoint::connect(&w, format!("127.0.0.1:{port}").parse().unwrap()).unwrap();
    ep.wait_connected(T).unwrap();
    let msg = w.am_recv(AM_DESC, T).unwrap();
    assert_eq!(msg.header.len(), 16, "region header");
    let desc = RegionDesc {
        base: u64::from_le_bytes(msg.header[..8].try_into().unwrap()),
        len: u64::from_le_bytes(msg.header[8..].try_into().unwrap()),
        rkey: PackedRkey(msg.data.to_vec()),
    };
    assert_eq!(desc.len, LEN as u64);
    let region = RemoteRegion::new(&ep, &desc).unwrap();

    // Cross-process get of the peer's bytes, then put + flush + get back.
    let local = MemHandle::alloc(&ctx, LEN, MemType::Host).unwrap();
    ep.get(&local, 0, &region, 0, LEN).unwrap().wait(T).unwrap();
    let mut got = vec![0u8; LEN];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(LEN, 42), "cross-process get not byte-exact");
    local.write(0, &pattern(LEN, 7)).unwrap();
    ep.put(&local, 0, &region, 0, LEN).unwrap().wait(T).unwrap();
    ep.flush(T).unwrap();
    let back = MemHandle::alloc(&ctx, LEN, MemType::Host).unwrap();
    ep.get(&back, 0, &region, 0, LEN).unwrap().wait(T).unwrap();
    back.read(0, &mut got).unwrap();
    assert!(got == pattern(LEN, 7), "cross-process put not byte-exact");
    passed += 1;

    // Post a get, kill the peer: the request must end (done or failed), never time out.
    let pending = ep.get(&back, 0, &region, 0, LEN).unwrap();
    peer.kill().expect("kill -9 peer");
    peer.wait().unwrap();
    let start = Instant::now();
    match pending.wait(T) {
        Ok(()) | Err(UcxError::EndpointFailed { .. }) => {}
        Err(e) => panic!("get in flight at the kill ended with {e:?}"),
    }
    // Later operations fail with EndpointFailed within the bound.
    let err = loop {
        let r = ep
            .put(&local, 0, &region, 0, 4096)
            .and_then(|r| r.wait(T))
            .and_then(|()| ep.flush(T));
        if let Err(e) = r {
            break e;
        }
        assert!(start.elapsed() < T, "killed peer not detected within {T:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = start.elapsed();
    match &err {
        UcxError::EndpointFailed { status, .. } => assert!(status.is_peer_failure(), "{status}"),
        e => panic!("expected EndpointFailed after kill -9, got {e:?}"),
    }
    assert!(ep.failure().is_some());
    eprintln!("peer killed: detected after {took:?}: {err}");
    passed += 1;
    drop(region);
    drop(ep);
    println!("peer_kill: {passed} passed, 0 failed");
}
