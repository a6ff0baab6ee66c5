//! Subjects in few words: the devices and pairs a finding is about, compressed for people
//! ("all 28 pairs of GPU0–GPU7", "GPU0–GPU3 ↔ GPU4–GPU7", "GPU0, GPU1 ↔ NIC0").
//!
//! Subjects are the doctor's own strings: `system`, a device id (`GPU0`, `NIC1 (mlx5_1)`), a
//! pair (`GPU0-GPU1`, `GPU0-NIC0 (mlx5_0)`; `GPU1-GPU0` for an ordered pair of `--measure`), a
//! directory (`/data`) or a directory and a pair (`/data: GPU0-NVME0`). Device ids are a
//! prefix and a number; the text in parentheses after an id is left out of a compressed list
//! (`--verbose` and `--json` keep every subject as it is). Anything else is kept as written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// At most this many characters for a compressed list; longer ones end in "… (N pairs in all)".
const MAX_CHARS: usize = 100;

/// A device id: `GPU3` is ("GPU", 3). Ordered by prefix, then number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Dev {
    prefix: String,
    n: u32,
}

impl Dev {
    /// `GPU3`, `NIC0 (mlx5_0)` (the parenthesis is dropped); `None` for anything else.
    fn parse(s: &str) -> Option<Dev> {
        let id = match s.split_once(" (") {
            Some((id, rest)) if rest.ends_with(')') => id,
            Some(_) => return None,
            None => s,
        };
        let digits = id.find(|c: char| c.is_ascii_digit())?;
        let (prefix, num) = id.split_at(digits);
        if prefix.is_empty()
            || !prefix.chars().all(|c| c.is_ascii_uppercase())
            || !num.chars().all(|c| c.is_ascii_digit())
            || (num.len() > 1 && num.starts_with('0'))
        {
            return None;
        }
        Some(Dev {
            prefix: prefix.to_owned(),
            n: num.parse().ok()?,
        })
    }
}

/// `GPU0-GPU1`, `GPU0-NIC0 (mlx5_0)`: a pair of device ids, in the order written.
fn parse_pair(s: &str) -> Option<(Dev, Dev)> {
    let (a, b) = s.split_once('-')?;
    Some((Dev::parse(a)?, Dev::parse(b)?))
}

/// Device ids as ranges: `GPU0–GPU3, GPU5` (two or more in a row make a range).
fn ranges(devs: &BTreeSet<Dev>) -> String {
    let mut by_prefix: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for d in devs {
        by_prefix.entry(&d.prefix).or_default().push(d.n);
    }
    let mut parts = Vec::new();
    for (p, nums) in by_prefix {
        let mut i = 0;
        while i < nums.len() {
            let mut j = i;
            while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
                j += 1;
            }
            if j > i {
                parts.push(format!("{p}{}–{p}{}", nums[i], nums[j]));
            } else {
                parts.extend((i..=j).map(|k| format!("{p}{}", nums[k])));
            }
            i = j + 1;
        }
    }
    parts.join(", ")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A set of pairs in few words: all pairs of a set ("all 28 pairs of GPU0–GPU7"), all of a set
