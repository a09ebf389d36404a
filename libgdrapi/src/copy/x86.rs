//! x86-64 SIMD copy kernels.
//!
//! Contract shared by every kernel here (checked by `debug_assert!`, relied on for soundness):
//! the device-side pointer (`dst` for stores, `src` for loads) is aligned to the kernel's width,
//! `n` is a multiple of that width (0 is allowed), both ranges are valid and do not overlap, and
//! the CPU has the instruction set named by the function (the dispatcher only hands out kernels
//! whose features were detected). The host side may be unaligned.
//!
//! Stores to the device use non-temporal (MOVNTDQ/VMOVNTDQ) or direct (MOVDIR64B) stores, so no
//! line of the mapping is ever read for ownership; loads from the device use streaming loads
//! (MOVNTDQA/VMOVNTDQA) except in the SSE2 fallback for CPUs without SSE4.1. No kernel fences: the
//! caller issues one fence per `gdr_copy_*` call (spec §4.5). Loads of one 64-byte line are issued
//! back to back before the host stores, so a streaming-load buffer filled by the first load of a
//! line serves the rest of it.

use core::arch::asm;
use core::arch::x86_64::*;

/// CPUID leaf 7 ECX bit 28: MOVDIR64B. `std` has no stable detection macro name for it.
pub(super) fn has_movdir64b() -> bool {
    #[allow(unused_unsafe)] // CPUID intrinsics are safe in recent Rust, unsafe in older ones.
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is queried only when leaf 0 reports it.
    let (max_leaf, ecx7) = unsafe {
        let max = __cpuid(0).eax;
        let ecx = if max >= 7 { __cpuid_count(7, 0).ecx } else { 0 };
        (max, ecx)
    };
    max_leaf >= 7 && (ecx7 >> 28) & 1 == 1
}

/// x86 SFENCE: orders the weakly ordered non-temporal and MOVDIR64B stores before later stores.
pub(super) fn sfence() {
    // SAFETY: SFENCE is baseline SSE on x86-64, touches no memory operand and no flags; without
    // `nomem` the asm block is also a compiler barrier, which is what a fence must be.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) }
}

/// x86 MFENCE: full barrier, used when mappings of several types coexist (spec §4.5).
pub(super) fn mfence() {
    // SAFETY: MFENCE is baseline SSE2 on x86-64 and has no operands; compiler barrier as above.
    unsafe { asm!("mfence", options(nostack, preserves_flags)) }
}

// ------------------------------------------------------------------------------------------------
// Stores (host -> device)
// ------------------------------------------------------------------------------------------------

/// 16-byte MOVNTDQ stores, 4 per 64-byte line.
///
/// # Safety
/// Module contract with width 16 (`dst` is the device side).
#[target_feature(enable = "sse2")]
pub(super) unsafe fn store_sse2(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(dst.addr().is_multiple_of(16) && n.is_multiple_of(16));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n keeps every access in range; dst + i is 16-aligned because dst is
        // and i is a multiple of 16, as MOVNTDQ requires; host loads are unaligned loads.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m128i>(), src.add(i).cast::<__m128i>());
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += 64;
    }
    while i < n {
        // SAFETY: i + 16 <= n (n is a multiple of 16); alignment as above.
        unsafe {
            let v = _mm_loadu_si128(src.add(i).cast());
            _mm_stream_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

/// 32-byte VMOVNTDQ (ymm) stores, 2 per line. VEX.256 VMOVNTDQ needs AVX only, not AVX2.
///
/// # Safety
/// Module contract with width 32 (`dst` is the device side); the CPU has AVX.
#[target_feature(enable = "avx")]
pub(super) unsafe fn store_avx(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(dst.addr().is_multiple_of(32) && n.is_multiple_of(32));
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n keeps the four 32-byte accesses in range; dst + i is 32-aligned
        // (dst is, i is a multiple of 32) as VMOVNTDQ requires; host loads are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m256i>(), src.add(i).cast::<__m256i>());
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            let c = _mm256_loadu_si256(s.add(2));
            let e = _mm256_loadu_si256(s.add(3));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
            _mm256_stream_si256(d.add(2), c);
            _mm256_stream_si256(d.add(3), e);
        }
        i += 128;
    }
    while i < n {
        // SAFETY: i + 32 <= n (n is a multiple of 32); alignment as above.
        unsafe {
            let v = _mm256_loadu_si256(src.add(i).cast());
            _mm256_stream_si256(dst.add(i).cast(), v);
        }
        i += 32;
    }
}

/// 64-byte VMOVNTDQ (zmm) stores, one per line. Implemented and benchmarked; see
/// `select.rs` for why the dispatcher does not pick it.
///
/// # Safety
/// Module contract with width 64 (`dst` is the device side); the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_avx512(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(dst.addr().is_multiple_of(64) && n.is_multiple_of(64));
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n keeps both 64-byte accesses in range; dst + i is 64-aligned as the
        // zmm VMOVNTDQ requires; host loads are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m512i>(), src.add(i).cast::<__m512i>());
            let a = _mm512_loadu_si512(s);
            let b = _mm512_loadu_si512(s.add(1));
            _mm512_stream_si512(d, a);
            _mm512_stream_si512(d.add(1), b);
        }
        i += 128;
    }
    if i < n {
        // SAFETY: exactly one 64-byte line remains (n is a multiple of 64); alignment as above.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i).cast());
            _mm512_stream_si512(dst.add(i).cast(), v);
        }
    }
}

