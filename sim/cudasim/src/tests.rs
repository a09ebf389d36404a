//! Unit tests of the C API through the rlib (same functions the cdylib exports).
//!
//! Tests run in parallel threads of one process and share the driver; each thread makes the
//! primary context of device 0 current (and never drops it to refcount 0).

use crate::capi::*;
use crate::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};
use crate::sys;
use crate::types::*;
use std::ffi::{CStr, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[track_caller]
fn ok(r: CUresult) {
    assert_eq!(r, err::SUCCESS, "expected CUDA_SUCCESS, got {}", error_entry(r).map_or("?", |e| e.1));
}

fn setup() -> CUcontext {
    let mut c = null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut c, 0));
        ok(cuCtxSetCurrent(c));
    }
    c
}

/// Held by every device allocation of these tests (all go through [`alloc`]) and by a check that
/// needs the address space next to an allocation to stay as it found it: the simulated device
/// hands out adjacent ranges, and the tests run in parallel.
static DEVICE_LAYOUT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A zeroed device allocation: cuMemAlloc does not clear memory, and with sub-allocation a slot
/// freed by another test (they run in parallel) may come back with its old bytes.
fn alloc(n: usize) -> CUdeviceptr {
    let mut p = 0;
    let _layout = DEVICE_LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: valid out-pointer; the memset covers exactly the new allocation.
    unsafe {
        ok(cuMemAlloc_v2(&mut p, n));
        ok(cuMemsetD8_v2(p, 0, n));
    }
    p
}

fn stream() -> CUstream {
    let mut s = null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cuStreamCreate(&mut s, 0) });
    s
}

fn a32(p: CUdeviceptr) -> &'static AtomicU32 {
    // SAFETY: tests only pass 4-aligned device pointers that stay allocated while used (host
    // mode: device memory is process memory).
    unsafe { AtomicU32::from_ptr(p as *mut u32) }
}

fn a64(p: CUdeviceptr) -> &'static AtomicU64 {
    // SAFETY: as a32, 8-aligned.
    unsafe { AtomicU64::from_ptr(p as *mut u64) }
}

/// Drains stream `s`, destroys it and frees `p`, each call expected to succeed.
#[track_caller]
fn drain_and_free(s: CUstream, p: CUdeviceptr) {
    // SAFETY: the tests pass a live stream and a live allocation, both from the API.
    unsafe {
        ok(cuStreamSynchronize(s));
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(p));
    }
}

/// Polls until `f` holds or 10 s pass.
#[track_caller]
fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Asserts that `f` stays false for a while (the stream is really blocked).
#[track_caller]
fn stays_false(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(30) {
        assert!(!f(), "{what} happened too early");
        std::thread::sleep(Duration::from_micros(500));
    }
}

#[test]
fn devices_and_attributes() {
    setup();
    // SAFETY: valid out-pointers; NULL cases are the point of the checks.
    unsafe {
        let mut n = 0;
        ok(cuDeviceGetCount(&mut n));
        assert!(n >= 1);
        let mut dev = -1;
        ok(cuDeviceGet(&mut dev, 0));
        assert_eq!(dev, 0);
        assert_eq!(cuDeviceGet(&mut dev, n), err::INVALID_DEVICE);
        assert_eq!(cuDeviceGet(null_mut(), 0), err::INVALID_VALUE);
        let mut name = [0i8; 64];
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "cudasim GPU");
        ok(cuDeviceGetName(name.as_mut_ptr(), 4, 0));
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "cud");
        let get = |a| {
            let mut v = -7;
            let r = cuDeviceGetAttribute(&mut v, a, 0);
            (r, v)
        };
        assert_eq!(get(attr::COMPUTE_CAPABILITY_MAJOR), (0, 9));
        assert_eq!(get(attr::COMPUTE_CAPABILITY_MINOR), (0, 0));
        for a in [98, 110, 116, 122, 123, attr::UNIFIED_ADDRESSING] {
            assert_eq!(get(a), (0, 1), "attribute {a}");
        }
        // The v1 stream-memop capabilities read 0, as on CUDA 13 drivers.
        for a in [92, 93, 94] {
            assert_eq!(get(a), (0, 0), "attribute {a}");
        }
        assert_eq!(get(attr::PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES), (0, 0));
        assert_eq!(get(0).0, err::INVALID_VALUE);
        assert_eq!(get(100_000).0, err::INVALID_VALUE);
        assert_eq!(cuDeviceGetAttribute(&mut 0, 75, 99), err::INVALID_DEVICE);
        let mut p = CUdevprop::default();
        ok(cuDeviceGetProperties(&mut p, 0));
        assert_eq!((p.simd_width, p.max_threads_per_block), (32, 1024));
        let mut v = 0;
        ok(cuDriverGetVersion(&mut v));
        assert!(v >= 11000);
        let mut bus = [0i8; 32];
        ok(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, 0));
        let mut back = -1;
        ok(cuDeviceGetByPCIBusId(&mut back, bus.as_ptr()));
        assert_eq!(back, 0);
        assert_eq!(cuDeviceGetByPCIBusId(&mut back, c"ffff:ff:1f.0".as_ptr()), err::INVALID_DEVICE);
    }
}

