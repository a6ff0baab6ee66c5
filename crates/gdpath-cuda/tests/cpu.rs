//! Tests that run without a GPU (CI, developer machines): library absence is a typed error, and
//! the conversions behind `gather_facts` give the values `nvidia-smi` printed on the H200
//! machine (fixture `device/h200x2-probe-2026-11-30.txt`).

mod common;

use gdpath_cuda::facts::{merge_nvml, normalize_pci, p2p_cap_from_code};
use gdpath_cuda::nvml::{self, nvlink_mbps_to_gbps, NvmlFacts, NvmlGpu};
use gdpath_cuda::{check_range, Cuda, CudaError, Library};
use gdpath_topo::facts::{
    DriverFacts, FactSource, GpuFacts, GpuPairFacts, NvLinkFacts, NvmlP2pStatus, P2pCap,
    PcieLinkFacts,
};
use nvml_wrapper::enum_wrappers::device::P2pStatus;

/// Assert `r` is `LibraryMissing` for `lib`, with a message naming the library and its package.
/// Returns false (after saying so) when the library is installed on this machine.
fn expect_missing<T: std::fmt::Debug>(
    r: Result<T, CudaError>,
    lib: Library,
    provider_word: &str,
) -> bool {
    match r {
        Err(e @ CudaError::LibraryMissing { .. }) => {
            assert_eq!(e.missing_library(), Some(lib));
            let msg = e.to_string();
            assert!(
                msg.contains(lib.soname()),
                "message does not name {}: {msg}",
                lib.soname()
            );
            assert!(
                msg.contains(provider_word),
                "message does not say what installs it: {msg}"
            );
            assert!(
                msg.contains(lib.env_override()),
                "message does not name the override: {msg}"
            );
            true
        }
        Err(other) => panic!("expected LibraryMissing for {lib}, got {other:?}"),
        Ok(v) => {
            eprintln!(
                "SKIPPED: {lib} is installed on this machine ({v:?}); absence not testable here"
            );
            false
        }
    }
}

#[test]
fn missing_cuda_driver_is_a_typed_error() {
    if expect_missing(Cuda::load(), Library::CudaDriver, "NVIDIA driver package") {
        // Cached failure: the second call gives the same error, still no panic.
        assert!(matches!(
            Cuda::load(),
            Err(CudaError::LibraryMissing { .. })
        ));
    }
}

#[test]
fn missing_nvml_is_a_typed_error() {
    expect_missing(
        nvml::init().map(|_| ()),
        Library::Nvml,
        "NVIDIA driver package",
    );
}

#[test]
fn missing_cufile_is_a_typed_error() {
    if expect_missing(
        gdpath_cuda::cufile::library(),
        Library::CuFile,
        "nvidia-cufile",
    ) {
        let Err(CudaError::LibraryMissing { tried, .. }) = gdpath_cuda::cufile::library() else {
            unreachable!()
        };
        assert_eq!(
            &tried[..3],
            &["libcufile.so.0", "libcufile.so.1", "libcufile.so"]
        );
    }
}

#[test]
fn gather_facts_without_any_driver_is_a_typed_error() {
    match gdpath_cuda::gather_facts() {
        Err(e) => assert_eq!(e.missing_library(), Some(Library::CudaDriver), "{e}"),
        Ok(f) => eprintln!(
            "SKIPPED: a driver is installed here; facts: {} GPUs",
            f.gpus.len()
        ),
    }
}

#[test]
fn copy_bounds_are_checked_without_a_driver() {
    // The sizes of the GPU suite: 1 GiB + 1 with offsets.
    let gib1 = (1usize << 30) + 1;
    check_range("H2D destination", gib1, 0, gib1).unwrap();
    check_range("H2D destination", gib1, 1, gib1 - 1).unwrap();
    let e = check_range("H2D destination", gib1, 1, gib1).unwrap_err();
    assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains(&format!("{gib1} bytes")), "{e}");
}

#[test]
fn nvml_bus_ids_of_the_probe_become_its_sysfs_addresses() {
    let p = common::probe();
    assert_eq!(p.nvml_bus_ids, ["00000000:00:06.0", "00000000:00:07.0"]);
    let converted: Vec<String> = p
        .nvml_bus_ids
        .iter()
        .map(|b| normalize_pci(b).unwrap())
        .collect();
    assert_eq!(
        converted, p.sysfs_gpus,
        "NVML ids must map to the sysfs names of the GPUs"
    );
    assert_eq!(converted, ["0000:00:06.0", "0000:00:07.0"]);
}

