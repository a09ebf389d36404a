//! Loads the built `libcuda.so` with dlopen, the way gdrcopy's dma-buf backend and other C
//! consumers do, and drives it only through `cuGetProcAddress`.
//!
//! Scenarios that need a fresh process or particular environment variables (before cuInit, no
//! device, dma-buf, wait timeout, fork) run in a child copy of this test binary: the parent
//! re-executes itself with `CUDASIM_CHILD=<name>` and the child test of that name does the work
//! (in a normal run the child tests return at once).
//!
//! `CUDASIM_LIB` may point to the library to test (the VM suite passes the staged
//! `libcuda.so.1`); by default the one cargo built next to this test is used.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(h: *mut c_void, name: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
}

const RTLD_NOW: c_int = 2;
const SUCCESS: u32 = 0;
const INVALID_VALUE: u32 = 1;
const NOT_INITIALIZED: u32 = 3;
const NO_DEVICE: u32 = 100;
const NOT_READY: u32 = 600;
const NOT_FOUND: u32 = 500;
const LAUNCH_TIMEOUT: u32 = 702;
const NOT_SUPPORTED: u32 = 801;

type GpaV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> u32;
type GpaV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> u32;
type FnU32 = unsafe extern "C" fn(c_uint) -> u32;
type FnPtrOut<T> = unsafe extern "C" fn(*mut T) -> u32;
type FnDevGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
type FnAttr = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> u32;
type FnRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
type FnPtr = unsafe extern "C" fn(*mut c_void) -> u32;
type FnAlloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FnFree = unsafe extern "C" fn(u64) -> u32;
type FnMemset = unsafe extern "C" fn(u64, u8, usize) -> u32;
type FnHtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> u32;
type FnDtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> u32;
type FnStreamCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32;
type FnWait32 = unsafe extern "C" fn(*mut c_void, u64, u32, c_uint) -> u32;
type FnWait64 = unsafe extern "C" fn(*mut c_void, u64, u64, c_uint) -> u32;
type FnBatch = unsafe extern "C" fn(*mut c_void, c_uint, *const [u64; 6], c_uint) -> u32;
type FnEvRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;
type FnHandle = unsafe extern "C" fn(*mut c_void, u64, usize, c_uint, u64) -> u32;
type FnErrStr = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;

