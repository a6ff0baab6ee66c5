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
use crate::path::Path;
use crate::region::Descriptor;
use crate::transfer::{Op, PlannedPair};
use std::sync::Arc;

/// An agent's backends in planner order, with the capabilities of each asked once, when it was
/// added (a backend's capabilities do not change; planning reads them for every pair).
#[derive(Default)]
pub(crate) struct BackendSet {
    pub(crate) list: Vec<Arc<dyn Backend>>,
    pub(crate) caps: Vec<Vec<Capability>>,
}

impl BackendSet {
    /// This set with `backend`, whose capabilities are `caps`, added last.
    pub(crate) fn with(&self, backend: Arc<dyn Backend>, caps: Vec<Capability>) -> BackendSet {
        let mut list = self.list.clone();
        let mut all = self.caps.clone();
        all.push(caps);
        list.push(backend);
        BackendSet { list, caps: all }
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

/// Plans pair `index`. Returns the chosen backend's position in `set.list` and the plan.
pub(crate) fn plan_pair(
    set: &BackendSet,
    op: Op,
    index: usize,
    local: &Descriptor,
    target: &Descriptor,
    accept: Option<&[Path]>,
) -> Result<(usize, PlannedPair)> {
    let (lc, tc) = (local.region.kind().class(), target.region.kind().class());
    let mut candidates: Vec<(Preference, usize)> = Vec::new();
    for (bi, bc) in set.caps.iter().enumerate() {
        let best = bc
            .iter()
            .filter(|c| c.local == lc && c.target == tc && c.ops.contains(&op))
            .map(|c| c.preference)
            .min();
        if let Some(p) = best {
            candidates.push((p, bi));
        }
    }
    candidates.sort_by_key(|&(p, bi)| (p, bi));
    if candidates.is_empty() {
        return Err(Error::NoPath {
            index,
            local: local.region.kind().clone(),
            target: target.region.kind().clone(),
        });
    }
    let mut first_refusal: Option<(&'static str, Refusal)> = None;
    let mut not_accepted: Option<Path> = None;
    for (pos, &(_, bi)) in candidates.iter().enumerate() {
        let b = &set.list[bi];
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
            Err(r) => {
                if first_refusal.is_none() {
                    first_refusal = Some((b.name(), r));
                }
            }
        }
    }
    let (finding, detail) = match first_refusal {
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
