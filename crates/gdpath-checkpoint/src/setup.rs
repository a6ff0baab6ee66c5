//! Loads set up from the storage chooser: the settings [`crate::chooser`] picks for a
//! checkpoint's files, an agent made with them while the GPU's driver and context come up on a
//! thread of their own, a warm-up that pays one-time costs before timed loads, and loads whose
//! chosen buffered reads are not reported as fallbacks. `gdpath load` and the Python module's
//! `load_file` both load through it.

use super::load::{Checkpoint, Destination, LoadError, LoadedCheckpoint};
use crate::chooser::{Dest, Overrides, Tuning};
use gdpath::error::Error;
use gdpath::finding::ids;
use gdpath::memory::{FileSpec, Memory};
use gdpath::TransferRequest;
use gdpath::{Agent, AgentConfig};
use std::time::{Duration, Instant};

/// The CUDA driver's initialisation and GPU `ordinal`'s primary context, brought up on a thread
/// of their own so that a load's CPU work (reading headers, the storage chooser, the agent's
/// CPU backends) runs meanwhile: the context is then already there when the load's agent
/// retains it. Holding it keeps the primary context alive; drop it once the agent has made its
/// own (after its first GPU registration). Failures are not reported here: the agent meets
/// them again and says why.
#[derive(Debug)]
pub struct GpuPrestart {
    thread: Option<std::thread::JoinHandle<Option<(gdpath_cuda::Context, Duration)>>>,
}

impl GpuPrestart {
    /// Starts the thread (a thread that cannot be started is no prestart: the agent does it).
    pub fn spawn(ordinal: u32) -> GpuPrestart {
        let thread = std::thread::Builder::new()
            .name("gdpath-cuda-prestart".into())
            .spawn(move || {
                let t0 = Instant::now();
                let cuda = gdpath_cuda::Cuda::load().ok()?;
                let ctx = gdpath_cuda::Context::new(&cuda, ordinal).ok()?;
                Some((ctx, t0.elapsed()))
            })
            .ok();
        GpuPrestart { thread }
    }

    /// Waits for the thread; returns how long the driver and the context took to come up on
    /// it (seconds), `None` when they failed. The context is released.
    pub fn finish(mut self) -> Option<f64> {
        let (_ctx, took) = self.thread.take()?.join().ok().flatten()?;
        Some(took.as_secs_f64())
    }
}

/// An agent set up for loading a checkpoint into one destination with the settings the chooser
/// picked for its files ([`Checkpoint::setup`]).
#[derive(Debug)]
pub struct LoadSetup {
    /// The agent: the base configuration with `tuning` applied ([`Tuning::apply`]).
    pub agent: Agent,
    /// What the chooser picked (with the caller's overrides) and why.
    pub tuning: Tuning,
    /// Where [`LoadSetup::load`] and [`LoadSetup::warm_up`] put the bytes.
    pub dest: Destination,
    /// Holds the GPU's primary context until the agent holds it (its first GPU work).
    prestart: Option<GpuPrestart>,
    context_s: Option<f64>,
}

impl Checkpoint {
    /// The chooser's settings ([`crate::chooser::choose`]) for reading this checkpoint's files into
    /// `dest`, with `over`'s values in place of the rule's. Errors: [`LoadError::Engine`]
    /// naming the first file when the files cannot be examined.
    pub fn choose(&self, dest: Destination, over: &Overrides) -> Result<Tuning, LoadError> {
        let to = match dest {
            Destination::Gpu(_) => Dest::Gpu,
            Destination::Host { .. } => Dest::Host,
        };
        crate::chooser::choose(&self.files, to, over).map_err(|e| self.engine_error(e))
    }

    /// An agent for loading this checkpoint into `dest`: [`Checkpoint::choose`]'s settings
    /// applied to `base`, with the GPU's CUDA driver and primary context brought up on a thread
    /// while the files are examined and the agent's CPU backends start.
    ///
    /// Errors: those of [`Checkpoint::choose`]; [`LoadError::Engine`] when the agent cannot be
    /// made, or with `Error::Unsupported` when `dest` is a GPU and no CUDA driver could be
    /// loaded (nothing is allocated).
    pub fn setup(
        &self,
        dest: Destination,
        over: &Overrides,
        base: AgentConfig,
    ) -> Result<LoadSetup, LoadError> {
        let prestart = match dest {
            Destination::Gpu(g) => Some(GpuPrestart::spawn(g)),
            Destination::Host { .. } => None,
        };
        let tuning = self.choose(dest, over)?;
        let mut cfg = base;
        tuning.apply(&mut cfg);
        let agent = Agent::new(cfg).map_err(|e| self.engine_error(e))?;
        if let Destination::Gpu(g) = dest {
            if !agent.backends().iter().any(|b| b.name == "cuda") {
                return Err(self.engine_error(Error::Unsupported {
                    what: format!("loading onto GPU {g} (no CUDA driver could be loaded here)"),
                    backend: "cuda",
                }));
            }
        }
        Ok(LoadSetup {
            agent,
            tuning,
            dest,
            prestart,
            context_s: None,
        })
    }

