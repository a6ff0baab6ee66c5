//! The index of a sharded checkpoint, `model.safetensors.index.json` (Hugging Face
//! `transformers`' format): `{"metadata": {...}, "weight_map": {tensor name: shard file}}`, the
//! shards being files beside the index.
//!
//! The index comes from an untrusted file: a shard name must be a relative path inside the
//! index's folder (no `..`, not absolute), and [`super::Checkpoint::open_index`] checks that
//! every shard holds exactly the tensors the map gives it.

use super::CheckpointError;
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// The largest index read (bytes). An index has a line per tensor, so tens of thousands of
/// tensors make a few MiB; a larger file is not an index.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// A parsed index: the shard files in name order, and the map itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Shard files, resolved against the index's folder, in name order.
    pub shards: Vec<PathBuf>,
    /// Tensor name → index into `shards`.
    pub weight_map: BTreeMap<String, usize>,
    /// The index's `metadata` object, kept as JSON (e.g. `{"total_size": 9084112896}`).
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct Raw {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    weight_map: serde_json::Map<String, serde_json::Value>,
}

impl Index {
    /// Reads and checks the index at `path`, through the engine's file opening
    /// ([`gdpath::file::read_bounded`]: a regular file, at most [`MAX_INDEX_BYTES`]). Errors:
    /// [`CheckpointError::Open`] (also for a directory, device or FIFO, or a larger file) /
    /// [`CheckpointError::Io`], and [`CheckpointError::BadIndex`] for malformed JSON, a weight
    /// map that is missing or not a map of strings, or a shard name that leaves the folder.
    pub fn read(path: &Path) -> Result<Index, CheckpointError> {
        let text = gdpath::file::read_bounded(path, MAX_INDEX_BYTES)
            .map_err(|e| super::file_error(path, e))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir)
    }

    /// Checks the index JSON `text` whose shards are in `dir`.
    pub fn parse(text: &[u8], dir: &Path) -> Result<Index, CheckpointError> {
        let bad = |message: String| CheckpointError::BadIndex { message };
        let raw: Raw = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        let mut by_name: BTreeMap<String, String> = BTreeMap::new();
        for (tensor, file) in raw.weight_map {
            let Some(file) = file.as_str() else {
                return Err(bad(format!("weight_map[{tensor:?}] is not a file name")));
            };
            // A NUL can name no file and a control character no file a writer made: refused
            // here, where the message quotes it escaped, rather than at an open that fails.
            if file.chars().any(char::is_control) {
                return Err(bad(format!(
                    "weight_map[{tensor:?}] = {file:?} is not a file name (it holds a control \
                     character)"
                )));
            }
            let inside = !file.is_empty()
                && Path::new(file)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !inside {
                return Err(bad(format!(
                    "weight_map[{tensor:?}] = {file:?} is not a file inside the index's folder"
                )));
            }
            by_name.insert(tensor, file.to_owned());
        }
        // Shards in name order (`model-00001-of-00004.safetensors`, ...): the order the
        // writers number them in.
        let mut files: Vec<&String> = by_name.values().collect();
        files.sort();
        files.dedup();
        if files.is_empty() {
            return Err(bad("the weight_map lists no tensors".into()));
        }
        let weight_map = by_name
            .iter()
            .map(|(t, f)| (t.clone(), files.binary_search(&f).expect("listed")))
            .collect();
        Ok(Index {
            shards: files.iter().map(|f| dir.join(f)).collect(),
            weight_map,
            metadata: raw.metadata.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_in_name_order_resolved_in_the_folder() {
        let text = br#"{"metadata": {"total_size": 12},
            "weight_map": {"b": "m-2.safetensors", "a": "m-1.safetensors", "c": "m-2.safetensors"}}"#;
        let i = Index::parse(text, Path::new("/ck")).unwrap();
        assert_eq!(
            i.shards,
            vec![
                PathBuf::from("/ck/m-1.safetensors"),
                PathBuf::from("/ck/m-2.safetensors")
            ]
        );
        assert_eq!(i.weight_map["b"], 1);
        assert_eq!(i.metadata["total_size"], 12);
    }

    #[test]
    fn a_shard_name_with_a_control_character_is_refused_escaped() {
        let text = "{\"weight_map\": {\"w\\u001b[2J\": \"a\\u0000.safetensors\"}}";
        let e = Index::parse(text.as_bytes(), Path::new("/ck")).unwrap_err();
        let m = e.to_string();
        assert!(m.contains(r#""a\0.safetensors" is not a file name"#), "{m}");
        assert!(m.contains(r#""w\u{1b}[2J""#), "{m}");
        assert!(!m.chars().any(char::is_control), "{m:?}");
    }

    #[test]
    fn an_index_that_is_not_a_regular_file_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let e = Index::read(d.path()).unwrap_err();
        assert!(
            matches!(&e, CheckpointError::Open { .. }) && e.to_string().contains("a directory"),
            "{e}"
        );
        let fifo = d.path().join("model.safetensors.index.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = Index::read(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }

    #[test]
    fn untrusted_indexes_are_refused_with_the_reason() {
        let dir = Path::new("/ck");
        for (text, says) in [
            (
                &br#"{"weight_map": {"a": "../etc/passwd"}}"#[..],
                "inside the index",
            ),
            (
                br#"{"weight_map": {"a": "/etc/passwd"}}"#,
                "inside the index",
            ),
            (br#"{"weight_map": {"a": ""}}"#, "inside the index"),
            (br#"{"weight_map": {"a": 3}}"#, "not a file name"),
            (br#"{"weight_map": {}}"#, "no tensors"),
            (br#"{"metadata": {}}"#, "weight_map"),
            (br#"[1, 2]"#, "invalid type"),
            (b"{", "EOF"),
        ] {
            let e = Index::parse(text, dir).unwrap_err();
            assert!(
                matches!(&e, CheckpointError::BadIndex { message } if message.contains(says)),
                "{}: {e}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
