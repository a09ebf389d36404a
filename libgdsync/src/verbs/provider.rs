//! The trait every verbs provider implements, below the providers and their dispatcher
//! ([`super::Dispatch`]), so that a provider never imports the dispatcher's module.

use std::ffi::c_void;
use std::ptr::NonNull;

use gpudirect_common::Result;

use crate::abi::{GdsCq, GdsQp, SendRequest, WaitRequest};

/// Raw C objects are passed through untouched; the C layer has checked what it can.
pub trait Provider: Sync {
    /// Creates a QP with its two CQs for GPU `gpu_id`; `attr` is a `gds_qp_init_attr_t *` that the
    /// provider may update (upstream writes back `send_cq`, `recv_cq`, `pd`, `cap`, ...).
    ///
    /// # Safety
    /// `pd`, `context` and `attr` are non-NULL pointers from the application, valid for the call.
    unsafe fn create_qp(
        &self,
        pd: *mut c_void,
        context: *mut c_void,
        attr: *mut c_void,
        gpu_id: i32,
        flags: i32,
    ) -> Result<NonNull<GdsQp>>;

    /// Destroys a QP from `create_qp` and everything it owns.
    ///
    /// # Safety
    /// `qp` came from `create_qp` and is not used afterwards.
    unsafe fn destroy_qp(&self, qp: NonNull<GdsQp>) -> Result<()>;

    /// Posts receive work requests (`struct ibv_recv_wr *` list) on the CPU.
    ///
    /// # Safety
    /// `qp` came from `create_qp`; `wr`/`bad_wr` are the application's pointers.
    unsafe fn post_recv(&self, qp: NonNull<GdsQp>, wr: *mut c_void, bad_wr: *mut *mut c_void) -> Result<()>;

    /// Writes the WQEs of `wr` (`gds_send_wr *` list) without ringing the doorbell and fills
    /// `request` (already zeroed, `commit.entries` = capacity) with the ops that ring it for every
    /// WQE posted since the previous commit; sets `commit.entries` and `commit.rollback_id`.
    ///
    /// # Safety
    /// As `post_recv`.
    unsafe fn prepare_send(
        &self,
        qp: NonNull<GdsQp>,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
    ) -> Result<()>;

    /// Forgets the WQEs of a prepared send whose execution failed (`rollback_id` from the commit).
    ///
    /// # Safety
    /// `qp` came from `create_qp`.
    unsafe fn rollback_send(&self, qp: NonNull<GdsQp>, rollback_id: u64) -> Result<()>;

    /// Fills `request` (zeroed; `peek.entries`, `peek.whence`, `peek.offset` set) with the poll of
    /// CQE number `peek.offset` and the release of the CPU-side block on it; sets `peek.peek_id`.
    ///
    /// # Safety
    /// `cq` is one of the two CQs of a QP from `create_qp`.
    unsafe fn prepare_wait(&self, cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()>;

    /// Releases the CPU-side block of a prepared wait (`gds_post_wait_cq`, failure clean-up).
    ///
    /// # Safety
    /// As `prepare_wait`.
    unsafe fn abort_wait(&self, cq: NonNull<GdsCq>, peek_id: u64) -> Result<()>;

    /// Called after the CPU executed a prepared send (`gds_post_send`): a provider whose doorbell
    /// is not the NIC's (the proxy) posts it now, so the call returns with the send posted, as
    /// upstream's does; the mlx5 provider notes that its doorbell record now holds the ring (which
    /// makes a later QP reset recognisable). Default: nothing to do.
    fn after_cpu_send(&self, _qp: NonNull<GdsQp>) {}
}
