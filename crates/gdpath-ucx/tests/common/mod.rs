//! Shared helpers: two workers of one process connected over a 127.0.0.1 listener.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use gdpath_ucx::{Context, Endpoint, ErrorMode, Features, Listener, UcxCfg, Worker};

pub const T: Duration = Duration::from_secs(20);

/// Progresses a worker on a background thread until dropped (the target of emulated RMA
/// must keep progressing).
pub struct BgProgress {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl BgProgress {
    pub fn new(w: &Worker) -> BgProgress {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, w) = (stop.clone(), w.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if w.progress() == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        BgProgress {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for BgProgress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().expect("progress thread panicked");
        }
    }
}

/// A context configuration for tests: network transports limited to the loopback device
/// (`UCX_NET_DEVICES=lo`), so that no test traffic uses another interface's address.
pub fn cfg(transports: Option<&str>) -> UcxCfg {
    UcxCfg {
        features: Features::RMA | Features::AM,
        transports: transports.map(str::to_string),
        devices: Some("lo".into()),
        ..UcxCfg::default()
    }
}

/// Server and client sides in one process. Field order is drop order: endpoints first.
pub struct Pair {
    pub client_ep: Endpoint,
    pub server_ep: Endpoint,
    pub bg: Option<BgProgress>,
    pub listener: Listener,
    pub client: Worker,
    pub server: Worker,
    pub ctx: Context,
    pub addr: SocketAddr,
}

impl Pair {
    /// A context with `transports`, two workers, a listener on 127.0.0.1 (free port) and a
    /// connected endpoint on each side; the server worker progresses in the background.
    pub fn new(transports: Option<&str>) -> Pair {
        Self::new_with(transports, ErrorMode::Peer)
    }

    /// As [`Pair::new`], with the endpoints' error handling mode given.
    pub fn new_with(transports: Option<&str>, mode: ErrorMode) -> Pair {
        let ctx = Context::new(&cfg(transports)).expect("context");
        let server = Worker::new(&ctx).expect("server worker");
        let client = Worker::new(&ctx).expect("client worker");
        let listener =
            Listener::bind_with(&server, "127.0.0.1:0".parse().unwrap(), mode).expect("listen");
        let addr = listener.local_addr().expect("listener address");
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
        let bg = BgProgress::new(&server);
        let client_ep = Endpoint::connect_with(&client, addr, mode).expect("connect");
        // Accept while the client side progresses too; then check the client is connected.
        let start = std::time::Instant::now();
        let server_ep = loop {
            client.progress();
            if let Some(ep) = listener.try_accept().expect("accept") {
                break ep;
            }
            assert!(start.elapsed() < T, "no connection request within {T:?}");
            std::thread::yield_now();
        };
        client_ep.wait_connected(T).expect("client connected");
        Pair {
            client_ep,
            server_ep,
            bg: Some(bg),
            listener,
            client,
            server,
            ctx,
            addr,
        }
    }
}

/// Deterministic bytes (xorshift64) so a misplaced or stale byte shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
