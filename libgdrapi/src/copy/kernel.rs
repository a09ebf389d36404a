//! The floor of the copy engines: the types every kernel, the selection and the dispatchers
//! share (the kernel and engine types, the mapping kinds), the fences, the size limits at which
//! the dispatchers change engines, and the byte helpers of the kernels. It imports nothing of
//! `copy/`, so a kernel that needs a shared fact imports only this module, never its dispatcher.

/// How the device side of a copy is mapped (values match `gdr_mapping_type_t` 1..=3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingKind {
    /// `GDR_MAPPING_TYPE_WC` (1): write-combined BAR mapping.
    WriteCombined,
    /// `GDR_MAPPING_TYPE_CACHING` (2): cache-coherent mapping (e.g. Grace Hopper).
    Cached,
    /// `GDR_MAPPING_TYPE_DEVICE` (3): arm64 Device memory.
    Device,
}

impl MappingKind {
    /// From the C enum value; `None` for `GDR_MAPPING_TYPE_NONE` (0) and out-of-range values.
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::WriteCombined),
            2 => Some(Self::Cached),
            3 => Some(Self::Device),
            _ => None,
        }
    }

    /// The C enum value.
    pub fn as_raw(self) -> u32 {
        match self {
            Self::WriteCombined => 1,
            Self::Cached => 2,
            Self::Device => 3,
        }
    }
}

/// Direction of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Host -> device (stores to the mapping). The engine's `dst` is the device side.
    ToDevice,
    /// Device -> host (loads from the mapping). The engine's `src` is the device side.
    FromDevice,
}

/// The way of a [`WcRange`]: host -> device.
#[derive(Clone, Copy)]
pub(crate) enum Store {}
/// The way of a [`WcRange`]: device -> host.
#[derive(Clone, Copy)]
pub(crate) enum Load {}

/// A write-combined copy range whose contract was established once, where the copy entered the
/// engines: `dst` is valid for `n` bytes of writes and `src` for `n` bytes of reads, the two do
/// not overlap, and the device side (`dst` of a [`Store`], `src` of a [`Load`]) lies in a mapping
/// made of whole pages (every BAR mapping is), so an aligned chunk holding one of its bytes is
/// readable. Any alignment. The helpers that take one state only what they need beyond it (a
/// size class), and their callers' SAFETY lines say where that came from instead of forwarding the
/// range's contract from function to function.
pub(crate) struct WcRange<W> {
    dst: *mut u8,
    src: *const u8,
    n: usize,
    way: core::marker::PhantomData<W>,
}

impl<W> Clone for WcRange<W> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for WcRange<W> {}

impl<W> WcRange<W> {
    /// The range `[dst, dst + n)` <- `[src, src + n)`.
    ///
    /// # Safety
    /// The contract in the type's documentation.
    #[inline(always)]
    pub(crate) unsafe fn new(dst: *mut u8, src: *const u8, n: usize) -> Self {
        Self { dst, src, n, way: core::marker::PhantomData }
    }

    /// The destination, the source and the length, for a kernel call.
    #[inline(always)]
    pub(crate) fn parts(self) -> (*mut u8, *const u8, usize) {
        (self.dst, self.src, self.n)
    }

    /// The length in bytes.
    #[inline(always)]
    pub(crate) fn len(self) -> usize {
        self.n
    }
}

impl WcRange<Load> {
    /// The device address (the source).
    #[inline(always)]
    pub(crate) fn dev(self) -> usize {
        self.src.addr()
    }
}

