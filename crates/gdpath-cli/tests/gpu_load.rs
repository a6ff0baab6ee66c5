//! GPU suite: `gdpath load` as a user runs it, on a safetensors file written here. Needs an
//! NVIDIA GPU (ignored otherwise; run with `--ignored` through `scripts/gpu-suite.sh`). The
//! library's loader is checked byte for byte by `gdpath`'s `gds_gpu` suite; this one holds the
//! command to what it prints: the one-time setup timed apart from the loads (`start`), every
//! tensor listed where the file has it and placed in one GPU allocation without overlap, and
//! the figures of the last load. The `gdpath` binary is the one cargo built
//! for this test, or `GDPATH_BIN` when the test binary was copied to another machine.

use std::process::Command;

mod common;

#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn load_times_its_setup_apart_and_places_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("model.safetensors");
    let tensors = [
        ("embed.weight", 3 << 20),
        ("head.bias", 1000),
        ("head.weight", 1 << 20),
    ];
    let (bytes, data_start) = common::write_checkpoint(&f, &tensors);
    let file = f.to_str().unwrap();

    let out = Command::new(common::bin())
        .args(["load", file, "--gpu", "0", "--repeat", "2", "--json"])
        .output()
        .unwrap();
    let v = common::json_ok(&out);
    assert_eq!(v["schema"], "gdpath.load/1", "{v}");
    // The start phase ran and succeeded (it is `null` when a step of it failed).
    let start = v["start_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no start_s: {v}"));
    assert!(start > 0.0, "{v}");
    assert_eq!(v["tensor_bytes"].as_u64(), Some(bytes), "{v}");
    let listed = v["tensors"].as_array().unwrap();
    assert_eq!(listed.len(), tensors.len(), "{v}");
    // Each tensor: its file range where it was written, and a device pointer inside one GPU
    // allocation (pointer − offset the same for all), ranges not overlapping, all within the
    // bytes read.
    let read = v["read_bytes"].as_u64().unwrap();
    let (mut base, mut file_off, mut placed) = (None, data_start, Vec::new());
    for (name, n) in tensors {
        let t = listed
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {v}"));
        let len = 4 * n as u64;
        assert_eq!(t["dtype"], "F32", "{t}");
        assert_eq!(t["shape"], serde_json::json!([n]), "{t}");
        assert_eq!(
            t["file_range"],
            serde_json::json!([file_off, file_off + len]),
            "{t}"
        );
        file_off += len;
        let ptr = u64::from_str_radix(
            t["device_ptr"].as_str().unwrap().trim_start_matches("0x"),
            16,
        )
        .unwrap();
        let off = t["offset"].as_u64().unwrap();
        assert!(off + len <= read, "{t}: beyond the {read} bytes read");
        assert_eq!(
            *base.get_or_insert(ptr - off),
            ptr - off,
            "{t}: another allocation"
        );
        placed.push((off, off + len));
    }
    placed.sort_unstable();
    assert!(
        placed.windows(2).all(|w| w[0].1 <= w[1].0),
        "overlapping: {placed:?}"
    );
    assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    let path = v["path"].as_str().unwrap();
    assert!(
        ["gds-native", "gds-compat", "posix-direct", "posix-buffered"].contains(&path),
        "{v}"
    );
    eprintln!(
        "gdpath load: start {start:.3} s, last load {:.2} GB/s via {path}",
        v["gbps"].as_f64().unwrap()
    );

    // The text form says the same: the setup line first, then each load.
    let (ok, text, err) = common::gdpath(&["load", file, "--gpu", "0", "--repeat", "2"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("chosen: "), "{text}");
    assert!(lines[1].starts_with("start: "), "{text}");
    assert!(lines[2].starts_with("load 1: "), "{text}");
    assert!(
        text.contains(&format!("{} tensors", tensors.len())),
        "{text}"
    );
}

/// A save from GPU memory must write the same bytes as a save from host memory: `gdpath resave` from GPU memory, as a user runs the save benchmark: the checkpoint
/// loaded onto GPU 0 and saved back (fsync on, then off), each DST verified tensor by tensor by
/// the command and byte-equal here to a `--host` save of the same checkpoint, the path one of
/// the file ↔ GPU paths, and an existing DST refused without --overwrite.
#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn resave_from_the_gpu_is_verified_and_reports_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("model.safetensors");
    common::write_checkpoint(&f, &[("a", 3 << 20), ("b", 1000), ("c", 1 << 20)]);
    let (src, host, gpu) = (
        f.to_str().unwrap(),
        dir.path().join("host.safetensors"),
        dir.path().join("gpu.safetensors"),
    );
    let (ok, _, err) = common::gdpath(&["resave", src, host.to_str().unwrap(), "--host"]);
    assert!(ok, "{err}");
    for extra in [&[][..], &["--no-fsync"]] {
        let out = Command::new(common::bin())
            .args([
                "resave",
                src,
                gpu.to_str().unwrap(),
                "--gpu",
                "0",
                "--overwrite",
            ])
            .args(extra)
            .arg("--json")
            .output()
            .unwrap();
        let v = common::json_ok(&out);
        assert_eq!(v["from"], "GPU 0", "{v}");
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["fsync"], extra.is_empty(), "{v}");
        let path = v["paths"][0].as_str().unwrap();
        assert!(
            ["gds-native", "gds-compat", "posix-direct", "posix-buffered"].contains(&path),
            "{v}"
        );
        assert!(std::fs::read(&gpu).unwrap() == std::fs::read(&host).unwrap());
        eprintln!("gdpath resave from GPU 0: {:.2} GB/s via {path}", v["gbps"]);
    }
    let (ok, _, err) = common::gdpath(&["resave", src, gpu.to_str().unwrap(), "--gpu", "0"]);
    assert!(
        !ok && err.contains("replaced only with --overwrite"),
        "{err}"
    );
}

