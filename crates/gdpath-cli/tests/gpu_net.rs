//! GPU suite: GPU memory of this process ↔ memory exported by `gdpath serve` in another
//! process, through UCX. Needs an NVIDIA GPU (ignored otherwise; run with `--ignored` through
//! `scripts/gpu-suite.sh`). With a CUDA-enabled UCX the serving process exports GPU 1 when two
//! GPUs are visible, else GPU 0; without, it exports host memory.
//!
//! Which UCX is loaded decides what is asserted (both are checked, never skipped silently):
//! - a CUDA-enabled UCX (`GDPATH_UCX_LIB` pointing at the `libucx-cu13` wheel's libucp): the
//!   bytes move between the processes over `cuda_ipc` (the pair's path is `ucx:cuda_ipc`, as
//!   UCX's own protocol description says), never by software emulation (gdpath turns on
//!   cuda_ipc's get, which UCX's default turns off on GPUs without an active NVLink; with
//!   `UCX_CUDA_IPC_ENABLE_GET_ZCOPY` set by the user on such a GPU the get may be emulated,
//!   and the path must then say so);
//! - a UCX without CUDA (Debian's and Ubuntu's packages): the engine stages the local GPU
//!   memory through pinned host buffers and reports `gdr.ucx-no-cuda`.
//!
//! In both, every byte is checked after a put and after a get. An exported GPU region's cluster
//! record says it comes with a CUDA IPC handle. The `gdpath` binary is the one
//! cargo built for this test, or `GDPATH_BIN` when the test binary was copied to another
//! machine.

use gdpath::finding::ids;
use gdpath::net::{FailureMode, NetConfig};
use gdpath::{Agent, AgentConfig, DataPath, HostBuffer, Memory, TransferRequest};
use gdpath_bench::fill_pattern;
use std::time::Duration;

mod common;

use common::Proc;

const LEN: u64 = 64 << 20;

/// Starts `gdpath serve` exporting `export` (`gpu:N:64MiB`, `host:64MiB`); returns it and its
/// address.
fn serve(export: &str, fast_local: bool) -> (Proc, std::net::SocketAddr) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "120",
        "--export",
        export,
    ];
    if fast_local {
        args.push("--fast-local");
    }
    common::serve(&[], &args, Duration::from_secs(60))
}

fn gpu_count() -> u32 {
    gdpath_cuda::Cuda::load()
        .and_then(|c| c.device_count())
        .expect("this test needs an NVIDIA GPU and driver (run on the GPU machine)")
}

/// Whether CUDA device 0 (this process's GPU) has an active NVLink, as NVML reports its links.
fn gpu0_has_active_nvlink() -> bool {
    let pci = gdpath_cuda::Cuda::load()
        .and_then(|c| c.device(0))
        .and_then(|d| d.pci_bus_id())
        .expect("CUDA device 0's PCI address");
    let facts =
        gdpath_cuda::nvml::read().expect("NVML (the driver is present: this is a GPU test)");
    facts
        .gpus
        .iter()
        .any(|g| g.pci == pci && !g.nvlinks.is_empty())
}

