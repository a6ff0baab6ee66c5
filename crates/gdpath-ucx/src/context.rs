//! The UCP context: features, configuration (transports), memory types and resources.

use std::ffi::CString;
use std::fmt;
use std::ops::BitOr;
use std::sync::{Arc, Mutex};

use crate::call;
use crate::error::{Result, UcxError};
use crate::loader::{Ucx, UcxVersion};
use crate::mem_type::MemType;
use crate::sync::lock;
use crate::sys;

/// UCP features a context is created with (`ucp_feature`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Features(u64);

impl Features {
    /// One-sided put/get (`UCP_FEATURE_RMA`).
    pub const RMA: Features = Features(sys::UCP_FEATURE_RMA as u64);
    /// Active messages (`UCP_FEATURE_AM`): this crate's control messages.
    pub const AM: Features = Features(sys::UCP_FEATURE_AM as u64);
    /// Blocking waits on an event fd (`UCP_FEATURE_WAKEUP`). Off by default. Together with
    /// tag matching (`UCP_FEATURE_TAG`, which this crate does not use), UCX's wireup puts the active-message lane only on a transport that
    /// can raise events; without TAG the lanes are chosen as without WAKEUP, and traffic on a
    /// transport that cannot raise events does not wake a waiter (bound the wait).
    pub const WAKEUP: Features = Features(sys::UCP_FEATURE_WAKEUP as u64);

    /// The raw `UCP_FEATURE_*` mask.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// True when every feature of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

/// How to create a [`Context`].
#[derive(Debug, Clone)]
pub struct UcxCfg {
    /// UCP features; default RMA | AM.
    pub features: Features,
    /// Transports (`UCX_TLS`), e.g. `"tcp"` or `"sm,self"`; `None` keeps UCX's default (or the
    /// environment's `UCX_TLS`).
    pub transports: Option<String>,
    /// Devices (`UCX_NET_DEVICES`), e.g. `"lo"` or `"mlx5_0:1"`; `None` keeps the default.
    pub devices: Option<String>,
    /// Other UCX settings as (name without the `UCX_` prefix, value), applied last; a value
    /// UCX refuses is an error (UCX ≥ 1.13 accepts names it does not know: it keeps them for
    /// its transports).
    pub extra: Vec<(String, String)>,
    /// Settings the caller prefers but the user may override, as (name without the `UCX_`
    /// prefix, value): skipped when the environment sets `UCX_<name>` (a value in UCX's
    /// configuration file is overridden), and when UCX refuses the value (it checks the values
    /// of its UCP settings here; a transport's setting is kept unchecked for the transport);
    /// applied before `extra`.
    pub defaults: Vec<(String, String)>,
}

impl Default for UcxCfg {
    fn default() -> Self {
        UcxCfg {
            features: Features::RMA | Features::AM,
            transports: None,
            devices: None,
            extra: Vec::new(),
            defaults: Vec::new(),
        }
    }
}

/// A transport on a device, as UCX lists a resource (`tcp/lo`, `posix/memory`, `rc_mlx5/mlx5_0:1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    /// Transport name (`tcp`, `posix`, `sysv`, `cma`, `self`, `rc_mlx5`, `cuda_copy`, ...).
    pub transport: String,
    /// Device name (`lo`, `eth0`, `memory`, `mlx5_0:1`, ...).
    pub device: String,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.transport, self.device)
    }
}

/// What the loaded UCX offers this context.
#[derive(Debug, Clone)]
pub struct UcxFacts {
    /// The library loaded (name or path).
    pub library: String,
    /// Its version.
    pub version: UcxVersion,
    /// Its version string.
    pub version_string: String,
    /// The transports and devices this context may use: the "resource" lines of
    /// `ucp_context_print_info`, the same set `ucx_info -d` lists filtered by `UCX_TLS`.
    pub resources: Vec<Resource>,
    /// Memory types the context can map and move (`UCP_ATTR_FIELD_MEMORY_TYPES`).
    pub memory_types: Vec<MemType>,
    /// True when CUDA device memory is among them (UCX built with CUDA and libcuda present).
    pub cuda_supported: bool,
    /// True when `ucp_ep_query` reports endpoint transports (UCX >= 1.14); otherwise
    /// [`crate::Endpoint::transports`] parses `ucp_ep_print_info`.
    pub ep_transport_query: bool,
    /// True when the context is safe to share between workers of different threads
    /// (`UCS_THREAD_MODE_MULTI`: UCX built with `--enable-mt`).
    pub thread_multi: bool,
}

pub(crate) struct ContextInner {
    pub(crate) ucx: Arc<Ucx>,
    pub(crate) raw: sys::ucp_context_h,
    pub(crate) features: Features,
    /// Serialises context-level calls (mem_map, rkey_pack, ...). When UCX cannot make the
    /// context thread-safe itself, workers share this lock too (see [`Context::worker_lock`]).
    pub(crate) lock: Arc<Mutex<()>>,
    pub(crate) thread_multi: bool,
}

