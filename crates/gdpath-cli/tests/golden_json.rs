//! The JSON documents of `topo`, `doctor` and `p2p` on every vendored fixture, compared byte for
//! byte with the documents recorded in `tests/golden/`: a refactoring that changes what a
//! command reports fails here. A change of output that is meant (a new field, a better verdict)
//! re-records them: `GDPATH_BLESS=1 cargo test -p gdpath-cli --test golden_json`, and the diff
//! of `tests/golden/` is then part of the commit, for review.
//!
//! Paths that depend on where the test runs are replaced before comparing: the fixture folder
//! by `$FIXTURES`, the unpacked sysfs dump by `$SYSFS`, the doctor's working directory (its
//! default GDS `--path`) by `$CWD`. The environment variables the doctor reads are cleared.

use gdpath_testkit::{fixtures, unpack_sysfs};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

/// Variables the doctor's P2P and GDR checks read from the environment.
const CLEARED_ENV: &[&str] = &[
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_DISABLE",
    "CUDA_VISIBLE_DEVICES",
    "CUFILE_ENV_PATH_JSON",
    "UCX_TLS",
    "UCX_NET_DEVICES",
];

fn golden_dir() -> PathBuf {
    gdpath_testkit::repo_root().join("crates/gdpath-cli/tests/golden")
}

/// Runs `gdpath ARGS` in `cwd` with the cleared environment and returns stdout with the
/// replacements applied (longest path first, so that a fixture under the working directory
/// keeps its own name).
fn run(cwd: &Path, args: &[&str], replace: &[(&Path, &str)]) -> String {
    let mut cmd = Command::new(common::bin());
    cmd.args(args).current_dir(cwd);
    for v in CLEARED_ENV {
        cmd.env_remove(v);
    }
    let out = cmd.output().expect("run gdpath");
    // The doctor's exit status is its verdict (0-2, or 4: nothing decided); 3 is a failure.
    let code = out.status.code().unwrap_or(-1);
    assert!(
        matches!(code, 0..=2 | 4),
        "gdpath {args:?} exited {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    let mut pairs: Vec<(String, &str)> = replace
        .iter()
        .map(|(p, name)| (p.to_str().expect("UTF-8 path").to_owned(), *name))
        .collect();
    pairs.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    for (p, name) in pairs {
        text = text.replace(&p, name);
    }
    text
}

/// A document's name and the arguments that print it.
type Case = (String, Vec<String>);
/// An unpacked sysfs dump: its guard (must outlive the runs) and its root.
type Dump = (tempfile::TempDir, PathBuf);

/// Every document to record, with the sysfs dumps unpacked.
fn cases(fx: &Path) -> (Vec<Case>, Vec<Dump>) {
    let mut cases = Vec::new();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let files = |dir: &str, ext: &str| -> Vec<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(fx.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_str().unwrap().ends_with(ext))
            .map(|p| {
                let name = p.file_name().unwrap().to_str().unwrap();
                (name.trim_end_matches(ext).to_owned(), p)
            })
            .collect();
        v.sort();
        v
    };
    for (name, p) in files("nccl-xml", ".xml") {
        cases.push((
            format!("topo-{name}"),
            vec!["topo".into(), "--nccl-xml".into(), s(&p)],
        ));
        cases.push((
            format!("topo-all-{name}"),
            vec!["topo".into(), "--nccl-xml".into(), s(&p), "--all".into()],
        ));
        cases.push((
            format!("doctor-{name}"),
            vec!["doctor".into(), "--nccl-xml".into(), s(&p), "--all".into()],
        ));
    }
    for (name, p) in files("hwloc-xml", ".xml") {
        cases.push((
            format!("topo-{name}"),
            vec!["topo".into(), "--hwloc-xml".into(), s(&p)],
        ));
        cases.push((
            format!("doctor-{name}"),
            vec!["doctor".into(), "--hwloc-xml".into(), s(&p), "--all".into()],
        ));
    }
    let mut snaps = files("device", ".tar.gz");
    // Canonical, so that `$ASSETS` replaces it wherever the checkout is.
    snaps.push((
        "h200x2".into(),
        PathBuf::from(gdpath_testkit::h200x2_snapshot())
            .canonicalize()
            .unwrap(),
    ));
    for (name, p) in snaps {
        for cmd in ["topo", "doctor", "p2p"] {
            let mut args = vec![cmd.into(), "--snapshot".into(), s(&p)];
            if cmd == "doctor" {
                args.push("--all".into());
            }
            cases.push((format!("{cmd}-{name}"), args));
        }
    }
    let mut dumps = Vec::new();
    for (name, _) in files("hwloc-sysfs", ".tar.bz2") {
        let (guard, root) = unpack_sysfs(&format!("{name}.tar.bz2"));
        for cmd in ["topo", "doctor"] {
            let mut args = vec![cmd.into(), "--sysfs-root".into(), s(&root)];
            if cmd == "doctor" {
                args.push("--all".into());
            }
            cases.push((format!("{cmd}-{name}"), args));
        }
        dumps.push((guard, root));
    }
    (cases, dumps)
}

#[test]
fn json_documents_match_the_recorded_ones() {
    let fx = fixtures().canonicalize().unwrap();
    let assets = gdpath_testkit::repo_root()
        .join("assets")
        .canonicalize()
        .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let (cases, dumps) = cases(&fx);
    let bless = std::env::var_os("GDPATH_BLESS").is_some();
    let dir = golden_dir();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut differ = Vec::new();
    for (name, mut args) in cases {
        args.push("--json".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut replace: Vec<(&Path, &str)> = vec![
            (&fx, "$FIXTURES"),
            (&assets, "$ASSETS"),
            (cwd.path(), "$CWD"),
        ];
        for (_, root) in &dumps {
            replace.push((root, "$SYSFS"));
        }
        let got = run(cwd.path(), &argv, &replace);
        assert!(
            serde_json::from_str::<serde_json::Value>(&got).is_ok(),
            "{name}: not JSON: {got}"
        );
        let file = dir.join(format!("{name}.json"));
        if bless {
            std::fs::write(&file, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (record with GDPATH_BLESS=1)", file.display()));
        if got != want {
            differ.push(name);
        }
    }
    assert!(
        differ.is_empty(),
        "documents differ from tests/golden/ (GDPATH_BLESS=1 re-records them; review the diff): \
         {differ:?}"
    );
}
