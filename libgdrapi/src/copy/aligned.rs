//! Scalar device accesses: the aligned-access helper used for heads and tails of write-combined
//! copies (spec §4.5), and the whole-copy loop used for `Device` mappings.
//!
//! Every device-side access here is one volatile load or store of 1, 2, 4 or 8 bytes at an address
//! that is a multiple of its width. That is what uncached and write-combined PCIe mappings, and
//! arm64 Device-nGnRE memory, accept without faults, splitting, or merging by the compiler. The host
//! side may be unaligned, so it goes through `read_unaligned`/`write_unaligned`.

/// Width of the next device access: the largest power of two up to 8 that divides the device
/// address, halved until it fits in `remaining`. `remaining` must be non-zero.
///
/// This is the same rule for the write-combined helper (spec: lowest set bit of the offset within
/// 16 bytes, 8 when 0) and for the `Device` loop (largest of 8/4/2/1 the pointer is aligned to).
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

/// Host -> device with naturally aligned volatile device stores of at most 8 bytes.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes, `src` for `n` bytes of reads, and they do not overlap.
/// No alignment is required of either pointer.
pub(crate) unsafe fn to_device(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        let w = step(dst.addr().wrapping_add(i), n - i);
        // SAFETY: i + w <= n, so both accesses stay inside the ranges the caller vouches for.
        // `step` returned a width that divides the device address, so the volatile store is
        // naturally aligned; the host load is explicitly unaligned.
        unsafe {
            let d = dst.add(i);
            let s = src.add(i);
            match w {
                8 => d.cast::<u64>().write_volatile(s.cast::<u64>().read_unaligned()),
                4 => d.cast::<u32>().write_volatile(s.cast::<u32>().read_unaligned()),
                2 => d.cast::<u16>().write_volatile(s.cast::<u16>().read_unaligned()),
                _ => d.write_volatile(s.read()),
            }
        }
        i += w;
    }
}

/// Device -> host with naturally aligned volatile device loads of at most 8 bytes.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes, `src` for `n` bytes of reads, and they do not overlap.
/// No alignment is required of either pointer.
pub(crate) unsafe fn from_device(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        let w = step(src.addr().wrapping_add(i), n - i);
        // SAFETY: i + w <= n keeps both accesses in range; `step` made the device (source)
        // address a multiple of the width, so the volatile load is naturally aligned; the host
        // store is explicitly unaligned.
        unsafe {
            let d = dst.add(i);
            let s = src.add(i);
            match w {
                8 => d.cast::<u64>().write_unaligned(s.cast::<u64>().read_volatile()),
                4 => d.cast::<u32>().write_unaligned(s.cast::<u32>().read_volatile()),
                2 => d.cast::<u16>().write_unaligned(s.cast::<u16>().read_volatile()),
                _ => d.write(s.read_volatile()),
            }
        }
        i += w;
    }
}
