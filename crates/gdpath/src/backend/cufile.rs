//! `cufile` and `cufile-compat`: file ↔ GPU memory through cuFile (GPUDirect Storage).
//!
//! cuFile is opened on the first file registration (`cuFileDriverOpen`, on GPU 0's primary
//! context), and every file region is registered with it then (`cuFileHandleRegister`, on the
//! O_DIRECT descriptor where there is one). A failure there does not fail the region: it is
//! recorded with cuFile's own reason (code, name and text, e.g. `CU_FILE_HANDLE_NOT_REGISTERED
//! (5027): file descriptor is not registered`) and the planner falls back, carrying
//! `gds.handle-register-failed` — the trap of containers without `/run/udev` and of VMs whose
//! virtio disks have no udev data.
//!
//! Which GDS mode a registered file gets is [`crate::gds::decide`]'s answer from the GDS facts,
//! the `cufile.json` settings and the driver's properties:
//!
//! | backend | preference | accepts | refuses with |
//! | --- | --- | --- | --- |
//! | `cufile` | preferred | native mode: `GdsNative` | `gds.cufile-missing`, `gds.handle-register-failed`, `gds.nvidia-fs-missing` (compat mode) |
//! | `cufile-compat` | fallback, after `file-gpu` | compat mode: `GdsCompat` | the same |
//!
//! Compatibility mode is cuFile's own POSIX fallback through its bounce buffers; gdpath's staged
//! path (`file-gpu`) is that same mechanism with more requests in flight, so it is planned first
//! and compat mode is taken only when asked for (`TransferRequest::accept([DataPath::GdsCompat])`,
//! `gdpath bench storage --path compat`).

use super::cuda::{gpu_buffer, memory::cuda_err};
use super::file_gpu::{gpu_and_file, plan_gpu_and_file};
use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::config::GdsConfig;
use crate::error::{Error, Result};
use crate::finding::ids;
use crate::gds::{decide, CufileSettings, DriverView, GdsDecision, GdsFacts, GdsMode};
use crate::memory::MemoryClass;
use crate::path::DataPath;
use crate::region::{BackendHandle, Descriptor, Region};
use crate::transfer::{Op, WorkItem};
use gdpath_cuda::{CuFileDriver, CuFileHandle, CudaError, DeviceBuffer};
use std::sync::{Arc, OnceLock};

/// Name of the native backend (holds the registrations).
pub const NAME: &str = "cufile";
/// Name of the compatibility-mode backend.
pub const COMPAT_NAME: &str = "cufile-compat";

/// What cuFile made of one file region.
pub struct CufileRegistration {
    /// The handle, or why cuFile (or its driver) refused: (finding id, evidence).
    pub handle: std::result::Result<CuFileHandle, (&'static str, String)>,
    /// The mode cuFile runs the file in, or why none.
    pub decision: std::result::Result<GdsDecision, (&'static str, String)>,
}

struct Shared {
    cfg: GdsConfig,
    settings: CufileSettings,
    facts: GdsFacts,
    driver: OnceLock<std::result::Result<(CuFileDriver, DriverView), String>>,
}

impl Shared {
    fn driver(&self) -> std::result::Result<&(CuFileDriver, DriverView), &String> {
        self.driver
            .get_or_init(|| {
                let open = || -> std::result::Result<(CuFileDriver, DriverView), CudaError> {
                    let cuda = gdpath_cuda::Cuda::load()?;
                    let ctx = gdpath_cuda::Context::new(&cuda, 0)?;
                    let d = CuFileDriver::open(&ctx)?;
                    let p = d.properties()?;
                    let view = DriverView {
                        nvfs_loaded: p.nvfs_loaded(),
                        compat_allowed: p.compat_mode_allowed(),
                    };
                    Ok((d, view))
                };
                open().map_err(|e| e.to_string())
            })
            .as_ref()
    }

    fn register_file(&self, region: &Region) -> CufileRegistration {
        let file = region.file().expect("called for file regions only");
        let has_direct = file.direct_fd().is_some();
        let (driver, view) = match self.driver() {
            Ok((d, v)) => (d, *v),
            Err(e) => {
                let why = (ids::GDS_CUFILE_MISSING, format!("cuFile: {e}"));
                return CufileRegistration {
                    handle: Err(why.clone()),
                    decision: Err(why),
                };
            }
        };
        let decision = decide(&self.facts, &self.settings, Some(&view), has_direct);
        let dup = file
            .direct_file()
            .unwrap_or_else(|| file.buffered_file())
            .try_clone();
        let handle = match dup {
            Err(e) => Err((
                ids::GDS_HANDLE_REGISTER_FAILED,
                format!("{}: duplicating the descriptor: {e}", file.path().display()),
            )),
            Ok(owned) => CuFileHandle::register(driver, Arc::new(owned)).map_err(|e| {
                (
                    ids::GDS_HANDLE_REGISTER_FAILED,
                    format!("cuFileHandleRegister({}): {e}", file.path().display()),
                )
            }),
        };
        if let Err((_, why)) = &handle {
            tracing::debug!(file = %file.path().display(), reason = %why, "cuFile refused the file");
        }
        CufileRegistration { handle, decision }
    }
}

/// A cuFile backend: [`CufileBackend::pair`] makes the native and the compat one.
pub struct CufileBackend {
    shared: Arc<Shared>,
    mode: GdsMode,
}

impl std::fmt::Debug for CufileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CufileBackend")
            .field("mode", &self.mode)
            .field("facts", &self.shared.facts)
            .finish()
    }
}

