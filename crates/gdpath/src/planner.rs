//! The path planner: picks a backend per descriptor pair and records why the preferred path was
//! not taken.
//!
//! Candidates are the backends' capabilities for the pair's memory classes and operation,
//! preferred ones first (then in backend registration order). Each is asked to [`Backend::plan`]
//! the pair; the first acceptance wins. When the winner is not the first candidate, the first
//! refusal's finding id is attached, so a fallback always says why. In strict mode a choice whose
//! path is not accepted counts as a refusal; if nothing accepted remains, the request fails
//! before any byte moves.

use crate::backend::{Backend, Capability, Preference, Refusal};
use crate::error::{Error, Result};
use crate::memory::MemoryClass;
use crate::path::DataPath;
use crate::region::{Descriptor, RegionId};
use crate::transfer::{Op, PlannedPair};
use std::sync::Arc;

/// An agent's backends in planner order, with the capabilities of each asked once, when it was
/// added (a backend's capabilities do not change; planning reads them for every pair).
#[derive(Default)]
pub(crate) struct BackendSet {
    pub(crate) list: Vec<Arc<dyn Backend>>,
    pub(crate) caps: Vec<Vec<Capability>>,
    /// For each (local class, target class, operation), the positions in `list` of the
    /// backends with a capability for it, best preference first, then in registration order
    /// ([`slot`]): computed when the set is built rather than for every pair posted.
    candidates: [Vec<usize>; SLOTS],
    /// Per slot: every candidate plans per region ([`Backend::plan_per_region`]).
    per_region: [bool; SLOTS],
}

const CLASSES: [MemoryClass; 4] = [
    MemoryClass::Host,
    MemoryClass::File,
    MemoryClass::Gpu,
    MemoryClass::Remote,
];
const OPS: [Op; 2] = [Op::Read, Op::Write];
const SLOTS: usize = CLASSES.len() * CLASSES.len() * OPS.len();

/// The index of a (local class, target class, operation) in [`BackendSet`]'s tables: the
/// enums' declaration order (test `slots_are_one_to_one`).
fn slot(local: MemoryClass, target: MemoryClass, op: Op) -> usize {
    ((local as usize) * CLASSES.len() + target as usize) * OPS.len() + op as usize
}

impl BackendSet {
    /// This set with `backend`, whose capabilities are `caps`, added last.
    pub(crate) fn with(&self, backend: Arc<dyn Backend>, caps: Vec<Capability>) -> BackendSet {
        let mut list = self.list.clone();
        let mut all = self.caps.clone();
        all.push(caps);
        list.push(backend);
        let mut candidates: [Vec<usize>; SLOTS] = std::array::from_fn(|_| Vec::new());
        let mut per_region = [false; SLOTS];
        for lc in CLASSES {
            for tc in CLASSES {
                for op in OPS {
                    let mut c: Vec<(Preference, usize)> = all
                        .iter()
                        .enumerate()
                        .filter_map(|(bi, bc)| {
                            bc.iter()
                                .filter(|c| c.local == lc && c.target == tc && c.ops.contains(&op))
                                .map(|c| c.preference)
                                .min()
                                .map(|p| (p, bi))
                        })
                        .collect();
                    c.sort_by_key(|&(p, bi)| (p, bi));
                    let k = slot(lc, tc, op);
                    per_region[k] = c.iter().all(|&(_, bi)| list[bi].plan_per_region());
                    candidates[k] = c.into_iter().map(|(_, bi)| bi).collect();
                }
            }
        }
        BackendSet {
            list,
            caps: all,
            candidates,
            per_region,
        }
    }

    /// The backends that serve memory of `class` on either side of a pair.
    pub(crate) fn serving(
        &self,
        class: MemoryClass,
    ) -> impl Iterator<Item = &Arc<dyn Backend>> + '_ {
        self.list
            .iter()
            .zip(&self.caps)
            .filter(move |(_, caps)| caps.iter().any(|c| c.local == class || c.target == class))
            .map(|(b, _)| b)
    }
}

