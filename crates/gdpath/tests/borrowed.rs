//! Memory gdpath does not own (`Memory::HostPointer`, what the Python binding registers for
//! NumPy arrays and `bytearray`s): transfers in and out of it at unaligned addresses, the owner
//! kept alive until the last transfer is done, read-only memory never written.

mod common;

use common::*;
use gdpath::{Error, FileSpec, HostPointer, Memory, Op, TransferRequest};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An owner whose drop is observable.
struct Owner {
    bytes: Vec<u8>,
    dropped: Arc<AtomicBool>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// Registers `owner.bytes[skip..]` (an address that is not page-aligned) as borrowed memory
/// that the region keeps alive.
fn borrowed(
    agent: &gdpath::Agent,
    mut owner: Owner,
    skip: usize,
    writable: bool,
) -> gdpath::Region {
    let len = owner.bytes.len() - skip;
    // SAFETY: the Vec's heap buffer does not move when `owner` is moved into the region, which
    // keeps it until its last handle goes.
    let mem = unsafe { HostPointer::new(owner.bytes.as_mut_ptr().add(skip), len, writable) };
    agent
        .register_kept(
            Memory::HostPointer {
                memory: mem,
                pinned: false,
            },
            owner,
        )
        .unwrap()
}

#[test]
fn borrowed_memory_is_read_into_and_written_from_in_place() {
    let dir = disk_dir();
    let agent = agent();
    let data = pattern((1 << 20) + 3, 7);
    let file = readable_file(&agent, dir.path(), "src", &data);
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = Owner {
        bytes: vec![0u8; data.len() + 1],
        dropped: dropped.clone(),
    };
    let base = owner.bytes.as_ptr() as usize;
    let dst = borrowed(&agent, owner, 1, true);
    assert_eq!(dst.host_ptr().unwrap() as usize, base + 1);
    assert_eq!(dst.len().unwrap(), data.len() as u64);
    let len = data.len() as u64;
    let r = move_whole(&agent, Op::Read, &dst, &file, len);
    assert_eq!(r.bytes, len);
    assert_eq!(&*dst.host_view().unwrap(), &data[..]);
    // And out again, into a second file, from a sub-range.
    let out = dir.path().join("out");
    let of = agent.register(Memory::File(FileSpec::write(&out))).unwrap();
    agent
        .post(TransferRequest::write(
            vec![dst.desc(5, 4096)],
            vec![of.desc(0, 4096)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), &data[5..5 + 4096]);
    // Memory gdpath does not own is not handed out as a buffer.
    let (dst, e) = dst.into_host_buffer().unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert!(!dropped.load(Ordering::SeqCst));
    drop(dst);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the owner outlived its region"
    );
}

#[test]
fn the_owner_outlives_a_transfer_whose_region_handle_was_dropped() {
    let dir = disk_dir();
    let agent = agent();
    let data = pattern(8 << 20, 3);
    let file = readable_file(&agent, dir.path(), "src", &data);
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = Owner {
        bytes: vec![0u8; data.len()],
        dropped: dropped.clone(),
    };
    let dst = borrowed(&agent, owner, 0, true);
    let t = agent
        .post(TransferRequest::read(
            vec![dst.desc(0, data.len() as u64)],
            vec![file.desc(0, data.len() as u64)],
        ))
        .unwrap();
    drop(dst);
    // The work items hold the region: the owner lives until they completed.
    let done = t.wait().unwrap();
    assert_eq!(done.bytes, data.len() as u64);
    assert!(dropped.load(Ordering::SeqCst));
}

#[test]
fn read_only_memory_is_never_written() {
    let dir = disk_dir();
    let agent = agent();
    let data = pattern(10_000, 9);
    let file = readable_file(&agent, dir.path(), "src", &data);
    let owner = Owner {
        bytes: data.clone(),
        dropped: Arc::new(AtomicBool::new(false)),
    };
    let ro = borrowed(&agent, owner, 0, false);
    assert!(ro.is_read_only());
    // A read into it: refused before any byte moves, naming the descriptor.
    let e = agent
        .post(TransferRequest::read(
            vec![ro.desc(0, 100)],
            vec![file.desc(0, 100)],
        ))
        .unwrap_err();
    assert_eq!(e.kind(), "read_only_memory");
    assert!(e.to_string().contains("descriptor 0 (local)"), "{e}");
    // As a write's target (host to host).
    let src = host(&agent, &[1u8; 100]);
    let e = agent
        .post(TransferRequest::write(
            vec![src.desc(0, 100)],
            vec![ro.desc(0, 100)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnlyMemory { .. }), "{e:?}");
    assert!(e.to_string().contains("descriptor 0 (target)"), "{e}");
    let e = agent.plan(&TransferRequest::read(
        vec![ro.desc(0, 100)],
        vec![file.desc(0, 100)],
    ));
    assert!(matches!(e, Err(Error::ReadOnlyMemory { .. })), "{e:?}");
    // No host view (it would be writable).
    assert!(matches!(ro.host_view(), Err(Error::ReadOnlyMemory { .. })));
    // Written from: fine.
    let out = dir.path().join("out");
    let of = agent.register(Memory::File(FileSpec::write(&out))).unwrap();
    move_whole(&agent, Op::Write, &ro, &of, 10_000);
    assert_eq!(std::fs::read(&out).unwrap(), data);
}

#[test]
fn pinned_borrowed_memory_needs_the_cuda_backend() {
    let agent = gdpath::Agent::bare(gdpath::AgentConfig::default());
    let mut v = vec![0u8; 64];
    // SAFETY: `v` outlives the (failed) registration.
    let mem = unsafe { HostPointer::new(v.as_mut_ptr(), v.len(), true) };
    let e = agent
        .register(Memory::HostPointer {
            memory: mem,
            pinned: true,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                backend: "cuda",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn empty_borrowed_memory_registers() {
    let agent = agent();
    // SAFETY: an empty range is never dereferenced.
    let mem = unsafe { HostPointer::new(std::ptr::null_mut(), 0, true) };
    let r = agent
        .register(Memory::HostPointer {
            memory: mem,
            pinned: false,
        })
        .unwrap();
    assert_eq!(r.len().unwrap(), 0);
}
