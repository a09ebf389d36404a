//! Tests of device and host memory (memory.rs) through the C API: allocation, copies, memset,
//! host allocations and registrations, pointer attributes, and frees that wait for streams.

use crate::capi::*;
use crate::test_util::*;
use crate::types::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

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
