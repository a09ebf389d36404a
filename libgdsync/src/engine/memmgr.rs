//! The registration cache (spec §4.5): host and I/O memory handed to stream APIs is registered with
//! `cuMemHostRegister` once and translated to a device address; GPU memory is used as is.
//!
//! Intervals are page-aligned closed ranges `[start, end]`, disjoint, keyed by start. Unlike
//! upstream, registrations this library made for its own allocations are undone when those
//! allocations are freed (`release`), and the cache is behind a mutex.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gpudirect_common::{Errno, Result};

use crate::abi::{GDS_MEMORY_GPU, GDS_MEMORY_HOST, GDS_MEMORY_IO};
use crate::cuda::*;
use crate::engine::memo::{self, Memo};

/// Page size used for host and I/O registrations (fixed, as upstream).
pub const HOST_PAGE: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Interval {
    end: usize,
    dev_base: u64,
    /// We called cuMemHostRegister for it (false when CUDA said "already registered").
    owned: bool,
}

/// Result of looking a byte range up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Contained(u64),
    Partial,
    NotFound,
}

pub struct MemMgr {
    map: Mutex<BTreeMap<usize, Interval>>,
    /// Distinguishes caches in the per-thread memo (tests make several).
    id: u64,
    /// Bumped whenever an interval is added or removed: a memo taken under an older value is not
    /// used (its gap may hold a registration now, its interval may be gone).
    generation: AtomicU64,
}

impl Default for MemMgr {
    fn default() -> Self {
        // From 1: id 0 is the empty memo's (memo::Memo).
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        MemMgr { map: Mutex::default(), id: NEXT_ID.fetch_add(1, Ordering::Relaxed), generation: AtomicU64::new(0) }
    }
}

/// A memo is only as good as the cache state it was taken in: `release` removes the interval
/// under the lock and bumps the generation before undoing the registration, and a new
/// registration bumps it too, so a memo taken before either is never used after it (a
/// translation racing the change itself can return the old answer either way, with or without
/// the memo, as in upstream). `gpu`: the word is GPU memory, which the memo's gap may answer.
#[inline(always)]
fn memo_get(m: &Memo, mm: &MemMgr, start: usize, end: usize, gpu: bool) -> Option<u64> {
    if m.mm != mm.id || m.generation != mm.generation.load(Ordering::Acquire) {
        return None;
    }
    if m.start <= start && end <= m.end {
        return Some(m.dev_base + (start - m.start) as u64);
    }
    (gpu && m.gap_start <= start && end <= m.gap_end).then_some(start as u64)
}

fn lookup_in(map: &BTreeMap<usize, Interval>, start: usize, end: usize) -> Lookup {
    match map.range(..=end).next_back() {
        Some((&s, iv)) if iv.end >= start => {
            if s <= start && end <= iv.end {
                Lookup::Contained(iv.dev_base + (start - s) as u64)
            } else {
                Lookup::Partial
            }
        }
        _ => Lookup::NotFound,
    }
}

impl MemMgr {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Interval>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    pub fn lookup(&self, ptr: usize, size: usize) -> Lookup {
        lookup_in(&self.lock(), ptr, ptr + size.max(1) - 1)
    }

    /// Translates `[ptr, ptr+size)` of memory type `mem_type` into a device address, registering
    /// host/I/O memory on first use (`gds_map_mem`). A repeat of this thread's last translation
    /// is answered inline from the memo; everything else (and every error) goes the full way,
    /// out of line, so that a post's translations inline the memo test alone and need no stack
    /// frame of their own.
    #[inline(always)]
    pub fn map_mem(&self, cuda: &dyn Cuda, ptr: usize, size: usize, mem_type: i32) -> Result<u64> {
        if matches!(mem_type, GDS_MEMORY_GPU | GDS_MEMORY_HOST | GDS_MEMORY_IO)
            && let Some(d) = self.remembered(ptr, size, mem_type)
        {
            return Ok(d);
        }
        self.map_mem_locked(cuda, ptr, size, mem_type)
    }

    /// The device address of `[ptr, ptr + size)` of memory type `mem_type` if this thread's memo
    /// holds it (no lock, no registration, no log line; `None` for anything else, including a
    /// NULL `ptr`).
    #[inline(always)]
    pub fn remembered(&self, ptr: usize, size: usize, mem_type: i32) -> Option<u64> {
        self.remembered_by(&memo::get(), ptr, size, mem_type)
    }

