//! aarch64 kernels: 16-byte NEON (`q` register) accesses, four per 64-byte line.
//!
//! Same contract as the x86 kernels: device-side pointer aligned to 16, `n` a multiple of 16,
//! valid non-overlapping ranges; the host side may be unaligned. Advanced SIMD is part of the
//! aarch64-unknown-linux-gnu baseline, so no run-time check is needed. Device accesses are
//! volatile so the compiler neither splits, merges nor drops them. A write-combined mapping is
//! Normal non-cacheable memory on arm64, where 16-byte aligned accesses are fine; LS64
//! (ST64B/LD64B) is not stable in Rust and is not used.

use core::arch::aarch64::uint8x16_t;
use core::arch::asm;

/// DMB ST: orders earlier stores before later stores.
pub(super) fn dmb_st() {
    // SAFETY: a barrier instruction with no operands; no `nomem`, so also a compiler barrier.
    unsafe { asm!("dmb st", options(nostack, preserves_flags)) }
}

/// DMB SY: full system barrier.
pub(super) fn dmb_sy() {
    // SAFETY: as above.
    unsafe { asm!("dmb sy", options(nostack, preserves_flags)) }
}

/// Host -> device, 16-byte volatile stores.
///
/// # Safety
/// `dst` (device) 16-aligned and valid for `n` writes, `src` valid for `n` reads, `n` a multiple of 16,
/// no overlap.
pub(super) unsafe fn store_neon(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(dst.addr().is_multiple_of(16) && n.is_multiple_of(16));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n keeps the accesses in range; dst + i is 16-aligned; host loads
        // are unaligned reads.
        unsafe {
            let (d, s) = (dst.add(i).cast::<uint8x16_t>(), src.add(i).cast::<uint8x16_t>());
            let a = s.read_unaligned();
            let b = s.add(1).read_unaligned();
            let c = s.add(2).read_unaligned();
            let e = s.add(3).read_unaligned();
            d.write_volatile(a);
            d.add(1).write_volatile(b);
            d.add(2).write_volatile(c);
            d.add(3).write_volatile(e);
        }
        i += 64;
    }
    while i < n {
        // SAFETY: i + 16 <= n; alignment as above.
        unsafe {
            let v = src.add(i).cast::<uint8x16_t>().read_unaligned();
            dst.add(i).cast::<uint8x16_t>().write_volatile(v);
        }
        i += 16;
    }
}

/// Device -> host, 16-byte volatile loads, the four of a line first.
///
/// # Safety
/// `src` (device) 16-aligned and valid for `n` reads, `dst` valid for `n` writes, `n` a multiple of 16,
/// no overlap.
pub(super) unsafe fn load_neon(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(src.addr().is_multiple_of(16) && n.is_multiple_of(16));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n keeps the accesses in range; src + i is 16-aligned; host stores
        // are unaligned writes.
        unsafe {
            let (d, s) = (dst.add(i).cast::<uint8x16_t>(), src.add(i).cast::<uint8x16_t>());
            let a = s.read_volatile();
            let b = s.add(1).read_volatile();
            let c = s.add(2).read_volatile();
            let e = s.add(3).read_volatile();
            d.write_unaligned(a);
            d.add(1).write_unaligned(b);
            d.add(2).write_unaligned(c);
            d.add(3).write_unaligned(e);
        }
        i += 64;
    }
    while i < n {
        // SAFETY: i + 16 <= n; alignment as above.
        unsafe {
            let v = src.add(i).cast::<uint8x16_t>().read_volatile();
            dst.add(i).cast::<uint8x16_t>().write_unaligned(v);
        }
        i += 16;
    }
}
