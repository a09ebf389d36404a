//! The C side's view of instances and handles.
//!
//! Upstream hands out raw pointers and dereferences whatever comes back, so a stale or foreign
//! `gdr_t`/`gdr_mh_t` is undefined behaviour there. We keep every live one in a table and look it
//! up instead: an unknown value is EINVAL, never a dereference.
//!
//! The memory behind the pointers still has upstream's layout where upstream's own test programs
//! read it (spec §1.8): `struct gdr` with the gdrdrv fd at offset 0 (48 bytes), and the handle
//! record with the kernel handle at offset 24 (104 bytes). Freed handle records are quarantined
//! before their memory is reused, so a stale handle rarely aliases a new one.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use gpudirect_common::{Errno, Result};

use crate::abi::MappingType;
use crate::core::{Instance, Pin};

/// The first 48 bytes of upstream's `struct gdr`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct GdrHeader {
    pub fd: c_int,
    pub list_head: usize,
    pub page_size: usize,
    pub page_mask: usize,
    pub page_shift: u8,
    pub gdrdrv_version: u32,
    pub backend: u32,
}

/// Upstream's handle record (`gdr_memh_t`, 104 bytes); `gdr_mh_t.h` points at one of these.
#[repr(C)]
#[derive(Debug, Default)]
pub struct HandleRecord {
    pub next: usize,
    pub prev: usize,
    pub mapping_type: u32,
    /// Backend words from offset 24: gdrdrv stores the 32-bit kernel handle in the first.
    pub words: [u64; 10],
}

struct InstanceEntry {
    _header: Box<GdrHeader>,
    instance: Arc<Instance>,
}

struct HandleEntry {
    record: Box<HandleRecord>,
    pin: Arc<Pin>,
    owner: usize,
}

const QUARANTINE_LEN: usize = 4096;

static INSTANCES: LazyLock<Mutex<HashMap<usize, InstanceEntry>>> = LazyLock::new(Default::default);
static HANDLES: LazyLock<RwLock<HashMap<usize, HandleEntry>>> = LazyLock::new(Default::default);
static QUARANTINE: Mutex<VecDeque<Box<HandleRecord>>> = Mutex::new(VecDeque::new());

fn instances() -> std::sync::MutexGuard<'static, HashMap<usize, InstanceEntry>> {
    INSTANCES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers a new instance; returns the `gdr_t` value.
pub fn add_instance(instance: Instance) -> usize {
    let page = instance.page();
    let header = Box::new(GdrHeader {
        fd: instance.raw_fd(),
        list_head: 0,
        page_size: page.size,
        page_mask: page.mask(),
        page_shift: page.shift,
        gdrdrv_version: instance.recorded_driver_version(),
        backend: u32::from(instance.uses_dma_buf()),
    });
    let key = &*header as *const GdrHeader as usize;
    instances().insert(key, InstanceEntry { _header: header, instance: Arc::new(instance) });
    key
}

/// The instance behind a `gdr_t`.
pub fn instance(g: usize) -> Result<Arc<Instance>> {
    instances().get(&g).map(|e| e.instance.clone()).ok_or_else(|| {
        gdr_err!("invalid gdr_t {g:#x} (not open, or already closed)");
        Errno::EINVAL
    })
}

/// Unregisters an instance whose pins are all gone; returns it for the final drop.
pub fn remove_instance(g: usize) -> Option<Arc<Instance>> {
    instances().remove(&g).map(|e| e.instance)
}

/// Registers a pin of instance `owner`; returns the `gdr_mh_t.h` value.
pub fn add_handle(owner: usize, pin: Arc<Pin>) -> usize {
    // Always a fresh allocation: freed records wait in the quarantine, so the allocator cannot
    // hand a recently unpinned handle's address out again soon.
    let mut record = Box::<HandleRecord>::default();
    if let Some(h) = pin.kernel_handle() {
        // Upstream keeps the kernel handle as a uint32_t at offset 24.
        record.words[0] = u64::from(h as u32);
    }
    let key = &*record as *const HandleRecord as usize;
    HANDLES.write().unwrap_or_else(|p| p.into_inner()).insert(key, HandleEntry { record, pin, owner });
    key
}

/// The pin behind a handle, checking that it belongs to `g`.
pub fn handle_of(g: usize, h: usize) -> Result<Arc<Pin>> {
    let handles = HANDLES.read().unwrap_or_else(|p| p.into_inner());
    match handles.get(&h) {
        Some(e) if e.owner == g => Ok(e.pin.clone()),
        Some(_) => {
            gdr_err!("handle {h:#x} belongs to another gdr_t");
            Err(Errno::EINVAL)
        }
        None => {
            gdr_err!("invalid handle {h:#x} (not pinned, or already unpinned)");
            Err(Errno::EINVAL)
        }
    }
}

/// The pin behind a handle, whatever its instance (the copy functions take no `gdr_t`).
pub fn pin_of(h: usize) -> Result<Arc<Pin>> {
    let handles = HANDLES.read().unwrap_or_else(|p| p.into_inner());
    handles.get(&h).map(|e| e.pin.clone()).ok_or_else(|| {
        gdr_err!("invalid handle {h:#x} (not pinned, or already unpinned)");
        Errno::EINVAL
    })
}

/// Mirrors the mapping type into the record, where upstream keeps it.
pub fn note_mapping_type(h: usize, t: MappingType) {
    if let Some(e) = HANDLES.write().unwrap_or_else(|p| p.into_inner()).get_mut(&h) {
        e.record.mapping_type = t as u32;
    }
}

/// Drops the handles of `g` whose pins are unpinned. The pin's own flag decides, not a snapshot
/// of the instance's list, so a pin made by another thread meanwhile is never taken for dead.
pub fn forget_unpinned(g: usize) {
    let mut handles = HANDLES.write().unwrap_or_else(|p| p.into_inner());
    let dead: Vec<usize> =
        handles.iter().filter(|(_, e)| e.owner == g && e.pin.is_unpinned()).map(|(k, _)| *k).collect();
    let mut q = QUARANTINE.lock().unwrap_or_else(|p| p.into_inner());
    for k in dead {
        if let Some(e) = handles.remove(&k) {
            q.push_back(e.record);
            if q.len() > QUARANTINE_LEN {
                q.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn private_layouts_match_upstream_tests() {
        assert_eq!(size_of::<GdrHeader>(), 48);
        assert_eq!(offset_of!(GdrHeader, fd), 0);
        assert_eq!(offset_of!(GdrHeader, list_head), 8);
        assert_eq!(offset_of!(GdrHeader, page_size), 16);
        assert_eq!(offset_of!(GdrHeader, page_mask), 24);
        assert_eq!(offset_of!(GdrHeader, page_shift), 32);
        assert_eq!(offset_of!(GdrHeader, gdrdrv_version), 36);
        assert_eq!(offset_of!(GdrHeader, backend), 40);
        assert_eq!(size_of::<HandleRecord>(), 104);
        assert_eq!(offset_of!(HandleRecord, mapping_type), 16);
        assert_eq!(offset_of!(HandleRecord, words), 24);
    }

    #[test]
    fn unknown_values_are_rejected() {
        assert_eq!(instance(0x1234).unwrap_err(), Errno::EINVAL);
        assert_eq!(pin_of(0x5678).unwrap_err(), Errno::EINVAL);
        assert_eq!(handle_of(1, 0x5678).unwrap_err(), Errno::EINVAL);
    }
}
