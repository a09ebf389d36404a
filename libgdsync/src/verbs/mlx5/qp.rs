//! QP creation and teardown for the mlx5 direct provider (rdma-core's `verbs.c` for it), the
//! table of its QPs, and the entry points the provider seam calls on a QP.
//!
//! The QP is made with `mlx5dv_create_qp` with scatter-to-CQE disabled (a stream waiting on a
//! CQE must find the data in the user buffer, not inside the CQE), in a parent domain over the
//! application's PD and a thread domain of its own, which gives it a doorbell/BlueFlame register
//! (UAR) not shared with CPU-posted QPs (libmlx5 guards a shared one with a lock the GPU cannot
//! take); where the device has no UAR left `ibv_alloc_td` fails and so does `gds_create_qp`.
//! Work requests: `num_sge` within the QP's `max_send_sge`, unknown `exp_create_flags` refused,
//! `wr_id`s kept for signaled WQEs only (an unsignaled one never completes).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::ranges::{Range, ranges};
use crate::sync::lock;
use crate::verbs::area::{Area, alloc_area, free_area};
use crate::verbs::exp::ExpQpInitAttr;
use crate::verbs::hook::{self, install_hook};
use crate::verbs::ibv::{self as verbs, PollCqFn, QpInitAttr, QpInitAttrEx, verbs};
use crate::verbs::mlx5::cq::{M5Cq, cqs};
use crate::verbs::mlx5::dv::{Cq, Sq};
use crate::verbs::mlx5::ffi::{
    Dv, DvCq, DvObj, DvQp, DvQpInitAttr, MLX5DV_OBJ_CQ, MLX5DV_OBJ_QP, MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
    MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS, RawMem, dv,
};
use crate::verbs::mlx5::sq::{SendCfg, SqState};

struct M5Qp {
    gds: usize,
    qp: usize,
    sq: Arc<Mutex<SqState>>,
    dbr_id: u64,
    bf_id: u64,
    send: Arc<M5Cq>,
    recv: Arc<M5Cq>,
    area: Area,
    sig_all: bool,
    rc: bool,
    /// `cap.max_send_sge` the QP was created with.
    max_send_sge: u32,
    /// Its thread domain + parent domain (freed after the QP).
    ded: Dedicated,
}

fn qps() -> &'static Mutex<HashMap<usize, Arc<M5Qp>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<M5Qp>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

pub fn owns_qp(qp: NonNull<GdsQp>) -> bool {
    lock(qps()).contains_key(&(qp.as_ptr() as usize))
}

fn register(ptr: usize, len: usize, ty: i32) -> Result<u64> {
    let dev = crate::engine::memmgr::memmgr().map_mem(crate::cuda::cuda()?, ptr, len, ty)?;
    Ok(ranges().register(Range { cpu: ptr, dev, len }))
}

impl M5Qp {
    /// # Safety
    /// As [`prepare_send`].
    unsafe fn prepare_send(&self, wr: *mut c_void, bad_wr: *mut *mut c_void, request: &mut SendRequest) -> Result<()> {
        const F: &str = "gds_prepare_send";
        if request.commit.entries < 3 {
            return Err(Errno(libc::ENOSPC));
        }
        if !self.rc {
            gds_err!(F, "the mlx5 direct provider builds RC/UC WQEs only");
            return Err(Errno::EINVAL);
        }
        // SAFETY: sq.buf, dbrec and bf.reg of this live QP are the only addresses used.
        let m = unsafe { RawMem::new() };
        let cfg =
            SendCfg { sig_all: self.sig_all, max_send_sge: self.max_send_sge, dbr_id: self.dbr_id, bf_id: self.bf_id };
        let qp = self.qp as *mut c_void;
        // SAFETY: this live QP.
        let mut state = || verbs().and_then(|v| unsafe { v.query_qp_state(qp) });
        // SAFETY: forwarded contract.
        unsafe { lock(&self.sq).prepare(&m, &cfg, wr, bad_wr, request, &mut state) }
    }

