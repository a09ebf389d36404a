//! The dma-buf backend end to end, on any machine: the simulated libcuda (`sim/cudasim`) in
//! host-memory mode exports allocations as memfd-backed dma-bufs when `CUDASIM_DMABUF=1`, and
//! reports a CUDA 13.3 driver with `CUDASIM_DRIVER_VERSION=13030`.
//!
//! The dynamic loader reads `LD_LIBRARY_PATH` only at start-up, so the test re-executes itself
//! with a directory holding `libcuda.so.1` → cudasim first on the path.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::process::Command;

use gdrapi::abi::*;
use gdrapi::{Attribute, Errno, Gdr, MappingType, capi};
use gpudirect_common::cuda::{Driver, as_fn};

const CHILD: &str = "GDRAPI_DMABUF_TEST_CHILD";
const SIZE: usize = 1 << 20;

/// The cudasim library next to the test's profile directory, if it was built, or the staged one
/// (`$STAGE_LIB/libcuda.so`, exported by the VM harness, which runs staged test binaries).
fn cudasim_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    let staged = std::env::var_os("STAGE_LIB").map(|d| PathBuf::from(d).join("libcuda.so"));
    std::iter::once(profile.join("libcuda.so")).chain(staged).find(|l| l.exists())
}

fn run_in_child(test: &str) {
    run_in_child_with(test, &[]);
}

