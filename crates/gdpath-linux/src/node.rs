//! This node's identity: the kernel's boot id, which every process and container of one
//! running kernel shares, so that two agents can tell whether they share memory-sharing
//! mechanisms (CUDA IPC handles, shared host memory).

use std::sync::OnceLock;

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`, a UUID) as 16 bytes, read once;
/// `None` when unreadable.
pub fn boot_id() -> Option<[u8; 16]> {
    static ID: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    *ID.get_or_init(|| {
        let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        parse_uuid(s.trim())
    })
}

/// The 16 bytes of a UUID in its text form (`19fd02f2-95a0-4080-9be3-09aa8fea0051`).
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_ids_parse_as_uuids() {
        assert_eq!(
            parse_uuid("19fd02f2-95a0-4080-9be3-09aa8fea0051"),
            Some([
                0x19, 0xfd, 0x02, 0xf2, 0x95, 0xa0, 0x40, 0x80, 0x9b, 0xe3, 0x09, 0xaa, 0x8f, 0xea,
                0x00, 0x51
            ])
        );
        assert_eq!(parse_uuid("19fd02f2"), None);
        assert_eq!(parse_uuid("zzfd02f2-95a0-4080-9be3-09aa8fea0051"), None);
        if std::path::Path::new("/proc/sys/kernel/random/boot_id").exists() {
            assert!(boot_id().is_some());
        }
    }
}