// SAFETY: every call on `raw` is made under `lock`, and workers of a context that is not
// UCS_THREAD_MODE_MULTI share that same lock, so UCX never sees two threads at once in a
// context that was not made for it.
unsafe impl Send for ContextInner {}
// SAFETY: as for Send.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let _g = lock(&self.lock);
        // SAFETY: last reference; workers, endpoints and mem handles hold a Context clone, so
        // all of them are gone.
        unsafe { call::cleanup(&self.ucx.api, self.raw) };
    }
}

/// A UCP context (`ucp_context_h`): cheap to clone, shareable between threads.
///
/// Thread safety: the context is created with `mt_workers_shared = 1`; when the loaded UCX
/// grants `UCS_THREAD_MODE_MULTI`, each worker serialises its own calls and the context
/// locks internally; otherwise one lock serialises the context and all its workers.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("features", &self.inner.features)
            .field("thread_multi", &self.inner.thread_multi)
            .finish()
    }
}

impl Context {
    /// Loads libucp ([`Ucx::load`]) and creates a context.
    pub fn new(cfg: &UcxCfg) -> Result<Context> {
        Self::with_ucx(Ucx::load()?, cfg)
    }

    /// Creates a context on an already loaded libucp.
    ///
    /// Errors: [`UcxError::InvalidArgument`] for a setting containing NUL,
    /// [`UcxError::Status`] from `ucp_config_modify` (a value of `transports`, `devices` or
    /// `extra` UCX refuses; refused `defaults` are skipped) or `ucp_init_version`
    /// (e.g. `UCS_ERR_NO_DEVICE` when no requested transport exists).
    pub fn with_ucx(ucx: Arc<Ucx>, cfg: &UcxCfg) -> Result<Context> {
        let api = &ucx.api;
        let mut settings: Vec<(CString, CString)> = Vec::new();
        let mut push = |k: &str, v: &str| -> Result<()> {
            let k = CString::new(k).map_err(|_| UcxError::InvalidArgument(format!("{k:?}")))?;
            let v = CString::new(v).map_err(|_| UcxError::InvalidArgument(format!("{v:?}")))?;
            settings.push((k, v));
            Ok(())
        };
        if let Some(t) = &cfg.transports {
            push("TLS", t)?;
        }
        if let Some(d) = &cfg.devices {
            push("NET_DEVICES", d)?;
        }
        for (k, v) in &cfg.extra {
            push(k.trim_start_matches("UCX_"), v)?;
        }

        let mut defaults: Vec<(CString, CString)> = Vec::new();
        for (k, v) in &cfg.defaults {
            let k = k.trim_start_matches("UCX_");
            if std::env::var_os(format!("UCX_{k}")).is_some() {
                continue; // the user's choice wins
            }
            let (Ok(k), Ok(v)) = (CString::new(k), CString::new(v.as_str())) else {
                return Err(UcxError::InvalidArgument(format!("{k:?}={v:?}")));
            };
            defaults.push((k, v));
        }

        let config = call::config_read(api)?;
        let result = (|| {
            for (k, v) in &defaults {
                // SAFETY: config was read above and is released only below.
                if let Err(e) = unsafe { call::config_modify(api, config, k, v) } {
                    tracing::debug!("UCX refused the default {k:?}={v:?} ({e}); skipped");
                }
            }
            for (k, v) in &settings {
                // SAFETY: as above.
                unsafe { call::config_modify(api, config, k, v) }?;
            }
            let mut params: sys::ucp_params_t = call::unset();
            params.field_mask =
                (sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED) as u64;
            params.features = cfg.features.bits();
            params.mt_workers_shared = 1;
            // SAFETY: config is live; both flags exist since UCX 1.13.
            unsafe { call::init_version(api, &params, config) }
        })();
        // SAFETY: config was read above and is no longer used.
        unsafe { call::config_release(api, config) };
        let raw = result?;

        // SAFETY: raw is a live context; THREAD_MODE exists since UCX 1.13.
        let thread_multi =
            unsafe { call::context_query(api, raw, sys::UCP_ATTR_FIELD_THREAD_MODE as u64) }
                .is_ok_and(|attr| attr.thread_mode == sys::UCS_THREAD_MODE_MULTI);
        Ok(Context {
            inner: Arc::new(ContextInner {
                ucx: ucx.clone(),
                raw,
                features: cfg.features,
                lock: Arc::new(Mutex::new(())),
                thread_multi,
            }),
        })
    }

    /// The loaded library.
    pub fn ucx(&self) -> &Arc<Ucx> {
        &self.inner.ucx
    }

