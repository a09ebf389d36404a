//! The CPU-proxy verbs provider: GPUDirect Async semantics on any rdma-core device (soft-RoCE
//! rxe, siw, non-mlx5 HCAs), with the GPU ringing a word in host memory instead of the NIC.
//!
//! * Send: `gds_prepare_send` checks and copies the work requests (inline payloads included)
//!   into a batch numbered `seq` (1, 2, ... per QP, mod 2^32) and returns two peer ops:
//!   `FENCE(write, from HCA, sys)` + `STORE_DWORD(seq → trigger word)`. When the stream (or the CPU
//!   in `gds_post_send`/`gds_post_descriptors`) executes them, the proxy thread sees the trigger
//!   word advance and posts every batch up to `seq` with `ibv_post_send`, in order: the trigger
//!   plays the SQ doorbell record of mlx5 ("ring up to this producer counter").
//! * Wait: each CQ has a completion counter word. The proxy thread moves completions from the
//!   real CQ into a software queue (absolute index 0, 1, ...) and stores the number moved into
//!   the counter. `gds_prepare_wait_cq` for CQE n returns `POLL_GEQ_DWORD(counter, n+1)` (cyclic
//!   GEQ, as CUDA's wait) + `STORE_DWORD(0 → busy flag)`; the busy flag is upstream's "peek
//!   entry": the application's `ibv_poll_cq` on the CQ (hooked, see below) does not return CQE
//!   n while a wait prepared for it has not run.
//! * `ibv_poll_cq` is an inline call through `ctx->ops.poll_cq`; the first QP created on a
//!   context installs the hook of [`crate::verbs::hook`] in that slot (the last one destroyed
//!   puts the original back). For CQs of this provider it serves the software queue.
//! * Triggers are checked against the QP's own window of prepared-but-unposted sends, and each
//!   QP numbers its sends from its own base (QPs 2^24 apart): a late stream write from a
//!   destroyed QP into a reused page is ignored instead of derailing the new QP.
//! * A panic in the proxy thread is contained: the thread stops, every stream wait prepared on a
//!   proxy CQ is released (its counter is set past every CQE a wait may name), `ibv_poll_cq` on
//!   proxy CQs returns an error and every later call on a proxy QP/CQ fails with `EIO`; one
//!   error line says so. Nothing hangs. (`GDS_TEST_PROXY_PANIC_AFTER=N` injects that panic after
//!   N posted batches, for the tests.)
//! * Error completions also advance the counter, so a stream wait never hangs on them (upstream's
//!   GEQ wait did); the application sees the status through `ibv_poll_cq`, as upstream. A batch
//!   that `ibv_post_send` refuses in the thread completes its signaled requests with
//!   `IBV_WC_LOC_QP_OP_ERR` (vendor_err = the errno) and an error line.
//!
//! Registered words live in page-aligned host memory registered with `cuMemHostRegister` through
//! [`crate::engine::memmgr`] and named by [`crate::engine::ranges`] ids. Pages of destroyed QPs are zeroed and
//! reused by later QPs (never freed: a stream may still hold writes to them; see the trigger window).
//!
//! Files: `wr` (work request checks and copies), `cq` (the software CQ, waits, the poll hook's
//! side, the failed state), `qp` (batches, triggers, posting), `thread` (the proxy thread); this
//! file creates and destroys QPs and answers the provider seam.

mod cq;
mod qp;
mod thread;
mod wr;

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::ranges::{Range, ranges};
use crate::sync::lock;
use crate::verbs::area::{alloc_area, free_area};
use crate::verbs::exp::*;
use crate::verbs::hook::{self, install_hook};
use crate::verbs::ibv::{self as verbs, verbs};
use crate::verbs::provider::Provider;
use crate::verbs::proxy::cq::{cqs, find_cq, make_cq};
use crate::verbs::proxy::qp::{ProxyQp, QpInner, find_qp, qps};

pub(crate) use cq::poll_claim;

pub struct Proxy;

