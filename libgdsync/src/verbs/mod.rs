//! The verbs provider seam.
//!
//! The QP/CQ half of the API (gds_create_qp, gds_prepare_send, gds_prepare_wait_cq, ...) needs a
//! provider that builds mlx5 WQEs itself on rdma-core (or proxies sends through a CPU thread) and
//! describes the doorbell writes and CQE polls as peer operations. The C layer does everything
//! around it exactly as upstream does (argument checks, request initialisation, `curr_offset`
//! bookkeeping, CPU execution, rollback/abort on failure, stream submission); a provider only
//! implements the verbs-specific steps below, registering the memory its ops touch with
//! [`crate::engine::ranges::ranges`] (and [`crate::engine::memmgr::memmgr`] for GPU visibility).
//!
//! Providers: [`proxy`] (CPU proxy thread, any rdma-core device, the default) and [`mlx5`] (mlx5
//! direct, opt-in with `GDS_PROVIDER=mlx5`), behind [`Dispatch`]. Below both, never importing
//! them: [`provider`] (the trait they implement), [`exp`] (MOFED exp-verbs layouts), [`area`] (registered host pages), [`hook`] (the
//! `ibv_poll_cq` hook, which asks the providers through functions they register) and [`ibv`]
//! (libibverbs).

pub mod area;
pub mod exp;
pub mod hook;
pub mod ibv;
pub mod mlx5;
pub mod provider;
pub mod proxy;

use std::ffi::c_void;
use std::ptr::NonNull;

use gpudirect_common::Result;

use crate::abi::{GdsCq, GdsQp, SendRequest, WaitRequest};
pub use provider::Provider;

/// Which provider `GDS_PROVIDER` asks for (read once): unset, `auto` or `proxy` → the CPU proxy
/// for every device (mlx5 included); `mlx5` → the mlx5 direct provider ([`crate::verbs::mlx5`]),
/// opt-in because it has never run on an mlx5 NIC; anything else → `EINVAL` at `gds_create_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Proxy,
    Mlx5,
    Invalid,
}

pub fn parse_choice(v: Option<&str>) -> Choice {
    match v.map(str::trim) {
        None | Some("") | Some("auto") | Some("proxy") => Choice::Proxy,
        Some("mlx5") => Choice::Mlx5,
        Some(_) => Choice::Invalid,
    }
}

pub fn choice() -> Choice {
    static C: std::sync::OnceLock<Choice> = std::sync::OnceLock::new();
    *C.get_or_init(|| parse_choice(std::env::var("GDS_PROVIDER").ok().as_deref()))
}

/// Routes each call to the provider that owns the object: `gds_create_qp` by `GDS_PROVIDER`,
/// everything else by which provider's table holds the QP/CQ.
pub struct Dispatch;

use crate::verbs::mlx5 as m5;
use crate::verbs::proxy::Proxy;

impl Provider for Dispatch {
    unsafe fn create_qp(
        &self,
        pd: *mut c_void,
        context: *mut c_void,
        attr: *mut c_void,
        gpu_id: i32,
        flags: i32,
    ) -> Result<NonNull<GdsQp>> {
        // The poll_cq hook asks both providers about the CQs it sees (either may own some).
        hook::set_claims(&[proxy::poll_claim, m5::poll_claim]);
        match choice() {
            // SAFETY: forwarded contract.
            Choice::Proxy => unsafe { Proxy.create_qp(pd, context, attr, gpu_id, flags) },
            // SAFETY: forwarded contract.
            Choice::Mlx5 => unsafe { m5::create(pd, context, attr, flags) },
            Choice::Invalid => {
                gds_err!("gds_create_qp", "GDS_PROVIDER must be proxy, auto or mlx5");
                Err(gpudirect_common::Errno::EINVAL)
            }
        }
    }
    unsafe fn destroy_qp(&self, qp: NonNull<GdsQp>) -> Result<()> {
        if m5::owns_qp(qp) {
            return m5::destroy(qp);
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.destroy_qp(qp) }
    }
    unsafe fn post_recv(&self, qp: NonNull<GdsQp>, wr: *mut c_void, bad_wr: *mut *mut c_void) -> Result<()> {
        if m5::owns_qp(qp) {
            // SAFETY: forwarded contract.
            return unsafe { m5::post_recv(qp, wr, bad_wr) };
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.post_recv(qp, wr, bad_wr) }
    }
    unsafe fn prepare_send(
        &self,
        qp: NonNull<GdsQp>,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
    ) -> Result<()> {
        if m5::owns_qp(qp) {
            // SAFETY: forwarded contract.
            return unsafe { m5::prepare_send(qp, wr, bad_wr, request) };
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.prepare_send(qp, wr, bad_wr, request) }
    }
    unsafe fn rollback_send(&self, qp: NonNull<GdsQp>, rollback_id: u64) -> Result<()> {
        if m5::owns_qp(qp) {
            return m5::rollback(qp, rollback_id);
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.rollback_send(qp, rollback_id) }
    }
    unsafe fn prepare_wait(&self, cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()> {
        if m5::owns_cq(cq) {
            return m5::prepare_wait(cq, request);
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.prepare_wait(cq, request) }
    }
    fn after_cpu_send(&self, qp: NonNull<GdsQp>) {
        if m5::owns_qp(qp) {
            m5::after_cpu_send(qp);
        } else {
            Proxy.after_cpu_send(qp);
        }
    }
    unsafe fn abort_wait(&self, cq: NonNull<GdsCq>, peek_id: u64) -> Result<()> {
        if m5::owns_cq(cq) {
            return m5::abort_wait(cq, peek_id);
        }
        // SAFETY: forwarded contract.
        unsafe { Proxy.abort_wait(cq, peek_id) }
    }
}

/// The provider entry point the C layer calls.
pub fn provider() -> &'static dyn Provider {
    &Dispatch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_choice() {
        assert_eq!(parse_choice(None), Choice::Proxy);
        assert_eq!(parse_choice(Some("proxy")), Choice::Proxy);
        assert_eq!(parse_choice(Some("auto")), Choice::Proxy);
        assert_eq!(parse_choice(Some("mlx5")), Choice::Mlx5);
        assert_eq!(parse_choice(Some("rxe")), Choice::Invalid);
    }
}