/// but a few, or products of two sets ("GPU0–GPU3 ↔ GPU4–GPU7"), whichever is shortest.
fn pairs_text(pairs: &BTreeSet<(Dev, Dev)>) -> String {
    if pairs.len() == 1 {
        let (a, b) = pairs.iter().next().expect("one pair");
        return format!("{}{}-{}{}", a.prefix, a.n, b.prefix, b.n);
    }
    let ordered = pairs.iter().any(|(a, b)| a > b);
    let arrow = if ordered { "→" } else { "↔" };
    let ends: BTreeSet<Dev> = pairs
        .iter()
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    let one_prefix = ends
        .iter()
        .all(|d| d.prefix == ends.first().expect("ends").prefix);
    let mut candidates = Vec::new();
    if one_prefix && !ordered {
        let n = ends.len();
        let all = n * (n - 1) / 2;
        if pairs.len() == all {
            candidates.push(format!(
                "all {} of {}",
                plural(all, "pair", "pairs"),
                ranges(&ends)
            ));
        } else if all - pairs.len() <= 4 {
            let v: Vec<&Dev> = ends.iter().collect();
            let missing: Vec<String> = (0..n)
                .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                .filter(|&(i, j)| !pairs.contains(&(v[i].clone(), v[j].clone())))
                .map(|(i, j)| format!("{}{}-{}{}", v[i].prefix, v[i].n, v[j].prefix, v[j].n))
                .collect();
            candidates.push(format!(
                "{} pairs: all of {} but {}",
                pairs.len(),
                ranges(&ends),
                missing.join(", ")
            ));
        }
    }
    if one_prefix && !ordered {
        // Complete sets apart from each other: "all of GPU0–GPU3; all of GPU4–GPU7".
        let mut comps: Vec<BTreeSet<Dev>> = Vec::new();
        for (a, b) in pairs {
            let hit: Vec<usize> = (0..comps.len())
                .filter(|&i| comps[i].contains(a) || comps[i].contains(b))
                .collect();
            let mut merged = BTreeSet::from([a.clone(), b.clone()]);
            for &i in hit.iter().rev() {
                merged.extend(comps.remove(i));
            }
            comps.push(merged);
        }
        let complete = comps
            .iter()
            .map(|c| c.len() * (c.len() - 1) / 2)
            .sum::<usize>()
            == pairs.len();
        if complete && comps.len() > 1 {
            comps.sort();
            let parts: Vec<String> = comps
                .iter()
                .map(|c| format!("all of {}", ranges(c)))
                .collect();
            candidates.push(capped(pairs.len(), &parts));
        }
    }
    // Products of two sets: group by one side, then merge the groups with the same other side.
    for by_first in [true, false] {
        let mut sides: BTreeMap<&Dev, BTreeSet<Dev>> = BTreeMap::new();
        for (a, b) in pairs {
            let (k, v) = if by_first { (a, b) } else { (b, a) };
            sides.entry(k).or_default().insert(v.clone());
        }
        let mut merged: Vec<(BTreeSet<Dev>, BTreeSet<Dev>)> = Vec::new();
        for (k, v) in sides {
            match merged.iter_mut().find(|(_, other)| *other == v) {
                Some((keys, _)) => {
                    keys.insert(k.clone());
                }
                None => merged.push((BTreeSet::from([k.clone()]), v)),
            }
        }
        let parts: Vec<String> = merged
            .iter()
            .map(|(keys, other)| {
                let (l, r) = if by_first {
                    (keys, other)
                } else {
                    (other, keys)
                };
                format!("{} {arrow} {}", ranges(l), ranges(r))
            })
            .collect();
        candidates.push(capped(pairs.len(), &parts));
    }
    candidates
        .into_iter()
        .min_by_key(|c| c.chars().count())
        .expect("at least one candidate")
}

/// Parts joined by "; " with the pair count, cut at [`MAX_CHARS`].
fn capped(count: usize, parts: &[String]) -> String {
    let mut out = format!("{count} pairs: ");
    for (i, p) in parts.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        if out.chars().count() + sep.len() + p.chars().count() > MAX_CHARS && i > 0 {
            out.push_str("; …");
            return out;
        }
        let _ = write!(out, "{sep}{p}");
    }
    out
}

/// Subjects of one finding id in few words, in the order first written: device ids as ranges,
/// pairs as described at [`pairs_text`], directories and `system` as written. Duplicates count
/// once; a single subject is given as written (`GPU0-NIC0 (mlx5_0)`).
pub fn compress<S: AsRef<str>>(subjects: &[S]) -> String {
    if let Some(first) = subjects.first() {
        if subjects.iter().all(|s| s.as_ref() == first.as_ref()) {
            return first.as_ref().to_owned();
        }
    }
    // Per context (`/data` of `/data: GPU0-NVME0`, or none): devices, pairs, other text.
    #[derive(Default)]
    struct Ctx {
        devs: BTreeSet<Dev>,
        pairs: BTreeSet<(Dev, Dev)>,
        other: Vec<String>,
    }
    let mut order: Vec<Option<String>> = Vec::new();
    let mut ctxs: BTreeMap<Option<String>, Ctx> = BTreeMap::new();
    for s in subjects {
        let s = s.as_ref();
        let (ctx, body) = match s.split_once(": ") {
            Some((c, b)) if Dev::parse(b).is_some() || parse_pair(b).is_some() => {
                (Some(c.to_owned()), b)
            }
            _ => (None, s),
        };
        if !order.contains(&ctx) {
            order.push(ctx.clone());
        }
        let c = ctxs.entry(ctx).or_default();
        if let Some(d) = Dev::parse(body) {
            c.devs.insert(d);
        } else if let Some(p) = parse_pair(body) {
            c.pairs.insert(p);
        } else if !c.other.iter().any(|o| o == body) {
            c.other.push(body.to_owned());
        }
    }
    let mut out = Vec::new();
    for key in order {
        let c = &ctxs[&key];
        let mut pieces = c.other.clone();
        if !c.devs.is_empty() {
            pieces.push(ranges(&c.devs));
        }
        if !c.pairs.is_empty() {
            pieces.push(pairs_text(&c.pairs));
        }
        let text = pieces.join(", ");
        out.push(match key {
            Some(k) => format!("{k}: {text}"),
            None => text,
        });
    }
    out.join("; ")
}