#[test]
fn nvml_p2p_statuses_map_to_the_codes_of_the_probe_legend() {
    let p = common::probe();
    let all = [
        P2pStatus::Ok,
        P2pStatus::ChipsetNotSupported,
        P2pStatus::GpuNotSupported,
        P2pStatus::IohTopologyNotSupported,
        P2pStatus::DisabledByRegkey,
        P2pStatus::NotSupported,
        P2pStatus::Unknown,
    ];
    for s in &all {
        let code = nvml::p2p_cap(s).code();
        assert!(
            p.p2p_legend.iter().any(|c| c == code),
            "{s:?} -> {code} not in legend {:?}",
            p.p2p_legend
        );
    }
    assert_eq!(
        nvml::p2p_cap(&P2pStatus::IohTopologyNotSupported),
        P2pCap::Tns
    );
    assert_eq!(nvml::p2p_cap(&P2pStatus::DisabledByRegkey), P2pCap::Ns);
    // The five columns of the probe, both directions.
    let cols: Vec<char> = p.p2p.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(cols, ['r', 'w', 'n', 'a', 'p']);
    for (c, a, b) in &p.p2p {
        let want = if *c == 'p' { P2pCap::Ns } else { P2pCap::Ok };
        assert_eq!((*a, *b), (want, want), "column {c}");
    }
    assert_eq!(p2p_cap_from_code("NS"), Some(P2pCap::Ns));
}

/// Build NVML facts from what the probe printed, CUDA facts with the two GPUs in the opposite
/// order (as `CUDA_DEVICE_ORDER=FASTEST_FIRST` may give), and check the merge matches by PCI.
#[test]
fn merge_matches_nvml_to_cuda_by_pci_address_on_probe_values() {
    let p = common::probe();
    let pcis: Vec<String> = p
        .nvml_bus_ids
        .iter()
        .map(|b| normalize_pci(b).unwrap())
        .collect();
    let nv = NvmlFacts {
        driver_version: Some(p.driver_version.clone()),
        cuda_driver_version: Some(13000),
        gpus: (0..2u32)
            .map(|i| NvmlGpu {
                index: i,
                pci: pcis[i as usize].clone(),
                name: Some("NVIDIA H200".into()),
                memory_bytes: Some(143_771 << 20),
                bar1_total_bytes: Some(p.bar1_total_mib[i as usize] << 20),
                bar1_used_bytes: Some(1 << 20),
                pcie: Some(PcieLinkFacts {
                    cur_gen: p.pcie_gen[i as usize].1,
                    max_gen: p.pcie_gen[i as usize].0,
                    cur_width: 16,
                    max_width: 16,
                }),
                nvlinks: p.nvlinks[i as usize]
                    .iter()
                    .map(|(l, gbps)| NvLinkFacts {
                        link: *l,
                        // What NVML reported on that machine: an NVSwitch the VM cannot see.
                        remote_pci: nvml::remote_pci_text("FFFFFFFF:FF:FF.0"),
                        remote_is_switch: true,
                        gbps: Some(*gbps),
                        version: Some("4.0".into()),
                    })
                    .collect(),
                gaps: vec![],
            })
            .collect(),
        p2p: vec![
            (
                0,
                1,
                NvmlP2pStatus {
                    read: P2pCap::Ok,
                    write: P2pCap::Ok,
                    nvlink: P2pCap::Ok,
                    atomics: P2pCap::Ok,
                    pci: P2pCap::Ns,
                },
            ),
            (
                1,
                0,
                NvmlP2pStatus {
                    read: P2pCap::Ok,
                    write: P2pCap::Ok,
                    nvlink: P2pCap::Ok,
                    atomics: P2pCap::Ok,
                    pci: P2pCap::Ns,
                },
            ),
        ],
    };
    // CUDA ordinal 0 is NVML's GPU 1.
    let mut facts = DriverFacts {
        gpus: vec![
            GpuFacts {
                ordinal: 0,
                pci: pcis[1].clone(),
                name: "NVIDIA H200".into(),
                ..Default::default()
            },
            GpuFacts {
                ordinal: 1,
                pci: pcis[0].clone(),
                name: "NVIDIA H200".into(),
                ..Default::default()
            },
        ],
        pairs: vec![
            GpuPairFacts {
                a: 0,
                b: 1,
                nvml: None,
                cuda: None,
            },
            GpuPairFacts {
                a: 1,
                b: 0,
                nvml: None,
                cuda: None,
            },
        ],
        ..Default::default()
    };
    merge_nvml(&nv, true, &mut facts);
    assert_eq!(facts.driver_version.as_deref(), Some("580.159.04"));
    assert_eq!(facts.cuda_driver_version, Some(13000));
    for g in &facts.gpus {
        assert_eq!(
            g.bar1_total_bytes,
            Some(256 << 30),
            "BAR1 256 GiB on GPU {}",
            g.ordinal
        );
        assert_eq!(g.pcie.unwrap().cur_gen, 5);
        assert_eq!(g.nvlinks.len(), 18);
        assert!(g
            .nvlinks
            .iter()
            .all(|l| l.remote_is_switch && l.remote_pci == "ffffffff:ff:ff.0"));
    }
    assert_eq!(
        facts.nvlink_count(0, 1),
        18,
        "NV18 as topo -m prints, through the switches"
    );
    let total: f64 = facts.gpus[0].nvlinks.iter().map(|l| l.gbps.unwrap()).sum();
    assert!((total - 18.0 * 26.562).abs() < 1e-9);
    assert_eq!(facts.pair(0, 1).unwrap().nvml.unwrap().pci, P2pCap::Ns);
    assert!(facts.gaps.is_empty());
}

