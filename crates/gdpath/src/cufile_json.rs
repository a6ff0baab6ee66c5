//! `cufile.json`, the cuFile configuration file, as NVIDIA ships it: JSON with `//` and
//! `/* */` comments (and, tolerated here, trailing commas).
//!
//! The file in force is `$CUFILE_ENV_PATH_JSON` when set, else `/etc/cufile.json` (cuFile API
//! reference, "cufile.json"). The settings the doctor reports: `properties.allow_compat_mode`
//! (cuFile falls back to POSIX I/O through its bounce buffers when native GDS is impossible;
//! default true), `properties.max_direct_io_size_kb` (largest I/O cuFile issues at once),
//! `properties.use_pci_p2pdma` (cuFile ≥ 1.13: native I/O through the kernel's PCI P2PDMA
//! instead of nvidia-fs), and `fs.generic.posix_unaligned_writes`.

use serde_json::Value;

/// Why a `cufile.json` text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CufileJsonError {
    /// A `/*` comment without its `*/`.
    #[error("line {line}: comment opened here is never closed")]
    UnclosedComment {
        /// The line the comment opens on (1-based).
        line: usize,
    },
    /// A string without its closing quote.
    #[error("line {line}: string opened here is never closed")]
    UnclosedString {
        /// The line the string opens on (1-based).
        line: usize,
    },
    /// Not JSON once comments are removed.
    #[error("line {line}, column {column}: {message}")]
    Json {
        /// The line of the fault (1-based; 0 when it has none, as for bad UTF-8).
        line: usize,
        /// The column of the fault (1-based; 0 when it has none).
        column: usize,
        /// serde_json's description of the fault.
        message: String,
    },
}

/// The settings of a `cufile.json` that matter to the doctor.
#[derive(Debug, Clone, PartialEq)]
pub struct CufileConfig {
    /// `properties.allow_compat_mode`: cuFile may fall back to POSIX I/O through its bounce
    /// buffers when native GDS is impossible (cuFile's default: true). `None` when absent.
    pub allow_compat_mode: Option<bool>,
    /// `properties.max_direct_io_size_kb`: the largest I/O cuFile issues at once (KiB).
    /// `None` when absent.
    pub max_direct_io_size_kb: Option<u64>,
    /// `properties.use_pci_p2pdma` (cuFile ≥ 1.13): native I/O through the kernel's PCI
    /// P2PDMA instead of nvidia-fs. `None` when absent.
    pub use_pci_p2pdma: Option<bool>,
    /// `fs.generic.posix_unaligned_writes`: true makes cuFile serve unaligned writes with POSIX
    /// writes instead of its GDS path (NVIDIA's shipped `cufile.json`). `None` when absent.
    pub posix_unaligned_writes: Option<bool>,
    /// The whole document.
    pub raw: Value,
}

