//! `PosixBuffered`: pread/pwrite through the page cache on a thread pool, the fallback where
//! O_DIRECT is refused or switched off. Reads and writes go straight between the file and the
//! registered memory (no bounce buffers).

use super::fileio::buffered_full;
use super::{Backend, Capability, PlanChoice, Preference, Refusal, SplitItem};
use crate::config::StorageConfig;
use crate::finding::ids;
use crate::memory::MemoryClass;
use crate::os::mem::HostMem;
use crate::path::DataPath;
use crate::region::{Descriptor, DirectStatus, Region};
use crate::transfer::{Op, WorkItem};
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Backend name.
pub const NAME: &str = "posix-buffered";

struct Job {
    split: Arc<SplitItem>,
    op: Op,
    file: Region,
    file_off: u64,
    /// The registered host memory and the chunk's offset in it.
    mem: HostMem,
    mem_off: usize,
    len: u64,
}

/// The buffered storage backend.
pub struct PosixBuffered {
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    chunk: u64,
}

impl PosixBuffered {
    /// Starts `cfg.buffered_threads` worker threads.
    pub fn new(cfg: &StorageConfig) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let threads = (0..cfg.buffered_threads)
            .map(|i| {
                let rx: Receiver<Job> = rx.clone();
                std::thread::Builder::new()
                    .name(format!("gdpath-buffered-{i}"))
                    .spawn(move || worker(rx))
                    .expect("spawning a thread")
            })
            .collect();
        PosixBuffered {
            tx: Some(tx),
            threads,
            chunk: cfg.chunk,
        }
    }
}

impl Job {
    /// Reports this chunk to its pair, after letting go of the pair's memory: the pair may
    /// complete now, and its caller may then take the memory back (`Region::into_host_buffer`).
    fn report(self, r: crate::Result<u64>) {
        let Job {
            split, mem, file, ..
        } = self;
        drop((mem, file));
        split.part_done(r);
    }
}

fn worker(rx: Receiver<Job>) {
    for job in rx {
        if job.split.failed() {
            job.report(Ok(0));
            continue;
        }
        if let Some(Some(stop)) = job.split.with_item(|i| i.stop_reason()) {
            job.report(Err(stop));
            continue;
        }
        job.split.with_item(|i| i.mark_started());
        let Some(file) = job.file.file() else {
            job.report(Err(crate::Error::Backend {
                backend: NAME,
                detail: "target is not a file".into(),
            }));
            continue;
        };
        let r = buffered_full(
            NAME,
            job.op,
            file,
            &job.mem,
            job.mem_off,
            job.len,
            job.file_off,
        );
        job.report(r);
    }
}

impl Drop for PosixBuffered {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Backend for PosixBuffered {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::both(
            MemoryClass::Host,
            MemoryClass::File,
            DataPath::PosixBuffered,
            Preference::Fallback,
        )]
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> Result<PlanChoice, Refusal> {
        let file = super::host_and_file(local, target)?;
        let mut choice = PlanChoice::on(DataPath::PosixBuffered);
        // The finding for a fallback comes from the preferred backend's refusal; when this
        // backend is used for a file that was switched to buffered I/O, say so as well.
        if file.direct_status() == DirectStatus::Disabled {
            choice.finding = Some(ids::STORAGE_ODIRECT_DISABLED.into());
        }
        Ok(choice)
    }

    fn submit(&self, items: Vec<WorkItem>) {
        let Some(tx) = &self.tx else { return };
        for item in items {
            let (Some(mem), file) = (
                item.local().region.host_mem().cloned(),
                item.target().region.clone(),
            ) else {
                item.complete(Err(crate::Error::Backend {
                    backend: NAME,
                    detail: "local memory is not host memory".into(),
                }));
                continue;
            };
            let mem0 = item.local().offset as usize;
            let (off0, len, op) = (item.target().offset, item.target().len, item.op());
            let parts = len.div_ceil(self.chunk) as usize;
            let split = SplitItem::new(item, parts);
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(self.chunk);
                let job = Job {
                    split: split.clone(),
                    op,
                    file: file.clone(),
                    file_off: off0 + done,
                    mem: mem.clone(),
                    mem_off: mem0 + done as usize,
                    len: n,
                };
                if let Err(e) = tx.send(job) {
                    e.0.report(Err(crate::Error::Backend {
                        backend: NAME,
                        detail: "worker threads stopped".into(),
                    }));
                }
                done += n;
            }
        }
    }
}
