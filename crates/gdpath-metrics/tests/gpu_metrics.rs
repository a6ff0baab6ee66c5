//! GPU suite: the metrics of GPU paths. GPU memory and pinned host memory registered show in
//! `gdpath_registered_bytes` by kind and device, and go when released; host → GPU (pinned and
//! pageable), GPU → host and, with two GPUs, GPU → GPU transfers show in `gdpath_bytes_total`
//! under the path each pair's report names, and a pair planned with a finding (pageable memory
//! staged through pinned buffers) in `gdpath_fallback_bytes_total` under its finding id.
//! Needs an NVIDIA GPU; run with `scripts/gpu-suite.sh` (built by `scripts/build-gpu-suite.sh`
//! as `gpu_metrics`). One test in its own binary: the counters it reads are its own.

use gdpath::{Agent, AgentConfig, HostBuffer, Memory, TransferReport, TransferRequest};
use std::collections::BTreeMap;

const LEN: u64 = 64 << 20;

/// The value of the sample whose line starts with `prefix` (name and labels), 0 when absent.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine (scripts/gpu-suite.sh)"]
fn gpu_paths_and_registrations_are_counted() {
    let agent = Agent::new(AgentConfig::default()).unwrap();
    assert!(
        agent.backends().iter().any(|b| b.name == "cuda"),
        "no cuda backend: this test needs an NVIDIA GPU and driver"
    );
    let gpus = gdpath_cuda::Cuda::load()
        .and_then(|c| c.device_count())
        .unwrap();
    let gpu0 = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: LEN,
        })
        .unwrap();
    let pinned = agent
        .register(Memory::pinned(HostBuffer::zeroed(LEN as usize)))
        .unwrap();
    let pageable = agent
        .register(Memory::host(HostBuffer::zeroed(LEN as usize)))
        .unwrap();
    let t = gdpath_metrics::text().unwrap();
    let gpu_bytes = "gdpath_registered_bytes{kind=\"gpu\",device=\"0\"}";
    assert_eq!(sample(&t, gpu_bytes), LEN as f64, "{t}");
    let pinned_bytes = "gdpath_registered_bytes{kind=\"host-pinned\",device=\"host\"}";
    assert_eq!(sample(&t, pinned_bytes), LEN as f64, "{t}");

    let mut moved: BTreeMap<String, u64> = BTreeMap::new();
    let mut fallbacks: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut add = |r: TransferReport| {
        for p in r.pairs {
            *moved.entry(p.path.name()).or_default() += p.bytes;
            if let Some(f) = p.finding {
                *fallbacks
                    .entry((f.as_str().to_owned(), p.path.name()))
                    .or_default() += p.bytes;
            }
        }
    };
    let write = |src: &gdpath::Region, dst: &gdpath::Region| {
        let req = TransferRequest::write(vec![src.desc(0, LEN)], vec![dst.desc(0, LEN)]);
        agent.post(req).unwrap().wait().unwrap()
    };
    add(write(&pinned, &gpu0));
    add(write(&pageable, &gpu0));
    add(write(&gpu0, &pageable));
    let gpu1 = (gpus > 1).then(|| {
        agent
            .register(Memory::Gpu {
                ordinal: 1,
                len: LEN,
            })
            .unwrap()
    });
    if let Some(g1) = &gpu1 {
        add(write(&gpu0, g1));
    } else {
        eprintln!("one GPU: no GPU → GPU pair counted (run with two for p2p-*/staged)");
    }

    let t = gdpath_metrics::text().unwrap();
    for (path, bytes) in &moved {
        let prefix = format!(
            "gdpath_bytes_total{{op=\"write\",path=\"{path}\",peer=\"local\",outcome=\"ok\"}}"
        );
        assert_eq!(sample(&t, &prefix), *bytes as f64, "{prefix}\n{t}");
    }
    for ((finding, path), bytes) in &fallbacks {
        let prefix =
            format!("gdpath_fallback_bytes_total{{finding=\"{finding}\",path=\"{path}\"}}");
        assert_eq!(sample(&t, &prefix), *bytes as f64, "{prefix}\n{t}");
    }
    println!("paths: {moved:?}; fallbacks: {fallbacks:?}");

    drop((gpu0, gpu1, pinned, pageable));
    let t = gdpath_metrics::text().unwrap();
    assert_eq!(sample(&t, gpu_bytes), 0.0, "{t}");
    assert_eq!(sample(&t, pinned_bytes), 0.0, "{t}");
}
