//! Helpers shared by the integration tests: device detection with a clear skip message, GPU memory
//! from the simulated GPU (`/dev/gpusim`, kmod/gpusim/gpusim_uapi.h), forked children, a PRNG.
//!
//! The tests run for real inside the VM (tests/vm/suites/35-libgdrapi.sh), where gdrdrv pins
//! memory of the simulated GPU. Every test that needs devices is `#[ignore]`d, so a plain
//! `cargo test` on a host reports it as ignored, never as passed; the VM suite runs them with
//! `--include-ignored` and `GPUDIRECT_REQUIRE_DEVICES=1`, under which a missing device fails the
//! test instead of skipping it. Run by hand elsewhere (`-- --include-ignored`), a test whose
//! devices are missing prints `SKIP <test>: <what is missing>` and returns.
#![allow(dead_code)]

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

pub use gdrapi::abi::{GdrInfoV2, GdrMh};
pub use gdrapi::capi::{self, GdrT};

pub mod race;

pub const GPU_PAGE: usize = 1 << 16;

/// Set to 1 where the devices must be present (the VM, the GPU machine): a skip is a failure.
pub const REQUIRE_DEVICES: &str = "GPUDIRECT_REQUIRE_DEVICES";

/// A test cannot run here: prints `SKIP <test>: <why>`, or fails the test when
/// `GPUDIRECT_REQUIRE_DEVICES=1` says that everything it needs must be here.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os(REQUIRE_DEVICES).is_some_and(|v| v == "1") {
        panic!("{test} cannot run: {why}, but {REQUIRE_DEVICES}=1 requires it to");
    }
    println!("SKIP {test}: {why}");
}

/// Whether the devices an end-to-end test needs are present; prints why not.
pub fn devices(test: &str) -> bool {
    let missing: Vec<&str> = [
        ("/dev/gdrdrv", "/dev/gdrdrv (gdrdrv kernel module)"),
        ("/dev/gpusim", "/dev/gpusim (simulated GPU, kmod/gpusim)"),
    ]
    .iter()
    .filter(|(p, _)| !Path::new(p).exists())
    .map(|(_, what)| *what)
    .collect();
    if missing.is_empty() {
        true
    } else {
        skip(test, &format!("missing {}; runs in the VM (scripts/vmtest --suite 35-libgdrapi)", missing.join(", ")));
        false
    }
}

// ---- /dev/gpusim ABI (gpusim_uapi.h) --------------------------------------------------------

const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xE7 << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

#[repr(C)]
#[derive(Default)]
struct GpusimAlloc {
    size: u64,
    flags: u64,
    gpu_va: u64,
}

#[repr(C)]
#[derive(Default)]
struct GpusimFree {
    gpu_va: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
pub struct GpusimInfo {
    pub bar_size: u64,
    pub bar_phys: u64,
    pub free_bytes: u64,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    pub pci_function: u32,
    pub active_pins: u64,
}

const GPUSIM_IOC_ALLOC: u64 = ioc(IOC_READ | IOC_WRITE, 1, size_of::<GpusimAlloc>() as u64);
const GPUSIM_IOC_FREE: u64 = ioc(IOC_WRITE, 2, size_of::<GpusimFree>() as u64);
const GPUSIM_IOC_INFO: u64 = ioc(IOC_READ, 3, size_of::<GpusimInfo>() as u64);

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// This process's handle on the simulated GPU (each process has its own GPU address space).
pub struct GpuSim {
    fd: OwnedFd,
}

impl GpuSim {
    pub fn open() -> GpuSim {
        // SAFETY: the path is a NUL-terminated literal.
        let fd = unsafe { libc::open(c"/dev/gpusim".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(fd >= 0, "open /dev/gpusim: errno {}", last_errno());
        // SAFETY: a descriptor we just opened and own.
        GpuSim { fd: unsafe { OwnedFd::from_raw_fd(fd) } }
    }

    fn ioctl<T>(&self, cmd: u64, arg: &mut T) -> Result<(), i32> {
        // SAFETY: `arg` is the argument struct of `cmd` (layouts from gpusim_uapi.h), alive for the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), cmd as _, arg as *mut T) };
        if r == 0 { Ok(()) } else { Err(last_errno()) }
    }

    pub fn info(&self) -> GpusimInfo {
        let mut i = GpusimInfo::default();
        self.ioctl(GPUSIM_IOC_INFO, &mut i).expect("GPUSIM_IOC_INFO");
        i
    }

    /// Allocates `size` bytes of device memory and maps the GPU's view of it.
    pub fn alloc(&self, size: usize) -> GpuMem<'_> {
        let mut a = GpusimAlloc { size: size as u64, ..Default::default() };
        self.ioctl(GPUSIM_IOC_ALLOC, &mut a).unwrap_or_else(|e| panic!("GPUSIM_IOC_ALLOC({size}): errno {e}"));
        let len = size.div_ceil(GPU_PAGE) * GPU_PAGE;
        // SAFETY: a fresh shared mapping of the allocation (offset = its GPU VA, as the uapi says).
        let view = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                a.gpu_va as libc::off_t,
            )
        };
        assert_ne!(view, libc::MAP_FAILED, "mmap /dev/gpusim at {:#x}: errno {}", a.gpu_va, last_errno());
        GpuMem { sim: self, va: a.gpu_va, len, view: view.cast(), freed: false }
    }