fn lib_path() -> PathBuf {
    if let Ok(p) = std::env::var("CUDASIM_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    let above = deps.parent().expect("profile dir").join("libcuda.so");
    if above.exists() { above } else { deps.join("libcuda.so") }
}

struct Cuda {
    h: *mut c_void,
    gpa: GpaV2,
}

impl Cuda {
    fn load() -> Cuda {
        let path = lib_path();
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: valid C string; dlopen of our own library runs no foreign constructors.
        let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
        if h.is_null() {
            // SAFETY: dlerror returns a C string after a failed dlopen.
            let why = unsafe { CStr::from_ptr(dlerror()) }.to_string_lossy();
            panic!("dlopen {}: {why}", path.display());
        }
        // SAFETY: h is a live handle; the symbol has the cuGetProcAddress_v2 signature.
        let p = unsafe { dlsym(h, c"cuGetProcAddress_v2".as_ptr()) };
        assert!(!p.is_null(), "cuGetProcAddress_v2 exported");
        // SAFETY: function address of the documented signature.
        let gpa: GpaV2 = unsafe { std::mem::transmute::<*mut c_void, GpaV2>(p) };
        Cuda { h, gpa }
    }

    /// Resolves `name` through cuGetProcAddress_v2 at CUDA 13.0.
    ///
    /// # Safety
    /// `F` must be the function-pointer type of the entry point `name` resolves to.
    unsafe fn f<F: Copy>(&self, name: &CStr) -> F {
        let mut p = null_mut();
        let mut st = 7;
        // SAFETY: valid arguments for cuGetProcAddress_v2.
        let r = unsafe { (self.gpa)(name.as_ptr(), &mut p, 13000, 0, &mut st) };
        assert_eq!((r, st), (SUCCESS, 0), "cuGetProcAddress({name:?})");
        assert!(!p.is_null());
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: F is a function pointer of the right signature (caller contract).
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }

    /// Initialises, retains device 0's primary context and makes it current.
    fn up(&self) {
        // SAFETY: signatures as in cuda.h.
        unsafe {
            assert_eq!(self.f::<FnU32>(c"cuInit")(0), SUCCESS);
            let mut ctx = null_mut();
            assert_eq!(self.f::<FnRetain>(c"cuDevicePrimaryCtxRetain")(&mut ctx, 0), SUCCESS);
            assert_eq!(self.f::<FnPtr>(c"cuCtxSetCurrent")(ctx), SUCCESS);
        }
    }
}

fn run_child(name: &str, env: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).env("CUDASIM_CHILD", name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn child test");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(text.contains("1 passed"), "child {name} did not run:\n{text}");
}

fn is_child(name: &str) -> bool {
    std::env::var("CUDASIM_CHILD").is_ok_and(|v| v == name)
}

#[test]
fn exported_symbols_and_soname() {
    let cu = Cuda::load();
    for name in [
        c"cuInit",
        c"cuMemAlloc_v2",
        c"cuMemFree_v2",
        c"cuStreamBatchMemOp",
        c"cuStreamBatchMemOp_v2",
        c"cuGetProcAddress",
        c"cuDevicePrimaryCtxRelease_v2",
        c"cuMemcpyDtoH_v2",
        c"cuMemCreate",
    ] {
        // SAFETY: live handle, valid C string.
        let sym = unsafe { dlsym(cu.h, name.as_ptr()) };
        assert!(!sym.is_null(), "{name:?} exported");
    }
    // SAFETY: live handle; the stub takes no arguments that it reads.
    unsafe {
        let stub = dlsym(cu.h, c"cuLaunchKernel".as_ptr());
        assert!(!stub.is_null());
        let stub: unsafe extern "C" fn() -> u32 =
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u32>(stub);
        assert_eq!(stub(), NOT_SUPPORTED);
        // cuGetProcAddress (v1, 4 arguments) and unknown symbols.
        let v1: GpaV1 = std::mem::transmute::<*mut c_void, GpaV1>(dlsym(cu.h, c"cuGetProcAddress".as_ptr()));
        let mut p = null_mut();
        assert_eq!(v1(c"cuMemAlloc".as_ptr(), &mut p, 12000, 0), SUCCESS);
        assert_eq!(p, dlsym(cu.h, c"cuMemAlloc_v2".as_ptr()));
        let mut st = 0;
        assert_eq!((cu.gpa)(c"cuLaunchKernel".as_ptr(), &mut p, 13000, 0, &mut st), NOT_FOUND);
        assert_eq!((st, p), (1, null_mut()));
    }
    match Command::new("readelf").args(["-d", lib_path().to_str().unwrap()]).output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("Library soname: [libcuda.so.1]"), "soname:\n{text}");
            assert!(text.contains("NODELETE"), "linked with -z nodelete:\n{text}");
        }
        Err(_) => eprintln!("SKIP soname check: readelf not installed"),
    }
}

