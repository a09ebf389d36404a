//! The safe Rust API: the same core as the C ABI, with ownership doing the cleanup.
//!
//! ```no_run
//! # fn demo(gpu_addr: u64) -> gdrapi::Result<()> {
//! let gdr = gdrapi::Gdr::open()?;
//! let buf = gdr.pin(gpu_addr, 1 << 16)?;
//! let mut map = buf.map()?;
//! map.write(0, b"hello")?;
//! let mut back = [0u8; 5];
//! map.read(0, &mut back)?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use gpudirect_common::{Errno, Result};

use crate::abi::{GDR_MAP_FLAG_DEFAULT, MappingType};
use crate::backend::{PinFacts, PinRequest};
use crate::core::{self, Direction, Instance, Pin};
use crate::cpu_mapping::CpuMapping;

/// An open library instance; unpins what is still pinned when dropped.
pub struct Gdr {
    inner: Instance,
}

/// Attributes an instance reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribute {
    UsePersistentMapping = crate::abi::GDR_ATTR_USE_PERSISTENT_MAPPING as isize,
    SupportPinFlagForcePcie = crate::abi::GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE as isize,
    UsingDmaBufMmap = crate::abi::GDR_ATTR_USING_DMA_BUF_MMAP as isize,
}

impl Gdr {
    /// Opens the first usable backend (gdrdrv, then dma-buf).
    pub fn open() -> Result<Gdr> {
        Ok(Gdr { inner: Instance::open()? })
    }

    /// Opens with a specific gdrdrv device node.
    pub fn open_at(device_path: &str) -> Result<Gdr> {
        Ok(Gdr { inner: Instance::open_at(device_path)? })
    }

    /// Pins `[addr, addr + size)` of GPU memory.
    pub fn pin(&self, addr: u64, size: u64) -> Result<PinnedBuffer<'_>> {
        self.pin_with_flags(addr, size, 0)
    }

    /// Pins with `gdr_pin_flags_t` bits (e.g. `GDR_PIN_FLAG_FORCE_PCIE`).
    pub fn pin_with_flags(&self, addr: u64, size: u64, flags: u32) -> Result<PinnedBuffer<'_>> {
        let pin = self.inner.pin(&PinRequest { addr, size, flags, ..Default::default() })?;
        Ok(PinnedBuffer { gdr: self, pin })
    }

    pub fn attribute(&self, attr: Attribute) -> Result<i32> {
        self.inner.attribute(attr as i32)
    }

    /// The kernel module's version as (major, minor).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        self.inner.driver_version()
    }

    /// This library's API version as (major, minor).
    pub fn runtime_version() -> (i32, i32) {
        core::runtime_version()
    }
}

impl Drop for Gdr {
    fn drop(&mut self) {
        let _ = self.inner.unpin_all(core::unmap_now);
    }
}

/// A pinned GPU buffer; unpinned on drop.
pub struct PinnedBuffer<'g> {
    gdr: &'g Gdr,
    pin: Arc<Pin>,
}

impl PinnedBuffer<'_> {
    pub fn info(&self) -> Result<PinFacts> {
        self.gdr.inner.info(&self.pin)
    }

    /// Whether the GPU memory was freed while pinned (non-persistent pins only).
    pub fn invalidated(&self) -> Result<bool> {
        self.gdr.inner.callback_flag(&self.pin)
    }

    /// Maps the whole pinned range with the platform's default type.
    pub fn map(&self) -> Result<Mapping<'_>> {
        let size = usize::try_from(self.info()?.mapped_size).map_err(|_| Errno::EINVAL)?;
        self.map_as(size, GDR_MAP_FLAG_DEFAULT)
    }

    /// Maps `size` bytes with a `gdr_map_flags_t` request.
    pub fn map_as(&self, size: usize, flags: i32) -> Result<Mapping<'_>> {
        let m = self.gdr.inner.map(&self.pin, size, flags, &mut None)?;
        let t = self.pin.mapping().map_or(MappingType::None, |(_, t)| t);
        Ok(Mapping { buf: self, m, size, mapping_type: t })
    }
}

impl Drop for PinnedBuffer<'_> {
    fn drop(&mut self) {
        if self.gdr.inner.owns(&self.pin) {
            let _ = self.gdr.inner.unpin(&self.pin, core::unmap_now);
        }
    }
}

/// A CPU mapping of a pinned buffer; unmapped on drop. Offsets are relative to its start.
pub struct Mapping<'b> {
    buf: &'b PinnedBuffer<'b>,
    m: CpuMapping,
    size: usize,
    mapping_type: MappingType,
}

impl Mapping<'_> {
    pub fn mapping_type(&self) -> MappingType {
        self.mapping_type
    }

    pub fn len(&self) -> usize {
        self.m.len
    }

    pub fn is_empty(&self) -> bool {
        self.m.len == 0
    }

    /// The mapping's address, for callers that access it directly (volatile accesses only).
    pub fn as_ptr(&self) -> *mut u8 {
        self.m.addr as *mut u8
    }

    fn at(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.m.len => Ok(self.m.addr + offset),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Copies `data` into the GPU buffer at `offset` with the write-combining copy engine.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.at(offset, data.len())?;
        // SAFETY: `data` is a live slice of the stated length and cannot overlap the mapping
        // (the mapping is device memory that no Rust reference points into).
        unsafe { core::copy(&self.buf.pin, Direction::ToMapping, dst, data.as_ptr() as usize, data.len()) }
    }

    /// Copies from the GPU buffer at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.at(offset, out.len())?;
        // SAFETY: as in `write`, with `out` exclusively borrowed.
        unsafe { core::copy(&self.buf.pin, Direction::FromMapping, src, out.as_mut_ptr() as usize, out.len()) }
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        let _ = self.buf.gdr.inner.unmap(&self.buf.pin, self.m.addr, self.size, core::unmap_now);
    }
}