impl CufileBackend {
    /// The native (`cufile`) and compatibility (`cufile-compat`) backends, sharing one driver
    /// and one registration per file. `facts`: [`GdsFacts::gather`] of `/`; `settings`: the
    /// `cufile.json` in force, parsed by the doctor's parser (default: unknown, cuFile's
    /// defaults). Nothing is loaded until the first file is registered.
    pub fn pair(
        cfg: GdsConfig,
        facts: GdsFacts,
        settings: CufileSettings,
    ) -> Result<(CufileBackend, CufileBackend)> {
        cfg.validate()?;
        let shared = Arc::new(Shared {
            cfg,
            settings,
            facts,
            driver: OnceLock::new(),
        });
        Ok((
            CufileBackend {
                shared: shared.clone(),
                mode: GdsMode::Native,
            },
            CufileBackend {
                shared,
                mode: GdsMode::Compat,
            },
        ))
    }

    fn path(&self) -> DataPath {
        match self.mode {
            GdsMode::Native => DataPath::GdsNative,
            GdsMode::Compat => DataPath::GdsCompat,
        }
    }

    fn execute(&self, item: &WorkItem) -> Result<u64> {
        if let Some(stop) = item.stop_reason() {
            return Err(stop);
        }
        item.mark_started();
        let (g, f) = gpu_and_file(item.local(), item.target()).ok_or_else(|| Error::Backend {
            backend: NAME,
            detail: "not a GPU/file pair".into(),
        })?;
        let to_gpu = (g.region.id() == item.local().region.id()) == (item.op() == Op::Read);
        let dev = gpu_buffer(&g.region).ok_or_else(|| Error::Backend {
            backend: NAME,
            detail: format!("region {} is not GPU memory", g.region.id()),
        })?;
        let path = f
            .region
            .file()
            .map(|x| x.path().to_owned())
            .unwrap_or_default();
        f.region.with_backend_handle(NAME, |h| {
            let reg = h
                .and_then(|h| h.downcast_ref::<CufileRegistration>())
                .and_then(|r| r.handle.as_ref().ok())
                .ok_or_else(|| Error::Backend {
                    backend: NAME,
                    detail: format!("{} has no cuFile handle", path.display()),
                })?;
            let stop = || item.stop_reason();
            cufile_copy(
                reg,
                dev,
                g.offset,
                f.offset,
                f.len,
                to_gpu,
                &self.shared.cfg,
                &stop,
                &path,
            )
        })?;
        Ok(f.len)
    }
}

