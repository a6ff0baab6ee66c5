//! Devices, FIFOs, sockets, existing destinations, full file systems: nothing is destroyed, nothing blocks.

use super::*;

/// A FIFO, a listening Unix socket and a character device, each with a way to tell it was not
/// written: the FIFO has a reader open (non-blocking) whose read must find nothing.
struct Specials {
    _dir: tempfile::TempDir,
    fifo: PathBuf,
    fifo_reader: std::fs::File,
    sock: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

fn specials() -> Specials {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = disk_dir();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo_reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let sock = dir.path().join("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    Specials {
        _dir: dir,
        fifo,
        fifo_reader,
        sock,
        _listener: listener,
    }
}

impl Specials {
    fn targets(&self) -> [(&Path, &'static str); 3] {
        [
            (&self.fifo, "a FIFO"),
            (&self.sock, "a socket"),
            (Path::new("/dev/null"), "a character device"),
        ]
    }

    /// Nothing was written into the FIFO, and it and the socket are still what they were.
    fn untouched(&mut self, what: &str) {
        let mut b = [0u8; 16];
        match self.fifo_reader.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{what}: the FIFO was written: {other:?}"),
        }
        let ft = std::fs::metadata(&self.fifo).unwrap().file_type();
        assert!(ft.is_fifo(), "{what}: the FIFO was replaced");
        let ft = std::fs::metadata(&self.sock).unwrap().file_type();
        assert!(ft.is_socket(), "{what}: the socket was replaced");
        let dir = self.fifo.parent().unwrap();
        assert!(temporaries(dir).is_empty(), "{what}: temporaries left");
    }
}

/// Writing to a special file can block for ever or destroy a device's data: a device, FIFO or socket given to any command that writes (or to
/// `copy` as its source) is refused by its type, with a message naming it, without blocking
/// and without a byte written (`bench storage --file FIFO` would otherwise block for ever, and a
/// device would be written with the test pattern).
#[test]
fn every_writing_command_refuses_devices_fifos_and_sockets() {
    let mut sp = specials();
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(1 << 20, 1)).unwrap();
    let targets: Vec<(PathBuf, &str)> = sp
        .targets()
        .iter()
        .map(|(p, w)| (p.to_path_buf(), *w))
        .collect();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck.safetensors");
    std::fs::write(&ck, b"\x08\0\0\0\0\0\0\0{}      ").unwrap(); // no tensors
    for (t, what) in &targets {
        let t = s(t);
        let bench = |extra: &[&'static str]| {
            let mut v = vec!["bench", "storage", "--file", t, "--size", "1MiB"];
            v.extend_from_slice(extra);
            v
        };
        let cases: Vec<Vec<&str>> = vec![
            bench(&[]),
            bench(&["--overwrite"]),
            bench(&["--write", "--overwrite"]),
            bench(&["--gpu", "0", "--overwrite"]),
            vec!["copy", s(&src), t],
            vec!["copy", s(&src), t, "--overwrite"],
            vec!["copy", t, s(&out)],
            vec!["copy", "gpu:0", t, "--size", "1MiB", "--overwrite"],
            vec!["topo", "capture", "-o", t, "--overwrite"],
            vec!["report", "-o", t, "--snapshot", h200_snapshot()],
            vec![
                "report",
                "-o",
                t,
                "--snapshot",
                h200_snapshot(),
                "--overwrite",
            ],
            vec!["topo", "--snapshot", h200_snapshot(), "--svg", t],
            vec![
                "topo",
                "--snapshot",
                h200_snapshot(),
                "--svg",
                t,
                "--overwrite",
            ],
            vec!["resave", s(&ck), t, "--host"],
            vec!["resave", s(&ck), t, "--host", "--overwrite"],
        ];
        for args in cases {
            let (st, err) = run(&args);
            let line = args.join(" ");
            sp.untouched(&line);
            assert!(!st.success(), "{line} succeeded");
            assert_eq!(st.code(), Some(1), "{line}: {err}");
            assert!(
                err.contains(&format!("is {what}, not a regular file")),
                "{line}: {err}"
            );
        }
        // Reading a FIFO would block: the readers that are this refuse it too.
        for args in [vec!["load", t], vec!["p2p", "--facts", t]] {
            let (st, err) = run(&args);
            sp.untouched(&args.join(" "));
            assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
            assert!(err.contains("not a regular file"), "{err}");
        }
        // The doctor's probe files go into --path directories.
        let (st, err) = run(&["doctor", "--measure", "--path", t]);
        assert_eq!(st.code(), Some(3), "doctor --path {t}: {err}");
        assert!(err.contains("not a directory"), "{err}");
        sp.untouched("doctor");
    }
    assert!(!out.exists());
}