/// With no storage flag, the load takes the chooser's settings (reported with the reason and
/// the facts), skips cuFile where the chooser says it would only fall back, and the bytes on
/// the GPU equal the file's (`--verify`); from tmpfs when /dev/shm is there, and cold from the
/// disk the test dir is on.
#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn load_uses_the_chooser_and_verifies_on_the_gpu() {
    let disk = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm");
    if let Err(e) = &shm {
        eprintln!("tmpfs half skipped: /dev/shm is not writable here: {e}");
    }
    let mut dirs = vec![(disk.path().to_owned(), true)];
    if let Ok(d) = &shm {
        dirs.push((d.path().to_owned(), false));
    }
    for (dir, cold) in dirs {
        let f = dir.join("model.safetensors");
        let (bytes, _) = common::write_checkpoint(&f, &[("w", 24 << 20), ("b", 77)]);
        let mut args = vec![
            "load",
            f.to_str().unwrap(),
            "--gpu",
            "0",
            "--verify",
            "--json",
        ];
        if cold {
            args.push("--cold");
        }
        let v = common::json_ok(&Command::new(common::bin()).args(&args).output().unwrap());
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["tensor_bytes"], bytes, "{v}");
        let c = &v["chosen"];
        assert!(c["overridden"].as_array().unwrap().is_empty(), "{v}");
        // From memory onto the GPU: 2 MiB reads into 3 slabs; cold: 16 MiB requests (cuFile's
        // 4 MiB where nvidia_fs is loaded), a buffer pair each, O_DIRECT on the kinds that take
        // it when (nearly) nothing is cached.
        let seen_cold = c["reason"].as_str().unwrap().starts_with("cold files");
        if cold && !seen_cold {
            eprintln!("cold half as memory: the kernel kept the file cached after DONTNEED ({v})");
        }
        let (chunk, slabs) = match (seen_cold, c["cufile"] == true) {
            (true, true) => (4 << 20, 0),
            (true, false) => (16 << 20, 0),
            (false, _) => (2 << 20, 3),
        };
        if seen_cold {
            let direct_fs = ["ext4", "xfs", "btrfs"].contains(&c["facts"]["fs"].as_str().unwrap());
            let nearly_none = c["facts"]["resident"]
                .as_f64()
                .is_none_or(|r| r < gdpath_checkpoint::chooser::DIRECT_BELOW);
            assert_eq!(
                c["direct"],
                c["cufile"] == true || (direct_fs && nearly_none),
                "{v}"
            );
        }
        assert_eq!(
            (&c["chunk"], &c["slabs"]),
            (&chunk.into(), &slabs.into()),
            "{v}"
        );
        assert!(!c["reason"].as_str().unwrap().is_empty(), "{v}");
        if c["facts"]["nvidia_fs"] == false {
            assert_eq!(
                c["cufile"], false,
                "no nvidia_fs: cuFile is not opened: {v}"
            );
            assert_ne!(v["path"], "gds-native", "{v}");
        }
        if c["facts"]["fs"] == "tmpfs" {
            assert_eq!(v["path"], "posix-buffered", "{v}");
        }
        assert!(v["start_s"].as_f64().is_some(), "{v}");
        eprintln!(
            "gdpath load ({}): {} start {:.3} s, {:.2} GB/s via {}",
            dir.display(),
            v["chosen_text"],
            v["start_s"].as_f64().unwrap(),
            v["gbps"].as_f64().unwrap(),
            v["path"]
        );
    }
}

/// `gdpath bench storage --gpu 0` with no --block/--threads runs the chooser's configuration
/// (its row's block and threads are the chosen ones, reported with the reason); given values
/// win and are named.
#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn bench_storage_gpu_without_flags_runs_the_chosen_configuration() {
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let f = dir.path().join("f");
    let file = f.to_str().unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(common::bin())
            .args([
                "bench", "storage", "--gpu", "0", "--file", file, "--size", "256MiB",
            ])
            .args(["--path", "staged", "--runs", "2", "--overwrite", "--json"])
            .args(extra)
            .output()
            .unwrap();
        common::json_ok(&out)
    };
    let v = run(&[]);
    let c = &v["chosen"];
    assert!(c["overridden"].as_array().unwrap().is_empty(), "{v}");
    let row = &v["rows"][0];
    assert_eq!(row["block"], c["chunk"], "{v}");
    assert_eq!(row["qd"], c["threads"], "{v}");
    assert_eq!(row["verified"], true, "{v}");
    if c["direct"] == false {
        assert_eq!(row["path"], "posix-buffered", "{v}");
    }
    eprintln!(
        "bench storage --gpu 0 (no flags): {} -> {} GB/s",
        v["chosen_text"], row["gbps_median"]
    );
    let v = run(&["--threads", "3", "--block", "1MiB"]);
    assert_eq!(
        v["chosen"]["overridden"],
        serde_json::json!(["threads", "chunk"]),
        "{v}"
    );
    let row = &v["rows"][0];
    assert_eq!(
        (row["qd"].as_u64(), row["block"].as_u64()),
        (Some(3), Some(1 << 20)),
        "{v}"
    );
    assert_eq!(row["verified"], true, "{v}");
}
