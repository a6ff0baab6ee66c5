//! Units of the engine's figures: bandwidth in GB/s (1e9 B/s) of bytes moved in a duration, and
//! sizes in bytes written with binary (KiB, MiB, ...) or decimal (kB, MB, ...) units, parsed from
//! and printed for people (configuration values, command lines, reports).

use std::time::Duration;

/// GB/s (1e9 bytes per second) for `bytes` in `elapsed`; 0 for a zero duration.
pub fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s / 1e9
    } else {
        0.0
    }
}

/// Errors of [`parse_size`] and [`parse_size_range`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The text is empty (or only whitespace).
    #[error("empty size")]
    Empty,
    /// Not a number with an optional unit.
    #[error("bad size {0:?}: expected a number with an optional unit B, KiB, MiB, GiB, TiB (binary), kB, MB, GB, TB (decimal), or K/M/G/T (binary)")]
    Bad(String),
    /// The size is more than `u64::MAX` bytes.
    #[error("size {0:?} does not fit in 64 bits")]
    Overflow(String),
    /// A range is not `MIN..MAX` with `0 < MIN <= MAX`.
    #[error("bad range {0:?}: expected MIN..MAX with 0 < MIN <= MAX, e.g. 1MiB..64MiB")]
    Range(String),
    /// A size of 0 in a list ([`parse_size_range`]): nothing would move, and a rate of it would
    /// read as measured.
    #[error("size {0:?} is 0: must be at least 1 byte")]
    Zero(String),
}

/// Parses `4096`, `4KiB`, `1.5GiB`, `64M`, `1GB` (= 1e9). Binary units (KiB, K, ...) are powers
/// of 1024, decimal ones (kB, MB, GB, TB) powers of 1000; case-insensitive except that `b`
/// alone means bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(SizeError::Bad(s.to_owned())),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(SizeError::Bad(s.to_owned()));
    }
    if !num.contains('.') {
        let n: u64 = num.parse().map_err(|_| SizeError::Overflow(s.to_owned()))?;
        return n
            .checked_mul(mult)
            .ok_or_else(|| SizeError::Overflow(s.to_owned()));
    }
    let f: f64 = num.parse().map_err(|_| SizeError::Bad(s.to_owned()))?;
    let v = f * mult as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(SizeError::Overflow(s.to_owned()));
    }
    Ok(v.round() as u64)
}

/// Parses a comma-separated list whose items are sizes or `MIN..MAX` sweeps (powers of two from
/// MIN up to MAX, MAX included even when not on the sequence): `1MiB..8MiB` → 1, 2, 4, 8 MiB;
/// `4KiB,1MiB..4MiB` → 4 KiB, 1, 2, 4 MiB. Sizes come in the order written; a size named twice
/// is kept once, where it first appears. Errors: the first item that is not a size or a sweep
/// with 0 < MIN <= MAX ([`SizeError::Range`]), or is a size of 0 ([`SizeError::Zero`]).
pub fn parse_size_range(s: &str) -> Result<Vec<u64>, SizeError> {
    let mut out: Vec<u64> = Vec::new();
    for item in s.split(',') {
        for size in parse_size_item(item)? {
            if !out.contains(&size) {
                out.push(size);
            }
        }
    }
    Ok(out)
}

/// One item of [`parse_size_range`]: a size, or a sweep.
fn parse_size_item(item: &str) -> Result<Vec<u64>, SizeError> {
    let Some((a, b)) = item.split_once("..") else {
        return match parse_size(item)? {
            0 => Err(SizeError::Zero(item.trim().to_owned())),
            n => Ok(vec![n]),
        };
    };
    let (lo, hi) = (parse_size(a)?, parse_size(b)?);
    if lo == 0 || lo > hi {
        return Err(SizeError::Range(item.trim().to_owned()));
    }
    let mut out = Vec::new();
    let mut x = lo;
    while x < hi {
        out.push(x);
        x = match x.checked_mul(2) {
            Some(y) => y,
            None => break,
        };
    }
    out.push(hi);
    Ok(out)
}

/// Prints bytes with the largest binary unit that divides them exactly; gdpath-text's, which
/// the file crate's messages share.
pub use gdpath_topo::text::format_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("64 MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gb").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert!(matches!(parse_size("12 parsecs"), Err(SizeError::Bad(_))));
        assert!(matches!(parse_size(""), Err(SizeError::Empty)));
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(parse_size("1.2.3M"), Err(SizeError::Bad(_))));
        assert_eq!(
            parse_size_range("1MiB..8MiB").unwrap(),
            vec![1 << 20, 2 << 20, 4 << 20, 8 << 20]
        );
        assert_eq!(
            parse_size_range("1MiB..3MiB").unwrap(),
            vec![1 << 20, 2 << 20, 3 << 20]
        );
        assert_eq!(parse_size_range("4k,1m").unwrap(), vec![4096, 1 << 20]);
        assert!(parse_size_range("8MiB..1MiB").is_err());
        // Lists mix sizes and sweeps, in the order written, each size once.
        assert_eq!(
            parse_size_range("4KiB, 8B..64B,16B").unwrap(),
            vec![4096, 8, 16, 32, 64]
        );
        assert!(matches!(
            parse_size_range("4KiB,0..8B"),
            Err(SizeError::Range(r)) if r == "0..8B"
        ));
        assert!(matches!(
            parse_size_range("4KiB,,8B"),
            Err(SizeError::Empty)
        ));
        assert!(matches!(
            parse_size_range("4KiB, 0B"),
            Err(SizeError::Zero(z)) if z == "0B"
        ));
        assert!(matches!(parse_size_range("0"), Err(SizeError::Zero(_))));
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(511), "511 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
    }
}
