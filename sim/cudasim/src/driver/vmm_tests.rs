//! Tests of the VMM API (vmm.rs) through the C API.

use crate::capi::*;
use crate::test_util::*;
use crate::types::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// VMM allocation properties: pinned memory on device 0 with `alloc_flags`.
fn pinned_on_device_0(alloc_flags: CUmemAllocFlags) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        win32_handle_meta_data: null_mut(),
        alloc_flags,
    }
}

#[test]
fn vmm_lifecycle() {
    setup();
    // SAFETY: structs are local; addresses come from the API.
    unsafe {
        let prop = pinned_on_device_0(CUmemAllocFlags { gpu_direct_rdma_capable: 1, ..Default::default() });
        let mut gran = 0;
        ok(cuMemGetAllocationGranularity(&mut gran, &prop, 0));
        assert_eq!(gran, 0x10000);
        ok(cuMemGetAllocationGranularity(&mut gran, &prop, 1));
        assert_eq!(cuMemGetAllocationGranularity(&mut gran, &prop, 2), err::INVALID_VALUE);
        let size = 4 * gran;
        let mut h = 0;
        assert_eq!(cuMemCreate(&mut h, size + 1, &prop, 0), err::INVALID_VALUE);
        ok(cuMemCreate(&mut h, size, &prop, 0));
        let mut va = 0;
        ok(cuMemAddressReserve(&mut va, size, 0, 0, 0));
        assert_eq!(va % 0x10000, 0);
        assert_eq!(cuMemMap(va + 1, size, 0, h, 0), err::INVALID_VALUE);
        ok(cuMemMap(va, size, 0, h, 0));
        assert_eq!(cuMemMap(va, size, 0, h, 0), err::ALREADY_MAPPED);
        // Not accessible before cuMemSetAccess.
        let x = [1u8; 64];
        assert_eq!(cuMemcpyHtoD_v2(va, x.as_ptr() as *const c_void, 64), err::INVALID_VALUE);
        let desc = CUmemAccessDesc { location: prop.location, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        assert_eq!(cuMemSetAccess(va, size + gran, &desc, 1), err::INVALID_VALUE, "past the mapping");
        ok(cuMemSetAccess(va, size, &desc, 1));
        ok(cuMemsetD8_v2(va, 0x5a, size));
        let mut back = vec![0u8; size];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, va, size));
        assert!(back.iter().all(|&b| b == 0x5a));
        let mut ty = 0u32;
        ok(cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, va + 100));
        assert_eq!(ty, CU_MEMORYTYPE_DEVICE);
        let mut rdma = 0u8;
        ok(cuPointerGetAttribute(&mut rdma as *mut u8 as *mut c_void, ptr_attr::IS_GPU_DIRECT_RDMA_CAPABLE, va));
        assert_eq!(rdma, 1);
        let mut h2 = 0;
        ok(cuMemRetainAllocationHandle(&mut h2, va as *mut c_void));
        assert_eq!(h2, h);
        // Release while mapped is allowed; the memory lives until unmapped.
        ok(cuMemRelease(h));
        assert_eq!(cuMemRelease(h), err::INVALID_VALUE);
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, va, 16));
        assert_eq!(cuMemAddressFree(va, size), err::INVALID_VALUE, "still mapped");
        assert_eq!(cuMemUnmap(va + gran as u64, gran), err::INVALID_VALUE, "partial unmap");
        ok(cuMemUnmap(va, size));
        assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, va, 16), err::INVALID_VALUE);
        ok(cuMemAddressFree(va, size));
        assert_eq!(cuMemAddressFree(va, size), err::INVALID_VALUE);
        let bad = CUmemAllocationProp { type_: 0, ..prop };
        assert_eq!(cuMemCreate(&mut h, size, &bad, 0), err::INVALID_VALUE);
        let baddev = CUmemAllocationProp { location: CUmemLocation { type_: 1, id: 77 }, ..prop };
        assert_eq!(cuMemCreate(&mut h, size, &baddev, 0), err::INVALID_DEVICE);
    }
}

#[test]
fn vmm_two_mappings_share_memory() {
    if gpusim_mode() {
        eprintln!("SKIP vmm_two_mappings_share_memory: with gpusim a handle is mapped once (docs/cudasim.md)");
        return;
    }
    setup();
    // SAFETY: as vmm_lifecycle.
    unsafe {
        let prop = pinned_on_device_0(CUmemAllocFlags::default());
        let g = 0x10000usize;
        let mut h = 0;
        ok(cuMemCreate(&mut h, 2 * g, &prop, 0));
        let (mut a, mut b) = (0, 0);
        ok(cuMemAddressReserve(&mut a, 2 * g, 0, 0, 0));
        ok(cuMemAddressReserve(&mut b, g, 0, 0, 0));
        ok(cuMemMap(a, 2 * g, 0, h, 0));
        ok(cuMemMap(b, g, g, h, 0)); // second half of the allocation
        let desc = CUmemAccessDesc { location: prop.location, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        ok(cuMemSetAccess(a, 2 * g, &desc, 1));
        ok(cuMemSetAccess(b, g, &desc, 1));
        ok(cuMemsetD32_v2(a + g as u64 + 64, 0xfeed_f00d, 1));
        assert_eq!(a32(b + 64).load(Ordering::SeqCst), 0xfeed_f00d);
        ok(cuMemUnmap(a, 2 * g));
        ok(cuMemUnmap(b, g));
        ok(cuMemRelease(h));
        ok(cuMemAddressFree(a, 2 * g));
        ok(cuMemAddressFree(b, g));
    }
}