/// [`run_in_child`] with more environment variables; returns the child's output.
fn run_in_child_with(test: &str, env: &[(&str, &str)]) -> String {
    // cudasim is built with the workspace: without it the test fails rather than pass unrun.
    let sim = cudasim_library()
        .unwrap_or_else(|| panic!("{test}: missing the simulated libcuda: cargo build --release -p cudasim"));
    let dir = std::env::temp_dir().join(format!("gdrapi-dmabuf-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&sim, &link).unwrap();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .env("CUDASIM_DMABUF", "1")
        // CUDASIM_BACKEND is inherited: host memory on a host, gpusim's kernel dma-bufs where
        // /dev/gpusim exists (the VM; suite 36 sets it to gpusim and counts the exports).
        .env("CUDASIM_DRIVER_VERSION", "13030")
        .env("GDRCOPY_USE_DMABUF_MMAP", "1")
        .env("GDRCOPY_ENABLE_LOGGING", "1")
        .env("GDRCOPY_LOG_LEVEL", "3")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child run of {test} failed:\n{text}");
    assert!(text.contains("1 passed"), "child did not run {test}:\n{text}");
    text
}

/// The few CUDA calls the test makes itself, through the same loader the library uses.
struct Cuda {
    _driver: Driver,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> c_int,
    mem_free: unsafe extern "C" fn(u64) -> c_int,
    htod: unsafe extern "C" fn(u64, *const c_void, usize) -> c_int,
    dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> c_int,
}

impl Cuda {
    fn init() -> Cuda {
        let driver = Driver::load("libcuda.so.1").expect("cudasim on LD_LIBRARY_PATH");
        let get = |n: &std::ffi::CStr| driver.resolve(n, 12000).unwrap_or_else(|r| panic!("{n:?}: {r}"));
        // SAFETY: each symbol is resolved by name at CUDA 12.0 and cast to its cuda.h signature.
        unsafe {
            let init: unsafe extern "C" fn(c_uint) -> c_int = as_fn(get(c"cuInit"));
            let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int =
                as_fn(get(c"cuDevicePrimaryCtxRetain"));
            let set: unsafe extern "C" fn(*mut c_void) -> c_int = as_fn(get(c"cuCtxSetCurrent"));
            assert_eq!(init(0), 0);
            let mut ctx = std::ptr::null_mut();
            assert_eq!(retain(&mut ctx, 0), 0);
            assert_eq!(set(ctx), 0);
            Cuda {
                mem_alloc: as_fn(get(c"cuMemAlloc")),
                mem_free: as_fn(get(c"cuMemFree")),
                htod: as_fn(get(c"cuMemcpyHtoD")),
                dtoh: as_fn(get(c"cuMemcpyDtoH")),
                _driver: driver,
            }
        }
    }

    fn alloc(&self, size: usize) -> u64 {
        let mut p = 0u64;
        // SAFETY: p is a valid out pointer.
        assert_eq!(unsafe { (self.mem_alloc)(&mut p, size) }, 0);
        p
    }

    fn read(&self, src: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: v holds len writable bytes; src is a live allocation of at least len bytes.
        assert_eq!(unsafe { (self.dtoh)(v.as_mut_ptr().cast(), src, len) }, 0);
        v
    }

    fn write(&self, dst: u64, data: &[u8]) {
        // SAFETY: data is a live slice; dst is a live allocation of at least data.len() bytes.
        assert_eq!(unsafe { (self.htod)(dst, data.as_ptr().cast(), data.len()) }, 0);
    }

    fn free(&self, p: u64) {
        // SAFETY: p came from cuMemAlloc and is freed once.
        assert_eq!(unsafe { (self.mem_free)(p) }, 0);
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn dma_buf_backend_pins_maps_and_copies() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_backend_pins_maps_and_copies");
    }
    let cuda = Cuda::init();
    let gdr = Gdr::open().expect("dma-buf backend with cudasim");
    assert_eq!(gdr.attribute(Attribute::UsingDmaBufMmap), Ok(1));
    assert_eq!(gdr.attribute(Attribute::UsePersistentMapping), Ok(1));
    assert_eq!(gdr.attribute(Attribute::SupportPinFlagForcePcie), Ok(1));
    assert_eq!(gdr.driver_version(), Err(Errno::EBADF));

    let dptr = cuda.alloc(SIZE);
    {
        let buf = gdr.pin(dptr, SIZE as u64).unwrap();
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let info = buf.info().unwrap();
        assert_eq!((info.va, info.mapped_size, info.page_size as usize), (dptr, SIZE as u64, page));
        assert_eq!((info.tm_cycles, info.cycles_per_ms), (0, 0));
        assert_eq!(info.mapping_type, MappingType::None);
        assert_eq!(buf.invalidated(), Ok(false));

        let mut map = buf.map().unwrap();
        assert_eq!(map.mapping_type(), MappingType::WriteCombined);
        assert_eq!(buf.info().unwrap().mapping_type, MappingType::WriteCombined);
        // A second mapping of the same handle is refused while the first lives.
        assert!(matches!(buf.map_as(SIZE, GDR_MAP_FLAG_DEFAULT), Err(Errno::EAGAIN)));

        // Written through the mapping at odd offsets and sizes, read by the "GPU" (cuMemcpyDtoH).
        for (off, len) in [(0usize, 1usize), (3, 17), (64, 4096), (4097, 65_535), (SIZE - 100, 100)] {
            let data = pattern(off as u8, len);
            map.write(off, &data).unwrap();
            assert_eq!(cuda.read(dptr + off as u64, len), data, "GPU view after write at {off}+{len}");
        }
        // Written by the "GPU", read through the mapping.
        let data = pattern(7, SIZE);
        cuda.write(dptr, &data);
        let mut back = vec![0u8; SIZE];
        map.read(0, &mut back).unwrap();
        assert_eq!(back, data);
        // Outside the mapping: refused, not a fault.
        assert_eq!(map.write(SIZE - 1, &[1, 2]), Err(Errno::EINVAL));
    }

    // A request for a type other than the pin-time one is refused; an unaligned pin cannot map.
    {
        let buf = gdr.pin(dptr, SIZE as u64).unwrap();
        assert!(matches!(buf.map_as(SIZE, GDR_MAP_FLAG_REQ_CACHE_MAPPING), Err(Errno::EINVAL)));
        let unaligned = gdr.pin(dptr + 100, 4096).unwrap();
        assert!(matches!(unaligned.map_as(4096, GDR_MAP_FLAG_DEFAULT), Err(Errno::EINVAL)));
        // More than was pinned: refused (a real exporter's dma-buf ends where the pin ends).
        let small = gdr.pin(dptr, 1 << 16).unwrap();
        assert!(matches!(small.map_as(2 << 16, GDR_MAP_FLAG_DEFAULT), Err(Errno::EINVAL)));
        assert!(small.map_as(1 << 16, GDR_MAP_FLAG_DEFAULT).is_ok());
    }

    // The legacy gdr_get_info has no fd to talk to in this backend: EBADF, as upstream.
    let g = capi::gdr_open();
    assert!(!g.is_null());
    let mut mh = GdrMh { h: 0 };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_pin_buffer_v2(g, dptr as _, SIZE, 0, &mut mh) }, 0);
    let mut v1 = GdrInfoV1::default();
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_get_info(g, mh, &mut v1) }, libc_ebadf());
    assert_eq!(capi::gdr_close(g), 0);
    cuda.free(dptr);
}