/// A consumer's session through cuGetProcAddress: memory, streams, a CPU thread racing stream
/// waits, a batch, events.
#[test]
fn consumer_flow_through_get_proc_address() {
    let cu = Cuda::load();
    cu.up();
    // SAFETY: every function pointer is resolved with its cuda.h signature; buffers are live.
    unsafe {
        let mut n = 0;
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDeviceGetCount")(&mut n), SUCCESS);
        assert!(n >= 1);
        let mut dev = -1;
        assert_eq!(cu.f::<FnDevGet>(c"cuDeviceGet")(&mut dev, 0), SUCCESS);
        // 64-bit stream memops: the CUDA 12+ attribute says yes, the v1 one (93) reads 0 as on CUDA 13.
        for (attr, want) in [(122, 1), (93, 0)] {
            let mut v = -1;
            assert_eq!(cu.f::<FnAttr>(c"cuDeviceGetAttribute")(&mut v, attr, dev), SUCCESS);
            assert_eq!(v, want, "attribute {attr}");
        }
        let alloc: FnAlloc = cu.f(c"cuMemAlloc");
        let free: FnFree = cu.f(c"cuMemFree");
        let mut p = 0u64;
        assert_eq!(alloc(&mut p, 1 << 20), SUCCESS);
        assert_eq!(cu.f::<FnMemset>(c"cuMemsetD8")(p, 0x11, 1 << 20), SUCCESS);
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(cu.f::<FnHtoD>(c"cuMemcpyHtoD")(p + 4096, data.as_ptr() as *const c_void, 4096), SUCCESS);
        let mut back = vec![0u8; 8192];
        assert_eq!(cu.f::<FnDtoH>(c"cuMemcpyDtoH")(back.as_mut_ptr() as *mut c_void, p, 8192), SUCCESS);
        assert!(back[..4096].iter().all(|&b| b == 0x11));
        assert_eq!(&back[4096..], &data[..]);

        let mut s = null_mut();
        assert_eq!(cu.f::<FnStreamCreate>(c"cuStreamCreate")(&mut s, 0), SUCCESS);
        let wait64: FnWait64 = cu.f(c"cuStreamWaitValue64");
        let write32: FnWait32 = cu.f(c"cuStreamWriteValue32");
        let query: FnPtr = cu.f(c"cuStreamQuery");
        let sync: FnPtr = cu.f(c"cuStreamSynchronize");
        // SAFETY: p is a live 64 KiB-aligned allocation (host mode: process memory).
        let flag = AtomicU64::from_ptr(p as *mut u64);
        let done = AtomicU32::from_ptr((p + 64) as *mut u32);
        flag.store(0, Ordering::SeqCst);
        done.store(0, Ordering::SeqCst);
        assert_eq!(wait64(s, p, 1 << 40, 0 /* GEQ */), SUCCESS);
        assert_eq!(write32(s, p + 64, 1, 0), SUCCESS);
        let mut ev = null_mut();
        assert_eq!(cu.f::<FnStreamCreate>(c"cuEventCreate")(&mut ev, 0), SUCCESS);
        assert_eq!(cu.f::<FnEvRecord>(c"cuEventRecord")(ev, s), SUCCESS);
        assert_eq!(query(s), NOT_READY);
        assert_eq!(cu.f::<FnPtr>(c"cuEventQuery")(ev), NOT_READY);
        // The writer stores a value just below the wait's and then holds off until this thread
        // has looked, so a slow machine cannot satisfy the wait before the check (a fixed 10 ms
        // against 20 ms failed under load).
        let (below_tx, below_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            // SAFETY: same live allocation.
            let flag = AtomicU64::from_ptr(p as *mut u64);
            flag.store((1 << 40) - 1, Ordering::Release);
            below_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            flag.store(1 << 41, Ordering::Release);
        });
        below_rx.recv().unwrap();
        // Time for the stream's worker to see the value below the wait's and keep waiting.
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(done.load(Ordering::SeqCst), 0, "write ran before the wait was satisfied");
        go_tx.send(()).unwrap();
        writer.join().unwrap();
        assert_eq!(cu.f::<FnPtr>(c"cuEventSynchronize")(ev), SUCCESS);
        assert_eq!(done.load(Ordering::SeqCst), 1);

        // Batch: WRITE_VALUE_32, WAIT_VALUE_32 (EQ, FLUSH), WRITE_VALUE_64, as raw 48-byte unions.
        let mk = |op: u64, addr: u64, val: u64, flags: u64| [op, addr, val, flags, 0, 0];
        // The name resolves to the _v2 entry point, which refuses NO_MEMORY_BARRIER (flags 1 on a
        // write) as CUDA 11.7+ does: the whole batch is rejected and nothing is queued.
        let relaxed = [mk(2, p + 128, 42, 1)];
        assert_eq!(cu.f::<FnBatch>(c"cuStreamBatchMemOp")(s, 1, relaxed.as_ptr(), 0), INVALID_VALUE);
        let ops = [mk(2, p + 128, 42, 0), mk(1, p + 128, 42, 1 | (1 << 30)), mk(5, p + 136, 0x1_0000_0002, 0)];
        assert_eq!(cu.f::<FnBatch>(c"cuStreamBatchMemOp")(s, 3, ops.as_ptr(), 0), SUCCESS);
        assert_eq!(sync(s), SUCCESS);
        assert_eq!(AtomicU64::from_ptr((p + 136) as *mut u64).load(Ordering::SeqCst), 0x1_0000_0002);

        let mut msg: *const c_char = null_mut();
        assert_eq!(cu.f::<FnErrStr>(c"cuGetErrorName")(NOT_READY, &mut msg), SUCCESS);
        assert_eq!(CStr::from_ptr(msg).to_str().unwrap(), "CUDA_ERROR_NOT_READY");
        assert_eq!(cu.f::<FnPtr>(c"cuEventDestroy")(ev), SUCCESS);
        assert_eq!(cu.f::<FnPtr>(c"cuStreamDestroy")(s), SUCCESS);
        assert_eq!(free(p), SUCCESS);
        assert_eq!(free(p), INVALID_VALUE);
    }
}

#[test]
fn not_initialized_before_cuinit() {
    run_child("child_not_initialized", &[]);
}

