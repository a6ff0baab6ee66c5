//! What NVML tells about GPUs that CUDA does not: BAR1, PCIe link, NVLink, P2P status.
//!
//! Through nvml-wrapper (which loads `libnvidia-ml.so.1` itself and returns an error, not a
//! panic, when it is absent), plus two raw calls through its symbol table where the wrapper falls
//! short: `nvmlDeviceGetNvLinkRemoteDeviceType` (the wrapper writes the result into a temporary
//! and always returns `Unknown`) and `nvmlDeviceGetFieldValues` with a scope id (per-link speed).
//! Each raw call has one checked function here that turns its `nvmlReturn_t` into a
//! [`CudaError`] naming the call, as the wrapper's calls do.

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;

use gdpath_topo::facts::{NvLinkFacts, NvmlP2pStatus, P2pCap, PcieLinkFacts};

use crate::error::{no_panic, CudaError, Library};
use crate::pci::normalize_pci;

/// `NVML_NVLINK_MAX_LINKS` of NVML 12/13 headers.
const MAX_LINKS: u32 = 18;
/// `NVML_FI_DEV_NVLINK_GET_SPEED`: per-link speed in MBps, link given as the scope id.
const FI_NVLINK_GET_SPEED: u32 = 164;
/// `NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`: speed common to all links, MBps.
const FI_NVLINK_SPEED_MBPS_COMMON: u32 = 90;
/// `NVML_NVLINK_DEVICE_TYPE_SWITCH`.
const NVLINK_DEVICE_TYPE_SWITCH: u32 = 2;

/// NVML's facts for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlGpu {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// PCI address, sysfs form.
    pub pci: String,
    /// `nvmlDeviceGetName`.
    pub name: Option<String>,
    /// Device memory in bytes (`nvmlDeviceGetMemoryInfo`).
    pub memory_bytes: Option<u64>,
    /// BAR1 aperture in bytes (`nvmlDeviceGetBAR1MemoryInfo`).
    pub bar1_total_bytes: Option<u64>,
    /// BAR1 in use, bytes.
    pub bar1_used_bytes: Option<u64>,
    /// PCIe link generation and width, current and maximum.
    pub pcie: Option<PcieLinkFacts>,
    /// The NVLinks that are up.
    pub nvlinks: Vec<NvLinkFacts>,
    /// Partial failures: (what, error text).
    pub gaps: Vec<(String, String)>,
}

/// Everything read from NVML.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlFacts {
    /// `nvmlSystemGetDriverVersion`, e.g. `580.159.04`.
    pub driver_version: Option<String>,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 13000.
    pub cuda_driver_version: Option<u32>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<NvmlGpu>,
    /// NVML P2P status for ordered pairs of NVML indices (a, b), a != b.
    pub p2p: Vec<(u32, u32, NvmlP2pStatus)>,
}

fn nvml_err(call: &'static str) -> impl Fn(NvmlError) -> CudaError {
    move |e| match e {
        NvmlError::LibloadingError(le) => CudaError::LibraryMissing {
            library: Library::Nvml,
            tried: vec![std::env::var(Library::Nvml.env_override())
                .unwrap_or_else(|_| Library::Nvml.soname().to_string())],
            detail: le.to_string(),
        },
        NvmlError::FailedToLoadSymbol(s) => {
            tracing::debug!(symbol = %s, "NVML symbol missing");
            CudaError::SymbolMissing {
                library: Library::Nvml,
                symbol: call,
                needed: NVML_NEEDED,
            }
        }
        other => CudaError::Nvml {
            call,
            message: other.to_string(),
        },
    }
}

/// Initialise NVML (`nvmlInit_v2`), from `GDPATH_LIBNVML` if set, else `libnvidia-ml.so.1`.
pub fn init() -> Result<Nvml, CudaError> {
    no_panic("nvml-wrapper Nvml::init", || {
        let path = std::env::var_os(Library::Nvml.env_override()).filter(|v| !v.is_empty());
        let r = match &path {
            Some(p) => Nvml::builder().lib_path(p).init(),
            None => Nvml::init(),
        };
        r.map_err(nvml_err("nvmlInit_v2"))
    })
}

/// Map NVML's `nvmlGpuP2PStatus_t` to the code `nvidia-smi topo -p2p` prints. NVML's
/// "disabled by registry key" prints as `NS` there as well.
pub fn p2p_cap(status: &P2pStatus) -> P2pCap {
    match status {
        P2pStatus::Ok => P2pCap::Ok,
        P2pStatus::ChipsetNotSupported => P2pCap::Cns,
        P2pStatus::GpuNotSupported => P2pCap::Gns,
        P2pStatus::IohTopologyNotSupported => P2pCap::Tns,
        P2pStatus::DisabledByRegkey | P2pStatus::NotSupported => P2pCap::Ns,
        P2pStatus::Unknown => P2pCap::U,
    }
}

