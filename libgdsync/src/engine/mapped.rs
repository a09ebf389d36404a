//! `gds_alloc_mapped_memory` / `gds_free_mapped_memory` (spec §6.23–§6.24): GPU memory with a CPU
//! mapping through gdrcopy, or page-aligned host memory registered for GPU access.

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::cuda::gdr::Gdr;
use crate::cuda::{Cuda, errno_of};
use crate::engine::memmgr::{HOST_PAGE, MemMgr};

/// The fields of a filled `gds_mem_desc_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub d_ptr: u64,
    pub h_ptr: usize,
    pub bar_ptr: usize,
    pub alloc_size: usize,
    pub mh: GdrMh,
}

/// GPU memory of `size` bytes in the current context, pinned and mapped through gdrcopy.
pub fn alloc_gpu(cuda: &dyn Cuda, gdr: &Gdr, size: usize) -> Result<Mapped> {
    const F: &str = "gds_alloc_mapped_memory";
    let d = cuda.mem_alloc(size).map_err(|r| {
        gds_err!(F, "cuMemAlloc({size}) failed: {} ({r})", cuda.error_string(r));
        errno_of(r)
    })?;
    let undo_alloc = |e: Errno| {
        let _ = cuda.mem_free(d);
        e
    };
    cuda.pointer_set_sync_memops(d).map_err(|r| {
        gds_err!(F, "cuPointerSetAttribute(SYNC_MEMOPS) failed: {r}");
        undo_alloc(errno_of(r))
    })?;
    let mh = gdr.pin(d, size).map_err(|e| {
        gds_err!(F, "gdr_pin_buffer({d:#x}, {size}) failed: {e}");
        undo_alloc(e)
    })?;
    let undo_pin = |e: Errno| {
        let _ = gdr.unpin(mh);
        undo_alloc(e)
    };
    let bar = gdr.map(mh, size).map_err(|e| {
        gds_err!(F, "gdr_map failed: {e}");
        undo_pin(e)
    })?;
    let undo_map = |e: Errno| {
        let _ = gdr.unmap(mh, bar, size);
        undo_pin(e)
    };
    let info = gdr.info(mh).map_err(|e| {
        gds_err!(F, "gdr_get_info failed: {e}");
        undo_map(e)
    })?;
    if d < info.va {
        gds_err!(F, "mapping starts after the buffer (va {:#x} > {d:#x})", info.va);
        return Err(undo_map(Errno::EINVAL));
    }
    Ok(Mapped { d_ptr: d, h_ptr: bar + (d - info.va) as usize, bar_ptr: bar, alloc_size: size, mh })
}

/// Undoes [`alloc_gpu`].
pub fn free_gpu(cuda: &dyn Cuda, gdr: &Gdr, m: &Mapped) -> Result<()> {
    const F: &str = "gds_free_mapped_memory";
    let mut first = Ok(());
    if let Err(e) = gdr.unmap(m.mh, m.bar_ptr, m.alloc_size) {
        gds_err!(F, "gdr_unmap failed: {e}");
        first = first.and(Err(e));
    }
    if let Err(e) = gdr.unpin(m.mh) {
        gds_err!(F, "gdr_unpin_buffer failed: {e}");
        first = first.and(Err(e));
    }
    if let Err(r) = cuda.mem_free(m.d_ptr) {
        gds_err!(F, "cuMemFree failed: {r}");
        first = first.and(Err(errno_of(r)));
    }
    first
}

/// Page-aligned host memory registered for GPU access.
pub fn alloc_host(cuda: &dyn Cuda, mm: &MemMgr, size: usize) -> Result<Mapped> {
    const F: &str = "gds_alloc_mapped_memory";
    let mut p: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: valid out pointer; alignment is a power of two multiple of sizeof(void *).
    let r = unsafe { libc::posix_memalign(&mut p, HOST_PAGE, size) };
    if r != 0 || p.is_null() {
        gds_err!(F, "posix_memalign({size}) failed");
        return Err(Errno::ENOMEM);
    }
    let h = p as usize;
    match mm.map_mem(cuda, h, size, GDS_MEMORY_HOST) {
        Ok(d) => Ok(Mapped { d_ptr: d, h_ptr: h, bar_ptr: 0, alloc_size: size, mh: GdrMh::default() }),
        Err(e) => {
            // SAFETY: p came from posix_memalign above and is not used afterwards.
            unsafe { libc::free(p) };
            Err(e)
        }
    }
}

/// Undoes [`alloc_host`]: the registration is dropped, then the memory freed.
pub fn free_host(cuda: Option<&dyn Cuda>, mm: &MemMgr, h_ptr: usize) {
    if let Some(c) = cuda {
        // Not found means someone else's registration covers it: leave that alone.
        let _ = mm.release(c, h_ptr);
    }
    // SAFETY: h_ptr is the h_ptr of a host gds_mem_desc_t, which came from posix_memalign
    // (the C layer checked the descriptor's memory type).
    unsafe { libc::free(h_ptr as *mut libc::c_void) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testcuda::{DEV_OFFSET, FakeCuda};

    #[test]
    fn host_allocation_round_trip_registers_and_unregisters() {
        let cuda = FakeCuda::new();
        let mm = MemMgr::default();
        let m = alloc_host(&cuda, &mm, 10000).unwrap();
        assert_eq!(m.h_ptr % HOST_PAGE, 0);
        assert_eq!(m.d_ptr, m.h_ptr as u64 + DEV_OFFSET);
        assert_eq!(cuda.registered(), vec![(m.h_ptr, 12288, 3)]);
        // SAFETY: the allocation is 10000 bytes, writable.
        unsafe { std::ptr::write_bytes(m.h_ptr as *mut u8, 0xab, 10000) };
        free_host(Some(&cuda), &mm, m.h_ptr);
        assert_eq!(cuda.unregistered(), vec![m.h_ptr]);
    }

    #[test]
    fn host_allocation_failure_frees_and_reports() {
        let cuda = FakeCuda::new();
        cuda.set_register_result(Some(crate::cuda::CUDA_ERROR_NOT_INITIALIZED));
        assert_eq!(alloc_host(&cuda, &MemMgr::default(), 100), Err(Errno::EAGAIN));
    }
}