/// cudasim sub-allocates small cuMemAllocs as CUDA does: a buffer that starts 4 KiB into a 2 MiB
/// region (host-page aligned, not 64 KiB aligned) and shares host pages with its neighbours pins,
/// maps and copies at `ptr - info.va`, without touching the neighbours' bytes.
#[test]
fn dma_buf_backend_pins_a_suballocated_buffer() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_backend_pins_a_suballocated_buffer");
    }
    let cuda = Cuda::init();
    let gdr = Gdr::open().expect("dma-buf backend with cudasim");
    let a = cuda.alloc(4096);
    let b = cuda.alloc(3000);
    let c = cuda.alloc(256);
    assert_eq!(a % (2 << 20), 0, "a fresh process's first allocation starts a 2 MiB region");
    assert_eq!((b, c), (a + 4096, a + 4096 + 3072), "small allocations are adjacent (256-byte slots)");
    assert_ne!(b % 65536, 0);
    let (pa, pc) = (pattern(0xa0, 4096), pattern(0xc0, 256));
    cuda.write(a, &pa);
    cuda.write(c, &pc);

    let buf = gdr.pin(b, 3000).unwrap();
    let info = buf.info().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    assert_eq!(info.va, b & !(page - 1), "dma-buf backend: va rounded down to the host page");
    assert_eq!(info.mapped_size, (b + 3000 - info.va).div_ceil(page) * page);
    let off = (b - info.va) as usize;
    let mut map = buf.map().unwrap();
    let data = pattern(0x5b, 3000);
    map.write(off, &data).unwrap();
    assert_eq!(cuda.read(b, 3000), data, "GPU view of the buffer after a write through the mapping");
    assert_eq!((cuda.read(a, 4096), cuda.read(c, 256)), (pa.clone(), pc.clone()), "neighbours untouched");
    let data2 = pattern(0x77, 3000);
    cuda.write(b, &data2);
    let mut back = vec![0u8; 3000];
    map.read(off, &mut back).unwrap();
    assert_eq!(back, data2, "mapping view after a GPU write");

    // Freeing a neighbour leaves the buffer, its pin and its mapping alone.
    cuda.free(a);
    assert_eq!(buf.invalidated(), Ok(false));
    map.read(off, &mut back).unwrap();
    assert_eq!(back, data2);
    assert_eq!(cuda.read(c, 256), pc);
    drop(map);
    drop(buf);
    cuda.free(b);
    cuda.free(c);
}

fn libc_ebadf() -> c_int {
    Errno::EBADF.0
}