#[test]
fn error_names_and_strings() {
    // SAFETY: valid out-pointers; returned strings are static C strings.
    unsafe {
        let mut s: *const i8 = null_mut();
        ok(cuGetErrorName(801, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "CUDA_ERROR_NOT_SUPPORTED");
        ok(cuGetErrorName(0, &mut s));
        assert_eq!(CStr::from_ptr(s).to_str().unwrap(), "CUDA_SUCCESS");
        ok(cuGetErrorString(1, &mut s));
        assert!(!CStr::from_ptr(s).to_bytes().is_empty());
        assert_eq!(cuGetErrorName(4242, &mut s), err::INVALID_VALUE);
        assert!(s.is_null());
        assert_eq!(cuGetErrorString(0, null_mut()), err::INVALID_VALUE);
    }
}

#[test]
fn context_stack() {
    let prim = setup();
    // SAFETY: valid out-pointers and handles from the API.
    unsafe {
        let mut c = null_mut();
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, prim);
        let mut mine = null_mut();
        ok(cuCtxCreate_v2(&mut mine, 0, 0));
        assert_ne!(mine, prim);
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, mine, "cuCtxCreate pushes the new context");
        let mut popped = null_mut();
        ok(cuCtxPopCurrent_v2(&mut popped));
        assert_eq!(popped, mine);
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, prim);
        ok(cuCtxPushCurrent_v2(mine));
        let mut dev = -1;
        ok(cuCtxGetDevice(&mut dev));
        assert_eq!(dev, 0);
        ok(cuCtxSynchronize());
        ok(cuCtxDestroy_v2(mine));
        ok(cuCtxGetCurrent(&mut c));
        assert_eq!(c, prim, "destroying a current context pops it");
        assert_eq!(cuCtxDestroy_v2(mine), err::INVALID_CONTEXT);
        assert_eq!(cuCtxSetCurrent(mine), err::INVALID_CONTEXT);
        assert_eq!(cuCtxPushCurrent_v2(null_mut()), err::INVALID_CONTEXT);
        assert_eq!(cuCtxDestroy_v2(prim), err::INVALID_CONTEXT, "primary contexts are not destroyed by cuCtxDestroy");
        ok(cuFlushGPUDirectRDMAWrites(0, 100));
        ok(cuFlushGPUDirectRDMAWrites(0, 200));
        assert_eq!(cuFlushGPUDirectRDMAWrites(1, 100), err::INVALID_VALUE);
        assert_eq!(cuFlushGPUDirectRDMAWrites(0, 0), err::INVALID_VALUE);
        // Retain/release pairs keep the same primary handle while a reference is held.
        let mut again = null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut again, 0));
        assert_eq!(again, prim);
        ok(cuDevicePrimaryCtxRelease_v2(0));
        let (mut flags, mut active) = (9, 0);
        ok(cuDevicePrimaryCtxGetState(0, &mut flags, &mut active));
        assert_eq!(active, 1);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut again, 5), err::INVALID_DEVICE);
    }
    // A thread without a current context.
    std::thread::spawn(|| {
        // SAFETY: valid out-pointers.
        unsafe {
            let mut c = 1 as CUcontext;
            ok(cuCtxGetCurrent(&mut c));
            assert!(c.is_null());
            let mut p = 0;
            assert_eq!(cuMemAlloc_v2(&mut p, 64), err::INVALID_CONTEXT);
            assert_eq!(cuCtxSynchronize(), err::INVALID_CONTEXT);
            assert_eq!(cuCtxPopCurrent_v2(null_mut()), err::INVALID_CONTEXT);
            let mut s = null_mut();
            assert_eq!(cuStreamCreate(&mut s, 0), err::INVALID_CONTEXT);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn alloc_copy_memset_free() {
    setup();
    // SAFETY: buffers are device allocations of the sizes used; host buffers are local.
    unsafe {
        let n = 300_000;
        let p = alloc(n);
        assert_eq!(p % 256, 0, "device pointers are 256-byte aligned");
        ok(cuMemsetD8_v2(p, 0xab, n));
        let mut host = vec![0u8; n];
        ok(cuMemcpyDtoH_v2(host.as_mut_ptr() as *mut c_void, p, n));
        assert!(host.iter().all(|&b| b == 0xab));
        let src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
        ok(cuMemcpyHtoD_v2(p, src.as_ptr() as *const c_void, n));
        let q = alloc(n);
        ok(cuMemcpyDtoD_v2(q + 1, p, n - 1));
        ok(cuMemcpyDtoH_v2(host.as_mut_ptr() as *mut c_void, q, n));
        assert_eq!(&host[1..], &src[..n - 1]);
        ok(cuMemsetD32_v2(q, 0x1234_5678, 4));
        ok(cuMemcpy(host.as_mut_ptr() as u64, q, 16));
        assert_eq!(&host[..16], &0x1234_5678u32.to_ne_bytes().repeat(4)[..]);
        assert_eq!(cuMemsetD32_v2(q + 2, 0, 1), err::INVALID_VALUE, "misaligned D32");
        ok(cuMemsetD16_v2(q + 2, 0xbeef, 1));
        // Out of range and unknown pointers.
        assert_eq!(cuMemcpyHtoD_v2(p + n as u64 - 4, src.as_ptr() as *const c_void, 8), err::INVALID_VALUE);
        assert_eq!(cuMemcpyDtoH_v2(host.as_mut_ptr() as *mut c_void, 0x1000, 8), err::INVALID_VALUE);
        assert_eq!(cuMemsetD8_v2(0, 0, 8), err::INVALID_VALUE);
        ok(cuMemcpyHtoD_v2(p, src.as_ptr() as *const c_void, 0));
        // Address range.
        let (mut base, mut size) = (0, 0);
        ok(cuMemGetAddressRange_v2(&mut base, &mut size, p + 1234));
        assert_eq!((base, size), (p, n));
        assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, 0x10), err::NOT_FOUND);
        // Free: interior pointer and double free are invalid.
        assert_eq!(cuMemFree_v2(p + 64), err::INVALID_VALUE);
        ok(cuMemFree_v2(p));
        assert_eq!(cuMemFree_v2(p), err::INVALID_VALUE);
        ok(cuMemFree_v2(q));
        ok(cuMemFree_v2(0));
        // Bad sizes.
        let mut r = 0;
        assert_eq!(cuMemAlloc_v2(&mut r, 0), err::INVALID_VALUE);
        assert_eq!(cuMemAlloc_v2(&mut r, usize::MAX - 10), err::OUT_OF_MEMORY);
        assert_eq!(cuMemAlloc_v2(null_mut(), 10), err::INVALID_VALUE);
        let (mut free, mut total) = (0, 0);
        ok(cuMemGetInfo_v2(&mut free, &mut total));
        assert!(free <= total && total > 0);
    }
}

#[test]
fn host_memory_alloc_and_register() {
    setup();
    // SAFETY: all pointers come from the API or from a local Vec kept alive.
    unsafe {
        let mut h: *mut c_void = null_mut();
        ok(cuMemHostAlloc(
            &mut h,
            10_000,
            CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_PORTABLE,
        ));
        let mut dp = 0;
        ok(cuMemHostGetDevicePointer_v2(&mut dp, (h as *mut u8).add(100) as *mut c_void, 0));
        assert_eq!(dp, h as u64 + 100);
        assert_eq!(cuMemHostGetDevicePointer_v2(&mut dp, h, 1), err::INVALID_VALUE);
        let mut ty = 0u32;
        ok(cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, h as u64));
        assert_eq!(ty, CU_MEMORYTYPE_HOST);
        let mut hp: *mut c_void = null_mut();
        ok(cuPointerGetAttribute(&mut hp as *mut _ as *mut c_void, ptr_attr::HOST_POINTER, h as u64 + 8));
        assert_eq!(hp as u64, h as u64 + 8);
        let mut flags = 0;
        ok(cuMemHostGetFlags(&mut flags, h));
        assert_eq!(flags & 7, 7);
        assert_eq!(cuMemHostAlloc(&mut h, 16, 0x80), err::INVALID_VALUE);
        assert_eq!(cuMemFree_v2(h as u64), err::INVALID_VALUE, "cuMemFree does not free host memory");
        ok(cuMemFreeHost(h));
        assert_eq!(cuMemFreeHost(h), err::INVALID_VALUE);
        let mut h2: *mut c_void = null_mut();
        ok(cuMemAllocHost_v2(&mut h2, 64));
        ok(cuMemFreeHost(h2));

        // Registration of ordinary memory.
        let mut buf = vec![0u32; 4096];
        let bp = buf.as_mut_ptr() as *mut c_void;
        ok(cuMemHostRegister_v2(bp, 16384, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
        assert_eq!(cuMemHostRegister_v2(bp, 16, 0), err::HOST_MEMORY_ALREADY_REGISTERED);
        ok(cuMemHostGetDevicePointer_v2(&mut dp, bp, 0));
        assert_eq!(dp, bp as u64);
        // The registered range can be the target of stream memory operations.
        ok(cuStreamWriteValue32_v2(null_mut(), dp + 8, 77, 0));
        ok(cuStreamSynchronize(null_mut()));
        assert_eq!(std::ptr::read_volatile(&buf[2]), 77);
        ok(cuMemHostUnregister(bp));
        assert_eq!(cuMemHostUnregister(bp), err::HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(cuStreamWriteValue32_v2(null_mut(), dp + 8, 78, 0), err::INVALID_VALUE, "no longer registered");
        assert_eq!(cuMemHostRegister_v2(null_mut(), 16, 0), err::INVALID_VALUE);
        assert_eq!(cuMemHostRegister_v2(bp, 16, 0x100), err::INVALID_VALUE);
        assert_eq!(cuMemHostRegister_v2(8 as *mut c_void, 4096, 0), err::INVALID_VALUE, "unmapped memory");
        drop(buf);
    }
}

#[test]
fn pointer_attributes() {
    let ctx = setup();
    // SAFETY: out-buffers sized for each attribute.
    unsafe {
        let p = alloc(100_000);
        let q = alloc(10);
        let mut c: CUcontext = null_mut();
        ok(cuPointerGetAttribute(&mut c as *mut _ as *mut c_void, ptr_attr::CONTEXT, p + 5));
        assert_eq!(c, ctx);
        let mut ty = 0u32;
        ok(cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, p));
        assert_eq!(ty, CU_MEMORYTYPE_DEVICE);
        let mut dp = 0u64;
        ok(cuPointerGetAttribute(&mut dp as *mut u64 as *mut c_void, ptr_attr::DEVICE_POINTER, p + 9));
        assert_eq!(dp, p + 9);
        let mut hp: *mut c_void = null_mut();
        assert_eq!(
            cuPointerGetAttribute(&mut hp as *mut _ as *mut c_void, ptr_attr::HOST_POINTER, p),
            err::INVALID_VALUE
        );
        let mut tok = P2pTokens { p2p_token: 5, va_space_token: 5 };
        ok(cuPointerGetAttribute(&mut tok as *mut P2pTokens as *mut c_void, ptr_attr::P2P_TOKENS, p));
        assert_eq!((tok.p2p_token, tok.va_space_token), (0, 0));
        let (mut id1, mut id2) = (0u64, 0u64);
        ok(cuPointerGetAttribute(&mut id1 as *mut u64 as *mut c_void, ptr_attr::BUFFER_ID, p));
        ok(cuPointerGetAttribute(&mut id2 as *mut u64 as *mut c_void, ptr_attr::BUFFER_ID, q));
        assert_ne!(id1, id2);
        let mut ord = -1i32;
        ok(cuPointerGetAttribute(&mut ord as *mut i32 as *mut c_void, ptr_attr::DEVICE_ORDINAL, p));
        assert_eq!(ord, 0);
        let (mut start, mut size) = (0u64, 0usize);
        ok(cuPointerGetAttribute(&mut start as *mut u64 as *mut c_void, ptr_attr::RANGE_START_ADDR, p + 4000));
        ok(cuPointerGetAttribute(&mut size as *mut usize as *mut c_void, ptr_attr::RANGE_SIZE, p + 4000));
        assert_eq!((start, size), (p, 100_000));
        let mut mapped = 0u32; // a wider variable than the bool CUDA writes: low byte is set
        ok(cuPointerGetAttribute(&mut mapped as *mut u32 as *mut c_void, ptr_attr::MAPPED, p));
        assert_eq!(mapped, 1);
        // SYNC_MEMOPS: off by default, settable (as gdrcopy and libgdsync do), per allocation.
        let mut sync = 0u32;
        ok(cuPointerGetAttribute(&mut sync as *mut u32 as *mut c_void, ptr_attr::SYNC_MEMOPS, p));
        assert_eq!(sync, 0);
        let one: u32 = 1;
        ok(cuPointerSetAttribute(&one as *const u32 as *const c_void, ptr_attr::SYNC_MEMOPS, p + 10));
        ok(cuPointerGetAttribute(&mut sync as *mut u32 as *mut c_void, ptr_attr::SYNC_MEMOPS, p));
        assert_eq!(sync, 1);
        ok(cuPointerGetAttribute(&mut sync as *mut u32 as *mut c_void, ptr_attr::SYNC_MEMOPS, q));
        assert_eq!(sync, 0);
        assert_eq!(
            cuPointerSetAttribute(&one as *const u32 as *const c_void, ptr_attr::BUFFER_ID, p),
            err::INVALID_VALUE
        );
        assert_eq!(
            cuPointerSetAttribute(&one as *const u32 as *const c_void, ptr_attr::SYNC_MEMOPS, 0x10),
            err::INVALID_VALUE
        );
        // Unknown pointers and attributes.
        assert_eq!(
            cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, 0x10),
            err::INVALID_VALUE
        );
        assert_eq!(cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, 999, p), err::INVALID_VALUE);
        assert_eq!(cuPointerGetAttribute(null_mut(), ptr_attr::MEMORY_TYPE, p), err::INVALID_VALUE);
        // cuPointerGetAttributes on unknown memory reports "not CUDA memory" values.
        let attrs = [ptr_attr::MEMORY_TYPE, ptr_attr::DEVICE_ORDINAL];
        let (mut t2, mut o2) = (7u32, 7i32);
        let mut outs = [&mut t2 as *mut u32 as *mut c_void, &mut o2 as *mut i32 as *mut c_void];
        ok(cuPointerGetAttributes(2, attrs.as_ptr(), outs.as_mut_ptr(), 0x10));
        assert_eq!((t2, o2), (0, -2));
        ok(cuPointerGetAttributes(2, attrs.as_ptr(), outs.as_mut_ptr(), p));
        assert_eq!((t2, o2), (CU_MEMORYTYPE_DEVICE, 0));
        ok(cuMemFree_v2(p));
        ok(cuMemFree_v2(q));
        assert_eq!(
            cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, p),
            err::INVALID_VALUE,
            "freed"
        );
    }
}

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

