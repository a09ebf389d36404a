//! The virtual memory management API: physical allocations (cuMemCreate), address reservations,
//! mappings and access rights.

use super::config::{GPU_PAGE, R, round_up};
use super::hostmap::trim;
use super::state::{Backend, Driver};
use super::tables::{Backing, Kind, Phys, Range, ResBacking, Reserve, TAG_PHYS, new_handle};
use crate::sys;
use crate::types::*;
use std::sync::Arc;

impl Driver {
    pub fn vmm_create(&self, size: u64, prop: &CUmemAllocationProp) -> R<u64> {
        if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            crate::log!("cuMemCreate: only pinned device allocations are simulated");
            return Err(if prop.type_ == CU_MEM_ALLOCATION_TYPE_PINNED {
                err::NOT_SUPPORTED
            } else {
                err::INVALID_VALUE
            });
        }
        self.check_device(prop.location.id)?;
        if prop.requested_handle_types & !CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 {
            return Err(err::NOT_SUPPORTED);
        }
        if size == 0 || size % GPU_PAGE != 0 {
            return Err(err::INVALID_VALUE);
        }
        let fd = match self.backend {
            Backend::Host => {
                self.host_reserve(size)?;
                match sys::memfd(c"cudasim-vmm", size) {
                    Ok(fd) => Some(Arc::new(fd)),
                    Err(e) => {
                        self.host_unreserve(size);
                        crate::log!("memfd for cuMemCreate failed: {e}");
                        return Err(err::OUT_OF_MEMORY);
                    }
                }
            }
            Backend::Gpusim(_) => None,
        };
        let h = new_handle(TAG_PHYS);
        self.tables().phys.insert(h, Phys { size, prop: *prop, fd, maps: 0, released: false });
        Ok(h)
    }

    pub fn vmm_release(&self, h: u64) -> R<()> {
        let mut t = self.tables();
        let p = t.phys.get_mut(&h).filter(|p| !p.released).ok_or(err::INVALID_VALUE)?;
        p.released = true;
        if p.maps == 0 {
            let p = t.phys.remove(&h).expect("present");
            drop(t);
            self.phys_free(p);
        }
        Ok(())
    }

    fn phys_free(&self, p: Phys) {
        if p.fd.is_some() {
            self.host_unreserve(p.size);
        }
    }

    pub fn vmm_reserve(&self, size: u64, align: u64, hint: u64, flags: u64) -> R<u64> {
        if size == 0 || size % GPU_PAGE != 0 || flags != 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(err::INVALID_VALUE);
        }
        let align = align.max(GPU_PAGE);
        let (base, backing) = match &self.backend {
            Backend::Host => {
                let len = size.checked_add(align).ok_or(err::OUT_OF_MEMORY)?;
                let mut got = None;
                if hint != 0 && hint % align == 0 {
                    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
                    let r = unsafe {
                        sys::mmap_raw(
                            hint,
                            size,
                            sys::PROT_NONE,
                            sys::MAP_PRIVATE | sys::MAP_ANONYMOUS | sys::MAP_NORESERVE | sys::MAP_FIXED_NOREPLACE,
                            -1,
                            0,
                        )
                    };
                    match r {
                        Ok(a) if a == hint => got = Some((hint, ResBacking::Host { addr: hint, len: size })),
                        // SAFETY: `a` is the mapping just created, referenced by nothing.
                        Ok(a) => drop(unsafe { sys::unmap(a, size) }),
                        Err(_) => {}
                    }
                }
                match got {
                    Some(g) => g,
                    None => {
                        let raw =
                            sys::mmap_anon(len, sys::PROT_NONE, sys::MAP_NORESERVE).map_err(|_| err::OUT_OF_MEMORY)?;
                        let base = round_up(raw, align).expect("within the mapping");
                        trim(raw, len, base, size);
                        (base, ResBacking::Host { addr: base, len: size })
                    }
                }
            }
            Backend::Gpusim(g) => {
                // The reservation is backed by a gpusim allocation so that its addresses are
                // real GPU VAs (what gdrdrv pins); see docs/cudasim.md for the consequence.
                if align > GPU_PAGE {
                    crate::log!("cuMemAddressReserve: alignment {align:#x} > 64 KiB is not simulated with gpusim");
                    return Err(err::NOT_SUPPORTED);
                }
                let va = g.alloc(size).map_err(|e| {
                    crate::log!("gpusim reservation of {size:#x} bytes failed: {e}");
                    err::OUT_OF_MEMORY
                })?;
                (va, ResBacking::Gpusim { va })
            }
        };
        self.tables().reserves.insert(base, Reserve { base, size, backing });
        Ok(base)
    }

    pub fn vmm_free_reservation(&self, ptr: u64, size: u64) -> R<()> {
        let mut t = self.tables();
        match t.reserves.get(&ptr) {
            Some(r) if r.size == size => {}
            _ => return Err(err::INVALID_VALUE),
        }
        if t.overlaps_any(ptr, ptr + size) {
            crate::log!("cuMemAddressFree: {ptr:#x}+{size:#x} still has mappings");
            return Err(err::INVALID_VALUE);
        }
        let r = t.reserves.remove(&ptr).expect("checked");
        drop(t);
        match r.backing {
            // SAFETY: the reservation is ours and nothing is mapped inside it any more.
            ResBacking::Host { addr, len } => drop(unsafe { sys::unmap(addr, len) }),
            ResBacking::Gpusim { va } => {
                if let Backend::Gpusim(g) = &self.backend {
                    let _ = g.free(va);
                }
            }
        }
        Ok(())
    }

    pub fn vmm_map(&self, ptr: u64, size: u64, offset: u64, h: u64, flags: u64) -> R<()> {
        if flags != 0 || size == 0 || ptr % GPU_PAGE != 0 || size % GPU_PAGE != 0 || offset % GPU_PAGE != 0 {
            return Err(err::INVALID_VALUE);
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        let inside = t.reserves.range(..=ptr).next_back().is_some_and(|(_, r)| end <= r.base + r.size);
        if !inside {
            crate::log!("cuMemMap: {ptr:#x}+{size:#x} is not inside a reservation");
            return Err(err::INVALID_VALUE);
        }
        if t.overlaps_any(ptr, end) {
            return Err(err::ALREADY_MAPPED);
        }
        let p = t.phys.get(&h).filter(|p| !p.released).ok_or(err::INVALID_HANDLE)?;
        if offset.checked_add(size).is_none_or(|e| e > p.size) {
            return Err(err::INVALID_VALUE);
        }
        let device = p.prop.location.id;
        match (&self.backend, &p.fd) {
            (Backend::Host, Some(fd)) => {
                // SAFETY: [ptr, end) lies in our PROT_NONE reservation with no mapping inside
                // (checked above), so replacing it affects nothing else.
                unsafe { sys::mmap_raw(ptr, size, sys::PROT_NONE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, offset) }
                    .map_err(|e| {
                        crate::log!("cuMemMap: mmap failed: {e}");
                        err::OUT_OF_MEMORY
                    })?;
            }
            (Backend::Gpusim(g), _) => {
                if p.maps > 0 || offset != 0 {
                    crate::log!("cuMemMap: with gpusim an allocation handle can be mapped once, at offset 0");
                    return Err(err::NOT_SUPPORTED);
                }
                g.map(ptr, size).map_err(|e| {
                    crate::log!("cuMemMap: gpusim mmap failed: {e}");
                    err::OUT_OF_MEMORY
                })?;
                // SAFETY: the mapping was just created by us; access starts as none, as CUDA's.
                let _ = unsafe { sys::protect(ptr, size, sys::PROT_NONE) };
            }
            (Backend::Host, None) => return Err(err::INVALID_HANDLE),
        }
        t.phys.get_mut(&h).expect("present").maps += 1;
        self.insert_range(&mut t, ptr, size, Kind::Vmm, 0, device, 0, Backing::Vmm { phys: h, offset, len: size });
        Ok(())
    }

    pub fn vmm_unmap(&self, ptr: u64, size: u64) -> R<()> {
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        let bases: Vec<u64> = t.ranges.range(ptr..end).map(|(b, _)| *b).collect();
        let straddles = t.find(ptr).is_some_and(|r| r.base < ptr) || t.find(end - 1).is_some_and(|r| r.end() > end);
        if bases.is_empty() || straddles || bases.iter().any(|b| t.ranges[b].kind != Kind::Vmm) {
            return Err(err::INVALID_VALUE);
        }
        let ranges: Vec<Range> = bases.iter().filter_map(|b| t.ranges.remove(b)).collect();
        drop(t);
        for r in ranges {
            self.release_range(r);
        }
        Ok(())
    }

    /// Unmaps one VMM mapping whose range was already removed and drained.
    pub(super) fn vmm_unmap_one(&self, base: u64, len: u64, phys: u64) {
        let res = if self.is_gpusim() {
            // SAFETY: the mapping is ours and drained; the reservation keeps its GPU VA.
            unsafe { sys::unmap(base, len) }
        } else {
            // SAFETY: restore the PROT_NONE reservation over our own mapping.
            unsafe {
                sys::mmap_raw(
                    base,
                    len,
                    sys::PROT_NONE,
                    sys::MAP_PRIVATE | sys::MAP_ANONYMOUS | sys::MAP_NORESERVE | sys::MAP_FIXED,
                    -1,
                    0,
                )
            }
            .map(|_| ())
        };
        if let Err(e) = res {
            crate::log!("unmapping VMM range {base:#x}+{len:#x} failed: {e}");
        }
        let mut t = self.tables();
        if let Some(p) = t.phys.get_mut(&phys) {
            p.maps -= 1;
            if p.maps == 0 && p.released {
                let p = t.phys.remove(&phys).expect("present");
                drop(t);
                self.phys_free(p);
            }
        }
    }

    pub fn vmm_set_access(&self, ptr: u64, size: u64, descs: &[CUmemAccessDesc]) -> R<()> {
        if descs.is_empty() || size == 0 {
            return Err(err::INVALID_VALUE);
        }
        let mut access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        for d in descs {
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(err::INVALID_VALUE);
            }
            self.check_device(d.location.id)?;
            if ![CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READWRITE]
                .contains(&d.flags)
            {
                return Err(err::INVALID_VALUE);
            }
            access |= d.flags;
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        // The range must be covered by whole VMM mappings, without holes.
        let mut cur = ptr;
        for (_, r) in t.ranges.range(..end) {
            if r.end() <= ptr {
                continue;
            }
            if r.kind != Kind::Vmm || r.base != cur {
                return Err(err::INVALID_VALUE);
            }
            cur = r.end();
        }
        if cur != end {
            return Err(err::INVALID_VALUE);
        }
        let prot = match access {
            CU_MEM_ACCESS_FLAGS_PROT_NONE => sys::PROT_NONE,
            CU_MEM_ACCESS_FLAGS_PROT_READ => sys::PROT_READ,
            _ => sys::PROT_READ | sys::PROT_WRITE,
        };
        // SAFETY: [ptr, end) consists of our own VMM mappings (checked above).
        unsafe { sys::protect(ptr, size, prot) }.map_err(|e| {
            crate::log!("cuMemSetAccess: mprotect failed: {e}");
            err::INVALID_VALUE
        })?;
        let bases: Vec<u64> = t.ranges.range(ptr..end).map(|(b, _)| *b).collect();
        for b in bases {
            t.ranges.get_mut(&b).expect("present").access = access;
        }
        Ok(())
    }
}
