//! The fast path of `gdr_copy_to_mapping` / `gdr_copy_from_mapping`: a copy through a live
//! write-combined mapping, by a thread that has copied before, while the process needs no
//! special fences. Everything else (first copy of a thread, cached and device mappings, several
//! mapping types at once, fenced readers, size 0, every error) goes to the general path in
//! [`crate::capi`], which gives the same results plus the errno and log line of a refusal.
//!
//! Why a separate path: the copy call is the library's reason to exist and its cost over the raw
//! engine is what users see. This one is written to compile into a leaf: one compare of the
//! handle with the one this thread's words name ([`crate::handles::thread_words`]: a thread that copied
//! through the same handle last has it validated and announced already, so its copy needs no
//! handle check and no store); otherwise, out of line, the handle check (one rotate and compare)
//! and the announcement ([`crate::handles`]: one store, left in place after the copy, which
//! the handle-lifetime protocol makes safe); then the window
//! check against the handle's fast-path mirror (whose length is 0 unless everything above
//! holds, so it needs no test of its own), and either one naturally aligned access plus the
//! fence, a short store (16-127 bytes) inline, a jump through a load slot (`LoadSlot`: the span
//! or the whole-load function where the CPU has AVX-512 VBMI, set once from the engine selection),
//! or a jump to the out-of-line engines. No lock, no atomic read-modify-write, no
//! call; the 1-8-byte copies need no saved register (the short copy saves one, on its own path only:
//! tests/fast_path_shape.rs checks the 8-byte straight line in the built library); every way out
//! that is not the fast copy is a tail call with the caller's own arguments.
//!
//! The process-wide conditions that forbid the fast path are in [`crate::conditions`]: the
//! registry reads them when it sets the handles' mirrors (whose format it owns), so the fast
//! path never does.

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering, compiler_fence};

use crate::copy::kernel::{Load, Store, WcRange};
use crate::copy::{self, Route, SHORT_MAX, aligned, wc};
use crate::handles::registry::{FastWindow, Mirror, SLACK};
use crate::handles::thread_words;

/// The offset of `dev` in the window, if a copy of 1-8 bytes there lies inside the mapping.
#[inline(always)]
fn small_fits(w: FastWindow, dev: usize) -> Option<usize> {
    let off = dev.wrapping_sub(w.addr);
    (off < w.lim).then_some(off)
}

/// Whether a copy of `n` bytes at offset `off` (which [`small_fits`] returned) lies inside the
/// mapping; false for `n == 0`, no overflow for any `n` (`off < lim`, far below `usize::MAX`).
#[inline(always)]
fn rest_fits(w: FastWindow, off: usize, n: usize) -> bool {
    n.wrapping_sub(1) < w.lim + SLACK - off
}

/// Which way a copy goes, as a const parameter so each export gets its own straight-line code.
pub(crate) const TO_MAPPING: bool = true;
/// See [`TO_MAPPING`].
pub(crate) const FROM_MAPPING: bool = false;

/// The general path of one public copy, called with the export's own arguments (so reaching it is
/// a plain jump): `(handle, map_d_ptr, h_ptr, size)` to the mapping, `(handle, h_ptr, map_d_ptr,
/// size)` from it.
pub(crate) type General = unsafe extern "C" fn(usize, usize, usize, usize) -> c_int;