    /// [`MemMgr::remembered`] with this thread's memo read already (one thread-local access for
    /// all the words of a post).
    #[inline(always)]
    pub fn remembered_by(&self, memo: &Memo, ptr: usize, size: usize, mem_type: i32) -> Option<u64> {
        let end = ptr.checked_add(size.max(1) - 1).filter(|_| ptr != 0)?;
        memo_get(memo, self, ptr, end, mem_type == GDS_MEMORY_GPU)
    }

    #[inline(never)]
    fn map_mem_locked(&self, cuda: &dyn Cuda, ptr: usize, size: usize, mem_type: i32) -> Result<u64> {
        const F: &str = "gds_map_mem";
        if ptr == 0 {
            gds_err!(F, "NULL pointer");
            return Err(Errno::EINVAL);
        }
        let Some(end) = ptr.checked_add(size.max(1) - 1) else {
            gds_err!(F, "range {ptr:#x}+{size} wraps around");
            return Err(Errno::EINVAL);
        };
        let flags = match mem_type {
            GDS_MEMORY_GPU => 0,
            GDS_MEMORY_HOST => CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE,
            GDS_MEMORY_IO => CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_IOMEMORY,
            t => {
                gds_err!(F, "invalid memory type {t:#x}");
                return Err(Errno::EINVAL);
            }
        };
        let mut map = self.lock();
        // This thread's memo at the cache's present generation: kept where it is of it, blank
        // otherwise; the answer found here then goes into it.
        let here = |generation: u64| {
            let m = memo::get();
            if m.mm == self.id && m.generation == generation { m } else { Memo::blank(self.id, generation) }
        };
        let generation = self.generation.load(Ordering::Acquire);
        match lookup_in(&map, ptr, end) {
            Lookup::Contained(d) => {
                if let Some((&start, iv)) = map.range(..=ptr).next_back() {
                    memo::put(Memo { start, end: iv.end, dev_base: iv.dev_base, ..here(generation) });
                }
                return Ok(d);
            }
            Lookup::Partial => {
                gds_err!(F, "range {ptr:#x}+{size} partially overlaps a registered range");
                return Err(Errno::EINVAL);
            }
            Lookup::NotFound => {}
        }
        if mem_type == GDS_MEMORY_GPU {
            // GPU memory is used as it is; remember the gap between the registrations around it.
            let gap_start = map.range(..ptr).next_back().map_or(0, |(_, iv)| iv.end + 1);
            let gap_end = end.checked_add(1).and_then(|e| map.range(e..).next()).map_or(usize::MAX, |(&s, _)| s - 1);
            memo::put(Memo { gap_start, gap_end, ..here(generation) });
            return Ok(ptr as u64);
        }
        let page = ptr & !(HOST_PAGE - 1);
        let Some(len) = (end - page + 1).checked_next_multiple_of(HOST_PAGE) else {
            return Err(Errno::EINVAL);
        };
        let owned = match cuda.mem_host_register(page, len, flags) {
            Ok(()) => true,
            Err(r @ (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED | CUDA_ERROR_ALREADY_MAPPED)) => {
                gds_warn!(F, "range {page:#x}+{len} was already registered with CUDA ({r}), using it");
                false
            }
            Err(CUDA_ERROR_NOT_INITIALIZED) => {
                gds_err!(F, "cuMemHostRegister: CUDA is not initialised");
                return Err(Errno::EAGAIN);
            }
            Err(r) => {
                gds_err!(F, "cuMemHostRegister({page:#x}, {len}, {flags:#x}) failed: {} ({r})", cuda.error_string(r));
                return Err(Errno::EINVAL);
            }
        };
        let dev = match cuda.mem_host_get_device_pointer(page) {
            Ok(d) => d,
            Err(r) => {
                gds_err!(F, "cuMemHostGetDevicePointer({page:#x}) failed: {} ({r})", cuda.error_string(r));
                if owned {
                    let _ = cuda.mem_host_unregister(page);
                }
                return Err(Errno::EINVAL);
            }
        };
        gds_dbg!(F, "registered {page:#x}+{len} type {mem_type} -> dev {dev:#x}");
        let iv = Interval { end: page + len - 1, dev_base: dev, owned };
        map.insert(page, iv);
        // Under the lock: every memo's gap taken before this may hold the new interval.
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        memo::put(Memo { start: page, end: iv.end, dev_base: dev, ..Memo::blank(self.id, generation) });
        Ok(dev + (ptr - page) as u64)
    }

