//! The few libc calls cudasim needs, declared by hand (no `libc` crate), each behind a small
//! wrapper that turns a failure into `io::Error::last_os_error()`.
//!
//! Memory-changing wrappers (`mmap_*`, `munmap`, `mprotect`) are `unsafe fn`: they change which
//! addresses are valid, so the caller states why no live Rust object is affected.

use std::ffi::{CStr, c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::io;

pub const PROT_NONE: c_int = 0;
pub const PROT_READ: c_int = 1;
pub const PROT_WRITE: c_int = 2;
pub const MAP_SHARED: c_int = 0x01;
pub const MAP_PRIVATE: c_int = 0x02;
pub const MAP_FIXED: c_int = 0x10;
pub const MAP_ANONYMOUS: c_int = 0x20;
pub const MAP_NORESERVE: c_int = 0x4000;
pub const MAP_FIXED_NOREPLACE: c_int = 0x100000;
const MAP_FAILED: *mut c_void = !0usize as *mut c_void;
pub const O_RDWR: c_int = 0o2;
pub const O_CLOEXEC: c_int = 0o2000000;
const MFD_CLOEXEC: c_uint = 1;
const F_DUPFD_CLOEXEC: c_int = 1030;
pub const ENOMEM: i32 = 12;
pub const EEXIST: i32 = 17;
pub const EINVAL: i32 = 22;
pub const EMFILE: i32 = 24;
pub const ENOTTY: i32 = 25;

unsafe extern "C" {
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
    fn mincore(addr: *mut c_void, len: usize, vec: *mut u8) -> c_int;
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn ftruncate(fd: c_int, len: i64) -> c_int;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn ioctl(fd: c_int, req: c_ulong, ...) -> c_int;
    fn getpid() -> c_int;
    fn sysconf(name: c_int) -> c_long;
}

fn check(rc: c_int) -> io::Result<c_int> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

pub fn pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { getpid() as u32 }
}

pub fn page_size() -> u64 {
    const SC_PAGESIZE: c_int = 30;
    // SAFETY: sysconf has no memory preconditions.
    let v = unsafe { sysconf(SC_PAGESIZE) };
    if v > 0 { v as u64 } else { 4096 }
}

/// mmap with explicit arguments; returns the mapped address.
///
/// # Safety
/// With `MAP_FIXED` the range `[addr, addr+len)` is replaced: the caller must own it (no Rust
/// object or other component may live there).
pub unsafe fn mmap_raw(addr: u64, len: u64, prot: c_int, flags: c_int, fd: c_int, off: u64) -> io::Result<u64> {
    // SAFETY: forwarded contract; the kernel validates the arguments.
    let p = unsafe { mmap(addr as *mut c_void, len as usize, prot, flags, fd, off as i64) };
    if p == MAP_FAILED { Err(io::Error::last_os_error()) } else { Ok(p as u64) }
}

/// Anonymous mapping anywhere (never replaces anything).
pub fn mmap_anon(len: u64, prot: c_int, extra_flags: c_int) -> io::Result<u64> {
    // SAFETY: addr 0 without MAP_FIXED: the kernel picks a free range, nothing is replaced.
    unsafe { mmap_raw(0, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0) }
}

/// # Safety
/// The caller owns `[addr, addr+len)` and nothing references it any more.
pub unsafe fn unmap(addr: u64, len: u64) -> io::Result<()> {
    // SAFETY: forwarded contract.
    check(unsafe { munmap(addr as *mut c_void, len as usize) }).map(|_| ())
}

/// # Safety
/// The caller owns `[addr, addr+len)`; reducing protection must not break live references.
pub unsafe fn protect(addr: u64, len: u64, prot: c_int) -> io::Result<()> {
    // SAFETY: forwarded contract.
    check(unsafe { mprotect(addr as *mut c_void, len as usize, prot) }).map(|_| ())
}

/// True when every page of `[addr, addr+len)` is mapped in this process.
pub fn is_mapped(addr: u64, len: u64) -> bool {
    let ps = page_size();
    let start = addr & !(ps - 1);
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let pages = (end - start).div_ceil(ps) as usize;
    let mut vec = vec![0u8; pages.max(1)];
    // SAFETY: mincore only reads the page tables and writes `pages` bytes into vec, which has
    // at least that many.
    let rc = unsafe { mincore(start as *mut c_void, (end - start) as usize, vec.as_mut_ptr()) };
    rc == 0
}

pub fn memfd(name: &CStr, len: u64) -> io::Result<Fd> {
    // SAFETY: name is a valid NUL-terminated string.
    let fd = Fd(check(unsafe { memfd_create(name.as_ptr(), MFD_CLOEXEC) })?);
    // SAFETY: fd is a memfd we own.
    check(unsafe { ftruncate(fd.0, len as i64) })?;
    Ok(fd)
}

/// Sets the size of the file behind `fd` (a memfd we own).
pub fn set_len(fd: &Fd, len: u64) -> io::Result<()> {
    // SAFETY: ftruncate on a descriptor we own; no memory is passed.
    check(unsafe { ftruncate(fd.0, len as i64) }).map(|_| ())
}

pub fn open_rdwr(path: &CStr) -> io::Result<Fd> {
    // SAFETY: path is a valid NUL-terminated string.
    Ok(Fd(check(unsafe { open(path.as_ptr(), O_RDWR | O_CLOEXEC) })?))
}

/// ioctl with a pointer argument.
///
/// # Safety
/// `arg` must point to a live object of the size the request number encodes.
pub unsafe fn ioctl_ptr<T>(fd: c_int, req: c_ulong, arg: *mut T) -> io::Result<c_int> {
    // SAFETY: forwarded contract.
    check(unsafe { ioctl(fd, req, arg) })
}

/// An owned file descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(pub c_int);

impl Fd {
    /// A new descriptor for the same open file (close-on-exec), owned by the caller.
    pub fn dup_raw(&self) -> io::Result<c_int> {
        // SAFETY: self.0 is an open descriptor we own; F_DUPFD_CLOEXEC creates a new one.
        check(unsafe { fcntl(self.0, F_DUPFD_CLOEXEC, 0 as c_int) })
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and nobody uses it after drop.
        unsafe { close(self.0) };
    }
}
