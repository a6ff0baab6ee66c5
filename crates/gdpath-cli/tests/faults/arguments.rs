//! Arguments that mean nothing or do not apply, refused before anything runs.

use super::*;

/// Values that mean nothing and options that do not apply to the chosen mode are
/// usage errors (status 2) that say why, before anything is created; a malformed GPU end is
/// named as such first, so that a user never gets a run that silently ignored an option (or, for
/// `gpu:x`, an error blaming a missing --size).
#[test]
fn arguments_that_do_not_apply_are_refused_before_anything_runs() {
    let dir = disk_dir();
    let f = dir.path().join("f");
    std::fs::write(&f, data(1 << 20, 5)).unwrap();
    let new = dir.path().join("new");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["bench", "storage", "--file", s(&new), "--size", "0"],
            "at least 1 byte",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--runs", "0"],
            "at least 1",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--qd", "0"],
            "--qd",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--threads", "4"],
            "--threads applies to the GDS bench",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--path", "gds"],
            "--path applies to the GDS bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--compare",
            ],
            "--compare applies to the host-memory bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--qd",
                "4",
            ],
            "--qd applies to the host-memory bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--buffered",
            ],
            "--buffered applies",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--threads",
                "0",
            ],
            "at least 1",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--write",
                "--compare",
            ],
            "--compare runs a buffered read loop",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--size",
                "1MiB",
                "--cold",
            ],
            "--cold drops the page cache before buffered runs",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--size",
                "1MiB",
                "--cold",
                "--write",
            ],
            "use it with --buffered or --compare",
        ),
        (vec!["bench", "h2d", "--runs", "0"], "at least 1"),
        // Sizes that do not parse, or are 0, in the lists the commands parse themselves (these
        // exited 1, as if the run had failed).
        (
            vec!["bench", "net", "--peer", "127.0.0.1:1", "--size", "0"],
            "--size: size \"0\" is 0: must be at least 1 byte",
        ),
        (
            vec!["bench", "net", "--peer", "127.0.0.1:1", "--size", "4KiB,zz"],
            "--size: bad size \"zz\"",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--block", "0"],
            "--block: size \"0\" is 0",
        ),
        (
            vec!["bench", "p2p", "--sizes", "0"],
            "--sizes: size \"0\" is 0",
        ),
        (
            vec!["serve", "--export", "host:zz"],
            "--export \"host:zz\": bad size",
        ),
        (
            vec!["copy", s(&f), s(&new), "--size", "0"],
            "at least 1 byte",
        ),
        (
            vec!["copy", s(&f), s(&new), "--window", "0"],
            "at least 1 byte",
        ),
        (vec!["copy", s(&f), s(&new), "--qd", "0"], "--qd"),
        (
            vec!["copy", s(&f), "--overwrite"],
            "--overwrite applies to a destination file",
        ),
        (
            vec!["copy", s(&f), "--no-fsync"],
            "--no-fsync applies to a destination file",
        ),
        (vec!["copy", "gpu:x", s(&new)], "bad GPU: gpu:x"),
        (vec!["copy", s(&f), "gpu:0@zz"], "bad GPU"),
        (vec!["copy", "gpu:0", s(&new)], "--size is needed"),
        (
            vec![
                "copy",
                "gpu:0",
                s(&new),
                "--size",
                "1MiB",
                "--window",
                "1MiB",
            ],
            "--window applies to copies between files",
        ),
        (
            vec!["copy", s(&f), "gpu:0", "--buffered"],
            "--buffered applies to copies between files",
        ),
        (
            vec!["copy", s(&f), "gpu:0", "--overwrite"],
            "--overwrite applies to a destination file",
        ),
        (vec!["load", s(&f), "--repeat", "0"], "at least 1"),
        (vec!["load", s(&f), "--chunk", "0"], "at least 1 byte"),
        (vec!["load", s(&f), "--threads", "0"], "at least 1"),
        (
            vec!["resave", s(&f), s(&new), "--repeat", "0"],
            "at least 1",
        ),
    ];
    for (args, says) in cases {
        let (st, err) = run(&args);
        let line = args.join(" ");
        assert_eq!(st.code(), Some(2), "{line}: {err}");
        assert!(err.contains(says), "{line}: {err:?} lacks {says:?}");
        assert!(!new.exists(), "{line} created a file");
        assert!(temporaries(dir.path()).is_empty(), "{line}");
    }
}

/// `bench net`: `--completion` and `--no-pack` say how puts are sent and confirmed, so
/// with `--op get` they are usage errors that say so, before anything is done: the peer, a
/// listener of this test, sees no connection, rather than a get that ignores them.
#[test]
fn put_options_with_a_get_run_are_refused_before_connecting() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let peer = listener.local_addr().unwrap().to_string();
    let cases: [(&[&str], &str); 4] = [
        (&["--completion", "local"], "--completion applies to puts"),
        (&["--completion", "remote"], "--completion applies to puts"),
        (&["--no-pack"], "--no-pack applies to puts"),
        (
            &["--no-pack", "--completion", "local"],
            "--completion applies to puts",
        ),
    ];
    for (extra, says) in cases {
        let mut args = vec!["bench", "net", "--peer", &peer, "--op", "get"];
        args.extend_from_slice(extra);
        let (st, err) = run(&args);
        let line = args.join(" ");
        assert_eq!(st.code(), Some(2), "{line}: {err}");
        assert!(err.contains(says), "{line}: {err:?} lacks {says:?}");
        match listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{line} connected to the peer: {other:?}"),
        }
    }
}

/// Host memory a command would allocate beyond what the machine has is refused before anything
/// is allocated, with both sizes: `bench kv` of 2,000,000 × 1 MiB blocks aborted on the failed
/// allocation (a Rust backtrace, status 134), and two `serve --export` of most of the memory
/// each were met by the OOM killer.
#[test]
fn host_memory_beyond_the_machine_is_refused_up_front() {
    let kv = [
        "bench",
        "kv",
        "--src",
        "host",
        "--dst",
        "host",
        "--blocks",
        "2000000",
        "--block-size",
        "1MiB",
    ];
    let (st, err) = run(&kv);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("bench kv needs")
            && err.contains("of host memory")
            && err.contains("available"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation of"),
        "{err}"
    );
    let (st, err) = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--export",
        "host:64TiB",
        "--export",
        "host:64TiB",
        "--duration",
        "1",
    ]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("--export needs") && err.contains("available"),
        "{err}"
    );
}