/// Plans every pair of a request (`local[i]` with `target[i]`): each backend's position in
/// `set.list` and each plan, in pair order. A pair on the same two regions as the pair before
/// takes that pair's plan when every candidate plans per region
/// ([`Backend::plan_per_region`]): a request of many small pairs is then planned once. With
/// `preferred_only` ([`crate::TransferRequest::preferred_only`]) a plan that carries a finding
/// (a fallback, or a degraded acceptance) fails the request.
pub(crate) fn plan_pairs(
    set: &BackendSet,
    op: Op,
    local: &[Descriptor],
    target: &[Descriptor],
    accept: Option<&[DataPath]>,
    preferred_only: bool,
    notify: bool,
) -> Result<(Vec<usize>, Vec<PlannedPair>)> {
    let mut backends = Vec::with_capacity(local.len());
    let mut plans: Vec<PlannedPair> = Vec::with_capacity(local.len());
    // The regions of the last pair planned, when its plan may be reused.
    let mut reusable: Option<(RegionId, RegionId)> = None;
    for (i, (ld, td)) in local.iter().zip(target).enumerate() {
        let regions = (ld.region.id(), td.region.id());
        if reusable == Some(regions) {
            let last = plans.last().expect("a pair was planned");
            let plan = PlannedPair {
                index: i,
                ..last.clone()
            };
            backends.push(*backends.last().expect("a pair was planned"));
            plans.push(plan);
            continue;
        }
        let (bi, plan) = plan_pair(set, op, i, ld, td, accept, notify)?;
        if preferred_only && plan.finding.is_some() {
            // A fallback, or a degraded acceptance: not the preferred path.
            return Err(Error::PathNotAccepted {
                index: i,
                accepted: Vec::new(),
                planned: Some(plan.path),
                finding: plan.finding,
                detail: plan.detail.unwrap_or_default(),
            });
        }
        let (lc, tc) = (ld.region.kind().class(), td.region.kind().class());
        reusable = set.per_region[slot(lc, tc, op)].then_some(regions);
        backends.push(bi);
        plans.push(plan);
    }
    Ok((backends, plans))
}

/// Plans one pair on its own (index 0): the chosen backend's position and the plan.
pub(crate) fn plan_one(
    set: &BackendSet,
    op: Op,
    local: &Descriptor,
    target: &Descriptor,
) -> Result<(usize, PlannedPair)> {
    plan_pair(set, op, 0, local, target, None, false)
}

/// Plans a block list between the regions of `local` and `target` (descriptors of the two
/// layouts' extents): the first candidate for the pair's classes that moves block lists
/// ([`Backend::block_lists`]) and accepts it, with its plan (index 0); `None` when no such
/// backend accepts (the caller then expands the list into descriptor pairs).
pub(crate) fn plan_block_list(
    set: &BackendSet,
    op: Op,
    local: &Descriptor,
    target: &Descriptor,
) -> Option<(usize, PlannedPair)> {
    let (lc, tc) = (local.region.kind().class(), target.region.kind().class());
    set.candidates[slot(lc, tc, op)]
        .iter()
        .filter(|&&bi| set.list[bi].block_lists())
        .find_map(|&bi| {
            let b = &set.list[bi];
            match b.plan(op, local, target) {
                Ok(choice) => Some((
                    bi,
                    PlannedPair {
                        index: 0,
                        backend: b.name(),
                        path: choice.path,
                        finding: choice.finding,
                        detail: choice.detail,
                    },
                )),
                Err(r) => {
                    tracing::debug!(backend = b.name(), detail = %r.detail, "block list refused");
                    None
                }
            }
        })
}

