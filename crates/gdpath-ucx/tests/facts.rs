//! Facts about the loaded UCX, cross-checked against UCX's own `ucx_info` where it is the
//! same build (the default `libucp.so.0`; skipped with a message when GDPATH_UCX_LIB points
//! elsewhere or ucx_info is absent).

mod common;

use std::process::Command;

use common::Pair;
use gdpath_ucx::{
    Context, ErrorMode, MemType, RmaBasis, TransportSource, Ucx, UcxError, MIN_VERSION,
};

/// `ucx_info ARGS` output, when the tool exists and describes the library we loaded.
fn ucx_info(args: &[&str]) -> Option<String> {
    let ucx = Ucx::load().unwrap();
    if ucx.library() != gdpath_ucx::LIBUCP_SONAME {
        eprintln!(
            "skipped ucx_info cross-check: loaded {} rather than the system libucp",
            ucx.library()
        );
        return None;
    }
    match Command::new("ucx_info").args(args).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => panic!(
            "ucx_info {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            eprintln!("skipped ucx_info cross-check: ucx_info not runnable ({e}); apt-get install ucx-utils");
            None
        }
    }
}

#[test]
fn loads_and_reports_version() {
    let _serial = gdpath_testkit::ucx_serial();
    let ucx = Ucx::load().expect("libucp.so.0 (apt-get install libucx0)");
    let v = ucx.version();
    assert!(v >= MIN_VERSION, "{v}");
    assert!(
        ucx.version_string()
            .starts_with(&format!("{}.{}", v.major, v.minor)),
        "{} vs {v}",
        ucx.version_string()
    );
    assert_eq!(ucx.has_ep_transport_query(), v.minor >= 14);
    assert!(ucx
        .status_string(gdpath_ucx::Status(-6))
        .to_lowercase()
        .contains("unreachable"));
    // Loading again returns the same library; another path is refused while one is loaded.
    assert!(std::sync::Arc::ptr_eq(&ucx, &Ucx::load().unwrap()));
    assert!(matches!(
        Ucx::load_from("libucp.so"),
        Err(UcxError::AlreadyLoaded { .. }) | Ok(_)
    ));
    if let Some(text) = ucx_info(&["-v"]) {
        // 1.13: "# Version 1.13.1"; 1.16+: "# Library version: 1.16.0".
        let found = text
            .split_whitespace()
            .find(|t| t.split('.').count() == 3 && t.split('.').all(|p| p.parse::<u32>().is_ok()))
            .expect("a version in ucx_info -v");
        assert_eq!(found, v.to_string(), "ucx_info -v says {found}");
    }
}

/// (transport, device) pairs `ucx_info -d` lists.
fn ucx_info_devices(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut tl = None;
    for line in text.lines() {
        let l = line.trim_start_matches('#').trim();
        if let Some(t) = l.strip_prefix("Transport:") {
            tl = Some(t.trim().to_string());
        } else if let Some(d) = l.strip_prefix("Device:") {
            if let Some(t) = &tl {
                out.push((t.clone(), d.trim().to_string()));
            }
        }
    }
    out
}

