//! DMA windows: memory as the controller sees it, one bus address per controller page.
//! Caller-supplied addresses (`nvm_dma_map`), host memory pinned by the helper module
//! (`nvm_dma_map_host`, `nvm_dma_create`) and GPU memory pinned by it (`nvm_dma_map_device`).

#![forbid(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::OwnedFd;

use gpudirect_common::Errno;

use crate::ctrl::Controller;
use crate::kernel::{self, AlignedBuf};
use crate::status::Result;

/// GPU pages as the module pins them.
pub const GPU_PAGE_SIZE: usize = 1 << 16;

#[derive(Debug)]
enum Backing {
    /// Addresses the caller gave; nothing to release.
    Caller,
    /// Pinned by the helper module through our own duplicate of its descriptor; `addr` is the
    /// address the pin was requested with (consumers may overwrite `nvm_dma_t.vaddr`).
    Module { fd: OwnedFd, addr: u64, _owned: Option<AlignedBuf> },
}

/// A DMA window.
#[derive(Debug)]
pub struct DmaWindow {
    /// The caller's address, kept as a number: the window never dereferences it.
    vaddr: usize,
    page_size: usize,
    ioaddrs: Vec<u64>,
    backing: Backing,
}

impl DmaWindow {
    /// `nvm_dma_map`: `n_pages` pages of `page_size` bytes at `page_addrs`, split into
    /// controller pages.
    pub fn from_addrs(
        ctrl: &Controller,
        vaddr: *mut c_void,
        page_size: usize,
        page_addrs: &[u64],
    ) -> Result<DmaWindow> {
        let cps = ctrl.page_size();
        let n_pages = page_addrs.len();
        let total = page_size.checked_mul(n_pages).ok_or(Errno::EINVAL)?;
        if page_size == 0 || n_pages == 0 || total % cps != 0 {
            return Err(Errno::EINVAL.into());
        }
        let ioaddrs = (0..total / cps)
            .map(|i| {
                let off = i * cps;
                page_addrs[off / page_size] + (off % page_size) as u64
            })
            .collect();
        Ok(DmaWindow { vaddr: vaddr as usize, page_size: cps, ioaddrs, backing: Backing::Caller })
    }

    /// `nvm_dma_map_host` / `nvm_dma_map_device`: pins through the helper module.
    pub fn map_module(ctrl: &Controller, vaddr: *mut c_void, size: usize, device: bool) -> Result<DmaWindow> {
        DmaWindow::map_module_owned(ctrl, vaddr, size, device, None)
    }

    fn map_module_owned(
        ctrl: &Controller,
        vaddr: *mut c_void,
        size: usize,
        device: bool,
        owned: Option<AlignedBuf>,
    ) -> Result<DmaWindow> {
        let Some(fd) = ctrl.device_fd() else {
            // A raw (BAR-mapping) controller has no module to pin memory with.
            return Err(Errno::EBADF.into());
        };
        if size == 0 || vaddr.is_null() {
            return Err(Errno::EINVAL.into());
        }
        let unit = if device { GPU_PAGE_SIZE } else { kernel::host_page_size() };
        let addr = vaddr as u64;
        let start = addr & !(unit as u64 - 1);
        let end = addr.checked_add(size as u64).ok_or(Errno::EINVAL)?;
        let n = end.div_ceil(unit as u64).saturating_sub(start / unit as u64) as usize;
        // Upstream sends the page count of `size` alone; counting from the rounded-down start
        // keeps the last bytes of an unaligned buffer inside the pin.
        let fd = kernel::dup_fd(std::os::fd::AsRawFd::as_raw_fd(fd)).map_err(|_| Errno::EBADF)?;
        let pages = kernel::ioctl_map(&fd, device, start, n)?;
        let cps = ctrl.page_size();
        let per = unit / cps;
        let mut ioaddrs = Vec::with_capacity(n * per.max(1));
        for p in &pages {
            for k in 0..per.max(1) {
                ioaddrs.push(if *p == 0 { 0 } else { p + (k * cps) as u64 });
            }
        }
        Ok(DmaWindow {
            vaddr: vaddr as usize,
            page_size: cps,
            ioaddrs,
            backing: Backing::Module { fd, addr: start, _owned: owned },
        })
    }

    /// `nvm_dma_create`: a page-aligned buffer owned by the window, pinned by the module.
    pub fn create(ctrl: &Controller, size: usize) -> Result<DmaWindow> {
        if ctrl.device_fd().is_none() {
            return Err(Errno::EBADF.into());
        }
        if size == 0 {
            return Err(Errno::EINVAL.into());
        }
        let cps = ctrl.page_size();
        let len = size.div_ceil(cps) * cps;
        let buf = AlignedBuf::new(len, cps)?;
        let p = buf.ptr();
        DmaWindow::map_module_owned(ctrl, p, len, false, Some(buf))
    }

    pub fn vaddr(&self) -> *mut c_void {
        self.vaddr as *mut c_void
    }
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn ioaddrs(&self) -> &[u64] {
        &self.ioaddrs
    }
}

impl Drop for DmaWindow {
    fn drop(&mut self) {
        if let Backing::Module { fd, addr, .. } = &self.backing
            && let Err(e) = kernel::ioctl_unmap(fd, *addr)
        {
            nvm_warn!("nvm_dma_unmap", "Unmapping {addr:#x} failed: {e}");
        }
    }
}