impl Proxy {
    /// # Safety
    /// As [`Provider::create_qp`].
    unsafe fn create(
        &self,
        pd: *mut c_void,
        ctx: *mut c_void,
        attr: *mut c_void,
        flags: i32,
    ) -> Result<NonNull<GdsQp>> {
        const F: &str = "gds_create_qp";
        let v = verbs()?;
        // SAFETY: non-NULL gds_qp_init_attr_t (152 bytes) per the contract.
        let a = unsafe { &mut *(attr as *mut ExpQpInitAttr) };
        if flags & GDS_CREATE_QP_WQ_ON_GPU != 0 {
            gds_err!(F, "GDS_CREATE_QP_WQ_ON_GPU is not supported yet");
            return Err(Errno::EINVAL);
        }
        if flags & (GDS_CREATE_QP_TX_CQ_ON_GPU | GDS_CREATE_QP_RX_CQ_ON_GPU | GDS_CREATE_QP_WQ_DBREC_ON_GPU) != 0 {
            gds_warn_once!(F, "CQ/doorbell placement flags {flags:#x} have no effect with the CPU-proxy provider");
        }
        check_create_flags(F, a)?;
        if !thread::start() {
            return Err(Errno(libc::EAGAIN));
        }
        let ncq_s = a.cap.max_send_wr.max(1);
        let ncq_r = a.cap.max_recv_wr.max(1);
        // SAFETY: live context.
        let scq = unsafe { v.create_cq(ctx, ncq_s as c_int) }
            .inspect_err(|e| gds_err!(F, "ibv_create_cq (send) failed: {}", e.describe()))?;
        // SAFETY: live context.
        let rcq = match unsafe { v.create_cq(ctx, ncq_r as c_int) } {
            Ok(c) => c,
            Err(e) => {
                gds_err!(F, "ibv_create_cq (recv) failed: {}", e.describe());
                // SAFETY: created above, unused.
                let _ = unsafe { v.destroy_cq(scq) };
                return Err(e);
            }
        };
        let destroy_cqs = || {
            // SAFETY: created above, not used afterwards.
            unsafe {
                let _ = v.destroy_cq(scq);
                let _ = v.destroy_cq(rcq);
            }
        };
        let mut ia = a.verbs_attr(scq, rcq);
        // SAFETY: live pd; CQs created above.
        let qp = match unsafe { v.create_qp(pd, &mut ia) } {
            Ok(q) => q,
            Err(e) => {
                gds_err!(F, "ibv_create_qp failed: {}", e.describe());
                destroy_cqs();
                return Err(e);
            }
        };
        // SAFETY: live CQs.
        let (cqe_s, cqe_r) = unsafe { (verbs::object_u32(scq, verbs::CQ_CQE), verbs::object_u32(rcq, verbs::CQ_CQE)) };
        let np_s = (cqe_s.max(1) + 1).next_power_of_two();
        let np_r = (cqe_r.max(1) + 1).next_power_of_two();
        let area = match alloc_area(256 + 4 * (np_s + np_r) as usize) {
            Ok(a) => a,
            Err(e) => {
                gds_err!(F, "cannot register the proxy words with CUDA: {}", e.describe());
                // SAFETY: created above, unused.
                let _ = unsafe { v.destroy_qp(qp) };
                destroy_cqs();
                return Err(e);
            }
        };
        // SAFETY: live context per the contract.
        let orig = match unsafe { install_hook(ctx) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: created above, unused.
                let _ = unsafe { v.destroy_qp(qp) };
                destroy_cqs();
                free_area(area);
                return Err(e);
            }
        };
        hook::adopt_cq(scq);
        hook::adopt_cq(rcq);
        // SAFETY: live CQs; the area is ours.
        let (send, recv) = unsafe {
            (
                Arc::new(make_cq(scq, orig, &area, 64, 256, np_s, true)),
                Arc::new(make_cq(rcq, orig, &area, 128, 256 + 4 * np_s as usize, np_r, false)),
            )
        };
        let trig_id = ranges().register(Range { cpu: area.cpu, dev: area.dev, len: 4 });
        a.write_back(scq, rcq, pd, ia.cap);
        let gds = Box::into_raw(Box::new(GdsQp::new(qp, scq, rcq, ctx)));
        // SAFETY: live QP.
        let qp_num = unsafe { verbs::object_u32(qp, verbs::QP_NUM) };
        let pq = Arc::new(ProxyQp {
            gds: gds as usize,
            ctx: ctx as usize,
            qp: qp as usize,
            qp_num,
            send: send.clone(),
            recv: recv.clone(),
            trig: area.cpu,
            trig_id,
            area,
            cap: ia.cap,
            sig_all: a.sq_sig_all != 0,
            inner: Mutex::new(QpInner::new()),
        });
        {
            let mut c = lock(cqs());
            c.insert(scq as usize, send);
            c.insert(rcq as usize, recv);
        }
        lock(qps()).insert(gds as usize, pq);
        thread::wake();
        // SAFETY: live context.
        let dev = unsafe { verbs::device_name(ctx) };
        gds_dbg!(F, "QP {qp_num:#x} on {dev} (CPU-proxy provider), cap {:?}", ia.cap);
        // SAFETY: from Box::into_raw, non-NULL.
        Ok(unsafe { NonNull::new_unchecked(gds) })
    }

    fn destroy(&self, qp: NonNull<GdsQp>) -> Result<()> {
        const F: &str = "gds_destroy_qp";
        let pq = lock(qps()).remove(&(qp.as_ptr() as usize)).ok_or_else(|| {
            gds_err!(F, "QP {:p} was not created by gds_create_qp (or was destroyed)", qp.as_ptr());
            Errno::EINVAL
        })?;
        let v = verbs()?;
        {
            let mut g = lock(&pq.inner);
            g.dead = true;
            if !g.pending.is_empty() {
                gds_dbg!(F, "dropping {} prepared sends never triggered", g.pending.len());
            }
            g.pending.clear();
        }
        for c in [&pq.send, &pq.recv] {
            lock(&c.inner).dead = true;
            lock(cqs()).remove(&c.cq);
            hook::forget_cq(c.cq as *mut c_void);
        }
        // SAFETY: the QP's context is live (its QP still is); paired with create's install.
        unsafe { hook::release_hook(pq.ctx as *mut c_void) };
        let mut last = Ok(());
        // SAFETY: live QP; no thread uses it any more (dead under its lock).
        if let Err(e) = unsafe { v.destroy_qp(pq.qp as *mut c_void) } {
            gds_err!(F, "ibv_destroy_qp failed: {}", e.describe());
            last = Err(e);
        }
        for c in [&pq.send, &pq.recv] {
            // SAFETY: live CQ, dead under its lock (no drain/poll reaches it any more).
            if let Err(e) = unsafe { v.destroy_cq(c.cq as *mut c_void) } {
                gds_err!(F, "ibv_destroy_cq failed: {}", e.describe());
                last = Err(e);
            }
            let _ = ranges().unregister(c.counter_id);
            let _ = ranges().unregister(c.busy_id);
        }
        let _ = ranges().unregister(pq.trig_id);
        free_area(pq.area);
        // SAFETY: from Box::into_raw in create; removed from the table, so freed once.
        drop(unsafe { Box::from_raw(pq.gds as *mut GdsQp) });
        last
    }
}

