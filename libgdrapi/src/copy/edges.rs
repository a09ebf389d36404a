//! Device stores under 16 bytes into a write-combined mapping on x86-64: the whole copy when it
//! is that short, and the head and tail of a longer one. At most two plain stores of one width,
//! the second ending where the range ends, so they overlap when the size is not that width.
//!
//! Why this differs from the aligned-access helper (`aligned.rs`, spec §4.5), which keeps every
//! device store naturally aligned and needs up to four of them (8 bytes at device offset 7: 1, 4,
//! 2 and 1 bytes): on x86 a plain store to write-combined memory is taken by the write-combining
//! buffer of its line whatever its alignment (one crossing a line boundary goes into two buffers),
//! and the buffer leaves the core as whole-line or byte-enabled partial writes. Those partial
//! writes are what one-byte stores, which the helper itself makes, produce, so a misaligned store
//! asks nothing new of the device. Bytes written twice get the same value twice, which memory (a
//! BAR maps GPU memory, not registers) cannot tell from once, and no byte outside the range is
//! written. What is lost is single-copy atomicity of a naturally aligned 8-byte part of a longer
//! store, which no copy of more than one access promises; one naturally aligned access of 1, 2, 4
//! or 8 bytes never comes here ([`super::aligned::is_single_access`] takes it first).
//!
//! Only x86-64 and only write-combined mappings: arm64 Device memory faults on misaligned
//! accesses, and its write-combined (Normal non-cacheable) mappings keep the helper so that one
//! rule covers that architecture. Loads do not come here: every device read is a PCIe round trip,
//! so they read whole aligned chunks instead (`wc.rs`).

/// Calls `put(offset, width)` for each store of an `n`-byte copy, `n < 16`: none when `n` is 0, one
/// when it is 1, two of the widest power of two up to 8 that fits otherwise, at 0 and at `n - width`.
/// The plan [`to_device`] follows, kept apart so the tests can check it.
#[inline(always)]
pub(crate) fn plan(n: usize, mut put: impl FnMut(usize, usize)) {
    debug_assert!(n < 16);
    let w = if n & 8 != 0 {
        8
    } else if n & 4 != 0 {
        4
    } else if n & 2 != 0 {
        2
    } else {
        if n != 0 {
            put(0, 1);
        }
        return;
    };
    put(0, w);
    put(n - w, w);
}

/// Host -> write-combined device memory, `n < 16` bytes, any alignment of either side, with
/// the stores [`plan`] lists. Does not fence.
///
/// # Safety
/// `dst` is valid for `n` bytes of writes and lies in a write-combined (or cacheable) mapping on
/// x86-64, `src` is valid for `n` bytes of reads, they do not overlap, and `n < 16`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: `plan` lists stores inside [0, n) (its test checks it); the caller vouches for
    // both ranges and for the memory type.
    plan(n, |i, w| unsafe { store_any(dst.add(i), src.add(i), w) });
}

/// One store of `w` (1, 2, 4 or 8) bytes at any alignment, as exactly one `mov`: inline assembly,
/// because a volatile write must be aligned in Rust and a plain unaligned write may be merged
/// with the other store, split, or turned into a call by the compiler.
///
/// # Safety
/// `d` is valid for `w` bytes of writes, `s` for `w` bytes of reads.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_any(d: *mut u8, s: *const u8, w: usize) {
    use std::arch::asm;
    // SAFETY: the caller's contract; each `mov` writes exactly `w` bytes at `d`, touches no stack
    // and leaves the flags alone. The host side is ordinary memory, read unaligned.
    unsafe {
        match w {
            8 => {
                let v = s.cast::<u64>().read_unaligned();
                asm!("mov qword ptr [{d}], {v}", d = in(reg) d, v = in(reg) v, options(nostack, preserves_flags));
            }
            4 => {
                let v = s.cast::<u32>().read_unaligned();
                asm!("mov dword ptr [{d}], {v:e}", d = in(reg) d, v = in(reg) v, options(nostack, preserves_flags));
            }
            2 => {
                let v = s.cast::<u16>().read_unaligned();
                asm!("mov word ptr [{d}], {v:x}", d = in(reg) d, v = in(reg) v, options(nostack, preserves_flags));
            }
            _ => {
                let v = s.read();
                asm!("mov byte ptr [{d}], {v}", d = in(reg) d, v = in(reg_byte) v, options(nostack, preserves_flags));
            }
        }
    }
}

/// Elsewhere the naturally aligned helper (see the module's comment).
///
/// # Safety
/// As the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) unsafe fn to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded; the helper takes any alignment.
    unsafe { super::aligned::to_device(dst, src, n) }
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn the_plan_covers_exactly_the_range_with_at_most_two_stores_of_one_width() {
        let mut none = 0;
        plan(0, |_, _| none += 1);
        assert_eq!(none, 0, "a store for 0 bytes");
        for n in 1..16 {
            let mut written = [0u32; 16];
            let mut stores = Vec::new();
            plan(n, |i, w| {
                stores.push((i, w));
                for b in &mut written[i..i + w] {
                    *b += 1;
                }
            });
            assert!(!stores.is_empty() && stores.len() <= 2, "n {n}: {stores:?}");
            assert!(stores.iter().all(|&(_, w)| w == stores[0].1 && [1, 2, 4, 8].contains(&w)), "n {n}: {stores:?}");
            assert!(stores.iter().all(|&(i, w)| i + w <= n), "n {n}: store past the range, {stores:?}");
            assert!(written[..n].iter().all(|&c| c >= 1), "n {n}: a byte not written, {stores:?}");
            assert_eq!(stores[0].0, 0, "n {n}");
            // The widest width that fits: a narrower one would leave a gap between the two.
            assert!(stores[0].1 * 2 > n, "n {n}: {stores:?}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_stores_write_every_byte_of_the_range_and_none_outside_at_every_offset() {
        for off in 0..16 {
            for n in 0..16 {
                let mut dst = [0xA5u8; 48];
                let src: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(37).wrapping_add(1)).collect();
                // SAFETY: `off + n <= 30 < 48`, disjoint buffers, `n < 16`.
                unsafe { super::to_device(dst.as_mut_ptr().add(off), src.as_ptr(), n) };
                assert_eq!(&dst[off..off + n], &src[..], "off {off} n {n}");
                assert!(dst[..off].iter().chain(&dst[off + n..]).all(|&b| b == 0xA5), "off {off} n {n}");
            }
        }
    }
}
