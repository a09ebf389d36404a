//! The per-thread translation memo of the registration cache ([`super::memmgr`]): the interval
//! this thread translated through last, and the unregistered gap around the last GPU-memory word.
//! A stream-ordered program posts the same flag words again and again, so most translations are
//! answered from here without taking the cache's lock.
//!
//! It is a plain `thread_local!` (general-dynamic TLS: a call to `__tls_get_addr` per access),
//! not an initial-exec block as libgdrapi's copy path uses (`gpudirect_common::tls`): that would
//! save the call (11 of the about 260 instructions of a two-descriptor enqueue), but it marks the
//! library `STATIC_TLS`, and then its whole TLS segment (296 bytes: the standard library's
//! thread-locals, the scratch buffers and this memo) comes out of the 512-byte surplus glibc
//! keeps for dlopen'ed libraries, of which libgdrapi already takes 160.

use std::cell::Cell;

/// What this thread translated last through cache `mm`, as of the cache's `generation`: a
/// registered interval `[start, end]` whose first byte is at `dev_base` on the device, and an
/// interval `[gap_start, gap_end]` that no registration touches, where GPU-memory words are used
/// as they are (so a post of a GPU-memory word needs the cache's lock once, not every time). A part
/// with `start > end` answers nothing. All zero is the empty memo: cache ids start at 1, so it
/// never matches. Aligned to a cache line: unaligned, it straddled two lines of the TLS block,
/// and after the driver's work a post is paid by the line it has to fetch again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Memo {
    pub mm: u64,
    pub generation: u64,
    pub start: usize,
    pub end: usize,
    pub dev_base: u64,
    pub gap_start: usize,
    pub gap_end: usize,
}

impl Memo {
    /// A memo of cache `mm` at `generation` that answers nothing yet.
    pub const fn blank(mm: u64, generation: u64) -> Memo {
        Memo { mm, generation, start: usize::MAX, end: 0, dev_base: 0, gap_start: usize::MAX, gap_end: 0 }
    }
}

const _: () = assert!(size_of::<Memo>() == 64, "one cache line");

thread_local! {
    static MEMO: Cell<Memo> = const {
        Cell::new(Memo { mm: 0, generation: 0, start: 0, end: 0, dev_base: 0, gap_start: 0, gap_end: 0 })
    };
}

/// This thread's memo (the empty one until its first translation).
#[inline(always)]
pub fn get() -> Memo {
    MEMO.with(Cell::get)
}

/// This thread's memo in place, not copied out (the unguarded post reads a few of its words;
/// copying the whole line out cost about 15 instructions more).
///
/// # Safety
/// Nothing may write this thread's memo ([`put`], or anything that translates a word through the
/// registration cache) while the reference is used, and the reference must not leave the thread.
#[inline(always)]
pub unsafe fn in_place<'a>() -> &'a Memo {
    let memo: *const Memo = MEMO.with(Cell::as_ptr);
    // SAFETY: the cell is this thread's and lives as long as the thread (a `const` thread-local
    // without a destructor); the caller promises that nothing writes it meanwhile.
    unsafe { &*memo }
}

/// Remembers `m` for this thread.
#[inline]
pub fn put(m: Memo) {
    MEMO.with(|c| c.set(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_starts_empty_and_keeps_its_own() {
        let m = Memo { start: 0x1000, end: 0x1fff, dev_base: 0x7000, ..Memo::blank(9, 1) };
        put(m);
        let there = std::thread::spawn(|| {
            let first = get();
            put(Memo { mm: 3, ..first });
            first
        })
        .join()
        .unwrap();
        assert_eq!(there, Memo { start: 0, end: 0, gap_start: 0, ..Memo::blank(0, 0) }, "a new thread's memo is empty");
        assert_eq!(get(), m, "and another thread's put does not reach this one");
    }
}