#[test]
fn child_not_initialized() {
    if !is_child("child_not_initialized") {
        return;
    }
    let cu = Cuda::load();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        let mut n = 0;
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDeviceGetCount")(&mut n), NOT_INITIALIZED);
        let mut p = 0;
        assert_eq!(cu.f::<FnAlloc>(c"cuMemAlloc")(&mut p, 16), NOT_INITIALIZED);
        let mut v = 0;
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDriverGetVersion")(&mut v), SUCCESS);
        assert_eq!(v, 13000, "default driver version");
        let init: FnU32 = cu.f(c"cuInit");
        assert_eq!(init(1), INVALID_VALUE);
        assert_eq!(init(0), SUCCESS);
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDeviceGetCount")(&mut n), SUCCESS);
        assert_eq!(n, 1, "one device by default");
        let mut a = -1;
        assert_eq!(cu.f::<FnAttr>(c"cuDeviceGetAttribute")(&mut a, 124, 0), SUCCESS);
        // gpusim exports kernel dma-bufs (as the H100 reports 1); host memory only with CUDASIM_DMABUF=1.
        let on_gpusim = std::path::Path::new("/dev/gpusim").exists()
            && std::env::var("CUDASIM_BACKEND").map_or(true, |v| v != "host");
        assert_eq!(a, on_gpusim as c_int, "dma-buf support: gpusim yes, host memory only with CUDASIM_DMABUF=1");
    }
}

#[test]
fn environment_knobs() {
    run_child("child_no_device", &[("CUDASIM_DEVICE_COUNT", "0")]);
    run_child("child_env", &[("CUDASIM_DEVICE_COUNT", "3"), ("CUDASIM_DRIVER_VERSION", "13030")]);
}

/// CUDASIM_PLATFORM: compute capability major (75), pageable access (88) and pageable access
/// through host page tables (100, "coherent platform") per mode; an unknown mode fails cuInit.
#[test]
fn platform_modes() {
    for (mode, cc, coherent) in
        [("", "9", "0"), ("pcie", "9", "0"), ("coherent", "9", "1"), ("coherent-cc10", "10", "1")]
    {
        run_child("child_platform", &[("CUDASIM_PLATFORM", mode), ("WANT_CC", cc), ("WANT_COHERENT", coherent)]);
    }
    run_child("child_platform", &[("CUDASIM_PLATFORM", "grace"), ("WANT_CC", "none"), ("WANT_COHERENT", "0")]);
}

#[test]
fn child_platform() {
    if !is_child("child_platform") {
        return;
    }
    let cu = Cuda::load();
    let want_cc = std::env::var("WANT_CC").unwrap();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        if want_cc == "none" {
            assert_eq!(cu.f::<FnU32>(c"cuInit")(0), INVALID_VALUE, "unknown CUDASIM_PLATFORM");
            return;
        }
        cu.up();
        let attr: FnAttr = cu.f(c"cuDeviceGetAttribute");
        let coherent: c_int = std::env::var("WANT_COHERENT").unwrap().parse().unwrap();
        for (a, want) in [(75, want_cc.parse::<c_int>().unwrap()), (88, coherent), (100, coherent)] {
            let mut v = -1;
            assert_eq!(attr(&mut v, a, 0), SUCCESS);
            assert_eq!(v, want, "attribute {a}");
        }
    }
}

#[test]
fn child_no_device() {
    if !is_child("child_no_device") {
        return;
    }
    let cu = Cuda::load();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        assert_eq!(cu.f::<FnU32>(c"cuInit")(0), NO_DEVICE);
        let mut n = 0;
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDeviceGetCount")(&mut n), NOT_INITIALIZED);
    }
}

#[test]
fn child_env() {
    if !is_child("child_env") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        let (mut n, mut v) = (0, 0);
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDeviceGetCount")(&mut n), SUCCESS);
        assert_eq!(cu.f::<FnPtrOut<c_int>>(c"cuDriverGetVersion")(&mut v), SUCCESS);
        assert_eq!((n, v), (3, 13030));
        let attr: FnAttr = cu.f(c"cuDeviceGetAttribute");
        let (mut b0, mut b2) = (0, 0);
        assert_eq!(attr(&mut b0, 33, 0), SUCCESS);
        assert_eq!(attr(&mut b2, 33, 2), SUCCESS);
        assert_ne!(b0, b2, "devices have distinct PCI bus numbers");
        assert_eq!(attr(&mut b2, 33, 3), 101);
    }
}

#[test]
fn dmabuf_export() {
    run_child("child_dmabuf", &[("CUDASIM_DMABUF", "1"), ("CUDASIM_BACKEND", "host")]);
}

