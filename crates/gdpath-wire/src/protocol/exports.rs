//! The regions an agent exports, as the protocol sees them: what the metadata lists, what
//! packed writes are checked against, and which withdrawn regions peers still hold.
//!
//! Only exported regions are listed; a withdrawn one stays held ([`Exports::retiring`]) until
//! every peer it was withdrawn from acknowledged or went away, and only then is
//! [`Action::Release`] given: memory is never freed under a peer's operation in flight.

use super::Action;
use crate::codec::{self, Metadata, RegionMeta, WireKind, WritesStatus};
use std::collections::{BTreeMap, HashSet};

/// A withdrawn region: held until the connections in `waiting` acknowledged or ended.
#[derive(Debug, Clone)]
struct Retiring {
    id: u64,
    waiting: HashSet<u64>,
}

/// The export table of one agent.
#[derive(Debug, Clone, Default)]
pub struct Exports {
    live: BTreeMap<u64, RegionMeta>,
    retiring: Vec<Retiring>,
}

impl Exports {
    /// Adds a region. Errors (the text says why) when its id is exported or still held.
    pub fn add(&mut self, meta: RegionMeta) -> Result<(), String> {
        if self.holds(meta.id) {
            return Err(format!("region {} is already exported", meta.id));
        }
        self.live.insert(meta.id, meta);
        Ok(())
    }

    /// Takes a live region out (undoes [`Exports::add`] without a withdrawal).
    pub fn remove(&mut self, id: u64) -> Option<RegionMeta> {
        self.live.remove(&id)
    }

    /// Withdraws live region `id` from the connections in `reached` (those told): it stays held
    /// until each acknowledged or ended; with none, [`Action::Release`] at once. Returns false
    /// when `id` is not live.
    pub fn withdraw(
        &mut self,
        id: u64,
        reached: impl IntoIterator<Item = u64>,
        out: &mut Vec<Action>,
    ) -> bool {
        if self.live.remove(&id).is_none() {
            return false;
        }
        let waiting: HashSet<u64> = reached.into_iter().collect();
        if waiting.is_empty() {
            out.push(Action::Release(id));
        } else {
            self.retiring.push(Retiring { id, waiting });
        }
        true
    }

    /// Whether `id` is exported or held for a withdrawal.
    pub fn holds(&self, id: u64) -> bool {
        self.live.contains_key(&id) || self.retiring.iter().any(|r| r.id == id)
    }

    /// The live region `id`.
    pub fn get(&self, id: u64) -> Option<&RegionMeta> {
        self.live.get(&id)
    }

    /// The metadata peers receive: `name` (cut to [`codec::AGENT_NAME_CHARS`]) and the live
    /// regions.
    pub fn metadata(&self, name: &str) -> Metadata {
        Metadata {
            name: name.chars().take(codec::AGENT_NAME_CHARS).collect(),
            regions: self.live.values().cloned().collect(),
        }
    }

    /// Withdrawn regions still held.
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Connection `conn` acknowledged the withdrawal of `ids`.
    pub(crate) fn acked(&mut self, conn: u64, ids: &[u64], out: &mut Vec<Action>) {
        for r in &mut self.retiring {
            if ids.contains(&r.id) {
                r.waiting.remove(&conn);
            }
        }
        self.release(out);
    }

    /// Connection `conn` ended: nothing of it can be in flight any more.
    pub(crate) fn conn_gone(&mut self, conn: u64, out: &mut Vec<Action>) {
        for r in &mut self.retiring {
            r.waiting.remove(&conn);
        }
        self.release(out);
    }

    fn release(&mut self, out: &mut Vec<Action>) {
        self.retiring.retain(|r| {
            if r.waiting.is_empty() {
                out.push(Action::Release(r.id));
            }
            !r.waiting.is_empty()
        });
    }

    /// Checks packed writes against live export `region` before any byte is copied: host
    /// memory, every write inside the region, exactly the bytes the writes add up to. The
    /// answer when they cannot be made: the region not exported (or withdrawn), or refused
    /// with the reason.
    pub fn check_writes(
        &self,
        region: u64,
        records: &[(u64, u32)],
        data_len: usize,
    ) -> Result<(), WritesStatus> {
        let total: u64 = records.iter().map(|&(_, l)| u64::from(l)).sum();
        if total != data_len as u64 {
            return Err(WritesStatus::Refused(format!(
                "the writes add up to {total} bytes and {data_len} came"
            )));
        }
        let m = self.live.get(&region).ok_or(WritesStatus::NotExported)?;
        if m.kind != WireKind::Host {
            return Err(WritesStatus::Refused(format!(
                "region {region} is {} memory: packed writes are for host memory",
                m.kind
            )));
        }
        for &(off, len) in records {
            if off.checked_add(len.into()).is_none_or(|end| end > m.len) {
                return Err(WritesStatus::Refused(format!(
                    "write at {off} of {len} bytes is past the end of region {region} ({} bytes)",
                    m.len
                )));
            }
        }
        Ok(())
    }
}
