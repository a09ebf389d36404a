//! The C ABI with NULL, bogus and stale arguments, on any machine (no device needed for most):
//! every function answers with the errno of docs/return-values.md and touches no output.

mod common;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;

use common::*;
use gdrapi::abi::*;

const EINVAL: i32 = libc::EINVAL;

fn bogus_instances() -> Vec<GdrT> {
    static FAKE: [u64; 6] = [0; 6];
    vec![std::ptr::null_mut(), 1 as GdrT, FAKE.as_ptr() as GdrT, usize::MAX as GdrT]
}

fn bogus_handles() -> Vec<GdrMh> {
    static FAKE: [u64; 13] = [0; 13];
    vec![GdrMh { h: 0 }, GdrMh { h: 1 }, GdrMh { h: FAKE.as_ptr() as _ }, GdrMh { h: !0 }]
}

#[test]
fn runtime_version_is_2_6_and_tolerates_null() {
    let (mut ma, mut mi) = (-1, -1);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    unsafe { capi::gdr_runtime_get_version(&mut ma, &mut mi) };
    assert_eq!((ma, mi), (2, 6));
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    unsafe { capi::gdr_runtime_get_version(std::ptr::null_mut(), std::ptr::null_mut()) };
    mi = -1;
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    unsafe { capi::gdr_runtime_get_version(std::ptr::null_mut(), &mut mi) };
    assert_eq!(mi, 6);
}

#[test]
fn mapping_type_strings() {
    for (t, name) in [(0, "None"), (1, "Write Combining"), (2, "Caching"), (3, "Device")] {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
        assert_eq!(unsafe { capi::gdr_get_mapping_type_string(t, &mut p) }, 0);
        // SAFETY: on success the library stores a pointer to a static NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), name);
    }
    for bad in [4, -1, 5, c_int::MAX, c_int::MIN] {
        let sentinel = c"untouched".as_ptr();
        let mut p = sentinel;
        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
        assert_eq!(unsafe { capi::gdr_get_mapping_type_string(bad, &mut p) }, EINVAL, "type {bad}");
        assert_eq!(p, sentinel);
    }
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_mapping_type_string(1, std::ptr::null_mut()) }, EINVAL);
}

#[test]
fn every_function_rejects_a_bad_instance() {
    for g in bogus_instances() {
        for h in bogus_handles() {
            let mut out = GdrMh { h: 0x5a5a };
            assert_eq!(capi::gdr_close(g), EINVAL);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_pin_buffer(g, 0x10000, 0x10000, 0, 0, &mut out) }, EINVAL);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_pin_buffer_v2(g, 0x10000, 0x10000, 1, &mut out) }, EINVAL);
            assert_eq!(out.h, 0x5a5a, "handle written on failure");
            assert_eq!(capi::gdr_unpin_buffer(g, h), EINVAL);
            let mut flag = 77;
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_get_callback_flag(g, h, &mut flag) }, EINVAL);
            assert_eq!(flag, 77);
            let mut info = GdrInfoV2 { va: 0xabc, ..Default::default() };
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_get_info_v2(g, h, &mut info) }, EINVAL);
            assert_eq!(info.va, 0xabc);
            let mut info1 = GdrInfoV1 { va: 0xabc, ..Default::default() };
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_get_info(g, h, &mut info1) }, EINVAL);
            assert_eq!(info1.va, 0xabc);
            let mut va = 0x1234 as *mut c_void;
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_map(g, h, &mut va, 0x10000) }, EINVAL);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_map_v2(g, h, &mut va, 0x10000, 1) }, EINVAL);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_map_v2(g, h, &mut va, 0x10000, 42) }, EINVAL);
            assert_eq!(va, 0x1234 as *mut c_void);
            assert_eq!(capi::gdr_unmap(g, h, 0x10000 as *mut c_void, 0x10000), EINVAL);
            let (mut ma, mut mi) = (77, 77);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_driver_get_version(g, &mut ma, &mut mi) }, EINVAL);
            assert_eq!((ma, mi), (77, 77));
            let mut v = 77;
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &mut v) }, EINVAL);
            assert_eq!(v, 0, "gdr_get_attribute writes *v = 0 first, as upstream");
        }
    }
}