#[test]
fn child_dmabuf() {
    if !is_child("child_dmabuf") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    // SAFETY: signatures as in cuda.h; the mmap'ed view is unmapped before the fd is closed.
    unsafe {
        let mut a = 0;
        assert_eq!(cu.f::<FnAttr>(c"cuDeviceGetAttribute")(&mut a, 124, 0), SUCCESS);
        assert_eq!(a, 1);
        let size = 3 * 65536 + 100;
        let mut p = 0u64;
        assert_eq!(cu.f::<FnAlloc>(c"cuMemAlloc")(&mut p, size), SUCCESS);
        let data: Vec<u8> = (0..size).map(|i| (i * 13 % 256) as u8).collect();
        assert_eq!(cu.f::<FnHtoD>(c"cuMemcpyHtoD")(p, data.as_ptr() as *const c_void, size), SUCCESS);
        let export: FnHandle = cu.f(c"cuMemGetHandleForAddressRange");
        let aligned = size.div_ceil(4096) * 4096;
        let mut fd: c_int = -1;
        assert_eq!(export(&mut fd as *mut c_int as *mut c_void, p + 100, 4096, 1, 0), INVALID_VALUE, "unaligned");
        assert_eq!(export(&mut fd as *mut c_int as *mut c_void, p, aligned, 2, 0), INVALID_VALUE, "handle type");
        assert_eq!(export(&mut fd as *mut c_int as *mut c_void, p, 8 << 20, 1, 0), INVALID_VALUE, "past the region");
        assert_eq!(export(&mut fd as *mut c_int as *mut c_void, p, aligned, 1, 1 /* PCIE */), SUCCESS);
        assert!(fd >= 0);
        let view = mmap(null_mut(), aligned, 3, 1 /* MAP_SHARED */, fd, 0);
        assert_ne!(view as isize, -1, "mmap of the exported fd");
        let bytes = std::slice::from_raw_parts_mut(view as *mut u8, size);
        assert_eq!(&bytes[..], &data[..], "the fd maps the device memory");
        bytes[5] = 0xee;
        let mut back = [0u8; 8];
        assert_eq!(cu.f::<FnDtoH>(c"cuMemcpyDtoH")(back.as_mut_ptr() as *mut c_void, p, 8), SUCCESS);
        assert_eq!(back[5], 0xee, "writes through the dma-buf view reach device memory");
        munmap(view, aligned);
        close(fd);
        assert_eq!(cu.f::<FnFree>(c"cuMemFree")(p), SUCCESS);
    }
}

#[test]
fn dmabuf_overlapping_exports() {
    run_child("child_dmabuf_overlap", &[("CUDASIM_DMABUF", "1"), ("CUDASIM_BACKEND", "host")]);
}

/// One exported range as a consumer holds it: the descriptor and a shared mapping of it.
struct View {
    fd: c_int,
    p: *mut u8,
    len: usize,
}

impl View {
    /// The `len` bytes as this view sees them now.
    fn bytes(&self) -> Vec<u8> {
        // SAFETY: p is a live shared mapping of len bytes until drop; copied out at once, as other
        // mappings of the same memory may write it later.
        unsafe { std::slice::from_raw_parts(self.p, self.len) }.to_vec()
    }

