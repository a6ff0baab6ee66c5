//! The exposition: the engine's metrics after real transfers in the Prometheus text format
//! (checked by `promtool check metrics`, Debian's `prometheus` package), and the `/metrics`
//! endpoint's bounds (request size, time, method and target) over real TCP connections.

use gdpath::{Agent, AgentConfig, DirectIo, FileSpec, HostBuffer, Memory, TransferRequest};
use gdpath_metrics::{text, MetricsServer, MAX_REQUEST_BYTES, REQUEST_TIMEOUT};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn server() -> MetricsServer {
    MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap()
}

/// Sends `request` and returns the whole answer.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer (431) and close before reading everything sent.
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The only test of this binary that moves bytes or fails a post, so the counters it reads
/// are its own.
#[test]
fn a_host_copy_is_counted_and_the_text_passes_promtool() {
    let agent = Agent::new(AgentConfig::default()).unwrap();
    let len = 3 << 20;
    let src = agent
        .register(Memory::host(HostBuffer::from_slice(&vec![1u8; len])))
        .unwrap();
    let dst = agent
        .register(Memory::host(HostBuffer::zeroed(len)))
        .unwrap();
    let n = len as u64;
    for _ in 0..2 {
        agent
            .post(TransferRequest::write(
                vec![src.desc(0, n)],
                vec![dst.desc(0, n)],
            ))
            .unwrap()
            .wait()
            .unwrap();
    }
    // A file written with O_DIRECT turned off: the buffered path, a fallback with its finding.
    let dir = tempfile::tempdir().unwrap();
    let spec = FileSpec::write(dir.path().join("f")).direct(DirectIo::Off);
    let file = agent.register(Memory::File(spec)).unwrap();
    let r = agent
        .post(TransferRequest::write(
            vec![src.desc(0, n)],
            vec![file.desc(0, n)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    let finding = r.pairs[0].finding.clone().expect("a fallback says why");
    assert_eq!(r.pairs[0].path.name(), "posix-buffered");
    let t = text().unwrap();
    let want = format!(
        "gdpath_fallback_bytes_total{{finding=\"{}\",path=\"posix-buffered\"}} {n}\n",
        finding.as_str()
    );
    assert!(t.contains(&want), "{want}\n{t}");
    let want = format!(
        "gdpath_bytes_total{{op=\"write\",path=\"host-copy\",peer=\"local\",outcome=\"ok\"}} {}\n",
        2 * n
    );
    assert!(t.contains(&want), "{t}");
    assert!(
        t.contains(
            "gdpath_pairs_total{op=\"write\",path=\"host-copy\",peer=\"local\",outcome=\"ok\"} 2\n"
        ),
        "{t}"
    );
    assert!(t.contains("gdpath_transfers_in_flight 0\n"), "{t}");
    // Both host regions are alive and registered (no other test here registers memory; the
    // file is not counted).
    let registered = |t: &str| -> i64 {
        t.lines()
            .find_map(|l| {
                l.strip_prefix("gdpath_registered_bytes{kind=\"host-pageable\",device=\"host\"} ")
            })
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(registered(&t), 2 * len as i64, "{t}");
    // A failed post is counted by its error kind.
    let e = agent
        .post(TransferRequest::write(
            vec![src.desc(0, 2 * n)],
            vec![dst.desc(0, 2 * n)],
        ))
        .unwrap_err();
    assert_eq!(e.kind(), "out_of_bounds");
    let t = text().unwrap();
    assert!(
        t.contains("gdpath_errors_total{kind=\"out_of_bounds\"} 1\n"),
        "{t}"
    );

    // Released with the regions.
    drop((src, dst, file, agent));
    assert_eq!(registered(&text().unwrap()), 0);

    let Some(promtool) = gdpath_testkit::prometheus_tool("promtool", "promtool check metrics")
    else {
        return;
    };
    gdpath_testkit::promtool_check_metrics(&promtool, &t).unwrap();
}

#[test]
fn only_get_metrics_is_served() {
    let s = server();
    let ok = exchange(s.local_addr(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(
        ok.contains("Content-Type: text/plain; version=0.0.4"),
        "{ok}"
    );
    assert!(ok.contains("# TYPE gdpath_bytes_total counter"), "{ok}");
    let other = exchange(s.local_addr(), b"GET /admin HTTP/1.1\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    let post = exchange(
        s.local_addr(),
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("Allow: GET"), "{post}");
}

#[test]
fn an_oversized_request_is_refused_and_the_next_one_served() {
    let s = server();
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.resize(4 * MAX_REQUEST_BYTES, b'a');
    let answer = exchange(s.local_addr(), &big);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.200}");
    let ok = exchange(s.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok:.200}");
}

#[test]
fn a_client_that_never_finishes_its_request_is_dropped_in_bounded_time() {
    let s = server();
    let mut slow = TcpStream::connect(s.local_addr()).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let t0 = Instant::now();
    // The next client waits behind the slow one for at most REQUEST_TIMEOUT.
    let ok = exchange(s.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok:.200}");
    assert!(
        t0.elapsed() < REQUEST_TIMEOUT + Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    // The slow one was closed without an answer.
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
}

#[test]
fn a_busy_address_is_a_bind_error() {
    let s = server();
    let e = MetricsServer::bind(s.local_addr()).unwrap_err();
    assert!(
        matches!(e, gdpath_metrics::MetricsError::Bind { .. }),
        "{e}"
    );
    assert!(e.to_string().contains(&s.local_addr().to_string()), "{e}");
}
