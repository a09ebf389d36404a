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

/// Generates one NEON copy kernel: `fn(dst, src, n)` copying `n` bytes in 16-byte `q` vectors,
/// four per 64-byte line with the line's loads issued before its stores. `store` kernels treat
/// `dst` as the device side, `load` kernels `src`; `load` and `store` name the pointer methods
/// used (volatile on the device side, unaligned on the host side).
macro_rules! neon_kernel {
    (
        $(#[$doc:meta])*
        $dir:ident fn $name:ident,
        load = $load:ident,
        store = $store:ident $(,)?
    ) => {
        $(#[$doc])*
        pub(super) unsafe fn $name(dst: *mut u8, src: *const u8, n: usize) {
            let device_addr = neon_kernel!(@device $dir, dst, src).addr();
            debug_assert!(device_addr.is_multiple_of(16) && n.is_multiple_of(16));
            let mut i = 0;
            while i + 64 <= n {
                // SAFETY: i + 64 <= n keeps the accesses in range; the device-side pointer plus i
                // is 16-aligned; host-side accesses are unaligned ones.
                unsafe {
                    let (d, s) = (dst.add(i).cast::<uint8x16_t>(), src.add(i).cast::<uint8x16_t>());
                    let v = [s.$load(), s.add(1).$load(), s.add(2).$load(), s.add(3).$load()];
                    d.$store(v[0]);
                    d.add(1).$store(v[1]);
                    d.add(2).$store(v[2]);
                    d.add(3).$store(v[3]);
                }
                i += 64;
            }
            while i < n {
                // SAFETY: i + 16 <= n; alignment as above.
                unsafe {
                    let v = src.add(i).cast::<uint8x16_t>().$load();
                    dst.add(i).cast::<uint8x16_t>().$store(v);
                }
                i += 16;
            }
        }
    };
    (@device store, $dst:ident, $src:ident) => { $dst };
    (@device load, $dst:ident, $src:ident) => { $src };
}

neon_kernel! {
    /// Host -> device, 16-byte volatile stores.
    ///
    /// # Safety
    /// `dst` (device) 16-aligned and valid for `n` writes, `src` valid for `n` reads, `n` a multiple of 16,
    /// no overlap.
    store fn store_neon,
    load = read_unaligned,
    store = write_volatile,
}

neon_kernel! {
    /// Device -> host, 16-byte volatile loads, the four of a line first.
    ///
    /// # Safety
    /// `src` (device) 16-aligned and valid for `n` reads, `dst` valid for `n` writes, `n` a multiple of 16,
    /// no overlap.
    load fn load_neon,
    load = read_volatile,
    store = write_unaligned,
}
