//! The copy path's per-thread words, reached in two instructions: this thread's grace line
//! ([`crate::grace`]) and the handle region as this thread last saw it ([`crate::registry`]).
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
//! Rust's `thread_local!` in a shared library uses the general-dynamic TLS model: a call to
//! `__tls_get_addr` (about ten instructions behind a PLT jump) on every access. TLS descriptors
//! (the "GNU2" dialect) are no better for a library that is dlopen'ed, as NCCL and UCX load this
//! one: glibc then resolves them dynamically, and since 2.39 that path saves and restores every
//! vector register (measured on the H100 machine, Ubuntu 24.04: 14 ns per copy against 10 ns with
//! the model used here). So on x86-64 Linux the block is declared in assembly and reached with the
//! initial-exec model: one load of its offset from the GOT and one add of the thread pointer. The
//! price is the `STATIC_TLS` flag: the 24 bytes come from the static TLS surplus glibc keeps for
//! exactly such libraries (`glibc.rtld.optional_static_tls`, 512 bytes by default); if a process
//! has used that up, `dlopen` fails with "cannot allocate memory in static TLS block" and the
//! tunable raises it (docs/performance.md).

use std::cell::Cell;

use crate::grace::Reader;

/// One thread's copy-path words (layout fixed: the x86-64 block below is declared by size).
#[repr(C)]
pub(crate) struct ThreadWords {
    /// This thread's grace line, null until its first copy.
    pub(crate) line: Cell<*const Reader>,
    /// The handle region's base as this thread last saw it.
    pub(crate) handles_base: Cell<usize>,
    /// The handle region's slot count as this thread last saw it, while the thread has a line;
    /// 0 otherwise. Never above the region's real count.
    pub(crate) handles_limit: Cell<usize>,
}

const _: () = assert!(size_of::<ThreadWords>() == 24 && align_of::<ThreadWords>() == 8);

/// This thread's words.
///
/// The reference is `!Send` (the cells make `ThreadWords` `!Sync`), so it cannot leave the thread;
/// the block has no destructor and lives until the thread's TLS is freed, after its TLS
/// destructors ran, so it is valid wherever this thread's code runs.
#[inline(always)]
pub(crate) fn mine() -> &'static ThreadWords {
    // SAFETY: see above; the pointer is this thread's block, aligned and zero-initialised (a
    // valid ThreadWords: null line, zero base and count).
    unsafe { &*imp::block() }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use super::ThreadWords;

    std::arch::global_asm!(
        // Global but hidden: visible to the other codegen units of this crate (debug builds split
        // it into many objects), never exported from the shared library; "__"-prefixed, the
        // implementation's namespace, so no C program's own name can collide with it in the
        // static archive.
        ".globl __gdrapi_thread_words",
        ".hidden __gdrapi_thread_words",
        ".pushsection .tbss,\"awT\",@nobits",
        ".balign 8",
        ".type __gdrapi_thread_words,@object",
        ".size __gdrapi_thread_words,24",
        "__gdrapi_thread_words:",
        ".zero 24",
        ".popsection",
    );

    /// The address of this thread's block.
    #[inline(always)]
    pub(super) fn block() -> *const ThreadWords {
        let addr: *const ThreadWords;
        // SAFETY: the x86-64 initial-exec TLS sequence: the GOT entry holds the block's offset
        // from the thread pointer, which `%fs:0` holds. Reads only the GOT and the TCB.
        unsafe {
            std::arch::asm!(
                "movq __gdrapi_thread_words@gottpoff(%rip), {a}",
                "addq %fs:0, {a}",
                a = out(reg) addr,
                options(att_syntax, nostack, pure, readonly, preserves_flags),
            );
        }
        addr
    }
}

/// Elsewhere, the standard thread-local (aarch64 uses TLS descriptors by default).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use super::ThreadWords;
    use std::cell::Cell;

    thread_local! {
        static MINE: ThreadWords = const {
            ThreadWords {
                line: Cell::new(std::ptr::null()),
                handles_base: Cell::new(0),
                handles_limit: Cell::new(0),
            }
        };
    }

    #[inline(always)]
    pub(super) fn block() -> *const ThreadWords {
        MINE.with(|w| w as *const ThreadWords)
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
