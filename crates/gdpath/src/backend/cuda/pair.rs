//! The P2P rule: which path a copy between two different GPUs takes. One function, called by the
//! backend's planning and by `gdpath p2p`, so that the matrix a user is shown is the planner's
//! own answer.

use crate::path::DataPath;
use gdpath_topo::facts::DriverFacts;

/// The path of a copy between GPUs a and b (a ≠ b) from the driver's answers, as the backend
/// plans it: `access` is `cuDeviceCanAccessPeer` for a → b and for b → a; `nvlinks` gives the
/// number of NVLinks joining the pair (NVML's facts; 0 when unknown), asked only when access
/// allows P2P.
///
/// P2P needs access both ways (a bidirectional user and the copy engines need both mappings):
/// [`DataPath::P2pNvlink`] when links join the pair, else [`DataPath::P2pPcie`]. Any other pair is
/// [`DataPath::Staged`] through pinned host buffers. `None` when an answer is missing (recorded
/// facts without CUDA's). [`crate::GpuConfig::p2p`] `false` stages every pair; the backend
/// applies that on top of this rule.
pub fn gpu_pair_path(access: [Option<bool>; 2], nvlinks: impl FnOnce() -> u32) -> Option<DataPath> {
    match access {
        [Some(true), Some(true)] if nvlinks() > 0 => Some(DataPath::P2pNvlink),
        [Some(true), Some(true)] => Some(DataPath::P2pPcie),
        [None, _] | [_, None] => None,
        _ => Some(DataPath::Staged),
    }
}

/// [`gpu_pair_path`] for GPUs `a` and `b` (CUDA ordinals) from live or recorded driver facts:
/// CUDA's peer access of the pair both ways and NVML's NVLink count.
pub fn gpu_pair_path_from_facts(facts: &DriverFacts, a: u32, b: u32) -> Option<DataPath> {
    let access = |x, y| {
        facts
            .pair(x, y)
            .and_then(|p| p.cuda)
            .map(|c| c.access_supported)
    };
    gpu_pair_path([access(a, b), access(b, a)], || facts.nvlink_count(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2p_needs_access_both_ways_and_links_choose_nvlink() {
        let t = Some(true);
        let f = Some(false);
        assert_eq!(gpu_pair_path([t, t], || 18), Some(DataPath::P2pNvlink));
        assert_eq!(gpu_pair_path([t, t], || 0), Some(DataPath::P2pPcie));
        for access in [[t, f], [f, t], [f, f]] {
            let asked = std::cell::Cell::new(false);
            let path = gpu_pair_path(access, || {
                asked.set(true);
                4
            });
            assert_eq!(path, Some(DataPath::Staged), "{access:?}");
            assert!(!asked.get(), "NVLinks asked for a pair without P2P");
        }
        assert_eq!(gpu_pair_path([None, t], || 1), None);
        assert_eq!(gpu_pair_path([f, None], || 1), None);
    }
}