#[test]
fn transports_tcp_only_and_default() {
    let _serial = gdpath_testkit::ucx_serial();
    let tcp = Context::new(&common::cfg(Some("tcp")))
        .unwrap()
        .facts()
        .unwrap();
    assert!(!tcp.resources.is_empty());
    assert!(
        tcp.resources.iter().all(|r| r.transport == "tcp"),
        "{:?}",
        tcp.resources
    );
    assert!(
        tcp.resources.iter().any(|r| r.device == "lo"),
        "tcp/lo missing: {:?}",
        tcp.resources
    );

    let def = Context::new(&common::cfg(None)).unwrap().facts().unwrap();
    let names: Vec<String> = def.resources.iter().map(|r| r.to_string()).collect();
    assert!(names.iter().any(|n| n.starts_with("tcp/")), "{names:?}");
    assert!(
        def.resources
            .iter()
            .any(|r| ["posix", "sysv", "cma"].contains(&r.transport.as_str())),
        "no shared-memory transport in {names:?}"
    );
    assert!(def.memory_types.contains(&MemType::Host));
    if let Some(text) = ucx_info(&["-d"]) {
        let listed = ucx_info_devices(&text);
        for r in &def.resources {
            // ucx_info names the self device "memory"; a context may number it ("memory0").
            let ok = listed.iter().any(|(t, d)| {
                *t == r.transport && (*d == r.device || r.device.starts_with(d.as_str()))
            });
            assert!(ok, "{r} not in ucx_info -d ({listed:?})");
        }
    }

    // An unknown transport name is a typed error, not a panic.
    match Context::new(&common::cfg(Some("no_such_transport"))) {
        Err(UcxError::Status { .. }) => {}
        Ok(ctx) => {
            // Some UCX versions only warn; then the context has no resources to offer.
            let r = ctx.resources().unwrap();
            assert!(r.is_empty(), "{r:?}");
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn cuda_support_matches_the_build() {
    let _serial = gdpath_testkit::ucx_serial();
    let ctx = Context::new(&common::cfg(None)).unwrap();
    let f = ctx.facts().unwrap();
    assert_eq!(f.cuda_supported, f.memory_types.contains(&MemType::Cuda));
    if let Some(text) = ucx_info(&["-b"]) {
        // `ucx_info -b` prints the build's config.h; CUDA builds define HAVE_CUDA 1.
        let built_with_cuda = text.lines().any(|l| l.trim() == "#define HAVE_CUDA 1");
        if built_with_cuda {
            eprintln!(
                "this UCX is built with CUDA; cuda_supported={} depends on libcuda and a GPU",
                f.cuda_supported
            );
        } else {
            assert!(
                !f.cuda_supported,
                "UCX without CUDA reports CUDA memory support"
            );
        }
    }
    if !f.cuda_supported {
        let p = Pair::new(Some("tcp"));
        assert!(matches!(
            p.client_ep.rma_transports(MemType::Cuda),
            Err(UcxError::MemTypeUnsupported(MemType::Cuda, _))
        ));
    }
}

#[test]
fn endpoint_transports_over_tcp() {
    let _serial = gdpath_testkit::ucx_serial();
    let p = Pair::new(Some("tcp"));
    let t = p.client_ep.transports().unwrap();
    let ucx = p.ctx.ucx().clone();
    let expect = if ucx.has_ep_transport_query() {
        TransportSource::EpQuery
    } else {
        TransportSource::PrintInfo
    };
    assert_eq!(t.source, expect);
    assert!(!t.lanes.is_empty());
    assert!(
        t.lanes.iter().all(|l| l.transport == "tcp"),
        "{:?}",
        t.lanes
    );
    assert!(t.lanes.iter().all(|l| l.device == "lo"), "{:?}", t.lanes);

    let rma = p.client_ep.rma_transports(MemType::Host).unwrap();
    assert!(!rma.lanes.is_empty());
    assert!(rma.lanes.iter().all(|l| l.transport == "tcp"));
    // UCX 1.13 marks tcp/lo `rma_bw` for client-server endpoints (put/get over tcp, served
    // by the target's progress); other versions may emulate them with active messages.
    assert!(
        matches!(rma.basis, RmaBasis::AmEmulation | RmaBasis::RmaLanes),
        "{rma:?}"
    );
    eprintln!("tcp endpoint: {:?}; put/get: {:?}", t, rma);
}

#[test]
fn endpoint_transports_default() {
    let _serial = gdpath_testkit::ucx_serial();
    // Peer error handling (the default): UCX uses only transports that detect peer failure.
    let p = Pair::new(None);
    let t = p.client_ep.transports().unwrap();
    let rma = p.client_ep.rma_transports(MemType::Host).unwrap();
    eprintln!(
        "default transports, peer error handling: {:?}\nput/get: {:?}",
        t.lanes, rma
    );
    assert!(!t.lanes.is_empty() && !rma.lanes.is_empty());
    drop(p);

    // Without it, two workers of one process must share memory rather than use tcp.
    let p = Pair::new_with(None, ErrorMode::None);
    let t = p.client_ep.transports().unwrap();
    let rma = p.client_ep.rma_transports(MemType::Host).unwrap();
    eprintln!(
        "default transports, no error handling: {:?}\nput/get: {:?}",
        t.lanes, rma
    );
    assert_eq!(rma.basis, RmaBasis::RmaLanes, "{rma:?}");
    assert!(
        rma.lanes
            .iter()
            .all(|l| ["posix", "sysv", "cma", "self"].contains(&l.transport.as_str())),
        "RMA not over shared memory: {rma:?}"
    );
}
