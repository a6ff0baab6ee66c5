//! The test pattern that copies are verified with, on the CPU. The PTX kernels in
//! `src/ptx/verify.ptx` compute the same bytes on the GPU.
//!
//! Byte at stream position `p` is byte `p % 8` (little-endian) of `word(seed, p / 8)`, where
//! `word` is one splitmix64 step of `(p / 8) ^ seed`. Positions are absolute, so a range
//! `[off, off + len)` of a stream can be produced or checked on its own: that is what lets
//! tests copy with offsets and still verify every byte.

/// The 64-bit word holding positions `8 * w .. 8 * w + 8` (splitmix64 of `w ^ seed`).
pub fn word(seed: u64, w: u64) -> u64 {
    let mut z = (w ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The byte at stream position `pos`.
pub fn byte(seed: u64, pos: u64) -> u8 {
    (word(seed, pos >> 3) >> ((pos & 7) * 8)) as u8
}

/// Fill `buf` with the pattern for positions `base .. base + buf.len()`.
pub fn fill(buf: &mut [u8], seed: u64, base: u64) {
    let mut i = 0usize;
    // Head up to a word boundary of the stream, then whole words, then the tail.
    while i < buf.len() && (base + i as u64) % 8 != 0 {
        buf[i] = byte(seed, base + i as u64);
        i += 1;
    }
    let mut chunks = buf[i..].chunks_exact_mut(8);
    let mut w = (base + i as u64) >> 3;
    for c in &mut chunks {
        c.copy_from_slice(&word(seed, w).to_le_bytes());
        w += 1;
    }
    let tail = chunks.into_remainder();
    let tail_base = w << 3;
    for (k, b) in tail.iter_mut().enumerate() {
        *b = byte(seed, tail_base + k as u64);
    }
}

/// Result of comparing memory with the pattern or with other memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Number of bytes that differ.
    pub mismatches: u64,
    /// Index (relative to the start of the checked range) of the first differing byte.
    pub first_mismatch: Option<u64>,
}

impl Verdict {
    /// Whether every byte matched.
    pub fn is_ok(&self) -> bool {
        self.mismatches == 0
    }

    /// Combine the verdict of a later chunk starting `offset` bytes into the range.
    pub fn merge(&mut self, later: Verdict, offset: u64) {
        self.mismatches += later.mismatches;
        if self.first_mismatch.is_none() {
            self.first_mismatch = later.first_mismatch.map(|i| i + offset);
        }
    }
}

/// Check `buf` against the pattern for positions `base .. base + buf.len()`.
pub fn check(buf: &[u8], seed: u64, base: u64) -> Verdict {
    let mut expect = vec![0u8; buf.len().min(1 << 20)];
    let mut v = Verdict::default();
    let mut done = 0usize;
    for chunk in buf.chunks(expect.len().max(1)) {
        let e = &mut expect[..chunk.len()];
        fill(e, seed, base + done as u64);
        if chunk != e {
            let local = Verdict {
                mismatches: chunk.iter().zip(e.iter()).filter(|(a, b)| a != b).count() as u64,
                first_mismatch: chunk
                    .iter()
                    .zip(e.iter())
                    .position(|(a, b)| a != b)
                    .map(|i| i as u64),
            };
            v.merge(local, done as u64);
        }
        done += chunk.len();
    }
    v
}

/// Check that `buf` (whose byte 0 is address `buf_base`) holds, for every copy, the pattern of
/// the copy's source: the bytes at `[c.dst, c.dst + c.len)` must be the pattern of positions
/// `c.src - src_base ..` (a source region filled with the pattern from position 0 at address
/// `src_base`). Runs on every core. Returns (copies that differ, index of the first one); a
/// copy whose destination is not inside `buf`, or whose source is below `src_base`, differs.
pub fn check_copies(
    buf: &[u8],
    buf_base: u64,
    copies: &[crate::blocks::BlockCopy],
    src_base: u64,
    seed: u64,
) -> (usize, Option<usize>) {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = copies.len().div_ceil(threads).max(1);
    let bad: Vec<(usize, Option<usize>)> = std::thread::scope(|s| {
        let handles: Vec<_> = copies
            .chunks(per)
            .enumerate()
            .map(|(t, chunk)| {
                s.spawn(move || {
                    let mut n = 0;
                    let mut first = None;
                    for (i, c) in chunk.iter().enumerate() {
                        let got = c
                            .dst
                            .checked_sub(buf_base)
                            .and_then(|at| Some((at, at.checked_add(c.len)?)))
                            .and_then(|(at, end)| buf.get(at as usize..end as usize));
                        let ok = match (got, c.src.checked_sub(src_base)) {
                            (Some(got), Some(pos)) => check(got, seed, pos).is_ok(),
                            _ => false,
                        };
                        if !ok {
                            n += 1;
                            first.get_or_insert(t * per + i);
                        }
                    }
                    (n, first)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("checker thread"))
            .collect()
    });
    let count = bad.iter().map(|b| b.0).sum();
    (count, bad.iter().find_map(|b| b.1))
}

/// The numbers `0..n` in an order fixed by `seed` (Fisher–Yates driven by [`word`]): random
/// block layouts for tests and benchmarks that are the same on every run.
pub fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    for i in (1..v.len()).rev() {
        let j = (word(seed, i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_matches_bytewise_definition_at_any_alignment() {
        for base in [0u64, 1, 7, 8, 4093, (1 << 30) + 1] {
            for len in [0usize, 1, 7, 8, 9, 4095, 4097] {
                let mut buf = vec![0u8; len];
                fill(&mut buf, 42, base);
                for (i, b) in buf.iter().enumerate() {
                    assert_eq!(*b, byte(42, base + i as u64), "base {base} i {i}");
                }
            }
        }
    }

    #[test]
    fn a_subrange_is_the_same_as_the_whole() {
        let mut whole = vec![0u8; 10_000];
        fill(&mut whole, 7, 0);
        let mut part = vec![0u8; 3001];
        fill(&mut part, 7, 4097);
        assert_eq!(&whole[4097..7098], &part[..]);
    }

    #[test]
    fn check_counts_and_locates_mismatches() {
        let mut buf = vec![0u8; 3 << 20];
        fill(&mut buf, 1, 5);
        assert!(check(&buf, 1, 5).is_ok());
        buf[(1 << 20) + 3] ^= 0xff;
        buf[(2 << 20) + 9] ^= 0x01;
        let v = check(&buf, 1, 5);
        assert_eq!(v.mismatches, 2);
        assert_eq!(v.first_mismatch, Some((1 << 20) + 3));
        // Another seed gives other bytes (up to chance agreement of ~1/256 per byte).
        assert!(check(&buf, 2, 5).mismatches > buf.len() as u64 / 2);
    }

    #[test]
    fn known_first_words() {
        // splitmix64 with state 0 gives 0xe220a8397b1dcdaf as its first output (the published
        // reference sequence of Vigna's splitmix64.c); word(0, 0) is exactly that step.
        assert_eq!(word(0, 0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn shuffled_is_a_fixed_permutation() {
        let a = shuffled(10_000, 5);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10_000).collect::<Vec<u32>>());
        assert_eq!(a, shuffled(10_000, 5));
        assert_ne!(a, shuffled(10_000, 6));
        assert_ne!(a, sorted, "not the identity");
        assert!(shuffled(0, 1).is_empty());
        assert_eq!(shuffled(1, 1), [0]);
    }

    #[test]
    fn check_copies_finds_the_wrong_block() {
        use crate::blocks::BlockCopy;
        let (base, src_base, block) = (1u64 << 40, 1u64 << 20, 1000u64);
        let order = shuffled(64, 9);
        let copies: Vec<BlockCopy> = order
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                BlockCopy::new(base + i as u64 * block, src_base + s as u64 * block, block)
            })
            .collect();
        let mut buf = vec![0u8; 64 * block as usize];
        for c in &copies {
            let at = (c.dst - base) as usize;
            fill(&mut buf[at..at + block as usize], 3, c.src - src_base);
        }
        assert_eq!(check_copies(&buf, base, &copies, src_base, 3), (0, None));
        buf[17 * block as usize + 999] ^= 1;
        buf[40 * block as usize] ^= 1;
        assert_eq!(
            check_copies(&buf, base, &copies, src_base, 3),
            (2, Some(17))
        );
        // Out of the buffer or below the source base: counted, not a panic.
        let odd = [
            BlockCopy::new(base + 64 * block - 1, src_base, 2),
            BlockCopy::new(base, src_base - 1, 1),
            BlockCopy::new(base - 1, src_base, 1),
        ];
        assert_eq!(check_copies(&buf, base, &odd, src_base, 3), (3, Some(0)));
    }
}
