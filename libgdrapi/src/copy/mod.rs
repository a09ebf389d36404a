//! Copy engines behind `gdr_copy_to_mapping` / `gdr_copy_from_mapping`.
//!
//! The device side of these copies is a GPU BAR mapped over PCIe, normally write-combined (WC):
//! uncached, with stores gathered in write-combining buffers and reads going to the device every
//! time. The rules this module follows for WC mappings, from the architecture manuals rather than
//! from cached-memory timings:
//! - every device load is naturally aligned; outside the SIMD kernels it is one volatile access
//!   of at most 8 bytes (`aligned.rs`) or an aligned vector holding the range. So is every store
//!   except on x86-64, where a store under 16 bytes (a short copy, or the head or tail of a
//!   longer one) is at most two plain stores of one width at any alignment, overlapping
//!   (`edges.rs` says why that is sound on write-combined memory);
//! - stores are non-temporal (MOVNTDQ, VMOVNTDQ; MOVDIR64B and zmm VMOVNTDQ are implemented and
//!   benchmarked, see `select.rs` for why they are not selected), and fill whole 64-byte lines
//!   back to back wherever the range allows, so a line leaves the core as one write and no line
//!   of the BAR is ever read for ownership;
//! - loads are streaming loads (MOVNTDQA, VMOVNTDQA), the loads of one line issued together;
//! - no kernel fences: the caller issues one [`store_fence`] or [`full_fence`] per call, chosen
//!   from the process's mapping-type counters (spec §4.5);
//! - the host side may have any alignment.
//!
//! `Cached` mappings are ordinary cacheable memory and use `memcpy`. `Device` mappings (arm64
//! Device-nGnRE, BlueField-3 hosts) get only naturally aligned volatile accesses of up to 8 bytes.
//! Upstream switches to `memcpy` for the 8-byte aligned bulk of a `Device` copy; `memcpy` may
//! use wider, pair or unaligned accesses, so we keep to single 8-byte accesses there.
//!
//! Engine choice is made once per process (`select.rs`, which also explains why AVX-512 is
//! selected only for loads on CPUs with VBMI: the realigning line load, the span load and the
//! whole-load function); the per-call split into head, line bulk and tail is the pure function
//! [`plan_wc`].

// The engine table (`engines`, `Engine::width`, the raw kind values) serves the benchmark (feature
// `bench-internals`) and the unit tests; the library itself only dispatches.
#![cfg_attr(not(feature = "bench-internals"), allow(dead_code))]

pub(crate) mod aligned;
#[cfg(target_arch = "aarch64")]
mod arm;
pub(crate) mod edges;
pub(crate) mod select;
#[cfg(test)]
mod tests;
pub(crate) mod wc;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

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

/// Detect CPU features once per process (cheap on later calls) and return a one-line
/// description of the selected engines for the debug log.
pub fn detect() -> &'static str {
    &select::get().summary
}

/// Enumerate the engines usable on this CPU, each callable directly (benchmarks and tests).
pub fn engines() -> Vec<Engine> {
    select::get().engines.clone()
}

/// Copy host -> mapped device memory, with the engines for `kind`. Does not fence.
///
/// # Safety
/// `dev_dst` is valid for `len` bytes of writes, `host_src` for `len` bytes of reads, and the
/// two ranges do not overlap. Any alignment is accepted.
#[inline(always)]
pub unsafe fn copy_to_mapping(kind: MappingKind, dev_dst: *mut u8, host_src: *const u8, len: usize) {
    match kind {
        // SAFETY: the caller's contract is exactly memcpy's.
        MappingKind::Cached => unsafe { core::ptr::copy_nonoverlapping(host_src, dev_dst, len) },
        // SAFETY: the caller's contract is the helper's (any alignment, valid, no overlap).
        MappingKind::Device => unsafe { aligned::to_device(dev_dst, host_src, len) },
        // SAFETY: forwarded caller contract.
        MappingKind::WriteCombined => unsafe { wc::store(dev_dst, host_src, len) },
    }
}