fn round_trip(fast_local: bool) {
    let remote_gpu = if gpu_count() >= 2 { 1 } else { 0 };
    let agent = Agent::new(AgentConfig {
        name: "gpu-net-test".into(),
        // UCX's path is under test: the cuda backend's IPC path (gdpath's gpu_kv test) is off.
        gpu: gdpath::GpuConfig {
            ipc: false,
            ..gdpath::GpuConfig::default()
        },
        ..AgentConfig::default()
    })
    .unwrap();
    agent
        .enable_net(NetConfig {
            failure_mode: if fast_local {
                FailureMode::FastLocal
            } else {
                FailureMode::Detect
            },
            // UCX is under test, also where the peer exports (shared) host memory.
            shared_memory: false,
            ..NetConfig::default()
        })
        .unwrap();
    let cuda_ucx = agent.ucx_facts().expect("UCX facts").cuda_supported;
    // A UCX without CUDA cannot export GPU memory (`serve` refuses): the peer exports host
    // memory and the local GPU side is staged.
    let export = if cuda_ucx {
        format!("gpu:{remote_gpu}:64MiB")
    } else {
        "host:64MiB".to_owned()
    };
    let (_srv, addr) = serve(&export, fast_local);
    let peer = agent.connect(addr).unwrap();
    let remote = agent
        .register(peer.memory(peer.regions()[0].id).unwrap())
        .unwrap();
    let gpu = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: LEN,
        })
        .unwrap();
    let mut want = vec![0u8; LEN as usize];
    fill_pattern(&mut want, 0, 0x6e65_7447);
    let host = agent
        .register(Memory::host(HostBuffer::from_slice(&want)))
        .unwrap();
    let back = agent
        .register(Memory::host(HostBuffer::zeroed(LEN as usize)))
        .unwrap();
    let wait = |r: TransferRequest| agent.post(r).unwrap().wait().unwrap();

    // Host pattern → local GPU (CUDA backend), local GPU → remote GPU (the path under test),
    // then the remote read back into host memory over the network and compared.
    wait(TransferRequest::write(
        vec![host.desc(0, LEN)],
        vec![gpu.desc(0, LEN)],
    ));
    let put = wait(TransferRequest::write(
        vec![gpu.desc(0, LEN)],
        vec![remote.desc(0, LEN)],
    ));
    let get = wait(TransferRequest::read(
        vec![back.desc(0, LEN)],
        vec![remote.desc(0, LEN)],
    ));
    assert!(
        back.host_view().unwrap()[..] == want[..],
        "remote GPU memory differs from what was put"
    );
    // And a get into GPU memory: remote → local GPU (cleared first), then local GPU → host.
    let zeros = agent
        .register(Memory::host(HostBuffer::zeroed(LEN as usize)))
        .unwrap();
    wait(TransferRequest::write(
        vec![zeros.desc(0, LEN)],
        vec![gpu.desc(0, LEN)],
    ));
    let get_gpu = wait(TransferRequest::read(
        vec![gpu.desc(0, LEN)],
        vec![remote.desc(0, LEN)],
    ));
    let check = agent
        .register(Memory::host(HostBuffer::zeroed(LEN as usize)))
        .unwrap();
    wait(TransferRequest::read(
        vec![check.desc(0, LEN)],
        vec![gpu.desc(0, LEN)],
    ));
    assert!(
        check.host_view().unwrap()[..] == want[..],
        "GPU memory got from the remote GPU differs"
    );

    let (pp, gp) = (&put.pairs[0], &get_gpu.pairs[0]);
    println!(
        "UCX {} (CUDA memory: {cuda_ucx}), {} mode: put GPU0 → remote {export} path {} \
         ({:.1} GB/s), get remote → GPU0 path {}, get remote → host path {}",
        agent.ucx_facts().unwrap().version_string,
        if fast_local { "fast-local" } else { "detect" },
        pp.path,
        put.gbps(),
        gp.path,
        get.pairs[0].path
    );
    if cuda_ucx {
        let ipc = DataPath::Ucx {
            transport: "cuda_ipc".into(),
        };
        assert_eq!(pp.path, ipc, "put GPU → remote GPU did not run on cuda_ipc");
        let user_get_setting = std::env::var("UCX_CUDA_IPC_ENABLE_GET_ZCOPY").ok();
        if user_get_setting.is_none() {
            // gdpath sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y where the environment does not:
            // UCX's own default keeps cuda_ipc's get only for GPUs with an active NVLink
            // (openucx/ucx PR #7566) and emulates it elsewhere.
            assert_eq!(gp.path, ipc, "get remote GPU → GPU did not run on cuda_ipc");
        } else {
            // The user chose the setting (UCX's `auto` emulates the get where GPU 0 has no
            // active NVLink, `n` everywhere): an emulated get must say so, not claim cuda_ipc.
            let name = gp.path.name();
            assert!(
                gp.path == ipc || name.contains("software emulation"),
                "get reported {name}"
            );
            eprintln!(
                "UCX_CUDA_IPC_ENABLE_GET_ZCOPY={} is set (GPU 0 has an active NVLink: {}): the \
                 GPU → GPU get between processes ran on {name}",
                user_get_setting.unwrap_or_default(),
                gpu0_has_active_nvlink()
            );
        }
        assert_eq!(pp.finding, None);
    } else {
        assert_eq!(
            pp.finding.as_ref().map(|f| f.as_str()),
            Some(ids::GDR_UCX_NO_CUDA)
        );
        assert_eq!(
            gp.finding.as_ref().map(|f| f.as_str()),
            Some(ids::GDR_UCX_NO_CUDA)
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn gpu_to_gpu_between_processes_fast_local() {
    round_trip(true);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn gpu_to_gpu_between_processes_with_peer_error_handling() {
    round_trip(false);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn an_exported_gpu_region_is_recorded_with_its_cuda_ipc_handle() {
    gpu_count();
    let agent = Agent::new(AgentConfig::default()).unwrap();
    agent.enable_net(NetConfig::default()).unwrap();
    let gpu = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: LEN,
        })
        .unwrap();
    if !agent.ucx_facts().expect("UCX facts").cuda_supported {
        // A UCX without CUDA refuses GPU exports: there is nothing to record.
        assert_eq!(agent.export(&gpu).unwrap_err().kind(), "unsupported");
        return;
    }
    agent.export(&gpu).unwrap();
    // The cluster record says what the engine offers peers: the allocation's CUDA IPC handle
    // for agents of this node, no shared host memory.
    let rec = gdpath_cluster::RegionRecord::exported(&agent, &gpu).unwrap();
    assert_eq!(
        (rec.kind, rec.gpu, rec.len),
        (gdpath_cluster::RegionKind::Gpu, Some(0), LEN)
    );
    assert!(rec.cuda_ipc, "{rec:?}");
    assert!(!rec.shm, "{rec:?}");
}
