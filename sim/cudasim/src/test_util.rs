//! Helpers of the unit tests that drive the C API through the rlib (the same functions the cdylib
//! exports).
//!
//! Tests run in parallel threads of one process and share the driver; each thread makes the
//! primary context of device 0 current (and never drops it to refcount 0).

use crate::capi::*;
use crate::types::*;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

#[track_caller]
pub(crate) fn ok(r: CUresult) {
    assert_eq!(r, err::SUCCESS, "expected CUDA_SUCCESS, got {}", error_entry(r).map_or("?", |e| e.1));
}

pub(crate) fn setup() -> CUcontext {
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
pub(crate) static DEVICE_LAYOUT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A zeroed device allocation: cuMemAlloc does not clear memory, and with sub-allocation a slot
/// freed by another test (they run in parallel) may come back with its old bytes.
pub(crate) fn alloc(n: usize) -> CUdeviceptr {
    let mut p = 0;
    let _layout = DEVICE_LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: valid out-pointer; the memset covers exactly the new allocation.
    unsafe {
        ok(cuMemAlloc_v2(&mut p, n));
        ok(cuMemsetD8_v2(p, 0, n));
    }
    p
}

pub(crate) fn stream() -> CUstream {
    let mut s = null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cuStreamCreate(&mut s, 0) });
    s
}

pub(crate) fn a32(p: CUdeviceptr) -> &'static AtomicU32 {
    // SAFETY: tests only pass 4-aligned device pointers that stay allocated while used (host
    // mode: device memory is process memory).
    unsafe { AtomicU32::from_ptr(p as *mut u32) }
}

pub(crate) fn a64(p: CUdeviceptr) -> &'static AtomicU64 {
    // SAFETY: as a32, 8-aligned.
    unsafe { AtomicU64::from_ptr(p as *mut u64) }
}

/// Drains stream `s`, destroys it and frees `p`, each call expected to succeed.
#[track_caller]
pub(crate) fn drain_and_free(s: CUstream, p: CUdeviceptr) {
    // SAFETY: the tests pass a live stream and a live allocation, both from the API.
    unsafe {
        ok(cuStreamSynchronize(s));
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(p));
    }
}

/// Polls until `f` holds or 10 s pass.
#[track_caller]
pub(crate) fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Asserts that `f` stays false for a while (the stream is really blocked).
#[track_caller]
pub(crate) fn stays_false(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(30) {
        assert!(!f(), "{what} happened too early");
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// True when device memory comes from /dev/gpusim (the VM suite).
pub(crate) fn gpusim_mode() -> bool {
    std::path::Path::new("/dev/gpusim").exists() && std::env::var("CUDASIM_BACKEND").map_or(true, |v| v != "host")
}
