//! What a forked child may do with libgdsync: nothing. After `fork()` the child has none of the
//! parent's other threads (the proxy thread among them), any lock another thread held at that
//! moment stays locked forever, and CUDA contexts and verbs resources are not usable there. So a
//! `pthread_atfork` child handler marks the process, and from then on every exported function
//! fails at once with `EIO`, before touching any lock; the `ibv_poll_cq` hook passes foreign CQs
//! to their provider without taking locks and refuses ours. The handler is registered on the
//! first call into the library: a process that forks before using it has nothing to lose.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use gpudirect_common::{Errno, Result};

/// The two words every exported call tests, on one cache line of their own: after the
/// application's driver calls, a value post and its prepares pay one miss for them, not two.
#[repr(C, align(64))]
struct State {
    register: Once,
    in_child: AtomicBool,
}

static STATE: State = State { register: Once::new(), in_child: AtomicBool::new(false) };
static REPORTED: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    // Only an atomic store: this runs in the child before fork() returns.
    STATE.in_child.store(true, Ordering::Relaxed);
}

fn register() {
    // SAFETY: registers a child handler with no prepare/parent handlers; the handler only stores
    // to an atomic and stays valid for the life of the process (the library is never unloaded
    // while its functions can be called; an unloaded library's handler would be a dangling
    // pointer, which is why it is registered from a function of the library only once).
    let r = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    if r != 0 {
        gds_warn!("gds_init", "pthread_atfork failed ({r}): a forked child is not protected");
    }
}

/// Whether this process is a child forked after the library was used.
#[inline]
pub(crate) fn in_child() -> bool {
    STATE.in_child.load(Ordering::Relaxed)
}

/// Whether the fork handler is registered and this is not a forked child: what [`check`] lets
/// through, tested without a call. The prepare calls' unguarded fast path starts with it; on
/// false they take their guarded body, which calls [`check`].
#[inline]
pub(crate) fn settled() -> bool {
    STATE.register.is_completed() && !in_child()
}

/// The first thing every exported function does: `EIO` in a forked child (one line on stderr,
/// written without the logger's lock), otherwise makes sure the fork handler is registered.
#[inline]
pub(crate) fn check(origin: &str) -> Result<()> {
    STATE.register.call_once(register);
    if in_child() {
        report(origin);
        return Err(Errno::EIO);
    }
    Ok(())
}

#[cold]
fn report(origin: &str) {
    if REPORTED.swap(true, Ordering::Relaxed) {
        return;
    }
    let line = format!(
        "[{}] GDS ERR   {origin}() libgdsync cannot be used in a process forked after it was used (EIO)\n",
        std::process::id()
    );
    // SAFETY: writes the bytes of `line` to fd 2; no lock is taken (another thread of the
    // parent may have held the stderr lock at fork time).
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_gets_eio_and_the_parent_does_not() {
        assert_eq!(check("t"), Ok(()));
        // SAFETY: fork in a test process; the child only calls check() (atomics, a write(2))
        // and leaves with _exit, running no destructors and touching no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = check("t") == Err(Errno::EIO) && in_child();
            // SAFETY: see above.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        assert_eq!(check("t"), Ok(()), "the parent is unaffected");
    }
}
