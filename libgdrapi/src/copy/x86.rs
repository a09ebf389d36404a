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
//! caller issues one fence per `gdr_copy_*` call (spec §4.5); the exception is the fenced twin of
//! a load kernel (`*_fenced`), which is that call's last step and fences itself. Loads of one
//! 64-byte line are issued back to back before the host stores, so a streaming-load buffer filled
//! by the first load of a line serves the rest of it.
//!
//! Where the CPU has AVX-512 VBMI, three more: the realigning line load (`load_avx2_realign`,
//! whose host sides that are not 32-aligned go to `load_lines_realigned`: one zmm streaming load,
//! one rotation and one blend per line, aligned host stores), `load_span_vbmi`, a whole load of
//! any length at any alignment (used below 512 bytes: one read per device line, one two-line
//! shuffle per 64 host bytes, one masked store), and `load_large_vbmi`, a whole load of 128 bytes
//! and up whose partial end lines are one zmm streaming load each (used from 512 bytes).

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

/// One 16-byte non-temporal store to the device: MOVDQU from the host, MOVNTDQ to `dev`.
///
/// # Safety
/// `dev` is 16-aligned and writable for 16 bytes, `host` readable for 16 bytes (any alignment).
#[inline(always)]
pub(super) unsafe fn nt_store16(dev: *mut u8, host: *const u8) {
    // SAFETY: the caller's contract; both instructions are baseline SSE2 on x86-64.
    unsafe {
        asm!(
            "movdqu {x}, xmmword ptr [{s}]",
            "movntdq xmmword ptr [{d}], {x}",
            s = in(reg) host, d = in(reg) dev, x = out(xmm_reg) _,
            options(nostack, preserves_flags),
        );
    }
}

