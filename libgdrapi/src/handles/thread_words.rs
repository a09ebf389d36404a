//! The copy path's per-thread words, reached in two instructions: the handle this thread's grace
//! line names ([`super::grace`]), the line's announcement word, and the handle region as this
//! thread last saw it ([`super::registry`]).
//!
//! A leaf: the words hold the line as a pointer to its announcement word, not to `grace`'s line
//! type, so that only `grace` knows the word is the first field of its line.
//!
//! Why the named handle is kept here too: a thread that copies through the same handle again
//! (the common case) finds with one compare against its own block that the handle is valid (it
//! was when it was stored, and slots are never returned) and already announced, without the
//! handle check against the region's bounds or the two dependent loads of the line and its word.
//!
//! Why the handle region is kept per thread: with its base and slot count here, next to the line
//! pointer, the fast path validates a handle and learns that the thread has a line with one
//! compare against words it already reached, instead of two loads of the region's globals plus a
//! test of the line pointer. The count here is 0 until the thread has a line and again once its
//! line is given back, so "no line" fails the same compare as "not a handle". A copy through a
//! handle allocated after the thread last looked takes the general path once, which refreshes
//! the words (the region's count only grows, so a stale count is only ever too small).
//!
//! Only the owning thread reads or writes these words (the grace period's writer reads the lines
//! they point to, never the words), so they are plain cells.
//!
//! The block is reached with the initial-exec TLS model on x86-64 Linux (two instructions, no
//! `__tls_get_addr`): `gpudirect_common::tls` says why and what it costs
//! (docs/decisions/0004-initial-exec-tls.md).

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;

/// One thread's copy-path words.
#[repr(C)]
pub(crate) struct ThreadWords {
    /// A handle that the fast copy path validated ([`super::registry::Mirror::known_to`]) and then
    /// stored in this thread's line, while the line still names it; 0 otherwise. Whatever else
    /// writes the line ([`super::grace::announce`], the line's release) sets 0 first, so a
    /// non-zero value always equals the line's word.
    pub(crate) named: Cell<usize>,
    /// The announcement word of this thread's grace line ([`super::grace`]), null until its
    /// first copy.
    pub(crate) line: Cell<*const AtomicUsize>,
    /// The handle region's base as this thread last saw it.
    pub(crate) handles_base: Cell<usize>,
    /// The handle region's slot count as this thread last saw it, while the thread has a line;
    /// 0 otherwise. Never above the region's real count.
    pub(crate) handles_limit: Cell<usize>,
}

// Four words of the static TLS surplus (gpudirect_common::tls), no more.
const _: () = assert!(size_of::<ThreadWords>() == 32 && align_of::<ThreadWords>() == 8);

// SAFETY: every field is a cell of a raw pointer or an integer: all-zero is no named handle, a
// null line and a zero base and count.
unsafe impl gpudirect_common::tls::ZeroValid for ThreadWords {}

gpudirect_common::initial_exec_block! {
    /// This thread's words (the reference is `!Send`: the cells make `ThreadWords` `!Sync`).
    pub(crate) fn mine() -> &'static ThreadWords = "__gdrapi_thread_words";
}

impl ThreadWords {
    /// The announcement word of this thread's line. Storing a key there (with release ordering)
    /// announces a copy only while readers need no fence (`membarrier` works); the caller checks
    /// that first (the public copy path does, through its handle's mirror). The key may stay
    /// there after the copy.
    ///
    /// # Safety
    /// The thread has a line (`line` is not null). The fast path knows without a test: its
    /// handle check fails while the thread has no line, because the thread's handle count is 0
    /// then.
    #[inline(always)]
    pub(crate) unsafe fn word(&self) -> &'static AtomicUsize {
        // SAFETY: a non-null `line` points into a grace line, and lines are leaked, so it stays
        // valid for the life of the process.
        unsafe { &*self.line.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::mine;

    #[test]
    fn each_thread_has_its_own_zeroed_words() {
        let here = mine() as *const _ as usize;
        mine().handles_base.set(0x1234);
        let (there, base) =
            std::thread::spawn(|| (mine() as *const _ as usize, mine().handles_base.get())).join().unwrap();
        assert_ne!(here, there);
        assert_eq!(base, 0, "a new thread starts with zeroed words");
        assert_eq!(mine().handles_base.get(), 0x1234, "and does not see this thread's");
        mine().handles_base.set(0);
    }
}