    /// After the CPU rang a prepared send (`gds_post_send`): the doorbell record now holds that
    /// ring, which makes a later reset recognisable (see [`Sq::check_dbrec`]).
    fn after_cpu_send(&self) {
        // SAFETY: only the doorbell record of this live QP is read.
        let m = unsafe { RawMem::new() };
        let _ = lock(&self.sq).sq.check_dbrec(&m);
    }
}

/// The QP's own doorbell/BlueFlame register: libmlx5 shares one UAR between the QPs of a context
/// and serialises CPU posts on it with a lock the GPU cannot take. A thread domain gets a UAR of
/// its own, and a QP made in a parent domain over (the application's PD, that TD) uses it: the
/// rdma-core way to a dedicated UAR. A device with no UAR left fails `ibv_alloc_td`: then
/// `gds_create_qp` fails with that errno (and a line saying so) rather than share the register.
#[derive(Clone, Copy)]
struct Dedicated {
    td: usize,
    pd: usize,
}

impl Dedicated {
    /// # Safety
    /// `ctx` and `pd` are live.
    unsafe fn alloc(ctx: *mut c_void, pd: *mut c_void) -> Result<Dedicated> {
        const F: &str = "gds_create_qp";
        // SAFETY: live context.
        let td = unsafe { verbs::alloc_td(ctx) }.inspect_err(|e| {
            gds_err!(
                F,
                "ibv_alloc_td failed ({}): no doorbell register of its own for a stream-driven QP (the device may have none left); not sharing one",
                e.describe()
            )
        })?;
        // SAFETY: live context, PD and TD.
        match unsafe { verbs::alloc_parent_domain(ctx, pd, td) } {
            Ok(p) => Ok(Dedicated { td: td as usize, pd: p as usize }),
            Err(e) => {
                gds_err!(F, "ibv_alloc_parent_domain failed: {}", e.describe());
                // SAFETY: allocated above, unused.
                let _ = unsafe { verbs::dealloc_td(ctx, td) };
                Err(e)
            }
        }
    }

    /// # Safety
    /// No QP uses the parent domain any more.
    unsafe fn free(&self, v: &verbs::Verbs, ctx: *mut c_void) {
        // SAFETY: per the contract; the PD before the TD it refers to.
        unsafe {
            if let Err(e) = v.dealloc_pd(self.pd as *mut c_void) {
                gds_warn!("gds_destroy_qp", "ibv_dealloc_pd (parent domain) failed: {}", e.describe());
            }
            if let Err(e) = verbs::dealloc_td(ctx, self.td as *mut c_void) {
                gds_warn!("gds_destroy_qp", "dealloc_td failed: {}", e.describe());
            }
        }
    }
}

/// `mlx5dv_create_qp` in the parent domain `pdom`, scatter-to-CQE off; `ia.cap` gets the actual
/// capabilities, as `ibv_create_qp` would write them.
///
/// # Safety
/// `ctx`, `pdom` and the CQs in `ia` are live.
unsafe fn create_dv_qp(d: &Dv, ctx: *mut c_void, pdom: *mut c_void, ia: &mut QpInitAttr) -> Result<*mut c_void> {
    let mut ex = QpInitAttrEx {
        qp_context: ia.qp_context,
        send_cq: ia.send_cq,
        recv_cq: ia.recv_cq,
        srq: ia.srq,
        cap: ia.cap,
        qp_type: ia.qp_type,
        sq_sig_all: ia.sq_sig_all,
        comp_mask: verbs::QP_INIT_ATTR_PD,
        pd: pdom,
        xrcd: std::ptr::null_mut(),
        create_flags: 0,
        max_tso_header: 0,
        rwq_ind_tbl: std::ptr::null_mut(),
        rx_hash_conf: [0; 3],
        source_qpn: 0,
        send_ops_flags: 0,
    };
    let mut dva = DvQpInitAttr {
        comp_mask: MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags: MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
        ..Default::default()
    };
    // SAFETY: live objects per the contract; both attribute structs have rdma-core's layouts
    // (tests below and compat-tests/gdsync/verbs_layout.c).
    let qp = unsafe { (d.create_qp)(ctx, &mut ex, &mut dva) };
    if qp.is_null() {
        let e = Errno::last();
        gds_err!("gds_create_qp", "mlx5dv_create_qp failed: {}", e.describe());
        return Err(if e.0 == 0 { Errno::EINVAL } else { e });
    }
    ia.cap = ex.cap;
    Ok(qp)
}

