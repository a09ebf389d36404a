//! Unit tests of the C API's own pieces through the rlib: error names, cuGetProcAddress and the
//! unsupported entry points. The driver's concepts have theirs beside them (`driver/*_tests.rs`);
//! the shared helpers are in `test_util.rs`.

use crate::capi::*;
use crate::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};
use crate::test_util::*;
use crate::types::*;
use std::ffi::{CStr, c_void};
use std::ptr::null_mut;

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
