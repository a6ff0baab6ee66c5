//! What the kernel says about where a file's bytes are: how many of its pages are in the page
//! cache (`mincore(2)` on a read-only shared mapping of the file) and which file system holds
//! it (`fstatfs(2)`'s magic number). The storage chooser ([`crate::tune`]) decides from them.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

/// Bytes mapped and asked about per `mincore` call: bounds the residency vector at 256 KiB
/// (one byte per 4 KiB page) whatever the file size.
const WINDOW: u64 = 1 << 30;

/// Bytes of `f`'s first `len` bytes whose pages are in the page cache, counted a page at a time
/// (the last page counts whole). Linux answers for the page cache only for files the caller
/// owns or may write (`mincore(2)`, since 5.0); for other files it says which pages this
/// process has mapped, so the count can read low, never high.
///
/// Errors: the `mmap` or `mincore` error (e.g. `ENODEV` for a file system that cannot be
/// mapped).
pub fn resident_bytes(f: &File, len: u64) -> std::io::Result<u64> {
    let page = super::file::page_size() as u64;
    let mut resident_pages = 0u64;
    let mut off = 0u64;
    let mut vec = Vec::new();
    while off < len {
        let n = WINDOW.min(len - off);
        let map_len = usize::try_from(n).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let file_off = libc::off_t::try_from(off).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a new read-only shared mapping at an address the kernel picks; nothing reads
        // through it (mincore looks at the pages' state only) and it is unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                file_off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let pages = map_len.div_ceil(page as usize);
        vec.clear();
        vec.resize(pages, 0u8);
        // SAFETY: `addr` is the page-aligned start of a mapping of `map_len` bytes and `vec`
        // holds one byte per page of it, as mincore writes.
        let r = unsafe { libc::mincore(addr, map_len, vec.as_mut_ptr()) };
        let err = (r != 0).then(std::io::Error::last_os_error);
        // SAFETY: the mapping made above, unmapped once; no reference into it exists.
        unsafe { libc::munmap(addr, map_len) };
        if let Some(e) = err {
            return Err(e);
        }
        resident_pages += vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
        off += n;
    }
    Ok((resident_pages * page).min(len))
}

/// The file system magic number of `f` (`statfs.f_type`: `0x01021994` tmpfs, `0xEF53` ext2/3/4,
/// ...). Errors: the `fstatfs` error.
pub fn fs_magic(f: &File) -> std::io::Result<u64> {
    let s = rustix::fs::fstatfs(f)?;
    // f_type is signed on some ABIs; the magic numbers are 32-bit patterns.
    Ok(s.f_type as u64 & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_is_resident_and_an_empty_one_has_no_pages() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 3 << 20]).unwrap();
        let f = File::open(&p).unwrap();
        let r = resident_bytes(&f, 3 << 20).unwrap();
        // Written through the page cache a moment ago: its pages are there (the kernel could
        // evict some under memory pressure, never most).
        assert!(r > 1 << 20, "{r}");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(resident_bytes(&File::open(&p).unwrap(), 0).unwrap(), 0);
    }

    #[test]
    fn the_magic_of_dev_shm_is_tmpfs_when_it_is_mounted() {
        match File::open("/dev/shm") {
            Ok(f) => {
                let m = fs_magic(&f).unwrap();
                eprintln!("/dev/shm magic {m:#x}");
                assert_ne!(m, 0);
            }
            Err(e) => eprintln!("skipped: /dev/shm cannot be opened here: {e}"),
        }
    }
}
