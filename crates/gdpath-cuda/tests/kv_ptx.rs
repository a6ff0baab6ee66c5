//! The committed block-copy PTX (`src/ptx/copy_blocks.ptx`) is what `scripts/gen-kv-ptx.sh`
//! makes of `src/ptx/copy_blocks.cu`. Runs the script when clang is installed and is the
//! version the committed file names (its first line); otherwise it says why it skipped.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    gdpath_testkit::repo_root()
}

#[test]
fn committed_ptx_matches_the_generator() {
    let committed_path = repo().join("crates/gdpath-cuda/src/ptx/copy_blocks.ptx");
    let committed = std::fs::read_to_string(&committed_path).unwrap();
    let named = committed
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// clang: "))
        .expect("the committed PTX names the clang that made it on its first line")
        .to_string();
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let version = match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        _ => {
            eprintln!("SKIPPED: {clang} is not installed; the committed PTX was made by {named}");
            return;
        }
    };
    if version != named {
        eprintln!(
            "SKIPPED: {clang} is `{version}`, the committed PTX was made by `{named}`: \
             other clang versions emit other (equally valid) PTX"
        );
        return;
    }
    let out = tempfile::NamedTempFile::new().unwrap();
    let st = Command::new("bash")
        .arg(repo().join("scripts/gen-kv-ptx.sh"))
        .arg(out.path())
        .env("CLANG", &clang)
        .status()
        .unwrap();
    assert!(st.success(), "gen-kv-ptx.sh failed: {st}");
    let fresh = std::fs::read_to_string(out.path()).unwrap();
    assert!(
        fresh == committed,
        "src/ptx/copy_blocks.ptx is stale: run scripts/gen-kv-ptx.sh and commit the result"
    );
}
