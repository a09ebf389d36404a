//! The `ibv_poll_cq` hook. `ibv_poll_cq` is an inline call through `ctx->ops.poll_cq`, so a
//! provider that must see the application's polls of its CQs (to hold back completions whose
//! stream wait has not run, or to serve a software queue) replaces that slot in the context.
//!
//! * Installed by the first QP of a context ([`install_hook`]), restored by the last one
//!   ([`release_hook`]) and, for contexts that still have QPs, when the library is unloaded
//!   (a `.fini_array` destructor): a context never keeps a pointer into an unloaded library.
//! * Foreign CQs (the application's own, on the same context) cost a few atomic loads on top of
//!   the original call: a lock-free set of our CQs ([`adopt_cq`]/[`forget_cq`]) and a lock-free
//!   table context → original function. No lock, no read-modify-write.
//! * Our CQs go to the providers through [`Claim`] functions the provider seam registers, so
//!   this module never imports a provider.
//! * In a forked child ([`crate::fork`]) every CQ goes to the original function, lock-free.
//!
//! Limits (README): at most [`CTX_SLOTS`] verbs contexts carry the hook at once; a context closed
//! while it still has gds QPs is a use-after-free in the application that the unload restore
//! would repeat, so QPs must be destroyed before their context is closed (as verbs requires).

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use super::ibv::{self as verbs, PollCqFn, Wc};
use crate::sync::lock;

/// A provider's `poll_cq` for the CQs it owns: `Some(return value)`, or `None` for a CQ it does
/// not know.
pub(crate) type Claim = fn(cq: *mut c_void, n: c_int, wc: *mut Wc) -> Option<c_int>;

static CLAIMS: OnceLock<&'static [Claim]> = OnceLock::new();

/// Sets the providers' claims (once; the provider seam does it before creating any QP).
pub(crate) fn set_claims(c: &'static [Claim]) {
    let _ = CLAIMS.set(c);
}

// ---------------------------------------------------------------------------------------------
// Lock-free tables (read by the hook), written under the WRITERS lock

/// How many verbs contexts can carry the hook at once.
pub(crate) const CTX_SLOTS: usize = 64;
/// Open-addressing set of our CQs; beyond that, every poll on a hooked context asks the providers.
const CQ_SLOTS: usize = 1024;
/// A removed entry (no CQ lives at address 1).
const TOMBSTONE: usize = 1;

/// context → original `poll_cq`. Entries are never cleared (a poll that entered the hook just
/// before the restore must still find the original); a slot is reused for the same address only.
struct Slot {
    ctx: AtomicUsize,
    orig: AtomicUsize,
}

static CTX_TABLE: [Slot; CTX_SLOTS] =
    [const { Slot { ctx: AtomicUsize::new(0), orig: AtomicUsize::new(0) } }; CTX_SLOTS];
static OUR_CQS: [AtomicUsize; CQ_SLOTS] = [const { AtomicUsize::new(0) }; CQ_SLOTS];
/// Our CQs that did not fit in [`OUR_CQS`] (normally 0).
static OVERFLOW: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
struct Writers {
    /// Hooked context → number of QPs using the hook.
    users: HashMap<usize, usize>,
    overflow: HashSet<usize>,
    /// Entries of [`OUR_CQS`] in use: when it drops to 0 the set is wiped, so tombstones left by
    /// QPs come and gone do not lengthen the foreign-CQ probe for ever.
    live: usize,
}

fn writers() -> &'static Mutex<Writers> {
    static W: OnceLock<Mutex<Writers>> = OnceLock::new();
    W.get_or_init(Mutex::default)
}

fn home(cq: usize) -> usize {
    (cq >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15) % CQ_SLOTS
}

/// Whether `cq` is one of the providers' CQs (lock-free).
fn is_ours(cq: usize) -> bool {
    if OVERFLOW.load(Ordering::Acquire) != 0 {
        return true; // some of ours are not in the set: let the providers decide
    }
    let h = home(cq);
    for i in 0..CQ_SLOTS {
        match OUR_CQS[(h + i) % CQ_SLOTS].load(Ordering::Acquire) {
            0 => return false,
            v if v == cq => return true,
            _ => {}
        }
    }
    false
}

