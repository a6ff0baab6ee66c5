//! The doctor's paths on real machines: which findings decide each P2P pair, GPU ↔ NIC and
//! GPU ↔ NVMe path, and the subjects they are matched by.

use gdpath::finding::{ids, Area, Status};
use gdpath_doctor::routes::{RouteState, Subject};
use gdpath_testkit::fixture;
use gdpath_topo::Source;
use std::path::PathBuf;

fn examine(source: Source) -> gdpath_doctor::Examination {
    let dir = std::env::temp_dir();
    gdpath_doctor::examine(&source, &[dir], false).unwrap()
}

#[test]
fn the_h200_pair() {
    let ex = examine(Source::Snapshot(PathBuf::from(
        gdpath_testkit::h200x2_snapshot(),
    )));
    let routes = ex.routes();
    let p2p: Vec<_> = routes.iter().filter(|r| r.area == Area::P2p).collect();
    assert_eq!(p2p.len(), 1);
    assert_eq!(
        (p2p[0].gpu.as_str(), p2p[0].peer.as_str()),
        ("GPU0", "GPU1")
    );
    assert_eq!(p2p[0].class.to_string(), "NV18");
    // Every P2P check of the pair passed (NVML, CUDA, NVLink up): the direct path.
    assert_eq!(
        (p2p[0].state, p2p[0].status),
        (RouteState::Direct, Status::Ok)
    );
    // No RDMA device: each GPU's GDR path goes to the virtio NIC through host memory, decided
    // by gdr.no-rdma-device.
    let gdr: Vec<_> = routes.iter().filter(|r| r.area == Area::Gdr).collect();
    assert_eq!(gdr.len(), 2);
    for r in gdr {
        assert_eq!((r.peer.as_str(), r.rdma), ("NIC0", false));
        assert_eq!(r.state, RouteState::Staged);
        assert!(r
            .deciding
            .iter()
            .any(|f| f.id.as_str() == ids::GDR_NO_RDMA_DEVICE));
    }
    // No NVMe: no GDS path.
    assert!(!routes.iter().any(|r| r.area == Area::Gds));
}

#[test]
fn a_two_socket_server() {
    let ex = examine(Source::HwlocXml(fixture(
        "hwloc-xml/hwloc-xml-32em64t-2n8c2t-pci-normalio.xml",
    )));
    let routes = ex.routes();
    let gdr = |g: &str| {
        routes
            .iter()
            .find(|r| r.area == Area::Gdr && r.gpu == g)
            .unwrap()
    };
    // GPU0 (socket 0) ↔ mlx5_0 (socket 1): NCCL turns GDR off at SYS — staged, by gdr.nic-far.
    let r = gdr("GPU0");
    assert_eq!(
        (r.peer.as_str(), r.class.to_string().as_str()),
        ("NIC0", "SYS")
    );
    assert_eq!((r.state, r.status), (RouteState::Staged, Status::Degraded));
    assert!(r.deciding.iter().all(|f| f.id.as_str() == ids::GDR_NIC_FAR));
    // GPU2 shares the NIC's bridge (PIX): nothing degraded, but a file cannot tell.
    assert_eq!(gdr("GPU2").state, RouteState::Unknown);
    // GPU0–GPU1 cross sockets: over PCIe alone NCCL would stage them, but the source does not
    // describe NVLink, which could join them: unknown, not a verdict (docs/doctor.md).
    let p = routes
        .iter()
        .find(|r| r.area == Area::P2p && r.gpu == "GPU0" && r.peer == "GPU1")
        .unwrap();
    assert_eq!((p.state, p.status), (RouteState::Unknown, Status::Unknown));
    assert!(!p.deciding.is_empty());
}

#[test]
fn subjects() {
    let m = gdpath_topo::load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    )))
    .unwrap();
    let dirs = vec![std::path::PathBuf::from("/data")];
    let p = |s| Subject::parse(s, &m, &dirs);
    assert_eq!(p("system"), Subject::System);
    assert_eq!(p("GPU0-GPU7"), Subject::Devices(vec!["GPU0", "GPU7"]));
    assert_eq!(
        p("GPU0-NIC0 (0000:10:1b.0)"),
        Subject::Devices(vec!["GPU0", "NIC0"])
    );
    assert_eq!(p("NIC3 (0000:a0:1b.0)"), Subject::Devices(vec!["NIC3"]));
    assert_eq!(
        p("/data"),
        Subject::Dir {
            dir: "/data",
            devices: vec![]
        }
    );
    assert_eq!(
        p("/data: GPU1-GPU2"),
        Subject::Dir {
            dir: "/data",
            devices: vec!["GPU1", "GPU2"]
        }
    );
    // Not a device of this machine, or not a subject form: matched to nothing.
    assert_eq!(p("GPU8"), Subject::Other);
    assert_eq!(p("/elsewhere"), Subject::Other);
}