#[test]
fn dma_buf_backend_refuses_an_old_driver() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_backend_refuses_an_old_driver");
    }
    // The child inherits CUDASIM_DRIVER_VERSION=13030; this case needs an older driver.
    // SAFETY: the test process runs this test alone (--test-threads=1) and sets the variable
    // before anything reads it (libcuda is loaded only by gdr_open below).
    unsafe { std::env::set_var("CUDASIM_DRIVER_VERSION", "13000") };
    let g = capi::gdr_open();
    assert!(g.is_null(), "a CUDA 13.0 driver must not give a dma-buf backend");
}

/// Several threads pin, map, copy, unmap and unpin on one `gdr_t` at once (the registry must never
/// take another thread's fresh handle for a dead one).
#[test]
fn dma_buf_many_threads_one_instance() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_many_threads_one_instance");
    }
    let cuda = Cuda::init();
    let g = capi::gdr_open() as usize;
    assert_ne!(g, 0);
    const BUF: usize = 64 << 10;
    let bufs: Vec<u64> = (0..8).map(|_| cuda.alloc(BUF)).collect();
    std::thread::scope(|s| {
        for (t, &dptr) in bufs.iter().enumerate() {
            s.spawn(move || {
                let g = g as capi::GdrT;
                for round in 0..2000 {
                    let mut mh = GdrMh { h: 0 };
                    assert_eq!(
                        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                        unsafe { capi::gdr_pin_buffer_v2(g, dptr as _, BUF, 0, &mut mh) },
                        0,
                        "pin t{t} r{round}"
                    );
                    let mut va = std::ptr::null_mut();
                    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                    assert_eq!(unsafe { capi::gdr_map(g, mh, &mut va, BUF) }, 0, "map t{t} r{round}");
                    let data = pattern((t * 7 + round) as u8, 256);
                    assert_eq!(
                        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                        unsafe { capi::gdr_copy_to_mapping(mh, va, data.as_ptr().cast(), data.len()) },
                        0,
                        "copy t{t} r{round}"
                    );
                    let mut back = vec![0u8; data.len()];
                    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                    assert_eq!(unsafe { capi::gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), va, back.len()) }, 0);
                    assert_eq!(back, data, "t{t} r{round}");
                    assert_eq!(capi::gdr_unmap(g, mh, va, BUF), 0, "unmap t{t} r{round}");
                    assert_eq!(capi::gdr_unpin_buffer(g, mh), 0, "unpin t{t} r{round}");
                }
            });
        }
    });
    assert_eq!(capi::gdr_close(g as capi::GdrT), 0);
    for p in bufs {
        cuda.free(p);
    }
}

/// A fresh allocation of `len` bytes, pinned and mapped through the C ABI: (device address,
/// handle, mapping address).
fn pin_and_map(cuda: &Cuda, g: capi::GdrT, len: usize) -> (u64, GdrMh, usize) {
    let dptr = cuda.alloc(len);
    let mut mh = GdrMh { h: 0 };
    // SAFETY: pointers to live locals of this function.
    assert_eq!(unsafe { capi::gdr_pin_buffer_v2(g, dptr as _, len, 0, &mut mh) }, 0);
    let mut va = std::ptr::null_mut();
    // SAFETY: as above.
    assert_eq!(unsafe { capi::gdr_map(g, mh, &mut va, len) }, 0);
    (dptr, mh, va as usize)
}

/// The public copy calls after a thread's first copy (their lock-free fast path from then on):
/// every device offset in a line and sizes around every access width, both directions, against
/// what the "GPU" sees, with the bytes around each range left alone; then every refusal the fast
/// path hands to the general one: size 0, NULL host, outside the mapping, unmapped, unpinned.
#[test]
fn dma_buf_public_copies_fast_path_exact_and_refusals() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_public_copies_fast_path_exact_and_refusals");
    }
    fast_path_exact_and_refusals();
}