    /// Writes one byte through this view.
    fn set(&self, i: usize, v: u8) {
        assert!(i < self.len);
        // SAFETY: inside the live shared mapping (checked above).
        unsafe { self.p.add(i).write_volatile(v) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: our mapping and descriptor, released once.
        unsafe {
            munmap(self.p as *mut c_void, self.len);
            close(self.fd);
        }
    }
}

/// CUDA exports any page range of an allocation, overlapping earlier exports or not, and gdrcopy's
/// apiperf pins growing sizes from one start: host-memory dma-bufs must allow it too. Every view
/// is checked against a model of the device memory, and writes through views, the device and
/// cuMemcpy must be seen by every other view of the same bytes.
#[test]
fn child_dmabuf_overlap() {
    if !is_child("child_dmabuf_overlap") {
        return;
    }
    const P: usize = 65536;
    const PROT_RW: c_int = 3;
    const MAP_SHARED: c_int = 1;
    let cu = Cuda::load();
    cu.up();
    // SAFETY: each type is the cuda.h prototype of that entry point.
    let (export, htod, dtoh) = unsafe {
        (
            cu.f::<FnHandle>(c"cuMemGetHandleForAddressRange"),
            cu.f::<FnHtoD>(c"cuMemcpyHtoD"),
            cu.f::<FnDtoH>(c"cuMemcpyDtoH"),
        )
    };
    let size = 8 * P;
    let mut p = 0u64;
    // SAFETY: signatures as in cuda.h; valid out-pointers and buffers of the sizes passed.
    unsafe { assert_eq!(cu.f::<FnAlloc>(c"cuMemAlloc")(&mut p, size), SUCCESS) };
    let mut model: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: as above.
    unsafe { assert_eq!(htod(p, model.as_ptr() as *const c_void, size), SUCCESS) };
    let try_export = |off: usize, len: usize| -> Result<c_int, u32> {
        let mut fd: c_int = -1;
        // SAFETY: the handle is an int for a dma-buf fd.
        let r = unsafe { export(&mut fd as *mut c_int as *mut c_void, p + off as u64, len, 1, 0) };
        if r == SUCCESS { Ok(fd) } else { Err(r) }
    };
    let view = |off: usize, len: usize| -> View {
        let fd = try_export(off, len).unwrap_or_else(|r| panic!("export of +{off:#x}+{len:#x} returned {r}"));
        // SAFETY: a shared mapping of the exported descriptor, as gdrcopy's dma-buf backend makes.
        let m = unsafe { mmap(null_mut(), len, PROT_RW, MAP_SHARED, fd, 0) };
        assert_ne!(m as isize, -1, "mmap of the export +{off:#x}+{len:#x}");
        View { fd, p: m as *mut u8, len }
    };
    let device = || -> Vec<u8> {
        let mut d = vec![0u8; size];
        // SAFETY: as above.
        unsafe { assert_eq!(dtoh(d.as_mut_ptr() as *mut c_void, p, size), SUCCESS) };
        d
    };
    #[track_caller]
    fn same(v: &View, model: &[u8], off: usize, what: &str) {
        let got = v.bytes();
        let bad = (0..v.len).find(|&i| got[i] != model[off + i]);
        assert!(bad.is_none(), "{what}: first wrong byte at +{:#x}", off + bad.unwrap_or(0));
    }

    // Growing from one start, every export still held (pinned and mapped).
    let g1 = view(0, P);
    let g2 = view(0, 2 * P);
    let g4 = view(0, 4 * P);
    for (v, n) in [(&g1, "1"), (&g2, "2"), (&g4, "4")] {
        same(v, &model, 0, &format!("growing export of {n} pages"));
    }
    g4.set(P + 5, 0xa5);
    model[P + 5] = 0xa5;
    g1.set(7, 0x5a);
    model[7] = 0x5a;
    assert_eq!(device(), model, "writes through the views reach device memory");
    same(&g2, &model, 0, "a write through the 4-page view, seen in the 2-page view");
    same(&g4, &model, 0, "a write through the 1-page view, seen in the 4-page view");
    // The same start, smaller again, while the larger ones are held.
    let g_half = view(0, P / 2);
    same(&g_half, &model, 0, "a shorter export from the same start");

    // Exports nested in and overlapping the ones above (different starts), once those are released;
    // one view of the middle stays held throughout and must keep sharing the device's bytes.
    drop((g1, g2, g4, g_half));
    // apiperf's loop: pin, map, copy, unmap, unpin, at growing sizes from one start.
    for pages in 1..=5 {
        let v = view(P, pages * P);
        same(&v, &model, P, &format!("apiperf-style export of {pages} pages from one start"));
    }
    let held = view(2 * P, P);
    same(&held, &model, 2 * P, "an export nested in a released one");
    for (off, len) in [(P, P), (P / 2, 3 * P / 2), (3 * P, 3 * P), (4 * P, P), (3 * P + 4096, 2 * P)] {
        let v = view(off, len);
        same(&v, &model, off, &format!("export +{off:#x}+{len:#x} after the earlier ones were released"));
        v.set(len - 1, v.bytes()[len - 1] ^ 0xff);
        model[off + len - 1] ^= 0xff;
    }
    let bytes: Vec<u8> = (0..P).map(|i| (i * 3 % 256) as u8).collect();
    // SAFETY: as above.
    unsafe { assert_eq!(htod(p + 2 * P as u64, bytes.as_ptr() as *const c_void, P), SUCCESS) };
    model[2 * P..3 * P].copy_from_slice(&bytes);
    same(&held, &model, 2 * P, "the view held across every re-cut around it");
    assert_eq!(device(), model, "device memory after every re-cut");

    // What no memfd layout can give: two exports held at once that overlap with different
    // starts. Refused while the first is held by a descriptor alone or by a mapping alone; once
    // released, the same export works.
    assert_eq!(try_export(2 * P + 4096, 4096), Err(INVALID_VALUE), "inside a held export");
    assert_eq!(try_export(P, 2 * P), Err(INVALID_VALUE), "running into a held export");
    let fd_only = try_export(5 * P, 2 * P).expect("export");
    assert_eq!(try_export(6 * P, P), Err(INVALID_VALUE), "inside an export whose descriptor is held");
    // SAFETY: our descriptor.
    unsafe { close(fd_only) };
    let mapped = view(5 * P, 2 * P);
    let (m, len) = (mapped.p, mapped.len);
    // SAFETY: our descriptor; the mapping stays.
    unsafe { close(mapped.fd) };
    std::mem::forget(mapped);
    assert_eq!(try_export(6 * P, P), Err(INVALID_VALUE), "inside an export whose mapping is held");
    // SAFETY: the mapping made above, not used after.
    unsafe { munmap(m as *mut c_void, len) };
    let v = view(6 * P, P);
    same(&v, &model, 6 * P, "the same export once the overlapping one is released");
    drop((v, held));
    assert_eq!(device(), model, "device memory at the end");
    // SAFETY: as above.
    unsafe { assert_eq!(cu.f::<FnFree>(c"cuMemFree")(p), SUCCESS) };
}

#[test]
fn wait_timeout_makes_the_stream_fail() {
    run_child("child_timeout", &[("CUDASIM_WAIT_TIMEOUT_MS", "100")]);
}

#[test]
fn child_timeout() {
    if !is_child("child_timeout") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        let mut p = 0u64;
        assert_eq!(cu.f::<FnAlloc>(c"cuMemAlloc")(&mut p, 4096), SUCCESS);
        assert_eq!(cu.f::<FnMemset>(c"cuMemsetD8")(p, 0, 4096), SUCCESS);
        let mut s = null_mut();
        assert_eq!(cu.f::<FnStreamCreate>(c"cuStreamCreate")(&mut s, 0), SUCCESS);
        // The stream starts waiting (and its timeout running) at enqueue: take the time before,
        // or a busy host that deschedules this thread after the enqueue shortens the measure.
        let t = Instant::now();
        assert_eq!(cu.f::<FnWait32>(c"cuStreamWaitValue32")(s, p, 1, 1 /* EQ */), SUCCESS);
        assert_eq!(cu.f::<FnWait32>(c"cuStreamWriteValue32")(s, p + 4, 9, 0), SUCCESS);
        assert_eq!(cu.f::<FnPtr>(c"cuStreamSynchronize")(s), LAUNCH_TIMEOUT);
        assert!(t.elapsed() >= Duration::from_millis(90));
        assert_eq!(
            AtomicU32::from_ptr((p + 4) as *mut u32).load(Ordering::SeqCst),
            0,
            "work after the failure is skipped"
        );
        assert_eq!(cu.f::<FnPtr>(c"cuStreamQuery")(s), LAUNCH_TIMEOUT, "the error is sticky");
    }
}