/// True when device memory comes from /dev/gpusim (the VM suite).
fn gpusim_mode() -> bool {
    std::path::Path::new("/dev/gpusim").exists() && std::env::var("CUDASIM_BACKEND").map_or(true, |v| v != "host")
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

#[test]
fn streams_execute_in_order_with_callbacks() {
    setup();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn cb(_s: CUstream, status: CUresult, data: *mut c_void) {
        assert_eq!(status, 0);
        // SAFETY: data is the address of a live AtomicU32 device word (see below).
        let word = unsafe { AtomicU32::from_ptr(data as *mut u32) };
        // The callback runs after the write queued before it.
        assert_eq!(word.load(Ordering::SeqCst), 5);
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
    unsafe extern "C" fn hostfn(data: *mut c_void) {
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(data as *mut u32) }.store(6, Ordering::SeqCst);
    }
    // SAFETY: device buffers stay allocated until after synchronisation.
    unsafe {
        let s = stream();
        let p = alloc(4096);
        let host: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        let mut out = vec![0u8; 4096];
        for _ in 0..20 {
            ok(cuMemsetD8Async(p, 0, 4096, s));
            ok(cuMemcpyHtoDAsync_v2(p, host.as_ptr() as *const c_void, 4096, s));
            ok(cuStreamWriteValue32_v2(s, p + 64, 5, 0));
            ok(cuStreamAddCallback(s, Some(cb), (p + 64) as *mut c_void, 0));
            ok(cuLaunchHostFunc(s, Some(hostfn), (p + 64) as *mut c_void));
            ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, p, 4096, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(&out[..64], &host[..64]);
            assert_eq!(u32::from_ne_bytes(out[64..68].try_into().unwrap()), 6);
            assert_eq!(&out[68..], &host[68..]);
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), 20);
        ok(cuStreamQuery(s));
        let mut c = null_mut();
        ok(cuStreamGetCtx(s, &mut c));
        let mut cur = null_mut();
        ok(cuCtxGetCurrent(&mut cur));
        assert_eq!(c, cur);
        assert_eq!(cuStreamAddCallback(s, None, null_mut(), 0), err::INVALID_VALUE);
        assert_eq!(cuStreamAddCallback(s, Some(cb), null_mut(), 1), err::INVALID_VALUE);
        ok(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamQuery(s), err::INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(s), err::INVALID_HANDLE);
        assert_eq!(cuStreamSynchronize(0x1234_5670 as CUstream), err::INVALID_HANDLE);
        ok(cuStreamSynchronize(CU_STREAM_LEGACY as CUstream));
        ok(cuStreamSynchronize(CU_STREAM_PER_THREAD as CUstream));
        ok(cuMemFree_v2(p));
    }
}

