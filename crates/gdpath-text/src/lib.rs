//! Text from untrusted input made safe to show: the project's one rule for tensor and file
//! names, snapshot and XML texts, peers' names and anything else read from a file, a log or the
//! network before it reaches a terminal (a table, the doctor's evidence, an error message).
//!
//! A terminal acts on some characters instead of showing them: ESC starts a control sequence
//! (clear the screen, colours, a forged title), CR and LF forge lines, NUL and other C0/C1
//! controls and Unicode format characters (bidi overrides, zero-width ones) hide or reorder
//! text. [`escape`] writes each of them as Rust's `{:?}` does, the escaping the error messages
//! already use for the strings they quote, and without the quotes: `\u{1b}`, `\0`, `\n`, and
//! `\\` for a backslash so that the text reads back unambiguously. JSON output needs none of
//! this: its own escaping already covers it.
//!
//! It is a crate of its own, below every other, so that the wire protocol's peer names, the
//! topology readers' errors, the engine's error messages, the doctor's text and the CLI's tables
//! share it without an upward import (`gdpath_topo::text` re-exports it).
//!
//! [`format_size`] writes a byte count for people (`4 KiB`, `1.50 GiB`) here for the same
//! reason: the engine's messages (`gdpath::units` re-exports it) and the file crate's share it.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::fmt::Write as _;

/// `s` (a `str`, `String`, `Path` or `OsStr`) with every character a terminal would act on
/// escaped (module doc); printable text, non-ASCII included, is kept. Bytes that are not UTF-8
/// (a file name can hold any) are written `\xNN`.
pub fn escape<S: AsRef<OsStr> + ?Sized>(s: &S) -> String {
    let bytes = s.as_ref().as_encoded_bytes();
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        if valid.chars().all(plain) {
            out.push_str(valid);
        } else {
            // `{:?}` escapes `"` too, which needs no escaping outside quotes; a `"` in its
            // output always follows its own escaping backslash, so the replacement is exact.
            let quoted = format!("{valid:?}");
            out.push_str(&quoted[1..quoted.len() - 1].replace("\\\"", "\""));
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// Whether `c` is a character that acts instead of showing: a C0 or C1 control, DEL, or a
/// Unicode format, line/paragraph separator, private-use or unassigned character (bidi
/// overrides and isolates U+202E, U+2066, zero-width U+200B…), the characters [`escape`]
/// writes as `\u{…}` (Rust's `{:?}` rule; a combining mark after a base character is shown).
/// For output that is not a terminal (an HTML page) that must make the same characters visible.
pub fn hidden(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    // `{:?}` escapes a combining mark only at the start of a string, so ask after a letter.
    let mut buf = [b'a'; 5];
    let n = c.encode_utf8(&mut buf[1..]).len();
    std::str::from_utf8(&buf[..1 + n]).map_or(true, |s| s.escape_debug().count() > 2)
}

/// A character [`escape`] keeps without asking `{:?}`: printable ASCII but the backslash.
fn plain(c: char) -> bool {
    matches!(c, ' '..='~') && c != '\\'
}

/// Prints bytes with the largest binary unit that divides them exactly (`4 KiB`, `1 GiB`,
/// `1.50 GiB` otherwise, `511 B`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, m) in UNITS {
        if bytes >= m {
            return if bytes % m == 0 {
                format!("{} {name}", bytes / m)
            } else {
                format!("{:.2} {name}", bytes as f64 / m as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::{escape, hidden};
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn controls_and_format_characters_are_escaped_and_text_is_kept() {
        assert_eq!(escape("model.layers.0.weight"), "model.layers.0.weight");
        assert_eq!(escape("é ≥ → … 中文 ×"), "é ≥ → … 中文 ×");
        assert_eq!(escape("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escape("x\0y\r\nz\t"), "x\\0y\\r\\nz\\t");
        assert_eq!(escape("\u{7f}\u{85}\u{9b}"), "\\u{7f}\\u{85}\\u{9b}");
        // Bidi override, zero-width space, line separator.
        assert_eq!(
            escape("\u{202e}\u{200b}\u{2028}"),
            "\\u{202e}\\u{200b}\\u{2028}"
        );
        // Quotes stay; a backslash is doubled, so that `\n` in a name reads back as two
        // characters.
        assert_eq!(escape("say \"hi\" it's"), "say \"hi\" it's");
        assert_eq!(escape("a\\nb\\\"c"), "a\\\\nb\\\\\"c");
    }

    #[test]
    fn hidden_is_what_escape_escapes() {
        for c in [
            '\u{202e}', '\u{2066}', '\u{200b}', '\u{85}', '\u{1b}', '\u{7f}', '\u{2028}',
        ] {
            assert!(hidden(c), "{c:?}");
            assert_ne!(escape(&c.to_string()), c.to_string(), "{c:?}");
        }
        for c in ['a', ' ', 'é', '→', '中', '\u{301}'] {
            assert!(!hidden(c), "{c:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_hex() {
        let name = OsStr::from_bytes(b"shard-\xff\x1b.safetensors");
        assert_eq!(escape(name), "shard-\\xff\\u{1b}.safetensors");
        assert_eq!(escape(std::path::Path::new("/ck/a\0b")), "/ck/a\\0b");
    }
}