/// The fast path of one public copy, given the export's arguments in its own order (see
/// [`General`]); `general` is the general path for the same arguments.
///
/// # Safety
/// The C contract of `gdr_copy_*`: the host pointer is valid for `n` bytes in the copy's direction
/// and does not overlap the mapping; `h` and the device pointer need not be valid (they are
/// checked here).
#[inline(always)]
pub(crate) unsafe fn copy<const TO: bool>(h: usize, a: usize, b: usize, n: usize, general: General) -> c_int {
    let (dev, host) = if TO { (a, b) } else { (b, a) };
    let thread = thread_words::mine();
    // A thread copying through the handle it copied through last finds it named in its words:
    // valid (it was when stored, and slots are never returned) and announced in place, made
    // before this copy, so storing it again would change nothing a writer can see. Only 0 needs
    // excluding (the words' empty value). Everything else is checked against the handle region
    // and announced: a release store (this thread's earlier copies, whose announcement this
    // replaces, are over before a writer can see it gone).
    let mirror = if h == thread.named.get() && h != 0 {
        // SAFETY: `named` holds only handles `known_to` accepted.
        unsafe { Mirror::named(h) }
    } else if let Some(mirror) = Mirror::known_to(thread, h) {
        std::hint::cold_path();
        // SAFETY: `known_to` succeeds only while the thread has a line.
        unsafe { thread.word() }.store(h, Ordering::Release);
        thread.named.set(h);
        mirror
    } else {
        std::hint::cold_path();
        // SAFETY: forwarded contract.
        return unsafe { general(h, a, b, n) };
    };
    // Announced, now read the mirror (the order `grace` relies on; the writer's membarrier
    // orders the CPU, this fence the compiler).
    compiler_fence(Ordering::SeqCst);
    let w = mirror.fast_window();
    if let Some(off) = small_fits(w, dev)
        && host != 0
    {
        if n.wrapping_sub(1) < 8 {
            // SAFETY: 1-8 bytes at an offset `small_fits` accepted, inside a mapping that
            // stays ours while the line names the handle; the host side is the caller's.
            return unsafe { up_to_8::<TO>(h, a, b, dev, host, n) };
        }
        if rest_fits(w, off, n) {
            // The dispatcher's engine choice (`copy::route`, which `wc::load_body` and
            // `wc::store_body` match on too): below two lines the short copy even for one whole
            // line, which costs no call.
            let dir = if TO { copy::Direction::ToDevice } else { copy::Direction::FromDevice };
            // SAFETY: as above, for the whole range (and the size each helper takes).
            return unsafe {
                match copy::route(dir, dev, n) {
                    Route::Small => below_16::<TO>(h, a, b, n),
                    Route::Short => {
                        if TO {
                            short::<TO>(h, a, b, n)
                        } else {
                            SHORT_LOAD.jump(h, a, b, n)
                        }
                    }
                    Route::Lines => lines::<TO>(h, a, b, n),
                    Route::Span => SHORT_LOAD.jump(h, a, b, n),
                    Route::Large => {
                        if TO {
                            large::<TO>(h, a, b, n)
                        } else {
                            LONG_LOAD.jump(h, a, b, n)
                        }
                    }
                }
            };
        }
    }
    std::hint::cold_path();
    // SAFETY: forwarded contract.
    unsafe { general(h, a, b, n) }
}

/// A fast-path copy of 1-8 bytes: one naturally aligned access inline, or the small helper.
///
/// # Safety
/// `1 <= n <= 8` and `[dev, dev + n)` lies in a live write-combined mapping that this thread's
/// announcement keeps ours; the host side as in [`copy`]; `h`, `a`, `b` the export's arguments.
#[inline(always)]
unsafe fn up_to_8<const TO: bool>(h: usize, a: usize, b: usize, dev: usize, host: usize, n: usize) -> c_int {
    // One naturally aligned access of 1, 2, 4 or 8 bytes: one test of size and address together,
    // then one bit test per width. 8 bytes is the straight line (no taken jump, which costs more
    // than not-taken tests: docs/decisions/0001-fast-path-window.md), 1, 2 and 4 bytes one taken
    // jump each (a tree of two compares put 1 or 2 bytes two jumps away).
    // Written in this order because the compiler lays the first arms of such a chain out of the
    // way and the last `else` straight on.
    if aligned::is_single_access(dev, n) {
        // SAFETY: `n` is 1, 2, 4 or 8 (the width each branch picks by the bits it tests) and
        // `dev` a multiple of it; the rest is the caller's contract.
        return unsafe {
            if n & 1 != 0 {
                std::hint::cold_path();
                single::<TO, 1>(dev, host)
            } else if n & 2 != 0 {
                std::hint::cold_path();
                single::<TO, 2>(dev, host)
            } else if n & 4 == 0 {
                single::<TO, 8>(dev, host)
            } else {
                single::<TO, 4>(dev, host)
            }
        };
    }
    // Out of the straight line (the compiler would otherwise put the aligned copies behind a
    // taken jump): one taken jump here, as before the slot.
    std::hint::cold_path();
    // SAFETY: the caller's contract; `n < 16`.
    unsafe { below_16::<TO>(h, a, b, n) }
}

/// A slot the fast path jumps through: a load function with the export's own arguments (so the
/// jump moves nothing), at first one that waits for the engine selection and then stores its
/// choice here. The selection never changes once made, and every value a slot ever holds is
/// right for every load it takes, so the slot needs no ordering.
struct LoadSlot(AtomicPtr<()>);