    fn engine_error(&self, error: Error) -> LoadError {
        LoadError::Engine {
            path: self.files[0].clone(),
            error: Box::new(error),
        }
    }
}

impl LoadSetup {
    /// A setup around `agent`, already made with `tuning`'s settings (an agent a caller keeps
    /// between loads whose files get the same settings), loading into `dest`.
    pub fn with_agent(agent: Agent, tuning: Tuning, dest: Destination) -> LoadSetup {
        LoadSetup {
            agent,
            tuning,
            dest,
            prestart: None,
            context_s: None,
        }
    }

    /// One-time setup a serving process pays once, paid before timed loads: for a GPU, reading
    /// the first `threads × chunk × max(2, slabs)` bytes of `ck`'s first file onto it brings up
    /// the agent's context and the file path's own setup (cuFile's driver open and registration
    /// attempt where the tuning opens cuFile, the staged path's pinned bounce buffers: enough
    /// chunks that every thread takes both its buffers, or every slab is taken, and they stay
    /// pooled).
    /// Returns the seconds it took; `Ok(None)` for host memory, which has nothing to set up.
    /// docs/gds.md says what it costs on the H200.
    ///
    /// Errors: [`LoadError::Engine`] for the registration, allocation or read (the allocation
    /// is freed again).
    pub fn warm_up(&mut self, ck: &Checkpoint) -> Result<Option<f64>, LoadError> {
        let Destination::Gpu(ordinal) = self.dest else {
            return Ok(None);
        };
        let t = Instant::now();
        let eng = |e| ck.engine_error(e);
        let f = self
            .agent
            .register(Memory::File(FileSpec::read(&ck.files[0])))
            .map_err(eng)?;
        let gds = &self.agent.config().gds;
        let len = f
            .len()
            .map_err(eng)?
            .min((gds.threads as u64).max(1) * gds.chunk * gds.slabs.max(2) as u64);
        if len > 0 {
            let g = self
                .agent
                .register(Memory::Gpu { ordinal, len })
                .map_err(eng)?;
            self.agent
                .post(TransferRequest::read(
                    vec![g.desc(0, len)],
                    vec![f.desc(0, len)],
                ))
                .map_err(eng)?
                .wait()
                .map_err(|e| eng(e.error))?;
        }
        self.release_prestart();
        Ok(Some(t.elapsed().as_secs_f64()))
    }

    /// [`Checkpoint::load`] of `ck` (every tensor, or those `names`) into [`LoadSetup::dest`]
    /// with this agent, `elapsed` counted from the call. A buffered read the tuning chose is
    /// not a fallback: its `storage.odirect-disabled` finding is dropped from the result.
    /// Errors: those of [`Checkpoint::load`].
    pub fn load(
        &mut self,
        ck: &Checkpoint,
        names: Option<&[&str]>,
    ) -> Result<LoadedCheckpoint, LoadError> {
        let t0 = Instant::now();
        let loaded = ck.load(&self.agent, self.dest, names);
        self.release_prestart();
        let mut c = loaded?;
        if !self.tuning.direct
            && c.finding.as_ref().map(|f| f.as_str()) == Some(ids::STORAGE_ODIRECT_DISABLED)
        {
            c.finding = None;
            c.detail = None;
        }
        c.elapsed = t0.elapsed();
        Ok(c)
    }

    /// Waits [`super::load::SETTLE_AFTER_FREE`] when this setup loads onto a GPU, and returns
    /// at once for host memory: a caller timing loads in a row calls it after freeing one load
    /// and before the next, which would otherwise overlap the driver's work on the freed memory.
    pub fn settle_after_free(&self) {
        if matches!(self.dest, Destination::Gpu(_)) {
            std::thread::sleep(super::load::SETTLE_AFTER_FREE);
        }
    }

    /// Seconds the CUDA driver and the GPU's primary context took to come up on the prestart
    /// thread, beside the chooser and the agent's start; `None` for host memory, before the
    /// first [`LoadSetup::warm_up`] or [`LoadSetup::load`], or when they failed there (the
    /// agent then met the failure and said why).
    pub fn context_s(&self) -> Option<f64> {
        self.context_s
    }

    /// The agent holds the GPU's context after its first GPU work: the prestart's hold can go.
    fn release_prestart(&mut self) {
        if let Some(p) = self.prestart.take() {
            self.context_s = p.finish();
        }
    }
}
