//! The object tables: every context, allocation, stream, event, VMM handle and reservation the
//! driver hands out, looked up by handle or address. Plain data and lookups; the operations that
//! change them live with their concept (context, memory, vmm, ...).

use super::config::R;
use super::region::Region;
use crate::stream::{Event, Stream};
use crate::sys::Fd;
use crate::types::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Process-wide handle counter (never reset, so a handle from before a re-initialisation, e.g.
/// in a fork child, can never alias a new object).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
pub const TAG_CTX: u64 = 0x0c7a;
pub const TAG_STREAM: u64 = 0x057e;
pub const TAG_EVENT: u64 = 0x0e7e;
pub const TAG_PHYS: u64 = 0x0a11;

pub(super) fn new_handle(tag: u64) -> u64 {
    (tag << 44) | (NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) << 4)
}

pub struct Context {
    pub handle: u64,
    /// cuCtxGetId's answer: unique among all contexts of the process, never reused.
    pub id: u64,
    pub device: i32,
    pub flags: u32,
    pub primary: bool,
    pub(super) default_stream: Mutex<Option<Arc<Stream>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Device,
    Host,
    Registered,
    Vmm,
}

pub enum Backing {
    None,
    Anon {
        addr: u64,
        len: u64,
    },
    /// A cuMemAlloc allocation: a slot of the region at `region` (Tables::regions).
    Sub {
        region: u64,
    },
    Vmm {
        phys: u64,
        offset: u64,
        len: u64,
    },
}

/// One entry of the range table: device allocation, host allocation, registered host range or
/// VMM mapping.
pub struct Range {
    pub base: u64,
    pub size: u64,
    pub kind: Kind,
    pub ctx: u64,
    pub device: i32,
    pub buffer_id: u64,
    pub sync_memops: bool,
    pub flags: u32,
    /// CU_MEM_ACCESS_FLAGS_* (VMM mappings start with none; everything else is read-write).
    pub access: u32,
    pub backing: Backing,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
    pub fn is_device(&self) -> bool {
        matches!(self.kind, Kind::Device | Kind::Vmm)
    }
}

/// A VMM physical allocation (`CUmemGenericAllocationHandle`).
pub struct Phys {
    pub size: u64,
    pub prop: CUmemAllocationProp,
    /// Host mode: the memfd that holds the memory.
    pub fd: Option<Arc<Fd>>,
    pub maps: u32,
    pub released: bool,
}

// SAFETY: the only raw pointer in CUmemAllocationProp is an opaque Windows metadata pointer
// that cudasim stores but never dereferences.
unsafe impl Send for Phys {}

pub enum ResBacking {
    Host { addr: u64, len: u64 },
    Gpusim { va: u64 },
}

pub struct Reserve {
    pub base: u64,
    pub size: u64,
    pub backing: ResBacking,
}

#[derive(Default)]
pub struct PrimarySlot {
    pub handle: Option<u64>,
    pub refs: u32,
    pub flags: u32,
}

#[derive(Default)]
pub struct Tables {
    pub ctxs: HashMap<u64, Arc<Context>>,
    pub primary: Vec<PrimarySlot>,
    pub ranges: BTreeMap<u64, Range>,
    pub streams: HashMap<u64, Arc<Stream>>,
    pub events: HashMap<u64, Arc<Event>>,
    pub phys: HashMap<u64, Phys>,
    pub reserves: BTreeMap<u64, Reserve>,
    /// cuMemAlloc regions by base address.
    pub regions: BTreeMap<u64, Region>,
    pub host_used: u64,
    pub next_buffer_id: u64,
}

impl Tables {
    /// The range containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<&Range> {
        self.ranges.range(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    /// The cuMemAlloc region containing `addr`, if any.
    pub fn region(&self, addr: u64) -> Option<&Region> {
        self.regions.range(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    pub fn find_mut(&mut self, addr: u64) -> Option<&mut Range> {
        self.ranges.range_mut(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    /// Checks that `[addr, addr+len)` lies within one tracked range with the needed access.
    pub fn check(&self, addr: u64, len: u64, write: bool) -> R<&Range> {
        let r = self.find(addr).ok_or_else(|| {
            crate::log!("address {addr:#x} is not in any allocation or registered range");
            err::INVALID_VALUE
        })?;
        let end = addr.checked_add(len).ok_or(err::INVALID_VALUE)?;
        if end > r.end() {
            crate::log!("range {addr:#x}+{len:#x} runs past the end of allocation {:#x}+{:#x}", r.base, r.size);
            return Err(err::INVALID_VALUE);
        }
        let need = if write { CU_MEM_ACCESS_FLAGS_PROT_READWRITE } else { CU_MEM_ACCESS_FLAGS_PROT_READ };
        if r.access & need != need {
            crate::log!("range {addr:#x}+{len:#x} is not accessible (cuMemSetAccess)");
            return Err(err::INVALID_VALUE);
        }
        Ok(r)
    }

    pub(super) fn overlaps_any(&self, lo: u64, hi: u64) -> bool {
        self.ranges.range(..hi).next_back().is_some_and(|(_, r)| r.end() > lo)
    }

    pub(super) fn buffer_id(&mut self) -> u64 {
        self.next_buffer_id += 1;
        self.next_buffer_id
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning is ignored: table updates are single-step inserts/removes.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