/// One 16-byte load from the device: MOVNTDQA when `stream` (the CPU has SSE4.1), else MOVDQA,
/// then MOVDQU to the host.
///
/// # Safety
/// `dev` is 16-aligned and readable for 16 bytes, `host` writable for 16 bytes (any alignment);
/// `stream` only if the CPU has SSE4.1.
#[inline(always)]
pub(super) unsafe fn load16(host: *mut u8, dev: *const u8, stream: bool) {
    // SAFETY: the caller's contract; MOVDQA/MOVDQU are baseline SSE2.
    unsafe {
        if stream {
            asm!(
                "movntdqa {x}, xmmword ptr [{s}]",
                "movdqu xmmword ptr [{d}], {x}",
                s = in(reg) dev, d = in(reg) host, x = out(xmm_reg) _,
                options(nostack, preserves_flags),
            );
        } else {
            asm!(
                "movdqa {x}, xmmword ptr [{s}]",
                "movdqu xmmword ptr [{d}], {x}",
                s = in(reg) dev, d = in(reg) host, x = out(xmm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Kernel generator
// ------------------------------------------------------------------------------------------------

/// Generates one SIMD copy kernel: `fn(dst, src, n)` copying `n` bytes in `$width`-byte vectors;
/// with `fenced = name`, also its fenced twin (the same body, then SFENCE, returning 0).
///
/// `store` kernels treat `dst` as the device side, `load` kernels `src`; the device-side pointer is
/// the aligned one (see the module contract). The main loop moves one `$stride`-byte block per
/// iteration: every load of the block back to back (`$ld`), then every store (`$st`), so that the
/// loads of one line reach a streaming-load buffer together; a tail loop moves one vector at a
/// time.
///
/// The main loop is written in assembly for one reason: its first instruction sits on a 64-byte
/// boundary (`.p2align 6`). Where the compiler puts a loop depends on everything before it in the
/// library, and a loop that straddles one more 64-byte block of code than it needs is measurably
/// slower (docs/decisions/0008-code-alignment.md). The padding before the label runs once per
/// call that enters the loop.
macro_rules! simd_kernel {
    (
        $(#[$doc:meta])*
        $dir:ident fn $name:ident,
        $(fenced = $fenced:ident,)?
        $(host_unaligned = $realign:ident,)?
        feature = $feature:literal,
        $($rest:tt)*
    ) => {
        // The optional realigning function travels as one bracketed token, so the fenced twin's
        // optional block can use it.
        simd_kernel! {
            @fns [$($realign)?] $(#[$doc])* $dir fn $name, $(fenced = $fenced,)? feature = $feature, $($rest)*
        }
    };
    (
        @fns $realign:tt
        $(#[$doc:meta])*
        $dir:ident fn $name:ident,
        $(fenced = $fenced:ident,)?
        feature = $feature:literal,
        vector = $vec:ty,
        load = $load:ident,
        store = $store:ident,
        width = $width:literal,
        stride = $stride:literal,
        main = $main:tt,
        regs = $regs:tt $(,)?
    ) => {
        $(#[$doc])*
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name(dst: *mut u8, src: *const u8, n: usize) {
            simd_kernel!(@realign $realign, false, dst, src, n);
            simd_kernel!(@body $dir, $width, $stride, $vec, $load, $store, $main, $regs, dst, src, n);
        }
        $(
            /// The kernel above followed by the store fence, returning 0: a whole public copy
            /// once its ends are done, so the fast path can jump here instead of calling the
            /// kernel and fencing after it (one call and return fewer per copy).
            ///
            /// # Safety
            /// As the kernel.
            #[target_feature(enable = $feature)]
            pub(crate) unsafe extern "C" fn $fenced(dst: *mut u8, src: *const u8, n: usize) -> core::ffi::c_int {
                simd_kernel!(@realign $realign, true, dst, src, n);
                simd_kernel!(@body $dir, $width, $stride, $vec, $load, $store, $main, $regs, dst, src, n);
                end_of::<true>()
            }
        )?
    };
    (@body $dir:ident, $width:literal, $stride:literal, $vec:ty, $load:ident, $store:ident,
        [$($ld:tt),+ ; $($st:tt),+ $(,)?], [$($reg:tt),+], $dst:ident, $src:ident, $n:ident) => {{
        let (dst, src, n) = ($dst, $src, $n);
        let device_addr = simd_kernel!(@device $dir, dst, src).addr();
        debug_assert!(device_addr.is_multiple_of($width) && n.is_multiple_of($width));
        let mut i = 0usize;
        if n >= $stride {
            // SAFETY: the loop runs for i = 0, $stride, .. while i <= n - $stride, so every
            // access lies in [0, n); the device-side pointer plus i is aligned to the vector
            // width (the pointer is, and i is a multiple of it), as the device-side
            // instruction requires; the host side uses unaligned moves. The caller
            // guarantees the CPU has the target feature. Only the named vector registers,
            // `i` and the flags change; memory is read and written as the kernel's contract
            // says, so the block is not `nomem`/`readonly`.
            unsafe {
                asm!(
                    ".p2align 6",
                    "2:",
                    $($ld,)+
                    $($st,)+
                    "add {i}, {stride}",
                    "cmp {i}, {last}",
                    "jbe 2b",
                    i = inout(reg) i,
                    last = in(reg) n - $stride,
                    d = in(reg) dst,
                    s = in(reg) src,
                    stride = const $stride,
                    $(out($reg) _,)+
                    options(nostack),
                );
            }
        }
        while i < n {
            // SAFETY: one whole vector remains (n is a multiple of the width, i < n);
            // alignment as above.
            unsafe {
                let v = $load(src.add(i).cast::<$vec>());
                $store(dst.add(i).cast::<$vec>(), v);
            }
            i += $width;
        }
    }};
    // With `host_unaligned = f`: a copy whose host side is not 32-aligned is `f`'s (`f::<true>`
    // fences and returns 0, for the fenced twin), reached by a jump; an aligned one falls through
    // to the kernel's own loop.
    (@realign [], $fence:literal, $dst:ident, $src:ident, $n:ident) => {};
    (@realign [$realign:ident], false, $dst:ident, $src:ident, $n:ident) => {
        if $dst.addr() & 31 != 0 {
            // SAFETY: the kernel's contract, which is `f`'s, and the CPU has `f`'s features (the
            // kernel's feature list includes them).
            unsafe { $realign::<false>($dst, $src, $n) };
            return;
        }
    };
    (@realign [$realign:ident], true, $dst:ident, $src:ident, $n:ident) => {
        if $dst.addr() & 31 != 0 {
            // SAFETY: as above.
            return unsafe { $realign::<true>($dst, $src, $n) };
        }
    };
    (@device store, $dst:ident, $src:ident) => { $dst };
    (@device load, $dst:ident, $src:ident) => { $src };
}

// ------------------------------------------------------------------------------------------------
// Stores (host -> device)
// ------------------------------------------------------------------------------------------------

simd_kernel! {
    /// 16-byte MOVNTDQ stores, 4 per 64-byte line.
    ///
    /// # Safety
    /// Module contract with width 16 (`dst` is the device side).
    store fn store_sse2,
    feature = "sse2",
    vector = __m128i,
    load = _mm_loadu_si128,
    store = _mm_stream_si128,
    width = 16,
    stride = 64,
    main = [
        "movdqu xmm0, xmmword ptr [{s} + {i} + 0]",
        "movdqu xmm1, xmmword ptr [{s} + {i} + 16]",
        "movdqu xmm2, xmmword ptr [{s} + {i} + 32]",
        "movdqu xmm3, xmmword ptr [{s} + {i} + 48]";
        "movntdq xmmword ptr [{d} + {i} + 0], xmm0",
        "movntdq xmmword ptr [{d} + {i} + 16], xmm1",
        "movntdq xmmword ptr [{d} + {i} + 32], xmm2",
        "movntdq xmmword ptr [{d} + {i} + 48], xmm3",
    ],
    regs = ["xmm0", "xmm1", "xmm2", "xmm3"],
}

simd_kernel! {
    /// 32-byte VMOVNTDQ (ymm) stores, 2 per line. VEX.256 VMOVNTDQ needs AVX only, not AVX2.
    ///
    /// # Safety
    /// Module contract with width 32 (`dst` is the device side); the CPU has AVX.
    store fn store_avx,
    feature = "avx",
    vector = __m256i,
    load = _mm256_loadu_si256,
    store = _mm256_stream_si256,
    width = 32,
    stride = 128,
    main = [
        "vmovdqu ymm0, ymmword ptr [{s} + {i} + 0]",
        "vmovdqu ymm1, ymmword ptr [{s} + {i} + 32]",
        "vmovdqu ymm2, ymmword ptr [{s} + {i} + 64]",
        "vmovdqu ymm3, ymmword ptr [{s} + {i} + 96]";
        "vmovntdq ymmword ptr [{d} + {i} + 0], ymm0",
        "vmovntdq ymmword ptr [{d} + {i} + 32], ymm1",
        "vmovntdq ymmword ptr [{d} + {i} + 64], ymm2",
        "vmovntdq ymmword ptr [{d} + {i} + 96], ymm3",
    ],
    regs = ["ymm0", "ymm1", "ymm2", "ymm3"],
}

simd_kernel! {
    /// 64-byte VMOVNTDQ (zmm) stores, one per line. Implemented and benchmarked; see
    /// `select.rs` for why the dispatcher does not pick it.
    ///
    /// # Safety
    /// Module contract with width 64 (`dst` is the device side); the CPU has AVX-512F.
    store fn store_avx512,
    feature = "avx512f",
    vector = __m512i,
    load = _mm512_loadu_si512,
    store = _mm512_stream_si512,
    width = 64,
    stride = 128,
    main = [
        "vmovdqu64 zmm0, zmmword ptr [{s} + {i} + 0]",
        "vmovdqu64 zmm1, zmmword ptr [{s} + {i} + 64]";
        "vmovntdq zmmword ptr [{d} + {i} + 0], zmm0",
        "vmovntdq zmmword ptr [{d} + {i} + 64], zmm1",
    ],
    regs = ["zmm0", "zmm1"],
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

simd_kernel! {
    /// 16-byte MOVDQA loads: plain loads, for CPUs without SSE4.1 (no streaming load exists there).
    ///
    /// # Safety
    /// Module contract with width 16 (`src` is the device side).
    load fn load_sse2,
    fenced = load_sse2_fenced,
    feature = "sse2",
    vector = __m128i,
    load = _mm_load_si128,
    store = _mm_storeu_si128,
    width = 16,
    stride = 64,
    main = [
        "movdqa xmm0, xmmword ptr [{s} + {i} + 0]",
        "movdqa xmm1, xmmword ptr [{s} + {i} + 16]",
        "movdqa xmm2, xmmword ptr [{s} + {i} + 32]",
        "movdqa xmm3, xmmword ptr [{s} + {i} + 48]";
        "movdqu xmmword ptr [{d} + {i} + 0], xmm0",
        "movdqu xmmword ptr [{d} + {i} + 16], xmm1",
        "movdqu xmmword ptr [{d} + {i} + 32], xmm2",
        "movdqu xmmword ptr [{d} + {i} + 48], xmm3",
    ],
    regs = ["xmm0", "xmm1", "xmm2", "xmm3"],
}

simd_kernel! {
    /// 16-byte MOVNTDQA streaming loads, the 4 of a line back to back.
    ///
    /// # Safety
    /// Module contract with width 16 (`src` is the device side); the CPU has SSE4.1.
    load fn load_sse41,
    fenced = load_sse41_fenced,
    feature = "sse4.1",
    vector = __m128i,
    load = _mm_stream_load_si128,
    store = _mm_storeu_si128,
    width = 16,
    stride = 64,
    main = [
        "movntdqa xmm0, xmmword ptr [{s} + {i} + 0]",
        "movntdqa xmm1, xmmword ptr [{s} + {i} + 16]",
        "movntdqa xmm2, xmmword ptr [{s} + {i} + 32]",
        "movntdqa xmm3, xmmword ptr [{s} + {i} + 48]";
        "movdqu xmmword ptr [{d} + {i} + 0], xmm0",
        "movdqu xmmword ptr [{d} + {i} + 16], xmm1",
        "movdqu xmmword ptr [{d} + {i} + 32], xmm2",
        "movdqu xmmword ptr [{d} + {i} + 48], xmm3",
    ],
    regs = ["xmm0", "xmm1", "xmm2", "xmm3"],
}

/// The AVX2 streaming-load kernel's parameters, shared by [`load_avx2`] and
/// [`load_avx2_realign`] (which adds the realigning path and its features).
macro_rules! avx2_load_kernel {
    ($(#[$doc:meta])* $name:ident, fenced = $fenced:ident, $(host_unaligned = $realign:ident,)? feature = $feature:literal) => {
        simd_kernel! {
            $(#[$doc])*
            load fn $name,
            fenced = $fenced,
            $(host_unaligned = $realign,)?
            feature = $feature,
            vector = __m256i,
            load = _mm256_stream_load_si256,
            store = _mm256_storeu_si256,
            width = 32,
            stride = 128,
            main = [
                "vmovntdqa ymm0, ymmword ptr [{s} + {i} + 0]",
                "vmovntdqa ymm1, ymmword ptr [{s} + {i} + 32]",
                "vmovntdqa ymm2, ymmword ptr [{s} + {i} + 64]",
                "vmovntdqa ymm3, ymmword ptr [{s} + {i} + 96]";
                "vmovdqu ymmword ptr [{d} + {i} + 0], ymm0",
                "vmovdqu ymmword ptr [{d} + {i} + 32], ymm1",
                "vmovdqu ymmword ptr [{d} + {i} + 64], ymm2",
                "vmovdqu ymmword ptr [{d} + {i} + 96], ymm3",
            ],
            regs = ["ymm0", "ymm1", "ymm2", "ymm3"],
        }
    };
}

avx2_load_kernel! {
    /// 32-byte VMOVNTDQA (ymm) streaming loads, 4 (two lines) per iteration.
    ///
    /// # Safety
    /// Module contract with width 32 (`src` is the device side); the CPU has AVX2.
    load_avx2,
    fenced = load_avx2_fenced,
    feature = "avx2"
}

simd_kernel! {
    /// 64-byte VMOVNTDQA (zmm) streaming loads, one per line. Implemented and benchmarked, not
    /// selected (see `select.rs`).
    ///
    /// # Safety
    /// Module contract with width 64 (`src` is the device side); the CPU has AVX-512F.
    load fn load_avx512,
    feature = "avx512f",
    vector = __m512i,
    load = _mm512_stream_load_si512,
    store = _mm512_storeu_si512,
    width = 64,
    stride = 128,
    main = [
        "vmovntdqa zmm0, zmmword ptr [{s} + {i} + 0]",
        "vmovntdqa zmm1, zmmword ptr [{s} + {i} + 64]";
        "vmovdqu64 zmmword ptr [{d} + {i} + 0], zmm0",
        "vmovdqu64 zmmword ptr [{d} + {i} + 64], zmm1",
    ],
    regs = ["zmm0", "zmm1"],
}

avx2_load_kernel! {
    /// [`load_avx2`], but a host side that is not 32-aligned goes to [`load_lines_realigned`]:
    /// the line kernel selected where the CPU has AVX-512 VBMI. With an aligned host side it is
    /// exactly `load_avx2` (one test more per call).
    ///
    /// # Safety
    /// Module contract with width 64 (`src` is the device side; the realigning path needs whole
    /// lines); the CPU has AVX2, AVX-512F/BW and AVX-512 VBMI.
    load_avx2_realign,
    fenced = load_avx2_realign_fenced,
    host_unaligned = load_lines_realigned,
    feature = "avx2,avx512f,avx512bw,avx512vbmi"
}

/// Byte `i` is `i`: the 64 entries from `k` (`k < 64`) are the byte indices that move byte
/// `k + i` of a pair of lines to byte `i` (VPERMT2B reads the low 7 bits of an index), and,
/// since VPERMB reads only the low 6, that rotate a single line down by `k` bytes (byte `i` of
/// the result is byte `(i + k) % 64`).
static SHIFTS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

/// Whole lines from a 64-aligned device address to a host address that is not 32-aligned, with
/// every host store aligned: each device line is read once with one 64-byte streaming load
/// (VMOVNTDQA zmm: one read per line, as the write-combining rules want) and rotated once
/// (VPERMB) so that its bytes for the next 64-aligned host line come first; each aligned host
/// line is then the end of one rotated line blended with the start of the next (VPBLENDMB) and
/// stored with one aligned 64-byte store, the partial host lines at both ends with one masked
/// store each.
///
/// Why: the plain kernels store each vector at its device offset's host address, so with a host
/// side that is not 32-aligned every other 32-byte store splits a cache line, which made such
/// loads several times slower than aligned ones. One two-source byte shuffle per line
/// (VPERMT2B) was tried first: it costs three micro-operations on Ice Lake and later cores and
/// measured no faster than the split stores; a rotation and a blend are one each
/// (docs/decisions/0006-vbmi-loads.md). Why zmm here when the selection otherwise avoids it: byte rotation of a
/// whole line needs AVX-512 VBMI, which only CPUs without the 512-bit frequency licence penalty
/// of Skylake-SP/Cascade Lake have (Ice Lake and later, AMD Zen 4 and later), and a 256-bit
/// version would need two shuffles per 32 bytes (in-lane byte shifts plus a lane crossing).
///
/// # Safety
/// `src` is 64-aligned, `n` a multiple of 64 (0 does nothing), `dst` writable for `n` bytes and
/// not 64-aligned, no overlap; the CPU has AVX-512F/BW and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline(never)]
unsafe extern "C" fn load_lines_realigned<const FENCE: bool>(
    dst: *mut u8,
    src: *const u8,
    n: usize,
) -> core::ffi::c_int {
    debug_assert!(src.addr().is_multiple_of(64) && n.is_multiple_of(64));
    debug_assert!(!dst.addr().is_multiple_of(64));
    if n != 0 {
        // SAFETY: forwarded, with `n != 0`.
        unsafe { realign_lines(dst, src, n, 0) };
    }
    end_of::<FENCE>()
}

/// The end of a copy function that has a fenced twin: the store fence for the twin (`FENCE`),
/// then 0, opaque, so that a call the twin ends with stays a jump.
#[inline(always)]
fn end_of<const FENCE: bool>() -> core::ffi::c_int {
    if FENCE {
        super::kernel::store_fence();
    }
    super::kernel::opaque_zero()
}

/// The copying part of [`load_lines_realigned`] (a non-empty copy), and of [`load_large_vbmi`]'s
/// middle, which hands it the range's partial last line too: `after` (0-63) more bytes from the
/// device line at `src + n`, read whole, rotated and blended like the others, whose host bytes
/// are stored with masked stores at the aligned host lines they fall in, so no store of the tail
/// splits a line or a page.
///
/// # Safety
/// As [`load_lines_realigned`], and `n != 0`; with `after != 0` also `src + n` readable for
/// `after` bytes (inside the mapping) and `dst` writable for `n + after`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn realign_lines(dst: *mut u8, src: *const u8, n: usize, after: usize) {
    // Device byte `k` of each line is the first byte of a 64-aligned host line: `k` bytes of a
    // line go to the host line before, `64 - k` to the next.
    let k = 64 - (dst.addr() & 63);
    // Bytes of a blended host line that come from the next device line: the last `k`.
    let from_next: __mmask64 = !0 << (64 - k);
    // The 64-aligned host line holding the copy's first byte starts `64 - k` bytes before `dst`;
    // host line `i / 64` of the copy starts at `dst + i - (64 - k)`.
    let back = 64 - k;
    // SAFETY: every device read is one 64-aligned line inside [src, src + n). Host writes: the
    // first masked store writes [dst, dst + k) (a masked store touches only its selected bytes;
    // the line it names starts before `dst`, hence the wrapping pointer, but lies in the page
    // holding `dst`), the aligned stores the lines at dst + i - back for i in [64, n), and the
    // last masked store [dst + n - back, dst + n); with a tail, the device line at `src + n`
    // (the caller's), and host bytes [dst + n - back, dst + n + after) with one masked store, or
    // an aligned store and a masked one: all inside the range. The table read takes 64 bytes from
    // index k < 64 of 128. The CPU features are the caller's.
    unsafe {
        let rotate = _mm512_loadu_si512(SHIFTS.as_ptr().add(k).cast());
        let mut prev = _mm512_permutexvar_epi8(rotate, _mm512_stream_load_si512(src.cast()));
        _mm512_mask_storeu_epi8(dst.wrapping_sub(back).cast(), from_next, prev);
        let line = |i: usize| _mm512_permutexvar_epi8(rotate, _mm512_stream_load_si512(src.add(i).cast()));
        let mut i = 64;
        // Two lines per round: the loads of both back to back, and no register copy between
        // rounds but one (the previous line's rotation).
        while i + 128 <= n {
            let (a, b) = (line(i), line(i + 64));
            _mm512_store_si512(dst.add(i - back).cast(), _mm512_mask_blend_epi8(from_next, prev, a));
            _mm512_store_si512(dst.add(i + 64 - back).cast(), _mm512_mask_blend_epi8(from_next, a, b));
            prev = b;
            i += 128;
        }
        if i < n {
            let a = line(i);
            _mm512_store_si512(dst.add(i - back).cast(), _mm512_mask_blend_epi8(from_next, prev, a));
            prev = a;
        }
        // The host line at `dst + n - back`: its first `back` bytes are the last line's; the
        // tail's `after` bytes follow them, and past 64 go on into the next host line.
        let last = dst.add(n - back);
        if after == 0 {
            _mm512_mask_storeu_epi8(last.cast(), !from_next, prev);
        } else {
            let tail = line(n);
            let end = back + after;
            if end <= 64 {
                let mask: __mmask64 = u64::MAX >> (64 - end);
                _mm512_mask_storeu_epi8(last.cast(), mask, _mm512_mask_blend_epi8(from_next, prev, tail));
            } else {
                _mm512_store_si512(last.cast(), _mm512_mask_blend_epi8(from_next, prev, tail));
                let mask: __mmask64 = u64::MAX >> (128 - end);
                _mm512_mask_storeu_epi8(last.add(64).cast(), mask, tail);
            }
        }
    }
}

/// A load of at least [`super::kernel::SHORT_MAX`] bytes where the CPU has AVX-512 VBMI: each
/// partial line at the ends is one 64-byte streaming load of its line, one rotation that puts the
/// wanted bytes where they go, and one 64-byte host store; then the whole lines between them go
/// to the line kernel: its realigning loop inlined here where their host side is not 32-aligned
/// (saving the two jumps through `load_avx2_realign` and its test), otherwise the AVX2 kernel.
/// The realigning loop also takes the tail's partial line as one more step whose host stores are
/// at aligned lines: the tail's own unaligned store, where the host range ends just past a page
/// boundary, would split the two pages, which is costly (docs/decisions/0006-vbmi-loads.md). `FENCE`:
/// the fenced twin's end (SFENCE, 0), for the public fast path; otherwise returns 0 without
/// fencing, for the dispatcher.
///
/// The two end stores are whole vectors inside [host, host + n): the head's at `host`, the
/// tail's ending at `host + n`. Their bytes beyond the partial line are the rest of that device
/// line, not yet the right ones, and the middle's stores, which come after and cover them (the
/// middle is at least one line, since n >= 128), overwrite them. Masked stores would write only
/// the partial lines, but a masked store that crosses a page boundary costs a microcode assist
/// (docs/decisions/0006-vbmi-loads.md).
///
/// Why: the portable ends read 16-byte chunks and hand the bytes of the partial ones through
/// general registers, about 30-60 instructions for the two ends of a misaligned load, which made
/// misaligned loads much slower than aligned ones; here they are about ten, and each partial
/// line is one device read (a line is what a streaming load fetches anyway;
/// docs/decisions/0006-vbmi-loads.md).
///
/// # Safety
/// As `wc::load_ends_then`: `dev` readable and `host` writable for `n >= 128` bytes, no
/// overlap, `dev` inside a mapping made of whole pages; the CPU has AVX2, AVX-512F/BW and VBMI.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
#[inline(never)]
pub(crate) unsafe extern "C" fn load_large_vbmi<const FENCE: bool>(
    host: *mut u8,
    dev: *const u8,
    n: usize,
) -> core::ffi::c_int {
    debug_assert!(n >= 128);
    let skip = dev.addr() & 63;
    let before = (64 - skip) & 63;
    let after = (dev.addr() + n) & 63;
    // SAFETY: the device reads are the 64-aligned lines holding the first and the last byte of
    // the range (same pages, inside the mapping), the latter read by the realigning middle when
    // it takes the tail; the end stores (the tail's only where the middle does not take it)
    // write [host, host + 64) and [host + n - 64, host + n), inside the range as n >= 128, and
    // the middle's stores cover their bytes past the partial lines ([before, 64) and
    // [n - 64, n - after) lie in [before, n - after), which is at least 64 bytes long); the table
    // reads take 64 bytes from an index below 64 of 128. The middle has the line kernel's
    // contract: 64-aligned device side, whole lines.
    unsafe {
        if before != 0 {
            let line = _mm512_stream_load_si512(dev.sub(skip).cast());
            // Byte i is line byte i + skip: the head's bytes first.
            let rotate = _mm512_loadu_si512(SHIFTS.as_ptr().add(skip).cast());
            _mm512_storeu_si512(host.cast(), _mm512_permutexvar_epi8(rotate, line));
        }
        let (h, d, len) = (host.add(before), dev.add(before), n - before - after);
        if h.addr() & 31 != 0 {
            // The line kernel's realigning path (`len` is at least one line), here rather than
            // two jumps away, with the tail's partial line as its last step.
            realign_lines(h, d, len, after);
            return end_of::<FENCE>();
        }
        if after != 0 {
            let line = _mm512_stream_load_si512(dev.add(n - after).cast());
            // Byte 64 - after + j is line byte j: the tail's bytes last.
            let rotate = _mm512_loadu_si512(SHIFTS.as_ptr().add(after).cast());
            _mm512_storeu_si512(host.add(n - 64).cast(), _mm512_permutexvar_epi8(rotate, line));
        }
        if FENCE {
            load_avx2_realign_fenced(h, d, len)
        } else {
            load_avx2_realign(h, d, len);
            end_of::<false>()
        }
    }
}

/// [`load_large_vbmi`] (fenced) with the public copy call's own arguments, `(handle, host, dev,
/// n)`, the handle unused: what the fast path's partial-line loads from `select::SPAN_MAX` bytes
/// jump to once it is selected (`fastcopy`). A jump there with the arguments moved.
///
/// # Safety
/// As [`load_large_vbmi`].
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
#[inline(never)]
pub(crate) unsafe extern "C" fn load_large_vbmi_from_export(
    _handle: usize,
    host: usize,
    dev: usize,
    n: usize,
) -> core::ffi::c_int {
    // SAFETY: forwarded.
    unsafe { load_large_vbmi::<true>(host as *mut u8, dev as *const u8, n) }
}

/// A load of any length from any device address where the CPU has AVX-512 VBMI, output first:
/// each 64 bytes of the host side are one two-line byte shuffle (VPERMT2B) of the device lines
/// they come from, each device line is read once with one 64-byte streaming load (one read per
/// line, as the write-combining rules want), and the last 1-64 bytes are one masked store.
/// `FENCE` as [`load_large_vbmi`].
///
/// Why: below two lines a misaligned load was a string of 16-byte chunks, each handed to the host
/// through general registers (up to 30 instructions for the ends alone); here a load of up to 64
/// bytes is one or two device reads, one shuffle and one store, with no saved register and no
/// stack frame. From a few lines up the realigning kernels win (aligned host stores, one-micro-op
/// shuffles: this one is three), so [`WholeLoads::span`](super::select::WholeLoads) is used
/// below [`super::kernel::SPAN_MAX`] only.
///
/// A range inside one aligned 16-byte or 32-byte chunk (most loads below 16 bytes) is read with
/// one xmm or ymm streaming load and shuffled with VPSHUFB or VPERMB ymm instead: the public copy
/// call ends in a fence, so such loads are latency-bound, and the narrower load and the one-cycle
/// shuffle bring small misaligned loads closer to an aligned one
/// (docs/decisions/0006-vbmi-loads.md).
///
/// A masked store whose 64 bytes cross a page boundary takes a microcode assist, an order of
/// magnitude slower than one that does not, so where the last store's vector would cross one, its
/// bytes are rotated once more and stored as two masked stores at the 64-aligned lines on either
/// side of the boundary.
///
/// # Safety
/// `dev` readable and `host` writable for `n >= 1` bytes, no overlap, `dev` inside a mapping made
/// of whole pages; the CPU has AVX-512F/BW/VL, VBMI and BMI2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,bmi2")]
#[inline(never)]
pub(crate) unsafe extern "C" fn load_span_vbmi<const FENCE: bool>(
    host: *mut u8,
    dev: *const u8,
    n: usize,
) -> core::ffi::c_int {
    // SAFETY: forwarded.
    unsafe { span(host, dev, n) };
    end_of::<FENCE>()
}

/// [`load_span_vbmi`] (fenced) with the public copy call's own arguments, `(handle, host, dev,
/// n)`, the handle unused: what the fast path's small loads jump to once the span load is
/// selected (`fastcopy`), with no register to move on the way.
///
/// # Safety
/// As [`load_span_vbmi`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,bmi2")]
#[inline(never)]
pub(crate) unsafe extern "C" fn load_span_vbmi_from_export(
    _handle: usize,
    host: usize,
    dev: usize,
    n: usize,
) -> core::ffi::c_int {
    // SAFETY: forwarded.
    unsafe { span(host as *mut u8, dev as *const u8, n) };
    end_of::<true>()
}

/// A load of 1-15 bytes inside one aligned 16-byte chunk, where the CPU has SSE4.1 (and with it
/// SSSE3) but no span load: one streaming read of the chunk, its bytes moved down with one byte
/// shuffle (PSHUFB, by the same table as the span load's), then the low bytes through a general
/// register, or for 9-15 bytes two 8-byte host stores (a second shuffle for the last 8). Does not
/// fence. Inline assembly rather than intrinsics so that its callers need no `target_feature`
/// (which would keep the compiler from inlining their other paths into them).
///
/// Why: without it such a load across an 8-byte word went through the chunk path's general form
/// (both 16-byte reads' cases, a 128-bit shift through general registers, a saved register),
/// which made misaligned 2-8-byte public loads more than twice as slow as an aligned one on CPUs
/// without AVX-512 (docs/decisions/0006-vbmi-loads.md).
///
/// # Safety
/// `dev` readable and `host` writable for `n` bytes, `1 <= n < 16`, `dev % 16 + n <= 16`, no
/// overlap, `dev` inside a mapping made of whole pages; the CPU has SSE4.1 and SSSE3.
#[inline(always)]
pub(crate) unsafe fn load_in_chunk_sse41(host: *mut u8, dev: *const u8, n: usize) {
    let skip = dev.addr() & 15;
    debug_assert!(n >= 1 && skip + n <= 16);
    // SAFETY: one aligned 16-byte read of the chunk holding the range (same page, inside the
    // mapping); host writes inside [host, host + n) (8 bytes at 0 and at n - 8 when n > 8, else
    // `write_low_bytes`'s). The table reads take 16 bytes from an index below 16 of 128; PSHUFB
    // uses each index's low four bits, so the first `16 - skip` bytes of the result are the
    // chunk's bytes from `skip` (the rest, unused, wrap around); the table is read with MOVDQU
    // (a legacy-SSE memory operand of PSHUFB must be 16-aligned, and these indices are not).
    // MOVNTDQA is SSE4.1 and PSHUFB SSSE3, which the caller vouches for.
    unsafe {
        let index = SHIFTS.as_ptr().add(skip);
        let low: u64;
        if n <= 8 {
            asm!(
                "movntdqa {x}, xmmword ptr [{src}]",
                "movdqu {i}, xmmword ptr [{index}]",
                "pshufb {x}, {i}",
                "movq {low}, {x}",
                src = in(reg) dev.sub(skip), index = in(reg) index, low = out(reg) low,
                x = out(xmm_reg) _, i = out(xmm_reg) _,
                options(nostack, preserves_flags, readonly),
            );
            super::kernel::write_low_bytes(host, low, n);
        } else {
            let high: u64;
            asm!(
                "movntdqa {x}, xmmword ptr [{src}]",
                "movdqa {y}, {x}",
                "movdqu {i}, xmmword ptr [{index}]",
                "pshufb {x}, {i}",
                "movdqu {i}, xmmword ptr [{index} + {last}]",
                "pshufb {y}, {i}",
                "movq {low}, {x}",
                "movq {high}, {y}",
                src = in(reg) dev.sub(skip), index = in(reg) index, last = in(reg) n - 8,
                low = out(reg) low, high = out(reg) high,
                x = out(xmm_reg) _, y = out(xmm_reg) _, i = out(xmm_reg) _,
                options(nostack, preserves_flags, readonly),
            );
            host.cast::<u64>().write_unaligned(low);
            host.add(n - 8).cast::<u64>().write_unaligned(high);
        }
    }
}

/// The copy of [`load_span_vbmi`].
///
/// # Safety
/// As [`load_span_vbmi`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,bmi2")]
#[inline]
unsafe fn span(host: *mut u8, dev: *const u8, n: usize) {
    debug_assert!(n >= 1);
    let skip16 = dev.addr() & 15;
    if skip16 + n <= 16 && host.addr() & 4095 <= 4096 - 16 {
        // SAFETY: one aligned 16-byte device read holding the range (same page, inside the
        // mapping); one masked 16-byte host store of [host, host + n), whose 16 bytes lie in
        // one page (tested). The table read takes 16 bytes from an index below 16 of 128.
        unsafe {
            // VEX-encoded (the intrinsic is the legacy SSE form, which after VEX code with dirty
            // upper halves costs a state transition on some cores).
            let chunk: __m128i;
            asm!(
                "vmovntdqa {x}, xmmword ptr [{src}]",
                src = in(reg) dev.sub(skip16), x = out(xmm_reg) chunk,
                options(nostack, preserves_flags, readonly),
            );
            let v = _mm_shuffle_epi8(chunk, _mm_loadu_si128(SHIFTS.as_ptr().add(skip16).cast()));
            _mm_mask_storeu_epi8(host.cast(), _bzhi_u32(u32::MAX, n as u32) as __mmask16, v);
        }
        return;
    }
    let skip32 = dev.addr() & 31;
    if skip32 + n <= 32 && host.addr() & 4095 <= 4096 - 32 {
        // SAFETY: as above, with one aligned 32-byte read and a 32-byte vector; the table read
        // takes 32 bytes from an index below 32 of 128.
        unsafe {
            let chunk: __m256i;
            asm!(
                "vmovntdqa {x}, ymmword ptr [{src}]",
                src = in(reg) dev.sub(skip32), x = out(ymm_reg) chunk,
                options(nostack, preserves_flags, readonly),
            );
            let v = _mm256_permutexvar_epi8(_mm256_loadu_si256(SHIFTS.as_ptr().add(skip32).cast()), chunk);
            _mm256_mask_storeu_epi8(host.cast(), _bzhi_u32(u32::MAX, n as u32), v);
        }
        return;
    }
    let skip = dev.addr() & 63;
    // SAFETY: every device read is a 64-aligned line holding a byte of [dev, dev + n) (the first
    // holds `dev`; a next one is read only while bytes of the range remain past the current line:
    // `left > 64`, or `skip + left > 64`), so it lies in the same page, inside the mapping. Host
    // writes: whole 64-byte stores while more than 64 bytes remain, then `left` bytes, all inside
    // [host, host + n) (the page-crossing case: the bytes before the boundary and the bytes from
    // it). The table reads take 64 bytes from an index below 64 of 128.
    unsafe {
        let shift = _mm512_loadu_si512(SHIFTS.as_ptr().add(skip).cast());
        let mut line = dev.sub(skip);
        let mut out = host;
        let mut left = n;
        let mut a = _mm512_stream_load_si512(line.cast());
        while left > 64 {
            let b = _mm512_stream_load_si512(line.add(64).cast());
            _mm512_storeu_si512(out.cast(), _mm512_permutex2var_epi8(a, shift, b));
            a = b;
            line = line.add(64);
            out = out.add(64);
            left -= 64;
        }
        let last = if skip + left > 64 {
            _mm512_permutex2var_epi8(a, shift, _mm512_stream_load_si512(line.add(64).cast()))
        } else {
            _mm512_permutexvar_epi8(shift, a)
        };
        let mask: __mmask64 = _bzhi_u64(u64::MAX, left as u32);
        let to_page_end = 4096 - (out.addr() & 4095);
        if to_page_end >= 64 {
            _mm512_mask_storeu_epi8(out.cast(), mask, last);
        } else {
            std::hint::cold_path();
            // Byte j of `turned` is byte j + to_page_end (mod 64) of `last`: stored at the line
            // ending at the boundary, its last `to_page_end` bytes are the ones before it; stored
            // at the line starting there, its first ones are the rest.
            let turned = _mm512_permutexvar_epi8(_mm512_loadu_si512(SHIFTS.as_ptr().add(to_page_end).cast()), last);
            let boundary = out.add(to_page_end);
            _mm512_mask_storeu_epi8(boundary.wrapping_sub(64).cast(), mask << (64 - to_page_end), turned);
            // Only where bytes remain past the boundary: the next page need not be mapped.
            if left > to_page_end {
                _mm512_mask_storeu_epi8(boundary.cast(), mask >> to_page_end, turned);
            }
        }
    }
}
