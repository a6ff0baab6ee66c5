//! Facts from the hardware libraries, gathered live for the doctor: driver facts through
//! `gdpath-cuda` (CUDA driver API + NVML), UCX's build through `gdpath-ucx`, and cuFile's driver
//! state plus one `cuFileHandleRegister` attempt per `--path` directory.
//!
//! Each library may be absent; its absence becomes [`Gathered::Failed`] with the loader's typed
//! error text (which names the library and what provides it), never a panic.

use super::{CufileFacts, Gathered, UcxFacts};
use gdpath_cuda::cufile::{CuFileDriver, CuFileHandle};
use gdpath_topo::facts::DriverFacts;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `CUfileDriverStatusFlags` bit for PCI P2PDMA NVMe support (cufile.h, CUDA 13.0:
/// `CU_FILE_NVME_P2P_SUPPORTED = 11`).
const NVME_P2P_BIT: u32 = 11;

/// NVML and CUDA facts (`gdpath_cuda::gather_facts`).
pub fn driver() -> Gathered<DriverFacts> {
    gdpath_cuda::gather_facts().map_or_else(|e| Gathered::Failed(e.to_string()), Gathered::Got)
}

/// What the UCX library found at run time (`libucp.so.0`, or `GDPATH_UCX_LIB`) offers: its
/// version, the transports of a default context, and whether it can map CUDA memory.
pub fn ucx() -> Gathered<UcxFacts> {
    let facts = gdpath_ucx::Context::new(&gdpath_ucx::UcxCfg::default()).and_then(|c| c.facts());
    match facts {
        Ok(f) => {
            let mut transports: Vec<String> =
                f.resources.iter().map(|r| r.transport.clone()).collect();
            transports.sort();
            transports.dedup();
            Gathered::Got(UcxFacts {
                version: Some(f.version_string),
                transports,
                cuda_support: Some(f.cuda_supported),
            })
        }
        Err(e) => Gathered::Failed(e.to_string()),
    }
}

/// cuFile's state: library version, whether its driver opens (on GPU 0), nvidia-fs and P2PDMA
/// as cuFile reports them, and the result of registering a temporary O_DIRECT file in each of
/// `paths` (the step that fails on machines without udev data for their disks).
pub fn cufile(paths: &[PathBuf]) -> Gathered<CufileFacts> {
    if let Err(e) = gdpath_cuda::cufile::library() {
        return Gathered::Failed(e.to_string());
    }
    let mut facts = CufileFacts {
        library_found: true,
        ..CufileFacts::default()
    };
    let ctx = match gdpath_cuda::Cuda::load().and_then(|c| gdpath_cuda::Context::new(&c, 0)) {
        Ok(ctx) => ctx,
        Err(e) => {
            facts.driver_open_error = Some(format!("no CUDA context on GPU 0: {e}"));
            return Gathered::Got(facts);
        }
    };
    let driver = match CuFileDriver::open(&ctx) {
        Ok(d) => d,
        Err(e) => {
            facts.driver_open_error = Some(e.to_string());
            return Gathered::Got(facts);
        }
    };
    facts.version = driver.version().map(version_text);
    if let Ok(p) = driver.properties() {
        facts.nvfs_in_use = Some(p.nvfs_major != 0 || p.nvfs_minor != 0);
        facts.p2pdma_supported = Some(p.dstatusflags & (1 << NVME_P2P_BIT) != 0);
    }
    for dir in paths {
        facts
            .handle_register
            .insert(dir.clone(), register_probe(&driver, dir));
    }
    Gathered::Got(facts)
}

/// `cuFileGetVersion`'s integer (e.g. 1150) as `1.15.0`.
fn version_text(v: i32) -> String {
    format!("{}.{}.{}", v / 1000, (v % 1000) / 10, v % 10)
}

/// Registers a fresh temporary file of `dir`, opened `O_RDWR | O_DIRECT` as cuFile requires
/// (cuFile refuses `O_TMPFILE` descriptors with `CU_FILE_INVALID_FILE_OPEN_FLAG`), with cuFile:
/// `None` when that worked, else cuFile's error text, or why no such file could be opened. The
/// file is unlinked before this returns.
fn register_probe(driver: &CuFileDriver, dir: &Path) -> Option<String> {
    let probe = match tempfile::Builder::new()
        .prefix(".gdpath-cufile-probe")
        .tempfile_in(dir)
    {
        Ok(p) => p,
        Err(e) => return Some(format!("no temporary file in {}: {e}", dir.display())),
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(probe.path());
    match file {
        Ok(f) => CuFileHandle::register(driver, Arc::new(f))
            .err()
            .map(|e| e.to_string()),
        Err(e) => Some(format!(
            "open(O_DIRECT) of {} failed: {e}",
            probe.path().display()
        )),
    }
}

/// Driver, UCX and cuFile facts together, keyed for [`super::DoctorInput`].
pub struct HardwareFacts {
    /// CUDA driver and NVML facts, or why they could not be gathered.
    pub driver: Gathered<DriverFacts>,
    /// UCX's version and transports, or why they could not be gathered.
    pub ucx: Gathered<UcxFacts>,
    /// cuFile's driver properties, or why they could not be gathered.
    pub cufile: Gathered<CufileFacts>,
}

/// Gathers all three; driver facts only when `known` (already on the machine) is `None`, in
/// which case the returned `driver` is `Missing`. cuFile is only tried when `with_cufile` (else
/// it is `Missing`) and the driver facts show a GPU (it needs a CUDA context); otherwise it is
/// `Failed` with the reason.
pub fn gather(paths: &[PathBuf], known: Option<&DriverFacts>, with_cufile: bool) -> HardwareFacts {
    let driver = match known {
        Some(_) => Gathered::Missing,
        None => driver(),
    };
    let has_gpu = match known {
        Some(f) => !f.gpus.is_empty(),
        None => matches!(&driver, Gathered::Got(f) if !f.gpus.is_empty()),
    };
    let cufile = if !with_cufile {
        Gathered::Missing
    } else if has_gpu {
        cufile(paths)
    } else {
        match gdpath_cuda::cufile::library() {
            Err(e) => Gathered::Failed(e.to_string()),
            Ok(lib) => Gathered::Failed(format!(
                "{lib} loads, but there is no GPU to open cuFile's driver on"
            )),
        }
    };
    HardwareFacts {
        driver,
        ucx: ucx(),
        cufile,
    }
}
