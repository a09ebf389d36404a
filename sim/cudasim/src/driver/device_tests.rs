//! Tests of the device queries (device.rs) through the C API.

use crate::capi::*;
use crate::test_util::*;
use crate::types::*;
use std::ffi::CStr;
use std::ptr::null_mut;

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
