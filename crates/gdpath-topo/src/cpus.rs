//! CPU sets in the three spellings the sources use: Linux cpulists (`0-7,16-23`), Linux
//! cpumasks (`0000ffff,00ff00ff`, 32-bit hex words, most significant first) and hwloc bitmaps
//! (`0x00000303,0x03030000,,0x0`, the same with `0x` prefixes and empty words for zero).

use std::collections::BTreeSet;

/// The largest CPU number accepted (inputs are untrusted: a cpulist `0-4294967295` must not
/// allocate gigabytes).
pub const MAX_CPU: u32 = 1 << 16;

/// A set of logical CPU numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuSet(pub BTreeSet<u32>);

impl CpuSet {
    /// Parses a Linux cpulist (`local_cpulist`, `node*/cpulist`): `0-3,8,10-11`. Empty text is
    /// the empty set. `None` on malformed text or CPUs above [`MAX_CPU`].
    pub fn parse_list(text: &str) -> Option<CpuSet> {
        let mut set = BTreeSet::new();
        for part in text.trim().split(',').filter(|p| !p.trim().is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
                None => {
                    let v = part.trim().parse::<u32>().ok()?;
                    (v, v)
                }
            };
            if a > b || b > MAX_CPU {
                return None;
            }
            set.extend(a..=b);
        }
        Some(CpuSet(set))
    }

    /// Parses a Linux cpumask (`local_cpus`, NCCL's `affinity`) or an hwloc bitmap. Words are
    /// comma-separated 32-bit hex numbers, most significant first; an empty word is zero; each
    /// may carry a `0x` prefix. `None` on malformed text, on hwloc's infinite sets (`0xf...f`)
    /// and on masks longer than [`MAX_CPU`] bits.
    pub fn parse_mask(text: &str) -> Option<CpuSet> {
        let t = text.trim();
        if t.is_empty() || t.contains("...") {
            return None;
        }
        let words: Vec<&str> = t.split(',').collect();
        if words.len() as u64 * 32 > u64::from(MAX_CPU) {
            return None;
        }
        let mut set = BTreeSet::new();
        for (i, w) in words.iter().rev().enumerate() {
            let w = w.trim();
            let w = w
                .strip_prefix("0x")
                .or_else(|| w.strip_prefix("0X"))
                .unwrap_or(w);
            if w.is_empty() {
                continue;
            }
            if w.len() > 8 {
                return None;
            }
            let v = u32::from_str_radix(w, 16).ok()?;
            for bit in 0..32 {
                if v & (1 << bit) != 0 {
                    set.insert(i as u32 * 32 + bit);
                }
            }
        }
        Some(CpuSet(set))
    }

    /// True when there is no CPU in the set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The set as a Linux cpulist, ranges collapsed: `0-7,16-23`. Empty set → empty text.
    pub fn to_list(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            out.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
        }
        out.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        let s = CpuSet::parse_list("0-3,8,10-11\n").unwrap();
        assert_eq!(s.to_list(), "0-3,8,10-11");
        assert_eq!(CpuSet::parse_list("").unwrap(), CpuSet::default());
        assert!(CpuSet::parse_list("3-1").is_none());
        assert!(CpuSet::parse_list("0-4294967295").is_none());
        assert!(CpuSet::parse_list("a-b").is_none());
    }

    #[test]
    fn masks() {
        let m = CpuSet::parse_mask("0000,00000000,00000000,00000000,00000000,0000ffff").unwrap();
        assert_eq!(m.to_list(), "0-15");
        let h = CpuSet::parse_mask("0x00000303,0x03030000,,0x03030303").unwrap();
        assert_eq!(h.to_list(), "0-1,8-9,16-17,24-25,80-81,88-89,96-97,104-105");
        let n = CpuSet::parse_mask("000000ff,ffff0000,00ffffff").unwrap();
        assert_eq!(n.to_list(), "0-23,48-71");
        assert!(CpuSet::parse_mask("0xf...f").is_none());
        assert!(CpuSet::parse_mask("xyz").is_none());
    }
}
