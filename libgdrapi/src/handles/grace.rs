//! Grace periods for the copy path: steps 1, 3 and 4 of the handle-lifetime protocol
//! ([`super`]), which let `gdr_unmap`, `gdr_unpin_buffer` and `gdr_close` know whether a copy in
//! another thread may still touch a mapping they are about to remove.
//!
//! Every copying thread owns one cache line ([`Reader`]), found through a thread-local pointer
//! to its announcement word ([`super::thread_words`]). A copy stores the handle it works on there
//! and reads the handle's state; only the owning thread writes its line, so a value in place is an
//! announcement it made before, and nothing shared is written on the copy path. The retracting
//! thread runs `membarrier` and looks at every line ([`retire`]), which answers with the way the
//! mapping leaves ([`Exit`]).
//!
//! Where `membarrier` with private expedited commands is missing (kernels before 4.14, some
//! sandboxes), readers issue a full fence after announcing themselves instead; decided once, at the
//! first `gdr_open`, before any handle can exist.
//!
//! Epoch schemes were the alternative; they need the same per-thread line plus a global epoch
//! that the writer must advance and wait on, which buys nothing here since the writer already knows
//! the one key (the handle) it is looking for. Reader counts in the handle would be a
//! read-modify-write of a shared line on every copy.
//!
//! Not async-signal-safe, like upstream: a copy from a signal handler interrupting a copy in the
//! same thread would overwrite that thread's announcement.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, compiler_fence, fence};

use super::thread_words;
use crate::conditions::{self, Why};

/// One thread's announcement: the key (handle address) it is copying or last copied through, or 0.
/// `active` comes first: the thread's words hold a line as a pointer to it ([`mine`]).
#[repr(C, align(64))]
struct Reader {
    active: AtomicUsize,
    /// Whether a live thread owns this line; lines are recycled, never freed.
    claimed: AtomicBool,
    next: *const Reader,
}

// SAFETY: `next` is written once before the line is published and never changed; the other
// fields are atomics.
unsafe impl Sync for Reader {}

const _: () = assert!(std::mem::offset_of!(Reader, active) == 0);

/// Every line ever made, newest first (pushed with a CAS, never removed).
static READERS: AtomicPtr<Reader> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `membarrier` cannot be used, so that readers fence after announcing themselves: one
/// of the conditions that also keep copies off the fast path, kept there as the one flag.
#[inline(always)]
fn readers_fence() -> bool {
    conditions::holds(Why::FencedReaders)
}

thread_local! {
    /// Gives the line back when the thread exits (touched only when the line is claimed).
    static RELEASE: Release = const { Release(Cell::new(std::ptr::null())) };
}

/// This thread's line, or null: the words hold its first field, `active`, at the same address.
#[inline(always)]
fn mine() -> *const Reader {
    thread_words::mine().line.get().cast::<Reader>()
}

fn set_mine(r: *const Reader) {
    thread_words::mine().line.set(r.cast::<AtomicUsize>());
}

struct Release(Cell<*const Reader>);

impl Drop for Release {
    fn drop(&mut self) {
        let r = self.0.get();
        if !r.is_null() {
            // The fast path's handle check also stands for "this thread has a line": fail it first,
            // and forget the handle the line named.
            let words = thread_words::mine();
            words.handles_limit.set(0);
            words.named.set(0);
            set_mine(std::ptr::null());
            // SAFETY: lines are leaked, so `r` stays valid for the life of the process.
            let r = unsafe { &*r };
            r.active.store(0, Ordering::Release);
            r.claimed.store(false, Ordering::Release);
        }
    }
}

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint) }
}

/// Decides, once per process, how readers and writers synchronise. Called by `gdr_open`.
pub(crate) fn init() {
    static DONE: OnceLock<bool> = OnceLock::new();
    DONE.get_or_init(|| {
        let supported = membarrier(MEMBARRIER_CMD_QUERY);
        let ok = supported >= 0
            && supported & libc::c_long::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
        if !ok {
            gdr_dbg!("membarrier(PRIVATE_EXPEDITED) unavailable: copies fence after announcing themselves");
            conditions::require_general(Why::FencedReaders);
        }
        ok
    });
}

/// An announced copy through `key`; dropping it ends the announcement.
pub(crate) struct Announced(&'static AtomicUsize);

impl Drop for Announced {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: every access of the copy happens before a waiting writer sees 0.
        self.0.store(0, Ordering::Release);
    }
}

/// Announces that this thread is about to read the state behind `key` and copy through it.
/// Everything read after this call is protected until the returned value is dropped.
#[inline(always)]
pub(crate) fn announce(key: usize) -> Announced {
    // The line is about to name `key` and then nothing: the fast path may no longer take it as
    // naming the handle it stored there last.
    thread_words::mine().named.set(0);
    let mut r = mine();
    if r.is_null() {
        r = claim();
    }
    // SAFETY: lines are leaked, so the pointer stays valid for the life of the process.
    let active = unsafe { &(*r).active };
    // Release: the accesses of this thread's earlier copies, which may have left their key here,
    // happen before a writer sees this one (see the module comment).
    active.store(key, Ordering::Release);
    if readers_fence() {
        fence(Ordering::SeqCst);
    } else {
        // The CPU may still order the store after the caller's next loads; the writer's membarrier
        // closes that window. The compiler must not, which is what this fence is for.
        compiler_fence(Ordering::SeqCst);
    }
    Announced(active)
}