/// Records `cq` as a provider's CQ (before the application can poll it).
pub(crate) fn adopt_cq(cq: *mut c_void) {
    let cq = cq as usize;
    let mut w = lock(writers());
    let h = home(cq);
    for i in 0..CQ_SLOTS {
        let s = &OUR_CQS[(h + i) % CQ_SLOTS];
        let v = s.load(Ordering::Relaxed);
        if v == 0 || v == TOMBSTONE {
            s.store(cq, Ordering::Release);
            w.live += 1;
            return;
        }
    }
    w.overflow.insert(cq);
    OVERFLOW.store(w.overflow.len(), Ordering::Release);
}

/// Forgets a CQ recorded by [`adopt_cq`] (when the provider destroys it).
pub(crate) fn forget_cq(cq: *mut c_void) {
    let cq = cq as usize;
    let mut w = lock(writers());
    if w.overflow.remove(&cq) {
        OVERFLOW.store(w.overflow.len(), Ordering::Release);
        return;
    }
    let h = home(cq);
    for i in 0..CQ_SLOTS {
        let s = &OUR_CQS[(h + i) % CQ_SLOTS];
        match s.load(Ordering::Relaxed) {
            0 => return,
            v if v == cq => {
                s.store(TOMBSTONE, Ordering::Release);
                w.live -= 1;
                if w.live == 0 {
                    OUR_CQS.iter().for_each(|s| s.store(0, Ordering::Release));
                }
                return;
            }
            _ => {}
        }
    }
}

fn original(ctx: usize) -> Option<usize> {
    CTX_TABLE
        .iter()
        .find(|s| s.ctx.load(Ordering::Acquire) == ctx)
        .map(|s| s.orig.load(Ordering::Acquire))
        .filter(|&f| f != 0)
}

