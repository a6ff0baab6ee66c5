//! `HostCopy`: host memory ↔ host memory with `memcpy`, on the posting thread; block lists
//! (CPU KV tiers, [`crate::blocks`]) as one `memmove` per merged run. A peer's host region on
//! this node that the peer shares ([`super::shm`]) counts as host memory: the bytes go
//! straight into the peer's pages.

use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::blocks::{BatchReport, CopyMethod};
use crate::memory::MemoryClass;
use crate::os::mem::HostMem;
use crate::path::DataPath;
use crate::region::{Descriptor, Region};
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
        vec![
            Capability::both(
                MemoryClass::Host,
                MemoryClass::Host,
                DataPath::HostCopy,
                Preference::Preferred,
            ),
            // A peer's shared host memory on this node (refused otherwise: UCX takes the pair).
            Capability::both(
                MemoryClass::Host,
                MemoryClass::Remote,
                DataPath::HostCopy,
                Preference::Preferred,
            ),
        ]
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> Result<PlanChoice, Refusal> {
        match (host_side(&local.region), host_side(&target.region)) {
            (Some(Ok(_)), Some(Ok(_))) => Ok(PlanChoice::on(DataPath::HostCopy)),
            (Some(Err(e)), _) | (_, Some(Err(e))) => Err(Refusal::unexplained(e.to_string())),
            _ => Err(Refusal::unexplained(
                "both sides must be host memory (a peer's only when it shares it on this node)",
            )),
        }
    }

    fn plan_per_region(&self) -> bool {
        // Both regions being host memory decides it.
        true
    }

    fn block_lists(&self) -> bool {
        true
    }

    fn submit(&self, items: Vec<WorkItem>) {
        for item in items {
            if let Some(stop) = item.stop_reason() {
                item.complete(Err(stop));
                continue;
            }
            if item.blocks().is_some() {
                copy_blocks(item);
                continue;
            }
            let (l, t) = match both_host(item.local(), item.target()) {
                Ok(lt) => lt,
                Err(e) => {
                    item.complete(Err(e));
                    continue;
                }
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

/// The host memory of `region`: its own, or a peer's shared memory mapped here; `None` for
/// other memory; the error of a peer's that cannot be mapped, was withdrawn or whose peer
/// failed.
fn host_side(region: &Region) -> Option<Result<&HostMem, crate::Error>> {
    if let Some(m) = region.host_mem() {
        return Some(Ok(m));
    }
    super::ucx::shm_import(region).map(|r| {
        r.and_then(|i| {
            i.mem().map_err(|detail| crate::Error::Backend {
                backend: NAME,
                detail,
            })
        })
    })
}

/// The host memory of both sides of a pair, or the error that stops it.
fn both_host<'a>(
    a: &'a Descriptor,
    b: &'a Descriptor,
) -> Result<(&'a HostMem, &'a HostMem), crate::Error> {
    match (host_side(&a.region), host_side(&b.region)) {
        (Some(Ok(x)), Some(Ok(y))) => Ok((x, y)),
        (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e),
        _ => Err(crate::Error::Backend {
            backend: NAME,
            detail: "both sides must be host memory".into(),
        }),
    }
}

/// Moves a block list: one `memmove` per merged run, source to destination. The report's
/// `post_ns` is the whole copy (the CPU moves the bytes as it walks the list).
fn copy_blocks(item: WorkItem) {
    let fail = |detail: String| crate::Error::Backend {
        backend: NAME,
        detail,
    };
    let (src, dst) = match item.op() {
        Op::Write => (item.local(), item.target()),
        Op::Read => (item.target(), item.local()),
    };
    let (s, d) = match both_host(src, dst) {
        Ok(sd) => sd,
        Err(e) => {
            item.complete(Err(e));
            return;
        }
    };
    if let Some(m) = item.forced_method().filter(|&m| m != CopyMethod::Copies) {
        item.complete(Err(fail(format!(
            "the {m} method was asked for; host memory moves with copies only"
        ))));
        return;
    }
    let list = item.blocks().expect("checked by the caller");
    item.mark_started();
    let t = std::time::Instant::now();
    let mut first_err = None;
    let runs = list.for_each_run(|so, dof, len| {
        if first_err.is_none() {
            // Offsets are inside the regions (checked when prepared and posted).
            if let Err(e) = HostMem::copy(s, so as usize, d, dof as usize, len as usize) {
                first_err = Some(e);
            }
        }
    });
    let batch = BatchReport {
        method: CopyMethod::Copies,
        descriptors: list.descriptors(),
        coalesced: runs,
        posted: runs,
        post_ns: t.elapsed().as_nanos() as u64,
    };
    let bytes = list.bytes();
    match first_err {
        Some(e) => item.complete(Err(super::range_err(NAME, e))),
        None => item.complete_batch(Ok(bytes), batch),
    }
}
