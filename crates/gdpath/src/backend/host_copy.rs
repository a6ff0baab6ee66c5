//! `HostCopy`: host memory ↔ host memory with `memcpy`, on the posting thread.

use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::memory::MemoryClass;
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
                item.local().region.host_ptr(),
                item.target().region.host_ptr(),
            ) else {
                item.complete(Err(crate::Error::Backend {
                    backend: NAME,
                    detail: "both sides must be host memory".into(),
                }));
                continue;
            };
            item.mark_started();
            let len = item.local().len as usize;
            // SAFETY: the planner checked both ranges against their regions' lengths; the item
            // keeps both regions alive. `copy` allows the ranges to overlap.
            unsafe {
                let l = l.add(item.local().offset as usize);
                let t = t.add(item.target().offset as usize);
                match item.op() {
                    Op::Read => std::ptr::copy(t, l, len),
                    Op::Write => std::ptr::copy(l, t, len),
                }
            }
            item.complete(Ok(len as u64));
        }
    }
}