#[test]
fn null_out_pointers_are_einval() {
    let g = std::ptr::null_mut();
    let h = GdrMh { h: 0 };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_pin_buffer(g, 0x10000, 1, 0, 0, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_pin_buffer_v2(g, 0x10000, 1, 0, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_callback_flag(g, h, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info_v2(g, h, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info(g, h, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_map(g, h, std::ptr::null_mut(), 1) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_map_v2(g, h, std::ptr::null_mut(), 1, 0) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_attribute(g, 1, std::ptr::null_mut()) }, EINVAL);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_driver_get_version(g, std::ptr::null_mut(), std::ptr::null_mut()) }, EINVAL);
}

#[test]
fn copies_with_a_bad_handle_touch_nothing() {
    let mut host = [0x11u8; 64];
    let mut dev = [0x22u8; 64];
    for h in bogus_handles() {
        for n in [0, 1, 64] {
            assert_eq!(
                // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                unsafe { capi::gdr_copy_to_mapping(h, dev.as_mut_ptr().cast(), host.as_ptr().cast(), n) },
                EINVAL
            );
            assert_eq!(
                // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                unsafe { capi::gdr_copy_from_mapping(h, host.as_mut_ptr().cast(), dev.as_ptr().cast(), n) },
                EINVAL
            );
        }
        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
        assert_eq!(unsafe { capi::gdr_copy_to_mapping(h, std::ptr::null_mut(), std::ptr::null(), 16) }, EINVAL);
    }
    assert!(host.iter().all(|&b| b == 0x11) && dev.iter().all(|&b| b == 0x22));
}

/// Set in the re-executed child of `open_without_gdrdrv_returns_null`.
const NO_CUDA_CHILD: &str = "GDRAPI_TEST_NO_CUDA_CHILD";

#[test]
fn open_without_gdrdrv_returns_null() {
    const TEST: &str = "open_without_gdrdrv_returns_null";
    if Path::new("/dev/gdrdrv").exists() {
        // The VM and GPU machines: the precondition is the opposite of what they provide.
        println!("SKIP {TEST}: /dev/gdrdrv exists here");
        return;
    }
    if std::env::var_os(NO_CUDA_CHILD).is_none() {
        // cargo puts target/ on LD_LIBRARY_PATH, where cudasim's libcuda.so may be, and the
        // loader reads that variable only at start-up: run the test again in a process without
        // it (and without anything that could make a libcuda offer dma-buf).
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(NO_CUDA_CHILD, "1")
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("GDRCOPY_USE_DMABUF_MMAP")
            .env_remove("CUDASIM_DMABUF")
            .env_remove("CUDASIM_DRIVER_VERSION")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child run failed:\n{text}");
        if let Some(line) = text.lines().find(|l| l.starts_with("SKIP")) {
            println!("{line}");
        } else {
            assert!(text.contains("gdr_open returned NULL without gdrdrv"), "the child asserted nothing:\n{text}");
            println!("{TEST}: asserted in a child process without LD_LIBRARY_PATH");
        }
        return;
    }
    // A system libcuda (a GPU machine without gdrdrv) could satisfy gdr_open through dma-buf.
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: dlopen with a literal name; the handle is only tested for NULL and closed.
        let cuda = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY) };
        if !cuda.is_null() {
            // SAFETY: a handle dlopen just returned.
            unsafe { libc::dlclose(cuda) };
            println!("SKIP {TEST}: {name:?} is loadable without LD_LIBRARY_PATH here");
            return;
        }
    }
    assert!(capi::gdr_open().is_null());
    assert_eq!(gdrapi::Gdr::open().err(), Some(gdrapi::Errno::ENODEV));
    println!("{TEST}: gdr_open returned NULL without gdrdrv and without libcuda");
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn live_instance_rejects_bogus_handles_and_attributes() {
    if !Path::new("/dev/gdrdrv").exists() {
        skip("live_instance_rejects_bogus_handles_and_attributes", "missing /dev/gdrdrv");
        return;
    }
    let g = open();
    for h in bogus_handles() {
        assert_eq!(capi::gdr_unpin_buffer(g, h), EINVAL);
        assert_eq!(callback_flag(g, h), Err(EINVAL));
        assert_eq!(info(g, h).err(), Some(EINVAL));
        assert_eq!(map(g, h, GPU_PAGE, 0).err(), Some(EINVAL));
        assert_eq!(capi::gdr_unmap(g, h, 0x10000 as *mut c_void, GPU_PAGE), EINVAL);
    }
    for bad in [0, 4, -1, 1000] {
        assert_eq!(attribute(g, bad), Err(EINVAL), "attribute {bad}");
    }
    assert_eq!(attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP), Ok(0));
    let (mut ma, mut mi) = (0, 0);
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_driver_get_version(g, &mut ma, &mut mi) }, 0);
    assert_eq!((ma, mi), (2, 6), "driver version");
    // gdrdrv refuses GPU address 0.
    assert_eq!(pin(g, 0, GPU_PAGE).err(), Some(EINVAL));
    assert_eq!(capi::gdr_close(g), 0);
    assert_eq!(capi::gdr_close(g), EINVAL, "double close");
    assert_eq!(attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING), Err(EINVAL), "closed instance");
}
