//! The live probes on this machine, each checked against an independent source
//! (`/proc/self/mountinfo`, `/proc/self/limits`, the kernel release), and the doctor run live.

mod doctor_common;
use gdpath::finding::ids;
use gdpath::topo::Source;
use gdpath::{Area, Status};
use gdpath_doctor::{self as doctor, live, Gathered, OdirectProbe};
use std::path::Path;

/// (major:minor, fstype) of every mount, from /proc/self/mountinfo.
fn mounts() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let dev = l.split_whitespace().nth(2)?.to_owned();
            let fstype = l.split(" - ").nth(1)?.split_whitespace().next()?.to_owned();
            Some((dev, fstype))
        })
        .collect()
}

fn magic_of(fstype: &str) -> Option<u64> {
    Some(match fstype {
        "ext2" | "ext3" | "ext4" => 0xEF53,
        "xfs" => 0x5846_5342,
        "tmpfs" => 0x0102_1994,
        "overlay" => 0x794C_7630,
        "btrfs" => 0x9123_683E,
        _ => return None,
    })
}

/// Probes `dir` and checks the device number and file-system magic against mountinfo.
fn probe_matches_mountinfo(dir: &Path) -> gdpath_doctor::PathProbe {
    let p = live::probe_path(dir).unwrap();
    let (ma, mi) = p.dev.unwrap();
    let key = format!("{ma}:{mi}");
    let fstype = mounts()
        .into_iter()
        .find(|(d, _)| *d == key)
        .map(|(_, t)| t)
        .unwrap_or_else(|| {
            panic!(
                "{}: st_dev {key} not in /proc/self/mountinfo",
                dir.display()
            )
        });
    match magic_of(&fstype) {
        Some(m) => assert_eq!(p.fs_magic, Some(m), "{}: {fstype}", dir.display()),
        None => eprintln!(
            "{}: file system {fstype} has no magic in this test's table; magic not compared",
            dir.display()
        ),
    }
    eprintln!(
        "{}: {fstype} st_dev {key} O_DIRECT {:?}",
        dir.display(),
        p.odirect
    );
    p
}

#[test]
fn probe_a_disk_directory() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = probe_matches_mountinfo(dir.path());
    if matches!(p.fs_magic, Some(0xEF53) | Some(0x5846_5342)) {
        assert_eq!(
            p.odirect,
            OdirectProbe::Works,
            "ext4 and XFS accept O_DIRECT"
        );
    }
    // The probe leaves nothing behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn probe_dev_shm() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let p = probe_matches_mountinfo(shm);
    if p.fs_magic != Some(0x0102_1994) {
        eprintln!("skipped the tmpfs rule: /dev/shm is not tmpfs here");
        return;
    }
    // tmpfs accepts O_DIRECT from Linux 6.6 on (shmem O_DIRECT support); before, open fails.
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = rel
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap(), v.next().unwrap());
    if (major, minor) >= (6, 6) {
        assert_eq!(p.odirect, OdirectProbe::Works, "kernel {rel}");
    } else {
        assert!(
            matches!(p.odirect, OdirectProbe::Refused(_)),
            "kernel {rel}: {:?}",
            p.odirect
        );
    }
}

#[test]
fn probe_where_nothing_can_be_created() {
    // /proc accepts no new files: O_DIRECT cannot be tested there, which is not a refusal.
    assert!(matches!(
        live::probe_odirect(Path::new("/proc")),
        OdirectProbe::NotTested(_)
    ));
    assert!(live::probe_path(Path::new("/nonexistent-gdpath-dir")).is_err());
}

#[test]
fn memlock_matches_proc_limits() {
    let Gathered::Got(m) = live::memlock() else {
        panic!("getrlimit failed");
    };
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap();
    let soft = line.split_whitespace().nth(3).unwrap();
    let expect = if soft == "unlimited" {
        None
    } else {
        Some(soft.parse::<u64>().unwrap())
    };
    assert_eq!(m.soft, expect, "{line}");
}

#[test]
fn rdma_core_symbol() {
    let r = live::rdma_core();
    let installed = [
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        "/usr/lib64/libibverbs.so.1",
        "/usr/lib/libibverbs.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if installed {
        assert_eq!(r.library.as_deref(), Some("libibverbs.so.1"));
        // Every rdma-core a distribution ships today (≥ 34) has it.
        assert!(r.has_reg_dmabuf_mr);
    } else {
        eprintln!("libibverbs not installed here: only checking that the probe says so");
        assert_eq!(r.library, None);
    }
}

#[test]
fn environment_keeps_only_relevant_variables() {
    let env = live::environment();
    assert!(env.keys().all(|k| ["NCCL_", "CUDA_", "CUFILE_", "UCX_"]
        .iter()
        .any(|p| k.starts_with(p))));
    assert!(!env.contains_key("PATH"));
}

