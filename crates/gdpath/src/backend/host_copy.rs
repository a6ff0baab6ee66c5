//! `HostCopy`: host memory ↔ host memory with `memcpy`, on the posting thread.

use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::memory::MemoryClass;
use crate::os::mem::HostMem;
use crate::path::Path;
use crate::region::Descriptor;
use crate::transfer::{Op, WorkItem};

/// Backend name.
pub const NAME: &str = "host-copy";

/// The host-to-host copy backend.
#[derive(Debug, Default)]
pub struct HostCopy;

impl Backend for HostCopy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::both(
            MemoryClass::Host,
            MemoryClass::Host,
            Path::HostCopy,
            Preference::Preferred,
        )]
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> Result<PlanChoice, Refusal> {
        match (local.region.host_ptr(), target.region.host_ptr()) {
            (Some(_), Some(_)) => Ok(PlanChoice::on(Path::HostCopy)),
            _ => Err(Refusal {
                finding: None,
                detail: "both sides must be host memory".into(),
            }),
        }
    }

    fn plan_per_region(&self) -> bool {
        // Both regions being host memory decides it.
        true
    }

    fn submit(&self, items: Vec<WorkItem>) {
        for item in items {
            if let Some(stop) = item.stop_reason() {
                item.complete(Err(stop));
                continue;
            }
            let (Some(l), Some(t)) = (
                item.local().region.host_mem(),
                item.target().region.host_mem(),
            ) else {
                item.complete(Err(crate::Error::Backend {
                    backend: NAME,
                    detail: "both sides must be host memory".into(),
                }));
                continue;
            };
            item.mark_started();
            let len = item.local().len as usize;
            let (lo, to) = (item.local().offset as usize, item.target().offset as usize);
            // `copy` allows the ranges to overlap (one region on both sides).
            let r = match item.op() {
                Op::Read => HostMem::copy(t, to, l, lo, len),
                Op::Write => HostMem::copy(l, lo, t, to, len),
            };
            if let Err(e) = r {
                item.complete(Err(super::range_err(NAME, e)));
                continue;
            }
            item.complete(Ok(len as u64));
        }
    }
}