impl Provider for Proxy {
    unsafe fn create_qp(
        &self,
        pd: *mut c_void,
        context: *mut c_void,
        attr: *mut c_void,
        _gpu_id: i32,
        flags: i32,
    ) -> Result<NonNull<GdsQp>> {
        // SAFETY: forwarded contract.
        unsafe { self.create(pd, context, attr, flags) }
    }
    unsafe fn destroy_qp(&self, qp: NonNull<GdsQp>) -> Result<()> {
        self.destroy(qp)
    }
    unsafe fn post_recv(&self, qp: NonNull<GdsQp>, wr: *mut c_void, bad_wr: *mut *mut c_void) -> Result<()> {
        let q = find_qp(qp)?;
        // SAFETY: live QP (in the table); the application's list.
        unsafe { verbs::post_recv(q.qp as *mut c_void, wr, bad_wr) }
    }
    unsafe fn prepare_send(
        &self,
        qp: NonNull<GdsQp>,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
    ) -> Result<()> {
        find_qp(qp)?.prepare_send(wr, bad_wr, request)?;
        if request.commit.entries != 0 {
            // A batch was queued: the thread posts it once the trigger word asks for it.
            thread::wake();
        }
        Ok(())
    }
    unsafe fn rollback_send(&self, qp: NonNull<GdsQp>, rollback_id: u64) -> Result<()> {
        find_qp(qp)?.rollback(rollback_id)
    }
    unsafe fn prepare_wait(&self, cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()> {
        find_cq(cq)?.prepare_wait(request)
    }
    unsafe fn abort_wait(&self, cq: NonNull<GdsCq>, peek_id: u64) -> Result<()> {
        find_cq(cq)?.abort_wait(peek_id)
    }
    fn after_cpu_send(&self, qp: NonNull<GdsQp>) {
        // The trigger word was just written by this thread: post in the caller, not later.
        if let Ok(q) = find_qp(qp) {
            q.service();
        }
    }
}
