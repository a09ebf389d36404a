//! dma-buf export (cuMemGetHandleForAddressRange): kernel dma-bufs on gpusim; in host mode,
//! memfds that the region's pieces are re-cut into so that every export starts at offset 0.

use super::config::R;
use super::region::{RegionMem, Seg};
use super::state::{Backend, Driver};
use super::tables::{Backing, Kind};
use crate::gpusim::Gpusim;
use crate::sys::{self, Fd};
use crate::types::*;
use std::sync::Arc;

impl Driver {
    /// cuMemGetHandleForAddressRange (dma-buf fd).
    pub fn dmabuf_fd(&self, ptr: u64, size: u64, handle_type: u32, flags: u64) -> R<i32> {
        if !self.dmabuf() {
            crate::log!("dma-buf export needs gpusim, or CUDASIM_DMABUF=1 in host memory mode");
            return Err(err::NOT_SUPPORTED);
        }
        if handle_type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
            || flags & !CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE != 0
        {
            return Err(err::INVALID_VALUE);
        }
        let ps = sys::page_size();
        if size == 0 || ptr % ps != 0 || size % ps != 0 {
            return Err(err::INVALID_VALUE);
        }
        if let Backend::Gpusim(g) = &self.backend {
            return self.gpusim_dmabuf_fd(g, ptr, size, flags);
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        // A split or merge below copies memory of the region, also outside [ptr, end): let no
        // queued stream operation write the region meanwhile.
        let (lo, hi) = self.tables().region(ptr).map_or((ptr, end), |reg| (reg.base, reg.end()));
        self.drain(lo, hi.max(end));
        let mut t = self.tables();
        let fd = if let Some(r) = t.find(ptr).filter(|r| r.kind == Kind::Vmm) {
            let (fd, maplen) = match (&r.backing, r.base == ptr) {
                (Backing::Vmm { phys, offset: 0, len }, true) => match t.phys.get(phys).and_then(|p| p.fd.clone()) {
                    Some(fd) => (fd, *len),
                    None => return Err(err::INVALID_VALUE),
                },
                _ => {
                    crate::log!("dma-buf export of {ptr:#x}: only VMM mappings from their base are supported");
                    return Err(err::INVALID_VALUE);
                }
            };
            if size > maplen {
                return Err(err::INVALID_VALUE);
            }
            fd
        } else {
            let rb = match t.region(ptr) {
                Some(reg) if end <= reg.end() => reg.base,
                _ => {
                    crate::log!("dma-buf export of {ptr:#x}+{size:#x}: not inside one cuMemAlloc region");
                    return Err(err::INVALID_VALUE);
                }
            };
            let reg = t.regions.get_mut(&rb).expect("found above");
            let reg_len = reg.len;
            let RegionMem::Memfd(segs) = &mut reg.mem else { return Err(err::INVALID_VALUE) };
            host_export_seg(segs, (rb, reg_len), ptr, size)?
        };
        fd.dup_raw().map_err(|e| {
            crate::log!("dup of the allocation's memfd failed: {e}");
            err::OPERATING_SYSTEM
        })
    }

    /// On gpusim the kernel exports a real dma-buf of the BAR pages (kmod/gpusim), as NVIDIA's
    /// driver does; like it on a discrete x86 GPU, the PCIe mapping-type flag is refused.
    fn gpusim_dmabuf_fd(&self, g: &Gpusim, ptr: u64, size: u64, flags: u64) -> R<i32> {
        if flags & CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE != 0 {
            crate::log!("dma-buf export: the PCIe mapping type needs a coherent (Grace) platform");
            return Err(err::NOT_SUPPORTED);
        }
        let t = self.tables();
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        // Any range inside one region (it may start or end in a neighbour's bytes or a free
        // slot, as CUDA's sub-allocated memory does) or inside one VMM mapping.
        let ok = t.region(ptr).is_some_and(|reg| end <= reg.end())
            || t.find(ptr).is_some_and(|r| r.kind == Kind::Vmm && end <= r.end());
        drop(t);
        if !ok {
            crate::log!("dma-buf export of {ptr:#x}+{size:#x}: not inside one device allocation region");
            return Err(err::INVALID_VALUE);
        }
        g.export_dmabuf(ptr, size).map_err(|e| {
            crate::log!("gpusim dma-buf export of {ptr:#x}+{size:#x} failed: {e}");
            match e.raw_os_error() {
                Some(sys::EINVAL) => err::INVALID_VALUE,
                Some(sys::ENOMEM) | Some(sys::EMFILE) => err::OUT_OF_MEMORY,
                Some(sys::ENOTTY) => err::NOT_SUPPORTED, // a gpusim.ko without dma-buf export
                _ => err::OPERATING_SYSTEM,
            }
        })
    }
}

/// The memfd a host-memory dma-buf export of `[ptr, ptr+size)` hands out: offset 0 of the file is
/// `ptr`, and the region's own mapping of the range is that file, so device memory and every
/// mapping of the dma-buf share pages. `region` is (base, length).
///
/// CUDA exports any page range, overlapping earlier exports or not. Here a file's offset 0 must
/// be the export's start, so the region's memfd pieces are re-cut to fit: a piece nobody holds
/// any more (no descriptor and no mapping of it outside cudasim, `export_held`) may be split or
/// absorbed like one never exported, and an export from the start of a held piece may grow it over
/// the pieces behind it. What no memfd layout can give is two held exports that overlap with
/// different starts: a page lives at one offset of one file. That export is refused (on gpusim,
/// kernel dma-bufs cover any range).
fn host_export_seg(segs: &mut Vec<Seg>, region: (u64, u64), ptr: u64, size: u64) -> R<Arc<Fd>> {
    let rb = region.0;
    let (off, end) = (ptr - rb, ptr - rb + size);
    // An export nobody holds any more pins nothing.
    for s in segs.iter_mut().filter(|s| s.exported && s.off < end && off < s.off + s.len) {
        s.exported = export_held(&s.fd, region);
    }
    let mut i = segs.iter().position(|s| s.off <= off && off < s.off + s.len).ok_or(err::INVALID_VALUE)?;
    if segs[i].off != off {
        if segs[i].exported {
            crate::log!(
                "dma-buf export of {ptr:#x}: starts inside the exported range {:#x}+{:#x}, which is still held; \
                 host-memory dma-bufs (memfds) cannot overlap with different starts (use gpusim)",
                rb + segs[i].off,
                segs[i].len
            );
            return Err(err::INVALID_VALUE);
        }
        let tail = segs[i].off + segs[i].len - off;
        let fd = host_split(ptr, tail)?;
        segs[i].len = off - segs[i].off;
        i += 1;
        segs.insert(i, Seg { off, len: tail, fd: Arc::new(fd), exported: false });
    }
    // Runs past its piece: absorb the pieces behind it (a held one cannot be moved).
    while segs[i].off + segs[i].len < end {
        let j = i + 1;
        if segs[j].exported {
            crate::log!(
                "dma-buf export of {ptr:#x}+{size:#x}: runs into the exported range {:#x}+{:#x}, which is still held; \
                 host-memory dma-bufs (memfds) cannot overlap with different starts (use gpusim)",
                rb + segs[j].off,
                segs[j].len
            );
            return Err(err::INVALID_VALUE);
        }
        let (joff, jlen) = (segs[j].off, segs[j].len);
        if joff + jlen > end {
            let fd = host_split(rb + end, joff + jlen - end)?;
            segs[j].len = end - joff;
            segs.insert(j + 1, Seg { off: end, len: joff + jlen - end, fd: Arc::new(fd), exported: false });
        }
        let jlen = segs[j].len;
        host_move(rb + joff, jlen, &segs[i].fd, joff - off)?;
        segs[i].len += jlen;
        segs.remove(j);
    }
    // An export that is not held also splits at its end, so the rest of the region stays
    // exportable from any start while this one is held.
    let (soff, slen) = (segs[i].off, segs[i].len);
    if !segs[i].exported && end < soff + slen {
        let tail = soff + slen - end;
        let fd = host_split(rb + end, tail)?;
        segs[i].len = size;
        segs.insert(i + 1, Seg { off: end, len: tail, fd: Arc::new(fd), exported: false });
    }
    let s = &mut segs[i];
    s.exported = true;
    Ok(Arc::clone(&s.fd))
}

/// Whether the memfd `fd` of an exported piece is still held outside cudasim in this process: a
/// descriptor other than cudasim's own, or a mapping outside the region's own addresses (`region`
/// is base, length). A dma-buf passed to another process is not seen (a limit of host memory
/// mode; on gpusim the kernel keeps the dma-buf). When /proc cannot be read, it counts as held.
fn export_held(fd: &Fd, region: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(me) = std::fs::metadata(format!("/proc/self/fd/{}", fd.0)) else { return true };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return true };
    for e in dir.flatten() {
        if e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) == Some(fd.0) {
            continue;
        }
        if std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == me.dev() && m.ino() == me.ino()) {
            return true;
        }
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return true };
    let ino = me.ino().to_string();
    maps.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[4] != ino || !f[5].starts_with("/memfd:cudasim-device") {
            return false;
        }
        let Some((a, b)) = f[0].split_once('-') else { return true };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { return true };
        a < region.0 || b > region.0 + region.1
    })
}

