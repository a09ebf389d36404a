//! Tests of dma-buf export (dmabuf.rs) through the C API. The host-memory backend's exports are
//! covered by the dlopen test (`tests/dlopen.rs`), which runs with CUDASIM_DMABUF=1.

use crate::capi::*;
use crate::sys;
use crate::test_util::*;
use crate::types::*;
use std::ffi::c_void;

/// On gpusim, cuMemGetHandleForAddressRange hands out the kernel's dma-buf of the BAR pages: the
/// device reports dma-buf support, any host-page-aligned range inside an allocation's 2 MiB region
/// exports, the PCIe mapping type is refused as on an x86 H100, and the dma-buf keeps the memory
/// after cuMemFree (kmod/gpusim). Needs gpusim's dmabuf_mmap=1 (its default).
#[test]
fn gpusim_exports_kernel_dma_bufs() {
    if !gpusim_mode() {
        println!("SKIP gpusim_exports_kernel_dma_bufs: host memory mode (runs in the VM, 15-cudasim)");
        return;
    }
    setup();
    let export = |p: CUdeviceptr, len: usize, flags: u64| {
        let mut fd = -1i32;
        // SAFETY: for DMA_BUF_FD the handle is an int.
        let r = unsafe { cuMemGetHandleForAddressRange(&mut fd as *mut i32 as *mut c_void, p, len, 1, flags) };
        (r, fd)
    };
    let mut v = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuDeviceGetAttribute(&mut v, attr::DMA_BUF_SUPPORTED, 0) });
    assert_eq!(v, 1);
    // A large allocation has a 2 MiB-aligned region of its own (CUDA's layout): nothing past it.
    let size = super::config::REGION_SIZE as usize;
    let p = alloc(size);
    let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: p is a live allocation of `size` bytes.
    ok(unsafe { cuMemcpyHtoD_v2(p, data.as_ptr().cast(), size) });
    assert_eq!(p as usize % size, 0, "large allocations are 2 MiB aligned");
    assert_eq!(export(p, size, 1).0, err::NOT_SUPPORTED, "PCIe mapping type on x86");
    assert_eq!(export(p + 100, 4096, 0).0, err::INVALID_VALUE, "unaligned");
    assert_eq!(export(p, size + 0x10000, 0).0, err::INVALID_VALUE, "past the allocation");
    // A small one is sub-allocated (256-byte alignment; other tests allocate meanwhile) from a
    // shared 2 MiB region: a range may run past it into the region (neighbours' bytes or free
    // slots, as gdrcopy's rounding to pages does on CUDA), not past the region.
    let small = alloc(0x30000);
    let q = (small as usize).next_multiple_of(0x1000) as u64;
    let to_region_end = size - (q as usize % size);
    assert!(to_region_end >= 0x30000 - (q - small) as usize, "the allocation lies inside one region");
    let (r, fd) = export(q, to_region_end, 0);
    ok(r);
    drop(sys::Fd(fd));
    assert_eq!(export(q, to_region_end + 0x10000, 0).0, err::INVALID_VALUE, "past the region");
    // SAFETY: small came from cuMemAlloc.
    ok(unsafe { cuMemFree_v2(small) });
    let (r, fd) = export(p + 0x1000, 0x20000, 0);
    ok(r);
    let fd = sys::Fd(fd);
    // SAFETY: (mapping) a new shared mapping of the dma-buf, unmapped below.
    let view = unsafe { sys::mmap_raw(0, 0x20000, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED, fd.0, 0) }
        .expect("mmap of the dma-buf (gpusim dmabuf_mmap=1)");
    // SAFETY: the mapping is 0x20000 bytes and lives until the unmap below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(view as *mut u8, 0x20000) };
    let want = &data[0x1000..0x21000];
    assert_eq!(&bytes[..], want, "the dma-buf maps the exported range");
    // SAFETY: p came from cuMemAlloc.
    ok(unsafe { cuMemFree_v2(p) });
    // The real driver's dma-buf holds its own reference on the memory: still there.
    assert_eq!(&bytes[..], want, "memory kept by the dma-buf after cuMemFree");
    // SAFETY: unmapping our own mapping; nothing refers to it any more.
    unsafe { sys::unmap(view, 0x20000) }.unwrap();
}