/// Blocking cuFile I/O of one pair, in `chunk`-byte requests over `threads` threads.
#[allow(clippy::too_many_arguments)]
fn cufile_copy(
    h: &CuFileHandle,
    dev: &DeviceBuffer,
    dev_off: u64,
    file_off: u64,
    len: u64,
    to_gpu: bool,
    cfg: &GdsConfig,
    stop: &(dyn Fn() -> Option<Error> + Sync),
    path: &std::path::Path,
) -> Result<()> {
    let chunk = cfg.chunk;
    let n = len.div_ceil(chunk) as usize;
    let workers = cfg.threads.clamp(1, n.max(1));
    let what = if to_gpu { "cuFileRead" } else { "cuFileWrite" };
    let one = |w: usize| -> Result<()> {
        for c in (w..n).step_by(workers) {
            if let Some(e) = stop() {
                return Err(e);
            }
            let off = c as u64 * chunk;
            let l = chunk.min(len - off);
            let mut done = 0u64;
            while done < l {
                let (b, fo, rest) = (
                    (dev_off + off + done) as usize,
                    file_off + off + done,
                    (l - done) as usize,
                );
                let r = if to_gpu {
                    h.read(dev, b, fo, rest)
                } else {
                    h.write(dev, b, fo, rest)
                };
                match r {
                    Ok(0) if to_gpu => {
                        return Err(Error::ShortFile {
                            path: path.to_owned(),
                            offset: fo,
                            wanted: rest as u64,
                            available: 0,
                        })
                    }
                    Ok(0) => {
                        return Err(cuda_err(
                            what,
                            CudaError::InvalidArgument("wrote 0 bytes".into()),
                        ))
                    }
                    Ok(k) => done += k as u64,
                    Err(e) => {
                        return Err(cuda_err(format!("{what} {} at {fo}", path.display()), e))
                    }
                }
            }
        }
        Ok(())
    };
    super::workers::fan_out(workers, one, || Error::Backend {
        backend: NAME,
        detail: "a cuFile thread panicked".into(),
    })
}

impl Backend for CufileBackend {
    fn name(&self) -> &'static str {
        match self.mode {
            GdsMode::Native => NAME,
            GdsMode::Compat => COMPAT_NAME,
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        use MemoryClass::{File, Gpu};
        let pref = match self.mode {
            GdsMode::Native => Preference::Preferred,
            GdsMode::Compat => Preference::Fallback,
        };
        vec![
            Capability::both(Gpu, File, self.path(), pref),
            Capability::both(File, Gpu, self.path(), pref),
        ]
    }

    fn register(&self, region: &Region) -> Result<Option<BackendHandle>> {
        if self.mode != GdsMode::Native || !self.shared.cfg.cufile || region.file().is_none() {
            return Ok(None);
        }
        Ok(Some(Box::new(self.shared.register_file(region))))
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal> {
        let (_, f) = plan_gpu_and_file(self.name(), local, target)?;
        if !self.shared.cfg.cufile {
            return Err(Refusal::unexplained(
                "cuFile switched off (GdsConfig::cufile)",
            ));
        }
        let path = f
            .region
            .file()
            .map(|x| x.path().display().to_string())
            .unwrap_or_default();
        f.region.with_backend_handle(NAME, |h| {
            let Some(reg) = h.and_then(|h| h.downcast_ref::<CufileRegistration>()) else {
                return Err(Refusal::unexplained(format!(
                    "{path} was not registered with cuFile"
                )));
            };
            let decision = reg.decision.as_ref();
            if let Err((id, why)) = &reg.handle {
                // The handle failed: say so, and what mode cuFile would have run in.
                let mode = match decision {
                    Ok(d) => format!(" (would run in {:?} mode: {})", d.mode, d.detail),
                    Err((_, w)) => format!(" ({w})"),
                };
                return Err(Refusal::because(id, format!("{why}{mode}")));
            }
            match decision {
                Err((id, why)) => Err(Refusal::because(id, why.clone())),
                Ok(d) if d.mode == self.mode => Ok(PlanChoice {
                    path: self.path(),
                    finding: d.finding.map(Into::into),
                    detail: Some(d.detail.clone()),
                }),
                Ok(d) => Err(Refusal {
                    finding: d.finding.map(Into::into),
                    detail: format!("cuFile runs {path} in {:?} mode: {}", d.mode, d.detail),
                }),
            }
        })
    }

    fn submit(&self, items: Vec<WorkItem>) {
        // cuFile calls block: one thread per item (each splits its pair over `threads`).
        for item in items {
            let me = CufileBackend {
                shared: self.shared.clone(),
                mode: self.mode,
            };
            let spawned = std::thread::Builder::new()
                .name("gdpath-cufile".into())
                .spawn(move || {
                    let r = me.execute(&item);
                    item.complete(r);
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a cuFile thread");
            }
        }
    }
}