/// Slow path of [`announce`]: gives this thread a line, recycling one of an exited thread.
#[cold]
#[inline(never)]
fn claim() -> *const Reader {
    let mut line = lines()
        .find(|r| r.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())
        .map_or(std::ptr::null(), |r| r as *const Reader);
    if line.is_null() {
        let head = READERS.load(Ordering::Acquire);
        let new =
            Box::leak(Box::new(Reader { active: AtomicUsize::new(0), claimed: AtomicBool::new(true), next: head }));
        let mut expected = head;
        while let Err(now) = READERS.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            new.next = now;
            expected = now;
        }
        line = new;
    }
    set_mine(line);
    // A thread that is exiting cannot register a destructor any more; its line then stays
    // claimed, which only costs one cache line of memory.
    let _ = RELEASE.try_with(|rel| rel.0.set(line));
    line
}

/// How a retracted mapping leaves the address space: what [`retire`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// No copy can be touching it: unmap it now.
    Now,
    /// A line names this handle (key): park the range until none does ([`super::parking`]).
    Parked(usize),
}

/// Whether a copy that could have seen the state behind `key` before the caller changed it may
/// still be touching what that state described: [`Exit::Now`] means none can,
/// [`Exit::Parked`] that some thread's line names `key` (a copy under way, or one that ended
/// without another since). The caller must have published the change (retracted the mapping)
/// first. Its own line does not count: it is not copying.
pub(crate) fn retire(key: usize) -> Exit {
    if !readers_fence() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
        // Registered at init, so this cannot fail on a sane kernel; if it does, fall back for good
        // and still answer correctly below (readers that did not fence before now are covered by
        // the full fence here: their announcement is either visible now or made after the mark).
        gdr_err!("membarrier failed ({}); copies will fence from now on", std::io::Error::last_os_error());
        conditions::require_general(Why::FencedReaders);
    }
    fence(Ordering::SeqCst);
    if named(key) { Exit::Parked(key) } else { Exit::Now }
}

/// Whether another thread's line names `key` now. Once a line shows another value, that thread's
/// accesses under `key` are over (its later store is a release store), so a key that was retired
/// with [`retire`] and is no longer named has no copy left; no barrier is needed for that.
pub(crate) fn named(key: usize) -> bool {
    other_lines().any(|r| r.active.load(Ordering::Acquire) == key)
}

/// In a child process right after `fork`: every line but this thread's belongs to a thread that
/// was not copied into the child, so it is cleared and given back.
pub(crate) fn forget_other_threads() {
    for r in other_lines() {
        r.active.store(0, Ordering::Relaxed);
        r.claimed.store(false, Ordering::Release);
    }
}

/// Every line ever made, newest first.
fn lines() -> impl Iterator<Item = &'static Reader> {
    let head = READERS.load(Ordering::Acquire).cast_const();
    // SAFETY: lines are leaked and their `next` never changes once published, so every pointer
    // in the list stays valid for the life of the process.
    let first = unsafe { head.as_ref() };
    std::iter::successors(first, |r| {
        // SAFETY: as above.
        unsafe { r.next.as_ref() }
    })
}

/// [`lines`] but this thread's own.
fn other_lines() -> impl Iterator<Item = &'static Reader> {
    let own = mine();
    lines().filter(move |r| !std::ptr::eq(*r, own))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_key_is_named_until_its_reader_moves_on() {
        init();
        let key = 0x1000usize;
        let (to_reader, reader_rx) = std::sync::mpsc::channel::<usize>();
        let (to_main, main_rx) = std::sync::mpsc::channel::<()>();
        // A reader that announces each key it is sent and leaves it there, as the fast path does.
        let t = std::thread::spawn(move || {
            for k in reader_rx {
                std::mem::forget(announce(k));
                to_main.send(()).unwrap();
            }
        });
        let step = |k: usize| {
            to_reader.send(k).unwrap();
            main_rx.recv().unwrap();
        };
        step(key);
        assert_eq!(retire(key), Exit::Parked(key), "a line names the key: the mapping may still be in use");
        assert_eq!(retire(key + 64), Exit::Now, "no line names another key");
        // The caller's own line never counts: it is not copying while it retires.
        std::mem::forget(announce(key + 128));
        assert_eq!(retire(key + 128), Exit::Now, "the retiring thread's own line counted");
        step(key + 64);
        assert!(!named(key), "the reader moved on, so nothing of the key is in use");
        assert!(named(key + 64));
        step(key);
        drop(to_reader);
        t.join().unwrap();
        // The exited thread's line was given back (cleared).
        assert!(!named(key), "an exited thread's line still names its last key");
    }

    #[test]
    fn lines_of_exited_threads_are_reused() {
        let count = || lines().count();
        for _ in 0..4 {
            std::thread::spawn(|| drop(announce(1))).join().unwrap();
        }
        let before = count();
        for _ in 0..16 {
            std::thread::spawn(|| drop(announce(1))).join().unwrap();
        }
        // Tests of other modules may claim a line or two meanwhile; without recycling this grows by 16.
        assert!(count() <= before + 2, "sequential threads should recycle lines ({before} -> {})", count());
    }
}