/// # Safety
/// As `Provider::create_qp`; `ctx` belongs to an mlx5 device.
pub unsafe fn create(pd: *mut c_void, ctx: *mut c_void, attr: *mut c_void, flags: i32) -> Result<NonNull<GdsQp>> {
    const F: &str = "gds_create_qp";
    let v = verbs()?;
    let d = dv()?;
    // SAFETY: live context.
    let name = unsafe { verbs::device_name(ctx) };
    if !name.starts_with("mlx5") {
        gds_err!(F, "GDS_PROVIDER=mlx5 but the device is {name}");
        return Err(Errno(libc::ENODEV));
    }
    if flags & GDS_CREATE_QP_WQ_ON_GPU != 0 {
        gds_err!(F, "GDS_CREATE_QP_WQ_ON_GPU is not supported yet");
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL attributes per the contract.
    let a = unsafe { &mut *(attr as *mut ExpQpInitAttr) };
    crate::verbs::exp::check_create_flags(F, a)?;
    gds_warn_once!(F, "mlx5 direct provider: never validated on hardware (see docs/gdsync.md)");
    // SAFETY: live context.
    let scq = unsafe { v.create_cq(ctx, a.cap.max_send_wr.max(1) as c_int) }?;
    // SAFETY: live context.
    let rcq = match unsafe { v.create_cq(ctx, a.cap.max_recv_wr.max(1) as c_int) } {
        Ok(c) => c,
        Err(e) => {
            // SAFETY: created above.
            let _ = unsafe { v.destroy_cq(scq) };
            return Err(e);
        }
    };
    let mut ia = a.verbs_attr(scq, rcq);
    let destroy_cqs = || {
        // SAFETY: created above, unused.
        unsafe {
            let _ = v.destroy_cq(scq);
            let _ = v.destroy_cq(rcq);
        }
    };
    // SAFETY: live pd and context.
    let ded = match unsafe { Dedicated::alloc(ctx, pd) } {
        Ok(dd) => dd,
        Err(e) => {
            destroy_cqs();
            return Err(e);
        }
    };
    // SAFETY: live context, parent domain and CQs.
    let qp = match unsafe { create_dv_qp(d, ctx, ded.pd as *mut c_void, &mut ia) } {
        Ok(q) => q,
        Err(e) => {
            // SAFETY: allocated above, unused.
            unsafe { ded.free(v, ctx) };
            destroy_cqs();
            return Err(e);
        }
    };
    // SAFETY: live context.
    let r = unsafe { install_hook(ctx) }.and_then(|orig| {
        hook::adopt_cq(scq);
        hook::adopt_cq(rcq);
        // SAFETY: live objects; the out structs are ours and large enough.
        let r = unsafe { finish(v, d, pd, ctx, a, qp, scq, rcq, orig, &ia, ded) };
        if r.is_err() {
            hook::forget_cq(scq);
            hook::forget_cq(rcq);
            // SAFETY: installed just above on this live context.
            unsafe { hook::release_hook(ctx) };
        }
        r
    });
    if r.is_err() {
        // SAFETY: created above, not registered anywhere.
        unsafe {
            let _ = v.destroy_qp(qp);
            ded.free(v, ctx);
        }
        destroy_cqs();
    }
    r
}

/// # Safety
/// Live objects from `create`.
#[allow(clippy::too_many_arguments)]
unsafe fn finish(
    _v: &verbs::Verbs,
    d: &Dv,
    pd: *mut c_void,
    ctx: *mut c_void,
    a: &mut ExpQpInitAttr,
    qp: *mut c_void,
    scq: *mut c_void,
    rcq: *mut c_void,
    orig: PollCqFn,
    ia: &QpInitAttr,
    ded: Dedicated,
) -> Result<NonNull<GdsQp>> {
    const F: &str = "gds_create_qp";
    let (mut dq, mut dsc, mut drc) = (DvQp::default(), DvCq::default(), DvCq::default());
    let mut obj = DvObj { pairs: [[0; 2]; 7] };
    obj.pairs[0] = [qp as usize, &mut dq as *mut DvQp as usize];
    obj.pairs[1] = [scq as usize, &mut dsc as *mut DvCq as usize];
    // SAFETY: live QP/CQ; out structs of the documented sizes.
    let r = unsafe { (d.init_obj)(&mut obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) };
    obj.pairs[1] = [rcq as usize, &mut drc as *mut DvCq as usize];
    // SAFETY: as above.
    let r2 = unsafe { (d.init_obj)(&mut obj, MLX5DV_OBJ_CQ) };
    if r != 0 || r2 != 0 {
        gds_err!(F, "mlx5dv_init_obj failed ({r}, {r2})");
        return Err(Errno::EINVAL);
    }
    let max_inline = ia.cap.max_inline_data;
    // SAFETY: live QP.
    let qpn = unsafe { verbs::object_u32(qp, verbs::QP_NUM) };
    let sq = Sq::new(dq.sq_buf, dq.sq_wqe_cnt, dq.dbrec, dq.bf_reg, dq.bf_size, qpn, max_inline)?;
    let dbr_id = register(dq.dbrec, 8, GDS_MEMORY_HOST)?;
    let bf_id = register(dq.bf_reg, (2 * dq.bf_size as usize).max(8), GDS_MEMORY_IO)?;
    let make =
        |dc: &DvCq, raw: *mut c_void, area: &Area, off: usize, sqs: Option<Arc<Mutex<SqState>>>| -> Result<M5Cq> {
            let cq = Cq::new(dc.buf, dc.cqe_cnt, dc.cqe_size, dc.dbrec, false)?;
            let ring_id = register(dc.buf, (dc.cqe_cnt * dc.cqe_size) as usize, GDS_MEMORY_HOST)?;
            let busy_id = ranges().register(Range {
                cpu: area.cpu + off,
                dev: area.dev + off as u64,
                len: 4 * dc.cqe_cnt as usize,
            });
            Ok(M5Cq::new(raw as usize, orig, cq, ring_id, area.cpu + off, busy_id, sqs))
        };
    let undo = |ids: &[u64]| {
        for &i in ids {
            let _ = ranges().unregister(i);
        }
    };
    let area = alloc_area(4 * (dsc.cqe_cnt + drc.cqe_cnt) as usize).inspect_err(|_| undo(&[dbr_id, bf_id]))?;
    let sqs = Arc::new(Mutex::new(SqState::new(sq)));
    let cqs_made = make(&dsc, scq, &area, 0, Some(sqs.clone())).and_then(|s| {
        let r = make(&drc, rcq, &area, 4 * dsc.cqe_cnt as usize, None);
        if r.is_err() {
            undo(&[s.ring_id, s.busy_id]);
        }
        r.map(|r| (s, r))
    });
    let (send, recv) = match cqs_made {
        Ok((s, r)) => (Arc::new(s), Arc::new(r)),
        Err(e) => {
            undo(&[dbr_id, bf_id]);
            free_area(area);
            return Err(e);
        }
    };
    a.write_back(scq, rcq, pd, ia.cap);
    let gds = Box::into_raw(Box::new(GdsQp::new(qp, scq, rcq, ctx)));
    let q = Arc::new(M5Qp {
        gds: gds as usize,
        qp: qp as usize,
        sq: sqs,
        dbr_id,
        bf_id,
        send: send.clone(),
        recv: recv.clone(),
        area,
        sig_all: a.sq_sig_all != 0,
        max_send_sge: ia.cap.max_send_sge,
        ded,
        rc: a.qp_type == 2 || a.qp_type == 3,
    });
    {
        let mut c = lock(cqs());
        c.insert(scq as usize, send);
        c.insert(rcq as usize, recv);
    }
    lock(qps()).insert(gds as usize, q);
    // SAFETY: from Box::into_raw.
    Ok(unsafe { NonNull::new_unchecked(gds) })
}

pub fn destroy(qp: NonNull<GdsQp>) -> Result<()> {
    let q = lock(qps()).remove(&(qp.as_ptr() as usize)).ok_or(Errno::EINVAL)?;
    let v = verbs()?;
    for c in [&q.send, &q.recv] {
        lock(&c.inner).dead = true;
        lock(cqs()).remove(&c.cq);
        hook::forget_cq(c.cq as *mut c_void);
    }
    // SAFETY: the GdsQp made by finish (freed below); its context is live while its QP is.
    let ctx = unsafe { (*(q.gds as *const GdsQp)).dev_context };
    // SAFETY: as above.
    unsafe { hook::release_hook(ctx) };
    let mut last = Ok(());
    // SAFETY: live QP, removed from every table.
    if let Err(e) = unsafe { v.destroy_qp(q.qp as *mut c_void) } {
        last = Err(e);
    }
    for c in [&q.send, &q.recv] {
        // SAFETY: live CQ, dead under its lock.
        if let Err(e) = unsafe { v.destroy_cq(c.cq as *mut c_void) } {
            last = Err(e);
        }
        let _ = ranges().unregister(c.ring_id);
        let _ = ranges().unregister(c.busy_id);
    }
    // SAFETY: the QP is destroyed: nothing uses its parent domain any more.
    unsafe { q.ded.free(v, ctx) };
    let _ = ranges().unregister(q.dbr_id);
    let _ = ranges().unregister(q.bf_id);
    free_area(q.area);
    // SAFETY: from Box::into_raw in finish; removed from the table, freed once.
    drop(unsafe { Box::from_raw(q.gds as *mut GdsQp) });
    last
}

fn find_qp(qp: NonNull<GdsQp>) -> Result<Arc<M5Qp>> {
    lock(qps()).get(&(qp.as_ptr() as usize)).cloned().ok_or(Errno::EINVAL)
}

/// # Safety
/// `wr`/`bad` are the application's `ibv_post_recv` arguments.
pub unsafe fn post_recv(qp: NonNull<GdsQp>, wr: *mut c_void, bad: *mut *mut c_void) -> Result<()> {
    let q = find_qp(qp)?;
    // SAFETY: live QP; the application's list (receives stay libmlx5's).
    unsafe { verbs::post_recv(q.qp as *mut c_void, wr, bad) }
}

/// # Safety
/// `wr` is NULL or a valid `gds_send_wr` list; `bad` NULL or writable.
pub unsafe fn prepare_send(
    qp: NonNull<GdsQp>,
    wr: *mut c_void,
    bad: *mut *mut c_void,
    request: &mut SendRequest,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { find_qp(qp)?.prepare_send(wr, bad, request) }
}

pub fn rollback(qp: NonNull<GdsQp>, id: u64) -> Result<()> {
    let q = find_qp(qp)?;
    if !lock(&q.sq).rollback(id) {
        gds_warn!("gds_post_send", "rollback id {id:#x} does not match the send queue (reset since?): ignored");
    }
    Ok(())
}

pub fn after_cpu_send(qp: NonNull<GdsQp>) {
    if let Ok(q) = find_qp(qp) {
        q.after_cpu_send();
    }
}