/// A user's file must not be lost to a command's output: an existing destination is replaced only with
/// `--overwrite`, and then whole, keeping its permissions; without it nothing changes, for every
/// command that writes a file (`copy`, `topo capture`, `report -o`, `topo --svg`).
#[test]
fn an_existing_destination_is_replaced_only_with_overwrite() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let new = data(3 << 20, 2);
    std::fs::write(&src, &new).unwrap();
    let dst = dir.path().join("dst");
    let old = data(100_000, 3);
    std::fs::write(&dst, &old).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o640)).unwrap();
    let snap = dir.path().join("snap.tar.gz");
    std::fs::write(&snap, b"an old snapshot").unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"precious").unwrap();
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o600)).unwrap();
    for args in [
        vec!["copy", s(&src), s(&dst)],
        vec!["copy", "gpu:0", s(&dst), "--size", "1MiB"],
        vec!["topo", "capture", "-o", s(&snap)],
        vec!["report", "-o", s(&notes), "--snapshot", h200_snapshot()],
        vec!["topo", "--snapshot", h200_snapshot(), "--svg", s(&notes)],
    ] {
        let (st, err) = run(&args);
        assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
        assert!(
            err.contains("exists: it is replaced only with --overwrite"),
            "{err}"
        );
    }
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert_eq!(std::fs::read(&snap).unwrap(), b"an old snapshot");
    assert_eq!(std::fs::read(&notes).unwrap(), b"precious");

    let (st, err) = run(&["copy", s(&src), s(&dst), "--overwrite", "--verify"]);
    assert!(st.success(), "{err}");
    assert!(std::fs::read(&dst).unwrap() == new, "replaced whole");
    let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the replaced file keeps its permissions");
    let (st, err) = run(&["topo", "capture", "-o", s(&snap), "--overwrite"]);
    assert!(st.success(), "{err}");
    let (st, err) = run(&["topo", "--snapshot", s(&snap)]);
    assert!(st.success(), "the new snapshot replays: {err}");
    for (args, starts) in [
        (
            vec![
                "report",
                "-o",
                s(&notes),
                "--snapshot",
                h200_snapshot(),
                "--overwrite",
            ],
            "<!DOCTYPE html>",
        ),
        (
            vec![
                "topo",
                "--snapshot",
                h200_snapshot(),
                "--svg",
                s(&notes),
                "--overwrite",
            ],
            "<svg",
        ),
    ] {
        let (st, err) = run(&args);
        assert!(st.success(), "{}: {err}", args.join(" "));
        let text = std::fs::read_to_string(&notes).unwrap();
        assert!(
            text.starts_with(starts),
            "{}: {}",
            args.join(" "),
            &text[..20]
        );
        let mode = std::fs::metadata(&notes).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the replaced file keeps its permissions");
    }
    assert!(temporaries(dir.path()).is_empty());
}