/// Stream waits on a word that a CPU thread updates: for every condition, 32 and 64 bit, the
/// operation queued behind the wait must not run before the condition holds, and must run
/// after it does.
#[test]
fn wait_value_all_conditions_race_cpu_writer() {
    setup();
    // (condition, initial value, blocking values written first, releasing value, reference)
    let cases: [(u32, u64, &[u64], u64, u64); 4] = [
        (CU_STREAM_WAIT_VALUE_GEQ, 0, &[1, 4], 5, 5),
        (CU_STREAM_WAIT_VALUE_EQ, 0, &[6, 8], 7, 7),
        (CU_STREAM_WAIT_VALUE_AND, 0, &[0x0f, 0x20], 0x11, 0x10),
        (CU_STREAM_WAIT_VALUE_NOR, 0xffff_ffff, &[0xffff_ffff, 0x0000_000f], 0x0000_000e, 0xffff_fff0),
    ];
    for wide in [false, true] {
        for (cond, init, blocking, release, reference) in cases {
            // 64-bit NOR: complement the high half too, so that only the low bits decide.
            let (init, blocking, release, reference): (u64, Vec<u64>, u64, u64) =
                if wide && cond == CU_STREAM_WAIT_VALUE_NOR {
                    (
                        u64::MAX,
                        blocking.iter().map(|v| v | 0xffff_ffff_0000_0000).collect(),
                        release | 0xffff_ffff_0000_0000,
                        reference | 0xffff_ffff_0000_0000,
                    )
                } else {
                    (init, blocking.to_vec(), release, reference)
                };
            let s = stream();
            let p = alloc(4096);
            let (flag, done) = (p, p + 256);
            a64(flag).store(init, Ordering::SeqCst);
            a32(done).store(0, Ordering::SeqCst);
            // SAFETY: flag/done are in the live allocation p.
            unsafe {
                if wide {
                    ok(cuStreamWaitValue64_v2(s, flag, reference, cond | CU_STREAM_WAIT_VALUE_FLUSH));
                } else {
                    ok(cuStreamWaitValue32_v2(s, flag, reference as u32, cond));
                }
                ok(cuStreamWriteValue32_v2(s, done, 1, 0));
                assert_eq!(cuStreamQuery(s), err::NOT_READY);
            }
            let what = format!("cond {cond} wide {wide}");
            let writer = std::thread::spawn(move || {
                for v in blocking {
                    if wide {
                        a64(flag).store(v, Ordering::Release)
                    } else {
                        a32(flag).store(v as u32, Ordering::Release)
                    }
                    stays_false("the write behind the wait", || a32(done).load(Ordering::Acquire) == 1);
                }
                if wide {
                    a64(flag).store(release, Ordering::Release)
                } else {
                    a32(flag).store(release as u32, Ordering::Release)
                }
            });
            writer.join().unwrap();
            eventually(&what, || a32(done).load(Ordering::Acquire) == 1);
            drain_and_free(s, p);
        }
    }
}