#[test]
fn fork_child_must_reinitialise() {
    run_child("child_fork", &[]);
}

#[test]
fn child_fork() {
    if !is_child("child_fork") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    // SAFETY: signatures as in cuda.h; the forked child only calls into the library and _exit.
    unsafe {
        let alloc: FnAlloc = cu.f(c"cuMemAlloc");
        let mut p = 0u64;
        assert_eq!(alloc(&mut p, 4096), SUCCESS);
        let pid = fork();
        assert!(pid >= 0);
        if pid == 0 {
            let mut q = 0u64;
            let code = if alloc(&mut q, 4096) != NOT_INITIALIZED {
                10
            } else {
                cu.up();
                if alloc(&mut q, 4096) != SUCCESS || q == 0 { 11 } else { 0 }
            };
            _exit(code);
        }
        let mut status = 0;
        assert_eq!(waitpid(pid, &mut status, 0), pid);
        assert_eq!(status, 0, "fork child status {status:#x}");
        assert_eq!(cu.f::<FnFree>(c"cuMemFree")(p), SUCCESS, "the parent is unaffected");
    }
}

/// Run by tests/vm/suites/15-cudasim.sh only: device pointers are gpusim GPU VAs.
#[test]
fn child_gpusim_va() {
    if !is_child("child_gpusim_va") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    // SAFETY: signatures as in cuda.h.
    unsafe {
        let mut p = 0u64;
        assert_eq!(cu.f::<FnAlloc>(c"cuMemAlloc")(&mut p, 1 << 20), SUCCESS);
        const BASE: u64 = 0x2000_0000_0000; // GPUSIM_VA_BASE
        assert!((BASE..BASE + (1 << 40)).contains(&p), "device pointer {p:#x}");
        assert_eq!(cu.f::<FnMemset>(c"cuMemsetD8")(p, 0x3c, 1 << 20), SUCCESS);
        assert_eq!(*((p + 12345) as *const u8), 0x3c, "the simulator's view is the allocation");
        assert_eq!(cu.f::<FnFree>(c"cuMemFree")(p), SUCCESS);
    }
    println!("gpusim va ok");
}

#[test]
fn suballocation_layout() {
    run_child("child_suballoc", &[]);
}

