//! What the kernel says about where a file's bytes are: how many of its pages are in the page
//! cache (`mincore(2)` on a read-only shared mapping of the file) and which file system holds
//! it (`fstatfs(2)`'s magic number). The storage chooser (`gdpath_checkpoint::chooser`) decides
//! from them.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

/// Files up to this size are counted page by page; larger ones are sampled. `mincore` costs
/// about 100 ns a page on tmpfs (docs/benchmarks.md, "Measurements behind the defaults"), so
/// counting a 9 GB checkpoint took longer than the chooser's other work and the load's start.
const EXACT_MAX: u64 = 256 << 20;

/// Evenly spaced windows asked about in a larger file, and the bytes of each: 128 MiB examined
/// whatever the file's size, enough to tell a cold file from one the storage chooser counts as
/// cached (`gdpath_checkpoint::chooser::HOT_FRACTION`).
const SAMPLES: u64 = 512;
const SAMPLE_BYTES: u64 = 256 << 10;

/// Bytes of `f`'s first `len` bytes in the page cache: counted page by page (the last page
/// whole) up to 256 MiB, above that estimated from 512 evenly spaced windows of 256 KiB (the
/// resident fraction of the windows times `len`), so that the answer costs about the same for
/// any file. Linux answers for the page cache only for files the caller owns or may write
/// (`mincore(2)`, since 5.0); for other files it says which pages this process has mapped, so
/// the count can read low, never high.
///
/// Errors: the `mmap` or `mincore` error (e.g. `ENODEV` for a file system that cannot be
/// mapped).
pub fn resident_bytes(f: &File, len: u64) -> std::io::Result<u64> {
    let page = super::file::page_size() as u64;
    if len <= EXACT_MAX {
        return Ok((resident_pages(f, 0, len)? * page).min(len));
    }
    // Window starts rounded down to a page, as mmap wants; a window is mapped alone, so a
    // process under an address-space limit (RLIMIT_AS) can still ask about a large file.
    let step = len / SAMPLES;
    let (mut asked, mut resident) = (0u64, 0u64);
    for i in 0..SAMPLES {
        let off = i * step / page * page;
        let n = SAMPLE_BYTES.min(len - off);
        asked += n.div_ceil(page);
        resident += resident_pages(f, off, n)?;
    }
    Ok((len as f64 * resident as f64 / asked.max(1) as f64) as u64)
}

/// Pages of `f`'s bytes `off .. off + n` (`off` page-aligned) in the page cache: one mapping
/// of that range, one `mincore`. Errors: the `mmap` or `mincore` error.
fn resident_pages(f: &File, off: u64, n: u64) -> std::io::Result<u64> {
    if n == 0 {
        return Ok(0);
    }
    let page = super::file::page_size() as u64;
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
    let mut vec = vec![0u8; n.div_ceil(page) as usize];
    // SAFETY: `addr` is the page-aligned start of a mapping of `map_len` bytes and `vec` holds
    // one byte per page of it, as mincore writes.
    let r = unsafe { libc::mincore(addr, map_len, vec.as_mut_ptr()) };
    let err = (r != 0).then(std::io::Error::last_os_error);
    // SAFETY: the mapping made above, unmapped once; no reference into it exists.
    unsafe { libc::munmap(addr, map_len) };
    match err {
        Some(e) => Err(e),
        None => Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64),
    }
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
    fn a_large_file_is_sampled_and_a_half_read_one_reads_about_half() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let len = EXACT_MAX * 2;
        let mut f = File::create(&p).unwrap();
        // A sparse file of which only the first half was written: the hole has no pages.
        f.write_all(&vec![7u8; (len / 2) as usize]).unwrap();
        f.seek(SeekFrom::Start(len - 1)).unwrap();
        f.write_all(&[1]).unwrap();
        drop(f);
        let r = resident_bytes(&File::open(&p).unwrap(), len).unwrap();
        // Just written: the first half's pages are cached (memory pressure could evict a few).
        let half = len / 2;
        assert!(r <= half + len / 64, "{r} of {len}");
        assert!(r >= half / 2, "{r} of {len}");
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