/// Ping-pong between a CPU thread and a stream, many rounds, through batch memops: checks
/// ordering and visibility of waits and writes under real concurrency.
#[test]
fn batch_ping_pong_with_cpu() {
    setup();
    let s = stream();
    let p = alloc(4096);
    let (ping, pong, pong64) = (p, p + 64, p + 128);
    const ROUNDS: u32 = 1500;
    // SAFETY: the parameter array lives across the call; addresses are in allocation p.
    unsafe {
        for i in 1..=ROUNDS {
            let mut ops: [CUstreamBatchMemOpParams; 4] = std::mem::zeroed();
            ops[0].wait_value = MemOpValueParams {
                operation: memop::WAIT_VALUE_32,
                address: ping,
                v: MemOpValue { value: i },
                flags: CU_STREAM_WAIT_VALUE_EQ,
                alias: 0,
            };
            ops[1].write_value = MemOpValueParams {
                operation: memop::WRITE_VALUE_64,
                address: pong64,
                v: MemOpValue { value64: (i as u64) << 32 | 1 },
                flags: 0,
                alias: 0,
            };
            ops[2].flush_remote_writes = MemOpFlagsParams { operation: memop::FLUSH_REMOTE_WRITES, flags: 0 };
            ops[3].write_value = MemOpValueParams {
                operation: memop::WRITE_VALUE_32,
                address: pong,
                v: MemOpValue { value: i },
                flags: 0,
                alias: 0,
            };
            ok(cuStreamBatchMemOp_v2(s, 4, ops.as_ptr(), 0));
            if i == 1 {
                // The v2 entry points refuse NO_MEMORY_BARRIER, as CUDA 11.7+ does; v1 takes it.
                let mut relaxed = ops[3];
                relaxed.write_value.flags = CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
                assert_eq!(cuStreamBatchMemOp_v2(s, 1, &relaxed, 0), err::INVALID_VALUE);
                assert_eq!(
                    cuStreamWriteValue32_v2(s, pong, i, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                    err::INVALID_VALUE
                );
                assert_eq!(
                    cuStreamWriteValue64_v2(s, pong64, 0, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                    err::INVALID_VALUE
                );
            }
        }
    }
    for i in 1..=ROUNDS {
        a32(ping).store(i, Ordering::Release);
        eventually("pong", || a32(pong).load(Ordering::Acquire) == i);
        // The 64-bit write queued before the 32-bit one is visible once the latter is.
        assert_eq!(a64(pong64).load(Ordering::Acquire), (i as u64) << 32 | 1);
    }
    drain_and_free(s, p);
}

#[test]
fn batch_memop_validation_is_all_or_nothing() {
    setup();
    let s = stream();
    let p = alloc(4096);
    // SAFETY: parameter arrays are local; addresses in allocation p.
    unsafe {
        let mut ops: [CUstreamBatchMemOpParams; 3] = std::mem::zeroed();
        ops[0].write_value = MemOpValueParams {
            operation: memop::WRITE_VALUE_32,
            address: p,
            v: MemOpValue { value: 9 },
            flags: 0,
            alias: 0,
        };
        ops[1].memory_barrier =
            MemOpFlagsParams { operation: memop::BARRIER, flags: CU_STREAM_MEMORY_BARRIER_TYPE_SYS };
        ops[2].write_value = MemOpValueParams {
            operation: memop::WRITE_VALUE_64,
            address: p + 4,
            v: MemOpValue { value64: 1 },
            flags: 0,
            alias: 0,
        };
        // Device memory is not zeroed (a freed neighbour's slot may be reused).
        ok(cuMemsetD8_v2(p, 0, 16));
        assert_eq!(cuStreamBatchMemOp_v2(s, 3, ops.as_ptr(), 0), err::INVALID_VALUE, "misaligned 64-bit write");
        ok(cuStreamSynchronize(s));
        assert_eq!(a32(p).load(Ordering::SeqCst), 0, "nothing of a rejected batch runs");
        ops[2].write_value.address = p + 8;
        ok(cuStreamBatchMemOp_v2(s, 3, ops.as_ptr(), 0));
        ok(cuStreamSynchronize(s));
        assert_eq!((a32(p).load(Ordering::SeqCst), a64(p + 8).load(Ordering::SeqCst)), (9, 1));
        // Zero-length batches succeed (libgdsync probes with them); flags are rejected.
        ok(cuStreamBatchMemOp_v2(null_mut(), 0, std::ptr::null(), 0));
        assert_eq!(cuStreamBatchMemOp_v2(null_mut(), 0, std::ptr::null(), 1), err::INVALID_VALUE);
        assert_eq!(cuStreamBatchMemOp_v2(s, 1, std::ptr::null(), 0), err::INVALID_VALUE);
        let mut bad: [CUstreamBatchMemOpParams; 1] = std::mem::zeroed();
        bad[0].operation = 42;
        assert_eq!(cuStreamBatchMemOp(s, 1, bad.as_ptr(), 0), err::INVALID_VALUE);
        bad[0].flush_remote_writes = MemOpFlagsParams { operation: memop::FLUSH_REMOTE_WRITES, flags: 1 };
        assert_eq!(cuStreamBatchMemOp(s, 1, bad.as_ptr(), 0), err::INVALID_VALUE);
        // Single-op validation.
        assert_eq!(cuStreamWriteValue32_v2(s, p + 2, 1, 0), err::INVALID_VALUE);
        assert_eq!(cuStreamWriteValue32_v2(s, p, 1, 2), err::INVALID_VALUE);
        assert_eq!(cuStreamWaitValue32_v2(s, p, 1, 4), err::INVALID_VALUE);
        assert_eq!(cuStreamWaitValue64_v2(s, p + 4, 1, 0), err::INVALID_VALUE);
        assert_eq!(cuStreamWriteValue64_v2(s, 0x1000, 1, 0), err::INVALID_VALUE, "not device memory");
        // The first slot past `p` that no allocation holds is refused: other tests' allocations
        // may follow `p` back to back (adjacent ranges), so skip over them, with allocations held
        // off so that the answer stands until the call.
        {
            let _layout = DEVICE_LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
            let slot_after = |end: CUdeviceptr| end.next_multiple_of(crate::driver::SUBALLOC_ALIGN);
            let (mut past, mut base, mut size) = (slot_after(p + 4096), 0, 0);
            while cuMemGetAddressRange_v2(&mut base, &mut size, past) == err::SUCCESS {
                past = slot_after(base + size as CUdeviceptr);
            }
            assert_eq!(cuStreamWriteValue32_v2(s, past, 1, 0), err::INVALID_VALUE, "past the allocation");
        }
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(p));
    }
}

#[test]
fn a_wait_blocks_only_its_own_stream_and_events_link_streams() {
    setup();
    let (s1, s2, s3) = (stream(), stream(), stream());
    let p = alloc(4096);
    let (flag, a, b, c) = (p, p + 8, p + 16, p + 24);
    // SAFETY: handles from the API; addresses in allocation p.
    unsafe {
        let (mut ev, mut t0) = (null_mut(), null_mut());
        ok(cuEventCreate(&mut ev, 0));
        ok(cuEventCreate(&mut t0, 0));
        ok(cuEventRecord(t0, s1));
        ok(cuStreamWaitValue32_v2(s1, flag, 1, CU_STREAM_WAIT_VALUE_EQ));
        ok(cuStreamWriteValue32_v2(s1, a, 1, 0));
        ok(cuEventRecord(ev, s1));
        ok(cuStreamWaitEvent(s2, ev, 0));
        ok(cuStreamWriteValue32_v2(s2, b, 1, 0));
        ok(cuStreamWriteValue32_v2(s3, c, 1, 0)); // independent stream
        ok(cuStreamSynchronize(s3));
        assert_eq!(a32(c).load(Ordering::SeqCst), 1, "another stream is not blocked");
        assert_eq!(cuEventQuery(ev), err::NOT_READY);
        assert_eq!(cuStreamQuery(s2), err::NOT_READY);
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, t0, ev), err::NOT_READY);
        stays_false("stream 2 passing the event", || a32(b).load(Ordering::SeqCst) == 1);
        std::thread::sleep(Duration::from_millis(20));
        a32(flag).store(1, Ordering::SeqCst);
        ok(cuEventSynchronize(ev));
        assert_eq!(a32(a).load(Ordering::SeqCst), 1);
        ok(cuStreamSynchronize(s2));
        assert_eq!(a32(b).load(Ordering::SeqCst), 1);
        ok(cuEventQuery(ev));
        ok(cuEventElapsedTime(&mut ms, t0, ev));
        assert!(ms >= 15.0, "elapsed {ms} ms covers the 20 ms wait");
        // Waiting on a never-recorded event is a no-op; timing-disabled events have no time.
        let mut fresh = null_mut();
        ok(cuEventCreate(&mut fresh, CU_EVENT_DISABLE_TIMING));
        ok(cuEventQuery(fresh));
        ok(cuStreamWaitEvent(s2, fresh, 0));
        ok(cuStreamSynchronize(s2));
        ok(cuEventRecord(fresh, s2));
        ok(cuEventSynchronize(fresh));
        assert_eq!(cuEventElapsedTime(&mut ms, t0, fresh), err::INVALID_HANDLE);
        assert_eq!(cuEventCreate(&mut fresh, CU_EVENT_INTERPROCESS), err::INVALID_VALUE);
        ok(cuEventDestroy_v2(ev));
        assert_eq!(cuEventQuery(ev), err::INVALID_HANDLE);
        ok(cuEventDestroy_v2(t0));
        ok(cuEventDestroy_v2(fresh));
        for s in [s1, s2, s3] {
            ok(cuStreamDestroy_v2(s));
        }
        ok(cuMemFree_v2(p));
    }
}

