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
    agent_with(name, cfg(mode))
}

/// An agent named `name` with the network backend enabled with `net`.
pub fn agent_with(name: &str, net: NetConfig) -> Agent {
    let a = Agent::new(AgentConfig {
        name: name.into(),
        ..AgentConfig::default()
    })
    .unwrap();
    a.enable_net(net).unwrap();
    a
}

/// `server` exports a host region holding `bytes` and listens on an ephemeral loopback port
/// with `token`: (the region, its export id, the server).
pub fn export_and_serve(server: &Agent, bytes: &[u8], token: Token) -> (Region, u64, Server) {
    let r = server
        .register(Memory::host(HostBuffer::from_slice(bytes)))
        .unwrap();
    let id = server.export(&r).unwrap();
    let srv = server.serve("127.0.0.1:0".parse().unwrap(), token).unwrap();
    (r, id, srv)
}

/// A serving agent ("srv", peer failure detection) exporting one zeroed 4 KiB host region,
/// listening on an ephemeral loopback port with `token`: (agent, region, server).
pub fn small_server(token: Token) -> (Agent, Region, Server) {
    let server = agent("srv", FailureMode::Detect);
    let (r, _, srv) = export_and_serve(&server, &[0; 4096], token);
    (server, r, srv)
}
