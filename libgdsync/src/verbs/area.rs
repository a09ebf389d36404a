//! Registered host words: zeroed, page-aligned host memory registered for the GPU (through
//! [`crate::engine::memmgr`]), where the providers keep the words a stream polls or writes
//! (trigger counters, completion counters, busy flags). Areas of destroyed QPs are zeroed and
//! reused, never freed: a stream may still hold writes to them.

use std::sync::atomic::{Ordering, fence};
use std::sync::{Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::GDS_MEMORY_HOST;
use crate::sync::lock;

/// A zeroed, page-aligned host area registered for the GPU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Area {
    pub cpu: usize,
    pub dev: u64,
    pub len: usize,
}

const PAGE: usize = 4096;

fn area_pool() -> &'static Mutex<Vec<Area>> {
    static P: OnceLock<Mutex<Vec<Area>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(Vec::new()))
}

pub(crate) fn alloc_area(len: usize) -> Result<Area> {
    let len = len.div_ceil(PAGE) * PAGE;
    let reuse = {
        let mut p = lock(area_pool());
        p.iter().position(|a| a.len == len).map(|i| p.swap_remove(i))
    };
    if let Some(a) = reuse {
        // SAFETY: the area is ours (from alloc below), len bytes, no longer used by any QP.
        unsafe { std::ptr::write_bytes(a.cpu as *mut u8, 0, a.len) };
        return Ok(a);
    }
    let layout = std::alloc::Layout::from_size_align(len, PAGE).map_err(|_| Errno::EINVAL)?;
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(Errno::ENOMEM);
    }
    let dev =
        crate::cuda::cuda().and_then(|c| crate::engine::memmgr::memmgr().map_mem(c, p as usize, len, GDS_MEMORY_HOST));
    match dev {
        Ok(dev) => Ok(Area { cpu: p as usize, dev, len }),
        Err(e) => {
            // SAFETY: allocated above with this layout, never registered.
            unsafe { std::alloc::dealloc(p, layout) };
            Err(e)
        }
    }
}

pub(crate) fn free_area(a: Area) {
    lock(area_pool()).push(a);
}

/// # Safety
/// `addr` is a live, aligned u32 of an [`Area`].
pub(crate) unsafe fn load(addr: usize) -> u32 {
    // SAFETY: per the contract. Volatile: the GPU (or another thread) writes it.
    let v = unsafe { std::ptr::read_volatile(addr as *const u32) };
    fence(Ordering::Acquire);
    v
}

/// # Safety
/// As [`load`].
pub(crate) unsafe fn store(addr: usize, v: u32) {
    fence(Ordering::Release);
    // SAFETY: per the contract.
    unsafe { std::ptr::write_volatile(addr as *mut u32, v) };
}