/// Defines `fn $name(r: WcRange<W>, extra...)` whose body runs out of line with the range in
/// three registers, as a function of raw pointers would get it (a [`WcRange`] passed by value to
/// a function that is not inlined would go through memory: Rust passes aggregates of more than
/// two words indirectly). The function is an inlined wrapper that hands `r`'s parts to the
/// `out_of_line` function inside it, which rebuilds `r` for the body: the range's contract is
/// justified here, once, not at each wrapper.
macro_rules! wc_out_of_line {
    ($(#[$m:meta])* $v:vis fn $name:ident($r:ident: WcRange<$w:ty> $(, $x:ident: $xt:ty)*) $body:block) => {
        $crate::copy::kernel::wc_out_of_line!(@ [] $(#[$m])* $v fn $name($r: WcRange<$w> $(, $x: $xt)*) $body);
    };
    ($(#[$m:meta])* $v:vis unsafe fn $name:ident($r:ident: WcRange<$w:ty> $(, $x:ident: $xt:ty)*) $body:block) => {
        $crate::copy::kernel::wc_out_of_line!(@ [unsafe] $(#[$m])* $v fn $name($r: WcRange<$w> $(, $x: $xt)*) $body);
    };
    (@ [$($q:tt)?]
        $(#[$m:meta])* $v:vis fn $name:ident($r:ident: WcRange<$w:ty> $(, $x:ident: $xt:ty)*) $body:block
    ) => {
        $(#[$m])*
        #[inline(always)]
        $v $($q)? fn $name($r: WcRange<$w> $(, $x: $xt)*) {
            /// The body of the function around it, out of line.
            ///
            /// # Safety
            /// `[dst, dst + n)` <- `[src, src + n)` is a [`WcRange`], and the contract of the
            /// function around it.
            #[inline(never)]
            unsafe fn out_of_line(dst: *mut u8, src: *const u8, n: usize $(, $x: $xt)*) {
                // SAFETY: this function's contract.
                let $r = unsafe { WcRange::<$w>::new(dst, src, n) };
                $body
            }

            let (dst, src, n) = $r.parts();
            // SAFETY: `r`'s parts, which `out_of_line` takes as a range; the rest of its contract,
            // if any, is this function's.
            unsafe { out_of_line(dst, src, n $(, $x)*) }
        }
    };
}
pub(crate) use wc_out_of_line;

/// A copy kernel: `f(dst, src, len)`.
pub type KernelFn = unsafe fn(*mut u8, *const u8, usize);

/// A copy function `f(dst, src, len)` returning 0 that the fast path can jump to: a line kernel's
/// fenced twin (`select::Selection::load_line_fenced`), or one form, fenced or not, of a whole load
/// (`select::WholeLoad`).
pub(crate) type FencedFn = unsafe extern "C" fn(*mut u8, *const u8, usize) -> core::ffi::c_int;

/// One copy kernel usable on this CPU.
///
/// Contract of `f(dst, src, len)`: the device-side pointer (`dst` for [`Direction::ToDevice`],
/// `src` for [`Direction::FromDevice`]) is aligned to `width`, `len` is a multiple of `width`
/// (0 allowed), `dst` is valid for `len` bytes of writes and `src` for `len` bytes of reads, and
/// the ranges do not overlap. The host side may be unaligned. Kernels do not fence.
#[derive(Clone, Copy, Debug)]
pub struct Engine {
    /// Instruction-level name, e.g. "AVX VMOVNTDQ".
    pub name: &'static str,
    /// Which way it copies.
    pub dir: Direction,
    /// Alignment and granularity of the device side, in bytes.
    pub width: usize,
    /// The kernel.
    pub f: KernelFn,
    /// Whether the dispatcher uses it for write-combined copies.
    pub selected: bool,
}

/// A fenced load with the public copy call's arguments, `(handle, host, dev, n)` (the handle
/// unused), returning 0: what the fast path jumps to with nothing to move.
pub(crate) type ExportFn = unsafe extern "C" fn(usize, usize, usize, usize) -> core::ffi::c_int;

/// Copies from 16 bytes up to this size (exclusive) are "short": done inline, 16 bytes at a time
/// between the ends, with no kernel call. Below two lines a call (and the registers it makes the
/// caller save) costs more than the SIMD width saves; every 16-byte piece is still a
/// non-temporal store (stores) or a streaming load (loads), so the write-combining rules hold.
pub(crate) const SHORT_MAX: usize = 128;

/// Loads shorter than this go to the span load (`select::WholeLoads::span`) where it exists
/// (unless they are one aligned access or lie in one 8-byte word). From here up the line kernels'
/// aligned host stores and one-micro-op shuffles beat its two-line shuffles
/// (docs/decisions/0006-vbmi-loads.md).
pub(crate) const SPAN_MAX: usize = 512;

/// Whether an `n`-byte copy at device address `dev` is whole 64-byte lines at a 64-aligned
/// address (`n > 0` assumed): the bulk case, which the line kernel does alone.
#[inline(always)]
pub(crate) fn is_whole_lines(dev: usize, n: usize) -> bool {
    (dev | n) & 63 == 0
}

/// 0, in a way the optimiser cannot see through: a constant return would be propagated into the
/// callers, which would then call the functions returning it instead of jumping to them (the
/// fast path's helpers, the realigning line load). One instruction where
/// inline assembly is available (`black_box` costs a stack round trip).
#[inline(always)]
pub(crate) fn opaque_zero() -> core::ffi::c_int {
    #[cfg(target_arch = "x86_64")]
    {
        let r: core::ffi::c_int;
        // SAFETY: zeroes one register; touches no memory, stack or flags the compiler relies on
        // (xor's flags are declared clobbered by not passing `preserves_flags`).
        unsafe { std::arch::asm!("xor {r:e}, {r:e}", r = out(reg) r, options(nomem, nostack)) };
        r
    }
    #[cfg(target_arch = "aarch64")]
    {
        let r: core::ffi::c_int;
        // SAFETY: moves the zero register into one register; nothing else.
        unsafe { std::arch::asm!("mov {r:w}, wzr", r = out(reg) r, options(nomem, nostack, preserves_flags)) };
        r
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        std::hint::black_box(0)
    }
}

/// Store barrier the caller issues after a copy to a WC mapping: x86 SFENCE (orders the weakly
/// ordered non-temporal and MOVDIR64B stores before later stores), arm64 DMB ST.
#[inline(always)]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE is baseline SSE on x86-64, touches no memory operand and no flags; without
    // `nomem` the asm block is also a compiler barrier, which is what a fence must be.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction with no operands; no `nomem`, so also a compiler barrier.
    unsafe {
        core::arch::asm!("dmb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Full barrier the caller issues when mappings of several types coexist (spec §4.5): x86
/// MFENCE, arm64 DMB SY.
#[inline(always)]
pub fn full_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: MFENCE is baseline SSE2 on x86-64 and has no operands; compiler barrier as above.
    unsafe {
        core::arch::asm!("mfence", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        core::arch::asm!("dmb sy", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Writes the low `n` (1..=8) bytes of `v` (byte 0 = the least significant) to `host`, with at
/// most two possibly overlapping stores.
///
/// # Safety
/// `host` is writable for `n` bytes, `1 <= n <= 8`.
#[inline(always)]
pub(crate) unsafe fn write_low_bytes(host: *mut u8, v: u64, n: usize) {
    // SAFETY: each pair covers [0, w) and [n - w, n) with w <= n.
    unsafe {
        if n == 8 {
            host.cast::<u64>().write_unaligned(v.to_le());
        } else if n >= 4 {
            host.cast::<u32>().write_unaligned((v as u32).to_le());
            host.add(n - 4).cast::<u32>().write_unaligned(((v >> (8 * (n - 4))) as u32).to_le());
        } else if n >= 2 {
            host.cast::<u16>().write_unaligned((v as u16).to_le());
            host.add(n - 2).cast::<u16>().write_unaligned(((v >> (8 * (n - 2))) as u16).to_le());
        } else {
            host.write(v as u8);
        }
    }
}

/// Copies `n` (1..=16) bytes between ordinary, non-overlapping buffers with two possibly
/// overlapping moves of the widest size that fits.
///
/// # Safety
/// `dst` writable and `src` readable for `n` bytes, `1 <= n <= 16`, no overlap.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn small_copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: each pair covers [0, w) and [n - w, n) with w <= n.
    unsafe {
        if n >= 8 {
            let (a, b) = (src.cast::<u64>().read_unaligned(), src.add(n - 8).cast::<u64>().read_unaligned());
            dst.cast::<u64>().write_unaligned(a);
            dst.add(n - 8).cast::<u64>().write_unaligned(b);
        } else if n >= 4 {
            let (a, b) = (src.cast::<u32>().read_unaligned(), src.add(n - 4).cast::<u32>().read_unaligned());
            dst.cast::<u32>().write_unaligned(a);
            dst.add(n - 4).cast::<u32>().write_unaligned(b);
        } else if n >= 2 {
            let (a, b) = (src.cast::<u16>().read_unaligned(), src.add(n - 2).cast::<u16>().read_unaligned());
            dst.cast::<u16>().write_unaligned(a);
            dst.add(n - 2).cast::<u16>().write_unaligned(b);
        } else {
            dst.write(src.read());
        }
    }
}