/// No read may wait on a FIFO's writer: every file a command reads (`--snapshot`, `--nccl-xml`, `--hwloc-xml`,
/// `--smi-topo`, `load`'s checkpoint, `--facts`, `--token-file`, `report --from`) is refused by
/// its type when it is a FIFO, at once, however the FIFO is held: with no writer, and with a
/// writer that stays silent (which kept `topo --snapshot FIFO` reading for ever and
/// `--nccl-xml FIFO` for 10 s before a misleading XML error). Nothing is read from it.
#[test]
fn every_file_input_refuses_a_fifo_at_once() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = disk_dir();
    let fifo = dir.path().join("input");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = s(&fifo);
    let out = dir.path().join("out.html");
    let cases: Vec<Vec<&str>> = vec![
        vec!["topo", "--snapshot", f],
        vec!["topo", "--nccl-xml", f],
        vec!["topo", "--hwloc-xml", f],
        vec!["topo", "--smi-topo", f],
        vec!["doctor", "--snapshot", f],
        vec!["doctor", "--nccl-xml", f],
        vec!["doctor", "--hwloc-xml", f],
        vec!["doctor", "--smi-topo", f],
        vec!["p2p", "--snapshot", f],
        vec!["p2p", "--facts", f],
        vec!["report", "--snapshot", f, "-o", s(&out)],
        vec![
            "report",
            "--from",
            f,
            "--snapshot",
            h200_snapshot(),
            "-o",
            s(&out),
        ],
        vec!["load", f],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            f,
            "--duration",
            "1",
        ],
    ];
    let check = |held: &str| {
        for args in &cases {
            let what = format!("{held}: gdpath {}", args.join(" "));
            let t = Instant::now();
            let (st, err) = run(args);
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{what}: took {:?}",
                t.elapsed()
            );
            assert!(!st.success(), "{what}: succeeded");
            assert!(
                err.contains("FIFO"),
                "{what}: the message does not name the FIFO: {err}"
            );
            assert!(!out.exists(), "{what}: a report was written");
        }
    };
    check("no writer");
    // Read and write on one descriptor: a writer that is there and never writes.
    let mut hold = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    check("a silent writer");
    // What the writer puts in from now on stays there: nobody reads the FIFO.
    use std::io::Write;
    hold.write_all(b"<system/>").unwrap();
    check("data waiting");
    let mut b = [0u8; 64];
    assert_eq!(
        hold.read(&mut b).unwrap(),
        9,
        "a command read from the FIFO"
    );
}

/// `p2p --facts /dev/zero` is refused at once (a character device), and a facts file larger
/// than the bound is refused naming it, instead of being read into memory without end.
#[test]
fn p2p_facts_input_is_bounded() {
    let (st, err) = run(&["p2p", "--facts", "/dev/zero"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("is a character device"), "{err}");
    let dir = disk_dir();
    let big = dir.path().join("facts.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    let (st, err) = run(&["p2p", "--facts", s(&big)]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("holds more than 67108864 bytes"), "{err}");
}

/// `copy --size N` copies the first N bytes of a file source (main ignored it and copied the
/// whole file), and refuses N beyond its end before writing anything.
#[test]
fn copy_honours_size_for_file_sources() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let d = data((2 << 20) + 5, 4);
    std::fs::write(&src, &d).unwrap();
    let dst = dir.path().join("dst");
    let (st, err) = run(&["copy", s(&src), s(&dst), "--size", "1MiB", "--verify"]);
    assert!(st.success(), "{err}");
    assert!(
        std::fs::read(&dst).unwrap() == d[..1 << 20],
        "the first MiB only"
    );
    let far = dir.path().join("far");
    let (st, err) = run(&["copy", s(&src), s(&far), "--size", "3MiB"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("short file"), "{err}");
    assert!(!far.exists());
    assert!(temporaries(dir.path()).is_empty());
}

/// Whether this process may mount (root in CI); otherwise the caller skips, saying why.
pub(super) fn tmpfs(size: &str) -> Option<Mounted> {
    let dir = disk_dir();
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            s(dir.path()),
        ])
        .stderr(Stdio::null())
        .status();
    match st {
        Ok(st) if st.success() => Some(Mounted { dir }),
        _ => {
            eprintln!("skipped: cannot mount a tmpfs here (needs root; CI runs as root)");
            None
        }
    }
}

