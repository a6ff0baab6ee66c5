//! Facts only the live machine gives, gathered by small system calls: the memlock limit, a
//! probe of each `--path` directory, rdma-core's dma-buf entry point, and the environment.
//! Driver (NVML/CUDA), UCX and cuFile facts come from `gdpath-cuda` and `gdpath-ucx` through
//! [`super::hardware`].

use super::{
    DoctorInput, Gathered, Memlock, Mode, OdirectProbe, PathInput, PathProbe, RdmaCoreFacts,
};
use gdpath_topo::{Machine, SysView};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefixes of the environment variables the doctor reads.
const ENV_PREFIXES: [&str; 4] = ["NCCL_", "CUDA_", "CUFILE_", "UCX_"];

/// A [`DoctorInput`] for the live machine with everything this module can gather: the
/// environment, the memlock limit, rdma-core, a probe of each path, and the driver, UCX and
/// cuFile facts of [`super::hardware::gather`] (driver facts already on `machine` win).
pub fn gather<'a>(
    machine: &'a Machine,
    view: &'a dyn SysView,
    paths: &[PathBuf],
) -> DoctorInput<'a> {
    gather_with(machine, view, paths, true)
}

/// [`gather`] for a process that serves (an agent publishing its verdicts): no directory
/// probed and cuFile left alone (`Gathered::Missing`), so that the doctor opens no cuFile
/// driver, retains no CUDA context and writes no probe file in the host program.
pub fn gather_quiet<'a>(machine: &'a Machine, view: &'a dyn SysView) -> DoctorInput<'a> {
    gather_with(machine, view, &[], false)
}

fn gather_with<'a>(
    machine: &'a Machine,
    view: &'a dyn SysView,
    paths: &[PathBuf],
    with_cufile: bool,
) -> DoctorInput<'a> {
    let mut input = DoctorInput::new(machine, view, Mode::Live);
    let hw = super::hardware::gather(paths, machine.driver.as_ref(), with_cufile);
    if matches!(input.driver, Gathered::Missing) {
        input.driver = hw.driver;
    }
    input.ucx = hw.ucx;
    input.cufile = hw.cufile;
    input.env = environment();
    input.memlock = memlock();
    input.rdma_core = Gathered::Got(rdma_core());
    input.paths = paths
        .iter()
        .map(|p| PathInput {
            path: p.clone(),
            probe: probe_path(p).map_or_else(|e| Gathered::Failed(e.to_string()), Gathered::Got),
        })
        .collect();
    input
}

/// [`PathInput`]s for a replay: the paths with their probes not run.
pub fn unprobed(paths: &[PathBuf]) -> Vec<PathInput> {
    paths
        .iter()
        .map(|p| PathInput {
            path: p.clone(),
            probe: Gathered::Missing,
        })
        .collect()
}

/// The environment variables of this process that the doctor reads (`NCCL_*`, `CUDA_*`,
/// `CUFILE_*`, `UCX_*`); others are not kept.
pub fn environment() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| ENV_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect()
}

/// `getrlimit(RLIMIT_MEMLOCK)` of this process, in bytes (`None` = unlimited).
pub fn memlock() -> Gathered<Memlock> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, hard)) => {
            // rlim_t is u64 on 64-bit Linux targets and u32 on some 32-bit ones.
            #[allow(clippy::unnecessary_cast)]
            let conv = |v: libc::rlim_t| (v != RLIM_INFINITY).then_some(v as u64);
            Gathered::Got(Memlock {
                soft: conv(soft),
                hard: conv(hard),
            })
        }
        Err(e) => Gathered::Failed(std::io::Error::from(e).to_string()),
    }
}

/// Major and minor of a Linux `dev_t` (glibc's encoding: 12 bits of major in bits 8–19 and the
/// rest above bit 32; minor in bits 0–7 and 20–31).
pub fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff);
    (major as u32, minor as u32)
}

/// `statfs(2)` `f_type` of the file system holding `path`.
pub fn fs_magic(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    // f_type is a signed word; magics are 32-bit values.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.filesystem_type().0 as i64 as u64) & 0xffff_ffff)
}

static PROBE_SEQ: AtomicU32 = AtomicU32::new(0);

/// Creates a new file in `dir` with `O_DIRECT` (and removes it): [`OdirectProbe::Works`], or
/// `Refused` when a plain create works but `O_DIRECT` does not, or `NotTested` when no file can
/// be created there at all.
pub fn probe_odirect(dir: &Path) -> OdirectProbe {
    let name = |tag: &str| {
        dir.join(format!(
            ".gdpath-doctor-{tag}-{}-{}",
            std::process::id(),
            PROBE_SEQ.fetch_add(1, Ordering::Relaxed)
        ))
    };
    let direct = name("odirect");
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&direct)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&direct);
            OdirectProbe::Works
        }
        Err(e_direct) => {
            let _ = std::fs::remove_file(&direct);
            let plain = name("plain");
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&plain)
            {
                Ok(f) => {
                    drop(f);
                    let _ = std::fs::remove_file(&plain);
                    OdirectProbe::Refused(e_direct.to_string())
                }
                Err(e) => OdirectProbe::NotTested(e.to_string()),
            }
        }
    }
}

/// Probes a `--path` directory: file system magic, device number, O_DIRECT. Errors when the
/// path does not exist or is not a directory.
pub fn probe_path(dir: &Path) -> std::io::Result<PathProbe> {
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a directory", dir.display()),
        ));
    }
    Ok(PathProbe {
        fs_magic: fs_magic(dir).ok(),
        dev: Some(split_dev(meta.dev())),
        odirect: probe_odirect(dir),
    })
}

/// Whether rdma-core's `libibverbs.so.1` loads and exports `ibv_reg_dmabuf_mr` (rdma-core ≥ 34,
/// needed to register GPU memory through dma-buf).
pub fn rdma_core() -> RdmaCoreFacts {
    const LIB: &str = "libibverbs.so.1";
    match gdpath::os::library_exports(LIB, "ibv_reg_dmabuf_mr") {
        None => RdmaCoreFacts {
            library: None,
            has_reg_dmabuf_mr: false,
        },
        Some(has) => RdmaCoreFacts {
            library: Some(LIB.to_owned()),
            has_reg_dmabuf_mr: has,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        // makedev(259, 1) and makedev(253, 0), glibc encoding.
        assert_eq!(split_dev((259 << 8) | 1), (259, 1));
        assert_eq!(split_dev(253 << 8), (253, 0));
        // A minor above 255 uses the high bits.
        let dev: u64 = (8 << 8) | (0x123 & 0xff) | ((0x123 & !0xff) << 12);
        assert_eq!(split_dev(dev), (8, 0x123));
    }
}
