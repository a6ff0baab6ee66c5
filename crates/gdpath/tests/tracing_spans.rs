//! A transfer as `tracing` spans: `transfer` with its `plan` and `post` phases, each pair's
//! `copy` and the `completion` event under the transfer's span, as a subscriber of the
//! application's sees them (here `tracing-subscriber`'s formatter into a buffer). A host → host
//! copy completes on the posting thread, so the thread-local subscriber sees every event.

use gdpath::{Agent, AgentConfig, HostBuffer, Memory, TransferRequest};
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_transfer_is_a_span_with_its_phases_copies_and_completion() {
    let buf = Buf::default();
    let w = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let agent = Agent::new(AgentConfig::default()).unwrap();
        let src = agent
            .register(Memory::host(HostBuffer::from_slice(&[3u8; 8192])))
            .unwrap();
        let dst = agent
            .register(Memory::host(HostBuffer::zeroed(8192)))
            .unwrap();
        let req = TransferRequest::write(
            vec![src.desc(0, 4096), src.desc(4096, 4096)],
            vec![dst.desc(0, 4096), dst.desc(4096, 4096)],
        );
        agent.post(req).unwrap().wait().unwrap();
    });
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let find = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in:\n{out}"))
    };
    let plan = find("plan{pairs=2}: gdpath::agent: new");
    let post = find("transfer{id=1 pairs=2}:post: gdpath::agent: new");
    let copy = find(
        "transfer{id=1 pairs=2}: gdpath::transfer::shared: copy pair=1 path=host-copy bytes=4096",
    );
    let done = find("transfer{id=1 pairs=2}: gdpath::transfer::shared: completion bytes=8192");
    assert!(plan < post && post < copy && copy < done, "{out}");
}