impl LoadSlot {
    const fn new(first: General) -> LoadSlot {
        LoadSlot(AtomicPtr::new(first as *mut ()))
    }

    /// The load through the slot.
    ///
    /// # Safety
    /// The contract of the loads the slot takes (see each slot).
    #[inline(always)]
    unsafe fn jump(&self, h: usize, a: usize, b: usize, n: usize) -> c_int {
        // SAFETY: a slot only ever holds `General` functions (given to `new` and `set`), each
        // with the slot's contract; the caller's is that contract.
        unsafe { std::mem::transmute::<*mut (), General>(self.0.load(Ordering::Relaxed))(h, a, b, n) }
    }

    /// Makes the slot jump to `f`, which has the slot's contract.
    fn set(&self, f: General) {
        self.0.store(f as *mut (), Ordering::Relaxed);
    }
}

/// Where the fast path's loads below [`SPAN_MAX`] bytes go, except those that are one aligned
/// access and those of whole lines from [`SHORT_MAX`] bytes (the loads the span load takes
/// where the CPU has one): the span load (its entry taking the export's arguments), or
/// [`short_load_chunks`] where the CPU has none. So such a load reaches its engine with one jump,
/// without testing the selection on the way (three to five tests and a second jump before).
///
/// [`SPAN_MAX`]: copy::kernel::SPAN_MAX
static SHORT_LOAD: LoadSlot = LoadSlot::new(first_load::<false>);

/// Where the fast path's loads from [`SPAN_MAX`] bytes that are not whole lines go: the whole-load
/// function where the CPU has AVX-512 VBMI (its entry taking the export's arguments), [`large`]
/// elsewhere. Before, every such load went through [`large`] and its selection tests.
///
/// [`SPAN_MAX`]: copy::kernel::SPAN_MAX
static LONG_LOAD: LoadSlot = LoadSlot::new(first_load::<true>);

/// The first function of [`LONG_LOAD`] (`LONG`) or [`SHORT_LOAD`]: once the engine selection
/// exists, points the slot at the slot's engine (the whole-load or the span load's entry with the
/// export's arguments where the CPU has AVX-512 VBMI, else [`large`] or [`short_load_chunks`])
/// and loads with it; before, loads with the second pair, which selects on its way.
///
/// # Safety
/// As [`small`], for a load the slot takes: `1 <= n < SPAN_MAX` and not whole lines from
/// [`SHORT_MAX`] bytes ([`SHORT_LOAD`]), or `n >= SPAN_MAX` and not whole lines ([`LONG_LOAD`]).
#[inline(never)]
unsafe extern "C" fn first_load<const LONG: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    let (slot, without_vbmi): (&LoadSlot, General) =
        if LONG { (&LONG_LOAD, large::<FROM_MAPPING>) } else { (&SHORT_LOAD, short_load_chunks) };
    let Some(sel) = crate::copy::select::ready() else {
        // SAFETY: forwarded; it takes every load the slot takes.
        return unsafe { without_vbmi(h, a, b, n) };
    };
    let chosen = sel.whole_loads.map_or(without_vbmi, |w| if LONG { w.large_from_export } else { w.span_from_export });
    slot.set(chosen);
    // SAFETY: forwarded; each choice takes every load the slot takes.
    unsafe { chosen(h, a, b, n) }
}

/// A load that [`SHORT_LOAD`] takes where the CPU has no span load: [`small`] below 16 bytes,
/// [`short`]'s chunks below [`SHORT_MAX`], [`large`] from there.
///
/// # Safety
/// As [`first_load`] for [`SHORT_LOAD`].
#[inline(never)]
unsafe extern "C" fn short_load_chunks(h: usize, a: usize, b: usize, n: usize) -> c_int {
    // SAFETY: forwarded, with the size each one takes.
    unsafe {
        if n < 16 {
            small::<FROM_MAPPING>(h, a, b, n)
        } else if n < SHORT_MAX {
            short::<FROM_MAPPING>(h, a, b, n)
        } else {
            large::<FROM_MAPPING>(h, a, b, n)
        }
    }
}

/// A fast-path copy under 16 bytes that is not one aligned access: [`small`] (stores) or
/// through [`SHORT_LOAD`] (loads).
///
/// # Safety
/// As [`small`].
#[inline(always)]
unsafe fn below_16<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { if TO { small::<TO>(h, a, b, n) } else { SHORT_LOAD.jump(h, a, b, n) } }
}