/// cuMemFree waits until no queued stream operation touches the buffer, instead of freeing
/// memory a pending write would hit.
#[test]
fn free_waits_for_pending_stream_work() {
    setup();
    let s = stream();
    let gate = alloc(4096);
    let victim = alloc(4096);
    // SAFETY: handles from the API; addresses in live allocations.
    unsafe {
        ok(cuStreamWaitValue32_v2(s, gate, 1, CU_STREAM_WAIT_VALUE_GEQ));
        ok(cuStreamWriteValue32_v2(s, victim, 3, 0));
    }
    let ctx = {
        let mut c = null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { cuCtxGetCurrent(&mut c) });
        c as usize
    };
    let freed = std::sync::Arc::new(AtomicU32::new(0));
    let f2 = std::sync::Arc::clone(&freed);
    let t = std::thread::spawn(move || {
        // SAFETY: ctx handle from the API; victim is a live allocation.
        unsafe {
            ok(cuCtxSetCurrent(ctx as CUcontext));
            ok(cuMemFree_v2(victim));
        }
        f2.store(1, Ordering::SeqCst);
    });
    stays_false("cuMemFree returning", || freed.load(Ordering::SeqCst) == 1);
    a32(gate).store(1, Ordering::SeqCst);
    t.join().unwrap();
    drain_and_free(s, gate);
}

