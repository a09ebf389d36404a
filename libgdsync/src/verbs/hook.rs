//! The `ibv_poll_cq` hook. `ibv_poll_cq` is an inline call through `ctx->ops.poll_cq`, so a
//! provider that must see the application's polls of its CQs (to hold back completions whose
//! stream wait has not run, or to serve a software queue) replaces that slot in the context. The
//! hook asks each provider in turn (through [`Claim`] functions the provider seam registers, so
//! this module never imports a provider) and hands every other CQ to the original function.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
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

fn hooks() -> &'static Mutex<HashMap<usize, usize>> {
    static M: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Installed in `ctx->ops.poll_cq` of every context that has a proxy QP.
///
/// # Safety
/// Called by `ibv_poll_cq` with a live CQ of that context and room for `n` completions.
unsafe extern "C" fn poll_hook(cq: *mut c_void, n: c_int, wc: *mut Wc) -> c_int {
    gpudirect_common::boundary::guard(
        -libc::EIO,
        |m| gds_err!("ibv_poll_cq", "internal error (panic): {m}"),
        || {
            for claim in CLAIMS.get().map_or(&[][..], |c| &c[..]) {
                if let Some(r) = claim(cq, n, wc) {
                    return r;
                }
            }
            // SAFETY: live CQ per the contract.
            let ctx = unsafe { verbs::object_context(cq) };
            let orig = lock(hooks()).get(&(ctx as usize)).copied();
            match orig {
                // SAFETY: the context's original poll_cq, saved when the hook was installed.
                Some(f) => unsafe { std::mem::transmute::<usize, PollCqFn>(f)(cq, n, wc) },
                None => -libc::EINVAL,
            }
        },
    )
}

/// Installs the hook in `ctx` (once per context) and returns the original `poll_cq`.
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub(crate) unsafe fn install_hook(ctx: *mut c_void) -> Result<PollCqFn> {
    let mut h = lock(hooks());
    let hook = poll_hook as PollCqFn as usize;
    // SAFETY: live context per the contract.
    let cur = unsafe { verbs::context_op(ctx, verbs::OPS_POLL_CQ) };
    let orig = if cur == hook {
        h.get(&(ctx as usize)).copied().ok_or(Errno::EINVAL)?
    } else {
        // First QP on this context (or a new context at the address of a closed one).
        if cur == 0 {
            gds_err!("gds_create_qp", "the verbs context has no poll_cq");
            return Err(Errno::EINVAL);
        }
        h.insert(ctx as usize, cur);
        // SAFETY: live context; the hook has poll_cq's prototype.
        unsafe { verbs::set_context_op(ctx, verbs::OPS_POLL_CQ, hook) };
        cur
    };
    // SAFETY: a non-NULL poll_cq function of the provider.
    Ok(unsafe { std::mem::transmute::<usize, PollCqFn>(orig) })
}
