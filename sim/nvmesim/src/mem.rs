//! "DMA": the controller's reads and writes of host memory. In this simulator a bus address is
//! a virtual address of the test process, so DMA is a copy through a raw pointer. The only
//! module with `unsafe` besides the C shim.

use std::sync::atomic::{Ordering, fence};

/// Whether an address can be a DMA target at all (the simulator cannot detect every bad
/// address, as real controllers cannot; it refuses the null page so a zero PRP reports a Data
/// Transfer Error instead of crashing the test).
pub fn plausible(addr: u64, len: usize) -> bool {
    addr >= 4096 && addr.checked_add(len as u64).is_some_and(|e| e < (1 << 47))
}

/// Copies host memory at bus address `addr` into `out`.
pub fn read(addr: u64, out: &mut [u8]) {
    // SAFETY: bus addresses in this simulator are virtual addresses the test handed to the
    // controller (queue bases, PRPs); the test keeps that memory alive and mapped while commands
    // are outstanding, exactly as a host must for a real controller's DMA. Volatile byte copies
    // because the host may be polling the same memory.
    unsafe {
        let p = addr as *const u8;
        for (i, b) in out.iter_mut().enumerate() {
            *b = p.add(i).read_volatile();
        }
    }
}

/// Copies `data` to host memory at bus address `addr`.
pub fn write(addr: u64, data: &[u8]) {
    // SAFETY: as in `read`: the test owns and keeps alive the memory it named as a DMA target.
    unsafe {
        let p = addr as *mut u8;
        for (i, b) in data.iter().enumerate() {
            p.add(i).write_volatile(*b);
        }
    }
}

/// Reads one little-endian u64 (a PRP list entry).
pub fn read_u64(addr: u64) -> u64 {
    let mut b = [0u8; 8];
    read(addr, &mut b);
    u64::from_le_bytes(b)
}

/// Reads a 64-byte submission queue entry.
pub fn read_cmd(addr: u64) -> [u32; 16] {
    fence(Ordering::Acquire);
    let mut c = [0u32; 16];
    for (i, d) in c.iter_mut().enumerate() {
        // SAFETY: an SQ slot inside a ring the host created (see `read`), 4-byte aligned.
        *d = unsafe { ((addr + 4 * i as u64) as *const u32).read_volatile() };
    }
    c
}

/// Writes a completion queue entry: dwords 0-2, then dword 3 (with the phase tag) last.
pub fn write_cpl(addr: u64, cpl: [u32; 4]) {
    for (i, d) in cpl.iter().enumerate().take(3) {
        // SAFETY: a CQ slot inside a ring the host created (see `read`), 4-byte aligned.
        unsafe { ((addr + 4 * i as u64) as *mut u32).write_volatile(*d) };
    }
    fence(Ordering::Release);
    // SAFETY: as above.
    unsafe { ((addr + 12) as *mut u32).write_volatile(cpl[3]) };
}
