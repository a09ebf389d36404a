//! Write-combined copies: one inline case, everything else out of line.
//!
//! The inline case is the one latency-bound consumers use most (flags, counters, doorbells): 1, 2,
//! 4 or 8 bytes at an address that is a multiple of the size. It is one volatile access, so it is
//! also single-copy atomic, as it was with the helper. Everything else goes to a function of its
//! own, so that callers (the public `gdr_copy_*` path above all) stay small enough to need no
//! saved registers on their fast path.
//!
//! Stores follow [`super::plan_wc`]: exact helper accesses for the head and tail, SIMD kernels for
//! the 16-byte aligned middle. A store may never touch a byte outside the range: the GPU may own
//! the bytes next to it.
//!
//! Loads read whole aligned 16-byte chunks instead of the head and tail pieces, through the same
//! 16-byte kernel as the middle, and deliver only the requested bytes to the host. Reads of GPU
//! memory through a BAR have no side effects, and an aligned chunk that holds a byte of the range
//! lies in the same page, so inside the mapping. What this buys on a real BAR, where every
//! uncached read is a PCIe round trip: a misaligned or odd-sized load costs at most two extra
//! 16-byte reads (one per end) where the helper needed up to eight 1-8-byte reads, and an odd
//! size under 16 bytes costs one or two reads instead of up to four.

use super::select::{self, Slots};
use super::{Direction, KernelFn, aligned, run_plan};

/// Host -> write-combined mapping. Does not fence.
///
/// # Safety
/// `dev` is valid for `n` bytes of writes, `host` for `n` bytes of reads, no overlap; any
/// alignment.
#[inline(always)]
pub(crate) unsafe fn store(dev: *mut u8, host: *const u8, n: usize) {
    if aligned::is_single_access(dev.addr(), n) {
        // SAFETY: `n` is 1, 2, 4 or 8 and `dev` a multiple of it; ranges as the caller promises.
        unsafe { aligned::store_one(dev, host, n) }
    } else {
        // SAFETY: forwarded.
        unsafe { store_general(dev, host, n) }
    }
}

/// Write-combined mapping -> host. Does not fence.
///
/// # Safety
/// `host` is valid for `n` bytes of writes, `dev` for `n` bytes of reads, no overlap; any
/// alignment. `dev` lies in a mapping made of whole pages (every BAR mapping is).
#[inline(always)]
pub(crate) unsafe fn load(host: *mut u8, dev: *const u8, n: usize) {
    if aligned::is_single_access(dev.addr(), n) {
        // SAFETY: as in `store`.
        unsafe { aligned::load_one(host, dev, n) }
    } else {
        // SAFETY: forwarded.
        unsafe { load_general(host, dev, n) }
    }
}

/// [`store`] for everything but a single access.
///
/// # Safety
/// As [`store`].
#[inline(never)]
pub(crate) unsafe fn store_general(dev: *mut u8, host: *const u8, n: usize) {
    // SAFETY: forwarded.
    unsafe { store_body(dev, host, n) }
}

/// The body of [`store_general`], for callers that are out of line themselves.
///
/// # Safety
/// As [`store`].
#[inline(always)]
pub(crate) unsafe fn store_body(dev: *mut u8, host: *const u8, n: usize) {
    let slots = &select::get().store;
    // SAFETY: forwarded contract; `run_plan` gives each kernel only the alignment it requires.
    unsafe { run_plan(slots, aligned::to_device, Direction::ToDevice, dev, host, n) }
}

/// [`load`] for everything but a single access.
///
/// # Safety
/// As [`load`].
#[inline(never)]
pub(crate) unsafe fn load_general(host: *mut u8, dev: *const u8, n: usize) {
    // SAFETY: forwarded.
    unsafe { load_body(host, dev, n) }
}

/// The body of [`load_general`], for callers that are out of line themselves.
///
/// # Safety
/// As [`load`].
#[inline(always)]
pub(crate) unsafe fn load_body(host: *mut u8, dev: *const u8, n: usize) {
    if n == 0 {
        return;
    }
    let head = dev.addr() & 15;
    let slots: &Slots = &select::get().load;
    // SAFETY: every chunk read starts at a 16-aligned address and holds at least one
    // byte of [dev, dev + n), so it lies in the same page as that byte, inside the mapping; every
    // host write stays inside [host, host + n); the middle is 16-aligned on the device side with a
    // length that is a multiple of 16, which the plan splits among the kernels' alignments.
    unsafe {
        if n < 16 && head + n <= 16 {
            bounce(slots.w16, dev.sub(head), head, host, n);
            return;
        }
        let mut i = 0;
        if head != 0 {
            i = 16 - head;
            bounce(slots.w16, dev.sub(head), head, host, i);
        }
        let body = (n - i) & !15;
        if body != 0 {
            run_plan(slots, aligned::from_device, Direction::FromDevice, host.add(i), dev.add(i), body);
        }
        let tail = (n - i) & 15;
        if tail != 0 {
            bounce(slots.w16, dev.add(i + body), 0, host.add(i + body), tail);
        }
    }
}

/// A 16-byte bounce buffer, aligned like a chunk of the device.
#[repr(C, align(16))]
struct Chunk([u8; 16]);

/// Reads the aligned 16-byte chunk at `chunk` with the 16-byte load kernel and writes its bytes
/// `[skip, skip + n)` to `host`.
///
/// # Safety
/// `chunk` is 16-aligned and readable for 16 bytes; `skip + n <= 16`, `n >= 1`; `host` is
/// writable for `n` bytes.
#[inline(always)]
unsafe fn bounce(w16: KernelFn, chunk: *const u8, skip: usize, host: *mut u8, n: usize) {
    let mut c = Chunk([0; 16]);
    // SAFETY: the kernel contract for width 16 (device side aligned, length 16); `c` is ours.
    unsafe { w16(c.0.as_mut_ptr(), chunk, 16) };
    // SAFETY: skip + n <= 16 keeps the reads inside `c`; the caller vouches for `host`.
    unsafe { small_copy(host, c.0.as_ptr().add(skip), n) }
}

/// Copies `n` (1..=16) bytes between ordinary, non-overlapping buffers with two possibly
/// overlapping moves of the widest size that fits.
///
/// # Safety
/// `dst` writable and `src` readable for `n` bytes, `1 <= n <= 16`, no overlap.
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