    /// Forgets the interval starting at `page` and undoes its registration if we made it.
    pub fn release(&self, cuda: &dyn Cuda, page: usize) -> Result<()> {
        let iv = {
            let mut map = self.lock();
            let iv = map.remove(&page).ok_or(Errno::EINVAL)?;
            self.generation.fetch_add(1, Ordering::AcqRel);
            iv
        };
        let undone = if iv.owned { cuda.mem_host_unregister(page) } else { Ok(()) };
        if let Err(r) = undone {
            gds_warn!("gds_unmap_mem", "cuMemHostUnregister({page:#x}) failed: {r}");
        }
        Ok(())
    }

    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.lock().len()
    }
}

/// The process-wide cache.
pub fn memmgr() -> &'static MemMgr {
    static M: std::sync::OnceLock<MemMgr> = std::sync::OnceLock::new();
    M.get_or_init(MemMgr::default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testcuda::{DEV_OFFSET, FakeCuda};

    #[test]
    fn host_memory_is_registered_once_per_page_range() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        let p = 0x10_0010usize;
        assert_eq!(m.map_mem(&cuda, p, 4, GDS_MEMORY_HOST).unwrap(), p as u64 + DEV_OFFSET);
        assert_eq!(cuda.registered(), vec![(0x10_0000, 4096, 3)]);
        // Another word in the same page: cached, no new registration.
        assert_eq!(m.map_mem(&cuda, p + 0x100, 4, GDS_MEMORY_HOST).unwrap(), (p + 0x100) as u64 + DEV_OFFSET);
        assert_eq!(cuda.registered().len(), 1);
        // A range straddling the cached page: partial overlap.
        assert_eq!(m.map_mem(&cuda, 0x10_0ff0, 0x20, GDS_MEMORY_HOST), Err(Errno::EINVAL));
        // I/O memory gets the IOMEMORY flag; the length covers the page-offset.
        m.map_mem(&cuda, 0x20_0ffc, 8, GDS_MEMORY_IO).unwrap();
        assert_eq!(cuda.registered()[1], (0x20_0000, 8192, 7));
    }

    #[test]
    fn gpu_memory_is_identity_and_bad_types_fail() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        assert_eq!(m.map_mem(&cuda, 0x7777_0000, 4, GDS_MEMORY_GPU).unwrap(), 0x7777_0000);
        assert!(cuda.registered().is_empty());
        assert_eq!(m.map_mem(&cuda, 0x1000, 4, 0), Err(Errno::EINVAL));
        assert_eq!(m.map_mem(&cuda, 0x1000, 4, 3), Err(Errno::EINVAL));
        assert_eq!(m.map_mem(&cuda, 0, 4, GDS_MEMORY_HOST), Err(Errno::EINVAL));
        assert_eq!(m.map_mem(&cuda, usize::MAX - 1, 4, GDS_MEMORY_HOST), Err(Errno::EINVAL));
    }

    #[test]
    fn cuda_register_errors_map_like_upstream() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        cuda.set_register_result(Some(CUDA_ERROR_NOT_INITIALIZED));
        assert_eq!(m.map_mem(&cuda, 0x5000, 4, GDS_MEMORY_HOST), Err(Errno::EAGAIN));
        cuda.set_register_result(Some(999));
        assert_eq!(m.map_mem(&cuda, 0x5000, 4, GDS_MEMORY_HOST), Err(Errno::EINVAL));
        assert_eq!(m.entries(), 0, "failures cache nothing");
        cuda.set_register_result(Some(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED));
        assert!(m.map_mem(&cuda, 0x5000, 4, GDS_MEMORY_HOST).is_ok());
        // Not ours: releasing it must not unregister.
        m.release(&cuda, 0x5000).unwrap();
        assert!(cuda.unregistered().is_empty());
    }

    #[test]
    fn memo_serves_repeats_and_dies_with_a_release() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        let p = 0x40_0100usize;
        let d = m.map_mem(&cuda, p, 4, GDS_MEMORY_HOST).unwrap();
        // Poison the locked map: only the memo can answer now.
        let saved = std::mem::take(&mut *m.lock());
        assert_eq!(m.map_mem(&cuda, p + 8, 4, GDS_MEMORY_HOST).unwrap(), d + 8, "memo hit");
        assert_eq!(cuda.registered().len(), 1);
        *m.lock() = saved;
        // Another cache's memo is not ours.
        let other = MemMgr::default();
        other.map_mem(&cuda, p, 4, GDS_MEMORY_HOST).unwrap();
        assert_eq!(cuda.registered().len(), 2, "a second cache registers for itself");
        // After a release the memo must not answer: the range is registered again.
        m.release(&cuda, 0x40_0000).unwrap();
        m.map_mem(&cuda, p, 4, GDS_MEMORY_HOST).unwrap();
        assert_eq!(cuda.registered().len(), 3, "released range re-registered, not served from the memo");
        // A range leaving the memo's interval goes to the map (partial overlap is still refused).
        assert_eq!(m.map_mem(&cuda, 0x40_0ffc, 8, GDS_MEMORY_HOST), Err(Errno::EINVAL));
        // Invalid arguments are refused before the memo is consulted.
        assert_eq!(m.map_mem(&cuda, p, 4, 0), Err(Errno::EINVAL));
    }

    #[test]
    fn gpu_words_are_remembered_until_a_registration_changes_the_gaps() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        m.map_mem(&cuda, 0x10_0000, 4, GDS_MEMORY_HOST).unwrap();
        let g = 0x50_0000usize;
        assert_eq!(m.map_mem(&cuda, g, 4, GDS_MEMORY_GPU), Ok(g as u64));
        // Poison the locked map: only the memo can answer now.
        let saved = std::mem::take(&mut *m.lock());
        assert_eq!(m.remembered(g + 0x1000, 4, GDS_MEMORY_GPU), Some(g as u64 + 0x1000), "anywhere in the gap");
        assert_eq!(m.remembered(0x10_1000, 4, GDS_MEMORY_GPU), Some(0x10_1000), "the gap starts after the page");
        assert_eq!(m.remembered(0x10_0ffc, 4, GDS_MEMORY_GPU), Some(0x10_0ffc + DEV_OFFSET), "the interval is kept");
        assert_eq!(m.remembered(g, 4, GDS_MEMORY_HOST), None, "host memory there is registered, not used as is");
        assert_eq!(m.remembered(g, 4, GDS_MEMORY_IO), None);
        *m.lock() = saved;
        // A registration in the gap ends every memo taken before it, other threads' too.
        let (taken, registered) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|t| {
            t.spawn(|| {
                assert_eq!(m.map_mem(&cuda, g, 4, GDS_MEMORY_GPU), Ok(g as u64));
                assert_eq!(m.remembered(g + 0x2000, 4, GDS_MEMORY_GPU), Some(g as u64 + 0x2000));
                taken.wait();
                registered.wait();
                assert_eq!(m.remembered(g + 0x2000, 4, GDS_MEMORY_GPU), None, "not used as is any more");
            });
            taken.wait();
            m.map_mem(&cuda, g + 0x2000, 4, GDS_MEMORY_HOST).unwrap();
            registered.wait();
        });
        assert_eq!(m.remembered(g, 4, GDS_MEMORY_GPU), None, "the gap may hold the new registration");
        assert_eq!(m.map_mem(&cuda, g + 0x2000, 4, GDS_MEMORY_GPU), Ok((g + 0x2000) as u64 + DEV_OFFSET));
        assert_eq!(m.map_mem(&cuda, g, 4, GDS_MEMORY_GPU), Ok(g as u64));
        assert_eq!(m.remembered(g + 0x1ffc, 4, GDS_MEMORY_GPU), Some(g as u64 + 0x1ffc), "up to the new page");
        assert_eq!(m.remembered(g + 0x1ffe, 4, GDS_MEMORY_GPU), None, "not across it");
        assert_eq!(m.map_mem(&cuda, g + 0x1ffe, 4, GDS_MEMORY_GPU), Err(Errno::EINVAL), "partial overlap");
        // A word that ends at the top of the address space (no overflow finding the gap).
        assert_eq!(m.map_mem(&cuda, usize::MAX - 3, 4, GDS_MEMORY_GPU), Ok(usize::MAX as u64 - 3));
        assert_eq!(m.remembered(usize::MAX - 3, 4, GDS_MEMORY_GPU), Some(usize::MAX as u64 - 3));
        // And a release ends it too.
        m.release(&cuda, g + 0x2000).unwrap();
        assert_eq!(m.remembered(g, 4, GDS_MEMORY_GPU), None);
    }

    #[test]
    fn release_undoes_our_registration() {
        let cuda = FakeCuda::new();
        let m = MemMgr::default();
        m.map_mem(&cuda, 0x9000, 8192, GDS_MEMORY_HOST).unwrap();
        m.release(&cuda, 0x9000).unwrap();
        assert_eq!(cuda.unregistered(), vec![0x9000]);
        assert_eq!(m.lookup(0x9000, 4), Lookup::NotFound);
        assert_eq!(m.release(&cuda, 0x9000), Err(Errno::EINVAL));
    }
}