/// A fast-path copy that is one naturally aligned access of `W` bytes, inline: the access and the
/// fence.
///
/// # Safety
/// `dev` is a multiple of `W` and `[dev, dev + W)` lies in a live write-combined mapping that
/// this thread's announcement keeps ours; the host side as in [`copy`].
#[inline(always)]
unsafe fn single<const TO: bool, const W: usize>(dev: usize, host: usize) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        if TO {
            aligned::store_one(dev as *mut u8, host as *const u8, W);
        } else {
            aligned::load_one(host as *mut u8, dev as *const u8, W);
        }
    }
    copy::store_fence();
    0
}

/// The rest of a fast-path copy under 16 bytes that is not one access: the edge stores
/// ([`copy::edges`]) and the fence (stores); for loads, which come here only where the CPU has
/// no span load ([`SHORT_LOAD`] sends them to the span load where it has one), one aligned
/// 8-byte read inside one 8-byte word, or a jump to [`small_across`]. Out of line, so the fast
/// path itself needs no saved registers and jumps here; `extern "C"` because such a function
/// cannot unwind, which is what lets the caller's call be a jump (a call that might unwind
/// through an `extern "C"` export needs a landing pad). Takes the export's own arguments in its
/// own order, as [`copy`] does (`h` unused, see [`keep`]), so the jump needs no register moves.
///
/// # Safety
/// The mapping side's `[ptr, ptr + n)` lies in a live write-combined mapping that this thread's
/// announcement keeps ours, `1 <= n < 16`; the host side as in [`copy`].
#[inline(never)]
unsafe extern "C" fn small<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    if !TO && !wc::in_one_word(b, n) {
        // SAFETY: the caller's contract, across an 8-byte word. A jump.
        return unsafe { small_across(h, a, b, n) };
    }
    // SAFETY: 1-15 bytes in `r` (this function's contract), which the edge stores take.
    let store = |r: WcRange<Store>| unsafe { copy::edges::to_device(r.parts().0, r.parts().1, n) };
    // SAFETY: `n >= 1`, in one 8-byte word (tested above).
    let load = |r| unsafe { wc::load_word(r) };
    // SAFETY: the caller's contract.
    unsafe { copy_then_fence::<TO>(h, a, b, n, store, load) }
}

/// A fast-path load of 1-15 bytes across an 8-byte word where the CPU has no span load: the
/// chunks inline ([`wc::load_small_across`]: a leaf reached by a jump, no call) and the fence.
/// A function of its own so that [`small`]'s other paths save no register.
///
/// # Safety
/// As [`small`], for a load across an 8-byte word.
#[inline(never)]
unsafe extern "C" fn small_across(h: usize, a: usize, b: usize, n: usize) -> c_int {
    // SAFETY: 1-15 bytes (this function's contract).
    let load = |r| unsafe { wc::load_small_across(r) };
    // SAFETY: the caller's contract.
    unsafe { copy_then_fence::<FROM_MAPPING>(h, a, b, n, |_| unreachable!("small_across is a load"), load) }
}

/// A short copy (16 bytes up to [`SHORT_MAX`]): 16-byte steps between exact or chunked ends,
/// no call. Stores inline in the export (the compiler saves the register it needs on this path
/// only, so the 1-8-byte copies still need none); loads in [`short_load_chunks`], where the CPU
/// has no span load ([`SHORT_LOAD`] sends them to the span load where it has one).
///
/// # Safety
/// As [`small`], but `16 <= n < SHORT_MAX`.
#[inline(always)]
unsafe fn short<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    let Some(stream) = wc::chunk_streaming() else {
        // SAFETY: forwarded.
        return unsafe { unselected::<TO>(h, a, b, n) };
    };
    // SAFETY: 16 bytes up to `SHORT_MAX` (this function's contract).
    let store = |r| unsafe { wc::store_short_body(r) };
    // SAFETY: as for the store; `stream` is the selection's.
    let load = |r| unsafe { wc::load_short_body(r, stream) };
    // SAFETY: the caller's contract.
    unsafe { copy_then_fence::<TO>(h, a, b, n, store, load) }
}

