//! The GPU suites' engine helpers (feature `agent`): an agent with the file ↔ GPU path's
//! chunking, and GPU region bytes read and written through a host region, so that a suite
//! checks GPU memory with the engine's own transfers. Every failure panics: these run in tests.

use gdpath::{Agent, AgentConfig, GdsConfig, HostBuffer, Memory, Region, TransferRequest};

/// An agent whose file ↔ GPU paths move `chunk` bytes at a time on `threads` threads (the
/// rest of the configuration default). Panics when the agent cannot be made.
pub fn gds_agent(chunk: u64, threads: usize) -> Agent {
    Agent::new(AgentConfig {
        gds: GdsConfig {
            chunk,
            threads,
            ..GdsConfig::default()
        },
        ..AgentConfig::default()
    })
    .expect("an agent with the GPU suite's GDS settings")
}

/// `len` bytes at byte `off` of GPU region `g`, read through a host region. Panics on a
/// failed registration or transfer.
pub fn gpu_bytes(a: &Agent, g: &Region, off: u64, len: u64) -> Vec<u8> {
    let h = a
        .register(Memory::host(HostBuffer::zeroed(len as usize)))
        .expect("registering the host window");
    let read = TransferRequest::read(vec![h.desc(0, len)], vec![g.desc(off, len)]);
    a.post(read)
        .expect("posting the GPU read")
        .wait()
        .expect("the GPU read");
    let v = h.host_view().expect("the host window's bytes").to_vec();
    v
}

/// Writes `bytes` at byte `off` of GPU region `g`, through a host region. Panics on a failed
/// registration or transfer.
pub fn gpu_put(a: &Agent, g: &Region, off: u64, bytes: &[u8]) {
    let h = a
        .register(Memory::host(HostBuffer::from_slice(bytes)))
        .expect("registering the host window");
    let n = bytes.len() as u64;
    let write = TransferRequest::write(vec![h.desc(0, n)], vec![g.desc(off, n)]);
    a.post(write)
        .expect("posting the GPU write")
        .wait()
        .expect("the GPU write");
}
