//! Grace periods for the copy path: how `gdr_unmap`, `gdr_unpin_buffer` and `gdr_close` know that
//! no copy in another thread still touches a mapping before it is unmapped.
//!
//! Why this scheme (asymmetric hazard announcements with `membarrier(2)`): a copy is the library's
//! whole reason to exist and costs a few nanoseconds, so its path may take no lock, do no atomic
//! read-modify-write on a shared cache line and make no call into the kernel. Unmapping is rare and
//! costs a system call anyway. So the cost is moved to the unmapping side:
//! - every copying thread owns one cache line ([`Reader`]), found through a thread-local pointer
//!   ([`crate::thread_words`]);
//!   a copy stores the handle it works on there, reads the handle's state, copies, and stores 0.
//!   Plain stores and loads of the thread's own line: nothing shared is written;
//! - a thread that retracts a mapping first marks it gone in the handle's state, then runs
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every thread of the process pass a
//!   full memory barrier, and then waits until no reader line names the handle. After the barrier a
//!   copy either saw the mark (and gives up) or its announcement is visible (and is waited for);
//!   this is the asymmetric Dekker pattern behind liburcu's membarrier flavour.
//!
//! Where `membarrier` with private expedited commands is missing (kernels before 4.14, some
//! sandboxes), readers issue a full fence after announcing themselves instead; decided once, at the
//! first `gdr_open`, before any handle can exist.
//!
//! Epoch schemes were the alternative; they need the same per-thread line plus a global epoch
//! that the writer must advance and wait on, which buys nothing here since the writer already knows
//! the one key (the handle) it is waiting for. Reader counts in the handle would be a
//! read-modify-write of a shared line on every copy.
//!
//! Not async-signal-safe, like upstream: a copy from a signal handler interrupting a copy in the
//! same thread would overwrite that thread's announcement.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, compiler_fence, fence};
use std::time::Duration;

use crate::fastcopy;
use crate::thread_words;

/// One thread's announcement: the key (handle address) it is copying through, or 0.
#[repr(C, align(64))]
pub(crate) struct Reader {
    active: AtomicUsize,
    /// Whether a live thread owns this line; lines are recycled, never freed.
    claimed: AtomicBool,
    next: *const Reader,
}

// SAFETY: `next` is written once before the line is published and never changed; the other
// fields are atomics.
unsafe impl Sync for Reader {}

/// Every line ever made, newest first (pushed with a CAS, never removed).
static READERS: AtomicPtr<Reader> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `membarrier` cannot be used, so that readers fence after announcing themselves: one
/// of the conditions that also keep copies off the fast path, kept there as the one flag.
#[inline(always)]
fn readers_fence() -> bool {
    fastcopy::holds(fastcopy::Why::FencedReaders)
}

thread_local! {
    /// Gives the line back when the thread exits (touched only when the line is claimed).
    static RELEASE: Release = const { Release(Cell::new(std::ptr::null())) };
}

/// This thread's line, or null.
#[inline(always)]
fn mine() -> *const Reader {
    thread_words::mine().line.get()
}

fn set_mine(r: *const Reader) {
    thread_words::mine().line.set(r);
}

struct Release(Cell<*const Reader>);

impl Drop for Release {
    fn drop(&mut self) {
        let r = self.0.get();
        if !r.is_null() {
            // The fast path's handle check also stands for "this thread has a line": fail it first.
            thread_words::mine().handles_limit.set(0);
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
            fastcopy::require_general(fastcopy::Why::FencedReaders);
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
    let mut r = mine();
    if r.is_null() {
        r = claim();
    }
    // SAFETY: lines are leaked, so the pointer stays valid for the life of the process.
    let active = unsafe { &(*r).active };
    active.store(key, Ordering::Relaxed);
    if readers_fence() {
        fence(Ordering::SeqCst);
    } else {
        // The CPU may still order the store after the caller's next loads; the writer's membarrier
        // closes that window. The compiler must not, which is what this fence is for.
        compiler_fence(Ordering::SeqCst);
    }
    Announced(active)
}

/// The announcement word of `line`, this thread's line as [`crate::thread_words`] holds it.
/// Storing a key there announces a copy only while readers need no fence (`membarrier` works);
/// the caller checks that first (the public copy path does, through its handle's mirror).
///
/// # Safety
/// `line` is not null. (The fast path knows without a test: its handle check fails while the
/// thread has no line, because the thread's handle count is 0 then.)
#[inline(always)]
pub(crate) unsafe fn word_of(line: *const Reader) -> &'static AtomicUsize {
    // SAFETY: lines are leaked, so a non-null pointer stays valid for the life of the process.
    unsafe { &(*line).active }
}

/// Slow path of [`announce`]: gives this thread a line, recycling one of an exited thread.
#[cold]
#[inline(never)]
fn claim() -> *const Reader {
    let mut p = READERS.load(Ordering::Acquire).cast_const();
    let mut line = std::ptr::null();
    while !p.is_null() {
        // SAFETY: lines are leaked, so every pointer in the list stays valid.
        let r = unsafe { &*p };
        if r.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            line = p;
            break;
        }
        p = r.next;
    }
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

/// Waits until no copy that could have seen the state behind `key` before the caller changed it
/// is still running. The caller must have published the change (retracted the mapping) first.
pub(crate) fn synchronize(key: usize) {
    if !readers_fence() && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
        // Registered at init, so this cannot fail on a sane kernel; if it does, fall back for good
        // and still wait correctly below (readers that did not fence before now are covered by
        // the full fence here plus the spin, which sees their store once it drains).
        gdr_err!("membarrier failed ({}); copies will fence from now on", std::io::Error::last_os_error());
        fastcopy::require_general(fastcopy::Why::FencedReaders);
    }
    fence(Ordering::SeqCst);
    let mut p = READERS.load(Ordering::Acquire).cast_const();
    while !p.is_null() {
        // SAFETY: lines are leaked, so every pointer in the list stays valid.
        let r = unsafe { &*p };
        let mut spins = 0u32;
        while r.active.load(Ordering::Acquire) == key {
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        p = r.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_writer_waits_for_an_announced_reader() {
        init();
        let key = 0x1000usize;
        let done = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicBool::new(false));
        let (d, i) = (done.clone(), inside.clone());
        let t = std::thread::spawn(move || {
            let a = announce(key);
            i.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            d.store(1, Ordering::SeqCst);
            drop(a);
        });
        while !inside.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        synchronize(key);
        assert_eq!(done.load(Ordering::SeqCst), 1, "synchronize returned while a reader was inside");
        t.join().unwrap();
        // Another key is not waited for.
        let _a = announce(key + 64);
        synchronize(key);
    }

    #[test]
    fn lines_of_exited_threads_are_reused() {
        let count = || {
            let mut n = 0;
            let mut p = READERS.load(Ordering::Acquire).cast_const();
            while !p.is_null() {
                n += 1;
                // SAFETY: leaked lines.
                p = unsafe { (*p).next };
            }
            n
        };
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
