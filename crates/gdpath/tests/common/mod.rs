//! Helpers shared by the engine's integration tests: real files in real directories.
#![allow(dead_code)]

use gdpath::{
    Agent, AgentConfig, DirectIo, FileSpec, HostBuffer, Memory, Op, Region, StorageConfig,
    TransferReport, TransferRequest,
};
use std::path::{Path, PathBuf};

/// A temporary directory on the work disk (ext4 here; accepts O_DIRECT).
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir on the work disk")
}

/// A temporary directory on tmpfs (/dev/shm), or None when it does not exist.
pub fn shm_dir() -> Option<tempfile::TempDir> {
    let p = Path::new("/dev/shm");
    if !p.is_dir() {
        eprintln!("SKIP part: /dev/shm does not exist on this machine");
        return None;
    }
    Some(tempfile::tempdir_in(p).expect("tempdir on /dev/shm"))
}

pub fn agent_with(f: impl FnOnce(&mut StorageConfig)) -> Agent {
    let mut cfg = AgentConfig::default();
    f(&mut cfg.storage);
    Agent::new(cfg).expect("agent")
}

pub fn agent() -> Agent {
    agent_with(|_| {})
}

pub fn buffered_agent() -> Agent {
    agent_with(|s| s.direct = DirectIo::Off)
}

/// `len` bytes of the test pattern copies are verified with (`gdpath_cuda::pattern`).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    gdpath_cuda::pattern::fill(&mut v, seed, 0);
    v
}

pub fn host(agent: &Agent, bytes: &[u8]) -> Region {
    agent
        .register(Memory::host(HostBuffer::from_slice(bytes)))
        .expect("register host")
}

pub fn host_zeroed(agent: &Agent, len: usize) -> Region {
    agent
        .register(Memory::host(HostBuffer::zeroed(len)))
        .expect("register host")
}

/// Moves `len` bytes between byte 0 of `local` and byte 0 of `target` (a read fills `local`)
/// and waits for the transfer; panics on a failed post or transfer.
pub fn move_whole(
    agent: &Agent,
    op: Op,
    local: &Region,
    target: &Region,
    len: u64,
) -> TransferReport {
    let (l, t) = (vec![local.desc(0, len)], vec![target.desc(0, len)]);
    let req = match op {
        Op::Read => TransferRequest::read(l, t),
        Op::Write => TransferRequest::write(l, t),
    };
    agent.post(req).expect("post").wait().expect("transfer")
}

pub fn bytes_of(r: &Region) -> Vec<u8> {
    r.host_view().expect("host view").to_vec()
}

pub fn file_in(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write test file");
    p
}

/// Writes `bytes` to a fresh file `name` in `dir` and registers it for reading (default
/// O_DIRECT policy).
pub fn readable_file(agent: &Agent, dir: &Path, name: &str, bytes: &[u8]) -> Region {
    agent
        .register(Memory::File(FileSpec::read(file_in(dir, name, bytes))))
        .expect("register file")
}

/// A mounted ramfs, which refuses O_DIRECT (no direct I/O support), unmounted on drop.
pub struct Ramfs {
    pub dir: tempfile::TempDir,
}

impl Ramfs {
    /// Mounts ramfs on a fresh directory; None (with the reason printed) when not permitted.
    pub fn mount() -> Option<Ramfs> {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).ok()?;
        let target = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: plain mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"ramfs".as_ptr(),
                target.as_ptr(),
                c"ramfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            eprintln!(
                "SKIP part: cannot mount ramfs (an O_DIRECT-refusing file system) here: {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Ramfs { dir })
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.dir.path().as_os_str().as_encoded_bytes())
            .expect("no NUL in a tempdir path");
        // SAFETY: plain umount2(2).
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}