/// Destroying a context stops its streams, even one blocked on a wait that never completes,
/// and frees its memory.
#[test]
fn context_destroy_aborts_blocked_streams() {
    setup();
    // SAFETY: handles from the API.
    unsafe {
        let mut ev = null_mut();
        ok(cuEventCreate(&mut ev, 0)); // in the primary context: survives the teardown
        let mut c = null_mut();
        ok(cuCtxCreate_v2(&mut c, 0, 0));
        let s = stream();
        let p = alloc(4096);
        ok(cuStreamWaitValue32_v2(s, p, 1, CU_STREAM_WAIT_VALUE_EQ));
        ok(cuMemsetD8Async(p, 1, 4096, s));
        ok(cuEventRecord(ev, s));
        assert_eq!(cuEventQuery(ev), err::NOT_READY);
        let t = Instant::now();
        ok(cuCtxDestroy_v2(c));
        assert!(t.elapsed() < Duration::from_secs(5));
        ok(cuEventSynchronize(ev)); // completed by the teardown, no hang
        ok(cuEventDestroy_v2(ev));
        assert_eq!(cuStreamQuery(s), err::INVALID_HANDLE);
        let mut ty = 0u32;
        assert_eq!(
            cuPointerGetAttribute(&mut ty as *mut u32 as *mut c_void, ptr_attr::MEMORY_TYPE, p),
            err::INVALID_VALUE
        );
    }
}