    /// Allocates `size` bytes filled with `byte` and returns only the device address (for threads:
    /// [`GpuMem`] is tied to this thread's view mapping).
    pub fn alloc_filled(&self, size: usize, byte: u8) -> u64 {
        let mut m = self.alloc(size);
        m.fill(byte);
        // SAFETY: our own view mapping, unmapped once; the allocation itself stays.
        unsafe { libc::munmap(m.view.cast(), m.len) };
        m.freed = true;
        m.va
    }

    pub fn free_va(&self, va: u64) -> Result<(), i32> {
        self.ioctl(GPUSIM_IOC_FREE, &mut GpusimFree { gpu_va: va })
    }
}

/// A device allocation and the simulated GPU's own view of it (a shared WC mapping).
pub struct GpuMem<'a> {
    sim: &'a GpuSim,
    pub va: u64,
    pub len: usize,
    view: *mut u8,
    freed: bool,
}

impl GpuMem<'_> {
    /// What the GPU sees at `[off, off + n)`.
    pub fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len && !self.freed);
        let mut v = vec![0u8; n];
        // SAFETY: inside the live view; no Rust reference into device memory exists, the bytes are
        // copied out at this moment.
        unsafe { std::ptr::copy_nonoverlapping(self.view.add(off), v.as_mut_ptr(), n) };
        v
    }

    /// Writes as the GPU would.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len && !self.freed);
        // SAFETY: inside the live view; see `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.view.add(off), data.len()) };
    }

    pub fn fill(&self, byte: u8) {
        self.write(0, &vec![byte; self.len]);
    }

    /// Frees the allocation now (as cuMemFree would), while gdrdrv may still pin it.
    pub fn free(&mut self) -> Result<(), i32> {
        if !self.freed {
            // SAFETY: our own view mapping, unmapped once.
            unsafe { libc::munmap(self.view.cast(), self.len) };
            self.freed = true;
            return self.sim.free_va(self.va);
        }
        Ok(())
    }
}

impl Drop for GpuMem<'_> {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

// ---- the C ABI, with Rust-side conveniences -------------------------------------------------

/// `gdr_open()` that must succeed.
pub fn open() -> GdrT {
    let g = capi::gdr_open();
    assert!(!g.is_null(), "gdr_open failed although /dev/gdrdrv exists");
    g
}

pub fn pin(g: GdrT, addr: u64, size: usize) -> Result<GdrMh, i32> {
    let mut h = GdrMh { h: 0 };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    match unsafe { capi::gdr_pin_buffer(g, addr as _, size, 0, 0, &mut h) } {
        0 => Ok(h),
        e => Err(e),
    }
}

pub fn map(g: GdrT, h: GdrMh, size: usize, flags: c_int) -> Result<*mut u8, i32> {
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    match unsafe { capi::gdr_map_v2(g, h, &mut va, size, flags) } {
        0 => Ok(va.cast()),
        e => Err(e),
    }
}