/// Moves `[addr, addr+len)` (host-page aligned, our own shared mapping) into a new memfd mapped
/// at the same addresses, keeping the contents.
fn host_split(addr: u64, len: u64) -> R<Fd> {
    let fd = sys::memfd(c"cudasim-device", len).map_err(|e| {
        crate::log!("memfd of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    host_move(addr, len, &fd, 0)?;
    Ok(fd)
}

/// Moves `[addr, addr+len)` (host-page aligned, our own shared mapping of a piece nobody else
/// holds) to offset `file_off` of the memfd `fd`, mapped at the same addresses, keeping the
/// contents; the file grows to hold it (never shrinks: other mappings of it stay valid).
fn host_move(addr: u64, len: u64, fd: &Fd, file_off: u64) -> R<()> {
    let need = file_off + len;
    let have = std::fs::metadata(format!("/proc/self/fd/{}", fd.0)).map(|m| m.len()).unwrap_or(0);
    if have < need {
        sys::set_len(fd, need).map_err(|e| {
            crate::log!("growing a memfd to {need:#x} bytes failed: {e}");
            err::OUT_OF_MEMORY
        })?;
    }
    // SAFETY: a fresh shared mapping of the memfd at a kernel-chosen address.
    let tmp = unsafe { sys::mmap_raw(0, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED, fd.0, file_off) }
        .map_err(|_| err::OUT_OF_MEMORY)?;
    // SAFETY: [addr, addr+len) is mapped readable device memory of ours (a region piece) and
    // [tmp, tmp+len) the fresh mapping above; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, tmp as *mut u8, len as usize) };
    // SAFETY: our temporary mapping, referenced by nothing.
    let _ = unsafe { sys::unmap(tmp, len) };
    // SAFETY: [addr, addr+len) is our own region mapping of a piece no one else holds; replacing
    // it with the same contents from `fd` changes nothing anyone else sees.
    unsafe {
        sys::mmap_raw(addr, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, file_off)
    }
    .map_err(|e| {
        crate::log!("remapping {addr:#x}+{len:#x} onto a memfd failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    Ok(())
}
