//! What a replaced file keeps: its owner and group where the writer may set them, its
//! permission bits, and its extended attributes (POSIX ACLs, SELinux labels, `user.*`).
//!
//! A replacement is a new inode renamed over the old name, so nothing of the old inode carries
//! over by itself: the new one is the writer's, with the writer's group and `umask`. Set-user-ID
//! and set-group-ID bits and file capabilities (`security.capability`) are not carried over: they
//! grant privilege to the program the file held, and the kernel drops them too when a file is
//! written (`file_remove_privs`).

use rustix::fs::{fchmod, fchown, fsetxattr, getxattr, listxattr, Gid, Mode, Uid, XattrFlags};
use rustix::io::Errno;
use std::ffi::CString;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// The most bytes of names `listxattr` and of one value `getxattr` return: the kernel's
/// `XATTR_LIST_MAX` and `XATTR_SIZE_MAX` (include/uapi/linux/limits.h, 64 KiB each).
const XATTR_MAX: usize = 65_536;

/// The attribute that is privilege, not description: dropped as set-user-ID is.
const CAPABILITY: &[u8] = b"security.capability";

/// A file's POSIX access ACL: its group entries apply to the file's owning group.
const ACCESS_ACL: &[u8] = b"system.posix_acl_access";

/// The attributes of a file being replaced, read just before the commit replaces it.
#[derive(Debug, Clone)]
pub(super) struct Kept {
    uid: u32,
    gid: u32,
    /// Permission bits only (`0o777`): set-id and sticky bits are dropped.
    mode: u32,
    /// Extended attributes (name, value) that the writer could read, but `security.capability`.
    xattrs: Vec<(CString, Vec<u8>)>,
}

impl Kept {
    /// The attributes of the file open as `old` (`O_PATH`), status `md`. Extended attributes
    /// are read through `/proc/self/fd/N` (an `O_PATH` descriptor has no `fgetxattr`); where
    /// `/proc` is missing or the file system has none, there are none to keep.
    pub(super) fn of(old: &File, md: &Metadata) -> Kept {
        Kept {
            uid: md.uid(),
            gid: md.gid(),
            mode: md.mode() & 0o777,
            xattrs: xattrs(&format!("/proc/self/fd/{}", old.as_raw_fd())),
        }
    }

    /// Gives `new` (the replacement, open for writing) these attributes, in the order that
    /// keeps each: owner and group first (a `chown` by a user who is not root clears set-id
    /// bits), then the mode, then the extended attributes (a POSIX ACL sets the group bits of
    /// the mode to its mask, as the old file had them).
    ///
    /// The owner: root (`CAP_CHOWN`) sets both; another writer gets `EPERM` for an owner
    /// other than itself and then keeps only the group, which `chown` allows when the writer
    /// is a member of it; failing that the new file stays the writer's and this carries on.
    /// Group bits (and the POSIX ACL, whose group entries would apply to the writer's group)
    /// are kept only with the group: where the new file has the writer's group instead, they
    /// would grant that group what the old file's group had, so they are cleared and the ACL
    /// is not copied. An extended attribute the file system or the writer's privilege refuses
    /// is skipped.
    ///
    /// Errors: the `fchmod`'s (the writer owns the new file, so it fails only on a file
    /// system that refuses modes).
    pub(super) fn apply(&self, new: &File) -> std::io::Result<()> {
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        let group_kept = match fchown(new, Some(uid), Some(gid)) {
            Ok(()) => true,
            Err(Errno::PERM) => {
                tracing::debug!(
                    "the replaced file's owner {} is not kept: the new file is the writer's",
                    self.uid
                );
                match fchown(new, None, Some(gid)) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!("the replaced file's group {} is not kept: {e}", self.gid);
                        false
                    }
                }
            }
            Err(e) => {
                tracing::debug!("the replaced file's owner and group are not kept: {e}");
                false
            }
        };
        let mode = if group_kept {
            self.mode
        } else {
            self.mode & !0o070
        };
        fchmod(new, Mode::from_raw_mode(mode))?;
        for (name, value) in &self.xattrs {
            if !group_kept && name.as_bytes() == ACCESS_ACL {
                continue;
            }
            if let Err(e) = fsetxattr(new, name.as_c_str(), value, XattrFlags::empty()) {
                tracing::debug!("extended attribute {name:?} not kept: {e}");
            }
        }
        Ok(())
    }
}

/// The extended attributes of the file at `path` (following links) that can be read, but
/// `security.capability`; none when they cannot be listed.
fn xattrs(path: &str) -> Vec<(CString, Vec<u8>)> {
    let mut names = vec![0u8; XATTR_MAX];
    let n = match listxattr(path, &mut names[..]) {
        Ok(n) => n,
        Err(e) => {
            if !matches!(e, Errno::OPNOTSUPP | Errno::NOENT) {
                tracing::debug!("extended attributes of {path} not read: {e}");
            }
            return Vec::new();
        }
    };
    let mut value = vec![0u8; XATTR_MAX];
    names[..n]
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty() && *name != CAPABILITY)
        .filter_map(|name| {
            let name = CString::new(name).ok()?;
            let len = getxattr(path, name.as_c_str(), &mut value[..]).ok()?;
            Some((name, value[..len].to_vec()))
        })
        .collect()
}