pub fn info(g: GdrT, h: GdrMh) -> Result<GdrInfoV2, i32> {
    let mut i = GdrInfoV2::default();
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    match unsafe { capi::gdr_get_info_v2(g, h, &mut i) } {
        0 => Ok(i),
        e => Err(e),
    }
}

pub fn attribute(g: GdrT, attr: c_int) -> Result<c_int, i32> {
    let mut v = -1;
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    match unsafe { capi::gdr_get_attribute(g, attr, &mut v) } {
        0 => Ok(v),
        e => Err(e),
    }
}

pub fn callback_flag(g: GdrT, h: GdrMh) -> Result<c_int, i32> {
    let mut f = -1;
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    match unsafe { capi::gdr_get_callback_flag(g, h, &mut f) } {
        0 => Ok(f),
        e => Err(e),
    }
}

pub fn copy_to(h: GdrMh, dst: *mut u8, src: &[u8]) -> i32 {
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    unsafe { capi::gdr_copy_to_mapping(h, dst.cast(), src.as_ptr().cast(), src.len()) }
}

pub fn copy_from(h: GdrMh, dst: &mut [u8], src: *const u8) -> i32 {
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    unsafe { capi::gdr_copy_from_mapping(h, dst.as_mut_ptr().cast(), src.cast(), dst.len()) }
}

/// Whether gdrdrv runs in persistent mode (its default): no free callbacks then.
pub fn persistent(g: GdrT) -> bool {
    attribute(g, gdrapi::abi::GDR_ATTR_USE_PERSISTENT_MAPPING).expect("GDR_ATTR_USE_PERSISTENT_MAPPING") != 0
}

/// [`persistent`], asked through a short-lived instance of its own.
#[track_caller]
pub fn persistent_mode() -> bool {
    let g = open();
    let p = persistent(g);
    assert_eq!(capi::gdr_close(g), 0);
    p
}

/// Pins `[addr, addr + size)` and maps all of it with default flags; both must succeed.
#[track_caller]
pub fn pin_map(g: GdrT, addr: u64, size: usize) -> (GdrMh, *mut u8) {
    let h = pin(g, addr, size).unwrap();
    let va = map(g, h, size, 0).unwrap();
    (h, va)
}

/// Unmaps `va` (`size` bytes) and unpins `h`; both must return 0.
#[track_caller]
pub fn unmap_unpin(g: GdrT, h: GdrMh, va: *mut u8, size: usize) {
    assert_eq!(capi::gdr_unmap(g, h, va.cast(), size), 0);
    assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
}

// ---- processes ------------------------------------------------------------------------------

/// How a child ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// Runs `f` in a forked child and returns how it ended. The child exits with `f`'s value, or 101
/// if it panicked. Run the tests that use it with --test-threads=1 (the suite does): a fork
/// copies only the calling thread.
pub fn in_child(f: impl FnOnce() -> i32) -> Exit {
    wait(spawn_child(f))
}

pub fn wait(pid: libc::pid_t) -> Exit {
    let mut status = 0;
    // SAFETY: waits for our own child; status is a valid out pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid");
    if libc::WIFSIGNALED(status) { Exit::Signal(libc::WTERMSIG(status)) } else { Exit::Code(libc::WEXITSTATUS(status)) }
}

/// Reads one byte through a raw mapping pointer (may fault: use in a child).
pub fn touch(p: *const u8) -> u8 {
    // SAFETY: the caller accepts that this access may raise SIGBUS/SIGSEGV; it is a plain read.
    unsafe { std::ptr::read_volatile(p) }
}

// ---- data -----------------------------------------------------------------------------------

/// xorshift64*: reproducible test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Forks a child running `f` without waiting for it (see [`in_child`]); returns its pid.
pub fn spawn_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only runs `f` and then _exit()s; it never returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: _exit ends the child without running the parent's atexit handlers twice.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Turns a failed check in a child into a distinct exit code (the parent prints it).
pub fn code_if(failed: bool, code: i32) -> Result<(), i32> {
    if failed { Err(code) } else { Ok(()) }
}
