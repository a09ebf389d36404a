//! Host-backend mappings: device memory in host mode is anonymous or memfd-backed memory at
//! 2 MiB-aligned addresses, made by over-reserving and trimming.

use super::config::{R, REGION_SIZE, round_up};
use crate::sys::{self, Fd};
use crate::types::*;

/// Trims a larger reservation `[raw, raw+len)` down to `[base, base+size)`.
pub(super) fn trim(raw: u64, len: u64, base: u64, size: u64) {
    // SAFETY: the head and tail lie inside the mapping we just made and nothing uses them.
    unsafe {
        if base > raw {
            let _ = sys::unmap(raw, base - raw);
        }
        if raw + len > base + size {
            let _ = sys::unmap(base + size, raw + len - (base + size));
        }
    }
}

/// Host-mode device memory: anonymous, 2 MiB aligned.
pub(super) fn host_map_anon(len: u64) -> R<u64> {
    let raw = sys::mmap_anon(len + REGION_SIZE, sys::PROT_READ | sys::PROT_WRITE, 0).map_err(|e| {
        crate::log!("mmap of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    let base = round_up(raw, REGION_SIZE).expect("within the mapping");
    trim(raw, len + REGION_SIZE, base, len);
    Ok(base)
}

/// Host-mode device memory backed by a memfd (so that it can be exported as a "dma-buf"), 2 MiB
/// aligned.
pub(super) fn host_map_memfd(len: u64) -> R<(u64, Fd)> {
    let fd = sys::memfd(c"cudasim-device", len).map_err(|e| {
        crate::log!("memfd of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    let raw = sys::mmap_anon(len + REGION_SIZE, sys::PROT_NONE, sys::MAP_NORESERVE).map_err(|_| err::OUT_OF_MEMORY)?;
    let base = round_up(raw, REGION_SIZE).expect("within the mapping");
    // SAFETY: [base, base+len) lies inside the PROT_NONE reservation just made.
    let r = unsafe {
        sys::mmap_raw(base, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, 0)
    };
    if let Err(e) = r {
        // SAFETY: our own reservation, unused.
        let _ = unsafe { sys::unmap(raw, len + REGION_SIZE) };
        crate::log!("mmap of the memfd failed: {e}");
        return Err(err::OUT_OF_MEMORY);
    }
    trim(raw, len + REGION_SIZE, base, len);
    Ok((base, fd))
}