impl CufileConfig {
    /// Parses the text of a `cufile.json`.
    pub fn parse(text: &str) -> Result<CufileConfig, CufileJsonError> {
        let clean = strip(text)?;
        let raw: Value = serde_json::from_str(&clean).map_err(|e| CufileJsonError::Json {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let get = |path: &[&str]| -> Option<&Value> { path.iter().try_fold(&raw, |v, k| v.get(k)) };
        Ok(CufileConfig {
            allow_compat_mode: get(&["properties", "allow_compat_mode"]).and_then(Value::as_bool),
            max_direct_io_size_kb: get(&["properties", "max_direct_io_size_kb"])
                .and_then(Value::as_u64),
            use_pci_p2pdma: get(&["properties", "use_pci_p2pdma"]).and_then(Value::as_bool),
            posix_unaligned_writes: get(&["fs", "generic", "posix_unaligned_writes"])
                .and_then(Value::as_bool),
            raw,
        })
    }
}

/// Removes comments outside strings and trailing commas before `}` or `]`, keeping every
/// newline so that serde_json's line numbers match the file's.
pub fn strip(text: &str) -> Result<String, CufileJsonError> {
    let b = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut line = 1;
    // Index in `out` of a comma that may turn out to be trailing.
    let mut pending_comma: Option<usize> = None;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' => {
                pending_comma = None;
                let start_line = line;
                out.push(c);
                i += 1;
                loop {
                    let Some(&d) = b.get(i) else {
                        return Err(CufileJsonError::UnclosedString { line: start_line });
                    };
                    out.push(d);
                    i += 1;
                    match d {
                        b'\\' => {
                            if let Some(&e) = b.get(i) {
                                out.push(e);
                                i += 1;
                                if e == b'\n' {
                                    line += 1;
                                }
                            }
                        }
                        b'"' => break,
                        b'\n' => line += 1,
                        _ => {}
                    }
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start_line = line;
                i += 2;
                loop {
                    match b.get(i) {
                        None => return Err(CufileJsonError::UnclosedComment { line: start_line }),
                        Some(b'*') if b.get(i + 1) == Some(&b'/') => {
                            i += 2;
                            break;
                        }
                        Some(b'\n') => {
                            out.push(b'\n');
                            line += 1;
                            i += 1;
                        }
                        Some(_) => i += 1,
                    }
                }
                // A comment separates tokens.
                out.push(b' ');
            }
            b',' => {
                pending_comma = Some(out.len());
                out.push(c);
                i += 1;
            }
            b'}' | b']' => {
                if let Some(p) = pending_comma.take() {
                    out[p] = b' ';
                }
                out.push(c);
                i += 1;
            }
            _ => {
                if c == b'\n' {
                    line += 1;
                }
                if !c.is_ascii_whitespace() {
                    pending_comma = None;
                }
                out.push(c);
                i += 1;
            }
        }
    }
    // Only ASCII bytes were removed or replaced, so the result is still UTF-8.
    String::from_utf8(out).map_err(|e| CufileJsonError::Json {
        line: 0,
        column: 0,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cufile.json in the shape NVIDIA ships (comment header, commented-out keys, URLs with
    /// `//` inside strings), written for this test.
    const SAMPLE: &str = r#"{
    // Applications may point CUFILE_ENV_PATH_JSON at their own copy.
    "logging": {
        "dir": "/var/log/cufile", // where cufile.log goes
        "level": "ERROR"
    },
    /* properties read at cuFileDriverOpen */
    "properties": {
        "max_direct_io_size_kb" : 16384,
        "allow_compat_mode": false,
        //"use_pci_p2pdma": true,
        "rdma_dev_addr_list": [ ],
        "note": "see https://docs.example/cufile /* not a comment */",
        "quote": "a \"quoted // text\"",
    },
    "fs": { "generic": { "posix_unaligned_writes" : false } }
}"#;

    #[test]
    fn parses_commented_json() {
        let c = CufileConfig::parse(SAMPLE).unwrap();
        assert_eq!(c.allow_compat_mode, Some(false));
        assert_eq!(c.max_direct_io_size_kb, Some(16384));
        assert_eq!(c.use_pci_p2pdma, None, "a commented-out key is absent");
        assert_eq!(c.posix_unaligned_writes, Some(false));
        assert_eq!(
            c.raw["properties"]["note"],
            "see https://docs.example/cufile /* not a comment */"
        );
        assert_eq!(c.raw["properties"]["quote"], "a \"quoted // text\"");
        assert_eq!(c.raw["logging"]["dir"], "/var/log/cufile");
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            CufileConfig::parse("{\n /* open\n").unwrap_err(),
            CufileJsonError::UnclosedComment { line: 2 }
        );
        assert_eq!(
            CufileConfig::parse("{\n\n \"a\": \"x\n").unwrap_err(),
            CufileJsonError::UnclosedString { line: 3 }
        );
        match CufileConfig::parse("{\n // c\n \"a\": 1 \"b\": 2\n}").unwrap_err() {
            CufileJsonError::Json { line, .. } => assert_eq!(line, 3),
            e => panic!("{e:?}"),
        }
        // A comma before a comment before the brace is still trailing.
        assert!(CufileConfig::parse("{\"a\": 1, // x\n}").is_ok());
        // Two commas are not one trailing comma.
        assert!(CufileConfig::parse("[1,,]").is_err());
    }
}
