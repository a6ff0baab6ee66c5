//! Argument checks shared by the subcommands: values that parse but mean nothing, and options
//! given for a mode they do not apply to. Each is refused before anything runs, as a usage
//! error (status 2) that says why.

use gdpath::units::parse_size;

/// A size (`parse_size`'s units) of at least one byte: `--size 0` would move nothing and
/// report a rate of 0 GB/s as if measured.
pub fn nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s).map_err(|e| e.to_string())? {
        0 => Err("must be at least 1 byte".into()),
        n => Ok(n),
    }
}

/// A count (runs, threads, repeats) of at least 1: 0 would run nothing and report nothing.
pub fn count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>().map_err(|e| e.to_string())? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// A slab count for `--slabs`: 0 or 2 ..= `gdpath::config::MAX_SLABS` (the engine's rule).
pub fn slabs(s: &str) -> Result<usize, String> {
    let n = s.trim().parse::<usize>().map_err(|e| e.to_string())?;
    if gdpath::config::valid_slabs(n) {
        Ok(n)
    } else {
        Err(format!(
            "must be 0 (a buffer pair per thread) or 2..={}",
            gdpath::config::MAX_SLABS
        ))
    }
}

/// Refuses `option`, given, when it does not apply: `why` says to what it does.
pub fn refuse_if(given: bool, option: &str, why: &str) -> anyhow::Result<()> {
    if given {
        return Err(crate::usage(format!("{option} {why}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_refused_and_sizes_parse() {
        assert!(nonzero_size("0").is_err());
        assert!(nonzero_size("0MiB").is_err());
        assert_eq!(nonzero_size("4KiB"), Ok(4096));
        assert!(nonzero_size("x").is_err());
        assert_eq!(count("3"), Ok(3));
        assert!(count("0").is_err());
        assert!(refuse_if(true, "--window", "applies to file copies").is_err());
        assert!(refuse_if(false, "--window", "applies to file copies").is_ok());
    }
}
