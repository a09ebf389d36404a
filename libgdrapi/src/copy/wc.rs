//! Write-combined copies: one inline case, everything else out of line.
//!
//! The inline case is the one latency-bound consumers use most (flags, counters, doorbells): 1, 2,
//! 4 or 8 bytes at an address that is a multiple of the size. It is one volatile access, so it is
//! also single-copy atomic, as it was with the helper. Everything else goes to a function of its
//! own, so that callers (the public `gdr_copy_*` path above all) stay small enough to need no
//! saved registers on their fast path.
//!
//! Stores follow [`super::plan::plan_wc`]: edge stores for the head and tail ([`super::edges`]: at most
//! two, overlapping, on x86-64; the aligned helper elsewhere), SIMD kernels for the 16-byte
//! aligned middle; short copies ([`SHORT_MAX`]) do the middle inline, 16 bytes at a
//! time, without the plan. A store may never touch a byte outside the range: the GPU may own the
//! bytes next to it.
//!
//! Loads read whole aligned 16-byte chunks instead of the head and tail pieces, through the same
//! 16-byte kernel as the middle, and deliver only the requested bytes to the host. Reads of GPU
//! memory through a BAR have no side effects, and an aligned chunk that holds a byte of the range
//! lies in the same page, so inside the mapping. What this buys on a real BAR, where every
//! uncached read is a PCIe round trip: a misaligned or odd-sized load costs at most two extra
//! 16-byte reads (one per end) where the helper needed up to eight 1-8-byte reads, and an odd
//! size under 16 bytes costs one or two reads instead of up to four. Where the CPU has AVX-512
//! VBMI, every load below [`SPAN_MAX`](super::kernel::SPAN_MAX) bytes that is not one access or one 8-byte word
//! goes to the span load instead (`x86::load_span_vbmi`: the same rule, one aligned read per
//! 16/32-byte chunk or 64-byte line holding a byte of the range), and larger ones that are not
//! whole lines to the whole-load function (`x86::load_large_vbmi`).
//!
//! Every function here takes its range as a [`WcRange`], whose contract the caller established
//! once, where the copy entered the engines; what a function states beyond it is only the size
//! class it needs, which its callers' route or tests give. The out-of-line ones are written with
//! [`wc_out_of_line!`], which keeps the range in three registers across the call.

#[cfg(not(target_arch = "x86_64"))]
use super::kernel::small_copy;
use super::kernel::{Direction, KernelFn, Load, Store, WcRange, wc_out_of_line, write_low_bytes};
#[cfg(target_arch = "x86_64")]
use super::kernel::{SHORT_MAX, is_whole_lines};
use super::plan::{Route, route, run_plan};
use super::select::{self, Selection};
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{aligned, edges};

/// Host -> write-combined mapping. Does not fence.
#[inline(always)]
pub(crate) fn store(r: WcRange<Store>) {
    let (dev, host, n) = r.parts();
    if aligned::is_single_access(dev.addr(), n) {
        // SAFETY: `r`'s range; `n` is 1, 2, 4 or 8 and `dev` a multiple of it.
        unsafe { aligned::store_one(dev, host, n) }
    } else {
        store_general(r)
    }
}

/// Write-combined mapping -> host. Does not fence.
#[inline(always)]
pub(crate) fn load(r: WcRange<Load>) {
    let (host, dev, n) = r.parts();
    if aligned::is_single_access(dev.addr(), n) {
        // SAFETY: `r`'s range; `n` is 1, 2, 4 or 8 and `dev` a multiple of it.
        unsafe { aligned::load_one(host, dev, n) }
    } else {
        load_general(r)
    }
}

wc_out_of_line! {
    /// [`store`] for everything but a single access.
    pub(crate) fn store_general(r: WcRange<Store>) {
        store_body(r)
    }
}