#[test]
fn merge_without_cuda_lists_nvml_gpus_and_records_nothing_false() {
    let nv = NvmlFacts {
        driver_version: Some("580.159.04".into()),
        cuda_driver_version: Some(13000),
        gpus: vec![NvmlGpu {
            index: 0,
            pci: "0000:00:06.0".into(),
            name: Some("NVIDIA H200".into()),
            memory_bytes: Some(1),
            bar1_total_bytes: None,
            bar1_used_bytes: None,
            pcie: None,
            nvlinks: vec![],
            gaps: vec![("BAR1".into(), "Not supported".into())],
        }],
        p2p: vec![],
    };
    let mut facts = DriverFacts::default();
    merge_nvml(&nv, false, &mut facts);
    assert_eq!(facts.gpus.len(), 1);
    assert_eq!(facts.gpus[0].pci, "0000:00:06.0");
    assert_eq!(
        facts.gpus[0].gdr_supported, None,
        "CUDA-only facts stay unknown"
    );
    assert_eq!(facts.gaps.len(), 1);
    assert_eq!(facts.gaps[0].source, FactSource::Nvml);
    assert!(facts.gaps[0].what.contains("BAR1"));
}

#[test]
fn nvlink_speed_units() {
    // nvidia-smi prints NVML's MBps figure divided by 1000: 26562 MBps -> 26.562 GB/s.
    let p = common::probe();
    let printed = p.nvlinks[0][0].1;
    assert_eq!(nvlink_mbps_to_gbps(26_562), printed);
    assert_eq!(nvml::nvlink_version_text(6), Some("4.0"));
    assert_eq!(nvml::nvlink_version_text(0), None);
}

/// Block lists through the public API, without a GPU: the checks and coalescing the copier
/// runs before it enqueues anything, and how their errors read.
#[test]
fn block_lists_are_checked_and_coalesced_without_a_gpu() {
    use gdpath_cuda::blocks::{check_list, coalesce, Side, MAX_BLOCKS_PER_CALL};
    use gdpath_cuda::{BlockCopy, BlockListError, BlockMethod, Unavailable};
    // 100,000 × 16 KiB in slot order on both sides: one descriptor after coalescing.
    let list: Vec<BlockCopy> = (0..100_000u64)
        .map(|i| BlockCopy::new((1 << 40) + i * 16384, (1 << 34) + i * 16384, 16384))
        .collect();
    check_list(&list).unwrap();
    let mut out = Vec::new();
    coalesce(&list, &mut out);
    assert_eq!(out, [BlockCopy::new(1 << 40, 1 << 34, 100_000 * 16384)]);
    let e = CudaError::from(check_list(&[]).unwrap_err());
    assert_eq!(e, CudaError::BlockList(BlockListError::Empty));
    assert_eq!(
        e.to_string(),
        "block list refused: the list has no descriptors"
    );
    let e = check_list(&[BlockCopy::new(8, 0, 4), BlockCopy::new(0, 8, 0)]).unwrap_err();
    assert_eq!(e.to_string(), "descriptor 1 has length 0");
    let e = check_list(&[BlockCopy::new(0, u64::MAX - 3, 8)]).unwrap_err();
    assert_eq!(
        e,
        BlockListError::Overflow {
            index: 0,
            side: Side::Src,
            addr: u64::MAX - 3,
            len: 8
        }
    );
    assert!(
        e.to_string()
            .contains("source 0xfffffffffffffffc + 8 bytes overflows"),
        "{e}"
    );
    let many = vec![BlockCopy::new(1 << 40, 0, 1); MAX_BLOCKS_PER_CALL + 1];
    assert!(matches!(
        check_list(&many),
        Err(BlockListError::TooMany { count, max }) if count == MAX_BLOCKS_PER_CALL + 1 && max == MAX_BLOCKS_PER_CALL
    ));
    let e = CudaError::MethodUnavailable {
        method: BlockMethod::DriverBatch,
        reason: Unavailable::DriverTooOld { driver: 12040 },
    };
    assert_eq!(
        e.to_string(),
        "block copy method driver-batch is unavailable: the driver supports CUDA 12.4; \
         cuMemcpyBatchAsync needs 12.8 (driver R570) or newer"
    );
}