/// [`small`] from [`SHORT_MAX`] bytes up, not whole lines: the partial lines at the ends and
/// the line kernel between them (loads come here only where the CPU has no whole-load
/// functions, through [`LONG_LOAD`] and [`short_load_chunks`]; if it has them, a jump to the
/// span load below [`SPAN_MAX`] and to the whole-load function from there up; else
/// `wc::load_lines_last`'s body here, ending in a jump to the line kernel's fenced twin; so the
/// way from the export to the kernel is two jumps and the kernel returns to the caller), or the
/// plan (stores).
///
/// # Safety
/// As [`small`], but `n >= SHORT_MAX`.
///
/// [`SPAN_MAX`]: copy::kernel::SPAN_MAX
#[inline(never)]
unsafe extern "C" fn large<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    #[cfg(target_arch = "x86_64")]
    if !TO {
        let Some((sel, fenced)) = crate::copy::select::ready().and_then(|s| Some((s, s.load_line_fenced?))) else {
            // SAFETY: forwarded.
            return unsafe { unselected::<TO>(h, a, b, n) };
        };
        keep(h);
        // Not whole lines: those went to `lines`.
        if let Some(whole) = sel.whole_load(n, false) {
            // SAFETY: the caller's contract, with `n >= SHORT_MAX` as `whole_load` wants; it
            // fences and returns 0. A jump.
            return unsafe { (whole.fenced)(a as *mut u8, b as *const u8, n) };
        }
        // SAFETY: the caller's contract: the export's range, with `n >= SHORT_MAX` as the body
        // needs; the fenced twin has the line slot's contract, fences and returns 0.
        return unsafe {
            let r = WcRange::new(a as *mut u8, b as *const u8, n);
            wc::load_ends_then(sel, r, |h, d, len| fenced(h, d, len))
        };
    }
    // SAFETY: forwarded.
    unsafe { planned::<TO>(h, a, b, n) }
}

/// Any fast-path copy of 16 bytes or more while the engine selection is not made yet (cannot
/// happen after `gdr_open`, which makes it): the general large copy, which selects.
///
/// # Safety
/// As [`small`], but `n >= 16`.
#[cold]
#[inline(never)]
unsafe extern "C" fn unselected<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { planned::<TO>(h, a, b, n) }
}

/// The general large copy of the write-combining engines (head, planned middle, tail), then the
/// fence: [`large`]'s stores, and every copy of [`unselected`] (which selects the engines).
///
/// # Safety
/// As [`small`], but `n >= 16`.
#[inline(always)]
unsafe fn planned<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    // SAFETY: the caller's contract, with `n >= 16` as `load_large_body` needs.
    unsafe {
        copy_then_fence::<TO>(
            h,
            a,
            b,
            n,
            // Inlined into each caller: shared by two functions, the closures would otherwise be
            // outlined, and the store path of `large` would pay a call and a spill for them (the
            // function itself in place of the store closure is outlined too: a closure it is).
            #[allow(clippy::redundant_closure)]
            #[inline(always)]
            |r| wc::store_large_body(r),
            #[inline(always)]
            |r| wc::load_large_body(r),
        )
    }
}

/// [`large`] for whole 64-byte lines at a 64-aligned device address: the line kernel alone. A
/// function of its own so that whole lines skip the end-line arithmetic and the length test of
/// the general large copy, and go from the export to the kernel in one jump and one call (loads
/// on x86-64: two jumps, the second to the kernel's fenced twin).
///
/// # Safety
/// As [`large`], and [`copy::kernel::is_whole_lines`] holds.
#[inline(never)]
unsafe extern "C" fn lines<const TO: bool>(h: usize, a: usize, b: usize, n: usize) -> c_int {
    #[cfg(target_arch = "x86_64")]
    if !TO {
        let Some(fenced) = crate::copy::select::ready().and_then(|s| s.load_line_fenced) else {
            // SAFETY: forwarded.
            return unsafe { unselected::<TO>(h, a, b, n) };
        };
        keep(h);
        // SAFETY: the line slot's contract is `copy::kernel::is_whole_lines` (as below); the fenced twin
        // fences and returns 0. A jump: the kernel returns to the caller.
        return unsafe { fenced(a as *mut u8, b as *const u8, n) };
    }
    let Some((store, load)) = wc::line_kernels() else {
        // SAFETY: forwarded.
        return unsafe { unselected::<TO>(h, a, b, n) };
    };
    // SAFETY: the line slot's contract (a 64-aligned device side, a multiple of 64 bytes) is
    // `copy::kernel::is_whole_lines`, this function's; the range is `r`. Kernels take (dst, src).
    let store = |r: WcRange<Store>| unsafe { store(r.parts().0, r.parts().1, n) };
    // SAFETY: as for the store.
    let load = |r: WcRange<Load>| unsafe { load(r.parts().0, r.parts().1, n) };
    // SAFETY: the caller's contract.
    unsafe { copy_then_fence::<TO>(h, a, b, n, store, load) }
}