    /// The loaded library's functions.
    pub(crate) fn api(&self) -> &sys::Ucp {
        &self.inner.ucx.api
    }

    pub(crate) fn require(&self, f: Features, name: &'static str) -> Result<()> {
        if self.inner.features.contains(f) {
            Ok(())
        } else {
            Err(UcxError::FeatureMissing(name))
        }
    }

    /// The lock a new worker of this context serialises its calls with.
    pub(crate) fn worker_lock(&self) -> Arc<Mutex<()>> {
        if self.inner.thread_multi {
            Arc::new(Mutex::new(()))
        } else {
            self.inner.lock.clone()
        }
    }

    /// Memory types this context can map and move (`ucp_context_query`,
    /// `UCP_ATTR_FIELD_MEMORY_TYPES`).
    pub fn memory_types(&self) -> Result<Vec<MemType>> {
        let attr = {
            let _g = lock(&self.inner.lock);
            // SAFETY: live context, calls serialised; MEMORY_TYPES exists since UCX 1.13.
            unsafe {
                call::context_query(
                    self.api(),
                    self.inner.raw,
                    sys::UCP_ATTR_FIELD_MEMORY_TYPES as u64,
                )
            }?
        };
        Ok(MemType::ALL
            .into_iter()
            .filter(|m| attr.memory_types & (1u64 << m.raw()) != 0)
            .collect())
    }

    /// True when this context can map and move memory of type `m`.
    pub fn supports(&self, m: MemType) -> Result<bool> {
        Ok(self.memory_types()?.contains(&m))
    }

    /// `Ok` when this context can map and move memory of type `m`.
    ///
    /// Errors: [`UcxError::MemTypeUnsupported`] listing the types it can.
    pub(crate) fn require_mem_type(&self, m: MemType) -> Result<()> {
        let have = self.memory_types()?;
        if have.contains(&m) {
            return Ok(());
        }
        let have: Vec<&str> = have.iter().map(|t| t.name()).collect();
        Err(UcxError::MemTypeUnsupported(m, have.join(",")))
    }

    /// UCX's own description of the context (`ucp_context_print_info`).
    pub fn print_info(&self) -> Result<String> {
        let _g = lock(&self.inner.lock);
        // SAFETY: live context, calls serialised.
        unsafe { call::context_print_info(self.api(), self.inner.raw) }
    }

    /// The transports and devices this context may use (see [`UcxFacts::resources`]).
    pub fn resources(&self) -> Result<Vec<Resource>> {
        Ok(parse_resources(&self.print_info()?))
    }

    /// Version, resources, memory types and capabilities in one value.
    pub fn facts(&self) -> Result<UcxFacts> {
        let memory_types = self.memory_types()?;
        let ucx = self.ucx();
        Ok(UcxFacts {
            library: ucx.library().to_string(),
            version: ucx.version(),
            version_string: ucx.version_string().to_string(),
            resources: self.resources()?,
            cuda_supported: memory_types.contains(&MemType::Cuda),
            memory_types,
            ep_transport_query: ucx.has_ep_transport_query(),
            thread_multi: self.inner.thread_multi,
        })
    }
}

/// Parses the `resource N : md M dev D flags -- tl/dev` lines of `ucp_context_print_info`
/// (format identical in UCX 1.13 through 1.22).
pub(crate) fn parse_resources(text: &str) -> Vec<Resource> {
    let mut out: Vec<Resource> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if !line.starts_with("resource") {
            continue;
        }
        let Some((_, name)) = line.rsplit_once(" -- ") else {
            continue;
        };
        if let Some((tl, dev)) = name.trim().split_once('/') {
            let r = Resource {
                transport: tl.to_string(),
                device: dev.to_string(),
            };
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resource_lines_of_1_13_and_1_22() {
        // Lines as UCX 1.13.1 (Debian) and 1.22.0 (PyPI wheel) print them.
        let text = "#\n# UCP context\n#\n#            md 0  :  component 0  self \n\
                    #      resource 0  :  md 0  dev 0  flags -- self/memory0\n\
                    #      resource 1  :  md 1  dev 1  flags -- tcp/lo\n\
                    #      resource 2  :  md 1  dev 2  flags -- tcp/eth0\n\
                    #      resource 4  :  md 3  dev 0  flags -- posix/memory\n\
                    #      resource 5  :  md 4  dev 3  flags -- rc_mlx5/mlx5_0:1\n";
        let r = parse_resources(text);
        let names: Vec<String> = r.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            names,
            [
                "self/memory0",
                "tcp/lo",
                "tcp/eth0",
                "posix/memory",
                "rc_mlx5/mlx5_0:1"
            ]
        );
    }

    #[test]
    fn features_combine() {
        let f = Features::RMA | Features::AM;
        assert!(f.contains(Features::RMA));
        assert!(!f.contains(Features::WAKEUP));
    }
}