pub(super) struct Mounted {
    pub(super) dir: tempfile::TempDir,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A full file system must cost neither the old file nor leave a partial one: `copy` of 16 MiB onto an existing file of an 8 MiB tmpfs
/// fails naming the file and the bytes needed, the old file survives byte-exact and nothing
/// partial is left; `topo capture` on a full file system leaves no 0-byte snapshot and an
/// old one intact.
#[test]
fn a_full_file_system_destroys_nothing_and_says_what_was_needed() {
    let Some(m) = tmpfs("8m") else { return };
    let disk = disk_dir();
    let src = disk.path().join("src");
    let new = data(16 << 20, 9);
    std::fs::write(&src, &new).unwrap();
    let dst = m.dir.path().join("dst");
    let old = data(1 << 20, 10);
    std::fs::write(&dst, &old).unwrap();
    // Without --overwrite the old file is not even opened.
    let (st, err) = run(&["copy", s(&src), s(&dst)]);
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert_eq!(st.code(), Some(1), "{err}");
    let (st, err) = run(&["copy", s(&src), s(&dst), "--overwrite"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("no space left for {}", dst.display()))
            && err.contains("16777216 bytes (16 MiB) needed"),
        "{err}"
    );
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert!(temporaries(m.dir.path()).is_empty());

    // Fill the file system to the last block, then capture into it.
    let snap = m.dir.path().join("snap.tar.gz");
    std::fs::write(&snap, b"old snapshot").unwrap();
    let filler = m.dir.path().join("filler");
    {
        use std::io::Write;
        let mut w = std::fs::File::create(&filler).unwrap();
        let block = vec![1u8; 4096];
        while w.write_all(&block).is_ok() {}
    }
    for (args, keeps) in [
        (
            vec!["topo", "capture", "-o", s(&snap), "--overwrite"],
            Some(&b"old snapshot"[..]),
        ),
        (
            vec!["topo", "capture", "-o", s(&m.dir.path().join("fresh"))],
            None,
        ),
    ] {
        let (st, err) = run(&args);
        assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
        assert!(err.contains("no space left for"), "{err}");
        match keeps {
            Some(k) => assert_eq!(std::fs::read(&snap).unwrap(), k),
            None => assert!(!m.dir.path().join("fresh").exists(), "no 0-byte snapshot"),
        }
        assert!(temporaries(m.dir.path()).is_empty());
    }
}

/// A block device (a loop device over a file of zeros) given to `bench storage`,
/// `copy` and `topo capture` is refused and not written, since a test pattern
/// written there would destroy whatever the device holds.
#[test]
fn a_block_device_is_never_written() {
    let dir = disk_dir();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show", s(&img)])
        .output();
    let dev = match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap().trim().to_owned(),
        _ => {
            eprintln!("skipped: losetup is not permitted here (needs root; CI runs as root)");
            return;
        }
    };
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());
    let src = dir.path().join("src");
    std::fs::write(&src, data(1 << 20, 11)).unwrap();
    for args in [
        vec!["bench", "storage", "--file", &dev, "--size", "16MiB"],
        vec![
            "bench",
            "storage",
            "--file",
            &dev,
            "--size",
            "16MiB",
            "--overwrite",
        ],
        vec![
            "bench",
            "storage",
            "--file",
            &dev,
            "--size",
            "16MiB",
            "--write",
            "--overwrite",
        ],
        vec!["copy", s(&src), &dev, "--overwrite"],
        vec!["topo", "capture", "-o", &dev, "--overwrite"],
        vec![
            "report",
            "-o",
            &dev,
            "--snapshot",
            h200_snapshot(),
            "--overwrite",
        ],
        vec![
            "topo",
            "--snapshot",
            h200_snapshot(),
            "--svg",
            &dev,
            "--overwrite",
        ],
    ] {
        let (st, err) = run(&args);
        let line = args.join(" ");
        let mut back = vec![0u8; 32 << 20];
        std::fs::File::open(&dev)
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "{line}: the device was written"
        );
        assert_eq!(st.code(), Some(1), "{line}: {err}");
        assert!(
            err.contains("is a block device, not a regular file"),
            "{err}"
        );
    }
}