/// MOVDIR64B: one 64-byte direct store per line, written as a single non-torn 64-byte write (the
/// property the instruction exists for), whatever the destination's memory type. Inline asm
/// because the intrinsic is not stable; the source operand may be unaligned.
///
/// # Safety
/// Module contract with width 64 (`dst` is the device side); the CPU reports MOVDIR64B
/// (`has_movdir64b`), otherwise the instruction raises #UD.
pub(super) unsafe fn store_movdir64b(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(dst.addr().is_multiple_of(64) && n.is_multiple_of(64));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 64 <= n, so the 64-byte source read and destination write are in range;
        // dst + i is 64-aligned (MOVDIR64B faults otherwise); the caller guarantees CPU support.
        // The asm reads and writes memory (no `nomem`/`readonly`), so the compiler keeps the
        // host buffer's contents materialised before it and does not cache device memory across it.
        unsafe {
            asm!(
                "movdir64b {d}, zmmword ptr [{s}]",
                d = in(reg) dst.add(i),
                s = in(reg) src.add(i),
                options(nostack, preserves_flags),
            );
        }
        i += 64;
    }
}

// ------------------------------------------------------------------------------------------------
// Loads (device -> host)
// ------------------------------------------------------------------------------------------------

/// 16-byte MOVDQA loads: plain loads, for CPUs without SSE4.1 (no streaming load exists there).
///
/// # Safety
/// Module contract with width 16 (`src` is the device side).
#[target_feature(enable = "sse2")]
pub(super) unsafe fn load_sse2(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(src.addr().is_multiple_of(16) && n.is_multiple_of(16));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n keeps every access in range; src + i is 16-aligned as MOVDQA
        // requires; host stores are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m128i>(), src.add(i).cast::<__m128i>());
            let a = _mm_load_si128(s);
            let b = _mm_load_si128(s.add(1));
            let c = _mm_load_si128(s.add(2));
            let e = _mm_load_si128(s.add(3));
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
        }
        i += 64;
    }
    while i < n {
        // SAFETY: i + 16 <= n; alignment as above.
        unsafe {
            let v = _mm_load_si128(src.add(i).cast());
            _mm_storeu_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

/// 16-byte MOVNTDQA streaming loads, the 4 of a line back to back.
///
/// # Safety
/// Module contract with width 16 (`src` is the device side); the CPU has SSE4.1.
#[target_feature(enable = "sse4.1")]
pub(super) unsafe fn load_sse41(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(src.addr().is_multiple_of(16) && n.is_multiple_of(16));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n keeps every access in range; src + i is 16-aligned as MOVNTDQA
        // requires; host stores are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m128i>(), src.add(i).cast::<__m128i>());
            let a = _mm_stream_load_si128(s);
            let b = _mm_stream_load_si128(s.add(1));
            let c = _mm_stream_load_si128(s.add(2));
            let e = _mm_stream_load_si128(s.add(3));
            _mm_storeu_si128(d, a);
            _mm_storeu_si128(d.add(1), b);
            _mm_storeu_si128(d.add(2), c);
            _mm_storeu_si128(d.add(3), e);
        }
        i += 64;
    }
    while i < n {
        // SAFETY: i + 16 <= n; alignment as above.
        unsafe {
            let v = _mm_stream_load_si128(src.add(i).cast());
            _mm_storeu_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

/// 32-byte VMOVNTDQA (ymm) streaming loads, 4 (two lines) per iteration.
///
/// # Safety
/// Module contract with width 32 (`src` is the device side); the CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn load_avx2(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(src.addr().is_multiple_of(32) && n.is_multiple_of(32));
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n keeps the four 32-byte accesses in range; src + i is 32-aligned as
        // the ymm VMOVNTDQA requires; host stores are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m256i>(), src.add(i).cast::<__m256i>());
            let a = _mm256_stream_load_si256(s);
            let b = _mm256_stream_load_si256(s.add(1));
            let c = _mm256_stream_load_si256(s.add(2));
            let e = _mm256_stream_load_si256(s.add(3));
            _mm256_storeu_si256(d, a);
            _mm256_storeu_si256(d.add(1), b);
            _mm256_storeu_si256(d.add(2), c);
            _mm256_storeu_si256(d.add(3), e);
        }
        i += 128;
    }
    while i < n {
        // SAFETY: i + 32 <= n; alignment as above.
        unsafe {
            let v = _mm256_stream_load_si256(src.add(i).cast());
            _mm256_storeu_si256(dst.add(i).cast(), v);
        }
        i += 32;
    }
}

/// 64-byte VMOVNTDQA (zmm) streaming loads, one per line. Implemented and benchmarked, not
/// selected (see `select.rs`).
///
/// # Safety
/// Module contract with width 64 (`src` is the device side); the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn load_avx512(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(src.addr().is_multiple_of(64) && n.is_multiple_of(64));
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n keeps both 64-byte accesses in range; src + i is 64-aligned as the
        // zmm VMOVNTDQA requires; host stores are unaligned.
        unsafe {
            let (d, s) = (dst.add(i).cast::<__m512i>(), src.add(i).cast::<__m512i>());
            let a = _mm512_stream_load_si512(s);
            let b = _mm512_stream_load_si512(s.add(1));
            _mm512_storeu_si512(d, a);
            _mm512_storeu_si512(d.add(1), b);
        }
        i += 128;
    }
    if i < n {
        // SAFETY: exactly one 64-byte line remains; alignment as above.
        unsafe {
            let v = _mm512_stream_load_si512(src.add(i).cast());
            _mm512_storeu_si512(dst.add(i).cast(), v);
        }
    }
}
