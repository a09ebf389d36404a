//! The fast path of `gdr_copy_to_mapping` / `gdr_copy_from_mapping`: a copy through a live
//! write-combined mapping, by a thread that has copied before, while the process needs no
//! special fences. Everything else (first copy of a thread, cached and device mappings, several
//! mapping types at once, fenced readers, size 0, every error) goes to the general path in
//! [`crate::capi`], which gives the same results plus the errno and log line of a refusal.
//!
//! Why a separate path: the copy call is the library's reason to exist and its cost over the raw
//! engine is what users see. This one is written to compile into a leaf: a handle range check, the
//! announcement ([`crate::grace`]), one state compare, the window check, and either one naturally
//! aligned access plus the fence, or a jump to the out-of-line engines. No lock, no atomic
//! read-modify-write, no call that needs saved registers; every way out that is not the fast copy
//! is a tail call. The conditions that force every copy onto the general path are one byte,
//! [`GENERAL_ONLY`], read once per call.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering, compiler_fence};

use crate::copy::{self, aligned, wc};
use crate::registry::Mirror;

/// Process-wide conditions under which copies must take the general path, one bit each.
static GENERAL_ONLY: AtomicU8 = AtomicU8::new(0);

/// Why copies must take the general path.
#[derive(Clone, Copy)]
pub(crate) enum Why {
    /// `membarrier` is unavailable: copies fence after announcing themselves ([`crate::grace`]).
    FencedReaders = 1,
    /// Mappings of more than one type are live: every copy ends with a full fence (spec §4.5).
    MixedTypes = 2,
}

/// Sets (`on`) or clears the condition `why`.
pub(crate) fn set_general(why: Why, on: bool) {
    if on {
        GENERAL_ONLY.fetch_or(why as u8, Ordering::SeqCst);
    } else {
        GENERAL_ONLY.fetch_and(!(why as u8), Ordering::SeqCst);
    }
}

/// Sets the condition `why` for good.
pub(crate) fn require_general(why: Why) {
    set_general(why, true);
}

/// Whether `[dev, dev + n)` is a non-empty range inside `[addr, addr + len)`: two compares, no
/// overflow for any input.
#[inline(always)]
fn inside(addr: usize, len: usize, dev: usize, n: usize) -> bool {
    let off = dev.wrapping_sub(addr);
    off < len && n.wrapping_sub(1) < len - off
}

/// Which way a copy goes, as a const parameter so each export gets its own straight-line code.
pub(crate) const TO_MAPPING: bool = true;
/// See [`TO_MAPPING`].
pub(crate) const FROM_MAPPING: bool = false;

/// The fast path of one public copy; `general` is the general path for the same arguments.
///
/// # Safety
/// The C contract of `gdr_copy_*`: `host` is valid for `n` bytes in the copy's direction and does
/// not overlap the mapping; `h` and `dev` need not be valid (they are checked here).
#[inline(always)]
pub(crate) unsafe fn copy<const TO: bool>(
    h: usize,
    dev: usize,
    host: usize,
    n: usize,
    general: unsafe extern "C" fn(usize, usize, usize, usize) -> c_int,
) -> c_int {
    if GENERAL_ONLY.load(Ordering::Relaxed) == 0
        && let Some(mirror) = Mirror::of(h)
        && let Some(word) = crate::grace::my_word()
    {
        // Announce, then read the state (the order `grace` relies on; the writer's membarrier
        // orders the CPU, this fence the compiler).
        word.store(h, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        if let Some(m) = mirror.wc_mapping()
            && inside(m.addr, m.len, dev, n)
            && host != 0
        {
            if aligned::is_single_access(dev, n) {
                // SAFETY: `n` is 1, 2, 4 or 8 and `dev` a multiple of it, inside a mapping that
                // stays mapped while `word` names the handle; the host side is the caller's.
                unsafe {
                    if TO {
                        aligned::store_one(dev as *mut u8, host as *const u8, n);
                    } else {
                        aligned::load_one(host as *mut u8, dev as *const u8, n);
                    }
                }
                copy::store_fence();
                word.store(0, Ordering::Release);
                return 0;
            }
            // SAFETY: as above, for the whole range.
            return unsafe { engines_then_release::<TO>(word, dev, host, n) };
        }
        word.store(0, Ordering::Release);
    }
    // SAFETY: forwarded contract.
    unsafe { general(h, dev, host, n) }
}

/// The rest of a fast-path copy under 16 bytes (or a jump to [`large_then_release`]): the
/// write-combined helper, the fence, the end of the announcement. Out of line, so the fast path
/// itself needs no saved registers and jumps here; `extern "C"` because such a function cannot
/// unwind, which is what lets the caller's call be a jump (a call that might unwind through an
/// `extern "C"` export needs a landing pad).
///
/// # Safety
/// `[dev, dev + n)` lies in a live write-combined mapping that `word` keeps mapped; `host` as in
/// [`copy`].
#[inline(never)]
unsafe extern "C" fn engines_then_release<const TO: bool>(
    word: &AtomicUsize,
    dev: usize,
    host: usize,
    n: usize,
) -> c_int {
    if n >= 16 {
        // SAFETY: forwarded.
        return unsafe { large_then_release::<TO>(word, dev, host, n) };
    }
    // SAFETY: the caller's contract, and 1 <= n < 16 (n = 0 never takes the fast path).
    unsafe {
        if TO {
            aligned::to_device(dev as *mut u8, host as *const u8, n);
        } else {
            wc::load_small(host as *mut u8, dev as *const u8, n);
        }
    }
    release(word)
}

/// [`engines_then_release`] from 16 bytes up: head, SIMD middle and tail, fence, release.
///
/// # Safety
/// As [`engines_then_release`], and `n >= 16`.
#[inline(never)]
unsafe extern "C" fn large_then_release<const TO: bool>(
    word: &AtomicUsize,
    dev: usize,
    host: usize,
    n: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        if TO {
            wc::store_large_body(dev as *mut u8, host as *const u8, n);
        } else {
            wc::load_large_body(host as *mut u8, dev as *const u8, n);
        }
    }
    release(word)
}

/// The end of a fast-path copy: the store fence of a write-combined copy, then the end of the
/// announcement (after the fence: the copy is complete before an unmapping thread may proceed).
#[inline(always)]
fn release(word: &AtomicUsize) -> c_int {
    copy::store_fence();
    word.store(0, Ordering::Release);
    // Opaque to the optimiser: a constant return would be propagated into the callers, which then
    // call instead of jumping here.
    std::hint::black_box(0)
}

#[cfg(test)]
mod tests {
    use super::inside;

    #[test]
    fn inside_is_exact_at_the_edges_and_refuses_empty_and_overflowing_ranges() {
        assert!(inside(0x1000, 0x100, 0x1000, 1));
        assert!(inside(0x1000, 0x100, 0x1000, 0x100));
        assert!(inside(0x1000, 0x100, 0x10ff, 1));
        assert!(!inside(0x1000, 0x100, 0x1000, 0x101));
        assert!(!inside(0x1000, 0x100, 0x1100, 1));
        assert!(!inside(0x1000, 0x100, 0xfff, 1));
        assert!(!inside(0x1000, 0x100, 0x1000, 0), "size 0 takes the general path");
        assert!(!inside(0x1000, 0x100, 0x1080, usize::MAX));
        assert!(!inside(0x1000, 0x100, usize::MAX, 2));
        assert!(!inside(0x1000, 0, 0x1000, 1), "nothing is inside an empty mapping");
    }
}
