//! System calls: file descriptors, the BAR0 mmap and the helper module's ioctls (§A9 of the
//! spec), plus page-aligned host buffers. The only module besides `mmio`, `dma` and `capi` with
//! `unsafe`.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use gpudirect_common::Errno;
use gpudirect_common::errno::check_syscall;

use crate::abi::{
    IoctlMap, IoctlVersion, NVM_ABI_MAJOR, NVM_GET_VERSION, NVM_MAP_DEVICE_MEMORY, NVM_MAP_HOST_MEMORY,
    NVM_UNMAP_MEMORY,
};

/// Duplicates a caller's descriptor (callers close theirs right after `nvm_ctrl_init`), with
/// close-on-exec set so the pins of this process never leak into an exec'd child.
pub fn dup_fd(fd: RawFd) -> Result<OwnedFd, Errno> {
    if fd < 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: F_DUPFD_CLOEXEC only reads the descriptor number; failure is reported as -1.
    let new = check_syscall(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `new` is a fresh descriptor this process now owns exclusively.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A shared mapping of a device file (BAR0 through `/dev/libnvmN` or sysfs `resource0`).
#[derive(Debug)]
pub struct DeviceMapping {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: the mapping is device memory accessed only through `mmio::Regs`; the struct only owns
// the address range, which may be unmapped from any thread.
unsafe impl Send for DeviceMapping {}
// SAFETY: as for Send.
unsafe impl Sync for DeviceMapping {}

impl DeviceMapping {
    /// Maps `len` bytes of BAR0 from a controller file (`nvm_ctrl_init`'s only way in), after
    /// checking that the file does not speak a module ABI this library does not know.
    pub fn map(fd: &OwnedFd, len: usize) -> Result<DeviceMapping, Errno> {
        check_module_version(fd)?;
        // SAFETY: a fresh shared mapping chosen by the kernel; nothing existing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FILE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let ptr = NonNull::new(p).ok_or(Errno::ENOMEM)?;
        Ok(DeviceMapping { ptr, len })
    }
    pub fn ptr(&self) -> NonNull<c_void> {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range `map` created; nothing refers to it once the owner drops it.
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// What `NVM_GET_VERSION` told about the file behind a controller descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleAbi {
    /// Our module: its version struct.
    Versioned(IoctlVersion),
    /// Upstream's 0.3 module (unknown ioctl: `EINVAL`), or a file without ioctls such as sysfs
    /// `resource0` (`ENOTTY`): ABI 1.0, no feature bits.
    Legacy,
}

impl ModuleAbi {
    /// Decodes the ioctl's outcome: success carries the struct, `EINVAL`/`ENOTTY` mean an
    /// unversioned file, anything else is passed on.
    pub fn decode(rc: Result<IoctlVersion, Errno>) -> Result<ModuleAbi, Errno> {
        match rc {
            Ok(v) => Ok(ModuleAbi::Versioned(v)),
            Err(e) if e == Errno::EINVAL || e == Errno::ENOTTY => Ok(ModuleAbi::Legacy),
            Err(e) => Err(e),
        }
    }
    /// (major, minor, features).
    pub fn version(&self) -> (u32, u32, u32) {
        match self {
            ModuleAbi::Versioned(v) => (v.abi_major, v.abi_minor, v.features),
            ModuleAbi::Legacy => (1, 0, 0),
        }
    }
    /// `Ok` for ABI major 1 (any minor: minors only add); `EPROTO` otherwise.
    pub fn accept(&self) -> Result<(), Errno> {
        if self.version().0 == NVM_ABI_MAJOR { Ok(()) } else { Err(Errno(libc::EPROTO)) }
    }
}

/// `NVM_GET_VERSION` on a controller descriptor, decoded and checked (see `ModuleAbi`), with a
/// debug line for an unversioned module and an error line for a refused one.
pub fn check_module_version(fd: &OwnedFd) -> Result<ModuleAbi, Errno> {
    const ORIGIN: &str = "nvm_ctrl_init";
    let mut v = IoctlVersion::default();
    // SAFETY: `v` is a 16-byte nvm_ioctl_version alive across the call; the module writes at
    // most that much, and a file that does not know the command writes nothing.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), NVM_GET_VERSION as _, &mut v as *mut IoctlVersion) };
    let res = check_syscall(rc).map(|_| v);
    let why = res.err();
    let abi = ModuleAbi::decode(res)?;
    let (major, minor, features) = abi.version();
    match abi {
        ModuleAbi::Legacy => nvm_log!(
            Debug,
            ORIGIN,
            "no NVM_GET_VERSION ({}): upstream 0.3 module or plain BAR file, ABI 1.0, no features",
            why.unwrap_or(Errno::EINVAL)
        ),
        ModuleAbi::Versioned(_) => {
            nvm_log!(Debug, ORIGIN, "helper module ABI {major}.{minor}, features 0x{features:x}")
        }
    }
    if let Err(e) = abi.accept() {
        nvm_err!(
            ORIGIN,
            "helper module speaks ABI {major}.{minor}, this library speaks ABI {NVM_ABI_MAJOR}.x: refused ({e})"
        );
        return Err(e);
    }
    Ok(abi)
}

/// `NVM_MAP_HOST_MEMORY` / `NVM_MAP_DEVICE_MEMORY`: pins `n_pages` pages from `vaddr` and returns
/// their bus addresses (0 for pages the module could not pin).
pub fn ioctl_map(fd: &OwnedFd, device: bool, vaddr: u64, n_pages: usize) -> Result<Vec<u64>, Errno> {
    let mut addrs = vec![0u64; n_pages];
    let mut req = IoctlMap { vaddr_start: vaddr, n_pages, ioaddrs: addrs.as_mut_ptr() };
    let cmd = if device { NVM_MAP_DEVICE_MEMORY } else { NVM_MAP_HOST_MEMORY };
    // SAFETY: `req` is a valid nvm_ioctl_map whose output array has room for n_pages addresses,
    // both alive across the call; the module writes at most n_pages entries.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, &mut req as *mut IoctlMap) };
    check_syscall(rc)?;
    Ok(addrs)
}

/// `NVM_UNMAP_MEMORY` for the address a window was mapped with.
pub fn ioctl_unmap(fd: &OwnedFd, vaddr: u64) -> Result<(), Errno> {
    let mut addr = vaddr;
    // SAFETY: the argument is a u64 that lives across the call; the module only reads it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), NVM_UNMAP_MEMORY as _, &mut addr as *mut u64) };
    check_syscall(rc).map(|_| ())
}

/// The host page size.
pub fn host_page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 { 4096 } else { v as usize }
}

/// A page-aligned host buffer (`posix_memalign`), not zeroed, freed on drop.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: plain heap memory owned by this value.
unsafe impl Send for AlignedBuf {}
// SAFETY: the value hands out only the address; accesses go through DMA or the C caller.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> Result<AlignedBuf, Errno> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: posix_memalign writes the result pointer only on success.
        let rc = unsafe { libc::posix_memalign(&mut p, align.max(std::mem::size_of::<usize>()), len.max(1)) };
        if rc != 0 {
            return Err(Errno(rc));
        }
        Ok(AlignedBuf { ptr: NonNull::new(p).ok_or(Errno::ENOMEM)?, len })
    }
    pub fn ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by posix_memalign in `new`, freed once.
        unsafe { libc::free(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ver(major: u32, minor: u32, features: u32) -> IoctlVersion {
        IoctlVersion { abi_major: major, abi_minor: minor, features, reserved: 0 }
    }

    #[test]
    fn version_decoding() {
        // Upstream 0.3 answers the unknown command with EINVAL; non-module files with ENOTTY.
        for e in [Errno::EINVAL, Errno::ENOTTY] {
            let abi = ModuleAbi::decode(Err(e)).unwrap();
            assert_eq!(abi, ModuleAbi::Legacy);
            assert_eq!(abi.version(), (1, 0, 0));
            assert_eq!(abi.accept(), Ok(()));
        }
        // Other failures are not read as "old module".
        assert_eq!(ModuleAbi::decode(Err(Errno::EFAULT)), Err(Errno::EFAULT));
        assert_eq!(ModuleAbi::decode(Err(Errno::EBADF)), Err(Errno::EBADF));
        // Ours: 1.0 with its three feature bits; a later minor is accepted.
        let abi = ModuleAbi::decode(Ok(ver(1, 0, 7))).unwrap();
        assert_eq!(abi.version(), (1, 0, 7));
        assert_eq!(abi.accept(), Ok(()));
        assert_eq!(ModuleAbi::decode(Ok(ver(1, 9, 0))).unwrap().accept(), Ok(()));
        // Another major is refused with EPROTO.
        for major in [0, 2, u32::MAX] {
            let abi = ModuleAbi::decode(Ok(ver(major, 0, 0))).unwrap();
            assert_eq!(abi.accept(), Err(Errno(libc::EPROTO)), "major {major}");
        }
    }

    #[test]
    fn non_module_file_is_legacy() {
        // A regular file has no ioctls: ENOTTY, read as an unversioned (ABI 1.0) file.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let fd = OwnedFd::from(f);
        assert_eq!(check_module_version(&fd), Ok(ModuleAbi::Legacy));
    }
}
