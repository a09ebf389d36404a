//! Registered ranges named by the `target_id` of peer operations (the provider seam, spec §4.7).
//!
//! A verbs provider (next issue) registers the doorbell record, BlueFlame page, CQ ring and peek
//! flags here and writes the returned ids into the `peer_op_wr`s it prepares. Upstream used the
//! address of a heap record as the id; we use numbers from a table, so a stale or garbage id is an
//! `EINVAL`, not a wild pointer, and every access is bounds-checked against the range.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gpudirect_common::{Errno, Result};

/// A range both the CPU and the GPU can address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub cpu: usize,
    pub dev: u64,
    pub len: usize,
}

impl Range {
    fn check(&self, offset: usize, size: usize) -> Result<()> {
        match offset.checked_add(size) {
            Some(e) if e <= self.len => Ok(()),
            _ => {
                gds_err!("gds_range", "access {offset}+{size} outside a registered range of {} bytes", self.len);
                Err(Errno::EINVAL)
            }
        }
    }
    /// Device address of `size` bytes at `offset`.
    pub fn dev_addr(&self, offset: usize, size: usize) -> Result<u64> {
        self.check(offset, size)?;
        Ok(self.dev + offset as u64)
    }
    /// CPU address of `size` bytes at `offset`.
    pub fn cpu_addr(&self, offset: usize, size: usize) -> Result<usize> {
        self.check(offset, size)?;
        Ok(self.cpu + offset)
    }
}

pub struct Ranges {
    map: Mutex<HashMap<u64, Range>>,
    next: AtomicU64,
}

impl Default for Ranges {
    fn default() -> Self {
        // Ids start far from small integers so that an uninitialised target_id is never valid.
        Ranges { map: Mutex::new(HashMap::new()), next: AtomicU64::new(0x6764_7300_0000_0001) }
    }
}

impl Ranges {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Range>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Registers a range and returns its non-zero id.
    pub fn register(&self, r: Range) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, r);
        id
    }
    pub fn unregister(&self, id: u64) -> Result<()> {
        self.lock().remove(&id).map(|_| ()).ok_or(Errno::EINVAL)
    }
    pub fn get(&self, id: u64) -> Result<Range> {
        self.lock().get(&id).copied().ok_or_else(|| {
            gds_err!("gds_range", "unknown target_id {id:#x}");
            Errno::EINVAL
        })
    }
}

/// The process-wide table.
pub fn ranges() -> &'static Ranges {
    static R: std::sync::OnceLock<Ranges> = std::sync::OnceLock::new();
    R.get_or_init(Ranges::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_resolve_and_bounds_are_checked() {
        let t = Ranges::default();
        let id = t.register(Range { cpu: 0x1000, dev: 0x9000, len: 64 });
        assert_ne!(id, 0);
        let r = t.get(id).unwrap();
        assert_eq!(r.dev_addr(60, 4).unwrap(), 0x903c);
        assert_eq!(r.cpu_addr(8, 8).unwrap(), 0x1008);
        assert_eq!(r.dev_addr(61, 4), Err(Errno::EINVAL));
        assert_eq!(r.dev_addr(usize::MAX, 4), Err(Errno::EINVAL));
        assert_eq!(t.get(0), Err(Errno::EINVAL));
        t.unregister(id).unwrap();
        assert_eq!(t.get(id), Err(Errno::EINVAL));
    }
}
