//! Device and host memory: cuMemAlloc's sub-allocation from regions, cuMemFree and the pages it
//! releases, host allocations and registrations, and the release of any range.

use super::config::{GPU_PAGE, R, REGION_SIZE, SUBALLOC_ALIGN, round_up};
use super::hostmap::{host_map_anon, host_map_memfd};
use super::region::{Region, RegionMem, Seg, released_pages};
use super::state::{Backend, Driver};
use super::tables::{Backing, Kind, Range, Tables, lock};
use crate::gpusim;
use crate::sys;
use crate::types::*;
use std::collections::BTreeMap;
use std::sync::Arc;

impl Driver {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert_range(
        &self,
        t: &mut Tables,
        base: u64,
        size: u64,
        kind: Kind,
        ctx: u64,
        device: i32,
        flags: u32,
        backing: Backing,
    ) {
        let buffer_id = t.buffer_id();
        let access = if kind == Kind::Vmm { CU_MEM_ACCESS_FLAGS_PROT_NONE } else { CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        t.ranges.insert(
            base,
            Range { base, size, kind, ctx, device, buffer_id, sync_memops: false, flags, access, backing },
        );
    }

    /// cuMemAlloc, laid out as CUDA does: allocations below 2 MiB are carved (first fit, 256-byte
    /// granularity) from shared 2 MiB regions, so consecutive small allocations are adjacent and
    /// share 64 KiB GPU pages; larger ones get a 2 MiB-aligned region of their own.
    pub fn mem_alloc(&self, size: u64) -> R<u64> {
        if size == 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let large = size >= REGION_SIZE;
        let slot = round_up(size, if large { GPU_PAGE } else { SUBALLOC_ALIGN }).ok_or(err::OUT_OF_MEMORY)?;
        let _a = lock(&self.alloc_lock);
        if !large {
            let mut t = self.tables();
            let hit = t.regions.values().filter(|r| r.shared).find_map(|r| r.fit(slot).map(|off| (r.base, off)));
            if let Some((rb, off)) = hit {
                t.regions.get_mut(&rb).expect("found above").slots.insert(off, slot);
                let base = rb + off;
                self.insert_range(&mut t, base, size, Kind::Device, c.handle, c.device, 0, Backing::Sub { region: rb });
                return Ok(base);
            }
        }
        let mut region = self.region_create(if large { slot } else { REGION_SIZE }, !large)?;
        region.slots.insert(0, slot);
        let base = region.base;
        let mut t = self.tables();
        t.regions.insert(base, region);
        self.insert_range(&mut t, base, size, Kind::Device, c.handle, c.device, 0, Backing::Sub { region: base });
        Ok(base)
    }

    /// A new, empty region of `len` bytes (a 64 KiB multiple) at a 2 MiB-aligned address.
    fn region_create(&self, len: u64, shared: bool) -> R<Region> {
        let (base, mem) = match &self.backend {
            Backend::Gpusim(g) => {
                let va = match g.alloc_mapped(len, gpusim::ALLOC_ALIGN_2M) {
                    Err(e) if e.raw_os_error() == Some(sys::EINVAL) => {
                        crate::log!("gpusim.ko without GPUSIM_ALLOC_ALIGN_2M: regions only 64 KiB aligned");
                        g.alloc_mapped(len, 0)
                    }
                    r => r,
                }
                .map_err(|e| {
                    crate::log!("gpusim allocation of {len:#x} bytes failed: {e}");
                    if e.raw_os_error() == Some(sys::ENOMEM) { err::OUT_OF_MEMORY } else { err::UNKNOWN }
                })?;
                (va, RegionMem::Gpusim)
            }
            Backend::Host => {
                self.host_reserve(len)?;
                let m = if self.cfg.dmabuf {
                    host_map_memfd(len).map(|(addr, fd)| {
                        (addr, RegionMem::Memfd(vec![Seg { off: 0, len, fd: Arc::new(fd), exported: false }]))
                    })
                } else {
                    host_map_anon(len).map(|addr| (addr, RegionMem::Anon))
                };
                match m {
                    Ok(m) => m,
                    Err(e) => {
                        self.host_unreserve(len);
                        return Err(e);
                    }
                }
            }
        };
        Ok(Region { base, len, shared, slots: BTreeMap::new(), mem })
    }

    /// cuMemFree of one slot: the region goes with its last allocation. Until then, the 64 KiB
    /// GPU pages that no live allocation uses any more are released: gpusim runs the free
    /// callbacks of the pins on them (docs/cudasim.md). A page the freed bytes share with a live
    /// neighbour stays, so freeing one buffer never invalidates a pin of a buffer that lives.
    fn sub_free(&self, rb: u64, base: u64, size: u64) {
        let _a = lock(&self.alloc_lock);
        let mut t = self.tables();
        let Some(reg) = t.regions.get_mut(&rb) else { return };
        reg.slots.remove(&(base - rb));
        if !reg.slots.is_empty() {
            let released = released_pages(&reg.slots, base - rb, size);
            drop(t);
            if let Some((off, len)) = released
                && let Backend::Gpusim(g) = &self.backend
                && let Err(e) = g.invalidate(rb + off, len)
            {
                crate::log!("gpusim invalidation of freed {base:#x}+{size:#x} failed: {e}");
            }
            return;
        }
        let reg = t.regions.remove(&rb).expect("present");
        drop(t);
        // SAFETY: the region is ours, out of the tables, and every allocation in it was freed
        // and drained.
        if let Err(e) = unsafe { sys::unmap(reg.base, reg.len) } {
            crate::log!("munmap({:#x}, {:#x}) failed: {e}", reg.base, reg.len);
        }
        match (&self.backend, reg.mem) {
            (Backend::Gpusim(g), _) => {
                if let Err(e) = g.free(reg.base) {
                    crate::log!("gpusim free of {:#x} failed: {e}", reg.base);
                }
            }
            (Backend::Host, _) => self.host_unreserve(reg.len),
        }
    }

    pub(super) fn host_reserve(&self, len: u64) -> R<()> {
        let mut t = self.tables();
        if t.host_used.checked_add(len).is_none_or(|u| u > self.cfg.host_mem) {
            crate::log!(
                "out of simulated device memory ({len:#x} bytes asked, CUDASIM_MEM_SIZE={:#x})",
                self.cfg.host_mem
            );
            return Err(err::OUT_OF_MEMORY);
        }
        t.host_used += len;
        Ok(())
    }

    pub(super) fn host_unreserve(&self, len: u64) {
        let mut t = self.tables();
        t.host_used = t.host_used.saturating_sub(len);
    }

    /// Frees a range by its exact base address if it is of one of the given kinds.
    pub fn free_range(&self, base: u64, kinds: &[Kind], not_found: CUresult) -> R<()> {
        let mut t = self.tables();
        match t.ranges.get(&base) {
            Some(r) if kinds.contains(&r.kind) => {}
            _ => return Err(not_found),
        }
        let r = t.ranges.remove(&base).expect("checked above");
        drop(t);
        self.release_range(r);
        Ok(())
    }

    /// Drains streams off a removed range and releases its memory.
    pub(super) fn release_range(&self, r: Range) {
        self.drain(r.base, r.end());
        match r.backing {
            Backing::None => {}
            Backing::Anon { addr, len } => {
                // SAFETY: the range was removed from the table and no stream op touches it any
                // more; the mapping was created by us for this host allocation only.
                if let Err(e) = unsafe { sys::unmap(addr, len) } {
                    crate::log!("munmap({addr:#x}, {len:#x}) failed: {e}");
                }
            }
            Backing::Sub { region } => self.sub_free(region, r.base, r.size),
            Backing::Vmm { phys, offset: _, len } => self.vmm_unmap_one(r.base, len, phys),
        }
    }

    /// cuMemAllocHost / cuMemHostAlloc: page-aligned host memory, also a device pointer.
    pub fn host_alloc(&self, size: u64, flags: u32) -> R<u64> {
        if size == 0
            || flags & !(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED) != 0
        {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let len = round_up(size, sys::page_size()).ok_or(err::OUT_OF_MEMORY)?;
        let addr = sys::mmap_anon(len, sys::PROT_READ | sys::PROT_WRITE, 0).map_err(|e| {
            crate::log!("host allocation of {len:#x} bytes failed: {e}");
            err::OUT_OF_MEMORY
        })?;
        let mut t = self.tables();
        self.insert_range(
            &mut t,
            addr,
            size,
            Kind::Host,
            c.handle,
            c.device,
            flags | CU_MEMHOSTALLOC_DEVICEMAP,
            Backing::Anon { addr, len },
        );
        Ok(addr)
    }

    /// cuMemHostRegister: records the range; the memory itself is used in place.
    pub fn host_register(&self, p: u64, size: u64, flags: u32) -> R<()> {
        if p == 0 || size == 0 || flags & !0xf != 0 {
            return Err(err::INVALID_VALUE);
        }
        let end = p.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let c = self.current()?;
        if !sys::is_mapped(p, size) {
            crate::log!("cuMemHostRegister: {p:#x}+{size:#x} is not mapped memory");
            return Err(err::INVALID_VALUE);
        }
        let mut t = self.tables();
        if t.overlaps_any(p, end) {
            return Err(err::HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.insert_range(
            &mut t,
            p,
            size,
            Kind::Registered,
            c.handle,
            c.device,
            flags | CU_MEMHOSTREGISTER_DEVICEMAP,
            Backing::None,
        );
        Ok(())
    }
}