/// Copy mapped device memory -> host, with the engines for `kind`. Does not fence.
///
/// # Safety
/// `host_dst` is valid for `len` bytes of writes, `dev_src` for `len` bytes of reads, and the
/// two ranges do not overlap. Any alignment is accepted.
#[inline(always)]
pub unsafe fn copy_from_mapping(kind: MappingKind, host_dst: *mut u8, dev_src: *const u8, len: usize) {
    match kind {
        // SAFETY: the caller's contract is exactly memcpy's.
        MappingKind::Cached => unsafe { core::ptr::copy_nonoverlapping(dev_src, host_dst, len) },
        // SAFETY: the caller's contract is the helper's (any alignment, valid, no overlap).
        MappingKind::Device => unsafe { aligned::from_device(host_dst, dev_src, len) },
        // SAFETY: forwarded caller contract.
        MappingKind::WriteCombined => unsafe { wc::load(host_dst, dev_src, len) },
    }
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

/// Store barrier the caller issues after a copy to a WC mapping: x86 SFENCE, arm64 DMB ST.
#[inline(always)]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    x86::sfence();
    #[cfg(target_arch = "aarch64")]
    arm::dmb_st();
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Full barrier the caller issues when mappings of several types coexist: x86 MFENCE, arm64
/// DMB SY.
#[inline(always)]
pub fn full_fence() {
    #[cfg(target_arch = "x86_64")]
    x86::mfence();
    #[cfg(target_arch = "aarch64")]
    arm::dmb_sy();
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// What one segment of a write-combined copy is done with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// The aligned-access helper (fewer than 16 bytes).
    Aligned,
    /// The `w16` slot: exactly 16 bytes at a 16-aligned device address.
    W16,
    /// The `w32` slot: exactly 32 bytes at a 32-aligned device address.
    W32,
    /// The `line` slot: a non-zero multiple of 64 bytes at a 64-aligned device address.
    Lines,
}

/// Splits a write-combined copy of `len` bytes whose device side starts at `dev_addr` (spec
/// §4.5, steps 1-7) and calls `seg(op, offset, length)` for each piece, in address order: under
/// 16 bytes, all with the helper; otherwise a helper head up to 16-byte alignment, one 16-byte
/// and one 32-byte step up to 64-byte alignment, the whole lines, one 32-byte and one 16-byte
/// step, and a helper tail under 16 bytes. A visitor rather than a returned list keeps the
/// per-call cost to a few compares for small copies; the tests collect the pieces and check them.
#[inline(always)]
pub(crate) fn plan_wc(dev_addr: usize, len: usize, mut seg: impl FnMut(Op, usize, usize)) {
    if len == 0 {
        return;
    }
    if len < 16 {
        seg(Op::Aligned, 0, len);
        return;
    }
    let mut off = (16 - (dev_addr & 15)) & 15;
    if off != 0 {
        seg(Op::Aligned, 0, off);
    }
    let at = |off: usize| dev_addr.wrapping_add(off) & 63;
    if len - off >= 16 && at(off) & 31 == 16 {
        seg(Op::W16, off, 16);
        off += 16;
    }
    if len - off >= 32 && at(off) == 32 {
        seg(Op::W32, off, 32);
        off += 32;
    }
    let lines = (len - off) & !63;
    if lines != 0 {
        // 64-aligned here: every step above that could not run left fewer than 64 bytes.
        seg(Op::Lines, off, lines);
        off += lines;
    }
    if len - off >= 32 {
        seg(Op::W32, off, 32);
        off += 32;
    }
    if len - off >= 16 {
        seg(Op::W16, off, 16);
        off += 16;
    }
    if len > off {
        seg(Op::Aligned, off, len - off);
    }
}

/// Executes `plan_wc` with the slots of one direction. `dst`/`src` are in copy order; the device
/// side is `dst` for `ToDevice` and `src` for `FromDevice`.
///
/// # Safety
/// `dst` valid for `len` bytes of writes, `src` for `len` reads, no overlap; the slots satisfy
/// the [`Engine`] contract for the width their step uses (`select.rs` guarantees it).
#[inline(always)]
unsafe fn run_plan(slots: &select::Slots, helper: KernelFn, dir: Direction, dst: *mut u8, src: *const u8, len: usize) {
    let dev_addr = match dir {
        Direction::ToDevice => dst.addr(),
        Direction::FromDevice => src.addr(),
    };
    if (dev_addr | len) & 63 == 0 {
        // Whole lines only (the common bulk case): the plan would yield exactly this one piece.
        // SAFETY: the device side is 64-aligned and `len` a multiple of 64, the line slot's
        // contract; ranges as the caller promises.
        unsafe { (slots.line)(dst, src, len) };
        return;
    }
    plan_wc(dev_addr, len, |op, off, n| {
        let f = match op {
            Op::Aligned => helper,
            Op::W16 => slots.w16,
            Op::W32 => slots.w32,
            Op::Lines => slots.line,
        };
        // SAFETY: `plan_wc` yields disjoint pieces inside [0, len), so both pointers stay in
        // their ranges; W16/W32/Lines pieces start at device addresses aligned to 16/32/64 and
        // have lengths that are multiples of those, which every kernel placed in those slots
        // accepts (its width divides the slot's alignment); the helper takes any alignment.
        unsafe { f(dst.add(off), src.add(off), n) }
    });
}
