//! A closed or full stdout, for every command.

use super::*;

/// Every command, with stdout closed by its reader (EPIPE) and with stdout full
/// (`/dev/full`). Closed: no panic, no message, the status a normal run has (the doctor's
/// verdict too). Full: the output is lost, so the command fails (1; the doctor 3) saying so.
/// Neither may panic ("failed printing to stdout", status 101), which is std's `println!` default.
#[test]
fn a_closed_or_full_stdout_ends_every_command_with_its_status() {
    let dir = disk_dir();
    let f = dir.path().join("f");
    std::fs::write(&f, data(1 << 20, 6)).unwrap();
    let facts = dir.path().join("driver.json");
    std::fs::write(&facts, gdpath_testkit::H200_DRIVER_FACTS_JSON).unwrap();
    let snap = |n: &str| s(&dir.path().join(n)).to_owned();
    let (s1, s2, s3) = (snap("s1"), snap("s2"), snap("s3"));
    let bench = vec![
        "bench",
        "storage",
        "--file",
        s(&f),
        "--size",
        "1MiB",
        "--runs",
        "1",
    ];
    let commands: Vec<(Vec<&str>, Option<&str>)> = vec![
        // Help and version are output too (clap's own printing ignored a full stdout: 0).
        (vec!["--help"], None),
        (vec!["--version"], None),
        (vec!["topo", "--help"], None),
        (vec!["doctor", "--help"], None),
        (vec!["topo"], None),
        (vec!["topo", "--json"], None),
        (vec!["topo", "--snapshot", h200_snapshot()], None),
        (vec!["doctor"], None),
        (vec!["doctor", "--json"], None),
        (vec!["doctor", "--snapshot", h200_snapshot(), "--all"], None),
        (vec!["p2p", "--snapshot", h200_snapshot()], None),
        (vec!["p2p", "--json", "--facts", s(&facts)], None),
        (vec!["copy", s(&f)], None),
        (vec!["copy", s(&f), "--json", "--verify"], None),
        (bench.clone(), None),
        ([&bench[..], &["--json"]].concat(), None),
        // Failures print their error document on stdout with --json.
        (vec!["load", s(&f), "--json"], None),
        (
            vec!["resave", s(&f), "/nonexistent/x", "--host", "--json"],
            None,
        ),
        (vec!["bench", "h2d", "--json"], None),
        (vec!["p2p", "--json", "--facts", "/nonexistent"], None),
        (vec!["copy", "/nonexistent", "--json"], None),
        // A capture writes a new file each time (the output is its summary).
        (vec!["topo", "capture", "-o", &s1], Some(s1.as_str())),
        (vec!["topo", "capture", "-o", &s2], Some(s2.as_str())),
        (vec!["topo", "capture", "-o", &s3], Some(s3.as_str())),
    ];
    // The capture commands run three times (normal, closed, full): one output each.
    let mut i = 0;
    for (args, made) in &commands {
        let line = args.join(" ");
        let fresh = |n: usize| -> Vec<String> {
            args.iter()
                .map(|a| match made {
                    Some(m) if a == m => format!("{m}-{n}"),
                    _ => (*a).to_owned(),
                })
                .collect()
        };
        i += 1;
        let spawn = |stdout: Stdio, n: usize| {
            let child = gdpath()
                .args(fresh(n))
                .stdout(stdout)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait(child, &line)
        };
        let (normal, err0) = spawn(Stdio::null(), 3 * i);
        assert_ne!(normal.code(), Some(101), "{line}: {err0}");
        let doctor = args[0] == "doctor";

        let (closed, err) = spawn(closed_pipe(), 3 * i + 1);
        assert!(!err.contains("panicked"), "{line}, closed stdout: {err}");
        assert_eq!(
            closed.code(),
            normal.code(),
            "{line}, closed stdout: {err}\nnormal run: {err0}"
        );
        assert!(
            !err.contains("cannot write to stdout"),
            "{line}: a reader that left is not an error: {err}"
        );

        let (full, err) = spawn(dev_full(), 3 * i + 2);
        assert!(!err.contains("panicked"), "{line}, full stdout: {err}");
        let failed = if doctor { 3 } else { 1 };
        assert_eq!(full.code(), Some(failed), "{line}, full stdout: {err}");
        if normal.success() {
            assert!(
                err.contains("cannot write to stdout: No space left on device"),
                "{line}: {err}"
            );
        }
    }
}