#[test]
fn get_proc_address_v1_and_v2() {
    // SAFETY: valid C strings and out-pointers.
    unsafe {
        let mut f: *mut c_void = null_mut();
        let mut st = 99u32;
        ok(cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut f, 13000, 0, &mut st));
        assert_eq!((f, st), (cuMemAlloc_v2 as *mut c_void, CU_GET_PROC_ADDRESS_SUCCESS));
        assert_eq!(cuGetProcAddress_v2(c"cuLaunchKernel".as_ptr(), &mut f, 13000, 0, &mut st), err::NOT_FOUND);
        assert_eq!((f, st), (null_mut(), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(cuGetProcAddress_v2(c"cuMemCreate".as_ptr(), &mut f, 10000, 0, &mut st), err::NOT_FOUND);
        assert_eq!(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        ok(cuGetProcAddress(
            c"cuStreamWaitValue32".as_ptr(),
            &mut f,
            12000,
            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        ));
        assert_eq!(f, cuStreamWaitValue32_v2 as *mut c_void);
        ok(cuGetProcAddress_v2(c"cuGetProcAddress".as_ptr(), &mut f, 13030, 0, null_mut()));
        assert_eq!(f, cuGetProcAddress_v2 as *mut c_void);
        assert_eq!(cuGetProcAddress(std::ptr::null(), &mut f, 13000, 0), err::INVALID_VALUE);
        assert_eq!(cuGetProcAddress(c"cuInit".as_ptr(), null_mut(), 13000, 0), err::INVALID_VALUE);
        assert_eq!(cuGetProcAddress(c"cuInit".as_ptr(), &mut f, 13000, 4), err::INVALID_VALUE);
    }
}

#[test]
fn unsupported_entry_points_say_so() {
    assert_eq!(crate::stubs::cuLaunchKernel(), err::NOT_SUPPORTED);
    assert_eq!(crate::stubs::cuMemAllocManaged(), err::NOT_SUPPORTED);
    setup();
    let p = alloc(0x10000);
    let mut fd = -1;
    // SAFETY: valid out-pointer; p is a live allocation.
    unsafe {
        // Without CUDASIM_DMABUF=1 in host mode (the dlopen test covers the enabled case; on
        // gpusim the export works: gpusim_exports_kernel_dma_bufs).
        if std::env::var("CUDASIM_DMABUF").is_err() && !gpusim_mode() {
            assert_eq!(
                cuMemGetHandleForAddressRange(&mut fd as *mut i32 as *mut c_void, p, 0x10000, 1, 0),
                err::NOT_SUPPORTED
            );
        }
        ok(cuMemFree_v2(p));
    }
}

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
    let size = crate::driver::REGION_SIZE as usize;
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

/// Several threads allocate, queue work on their own streams, synchronise and free at once:
/// the shared tables and per-stream queues must stay consistent.
#[test]
fn threads_hammer_the_driver_concurrently() {
    let ctx = setup() as usize;
    let workers: Vec<_> = (0..4u32)
        .map(|t| {
            std::thread::spawn(move || {
                // SAFETY: handles from the API; buffers are live until freed at the end.
                unsafe {
                    ok(cuCtxSetCurrent(ctx as CUcontext));
                    let s = stream();
                    for i in 0..50u32 {
                        let p = alloc(8192 + (i as usize) * 64);
                        let v = t << 16 | i;
                        ok(cuMemsetD32Async(p, v, 2048, s));
                        ok(cuStreamWriteValue64_v2(s, p + 8, (v as u64) << 32, 0));
                        ok(cuStreamWaitValue32_v2(s, p + 12, v, CU_STREAM_WAIT_VALUE_EQ));
                        let mut out = [0u32; 4];
                        ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, p, 16, s));
                        ok(cuStreamSynchronize(s));
                        assert_eq!(out, [v, v, 0, v]);
                        ok(cuMemFree_v2(p));
                    }
                    ok(cuStreamDestroy_v2(s));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn freeing_a_suballocation_releases_only_pages_no_live_allocation_uses() {
    use crate::driver::{GPU_PAGE, released_pages};
    use std::collections::BTreeMap;
    const P: u64 = GPU_PAGE;
    // Live neighbours share the freed slot's first and last page: nothing is released.
    let live: BTreeMap<u64, u64> = [(0, 0x100), (P + 0x300, 0x100)].into();
    assert_eq!(released_pages(&live, 0x100, P + 0x200), None);
    // The same slot with the neighbours gone: both pages go.
    assert_eq!(released_pages(&BTreeMap::new(), 0x100, P + 0x200), Some((0, 2 * P)));
    // A slot over several pages keeps only the shared edge pages.
    let neighbours: BTreeMap<u64, u64> = [(0, 0x100), (4 * P + 0x100, 0x100)].into();
    assert_eq!(released_pages(&neighbours, 0x100, 4 * P), Some((P, 3 * P)), "first page shared, last page free");
    let tail: BTreeMap<u64, u64> = [(4 * P, 0x100)].into();
    assert_eq!(released_pages(&tail, 0, 4 * P + 0x100 - 0x100), Some((0, 4 * P)), "ends on a page boundary");
    let last: BTreeMap<u64, u64> = [(3 * P + 0x80, 0x100)].into();
    assert_eq!(released_pages(&last, 0, 3 * P + 0x80), Some((0, 3 * P)), "last page shared");
    // The last allocation of a page releases it.
    let other: BTreeMap<u64, u64> = [(2 * P, 0x100)].into();
    assert_eq!(released_pages(&other, 0x200, 0x100), Some((0, P)));
}
