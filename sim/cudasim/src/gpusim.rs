//! Client of `/dev/gpusim` (kmod/gpusim/gpusim_uapi.h): the simulated GPU's memory.

use crate::sys::{self, Fd};
use std::ffi::c_ulong;
use std::io;

pub const DEVICE_PATH: &std::ffi::CStr = c"/dev/gpusim";

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Alloc {
    size: u64,
    flags: u64,
    gpu_va: u64,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Free {
    gpu_va: u64,
}

/// `struct gpusim_invalidate`
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Invalidate {
    gpu_va: u64,
    size: u64,
}

/// `GPUSIM_ALLOC_ALIGN_2M`: the GPU VA is 2 MiB aligned.
pub const ALLOC_ALIGN_2M: u64 = 0x1;

/// `struct gpusim_info`
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct Info {
    pub bar_size: u64,
    pub bar_phys: u64,
    pub free_bytes: u64,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    pub pci_function: u32,
    pub active_pins: u64,
}

/// `struct gpusim_export_dmabuf`
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct ExportDmabuf {
    gpu_va: u64,
    size: u64,
    flags: u32,
    fd: i32,
}

const fn ioc(dir: u64, nr: u64, size: usize) -> c_ulong {
    ((dir << 30) | ((size as u64) << 16) | (0xE7 << 8) | nr) as c_ulong
}
const IOC_W: u64 = 1;
const IOC_R: u64 = 2;
const IOC_ALLOC: c_ulong = ioc(IOC_W | IOC_R, 1, std::mem::size_of::<Alloc>());
const IOC_FREE: c_ulong = ioc(IOC_W, 2, std::mem::size_of::<Free>());
const IOC_INFO: c_ulong = ioc(IOC_R, 3, std::mem::size_of::<Info>());
const IOC_EXPORT_DMABUF: c_ulong = ioc(IOC_W | IOC_R, 5, std::mem::size_of::<ExportDmabuf>());
const IOC_INVALIDATE: c_ulong = ioc(IOC_W, 6, std::mem::size_of::<Invalidate>());

/// An open `/dev/gpusim`.
#[derive(Debug)]
pub struct Gpusim {
    fd: Fd,
}

impl Gpusim {
    pub fn open() -> io::Result<Gpusim> {
        Ok(Gpusim { fd: sys::open_rdwr(DEVICE_PATH)? })
    }

    pub fn info(&self) -> io::Result<Info> {
        let mut i = Info::default();
        // SAFETY: `i` is a live gpusim_info, the size encoded in IOC_INFO.
        unsafe { sys::ioctl_ptr(self.fd.0, IOC_INFO, &mut i) }?;
        Ok(i)
    }

    /// Allocates `len` bytes (a 64 KiB multiple) and maps them at their GPU VA, so the device
    /// pointer is also the simulator's CPU address.
    pub fn alloc_mapped(&self, len: u64, flags: u64) -> io::Result<u64> {
        let va = self.alloc_flags(len, flags)?;
        match self.map(va, len) {
            Ok(()) => Ok(va),
            Err(e) => {
                let _ = self.free(va);
                Err(e)
            }
        }
    }

    /// Allocates GPU memory without mapping it.
    pub fn alloc(&self, len: u64) -> io::Result<u64> {
        self.alloc_flags(len, 0)
    }

    /// Allocates GPU memory with `GPUSIM_ALLOC_*` flags, without mapping it.
    pub fn alloc_flags(&self, len: u64, flags: u64) -> io::Result<u64> {
        let mut a = Alloc { size: len, flags, gpu_va: 0 };
        // SAFETY: `a` is a live gpusim_alloc, the size encoded in IOC_ALLOC.
        unsafe { sys::ioctl_ptr(self.fd.0, IOC_ALLOC, &mut a) }?;
        Ok(a.gpu_va)
    }

    /// Maps `[va, va+len)` of the GPU address space at the same CPU address.
    pub fn map(&self, va: u64, len: u64) -> io::Result<()> {
        let flags = sys::MAP_SHARED | sys::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the range is in
        // gpusim's GPU VA window, which nothing else in this process uses.
        let got = unsafe { sys::mmap_raw(va, len, sys::PROT_READ | sys::PROT_WRITE, flags, self.fd.0, va) }?;
        if got != va {
            // Kernels before 4.17 treat the flag as a hint: undo and report.
            // SAFETY: `got` is the mapping just created, referenced by nothing.
            let _ = unsafe { sys::unmap(got, len) };
            return Err(io::Error::from_raw_os_error(sys::EEXIST));
        }
        Ok(())
    }

    /// Exports `[va, va+len)` (host-page aligned, inside one allocation) as a dma-buf: the kernel
    /// object NVIDIA's driver hands out for cuMemGetHandleForAddressRange. Returns a new fd.
    pub fn export_dmabuf(&self, va: u64, len: u64) -> io::Result<i32> {
        let mut e = ExportDmabuf { gpu_va: va, size: len, flags: 0, fd: -1 };
        // SAFETY: `e` is a live gpusim_export_dmabuf, the size encoded in IOC_EXPORT_DMABUF.
        unsafe { sys::ioctl_ptr(self.fd.0, IOC_EXPORT_DMABUF, &mut e) }?;
        Ok(e.fd)
    }

    /// Runs the free callbacks of the non-persistent pins overlapping `[va, va+len)` (part of one
    /// allocation) without freeing anything: a sub-allocation of a region was freed.
    pub fn invalidate(&self, va: u64, len: u64) -> io::Result<()> {
        let mut i = Invalidate { gpu_va: va, size: len };
        // SAFETY: `i` is a live gpusim_invalidate, the size encoded in IOC_INVALIDATE.
        unsafe { sys::ioctl_ptr(self.fd.0, IOC_INVALIDATE, &mut i) }?;
        Ok(())
    }

    pub fn free(&self, va: u64) -> io::Result<()> {
        let mut f = Free { gpu_va: va };
        // SAFETY: `f` is a live gpusim_free, the size encoded in IOC_FREE.
        unsafe { sys::ioctl_ptr(self.fd.0, IOC_FREE, &mut f) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // _IOWR(0xE7, 1, 24 bytes), _IOW(0xE7, 2, 8 bytes), _IOR(0xE7, 3, 48 bytes)
        assert_eq!(IOC_ALLOC, 0xC018_E701);
        assert_eq!(IOC_FREE, 0x4008_E702);
        assert_eq!(std::mem::size_of::<Info>(), 48);
        assert_eq!(IOC_INFO, 0x8030_E703);
        // _IOWR(0xE7, 5, 24 bytes)
        assert_eq!(std::mem::size_of::<ExportDmabuf>(), 24);
        assert_eq!(IOC_EXPORT_DMABUF, 0xC018_E705);
        // _IOW(0xE7, 6, 16 bytes)
        assert_eq!(IOC_INVALIDATE, 0x4010_E706);
    }
}
