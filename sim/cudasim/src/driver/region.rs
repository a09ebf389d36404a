//! The regions cuMemAlloc carves allocations from (docs/cudasim.md, Layout): slots, first fit,
//! which 64 KiB pages a free releases, and the memfd pieces of a host region whose ranges are
//! exported as dma-bufs.

use super::config::GPU_PAGE;
use crate::sys::Fd;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One piece of a host-backend region under `CUDASIM_DMABUF=1`: `[off, off+len)` of the region
/// is the memfd `fd` from its offset 0, so that a dup of `fd` is a "dma-buf" starting at `off`.
pub struct Seg {
    pub off: u64,
    pub len: u64,
    pub fd: Arc<Fd>,
    /// Handed out by cuMemGetHandleForAddressRange and, when last looked, still held outside
    /// cudasim: not split or moved (its fd must keep sharing memory with the device range).
    pub exported: bool,
}

pub enum RegionMem {
    /// Host backend: anonymous memory.
    Anon,
    /// Host backend with dma-buf export: memfds, re-cut at export bounds (see host_export_seg).
    Memfd(Vec<Seg>),
    /// One gpusim allocation, mapped at its GPU VA.
    Gpusim,
}

/// The 64 KiB pages of a freed slot `[off, off + size)` of a region that none of the live
/// `slots` (offset -> length) touches: `(offset, length)` in the region, or `None`.
pub fn released_pages(slots: &BTreeMap<u64, u64>, off: u64, size: u64) -> Option<(u64, u64)> {
    let used = |page: u64| slots.range(..page + GPU_PAGE).next_back().is_some_and(|(&o, &l)| o + l > page);
    let mut first = off & !(GPU_PAGE - 1);
    let mut end = (off + size).div_ceil(GPU_PAGE) * GPU_PAGE;
    if used(first) {
        first += GPU_PAGE;
    }
    if end > first && used(end - GPU_PAGE) {
        end -= GPU_PAGE;
    }
    (end > first).then(|| (first, end - first))
}

/// A stretch of device memory that cuMemAlloc sub-allocates from, as CUDA does: a 2 MiB region
/// shared by small allocations (`shared`), or a large allocation's own region.
pub struct Region {
    pub base: u64,
    pub len: u64,
    pub shared: bool,
    /// Allocated slots: offset -> length (the requested size rounded up to 256 bytes).
    pub slots: BTreeMap<u64, u64>,
    pub mem: RegionMem,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.base + self.len
    }

    /// First fit: the lowest offset with `need` free bytes.
    pub(super) fn fit(&self, need: u64) -> Option<u64> {
        let mut cur = 0;
        for (&off, &len) in &self.slots {
            if off - cur >= need {
                return Some(cur);
            }
            cur = off + len;
        }
        (self.len - cur >= need).then_some(cur)
    }
}
