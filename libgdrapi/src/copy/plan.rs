//! The per-call plan of a write-combined copy: which engine class a copy of `n` bytes takes
//! ([`route`], shared by the dispatcher in `wc.rs` and the public fast path), and the split of a
//! copy into a head, 16/32-byte steps, whole lines and a tail ([`plan_wc`], [`run_plan`]).

use super::kernel::{Direction, KernelFn, SHORT_MAX, SPAN_MAX, is_whole_lines};
use super::select;

/// The engine class of a write-combined copy, by size and device address ([`route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Under 16 bytes (0 included: callers that take 0 test it first).
    Small,
    /// 16 bytes up to [`SHORT_MAX`]: inline 16-byte steps, no kernel call.
    Short,
    /// From [`SHORT_MAX`]: whole 64-byte lines at a 64-aligned device address, the line kernel
    /// alone.
    Lines,
    /// A load from [`SHORT_MAX`] up to [`SPAN_MAX`] that is not whole lines: the span load where
    /// the CPU has one.
    Span,
    /// Everything larger: the planned copy, or the whole-load function for loads.
    Large,
}

/// The one size ladder of write-combined copies: the dispatcher (`wc::store_body`,
/// `wc::load_body`) and the public fast path (`fastcopy::copy`) both match on it, so the two
/// cannot choose different engines for the same copy. Inlined: each caller's match compiles to
/// the same compares the ladder had in each of them.
#[inline(always)]
pub(crate) fn route(dir: Direction, dev: usize, n: usize) -> Route {
    if n < 16 {
        Route::Small
    } else if n < SHORT_MAX {
        Route::Short
    } else if is_whole_lines(dev, n) {
        Route::Lines
    } else if dir == Direction::FromDevice && n < SPAN_MAX {
        Route::Span
    } else {
        Route::Large
    }
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
/// the [`Engine`](super::kernel::Engine) contract for the width their step uses (`select.rs` guarantees it).
#[inline(always)]
pub(crate) unsafe fn run_plan(
    slots: &select::Slots,
    helper: KernelFn,
    dir: Direction,
    dst: *mut u8,
    src: *const u8,
    len: usize,
) {
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