/// The same with the zmm loads refused (`GDRCOPY_COPY_NO_AVX512=1`): on a CPU with AVX-512 VBMI
/// this is what tests the loads of CPUs without it (16-byte chunks through general registers, the
/// line kernel between partial lines); the child's engine summary must say they are off.
#[test]
fn dma_buf_public_copies_fast_path_without_avx512() {
    if std::env::var_os(CHILD).is_some() {
        return fast_path_exact_and_refusals();
    }
    let env = [("GDRCOPY_COPY_NO_AVX512", "1"), ("GDRCOPY_LOG_LEVEL", "1")];
    let text = run_in_child_with("dma_buf_public_copies_fast_path_without_avx512", &env);
    let summary =
        text.lines().find(|l| l.contains("copy engines:")).unwrap_or_else(|| panic!("no engine summary:\n{text}"));
    assert!(!summary.contains("VBMI realign"), "{summary}");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512vbmi") {
        assert!(summary.contains("not used: GDRCOPY_COPY_NO_AVX512"), "{summary}");
    } else {
        println!("note: the CPU has no AVX-512 VBMI, so both fast-path tests take the same load paths");
    }
}

/// The body of the two fast-path tests above (in a child process with cudasim).
fn fast_path_exact_and_refusals() {
    const BUF: usize = 64 << 10;
    let cuda = Cuda::init();
    let g = capi::gdr_open();
    assert!(!g.is_null());
    let (dptr, mh, va) = pin_and_map(&cuda, g, BUF);
    let va = va as *mut c_void;
    let to = |off: usize, data: &[u8]| {
        // SAFETY: `data` is live; the device range is checked by the call itself.
        unsafe { capi::gdr_copy_to_mapping(mh, va.cast::<u8>().add(off).cast(), data.as_ptr().cast(), data.len()) }
    };
    let from = |off: usize, out: &mut [u8]| {
        // SAFETY: `out` is live; the device range is checked by the call itself.
        unsafe { capi::gdr_copy_from_mapping(mh, out.as_mut_ptr().cast(), va.cast::<u8>().add(off).cast(), out.len()) }
    };
    assert_eq!(to(0, &[1]), 0, "the first copy claims this thread's line");
    // Copies below would pass through the general path too; make sure they test the fast one.
    let fast = capi::fast_path_ready(mh);
    match fast {
        Some(ready) => assert!(ready, "a write-combined dma-buf mapping takes the fast path"),
        None => eprintln!("fast path unavailable in this process (no membarrier): only the general path is tested"),
    }

    let base = pattern(0x5a, 4096);
    let lens: Vec<usize> = (1..=40).chain([63, 64, 65, 100, 127, 128, 129, 255, 300, 511, 513, 1000, 2049]).collect();
    for off in 0..64usize {
        for &len in &lens {
            let at = 128 + off;
            cuda.write(dptr, &base);
            let data = pattern((off * 31 + len) as u8, len);
            assert_eq!(to(at, &data), 0, "store {len} at +{off}");
            let mut want = base.clone();
            want[at..at + len].copy_from_slice(&data);
            assert_eq!(cuda.read(dptr, base.len()), want, "GPU view after a store of {len} at +{off}");
            // Host side one byte into a poisoned buffer: only the requested bytes change.
            let mut out = vec![0xeeu8; len + 2];
            assert_eq!(from(at, &mut out[1..=len]), 0, "load {len} at +{off}");
            assert_eq!(&out[1..=len], &data[..], "load {len} at +{off}");
            assert_eq!((out[0], out[len + 1]), (0xee, 0xee), "host bytes around a load of {len} at +{off}");
        }
    }

    let mut one = [0u8; 8];
    assert_eq!(to(0, &[]), 0, "size 0");
    // SAFETY: a NULL host pointer, which the call must refuse.
    assert_eq!(unsafe { capi::gdr_copy_to_mapping(mh, va, std::ptr::null(), 8) }, libc::EINVAL);
    // SAFETY: as above.
    assert_eq!(unsafe { capi::gdr_copy_from_mapping(mh, std::ptr::null_mut(), va, 8) }, libc::EINVAL);
    assert_eq!(from(BUF - 4, &mut one), libc::EINVAL, "past the end");
    assert_eq!(to(BUF, &one), libc::EINVAL, "at the end");
    let before = GdrMh { h: mh.h - 128 };
    // SAFETY: a value that is not a handle, which the call must refuse.
    assert_eq!(unsafe { capi::gdr_copy_to_mapping(before, va, one.as_ptr().cast(), 8) }, libc::EINVAL);
    assert_eq!(capi::gdr_unmap(g, mh, va, BUF), 0);
    if fast.is_some() {
        assert_eq!(capi::fast_path_ready(mh), Some(false), "an unmapped handle leaves the fast path");
    }
    assert_eq!(from(0, &mut one), libc::EINVAL, "unmapped");
    assert_eq!(capi::gdr_unpin_buffer(g, mh), 0);
    assert_eq!(to(0, &one), libc::EINVAL, "unpinned");
    assert_eq!(capi::gdr_close(g), 0);
    cuda.free(dptr);
}