/// A set of GPU pairs described by its structure, for machines too large to list each pair:
/// groups of GPUs are given as indices into a list of groups (each a list of GPU indices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PairBlock {
    /// Every pair of the GPUs of one group.
    Within(usize),
    /// Every pair of a GPU of the first group and one of the second.
    Between(usize, usize),
    /// One pair of GPUs.
    Pair(usize, usize),
}

impl PairBlock {
    /// How many pairs the block holds, with `groups` the GPUs of each group.
    pub(crate) fn len(&self, groups: &[Vec<usize>]) -> usize {
        match *self {
            PairBlock::Within(g) => groups[g].len() * groups[g].len().saturating_sub(1) / 2,
            PairBlock::Between(a, b) => groups[a].len() * groups[b].len(),
            PairBlock::Pair(..) => 1,
        }
    }
}

/// Blocks of GPU pairs in few words (`ids` are the machine's GPU ids by index, `groups` the
/// GPUs of each group), without listing their pairs one by one: `all 3727815 pairs of
/// GPU0–GPU2729`, `GPU0–GPU1 ↔ GPU2–GPU3; …`; `apart` pairs of these blocks that have findings of
/// their own are said as a count. Only the blocks shown are formatted.
pub(crate) fn blocks_text(
    ids: &[&str],
    groups: &[Vec<usize>],
    blocks: &[PairBlock],
    apart: usize,
) -> String {
    let set = |v: &[usize]| -> String {
        let devs: Option<BTreeSet<Dev>> = v.iter().map(|&i| Dev::parse(ids[i])).collect();
        match devs {
            Some(d) => ranges(&d),
            None => v.iter().map(|&i| ids[i]).collect::<Vec<_>>().join(", "),
        }
    };
    let count: usize = blocks.iter().map(|b| b.len(groups)).sum::<usize>() - apart;
    let part = |b: &PairBlock| match *b {
        PairBlock::Within(g) => format!("all of {}", set(&groups[g])),
        PairBlock::Between(a, b) => format!("{} ↔ {}", set(&groups[a]), set(&groups[b])),
        PairBlock::Pair(a, b) => format!("{}-{}", ids[a], ids[b]),
    };
    let mut text = match blocks {
        [PairBlock::Within(g)] if apart == 0 => {
            format!(
                "all {} of {}",
                plural(count, "pair", "pairs"),
                set(&groups[*g])
            )
        }
        [b] if count == 1 => part(b),
        _ => {
            // Format only as many blocks as fit.
            let mut parts = Vec::new();
            let mut len = 0;
            for b in blocks {
                let p = part(b);
                len += p.chars().count() + 2;
                parts.push(p);
                if len > MAX_CHARS {
                    break;
                }
            }
            capped(count, &parts)
        }
    };
    if apart > 0 {
        let _ = write!(
            text,
            " ({} with findings of their own left out)",
            plural(apart, "pair", "pairs")
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_pairs(n: u32) -> Vec<String> {
        (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| format!("GPU{i}-GPU{j}")))
            .collect()
    }

    #[test]
    fn devices_become_ranges() {
        assert_eq!(
            compress(&["GPU0", "GPU1", "GPU2", "GPU3", "GPU5"]),
            "GPU0–GPU3, GPU5"
        );
        assert_eq!(compress(&["GPU0", "GPU1"]), "GPU0–GPU1");
        assert_eq!(compress(&["GPU0", "GPU2"]), "GPU0, GPU2");
        assert_eq!(
            compress(&["GPU1", "NIC0 (0000:10:1b.0)", "GPU0", "NIC1 (mlx5_1)"]),
            "GPU0–GPU1, NIC0–NIC1"
        );
        assert_eq!(compress(&["system", "system"]), "system");
        assert_eq!(compress(&["/data", "/tmp"]), "/data, /tmp");
    }

    #[test]
    fn pairs_become_sets() {
        assert_eq!(compress(&all_pairs(8)), "all 28 pairs of GPU0–GPU7");
        assert_eq!(compress(&["GPU0-GPU1"]), "GPU0-GPU1");
        let cross: Vec<String> = (0..4)
            .flat_map(|i| (4..8).map(move |j| format!("GPU{i}-GPU{j}")))
            .collect();
        assert_eq!(compress(&cross), "16 pairs: GPU0–GPU3 ↔ GPU4–GPU7");
        let apart: Vec<String> = all_pairs(8)
            .into_iter()
            .filter(|p| !["GPU0-GPU1", "GPU2-GPU3", "GPU4-GPU5", "GPU6-GPU7"].contains(&p.as_str()))
            .collect();
        let two: Vec<String> = all_pairs(8)
            .into_iter()
            .filter(|p| {
                let n = |s: &str| s.trim_start_matches("GPU").parse::<u32>().unwrap() < 4;
                let (a, b) = p.split_once('-').unwrap();
                n(a) == n(b)
            })
            .collect();
        assert_eq!(
            compress(&two),
            "12 pairs: all of GPU0–GPU3; all of GPU4–GPU7"
        );
        assert_eq!(
            compress(&apart),
            "24 pairs: all of GPU0–GPU7 but GPU0-GPU1, GPU2-GPU3, GPU4-GPU5, GPU6-GPU7"
        );
        let nics = [
            "GPU0-NIC0 (0000:10:1b.0)",
            "GPU1-NIC0 (0000:10:1b.0)",
            "GPU2-NIC1 (0000:20:1b.0)",
            "GPU3-NIC1 (0000:20:1b.0)",
        ];
        assert_eq!(
            compress(&nics),
            "4 pairs: GPU0–GPU1 ↔ NIC0; GPU2–GPU3 ↔ NIC1"
        );
        // Ordered pairs of --measure keep their direction.
        assert_eq!(
            compress(&["GPU0-GPU1", "GPU1-GPU0"]),
            "2 pairs: GPU0 → GPU1; GPU1 → GPU0"
        );
        assert_eq!(
            compress(&["/data: GPU0-NVME0", "/data: GPU1-NVME0", "/tmp"]),
            "/data: 2 pairs: GPU0–GPU1 ↔ NVME0; /tmp"
        );
    }

    #[test]
    fn long_lists_are_cut() {
        // Every other pair of 64 GPUs: no short form, so the list is cut with the count.
        let some: Vec<String> = all_pairs(64).into_iter().step_by(2).collect();
        let text = compress(&some);
        assert!(text.chars().count() <= MAX_CHARS + 4, "{text}");
        assert!(
            text.starts_with("1008 pairs: ") && text.ends_with('…'),
            "{text}"
        );
    }

    #[test]
    fn blocks() {
        let ids: Vec<String> = (0..6).map(|i| format!("GPU{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let groups = vec![vec![0, 1], vec![2, 3], vec![4, 5]];
        let all = vec![vec![0, 1, 2, 3, 4, 5]];
        assert_eq!(
            blocks_text(&ids, &all, &[PairBlock::Within(0)], 0),
            "all 15 pairs of GPU0–GPU5"
        );
        assert_eq!(
            blocks_text(
                &ids,
                &groups,
                &[PairBlock::Between(0, 1), PairBlock::Between(0, 2)],
                1
            ),
            "7 pairs: GPU0–GPU1 ↔ GPU2–GPU3; GPU0–GPU1 ↔ GPU4–GPU5 (1 pair with findings of \
             their own left out)"
        );
        assert_eq!(
            blocks_text(&ids, &groups, &[PairBlock::Pair(0, 5)], 0),
            "GPU0-GPU5"
        );
    }
}