/// NVML's `nvmlNvlinkVersion_t` as text: 1 → "1.0", 2 → "2.0", 3 → "2.2", 4 → "3.0",
/// 5 → "3.1", 6 → "4.0", 7 → "5.0" (nvml.h). `None` for 0 (invalid) and unknown values.
pub fn nvlink_version_text(v: u32) -> Option<&'static str> {
    Some(match v {
        1 => "1.0",
        2 => "2.0",
        3 => "2.2",
        4 => "3.0",
        5 => "3.1",
        6 => "4.0",
        7 => "5.0",
        _ => return None,
    })
}

/// The remote end of an NVLink in sysfs form; NVML's placeholder for an end the OS cannot see
/// (`FFFFFFFF:FF:FF.0`, not a valid address: an NVSwitch outside a VM, on HGX boards) is kept,
/// lower-cased, rather than rejected.
pub fn remote_pci_text(nvml_bus_id: &str) -> String {
    normalize_pci(nvml_bus_id).unwrap_or_else(|_| nvml_bus_id.trim().to_lowercase())
}

/// NVML's NVLink speed (MBps, 1e6 B/s, per direction) in GB/s (1e9 B/s).
pub fn nvlink_mbps_to_gbps(mbps: u64) -> f64 {
    mbps as f64 / 1000.0
}

/// The NVIDIA driver series that has every NVML call gdpath makes.
const NVML_NEEDED: &str = "an NVIDIA driver of the R450 series or newer";

/// nvml-wrapper's raw entry point `$sym` and its name, for the name in errors to be the one
/// called; [`CudaError::SymbolMissing`] naming it where this NVML lacks it.
macro_rules! raw_nvml {
    ($nvml:expr, $sym:ident) => {
        $nvml
            .lib()
            .$sym
            .as_ref()
            .map(|f| (f, stringify!($sym)))
            .map_err(|_| CudaError::SymbolMissing {
                library: Library::Nvml,
                symbol: stringify!($sym),
                needed: NVML_NEEDED,
            })
    };
}