/// The body of [`store_general`], for callers that are out of line themselves.
#[inline(always)]
pub(crate) fn store_body(r: WcRange<Store>) {
    let (dev, host, n) = r.parts();
    match route(Direction::ToDevice, dev.addr(), n) {
        // SAFETY: `r`'s range, which the edge stores take at any alignment below 16 bytes.
        Route::Small => unsafe { edges::to_device(dev, host, n) },
        // SAFETY: the route's size class.
        Route::Short => unsafe { store_short(r) },
        Route::Lines | Route::Span | Route::Large => store_large(r),
    }
}

wc_out_of_line! {
    /// A short store ([`SHORT_MAX`]), out of line for [`store_body`].
    ///
    /// # Safety
    /// `16 <= r.len() < SHORT_MAX`.
    unsafe fn store_short(r: WcRange<Store>) {
        // SAFETY: this function's size class.
        unsafe { store_short_body(r) }
    }
}

/// A short store: edge stores ([`edges`]) up to 16-byte alignment and for the tail, one non-temporal
/// 16-byte store for each aligned 16 bytes between them. No call, so callers that jump here need
/// no saved registers.
///
/// # Safety
/// `16 <= r.len() < SHORT_MAX`.
#[inline(always)]
pub(crate) unsafe fn store_short_body(r: WcRange<Store>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the pieces partition `r` (the head is below 16 <= n bytes); the edge stores stay
    // inside theirs (their contract); each 16-byte store is at a 16-aligned device address inside
    // the range, MOVNTDQ is baseline SSE2 on x86-64, and the host side is read unaligned.
    unsafe {
        let (dev, host, n) = r.parts();
        let head = dev.addr().wrapping_neg() & 15;
        if head != 0 {
            edges::to_device(dev, host, head);
        }
        let mut i = head;
        while i + 16 <= n {
            x86::nt_store16(dev.add(i), host.add(i));
            i += 16;
        }
        if i < n {
            edges::to_device(dev.add(i), host.add(i), n - i);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    store_large_body(r)
}

wc_out_of_line! {
    /// A store of 16 bytes or more: head, SIMD middle, tail. Out of line so that the small cases
    /// above need no saved registers.
    fn store_large(r: WcRange<Store>) {
        store_large_body(r)
    }
}

/// The body of [`store_large`], for callers that are out of line themselves.
#[inline(always)]
pub(crate) fn store_large_body(r: WcRange<Store>) {
    let slots = &select::get().store;
    let (dev, host, n) = r.parts();
    // SAFETY: `r`'s range; `run_plan` gives each kernel only the alignment it requires.
    unsafe { run_plan(slots, edges::to_device, Direction::ToDevice, dev, host, n) }
}

wc_out_of_line! {
    /// [`load`] for everything but a single access.
    pub(crate) fn load_general(r: WcRange<Load>) {
        load_body(r)
    }
}

/// The body of [`load_general`], for callers that are out of line themselves.
#[inline(always)]
pub(crate) fn load_body(r: WcRange<Load>) {
    let n = r.len();
    if n == 0 {
        return;
    }
    // SAFETY: the route's size class, which is each one's.
    unsafe {
        match route(Direction::FromDevice, r.dev(), n) {
            Route::Small => load_small(r),
            Route::Short => load_short(r),
            Route::Lines | Route::Span | Route::Large => load_large(r),
        }
    }
}

wc_out_of_line! {
    /// A short load ([`SHORT_MAX`]), out of line for [`load_body`].
    ///
    /// # Safety
    /// `16 <= r.len() < SHORT_MAX`.
    unsafe fn load_short(r: WcRange<Load>) {
        let sel = select::get();
        if let Some(span) = sel.span_load() {
            let (host, dev, n) = r.parts();
            // SAFETY: `r`'s range; the span load takes any load.
            unsafe { (span.unfenced)(host, dev, n) };
        } else {
            // SAFETY: this function's size class.
            unsafe { load_short_body(r, sel.stream_chunks) }
        }
    }
}

/// Whether chunk reads stream (MOVNTDQA), once the engine selection is made (`gdr_open` makes it,
/// so every copy through a mapping finds it): read without an initialising call.
#[inline(always)]
pub(crate) fn chunk_streaming() -> Option<bool> {
    select::ready().map(|s| s.stream_chunks)
}

/// A short load: the aligned 16-byte chunk holding a misaligned head, every aligned 16-byte chunk
/// of the middle, the chunk holding the tail; each one read with one instruction and handed to
/// the host through registers. No call, so callers that jump here need no saved registers.
/// `stream` is [`chunk_streaming`]'s answer.
///
/// # Safety
/// `16 <= r.len() < SHORT_MAX`.
#[inline(always)]
pub(crate) unsafe fn load_short_body(r: WcRange<Load>, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `r`'s range, which `load_chunks` takes; `n >= 16` is this function's size class,
    // and telling the compiler spares `load_chunks` its tests for ranges shorter than the first
    // chunk.
    unsafe {
        let (host, dev, n) = r.parts();
        std::hint::assert_unchecked(n >= 16);
        load_chunks(stream, host, dev, n)
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: this function's size class is within `load_large_body`'s.
    unsafe {
        let _ = stream;
        load_large_body(r)
    }
}

/// A load of 1-15 bytes: one aligned 8-byte read when the range lies in one 8-byte word, else one
/// aligned 16-byte chunk or, when it straddles two, both.
///
/// # Safety
/// `1 <= r.len() < 16`.
#[inline(always)]
pub(crate) unsafe fn load_small(r: WcRange<Load>) {
    // SAFETY: this function's size class; in one word for `load_word`, across a word for
    // `load_small_chunks`.
    unsafe { if in_one_word(r.dev(), r.len()) { load_word(r) } else { load_small_chunks(r, r.dev() & 15) } }
}

/// Whether a load of `n` bytes at device address `dev` lies in one aligned 8-byte word, which
/// one aligned 8-byte read fetches ([`load_word`]).
#[inline(always)]
pub(crate) fn in_one_word(dev: usize, n: usize) -> bool {
    (dev & 7) + n <= 8
}

/// A load of 1-8 bytes inside one aligned 8-byte word ([`in_one_word`]): one aligned read.
///
/// # Safety
/// `r.len() >= 1` and [`in_one_word`].
#[inline(always)]
pub(crate) unsafe fn load_word(r: WcRange<Load>) {
    let (host, dev, n) = r.parts();
    let word = dev.addr() & 7;
    // SAFETY: the aligned word holds a byte of `r`'s device range, so it lies in the same page,
    // inside the mapping; host writes stay inside [host, host + n).
    unsafe {
        let v = u64::from_le(dev.sub(word).cast::<u64>().read_volatile()) >> (8 * word);
        write_low_bytes(host, v, n);
    }
}

/// A load of 1-15 bytes across an 8-byte boundary, the chunks inline (x86-64; elsewhere
/// [`load_small`]), for a caller that is out of line itself and reached by a jump (the public
/// fast path where the CPU has no span load): no call.
///
/// # Safety
/// `1 <= r.len() < 16`.
#[inline(always)]
pub(crate) unsafe fn load_small_across(r: WcRange<Load>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: this function's size class, which is `small_chunks`'s. Without a selection (not
    // after `gdr_open`, which makes it) plain MOVDQA, valid on every x86-64 CPU: no initialising
    // call here. The shuffle only where the selection says the CPU has it, for a range inside one
    // chunk (its contract).
    unsafe {
        let (host, dev, n) = r.parts();
        let (stream, shuffle) = select::ready().map_or((false, false), |s| (s.stream_chunks, s.shuffle_chunks));
        let head = dev.addr() & 15;
        if shuffle && head + n <= 16 {
            x86::load_in_chunk_sse41(host, dev, n);
            return;
        }
        small_chunks(r, head, |chunk, skip, host, n| bounce_x86(stream, chunk, skip, host, n))
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: this function's size class is `load_small`'s.
    unsafe {
        load_small(r)
    }
}

wc_out_of_line! {
    /// [`load_small`] across an 8-byte boundary: one or two aligned 16-byte chunks. Out of line, so
    /// that the one-word case needs no saved registers.
    ///
    /// # Safety
    /// `1 <= r.len() < 16`; `head` is the device address `% 16`.
    unsafe fn load_small_chunks(r: WcRange<Load>, head: usize) {
        let sel = select::get();
        if let Some(span) = sel.span_load() {
            let (host, dev, n) = r.parts();
            // SAFETY: `r`'s range; the span load takes any load.
            unsafe { (span.unfenced)(host, dev, n) };
        } else {
            // SAFETY: this function's contract is `small_chunks`'s; `bounce` has `small_chunks`'s
            // contract for `chunk_to`.
            unsafe { small_chunks(r, head, |chunk, skip, host, n| bounce(sel, chunk, skip, host, n)) }
        }
    }
}

/// The chunks of a load of 1-15 bytes: the aligned 16-byte chunk holding `dev`, and the next one
/// when the range straddles both, each through `chunk_to(chunk, skip, host, count)` ([`bounce`]'s
/// signature and contract).
///
/// # Safety
/// `1 <= r.len() < 16`; `head` is the device address `% 16`.
#[inline(always)]
unsafe fn small_chunks(r: WcRange<Load>, head: usize, chunk_to: impl Fn(*const u8, usize, *mut u8, usize)) {
    let (host, dev, n) = r.parts();
    // SAFETY: every device read (an aligned chunk) holds at least one byte of [dev, dev + n), so
    // it lies in the same page, inside the mapping; host writes stay inside [host, host + n);
    // each call gets `skip + count <= 16`.
    unsafe {
        if head + n <= 16 {
            chunk_to(dev.sub(head), head, host, n);
        } else {
            let first = 16 - head;
            chunk_to(dev.sub(head), head, host, first);
            chunk_to(dev.add(first), 0, host.add(first), n - first);
        }
    }
}

wc_out_of_line! {
    /// A load of 16 bytes or more: an aligned chunk for a misaligned head, the 16-aligned middle with
    /// the kernels, an aligned chunk for the tail.
    ///
    /// # Safety
    /// `r.len() >= 16`.
    unsafe fn load_large(r: WcRange<Load>) {
        // SAFETY: this function's size class.
        unsafe { load_large_body(r) }
    }
}

/// The body of [`load_large`], for callers that are out of line themselves.
///
/// # Safety
/// `r.len() >= 16`.
#[inline(always)]
pub(crate) unsafe fn load_large_body(r: WcRange<Load>) {
    #[cfg(target_arch = "x86_64")]
    if r.len() >= SHORT_MAX
        && let Some(sel) = select::ready()
    {
        // SAFETY: `r.len() >= SHORT_MAX`, as `load_lines_last` needs.
        return unsafe { load_lines_last(sel, r) };
    }
    // SAFETY: this function's size class.
    unsafe { load_planned(r) }
}

wc_out_of_line! {
    /// [`load_large_body`] through the plan: a chunk for a misaligned head, the 16-aligned middle
    /// split among the kernels, a chunk for the tail. Out of line, so that the calls it makes do not
    /// make [`load_lines_last`]'s callers save registers.
    ///
    /// # Safety
    /// `r.len() >= 16`.
    unsafe fn load_planned(r: WcRange<Load>) {
        let sel = select::get();
        let (host, dev, n) = r.parts();
        let head = dev.addr() & 15;
        // SAFETY: chunk reads as in `small_chunks`, the head's inside the range as `n >= 16`; the
        // middle is 16-aligned on the device side with a length that is a multiple of 16, which the
        // plan splits among the kernels' alignments.
        unsafe {
            let mut i = 0;
            if head != 0 {
                i = 16 - head;
                bounce(sel, dev.sub(head), head, host, i);
            }
            let body = (n - i) & !15;
            if body != 0 {
                run_plan(&sel.load, aligned::from_device, Direction::FromDevice, host.add(i), dev.add(i), body);
            }
            let tail = (n - i) & 15;
            if tail != 0 {
                bounce(sel, dev.add(i + body), 0, host.add(i + body), tail);
            }
        }
    }
}

/// A load of at least [`SHORT_MAX`] bytes on x86-64: first the partial lines at both ends, in
/// 16-byte chunks inline, then the whole lines between them with the line kernel, last, as a
/// jump. Out of line on its own, so a caller keeps nothing across the call but what it needs
/// after the copy (the public path its announcement, one register; [`load_large`] nothing: its
/// call is a jump too), where the plan's calls made it save six. Reads have no side effects, so
/// their order is free; the host sees the same bytes.
///
/// # Safety
/// `r.len() >= SHORT_MAX`, so at least one whole line lies inside.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_lines_last(sel: &Selection, r: WcRange<Load>) {
    let (host, dev, n) = r.parts();
    // SAFETY: `r`'s parts, and this function's contract (`n >= SHORT_MAX`); `out_of_line` takes
    // them as the range.
    unsafe { load_lines_last_out_of_line(sel, host, dev, n) }
}

/// The body of [`load_lines_last`], out of line with the range in registers (see
/// [`wc_out_of_line`]; the selection comes first, which the macro does not write).
///
/// # Safety
/// `[host, host + n)` <- `[dev, dev + n)` is a [`WcRange`], and `n >= SHORT_MAX`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
unsafe fn load_lines_last_out_of_line(sel: &Selection, host: *mut u8, dev: *const u8, n: usize) {
    // SAFETY: this function's contract.
    let r = unsafe { WcRange::<Load>::new(host, dev, n) };
    if let Some(whole) = sel.whole_load(n, is_whole_lines(dev.addr(), n)) {
        // SAFETY: `r`'s range with `n >= SHORT_MAX`, as `whole_load` wants.
        unsafe { (whole.unfenced)(host, dev, n) };
        return;
    }
    // SAFETY: this function's size class; the line slot's kernel has the line slot's contract.
    unsafe { load_ends_then(sel, r, |h, d, len| (sel.load.line)(h, d, len)) }
}

/// The body of [`load_lines_last`]: the partial lines at both ends, then `lines(host, dev, len)`
/// for the whole lines between them, whose result it returns. [`load_lines_last`] passes the
/// selected line kernel; the public fast path, out of line itself and reached by a jump, passes
/// the kernel's fenced twin ([`Selection::load_line_fenced`]), so its copy ends in a jump too.
///
/// # Safety
/// `r.len() >= SHORT_MAX`; `lines` has the line slot's contract.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load_ends_then<R>(
    sel: &Selection,
    r: WcRange<Load>,
    lines: impl FnOnce(*mut u8, *const u8, usize) -> R,
) -> R {
    let (host, dev, n) = r.parts();
    let before = (64 - (dev.addr() & 63)) & 63;
    let after = (dev.addr() + n) & 63;
    // SAFETY: [dev, dev + before) ends at a line boundary and [dev + n - after, dev + n) starts at
    // one, both inside the range; between them lie `n - before - after` bytes (at least 64, as
    // `n >= SHORT_MAX`) of whole lines at a 64-aligned device address: the line slot's contract.
    unsafe {
        load_chunks(sel.stream_chunks, host, dev, before);
        load_chunks(sel.stream_chunks, host.add(n - after), dev.add(n - after), after);
        lines(host.add(before), dev.add(before), n - before - after)
    }
}

/// A load in aligned 16-byte chunks (a chunk for a misaligned start, whole chunks, a chunk for the
/// rest), inline, no call: the short path, and the partial lines at the ends of a long load.
///
/// # Safety
/// `[host, host + len)` <- `[dev, dev + len)` is a [`WcRange`] (`len` 0 does nothing).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_chunks(stream: bool, host: *mut u8, dev: *const u8, len: usize) {
    let skip = dev.addr() & 15;
    let mut i = 0;
    // SAFETY: chunk reads as in `small_chunks` (each aligned chunk holds a byte of the range); host
    // writes stay inside [host, host + len); `bounce_x86` gets `skip + count <= 16`.
    unsafe {
        if skip != 0 && len != 0 {
            i = (16 - skip).min(len);
            bounce_x86(stream, dev.sub(skip), skip, host, i);
        }
        while i + 16 <= len {
            x86::load16(host.add(i), dev.add(i), stream);
            i += 16;
        }
        if i < len {
            bounce_x86(stream, dev.add(i), 0, host.add(i), len - i);
        }
    }
}

/// The line kernels (store, load) when the selection is made, which it is once `gdr_open` ran.
#[inline(always)]
pub(crate) fn line_kernels() -> Option<(KernelFn, KernelFn)> {
    select::ready().map(|s| (s.store.line, s.load.line))
}

/// A 16-byte bounce buffer, aligned like a chunk of the device.
#[cfg(not(target_arch = "x86_64"))]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

/// Reads the aligned 16-byte chunk at `chunk` and writes its bytes `[skip, skip + n)` to `host`.
///
/// On x86-64 the read is one inline MOVNTDQA (where the 16-byte slot streams too; a streaming
/// load also brings the rest of the line for the middle's loads) or MOVDQA, and the bytes go from
/// the register to the host through general registers: a round trip through the stack would make
/// the host-side loads wait for a store they only partly overlap (a store-forwarding stall).
/// Elsewhere the read is the selected 16-byte kernel into a buffer.
///
/// # Safety
/// `chunk` is 16-aligned and readable for 16 bytes; `skip + n <= 16`, `n >= 1`; `host` is
/// writable for `n` bytes.
#[inline(always)]
unsafe fn bounce(sel: &Selection, chunk: *const u8, skip: usize, host: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's chunk is `bounce_x86`'s; `stream_chunks` is set only where the CPU has
    // SSE4.1.
    unsafe {
        bounce_x86(sel.stream_chunks, chunk, skip, host, n)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut c = Chunk([0; 16]);
        // SAFETY: the kernel contract for width 16 (device side aligned, length 16); `c` is ours.
        unsafe { (sel.load.w16)(c.0.as_mut_ptr(), chunk, 16) };
        // SAFETY: skip + n <= 16 keeps the reads inside `c`; the caller vouches for `host`.
        unsafe { small_copy(host, c.0.as_ptr().add(skip), n) }
    }
}

/// [`bounce`] on x86-64, with MOVNTDQA when `stream`, else MOVDQA.
///
/// # Safety
/// As [`bounce`]; `stream` only where the CPU has SSE4.1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn bounce_x86(stream: bool, chunk: *const u8, skip: usize, host: *mut u8, n: usize) {
    {
        let (lo, hi): (u64, u64);
        // SAFETY: one aligned 16-byte read of `chunk`; MOVNTDQA and PEXTRQ need SSE4.1, which
        // `stream` says the CPU has; the other branch is SSE2, baseline on x86-64.
        unsafe {
            if stream {
                std::arch::asm!(
                    "movntdqa {x}, xmmword ptr [{src}]",
                    "movq {lo}, {x}",
                    "pextrq {hi}, {x}, 1",
                    src = in(reg) chunk, lo = out(reg) lo, hi = out(reg) hi, x = out(xmm_reg) _,
                    options(nostack, preserves_flags, readonly),
                );
            } else {
                std::arch::asm!(
                    "movdqa {x}, xmmword ptr [{src}]",
                    "movq {lo}, {x}",
                    "psrldq {x}, 8",
                    "movq {hi}, {x}",
                    src = in(reg) chunk, lo = out(reg) lo, hi = out(reg) hi, x = out(xmm_reg) _,
                    options(nostack, preserves_flags, readonly),
                );
            }
        }
        // Byte i of the chunk is byte i of this little-endian value (x86-64 is little-endian).
        let v = ((u128::from(hi) << 64) | u128::from(lo)) >> (8 * skip);
        // SAFETY: the caller vouches for `host` and n <= 16 - skip.
        unsafe {
            if n > 8 {
                host.cast::<u64>().write_unaligned(v as u64);
                host.add(n - 8).cast::<u64>().write_unaligned((v >> (8 * (n - 8))) as u64);
            } else {
                write_low_bytes(host, v as u64, n);
            }
        }
    }
}