/// The body of every helper above: `store` for a copy to the mapping or `load` for one from it,
/// each given the export's range as a [`WcRange`] (`a` and `b` in the export's order, see
/// [`copy`]), then the store fence of a write-combined copy. `h` is the export's handle, unused
/// but kept ([`keep`]).
///
/// # Safety
/// The mapping side's `[ptr, ptr + n)` lies in a live write-combined mapping that this thread's
/// announcement keeps ours; the host side as in [`copy`]: the contract of [`WcRange`].
#[inline(always)]
unsafe fn copy_then_fence<const TO: bool>(
    h: usize,
    a: usize,
    b: usize,
    n: usize,
    store: impl FnOnce(WcRange<Store>),
    load: impl FnOnce(WcRange<Load>),
) -> c_int {
    keep(h);
    // SAFETY: this function's contract is the range's, in the copy's direction.
    unsafe {
        if TO {
            store(WcRange::new(a as *mut u8, b as *const u8, n));
        } else {
            load(WcRange::new(a as *mut u8, b as *const u8, n));
        }
    }
    copy::store_fence();
    copy::opaque_zero()
}

/// Marks `h` as used, at no cost. The helpers take the export's arguments as they are, the
/// unused handle included, so that the export reaches each with one conditional jump; were the
/// parameter unused, the optimiser would drop it from these internal functions, and every way to
/// a helper would need three register moves and a block of its own (one more taken jump for
/// every copy of 16 bytes and up; docs/decisions/0001-fast-path-window.md).
#[inline(always)]
fn keep(h: usize) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    // SAFETY: an empty template that reads one register; no instruction, memory, stack or flags.
    unsafe {
        std::arch::asm!("/* {0} */", in(reg) h, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::hint::black_box(h);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handles::registry::window_limit;

    /// What the fast path accepts, as it tests it.
    fn accepts(addr: usize, len: usize, dev: usize, n: usize) -> bool {
        let w = FastWindow { addr, lim: window_limit(len) };
        small_fits(w, dev).is_some_and(|off| n.wrapping_sub(1) < 8 || rest_fits(w, off, n))
    }

    /// Whether `[dev, dev + n)` is a non-empty range inside `[addr, addr + len)`, in wide integers.
    fn exactly_inside(addr: usize, len: usize, dev: usize, n: usize) -> bool {
        let (addr, len, dev, n) = (addr as u128, len as u128, dev as u128, n as u128);
        n > 0 && dev >= addr && dev + n <= addr + len
    }

    #[test]
    fn the_window_accepts_only_ranges_inside_and_all_but_those_starting_in_the_last_7_bytes() {
        let addr = 0x10_0000usize;
        for len in [0usize, 1, 7, 8, 9, 15, 16, 64, 0x100, 0x1000] {
            let mut devs: Vec<usize> = (addr - 20..addr + len + 20).collect();
            devs.extend([0, 1, usize::MAX, usize::MAX - 3, usize::MAX - 8, addr.wrapping_neg()]);
            let mut sizes: Vec<usize> = (0..=24).collect();
            sizes.extend([len, len + 1, len.wrapping_sub(1), usize::MAX, usize::MAX - 1, 1 << 63, addr.wrapping_neg()]);
            for &dev in &devs {
                for &n in &sizes {
                    let (fast, exact) = (accepts(addr, len, dev, n), exactly_inside(addr, len, dev, n));
                    assert!(!fast || exact, "accepted outside: len {len:#x} dev {dev:#x} n {n:#x}");
                    let in_slack = dev.wrapping_sub(addr) >= window_limit(len);
                    assert!(fast || !exact || in_slack, "refused inside: len {len:#x} dev {dev:#x} n {n:#x}");
                }
            }
        }
        assert_eq!(window_limit(0x1000), 0x1000 - 7);
        assert!(accepts(addr, 0x1000, addr + 0x1000 - 8, 8), "the last 8 bytes in one access");
        assert!(!accepts(addr, 0x1000, addr + 0x1000 - 7, 1), "starting in the slack: general path");
    }
}