/// `nvmlDeviceGetFieldValues` for one `field` with a scope id (the link, for per-link fields).
///
/// Errors: [`CudaError::SymbolMissing`] where NVML lacks the call; [`CudaError::Nvml`] for the
/// call's error or the field's own (`nvmlFieldValue_t::nvmlReturn`).
fn device_get_field_value(
    nvml: &Nvml,
    dev: &Device,
    field: u32,
    scope: u32,
) -> Result<nvmlFieldValue_t, CudaError> {
    let (f, call) = raw_nvml!(nvml, nvmlDeviceGetFieldValues)?;
    // SAFETY: a zeroed nvmlFieldValue_t is a valid input; we set the id and scope.
    let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    v.fieldId = field;
    v.scopeId = scope;
    // SAFETY: one element, a live device handle of this Nvml.
    nvml_try(unsafe { f(dev.handle(), 1, &mut v) }).map_err(nvml_err(call))?;
    nvml_try(v.nvmlReturn).map_err(nvml_err(call))?;
    Ok(v)
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType` of `link`: `nvmlIntNvLinkDeviceType_t`.
///
/// Errors: as [`device_get_field_value`].
fn device_get_nvlink_remote_device_type(
    nvml: &Nvml,
    dev: &Device,
    link: u32,
) -> Result<u32, CudaError> {
    let (f, call) = raw_nvml!(nvml, nvmlDeviceGetNvLinkRemoteDeviceType)?;
    let mut t: u32 = 0xff;
    // SAFETY: a live device handle; out-pointer to a live u32 (the C enum is 32-bit).
    nvml_try(unsafe { f(dev.handle(), link, &mut t as *mut u32 as *mut _) })
        .map_err(nvml_err(call))?;
    Ok(t)
}

/// One numeric field value (with a scope id), whatever its C type; `None` when NVML has none.
// `c_ulong` is 64 bits here but 32 on other targets, so its cast stays.
#[allow(clippy::unnecessary_cast)]
fn field_u64(nvml: &Nvml, dev: &Device, field: u32, scope: u32) -> Option<u64> {
    let v = device_get_field_value(nvml, dev, field, scope).ok()?;
    // SAFETY: valueType says which union member NVML wrote (nvmlValueType_t).
    unsafe {
        match v.valueType {
            0 => Some(v.value.dVal as u64),
            1 => Some(v.value.uiVal as u64),
            2 => Some(v.value.ulVal as u64),
            3 => Some(v.value.ullVal),
            4 => u64::try_from(v.value.sllVal).ok(),
            5 => u64::try_from(v.value.siVal).ok(),
            6 => Some(v.value.usVal as u64),
            _ => None,
        }
    }
}

fn remote_is_switch(nvml: &Nvml, dev: &Device, link: u32) -> Option<bool> {
    let t = device_get_nvlink_remote_device_type(nvml, dev, link).ok()?;
    Some(t == NVLINK_DEVICE_TYPE_SWITCH)
}

fn read_nvlinks(nvml: &Nvml, dev: &Device, gaps: &mut Vec<(String, String)>) -> Vec<NvLinkFacts> {
    let common = field_u64(nvml, dev, FI_NVLINK_SPEED_MBPS_COMMON, 0);
    let mut links = Vec::new();
    for l in 0..MAX_LINKS {
        let link = dev.link_wrapper_for(l);
        match link.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            // No NVLink on this GPU at all.
            Err(NvmlError::NotSupported) => break,
            // Past the last link of this GPU.
            Err(NvmlError::InvalidArg) => break,
            Err(e) => {
                gaps.push((format!("NVLink {l} state"), e.to_string()));
                continue;
            }
        }
        let remote_pci = match link.remote_pci_info() {
            Ok(p) => remote_pci_text(&p.bus_id),
            Err(e) => {
                gaps.push((format!("NVLink {l} remote PCI"), e.to_string()));
                String::new()
            }
        };
        let remote_is_switch = remote_is_switch(nvml, dev, l).unwrap_or_else(|| {
            gaps.push((
                format!("NVLink {l} remote device type"),
                "nvmlDeviceGetNvLinkRemoteDeviceType unavailable; assumed GPU".into(),
            ));
            false
        });
        let gbps = field_u64(nvml, dev, FI_NVLINK_GET_SPEED, l)
            .filter(|&v| v > 0)
            .or(common.filter(|&v| v > 0))
            .map(nvlink_mbps_to_gbps);
        let version = link
            .version()
            .ok()
            .and_then(nvlink_version_text)
            .map(str::to_string);
        links.push(NvLinkFacts {
            link: l,
            remote_pci,
            remote_is_switch,
            gbps,
            version,
        });
    }
    links
}

fn read_gpu(nvml: &Nvml, index: u32, dev: &Device) -> Result<NvmlGpu, CudaError> {
    let pci_raw = dev
        .pci_info()
        .map_err(nvml_err("nvmlDeviceGetPciInfo"))?
        .bus_id;
    let mut gaps = Vec::new();
    let mut note = |what: &str, e: &NvmlError| gaps.push((what.to_string(), e.to_string()));
    let name = dev.name().map_err(|e| note("name", &e)).ok();
    let memory_bytes = dev
        .memory_info()
        .map(|m| m.total)
        .map_err(|e| note("memory", &e))
        .ok();
    let bar1 = dev.bar1_memory_info().map_err(|e| note("BAR1", &e)).ok();
    let pcie = (|| -> Result<PcieLinkFacts, NvmlError> {
        Ok(PcieLinkFacts {
            cur_gen: dev.current_pcie_link_gen()?,
            max_gen: dev.max_pcie_link_gen()?,
            cur_width: dev.current_pcie_link_width()?,
            max_width: dev.max_pcie_link_width()?,
        })
    })()
    .map_err(|e| note("PCIe link", &e))
    .ok();
    let nvlinks = read_nvlinks(nvml, dev, &mut gaps);
    Ok(NvmlGpu {
        index,
        pci: normalize_pci(&pci_raw)?,
        name,
        memory_bytes,
        bar1_total_bytes: bar1.as_ref().map(|b| b.total),
        bar1_used_bytes: bar1.as_ref().map(|b| b.used),
        pcie,
        nvlinks,
        gaps,
    })
}

fn p2p_status(a: &Device, b: &Device) -> NvmlP2pStatus {
    let get =
        |i: P2pCapabilitiesIndex| a.p2p_status(b, i).map(|s| p2p_cap(&s)).unwrap_or(P2pCap::U);
    NvmlP2pStatus {
        read: get(P2pCapabilitiesIndex::Read),
        write: get(P2pCapabilitiesIndex::Write),
        nvlink: get(P2pCapabilitiesIndex::NvLink),
        atomics: get(P2pCapabilitiesIndex::Atomics),
        pci: get(P2pCapabilitiesIndex::Prop),
    }
}

/// Read everything gdpath uses from NVML.
///
/// Errors: [`CudaError::LibraryMissing`] without `libnvidia-ml.so.1`; [`CudaError::Nvml`] when
/// NVML loads but cannot count GPUs. Per-GPU failures are recorded in [`NvmlGpu::gaps`].
pub fn read() -> Result<NvmlFacts, CudaError> {
    let nvml = init()?;
    no_panic("NVML queries", || {
        let count = nvml
            .device_count()
            .map_err(nvml_err("nvmlDeviceGetCount_v2"))?;
        let mut devices = Vec::new();
        let mut gpus = Vec::new();
        for i in 0..count {
            let dev = nvml
                .device_by_index(i)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex_v2"))?;
            gpus.push(read_gpu(&nvml, i, &dev)?);
            devices.push(dev);
        }
        let mut p2p = Vec::new();
        for (a, da) in devices.iter().enumerate() {
            for (b, db) in devices.iter().enumerate() {
                if a != b {
                    p2p.push((a as u32, b as u32, p2p_status(da, db)));
                }
            }
        }
        Ok(NvmlFacts {
            driver_version: nvml.sys_driver_version().ok(),
            cuda_driver_version: nvml
                .sys_cuda_driver_version()
                .ok()
                .and_then(|v| u32::try_from(v).ok()),
            gpus,
            p2p,
        })
    })
}