/// Plans pair `index`. Returns the chosen backend's position in `set.list` and the plan.
fn plan_pair(
    set: &BackendSet,
    op: Op,
    index: usize,
    local: &Descriptor,
    target: &Descriptor,
    accept: Option<&[DataPath]>,
    notify: bool,
) -> Result<(usize, PlannedPair)> {
    let (lc, tc) = (local.region.kind().class(), target.region.kind().class());
    let candidates = &set.candidates[slot(lc, tc, op)];
    // Only the network backend delivers a request's notification to the peer.
    let remote = lc == MemoryClass::Remote || tc == MemoryClass::Remote;
    if candidates.is_empty() {
        return Err(Error::NoPath {
            index,
            local: local.region.kind().clone(),
            target: target.region.kind().clone(),
        });
    }
    let mut first_refusal: Option<(&'static str, Refusal)> = None;
    // A local backend's refusal of a peer's memory (no CUDA IPC handle or shared memory it
    // can use) only means the network backend moves the pair, as it would without it: it is
    // neither the pair's detail nor the error while the network backend has its own say.
    let mut quiet_refusal: Option<(&'static str, Refusal)> = None;
    let mut not_accepted: Option<DataPath> = None;
    for (pos, &bi) in candidates.iter().enumerate() {
        let b = &set.list[bi];
        let local_for_remote = remote && b.network().is_none();
        if notify && local_for_remote {
            continue;
        }
        match b.plan(op, local, target) {
            Ok(choice) => {
                if let Some(acc) = accept {
                    if !acc.contains(&choice.path) {
                        not_accepted.get_or_insert(choice.path.clone());
                        if first_refusal.is_none() {
                            first_refusal = Some((
                                b.name(),
                                Refusal {
                                    finding: choice.finding.clone(),
                                    detail: format!("{} would use {}", b.name(), choice.path),
                                },
                            ));
                        }
                        continue;
                    }
                }
                if pos > 0 {
                    tracing::debug!(
                        pair = index,
                        backend = b.name(),
                        path = %choice.path,
                        refused = ?first_refusal.as_ref().map(|(n, r)| (n, &r.finding, &r.detail)),
                        "fallback path planned"
                    );
                }
                let (finding, detail) = match (&first_refusal, pos) {
                    (Some((name, r)), p) if p > 0 => (
                        r.finding.clone().or(choice.finding.clone()),
                        Some(format!("{name} refused: {}", r.detail)),
                    ),
                    _ => (choice.finding.clone(), choice.detail.clone()),
                };
                return Ok((
                    bi,
                    PlannedPair {
                        index,
                        backend: b.name(),
                        path: choice.path,
                        finding,
                        detail,
                    },
                ));
            }
            Err(r) if local_for_remote => {
                tracing::debug!(pair = index, backend = b.name(), detail = %r.detail, "a peer's memory left to the network backend");
                if quiet_refusal.is_none() {
                    quiet_refusal = Some((b.name(), r));
                }
            }
            Err(r) => {
                if first_refusal.is_none() {
                    first_refusal = Some((b.name(), r));
                }
            }
        }
    }
    let (finding, detail) = match first_refusal.or(quiet_refusal) {
        Some((name, r)) => (r.finding, format!("{name}: {}", r.detail)),
        None => (None, "no backend accepted the pair".into()),
    };
    match accept {
        Some(acc) => Err(Error::PathNotAccepted {
            index,
            accepted: acc.to_vec(),
            planned: not_accepted,
            finding,
            detail,
        }),
        None => Err(Error::Refused {
            index,
            finding,
            detail,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PlanChoice;
    use crate::transfer::WorkItem;

    #[test]
    fn slots_are_one_to_one() {
        let mut seen = [false; SLOTS];
        for lc in CLASSES {
            for tc in CLASSES {
                for op in OPS {
                    let k = slot(lc, tc, op);
                    assert!(!seen[k], "slot {k} used twice");
                    seen[k] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// A backend that only declares capabilities (the table is built from them alone).
    struct Declares(&'static str, Vec<Capability>, bool);

    impl Backend for Declares {
        fn name(&self) -> &'static str {
            self.0
        }
        fn capabilities(&self) -> Vec<Capability> {
            self.1.clone()
        }
        fn plan(
            &self,
            _: Op,
            _: &Descriptor,
            _: &Descriptor,
        ) -> std::result::Result<PlanChoice, Refusal> {
            Ok(PlanChoice::on(DataPath::HostCopy))
        }
        fn plan_per_region(&self) -> bool {
            self.2
        }
        fn submit(&self, items: Vec<WorkItem>) {
            drop(items);
        }
    }

    #[test]
    fn candidates_are_preferred_first_then_in_order_added() {
        use MemoryClass::{File, Host};
        let cap = |l, t, p| Capability::both(l, t, DataPath::HostCopy, p);
        let mut set = BackendSet::default();
        for (name, caps, per_region) in [
            ("a", vec![cap(Host, Host, Preference::Fallback)], true),
            ("b", vec![cap(Host, Host, Preference::Preferred)], true),
            ("c", vec![cap(Host, File, Preference::Preferred)], false),
            ("d", vec![cap(Host, Host, Preference::Fallback)], true),
        ] {
            let b: Arc<dyn Backend> = Arc::new(Declares(name, caps.clone(), per_region));
            set = set.with(b, caps);
        }
        for op in OPS {
            assert_eq!(set.candidates[slot(Host, Host, op)], vec![1, 0, 3]);
            assert!(set.per_region[slot(Host, Host, op)]);
            assert_eq!(set.candidates[slot(Host, File, op)], vec![2]);
            assert!(!set.per_region[slot(Host, File, op)]);
            assert!(set.candidates[slot(File, Host, op)].is_empty());
        }
    }
}