/// cuMemAlloc lays memory out as CUDA does (a fresh process, so the layout is deterministic):
/// small allocations adjacent in 256-byte slots of one 2 MiB region, each its own range; freeing
/// one leaves its neighbour usable; large ones 2 MiB aligned in a region of their own.
#[test]
fn child_suballoc() {
    if !is_child("child_suballoc") {
        return;
    }
    let cu = Cuda::load();
    cu.up();
    type FnRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> u32;
    type FnPtrAttr = unsafe extern "C" fn(*mut c_void, c_int, u64) -> u32;
    const REGION: u64 = 2 << 20;
    // SAFETY: signatures as in cuda.h; host buffers are local and of the sizes passed.
    unsafe {
        let alloc: FnAlloc = cu.f(c"cuMemAlloc");
        let free: FnFree = cu.f(c"cuMemFree");
        let range: FnRange = cu.f(c"cuMemGetAddressRange");
        let attr: FnPtrAttr = cu.f(c"cuPointerGetAttribute");
        let htod: FnHtoD = cu.f(c"cuMemcpyHtoD");
        let dtoh: FnDtoH = cu.f(c"cuMemcpyDtoH");
        let memset: FnMemset = cu.f(c"cuMemsetD8");
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(alloc(&mut a, 100), SUCCESS);
        assert_eq!(alloc(&mut b, 1000), SUCCESS);
        assert_eq!((a % 256, b % 256), (0, 0), "256-byte aligned");
        assert_eq!(b, a + 256, "adjacent: 100 bytes take one 256-byte slot");
        assert_eq!(a % REGION, 0, "the first allocation opens a 2 MiB-aligned region");
        assert_eq!(a / REGION, b / REGION, "inside one 2 MiB region");
        assert_eq!(a / 65536, b / 65536, "sharing a 64 KiB GPU page");
        for (p, at, want) in [(a, a + 50, 100usize), (b, b + 999, 1000)] {
            let (mut base, mut size) = (0u64, 0usize);
            assert_eq!(range(&mut base, &mut size, at), SUCCESS);
            assert_eq!((base, size), (p, want), "cuMemGetAddressRange of {at:#x}");
            let (mut start, mut rsize) = (0u64, 0usize);
            assert_eq!(attr(&mut start as *mut u64 as *mut c_void, 11 /* RANGE_START_ADDR */, at), SUCCESS);
            assert_eq!(attr(&mut rsize as *mut usize as *mut c_void, 12 /* RANGE_SIZE */, at), SUCCESS);
            assert_eq!((start, rsize), (p, want));
        }
        let (mut ida, mut idb) = (0u64, 0u64);
        assert_eq!(attr(&mut ida as *mut u64 as *mut c_void, 7 /* BUFFER_ID */, a), SUCCESS);
        assert_eq!(attr(&mut idb as *mut u64 as *mut c_void, 7, b), SUCCESS);
        assert_ne!(ida, idb, "each allocation its own buffer id");
        let (mut base, mut size) = (0u64, 0usize);
        assert_eq!(range(&mut base, &mut size, b + 1000), NOT_FOUND, "the slot's rounding is no allocation");
        assert_eq!(free(a + 16), INVALID_VALUE, "interior pointer");

        let data: Vec<u8> = (0..1000).map(|i| (i * 7 + 1) as u8).collect();
        assert_eq!(htod(b, data.as_ptr() as *const c_void, 1000), SUCCESS);
        assert_eq!(free(a), SUCCESS);
        let mut back = vec![0u8; 1000];
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, b, 1000), SUCCESS);
        assert_eq!(back, data, "the neighbour survives the free");
        assert_eq!(memset(b, 0x5a, 1000), SUCCESS);
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, b, 1000), SUCCESS);
        assert!(back.iter().all(|&x| x == 0x5a), "and stays writable");
        assert_eq!(range(&mut base, &mut size, a), NOT_FOUND, "the freed slot is no allocation");
        assert_eq!(memset(a, 0, 16), INVALID_VALUE, "nor usable");

        let mut c = 0u64;
        assert_eq!(alloc(&mut c, 200), SUCCESS);
        assert_eq!(c, a, "first fit reuses the freed slot");
        let mut big = 0u64;
        assert_eq!(alloc(&mut big, 3 << 20), SUCCESS);
        assert_eq!(big % REGION, 0, "large allocations are 2 MiB aligned");
        assert_ne!(big / REGION, a / REGION);
        let mut d = 0u64;
        assert_eq!(alloc(&mut d, (REGION - 1) as usize), SUCCESS);
        assert_eq!(d % REGION, 0, "a small allocation that fits no region opens a new one");
        for p in [b, c, big, d] {
            assert_eq!(free(p), SUCCESS);
        }
        // Every region went with its last allocation: the next one opens a new region.
        let mut e = 0u64;
        assert_eq!(alloc(&mut e, 64), SUCCESS);
        assert_eq!(e % REGION, 0);
        assert_eq!(free(e), SUCCESS);
    }
}
