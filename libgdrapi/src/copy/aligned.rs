//! Scalar device accesses: the aligned-access helper (spec §4.5) used for heads and tails of
//! write-combined stores off x86-64 (x86-64 uses `edges.rs`) and for loads without the chunk
//! path, the single-access fast path of both directions, and the whole-copy loop used for
//! `Device` mappings.
//!
//! Every device-side access here is one volatile load or store of 1, 2, 4 or 8 bytes at an address
//! that is a multiple of its width. That is what uncached and write-combined PCIe mappings, and
//! arm64 Device-nGnRE memory, accept without faults, splitting, or merging by the compiler. The host
//! side may be unaligned, so it goes through `read_unaligned`/`write_unaligned`.
//!
//! The sequence of widths is the one [`step`] defines (widest naturally aligned access that fits),
//! computed without a per-access loop: [`pieces`] first consumes the low set bits of the device
//! address (1, 2, then 4 bytes) while they fit, then whole 8-byte words, then the set bits of what
//! is left (4, 2, 1). Both orders keep every access naturally aligned: the ascending part clears
//! the address's low bits one by one, and once something does not fit, everything left is smaller
//! than the alignment already reached.

/// Width of the next device access: the largest power of two up to 8 that divides the device
/// address, halved until it fits in `remaining`. `remaining` must be non-zero.
///
/// This is the rule the helper follows (spec: lowest set bit of the offset within 16 bytes, 8
/// when 0, halved until it fits); [`pieces`] produces the same sequence without computing it per
/// access, which the unit tests check.
#[cfg_attr(not(test), allow(dead_code))]
#[inline]
pub(crate) const fn step(addr: usize, remaining: usize) -> usize {
    debug_assert!(remaining > 0);
    let low = addr & 7;
    let mut w = if low == 0 { 8 } else { 1 << low.trailing_zeros() };
    while w > remaining {
        w >>= 1;
    }
    w
}

/// Calls `access(offset, width)` for each device access of an `n`-byte copy whose device side
/// starts at `addr`, in address order, with the widths [`step`] would choose.
#[inline(always)]
pub(crate) fn pieces(addr: usize, n: usize, mut access: impl FnMut(usize, usize)) {
    let mut i = 0;
    for w in [1, 2, 4] {
        if addr.wrapping_add(i) & w != 0 {
            if n - i < w {
                break;
            }
            access(i, w);
            i += w;
        }
    }
    while n - i >= 8 {
        access(i, 8);
        i += 8;
    }
    for w in [4, 2, 1] {
        if (n - i) & w != 0 {
            access(i, w);
            i += w;
        }
    }
}

/// One device store of `w` (1, 2, 4 or 8) bytes.
///
/// # Safety
/// `d` is valid for `w` bytes of writes and aligned to `w`; `s` valid for `w` bytes of reads.
#[inline(always)]
pub(crate) unsafe fn store_one(d: *mut u8, s: *const u8, w: usize) {
    // SAFETY: the caller's contract; the host side is read unaligned.
    unsafe {
        match w {
            8 => d.cast::<u64>().write_volatile(s.cast::<u64>().read_unaligned()),
            4 => d.cast::<u32>().write_volatile(s.cast::<u32>().read_unaligned()),
            2 => d.cast::<u16>().write_volatile(s.cast::<u16>().read_unaligned()),
            _ => d.write_volatile(s.read()),
        }
    }
}

/// One device load of `w` (1, 2, 4 or 8) bytes.
///
/// # Safety
/// `s` is valid for `w` bytes of reads and aligned to `w`; `d` valid for `w` bytes of writes.
#[inline(always)]
pub(crate) unsafe fn load_one(d: *mut u8, s: *const u8, w: usize) {
    // SAFETY: the caller's contract; the host side is written unaligned.
    unsafe {
        match w {
            8 => d.cast::<u64>().write_unaligned(s.cast::<u64>().read_volatile()),
            4 => d.cast::<u32>().write_unaligned(s.cast::<u32>().read_volatile()),
            2 => d.cast::<u16>().write_unaligned(s.cast::<u16>().read_volatile()),
            _ => d.write(s.read_volatile()),
        }
    }
}

/// Whether an `n`-byte copy at device address `addr` is one naturally aligned access: `n` is 1,
/// 2, 4 or 8 and `addr` a multiple of it. Three instructions and no table.
#[inline(always)]
pub(crate) fn is_single_access(addr: usize, n: usize) -> bool {
    let m = n.wrapping_sub(1);
    m < 8 && m & (n | addr) == 0
}

/// Host -> device with naturally aligned volatile device stores of at most 8 bytes.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes, `src` for `n` bytes of reads, and they do not overlap.
/// No alignment is required of either pointer.
#[inline]
pub(crate) unsafe fn to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: `pieces` yields accesses inside [0, n) whose device address is a multiple of their
    // width; the caller vouches for both ranges.
    pieces(dst.addr(), n, |i, w| unsafe { store_one(dst.add(i), src.add(i), w) });
}

/// Device -> host with naturally aligned volatile device loads of at most 8 bytes.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes, `src` for `n` bytes of reads, and they do not overlap.
/// No alignment is required of either pointer.
#[inline]
pub(crate) unsafe fn from_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: as in `to_device`, with the device (source) side aligned.
    pieces(src.addr(), n, |i, w| unsafe { load_one(dst.add(i), src.add(i), w) });
}