/// Records `ctx → orig` (caller holds the writers lock).
fn record(ctx: usize, orig: usize) -> Result<()> {
    let slot = CTX_TABLE
        .iter()
        .find(|s| s.ctx.load(Ordering::Relaxed) == ctx)
        .or_else(|| CTX_TABLE.iter().find(|s| s.ctx.load(Ordering::Relaxed) == 0));
    let Some(s) = slot else {
        gds_err!("gds_create_qp", "more than {CTX_SLOTS} verbs contexts with gds QPs");
        return Err(Errno::ENOMEM);
    };
    s.orig.store(orig, Ordering::Release);
    s.ctx.store(ctx, Ordering::Release);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The hook

fn hook_addr() -> usize {
    poll_hook as PollCqFn as usize
}

/// Installed in `ctx->ops.poll_cq` of every context that has a gds QP.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ of that context and room for `n` completions.
unsafe extern "C" fn poll_hook(cq: *mut c_void, n: c_int, wc: *mut Wc) -> c_int {
    gpudirect_common::boundary::guard(
        -libc::EIO,
        |m| gds_err!("ibv_poll_cq", "internal error (panic): {m}"),
        || {
            if !crate::fork::in_child() && is_ours(cq as usize) {
                for claim in CLAIMS.get().map_or(&[][..], |c| &c[..]) {
                    if let Some(r) = claim(cq, n, wc) {
                        return r;
                    }
                }
            }
            // SAFETY: live CQ per the contract.
            let ctx = unsafe { verbs::object_context(cq) } as usize;
            match original(ctx) {
                // SAFETY: the context's original poll_cq, saved when the hook was installed.
                Some(f) => unsafe { std::mem::transmute::<usize, PollCqFn>(f)(cq, n, wc) },
                None => -libc::EINVAL,
            }
        },
    )
}

/// Installs the hook in `ctx` (first user) or counts one more user; returns the original
/// `poll_cq`. Every successful call is paired with one [`release_hook`].
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub(crate) unsafe fn install_hook(ctx: *mut c_void) -> Result<PollCqFn> {
    let mut w = lock(writers());
    let hook = hook_addr();
    // SAFETY: live context per the contract.
    let cur = unsafe { verbs::context_op(ctx, verbs::OPS_POLL_CQ) };
    let orig = if cur == hook {
        let orig = original(ctx as usize).ok_or(Errno::EINVAL)?;
        *w.users.entry(ctx as usize).or_insert(0) += 1;
        orig
    } else {
        // First QP on this context (or a new context at the address of a closed one).
        if cur == 0 {
            gds_err!("gds_create_qp", "the verbs context has no poll_cq");
            return Err(Errno::EINVAL);
        }
        record(ctx as usize, cur)?;
        w.users.insert(ctx as usize, 1);
        // SAFETY: live context; the hook has poll_cq's prototype.
        unsafe { verbs::set_context_op(ctx, verbs::OPS_POLL_CQ, hook) };
        cur
    };
    // SAFETY: a non-NULL poll_cq function of the provider.
    Ok(unsafe { std::mem::transmute::<usize, PollCqFn>(orig) })
}

/// One user of the hook in `ctx` is gone; the last one puts the original `poll_cq` back.
///
/// # Safety
/// `ctx` is a live context on which [`install_hook`] succeeded.
pub(crate) unsafe fn release_hook(ctx: *mut c_void) {
    let mut w = lock(writers());
    let Some(n) = w.users.get_mut(&(ctx as usize)) else { return };
    *n -= 1;
    if *n > 0 {
        return;
    }
    w.users.remove(&(ctx as usize));
    // SAFETY: live context per the contract.
    unsafe { restore(ctx as usize) };
}

/// Puts the original `poll_cq` back in `ctx` if our hook is still there (someone else may have
/// hooked the slot after us: then theirs stays).
///
/// # Safety
/// `ctx` is a live context.
unsafe fn restore(ctx: usize) {
    let Some(orig) = original(ctx) else { return };
    // SAFETY: live context per the contract.
    unsafe {
        if verbs::context_op(ctx as *mut c_void, verbs::OPS_POLL_CQ) == hook_addr() {
            verbs::set_context_op(ctx as *mut c_void, verbs::OPS_POLL_CQ, orig);
        }
    }
}

/// At unload (dlclose or exit): contexts that still have gds QPs get their `poll_cq` back, so
/// none keeps a pointer into unmapped code.
extern "C" fn restore_all_at_unload() {
    let _ = std::panic::catch_unwind(|| {
        // try_lock: at exit another thread may be stopped holding the lock; then leave it.
        let Ok(w) = writers().try_lock() else { return };
        for &ctx in w.users.keys() {
            // SAFETY: a context with live gds QPs is live (QPs must be destroyed before their
            // context is closed).
            unsafe { restore(ctx) };
        }
    });
}

// SAFETY: a function pointer with the signature the loader calls `.fini_array` entries with.
#[used]
#[unsafe(link_section = ".fini_array")]
static UNLOAD: extern "C" fn() = restore_all_at_unload;

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables are process-wide: the tests of this module take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// A fake `ibv_context` (only the ops slot is used) and CQs pointing at it.
    struct FakeCtx(Box<[usize; 128]>);

    /// The provider's `poll_cq` the hook chains to: counts the call, touches nothing.
    ///
    /// # Safety
    /// None beyond `PollCqFn`'s signature: no pointer is dereferenced.
    unsafe extern "C" fn orig_poll(_cq: *mut c_void, n: c_int, _wc: *mut Wc) -> c_int {
        1000 + n
    }

    fn claim_ours(cq: *mut c_void, n: c_int, _wc: *mut Wc) -> Option<c_int> {
        // The claim sees only CQs in the set: it answers for "ours" (odd marker) only.
        // SAFETY: test CQs are [usize; 2] arrays.
        let mark = unsafe { *(cq as *const usize).add(1) };
        (mark == 7).then_some(2000 + n)
    }

    #[test]
    fn install_count_restore_and_foreign_cqs() {
        let _t = lock(&SERIAL);
        set_claims(&[claim_ours]);
        let mut c = FakeCtx(Box::new([0usize; 128]));
        let ctx = c.0.as_mut_ptr() as *mut c_void;
        // SAFETY: the fake context is large enough for the ops slot.
        unsafe { verbs::set_context_op(ctx, verbs::OPS_POLL_CQ, orig_poll as PollCqFn as usize) };
        // SAFETY: live fake context.
        let o = unsafe { install_hook(ctx) }.unwrap();
        assert_eq!(o as usize, orig_poll as PollCqFn as usize);
        // SAFETY: as above.
        unsafe { install_hook(ctx) }.unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { verbs::context_op(ctx, verbs::OPS_POLL_CQ) }, hook_addr());
        let mut ours = [ctx as usize, 7];
        let mut foreign = [ctx as usize, 0];
        adopt_cq(ours.as_mut_ptr().cast());
        // SAFETY: the fake CQs start with the context pointer, as ibv_cq does.
        unsafe {
            assert_eq!(poll_hook(ours.as_mut_ptr().cast(), 3, std::ptr::null_mut()), 2003, "ours: the provider");
            assert_eq!(poll_hook(foreign.as_mut_ptr().cast(), 3, std::ptr::null_mut()), 1003, "foreign: original");
        }
        assert!(is_ours(ours.as_ptr() as usize) && !is_ours(foreign.as_ptr() as usize));
        forget_cq(ours.as_mut_ptr().cast());
        assert!(!is_ours(ours.as_ptr() as usize));
        // SAFETY: as above.
        unsafe {
            release_hook(ctx);
            assert_eq!(verbs::context_op(ctx, verbs::OPS_POLL_CQ), hook_addr(), "one user left");
            release_hook(ctx);
            assert_eq!(verbs::context_op(ctx, verbs::OPS_POLL_CQ), orig_poll as PollCqFn as usize, "restored");
            // A poll that entered the hook before the restore still reaches the original.
            assert_eq!(poll_hook(foreign.as_mut_ptr().cast(), 1, std::ptr::null_mut()), 1001);
        }
        // Restore leaves a slot someone else hooked after us alone.
        // SAFETY: as above.
        unsafe {
            install_hook(ctx).unwrap();
            verbs::set_context_op(ctx, verbs::OPS_POLL_CQ, 0x1234);
            release_hook(ctx);
            assert_eq!(verbs::context_op(ctx, verbs::OPS_POLL_CQ), 0x1234);
        }
    }

    #[test]
    fn our_cq_set_survives_tombstones_and_overflow() {
        let _t = lock(&SERIAL);
        let base = vec![0u64; 8 * (CQ_SLOTS + 8)];
        let addr = |i: usize| base.as_ptr() as usize + 64 * i;
        for i in 0..CQ_SLOTS + 4 {
            adopt_cq(addr(i) as *mut c_void);
        }
        assert!(OVERFLOW.load(Ordering::Relaxed) >= 4, "beyond the set: overflow");
        assert!(is_ours(addr(3)) && is_ours(0xdead_0000), "overflow: every CQ asks the providers");
        for i in 0..CQ_SLOTS + 4 {
            forget_cq(addr(i) as *mut c_void);
        }
        assert_eq!(OVERFLOW.load(Ordering::Relaxed), 0);
        assert!(!is_ours(addr(3)) && !is_ours(addr(CQ_SLOTS + 1)));
        assert!(OUR_CQS.iter().all(|s| s.load(Ordering::Relaxed) == 0), "wiped when the last CQ went");
        adopt_cq(addr(5) as *mut c_void);
        adopt_cq(addr(6) as *mut c_void);
        forget_cq(addr(5) as *mut c_void);
        assert!(is_ours(addr(6)) && !is_ours(addr(5)), "found past a tombstone");
        forget_cq(addr(6) as *mut c_void);
    }
}