/// A mapping another thread last copied through is parked by `gdr_unmap` (that thread's
/// announcement still names the handle: src/parking.rs) and released at the first control call
/// after that thread copied through another handle; one only the unmapping thread copied through
/// is unmapped at once.
#[test]
fn dma_buf_unmap_parks_what_another_thread_may_use() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_unmap_parks_what_another_thread_may_use");
    }
    const BUF: usize = 64 << 10;
    let cuda = Cuda::init();
    let g = capi::gdr_open();
    assert!(!g.is_null());
    let map = || pin_and_map(&cuda, g, BUF);
    let copy = |mh: GdrMh, va: usize| {
        let v = 7u64;
        // SAFETY: `v` is live; 8 bytes at the start of a live mapping.
        assert_eq!(unsafe { capi::gdr_copy_to_mapping(mh, va as *mut c_void, (&raw const v).cast(), 8) }, 0);
    };
    let (a, b, c) = (map(), map(), map());
    let mapped = |va: usize| !common::race::mappings_over(va, BUF).is_empty();
    let anonymous = |va: usize| common::race::all_anonymous(&common::race::mappings_over(va, BUF));

    // Only this thread copied through `a`: its own announcement does not hold the range.
    copy(a.1, a.2);
    copy(a.1, a.2);
    assert!(
        capi::fast_path_ready(a.1).is_some(),
        "no membarrier in this process: copies would clear their announcement and nothing could be parked"
    );
    assert_eq!(capi::gdr_unmap(g, a.1, a.2 as *mut c_void, BUF), 0);
    assert!(!mapped(a.2), "unmapped at once");
    assert_eq!(capi::parked_mappings(), 0);

    // Another thread copies through `b` twice (the second time on the fast path, which leaves its
    // announcement), once on the general path (4 bytes in the mapping's last 7, outside the fast
    // path's window: that announcement ends with the copy) and once more on the fast path, which
    // must announce again rather than take the handle as still named; then it waits.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<(GdrMh, usize)>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        for (mh, va) in go_rx {
            copy(mh, va);
            copy(mh, va);
            let v = 9u32;
            // SAFETY: `v` is live; the last 4 bytes of a live mapping.
            let rc = unsafe { capi::gdr_copy_to_mapping(mh, (va + BUF - 4) as *mut c_void, (&raw const v).cast(), 4) };
            assert_eq!(rc, 0);
            copy(mh, va);
            done_tx.send(()).unwrap();
        }
    });
    go_tx.send((b.1, b.2)).unwrap();
    done_rx.recv().unwrap();
    // A fork child has no such thread: its copy of the line is forgotten, so the child's unmap of
    // `b` is immediate.
    // SAFETY: the child only makes library calls and reads /proc, then leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let ok = capi::gdr_unmap(g, b.1, b.2 as *mut c_void, BUF) == 0 && capi::parked_mappings() == 0 && !mapped(b.2);
        // SAFETY: leaves the child at once, running nothing of the parent's test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "in a fork child, a line of a thread the child does not have still held a mapping ({status:#x})"
    );
    assert_eq!(capi::gdr_unmap(g, b.1, b.2 as *mut c_void, BUF), 0);
    assert_eq!(capi::parked_mappings(), 1, "a thread's announcement names `b`: parked");
    assert!(anonymous(b.2), "parked as anonymous memory: {:?}", common::race::mappings_over(b.2, BUF));

    // Mapping `b` again takes its parked range back (so remapping while the thread keeps naming
    // `b` never piles ranges up), and the mapping there is the real one.
    for round in 0..3u8 {
        let mut va = std::ptr::null_mut();
        // SAFETY: pointers to live locals of this test.
        assert_eq!(unsafe { capi::gdr_map(g, b.1, &mut va, BUF) }, 0);
        assert_eq!(va as usize, b.2, "round {round}: the parked range was not reused");
        assert_eq!(capi::parked_mappings(), 0, "round {round}");
        let v = [round + 1; 8];
        // SAFETY: `v` is live; 8 bytes at the start of the live mapping.
        assert_eq!(unsafe { capi::gdr_copy_to_mapping(b.1, va, v.as_ptr().cast(), 8) }, 0);
        assert_eq!(cuda.read(b.0, 8), v, "round {round}: the GPU sees the copy through the reused range");
        assert_eq!(capi::gdr_unmap(g, b.1, va, BUF), 0);
        assert_eq!(capi::parked_mappings(), 1, "round {round}: parked again");
    }
    let mut out = [0xffu8; 8];
    // SAFETY: `out` is live; the handle is unmapped, which the call must refuse.
    let rc = unsafe { capi::gdr_copy_from_mapping(b.1, out.as_mut_ptr().cast(), b.2 as *const c_void, 8) };
    assert_eq!(rc, libc::EINVAL, "a copy through the unmapped handle");
    assert_eq!(capi::gdr_unpin_buffer(g, b.1), 0);
    assert_eq!(capi::parked_mappings(), 1, "still named: still parked");

    // The other thread moves on to `c`; the next control call releases `b`'s range.
    go_tx.send((c.1, c.2)).unwrap();
    done_rx.recv().unwrap();
    assert!(mapped(b.2), "released only by a control call");
    assert_eq!(capi::gdr_unpin_buffer(g, a.1), 0);
    assert_eq!(capi::parked_mappings(), 0, "nothing names `b` any more");
    assert!(!mapped(b.2), "the parked range is unmapped");

    // `c` is named by the other thread when the instance closes: parked, then released once the
    // thread has exited (its line is given back) at the next close.
    assert_eq!(capi::gdr_close(g), 0);
    assert_eq!(capi::parked_mappings(), 1, "the close parked `c`");
    drop(go_tx);
    other.join().unwrap();
    let g2 = capi::gdr_open();
    assert_eq!(capi::gdr_close(g2), 0);
    assert_eq!(capi::parked_mappings(), 0, "released after the thread exited");
    assert!(!mapped(c.2));
    for (dptr, _, _) in [a, b, c] {
        cuda.free(dptr);
    }
}

impl common::race::Gpu for Cuda {
    fn alloc(&self, len: usize) -> u64 {
        let p = Cuda::alloc(self, len);
        self.write(p, &vec![common::race::GPU_BYTE; len]);
        p
    }
    fn free(&self, va: u64) {
        Cuda::free(self, va);
    }
}

/// The copy/unmap race of `common/race.rs` on the dma-buf backend (no free callbacks there).
#[test]
fn dma_buf_copy_unmap_race() {
    if std::env::var_os(CHILD).is_none() {
        return run_in_child("dma_buf_copy_unmap_race");
    }
    let cuda = Cuda::init();
    common::race::copy_unmap_race(&cuda, 3, std::time::Duration::from_secs(3), false);
}
