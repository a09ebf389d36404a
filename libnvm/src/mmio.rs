//! Volatile access to controller registers (BAR0) and to queue rings in DMA memory: the only
//! place that dereferences those pointers. A [`Regs`] or [`Ring`] is created once from a pointer
//! whose validity the creator vouches for (`unsafe fn new`); every access after that is
//! bounds-checked and safe.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{Ordering, fence};

use crate::abi::{NvmCmd, NvmCpl};

/// A register window (BAR0 or a stand-in), `len` bytes from `base`.
#[derive(Debug, Clone, Copy)]
pub struct Regs {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: Regs is an address range of device registers; accesses are single volatile loads and
// stores, which the device (or the simulator behind the memory) serialises itself.
unsafe impl Send for Regs {}
// SAFETY: see Send; no access goes through a shared Rust reference to the memory.
unsafe impl Sync for Regs {}

impl Regs {
    /// # Safety
    /// `base` must point at `len` bytes of mapped, 4-byte-aligned register memory that stays
    /// mapped for as long as this value (or a copy of it) is used.
    pub unsafe fn new(base: NonNull<c_void>, len: usize) -> Regs {
        Regs { base: base.cast(), len }
    }

    pub fn base(&self) -> *mut c_void {
        self.base.as_ptr().cast()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, off: usize, width: usize) -> bool {
        off.is_multiple_of(width) && off.checked_add(width).is_some_and(|end| end <= self.len)
    }

    /// Reads a 32-bit register; out-of-range offsets read as all ones (as a missing device does).
    pub fn read32(&self, off: usize) -> u32 {
        if !self.check(off, 4) {
            return u32::MAX;
        }
        // SAFETY: in bounds and aligned (checked), and `new`'s contract keeps the window mapped.
        unsafe { self.base.as_ptr().add(off).cast::<u32>().read_volatile() }
    }

    /// Writes a 32-bit register; out-of-range offsets are ignored.
    pub fn write32(&self, off: usize, v: u32) {
        if !self.check(off, 4) {
            return;
        }
        // SAFETY: as in read32.
        unsafe { self.base.as_ptr().add(off).cast::<u32>().write_volatile(v) }
    }

    /// A 64-bit register read as two 32-bit halves, low first.
    pub fn read64(&self, off: usize) -> u64 {
        u64::from(self.read32(off)) | (u64::from(self.read32(off + 4)) << 32)
    }

    /// A 64-bit register written as two 32-bit halves, low first.
    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// The address of a 32-bit register, for doorbell pointers handed to C (`nvm_queue_t.db`).
    pub fn reg_ptr(&self, off: usize) -> Option<*mut u32> {
        if !self.check(off, 4) {
            return None;
        }
        // SAFETY: in bounds (checked), so the offset stays inside the mapping.
        Some(unsafe { self.base.as_ptr().add(off).cast::<u32>() })
    }
}

/// A queue ring in host memory: `entries` entries of `entry_size` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    base: NonNull<u8>,
    entries: usize,
    entry_size: usize,
}

// SAFETY: ring memory is shared with a DMA engine anyway; every access is volatile.
unsafe impl Send for Ring {}
// SAFETY: as for Send.
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `base` must point at `entries * entry_size` bytes of writable, 16-byte-aligned host memory
    /// that stays valid while the ring is used. `entry_size` is 16 (CQ) or 64 (SQ).
    pub unsafe fn new(base: NonNull<c_void>, entries: usize, entry_size: usize) -> Ring {
        Ring { base: base.cast(), entries, entry_size }
    }

    fn slot(&self, i: usize) -> Option<*mut u32> {
        if i >= self.entries {
            return None;
        }
        // SAFETY: i < entries, so the slot lies inside the ring (`new`'s contract).
        Some(unsafe { self.base.as_ptr().add(i * self.entry_size).cast::<u32>() })
    }

    /// Zeroes the whole ring.
    pub fn zero(&self) {
        for i in 0..self.entries * self.entry_size / 4 {
            // SAFETY: i*4 < entries*entry_size: inside the ring.
            unsafe { self.base.as_ptr().cast::<u32>().add(i).write_volatile(0) }
        }
    }

    /// Writes a command into slot `i` (an SQ ring), then orders it before later doorbell writes.
    pub fn write_cmd(&self, i: usize, cmd: &NvmCmd) {
        let Some(p) = self.slot(i) else { return };
        for (k, d) in cmd.dword.iter().enumerate().take(self.entry_size / 4) {
            // SAFETY: k < entry_size/4, inside slot i.
            unsafe { p.add(k).write_volatile(*d) }
        }
        fence(Ordering::Release);
    }

    /// The 16-bit status field of completion slot `i` (a CQ ring).
    pub fn status(&self, i: usize) -> u16 {
        let Some(p) = self.slot(i) else { return 0 };
        // SAFETY: dword 3 of a 16-byte slot inside the ring.
        (unsafe { p.add(3).read_volatile() } >> 16) as u16
    }

    /// Reads completion slot `i` (after its phase was seen).
    pub fn read_cpl(&self, i: usize) -> NvmCpl {
        let mut c = NvmCpl::default();
        let Some(p) = self.slot(i) else { return c };
        fence(Ordering::Acquire);
        for (k, d) in c.dword.iter_mut().enumerate() {
            // SAFETY: k < 4, inside a slot of at least 16 bytes.
            *d = unsafe { p.add(k).read_volatile() };
        }
        c
    }

    /// The address of slot `i`, handed back to C callers (`nvm_cq_dequeue_block`).
    pub fn slot_ptr(&self, i: usize) -> *mut c_void {
        self.slot(i).map_or(std::ptr::null_mut(), |p| p.cast())
    }
}

/// Writes a doorbell through a pointer a queue descriptor carries.
///
/// # Safety
/// `db` must be a doorbell pointer computed by this library (inside a live register mapping).
pub unsafe fn ring_doorbell(db: *mut u32, v: u32) {
    fence(Ordering::Release);
    // SAFETY: the caller's contract.
    unsafe { db.write_volatile(v) }
}

/// The register window of a device mapping (valid while the mapping is).
pub fn regs_of_mapping(map: &crate::kernel::DeviceMapping) -> Regs {
    // SAFETY: the mapping is `len` bytes of mapped device memory, page aligned; callers keep the
    // `DeviceMapping` alive next to the returned window (`Controller`'s backing).
    unsafe { Regs::new(map.ptr(), map.len()) }
}

// SAFETY: a queue descriptor's pointers (doorbell, ring) are addresses into a register mapping
// and DMA memory that outlive it; this library dereferences them only through `Regs`/`Ring`
// (bounds-checked) or in the C helpers whose contract says one thread owns a queue. Moving a
// descriptor to another thread changes none of that.
unsafe impl Send for crate::abi::NvmQueue {}
