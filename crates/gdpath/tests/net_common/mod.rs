//! Helpers shared by the network tests (`net_loopback`, `net_garbage`): agents whose UCX
//! traffic stays on the loopback interface, and a small serving agent.
#![allow(dead_code)]

use gdpath::net::{FailureMode, NetConfig, Server, Token};
use gdpath::{Agent, AgentConfig, HostBuffer, Memory, Region};

/// The network configuration of these tests: UCX on `lo` only, failure mode `mode`.
pub fn cfg(mode: FailureMode) -> NetConfig {
    NetConfig {
        failure_mode: mode,
        devices: Some("lo".into()),
        ..NetConfig::default()
    }
}

/// An agent named `name` with the network backend enabled as [`cfg`] says.
pub fn agent(name: &str, mode: FailureMode) -> Agent {
    let a = Agent::new(AgentConfig {
        name: name.into(),
        ..AgentConfig::default()
    })
    .unwrap();
    a.enable_net(cfg(mode)).unwrap();
    a
}

/// A serving agent ("srv", peer failure detection) exporting one zeroed 4 KiB host region,
/// listening on an ephemeral loopback port with `token`: (agent, region, server).
pub fn small_server(token: Token) -> (Agent, Region, Server) {
    let server = agent("srv", FailureMode::Detect);
    let r = server
        .register(Memory::host(HostBuffer::zeroed(4096)))
        .unwrap();
    server.export(&r).unwrap();
    let srv = server.serve("127.0.0.1:0".parse().unwrap(), token).unwrap();
    (server, r, srv)
}