/// The whole doctor on this machine, as `gdpath doctor --path <tmp> --path /dev/shm` runs it.
#[test]
fn doctor_live_here() {
    let loaded = doctor::load(&Source::Live).unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut paths = vec![dir.path().to_owned()];
    if Path::new("/dev/shm").is_dir() {
        paths.push("/dev/shm".into());
    }
    let input = live::gather(&loaded.machine, loaded.view.as_ref(), &paths);
    let r = doctor::run(&input);
    assert_eq!(r.mode, "live");
    let gpus = loaded.machine.gpus().count();
    let no_gpu = r
        .of(Area::System)
        .find(|f| f.id.as_str() == ids::SYSTEM_NO_GPU)
        .unwrap();
    assert_eq!(no_gpu.status == Status::Unavailable, gpus == 0);
    if gpus == 0 {
        eprintln!("no GPU here: checking that the doctor says so and what it checks without one");
        assert_eq!(r.exit_code(), 2);
        assert_eq!(r.verdict(Area::P2p).unwrap().status, Status::Unavailable);
    }
    // Live facts are gathered, not "not-run".
    let memlock = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::SYSTEM_MEMLOCK_LOW)
        .unwrap();
    assert!(
        matches!(memlock.status, Status::Ok | Status::Degraded),
        "{memlock:?}"
    );
    let sub = dir.path().display().to_string();
    let od = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::STORAGE_ODIRECT_UNSUPPORTED && f.subject == sub)
        .unwrap();
    assert_ne!(od.status, Status::NotRun);
    // The block device behind the temp dir is found through /sys/dev/block.
    let dm = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::GDS_DEVICE_MAPPER && f.subject == sub);
    let nn = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::GDS_NOT_NVME && f.subject == sub)
        .unwrap();
    assert!(dm.is_some() || nn.evidence.contains("st_dev"), "{nn:?}");
    assert!(
        r.findings.iter().all(|f| f.status != Status::NotRun),
        "nothing is not-run live"
    );
}

/// `--measure` on a machine without libcuda: one `unknown` P2P finding that names the missing
/// library, never a panic. (On a machine with a driver the probe measures instead: the GPU
/// machine run in docs/machines.md.)
#[test]
fn p2p_probe_without_a_driver_says_why() {
    if gdpath_cuda::Cuda::load().is_ok() {
        eprintln!("SKIP p2p_probe_without_a_driver_says_why: libcuda is present here");
        return;
    }
    let fs = gdpath_doctor::measured::probe_p2p();
    assert_eq!(fs.len(), 1, "{fs:?}");
    assert_eq!(fs[0].id.as_str(), "p2p.measured-fallback");
    assert_eq!(fs[0].status, gdpath::Status::Unknown);
    assert!(
        fs[0].evidence.contains("libcuda.so.1"),
        "{}",
        fs[0].evidence
    );
}

/// The GDS probe on a machine without libcuda: one `unknown` finding per directory naming the
/// missing library, and no probe file written there.
#[test]
fn gds_probe_without_a_driver_says_why_and_writes_nothing() {
    if gdpath_cuda::Cuda::load().is_ok() {
        eprintln!(
            "SKIP gds_probe_without_a_driver_says_why_and_writes_nothing: libcuda is present here"
        );
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path().to_owned(), b.path().to_owned()];
    let fs = gdpath_doctor::measured::probe_gds(&dirs);
    assert_eq!(fs.len(), 2, "{fs:?}");
    for (f, d) in fs.iter().zip(&dirs) {
        assert_eq!(f.id.as_str(), "gds.measured-fallback");
        assert_eq!(f.status, gdpath::Status::Unknown);
        assert_eq!(f.subject, d.display().to_string());
        assert!(f.evidence.contains("libcuda.so.1"), "{}", f.evidence);
        assert_eq!(
            std::fs::read_dir(d).unwrap().count(),
            0,
            "nothing written in {d:?}"
        );
    }
}

/// The live machine's NVLink coverage comes from the driver: described when its facts load,
/// else unknown with the loader's own error (here, without a GPU driver: libcuda's).
#[test]
fn live_nvlink_coverage_says_why_the_driver_facts_are_missing() {
    if !Path::new("/sys/bus/pci/devices").is_dir() {
        eprintln!("skipped: this machine has no /sys/bus/pci/devices");
        return;
    }
    let (m, why) = doctor::machine::load_reporting(&Source::Live).unwrap();
    match doctor::machine::live_driver_facts() {
        Ok(_) => {
            assert!(why.is_none());
            assert!(m.driver.is_some());
        }
        Err(e) => {
            let e = e.to_string();
            assert_eq!(why.as_deref(), Some(e.as_str()));
            let reason = m
                .coverage
                .nvlink
                .gap()
                .expect("NVLink unknown without a driver");
            assert!(
                m.coverage.nvlink.is_unknown() && reason.contains(&e),
                "{reason}"
            );
            // The doctor's loader records the same.
            let loaded = doctor::load(&Source::Live).unwrap();
            assert_eq!(loaded.machine.coverage.nvlink, m.coverage.nvlink);
        }
    }
}
