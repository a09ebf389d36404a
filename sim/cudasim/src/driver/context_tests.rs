//! Tests of contexts (context.rs) through the C API: the context stack, primary contexts and
//! the teardown of a context with blocked streams.

use crate::capi::*;
use crate::test_util::*;
use crate::types::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

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
