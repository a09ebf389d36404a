//! The mlx5 direct provider (`GDS_PROVIDER=mlx5`, mlx5 devices only): QPs and CQs created with
//! plain rdma-core verbs, their rings described by `mlx5dv_init_obj` (libmlx5.so.1, dlopen), the
//! data path of [`crate::verbs::mlx5::dv`] on that memory (spec §7.4/§7.5):
//! * sends: the CPU writes WQEs into `sq.buf` at our own producer counter (rdma-core's
//!   `ibv_post_send` would ring the doorbell itself); the request's ops store the doorbell record
//!   and the first ctrl qword to the BlueFlame register (registered as I/O memory) from the stream;
//! * waits: poll of the CQE ownership word in `cq.buf` (registered host memory) + release of a
//!   busy flag; the CPU keeps polling with `ibv_poll_cq` (libmlx5 consumes the CQE: consumer index,
//!   doorbell record, scatter-to-CQE copies), through the same `ctx->ops.poll_cq` hook as the proxy,
//!   which holds back CQEs whose wait has not run, replaces send `wr_id`s from our own table
//!   (libmlx5's is filled only by its own post_send) and rewrites consumed `op_own` to 0xF0 so a
//!   later-lap GEQ wait cannot fire on a stale entry.
//!
//! The QP is made with `mlx5dv_create_qp` with scatter-to-CQE disabled (a stream waiting on a
//! CQE must find the data in the user buffer, not inside the CQE), in a parent domain over the
//! application's PD and a thread domain of its own, which gives it a doorbell/BlueFlame register
//! (UAR) not shared with CPU-posted QPs (libmlx5 guards a shared one with a lock the GPU cannot
//! take); where the device has no UAR left `ibv_alloc_td` fails and so does `gds_create_qp`.
//! Work requests: `num_sge` within the QP's `max_send_sge`, unknown `exp_create_flags` refused,
//! `wr_id`s kept for signaled WQEs only (an unsignaled one never completes).
//!
//! QP reset: the application drives the QP with plain `ibv_modify_qp`, which does not go through
//! the context's ops table, so it cannot be hooked. On RESET libmlx5 zeroes its indices and both
//! words of the doorbell record; we see that lazily, on our own post path: each prepare reads
//! `dbrec[1]` back ([`dv::Sq::check_dbrec`]; one 4-byte read, no call) and compares it with what
//! our rings can have left there. The last ring that reached the record carries a counter
//! between the last one seen there (or the completed tail) and the last commit; a 0 that none of
//! them stores is the reset. Then the send queue restarts at WQE 0, the WQEs in flight and their
//! `wr_id`s are dropped (they will never complete), and only then is the QP's state asked
//! (`ibv_query_qp`): while it is RESET or ERROR a prepare fails with `EINVAL` and an error line
//! (nothing upstream documents another errno; the state is asked again on each prepare until the
//! QP is usable). What stays invisible: a reset before any ring of ours was seen in the record or
//! completed (a 0 is then still a legitimate value; `gds_post_send` notes its ring at once), and a
//! reset where the last ring run may have stored 0 (its counter a multiple of 2^16). In the
//! second case with that ring the last one, the next WQE (index 0 in slot 0) is already where the
//! reset QP expects it; the dropped WQEs' `wr_id`s and in-flight entries then go with the first
//! completion after the reset (a send queue completes in order). Requests prepared before a reset
//! and executed by a stream after it are the application's error: they store stale counters into
//! the doorbell record (seen as a foreign value, reported once) and ring the device on stale
//! WQEs, but they only touch the registered record and BlueFlame register, and our own WQEs are
//! always written at the counter masked to the ring; a rollback id from before the reset is
//! ignored.
//!
//! CQ side of a reset: libmlx5 also removes the QP's unpolled CQEs from its CQs
//! (`mlx5_cq_clean`: the QP's entries dropped, the other QPs' moved up towards the producer end,
//! its consumer index moved past the freed entries and published in the CQ doorbell record,
//! `dbrec[0]`, big-endian 24 bits). Each CQ keeps libmlx5's index beside ours and follows the
//! record lazily, at each poll step and each wait prepare ([`dv::Cq::follow`]; one 4-byte read,
//! no call). It only moves through our hook (one CQE at a time, in step with ours) or by a clean,
//! so a move of at most a ring is a clean: the span between our index and libmlx5's is walked
//! without delivery (nothing of it is in libmlx5's queue any more), each entry once its stream
//! waits ran, as a CQE is held back, then made invalid (0xF0) unless the hardware already wrote
//! the next lap there; the other QPs' moved CQEs come after it, in order. Stream waits on removed
//! entries cannot be failed (a wait is a poll on the ring): they pass on the entry the clean left
//! in place (it keeps its lap's owner bit), so nothing hangs, and a line reports how many there
//! are; a new wait on a removed CQE fails with `EINVAL` (the offset stays claimed). A clean that
//! runs between the hook's look at a CQE and libmlx5's poll is seen after the poll (the record
//! then says which entry was polled): the skipped span's pending waits go to the stale list and
//! their entries keep their content. Still not followed: a wait prepared for a reset QP's WQE
//! that was in flight (its CQE never comes; the index is taken by the next completion on the
//! CQ), and a removed entry the hardware overwrites with the next lap (a ring's worth of newer
//! completions) before the stream reaches its wait. Only completions naming our QP number retire
//! our WQEs and get `wr_id`s from our table (another QP may share the CQ).
//!
//! Limits: RC/UC only (a UD WQE needs the mlx5 address vector of an AH), no `SEND_WITH_INV`/
//! `LOCAL_INV`/`TSO`, GEQ waits on even laps (NOR would need the ring's owner bits preset).
//! **Never run on hardware**: no mlx5 NIC is reachable from our test machines. The WQE/CQE logic is
//! unit-tested on synthetic rings (`mlx5dv`); this glue is compiled and reviewed only, which is why
//! it is opt-in and the default for every device is the CPU proxy.

pub mod dv;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;
use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::memops::PeerOp;
use crate::engine::ranges::{Range, ranges};
use crate::sync::lock;
use crate::verbs::area::{Area, alloc_area, free_area};
use crate::verbs::exp::{ExpQpInitAttr, ExpSendWr};
use crate::verbs::hook::{self, install_hook};
use crate::verbs::ibv::{self as verbs, PollCqFn, QpInitAttr, QpInitAttrEx, Sge, Wc, verbs};
use crate::verbs::mlx5::dv::{self as mlx5dv, Cq, Dbrec, Follow, Mem, Sq, Wqe};

/// `struct mlx5dv_qp` (96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DvQp {
    dbrec: usize,
    sq_buf: usize,
    sq_wqe_cnt: u32,
    sq_stride: u32,
    rq_buf: usize,
    rq_wqe_cnt: u32,
    rq_stride: u32,
    bf_reg: usize,
    bf_size: u32,
    pad: u32,
    comp_mask: u64,
    uar_mmap_offset: i64,
    tirn: u32,
    tisn: u32,
    rqn: u32,
    sqn: u32,
    tir_icm_addr: u64,
}

/// `struct mlx5dv_cq` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DvCq {
    buf: usize,
    dbrec: usize,
    cqe_cnt: u32,
    cqe_size: u32,
    cq_uar: usize,
    cqn: u32,
    pad: u32,
    comp_mask: u64,
}

/// `struct mlx5dv_obj` (7 in/out pairs).
#[repr(C)]
struct DvObj {
    pairs: [[usize; 2]; 7],
}

const MLX5DV_OBJ_QP: u64 = 1;
const MLX5DV_OBJ_CQ: u64 = 2;

type InitObjFn = unsafe extern "C" fn(*mut DvObj, u64) -> c_int;
type CreateQpFn = unsafe extern "C" fn(*mut c_void, *mut QpInitAttrEx, *mut DvQpInitAttr) -> *mut c_void;

/// `struct mlx5dv_qp_init_attr` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DvQpInitAttr {
    comp_mask: u64,
    create_flags: u32,
    pad: u32,
    dc_init_attr: [u64; 2],
    send_ops_flags: u64,
}

const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1;
/// Small receives and READ/atomic responses would otherwise land in the CQE itself and reach the
/// user buffer only when a CPU polls: a stream waiting on the CQE would then read stale data.
const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;

struct Dv {
    _lib: Library,
    init_obj: InitObjFn,
    create_qp: CreateQpFn,
}

fn dv() -> Result<&'static Dv> {
    static D: OnceLock<std::result::Result<Dv, String>> = OnceLock::new();
    let r = D.get_or_init(|| {
        let lib = Library::open("libmlx5.so.1")?;
        let p = lib.symbol(c"mlx5dv_init_obj").ok_or("libmlx5.so.1 lacks mlx5dv_init_obj")?;
        // SAFETY: rdma-core's `int mlx5dv_init_obj(struct mlx5dv_obj *, uint64_t)`.
        let init_obj = unsafe { as_fn::<InitObjFn>(p) };
        let p = lib.symbol(c"mlx5dv_create_qp").ok_or("libmlx5.so.1 lacks mlx5dv_create_qp")?;
        // SAFETY: rdma-core's `struct ibv_qp *mlx5dv_create_qp(struct ibv_context *,
        // struct ibv_qp_init_attr_ex *, struct mlx5dv_qp_init_attr *)`.
        let create_qp = unsafe { as_fn::<CreateQpFn>(p) };
        Ok(Dv { _lib: lib, init_obj, create_qp })
    });
    r.as_ref().map_err(|e| {
        gds_err!("gds_mlx5", "cannot use libmlx5: {e}");
        Errno::ENOSYS
    })
}

/// Real memory: the rings and registers the device shares with us.
struct RawMem(());

impl RawMem {
    /// # Safety
    /// Every address later passed to `write`/`read` must be mapped and writable/readable for
    /// the given length (rings and registers of live mlx5dv objects).
    unsafe fn new() -> RawMem {
        RawMem(())
    }
}

impl Mem for RawMem {
    fn write(&self, addr: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: RawMem::new's contract.
            unsafe { std::ptr::write_volatile((addr + i) as *mut u8, *b) };
        }
    }
    fn read(&self, addr: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: RawMem::new's contract.
            *b = unsafe { std::ptr::read_volatile((addr + i) as *const u8) };
        }
    }
}

struct CqInner {
    cq: Cq,
    peeks: HashMap<u32, Vec<u32>>,
    stale: Vec<u32>,
    free: Vec<u32>,
    dead: bool,
    /// libmlx5's consumer index was seen at a value no clean explains (reported once).
    foreign_said: bool,
}

struct M5Cq {
    cq: usize,
    orig_poll: PollCqFn,
    ring_id: u64,
    busy: usize,
    busy_id: u64,
    npeek: u32,
    /// The send queue this CQ completes, with its wqe index → wr_id table.
    sq: Option<Arc<Mutex<SqState>>>,
    inner: Mutex<CqInner>,
}

struct SqState {
    sq: Sq,
    wrids: HashMap<u16, u64>,
    /// A reset was seen and the QP not yet found out of RESET/ERR: its state is queried on every
    /// prepare until it is.
    recheck: bool,
    /// The doorbell record's foreign value was reported (once until it is ours again).
    foreign_said: bool,
}

/// What a prepare needs of the QP besides its send queue.
struct SendCfg {
    sig_all: bool,
    /// `cap.max_send_sge` the QP was created with.
    max_send_sge: u32,
    /// Range ids of the doorbell record and the BlueFlame register.
    dbr_id: u64,
    bf_id: u64,
}

impl SqState {
    fn new(sq: Sq) -> SqState {
        SqState { sq, wrids: HashMap::new(), recheck: false, foreign_said: false }
    }

    /// Keeps the `wr_id` of the WQE at `idx` for its CQE; only a signaled WQE gets one (an
    /// unsignaled one's entry would never be consumed). Returns whether it was kept.
    fn remember(&mut self, idx: u16, wr_id: u64, signaled: bool) -> bool {
        if signaled {
            self.wrids.insert(idx, wr_id);
        }
        signaled
    }

    /// A send CQE naming `wqe_counter`: its `wr_id`, and the WQEs up to it retired. The older
    /// WQEs retired with it had their own CQEs first (a send queue completes in order), so a
    /// `wr_id` still kept for one of them is stale (left by a reset we could not see): dropped.
    fn complete(&mut self, wqe_counter: u16) -> Option<u64> {
        let id = self.wrids.remove(&wqe_counter);
        if !self.wrids.is_empty() {
            let older: Vec<u16> =
                self.sq.inflight.iter().map(|&(st, _)| st as u16).take_while(|&st| st != wqe_counter).collect();
            for st in older {
                self.wrids.remove(&st);
            }
        }
        self.sq.complete(wqe_counter);
        id
    }

    /// rdma-core reset the QP: WQE index 0, nothing in flight, no `wr_id` kept.
    fn reset(&mut self) {
        self.sq.reset();
        self.wrids.clear();
    }

    /// [`Sq::rollback`] and the `wr_id`s of the WQEs it forgets; false for an id from before a
    /// reset (nothing done).
    fn rollback(&mut self, id: u64) -> bool {
        let to = id as u32;
        let pos: Vec<u16> = self
            .sq
            .inflight
            .iter()
            .filter(|&&(st, _)| (st.wrapping_sub(to) as i32) >= 0)
            .map(|&(st, _)| st as u16)
            .collect();
        if !self.sq.rollback(id) {
            return false;
        }
        for i in pos {
            self.wrids.remove(&i);
        }
        true
    }

    /// Before a post: notices that rdma-core reset the QP behind our back (plain
    /// `ibv_modify_qp` to RESET zeroes the doorbell record; see the module doc) and restarts
    /// the send queue at WQE 0. After a reset the QP's state is asked of `state`
    /// (`ibv_query_qp`; only then, never on the common path): a QP still in RESET or in ERROR
    /// takes no send (`EINVAL`, as nothing upstream documents another errno for it).
    fn check_reset(&mut self, m: &dyn Mem, state: &mut dyn FnMut() -> Result<u32>) -> Result<()> {
        const F: &str = "gds_prepare_send";
        let qpn = self.sq.qpn;
        match self.sq.check_dbrec(m) {
            Dbrec::Ours => self.foreign_said = false,
            Dbrec::Foreign(v) => {
                if !self.foreign_said {
                    self.foreign_said = true;
                    gds_warn!(
                        F,
                        "QP {qpn:#x}: the send doorbell record holds {v:#x}, which no ring of this library stores (ibv_post_send on the QP, or a ring left pending across a reset?); going on at WQE {:#x}",
                        self.sq.cur_post & 0xffff
                    );
                }
            }
            Dbrec::Reset => {
                gds_warn!(
                    F,
                    "QP {qpn:#x} was reset (send doorbell record back to 0, ours at {:#x}): restarting at WQE 0; {} WQEs in flight and {} wr_ids dropped (they will not complete)",
                    self.sq.committed & 0xffff,
                    self.sq.inflight.len(),
                    self.wrids.len()
                );
                self.reset();
                self.recheck = true;
            }
        }
        if self.recheck {
            match state() {
                Ok(st) if st == verbs::IBV_QPS_RESET || st == verbs::IBV_QPS_ERR => {
                    let name = if st == verbs::IBV_QPS_RESET { "RESET" } else { "ERROR" };
                    gds_err!(F, "QP {qpn:#x} is in the {name} state: send refused");
                    return Err(Errno::EINVAL);
                }
                Ok(_) => self.recheck = false,
                Err(e) => {
                    gds_warn!(F, "QP {qpn:#x}: ibv_query_qp failed after a reset ({}); going on", e.describe());
                    self.recheck = false;
                }
            }
        }
        Ok(())
    }

    /// `gds_prepare_send` on this send queue: the reset check, the WQEs of `wr` at the producer
    /// counter (all or nothing), and the commit's ops in `request`.
    ///
    /// # Safety
    /// `wr` is NULL or a valid `gds_send_wr` list; `bad_wr` NULL or writable.
    unsafe fn prepare(
        &mut self,
        m: &dyn Mem,
        cfg: &SendCfg,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
        state: &mut dyn FnMut() -> Result<u32>,
    ) -> Result<()> {
        const F: &str = "gds_prepare_send";
        self.check_reset(m, state)?;
        let s = self;
        let saved = (s.sq.cur_post, s.sq.last, s.sq.inflight.len());
        let mut added = Vec::new();
        let mut p = wr as *const ExpSendWr;
        let mut fail = None;
        while !p.is_null() {
            // SAFETY: a non-NULL element of the application's list.
            let e = unsafe { &*p };
            let (mut sg, mut buf) = (Vec::new(), Vec::new());
            // SAFETY: as above.
            let r = unsafe { to_wqe(e, cfg.sig_all, cfg.max_send_sge, &mut sg, &mut buf) }.map_err(|why| {
                gds_err!(F, "{why}");
                Errno::EINVAL
            });
            let idx = s.sq.cur_post as u16;
            let signaled = r.as_ref().is_ok_and(|w| w.signaled);
            match r.and_then(|w| s.sq.post(m, &w)) {
                Ok(_) => {
                    if s.remember(idx, e.wr_id, signaled) {
                        added.push(idx);
                    }
                }
                Err(er) => {
                    fail = Some((er, p));
                    break;
                }
            }
            p = e.next;
        }
        if let Some((er, at)) = fail {
            // All or nothing: forget the WQEs this call wrote.
            s.sq.cur_post = saved.0;
            s.sq.last = saved.1;
            s.sq.inflight.truncate(saved.2);
            for i in added {
                s.wrids.remove(&i);
            }
            if !bad_wr.is_null() {
                // SAFETY: the application's out pointer.
                unsafe { *bad_wr = at as *mut c_void };
            }
            return Err(er);
        }
        let Some((ops, rollback)) = s.sq.commit(m, cfg.dbr_id, cfg.bf_id, false) else {
            request.commit.entries = 0;
            return Ok(());
        };
        for (i, op) in ops.iter().enumerate() {
            let w = &mut request.wr[i];
            match *op {
                PeerOp::StoreDword { data, target, offset } => {
                    w.type_ = IBV_EXP_PEER_OP_STORE_DWORD;
                    w.wr.dword_va = DwordVa { data, target_id: target, offset };
                }
                PeerOp::Fence { flags } => {
                    w.type_ = IBV_EXP_PEER_OP_FENCE;
                    w.wr.fence_flags = flags;
                }
                PeerOp::StoreQword { data, target, offset } => {
                    w.type_ = IBV_EXP_PEER_OP_STORE_QWORD;
                    w.wr.qword_va = QwordVa { data, target_id: target, offset };
                }
                _ => return Err(Errno::EINVAL),
            }
        }
        request.wr[ops.len() - 1].next = std::ptr::null_mut();
        request.commit.entries = ops.len() as u32;
        request.commit.rollback_id = rollback;
        Ok(())
    }
}

fn is_busy(busy: usize, e: u32) -> bool {
    // SAFETY: e < npeek inside the CQ's live area.
    unsafe { std::ptr::read_volatile((busy + 4 * e as usize) as *const u32) != 0 }
}

fn set_busy(busy: usize, e: u32, v: u32) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    // SAFETY: e < npeek inside the CQ's live area.
    unsafe { std::ptr::write_volatile((busy + 4 * e as usize) as *mut u32, v) };
}

impl M5Cq {
    /// Follows libmlx5's consumer index ([`Cq::follow`]): after a QP reset's `mlx5_cq_clean`
    /// the removed span is walked without delivery (see the module doc). Logs each removal.
    fn follow(&self, m: &dyn Mem, g: &mut CqInner) {
        const F: &str = "gds_mlx5";
        match g.cq.follow(m) {
            Follow::Same => {}
            Follow::Moved(k) => {
                g.foreign_said = false;
                let busy = self.busy;
                let waits: usize = g
                    .peeks
                    .iter()
                    .filter(|&(&n, _)| g.cq.removed(n))
                    .map(|(_, es)| es.iter().filter(|&&e| is_busy(busy, e)).count())
                    .sum();
                gds_warn!(
                    F,
                    "CQ {:#x}: libmlx5 removed {k} unpolled CQEs (a QP on it was reset); following its consumer index to {:#x}: CQEs {:#x}..{:#x} are not delivered, {waits} pending stream waits on them pass on the entries left in the ring",
                    self.cq,
                    g.cq.lib_ci & 0xff_ffff,
                    g.cq.removed_from,
                    g.cq.lib_ci
                );
            }
            Follow::Foreign(v) => {
                if !g.foreign_said {
                    g.foreign_said = true;
                    gds_warn!(
                        F,
                        "CQ {:#x}: libmlx5's consumer index {v:#x} is not explained by its own polls or a clean (ours at {:#x}): ignored",
                        self.cq,
                        g.cq.lib_ci & 0xff_ffff
                    );
                }
            }
        }
    }

    /// The peek entries waiting on CQE `idx`: false (kept) while one of their stream waits has
    /// not run; else given back to the free list.
    fn take_peeks(&self, g: &mut CqInner, idx: u32) -> bool {
        if let Some(es) = g.peeks.get(&idx) {
            if es.iter().any(|&e| is_busy(self.busy, e)) {
                return false;
            }
            let es = g.peeks.remove(&idx).unwrap_or_default();
            g.free.extend(es);
        }
        true
    }

    fn poll(&self, n: c_int, out: *mut Wc) -> c_int {
        // SAFETY: the ring and doorbell record of a live CQ (dead CQs are skipped below).
        let m = unsafe { RawMem::new() };
        let mut g = lock(&self.inner);
        if g.dead {
            return 0;
        }
        let busy = self.busy;
        let mut i = 0;
        while i < g.stale.len() {
            if is_busy(busy, g.stale[i]) {
                i += 1;
            } else {
                let e = g.stale.swap_remove(i);
                g.free.push(e);
            }
        }
        let mut k = 0usize;
        while (k as c_int) < n {
            self.follow(&m, &mut g);
            let idx = g.cq.cons_index;
            let at = g.cq.buf + g.cq.cqe64(idx);
            if idx != g.cq.lib_ci {
                // Removed by libmlx5: nothing to deliver; walked past once its waits ran (held
                // until then, as a CQE is), then made invalid like a consumed entry unless the
                // hardware already wrote the next lap there.
                if !self.take_peeks(&mut g, idx) {
                    break;
                }
                if g.cq.of_lap(&m, idx) {
                    m.write(at + 63, &[mlx5dv::MLX5_CQE_INVALID << 4]);
                }
                g.cq.cons_index = idx.wrapping_add(1);
                continue;
            }
            let mut c = [0u8; 64];
            m.read(at, &mut c);
            let opcode = c[63] >> 4;
            if opcode == mlx5dv::MLX5_CQE_INVALID || (c[63] & 1 != 0) != (idx & g.cq.cqe_cnt != 0) {
                break;
            }
            if !self.take_peeks(&mut g, idx) {
                break;
            }
            // SAFETY: live CQ; one completion written at out + k (< n).
            let r = unsafe { (self.orig_poll)(self.cq as *mut c_void, 1, out.add(k)) };
            if r != 1 {
                if r < 0 && k == 0 {
                    return r;
                }
                break;
            }
            // libmlx5 polled the entry at its consumer index: `idx`, unless a QP reset cleaned
            // the CQ between our look and its poll (then the entry is further on).
            let d = g.cq.provider_ci(&m).wrapping_sub(idx) & 0xff_ffff;
            let got = if (2..=g.cq.cqe_cnt).contains(&d) { idx.wrapping_add(d - 1) } else { idx };
            if got != idx {
                gds_warn!(
                    "gds_mlx5",
                    "CQ {:#x}: libmlx5 removed CQEs while polling (a QP reset racing ibv_poll_cq); CQEs {idx:#x}..{got:#x} are not delivered, their pending stream waits pass on the entries left",
                    self.cq
                );
                g.cq.removed_from = idx;
                for j in 0..got.wrapping_sub(idx) {
                    let x = idx.wrapping_add(j);
                    if !self.take_peeks(&mut g, x) {
                        let es = g.peeks.remove(&x).unwrap_or_default();
                        g.stale.extend(es);
                    } else if g.cq.of_lap(&m, x) {
                        m.write(g.cq.buf + g.cq.cqe64(x) + 63, &[mlx5dv::MLX5_CQE_INVALID << 4]);
                    }
                }
                if !self.take_peeks(&mut g, got) {
                    let es = g.peeks.remove(&got).unwrap_or_default();
                    g.stale.extend(es);
                }
                m.read(g.cq.buf + g.cq.cqe64(got), &mut c);
            }
            let at = g.cq.buf + g.cq.cqe64(got);
            let wqe_counter = u16::from_be_bytes([c[60], c[61]]);
            let qpn = u32::from_be_bytes([c[56], c[57], c[58], c[59]]) & 0xff_ffff;
            if let Some(sq) = &self.sq {
                let mut s = lock(sq);
                // Only our QP's completions name our WQEs (another QP may share the CQ).
                if s.sq.qpn == qpn
                    && let Some(id) = s.complete(wqe_counter)
                {
                    // SAFETY: written by the poll above.
                    unsafe { (*out.add(k)).wr_id = id };
                }
            }
            // A consumed entry must not satisfy a later-lap GEQ wait (libmlx5 does not rewrite it).
            m.write(at + 63, &[mlx5dv::MLX5_CQE_INVALID << 4]);
            g.cq.cons_index = got.wrapping_add(1);
            g.cq.lib_ci = g.cq.cons_index;
            k += 1;
        }
        k as c_int
    }

    fn prepare_wait(&self, request: &mut WaitRequest) -> Result<()> {
        if request.peek.whence != IBV_EXP_PEER_PEEK_ABSOLUTE {
            return Err(Errno::EINVAL);
        }
        if request.peek.entries < 2 {
            return Err(Errno(libc::ENOSPC));
        }
        let n = request.peek.offset;
        let mut g = lock(&self.inner);
        // SAFETY: only the doorbell record of this live CQ is read.
        self.follow(&unsafe { RawMem::new() }, &mut g);
        if g.cq.removed(n) {
            gds_err!(
                "gds_prepare_wait_cq",
                "CQE {n} was removed by libmlx5 (a QP on the CQ was reset): no completion will come there"
            );
            return Err(Errno::EINVAL);
        }
        let (op, data, off) = g.cq.peek(n).inspect_err(|_| {
            gds_err!("gds_prepare_wait_cq", "CQE {n} is more than one CQ ring ahead of the consumer index");
        })?;
        let Some(e) = g.free.pop() else {
            gds_err!("gds_prepare_wait_cq", "no free peek entry: poll the CQ");
            return Err(Errno::ENOMEM);
        };
        set_busy(self.busy, e, 1);
        if (n.wrapping_sub(g.cq.cons_index) as i32) < 0 {
            g.stale.push(e);
        } else {
            g.peeks.entry(n).or_default().push(e);
        }
        request.wr[0].type_ = op;
        request.wr[0].wr.dword_va = DwordVa { data, target_id: self.ring_id, offset: off };
        request.wr[1].type_ = IBV_EXP_PEER_OP_STORE_DWORD;
        request.wr[1].wr.dword_va = DwordVa { data: 0, target_id: self.busy_id, offset: 4 * e as usize };
        request.wr[1].next = std::ptr::null_mut();
        request.peek.entries = 2;
        request.peek.peek_id = (0x6d6c_7835u64 << 32) | e as u64;
        Ok(())
    }

    fn abort_wait(&self, id: u64) -> Result<()> {
        let e = id & 0xffff_ffff;
        if id >> 32 != 0x6d6c_7835 || e >= self.npeek as u64 {
            gds_err!("gds_post_wait_cq", "invalid peek id {id:#x}");
            return Err(Errno::EINVAL);
        }
        set_busy(self.busy, e as u32, 0);
        Ok(())
    }
}

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

fn cqs() -> &'static Mutex<HashMap<usize, Arc<M5Cq>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<M5Cq>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The poll hook's entry for CQs of this provider.
/// The poll_cq hook's question ([`crate::verbs::hook::Claim`]).
pub(crate) fn poll_claim(cq: *mut c_void, n: c_int, wc: *mut Wc) -> Option<c_int> {
    poll_hooked(cq as usize, n, wc)
}

fn poll_hooked(cq: usize, n: c_int, wc: *mut Wc) -> Option<c_int> {
    let c = lock(cqs()).get(&cq).cloned()?;
    Some(c.poll(n, wc))
}

pub fn owns_qp(qp: NonNull<GdsQp>) -> bool {
    lock(qps()).contains_key(&(qp.as_ptr() as usize))
}

pub fn owns_cq(cq: NonNull<GdsCq>) -> bool {
    // SAFETY: a gds_cq from the application (C layer contract); only `cq` is read.
    let raw = unsafe { (*cq.as_ptr()).cq } as usize;
    lock(cqs()).contains_key(&raw)
}

fn register(ptr: usize, len: usize, ty: i32) -> Result<u64> {
    let dev = crate::engine::memmgr::memmgr().map_mem(crate::cuda::cuda()?, ptr, len, ty)?;
    Ok(ranges().register(Range { cpu: ptr, dev, len }))
}

/// One `gds_send_wr` as an mlx5 WQE description; inline payloads gathered into `buf`.
///
/// # Safety
/// As `proxy::translate_wr`.
unsafe fn to_wqe<'a>(
    e: &ExpSendWr,
    sig_all: bool,
    max_sge: u32,
    sges: &'a mut Vec<(u64, u32, u32)>,
    buf: &'a mut Vec<u8>,
) -> std::result::Result<Wqe<'a>, String> {
    if e.comp_mask != 0 || e.exp_send_flags & !0xf != 0 {
        return Err("unsupported comp_mask or send flags".into());
    }
    let opcode = match e.exp_opcode {
        0 => mlx5dv::MLX5_OPCODE_RDMA_WRITE,
        1 => mlx5dv::MLX5_OPCODE_RDMA_WRITE_IMM,
        2 => mlx5dv::MLX5_OPCODE_SEND,
        3 => mlx5dv::MLX5_OPCODE_SEND_IMM,
        4 => mlx5dv::MLX5_OPCODE_RDMA_READ,
        5 => mlx5dv::MLX5_OPCODE_ATOMIC_CS,
        6 => mlx5dv::MLX5_OPCODE_ATOMIC_FA,
        op => return Err(format!("opcode {op:#x} is not supported by the mlx5 direct provider")),
    };
    if e.num_sge < 0 || (e.num_sge > 0 && e.sg_list.is_null()) || e.num_sge > 16 {
        return Err(format!("bad scatter/gather list ({} entries)", e.num_sge));
    }
    // The QP was sized for max_send_sge data segments per WQE (inline data is bounded elsewhere).
    if e.exp_send_flags & 8 == 0 && e.num_sge as u32 > max_sge {
        return Err(format!("{} scatter/gather entries, the QP takes {max_sge}", e.num_sge));
    }
    let list: &[Sge] = if e.num_sge == 0 {
        &[]
    } else {
        // SAFETY: num_sge entries at sg_list (caller's contract).
        unsafe { std::slice::from_raw_parts(e.sg_list, e.num_sge as usize) }
    };
    sges.extend(list.iter().map(|s| (s.addr, s.length, s.lkey)));
    let inline = e.exp_send_flags & 8 != 0;
    if inline {
        for s in list {
            // SAFETY: an inline SGE names readable bytes (verbs contract).
            buf.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
            });
        }
    }
    let rdma = matches!(e.exp_opcode, 0 | 1 | 4 | 5 | 6);
    let atomic = match e.exp_opcode {
        5 => Some((e.wr[2], e.wr[1])),
        6 => Some((e.wr[1], 0)),
        _ => None,
    };
    let rkey = if atomic.is_some() { e.wr[3] as u32 } else { e.wr[1] as u32 };
    Ok(Wqe {
        opcode,
        signaled: sig_all || e.exp_send_flags & 2 != 0,
        solicited: e.exp_send_flags & 4 != 0,
        fence: e.exp_send_flags & 1 != 0,
        imm_be: e.imm_data,
        raddr: rdma.then_some((e.wr[0], rkey)),
        atomic,
        sges: if inline { &[] } else { sges.as_slice() },
        inline: if inline { Some(buf.as_slice()) } else { None },
    })
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
    let mut ia = QpInitAttr {
        qp_context: a.qp_context,
        send_cq: scq,
        recv_cq: rcq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
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
            Ok(M5Cq {
                cq: raw as usize,
                orig_poll: orig,
                ring_id,
                busy: area.cpu + off,
                busy_id,
                npeek: dc.cqe_cnt,
                sq: sqs,
                inner: Mutex::new(CqInner {
                    cq,
                    peeks: HashMap::new(),
                    stale: Vec::new(),
                    free: (0..dc.cqe_cnt).rev().collect(),
                    dead: false,
                    foreign_said: false,
                }),
            })
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
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.pd = pd;
    a.comp_mask |= 1 | (1 << 10);
    a.cap = ia.cap;
    let gds = Box::into_raw(Box::new(GdsQp {
        qp,
        send_cq: GdsCq { cq: scq, curr_offset: 0 },
        recv_cq: GdsCq { cq: rcq, curr_offset: 0 },
        res_domain: std::ptr::null_mut(),
        dev_context: ctx,
    }));
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

fn find_cq(cq: NonNull<GdsCq>) -> Result<Arc<M5Cq>> {
    // SAFETY: a gds_cq from the application; only `cq` is read.
    let raw = unsafe { (*cq.as_ptr()).cq } as usize;
    lock(cqs()).get(&raw).cloned().ok_or(Errno::EINVAL)
}

/// # Safety
/// `wr`/`bad` are the application's `ibv_post_recv` arguments.
pub unsafe fn post_recv(qp: NonNull<GdsQp>, wr: *mut c_void, bad: *mut *mut c_void) -> Result<()> {
    let q = find_qp(qp)?;
    // SAFETY: live QP; the application's list (receives stay libmlx5's).
    match unsafe { verbs::post_recv(q.qp as *mut c_void, wr, bad) } {
        0 => Ok(()),
        r if r < 0 => Err(Errno::last()),
        r => Err(Errno(r)),
    }
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

pub fn prepare_wait(cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()> {
    find_cq(cq)?.prepare_wait(request)
}

pub fn abort_wait(cq: NonNull<GdsCq>, id: u64) -> Result<()> {
    find_cq(cq)?.abort_wait(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn dv_layouts() {
        assert_eq!(std::mem::size_of::<DvQp>(), 96);
        assert_eq!(std::mem::offset_of!(DvQp, bf_reg), 40);
        assert_eq!(std::mem::offset_of!(DvQp, bf_size), 48);
        assert_eq!(std::mem::offset_of!(DvQp, comp_mask), 56);
        assert_eq!(std::mem::offset_of!(DvQp, tir_icm_addr), 88);
        assert_eq!(std::mem::size_of::<DvCq>(), 48);
        assert_eq!(std::mem::offset_of!(DvCq, cqe_cnt), 16);
        assert_eq!(std::mem::offset_of!(DvCq, cqn), 32);
        assert_eq!(std::mem::size_of::<DvObj>(), 112);
        assert_eq!(std::mem::size_of::<DvQpInitAttr>(), 40);
        assert_eq!(std::mem::offset_of!(DvQpInitAttr, create_flags), 8);
        assert_eq!(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, 8);
    }

    #[test]
    fn only_signaled_wqes_keep_a_wr_id() {
        let (buf, db, bf) = (vec![0u8; 4 * 64], [0u32; 2], vec![0u8; 512]);
        let sq = Sq::new(buf.as_ptr() as usize, 4, db.as_ptr() as usize, bf.as_ptr() as usize, 256, 7, 64).unwrap();
        let mut s = SqState::new(sq);
        // WQEs 0..4: unsignaled, unsignaled, signaled, unsignaled, signaled.
        let kept: Vec<bool> = [false, false, true, false, true]
            .iter()
            .enumerate()
            .map(|(i, &sig)| s.remember(i as u16, 100 + i as u64, sig))
            .collect();
        assert_eq!(kept, [false, false, true, false, true]);
        assert_eq!(s.wrids.len(), 2, "no entries for unsignaled WQEs");
        assert_eq!(s.complete(2), Some(102));
        assert_eq!(s.complete(4), Some(104));
        assert!(s.wrids.is_empty(), "nothing left behind once the signaled ones completed");
        assert_eq!(s.complete(3), None, "an unsignaled index has no wr_id");
    }

    /// A synthetic send queue of 4 WQEBBs in real memory (the provider's `RawMem` on it).
    struct Ring {
        buf: Vec<u8>,
        db: Box<[u32; 2]>,
        _bf: Vec<u8>,
        s: SqState,
    }

    const CFG: SendCfg = SendCfg { sig_all: false, max_send_sge: 1, dbr_id: 11, bf_id: 22 };
    const POISON: u8 = 0xa5;

    /// A ring whose counters all stand at `at`, everything before it rung and completed.
    fn ring_at(at: u32) -> Ring {
        let mut r = ring();
        r.s.sq.cur_post = at;
        r.s.sq.committed = at;
        r.s.sq.tail = at;
        r.s.sq.rung = at;
        r.db[1] = at.to_be();
        r
    }

    fn ring() -> Ring {
        let (buf, db, bf) = (vec![POISON; 4 * 64], Box::new([0u32; 2]), vec![0u8; 512]);
        let sq = Sq::new(buf.as_ptr() as usize, 4, db.as_ptr() as usize, bf.as_ptr() as usize, 256, 7, 64).unwrap();
        Ring { buf, db, _bf: bf, s: SqState::new(sq) }
    }

    fn mem() -> RawMem {
        // SAFETY: the tests only pass addresses inside a live `Ring`.
        unsafe { RawMem::new() }
    }

    /// Prepares one signaled SEND carrying `wr_id`; `state` answers the QP state query and
    /// counts its calls.
    fn prepare(r: &mut Ring, wr_id: u64, state: u32, queried: &mut u32) -> Result<Box<SendRequest>> {
        // SAFETY: all-zero is a valid ExpSendWr and a valid SendRequest.
        let (mut e, mut req): (ExpSendWr, Box<SendRequest>) =
            unsafe { (std::mem::zeroed(), Box::new(std::mem::zeroed())) };
        e.exp_opcode = 2;
        e.exp_send_flags = 2;
        e.wr_id = wr_id;
        let mut q = || {
            *queried += 1;
            Ok(state)
        };
        // SAFETY: a one-element list on the stack; the ring is live.
        unsafe {
            r.s.prepare(&mem(), &CFG, &mut e as *mut ExpSendWr as *mut c_void, std::ptr::null_mut(), &mut req, &mut q)
        }?;
        Ok(req)
    }

    /// What the request's first op stores into the doorbell record (host value of dbrec[1]).
    fn dbrec_store(req: &SendRequest) -> u32 {
        assert_eq!(req.commit.entries, 3);
        assert_eq!(req.wr[0].type_, IBV_EXP_PEER_OP_STORE_DWORD);
        // SAFETY: a STORE_DWORD op fills dword_va.
        let d = unsafe { req.wr[0].wr.dword_va };
        assert_eq!((d.target_id, d.offset), (11, 4), "dbrec[1]");
        u32::from_be_bytes(d.data.to_ne_bytes())
    }

    /// The stream (or CPU) executing the request's doorbell-record store.
    fn ring_it(r: &mut Ring, req: &SendRequest) {
        // SAFETY: a STORE_DWORD op fills dword_va.
        r.db[1] = unsafe { req.wr[0].wr.dword_va.data };
    }

    /// rdma-core's `ibv_modify_qp(RESET)` as seen from our memory: both doorbell words zeroed.
    fn provider_reset(r: &mut Ring) {
        r.db[0] = 0;
        r.db[1] = 0;
    }

    /// WQE index of the ctrl segment in ring slot `slot` (None: still poisoned).
    fn wqe_index(r: &Ring, slot: usize) -> Option<u32> {
        let c = &r.buf[slot * 64..slot * 64 + 4];
        (c != [POISON; 4]).then(|| u32::from_be_bytes(c.try_into().unwrap()) >> 8)
    }

    #[test]
    fn qp_reset_restarts_the_send_queue_at_wqe_0() {
        let mut r = ring();
        let mut queried = 0;
        for i in 0..3u64 {
            let req = prepare(&mut r, 100 + i, 3, &mut queried).unwrap();
            assert_eq!(dbrec_store(&req), i as u32 + 1);
            ring_it(&mut r, &req);
        }
        assert_eq!(r.s.wrids.len(), 3);
        r.db[0] = 5u32.to_be(); // receives posted by libmlx5
        provider_reset(&mut r);
        r.buf.fill(POISON);
        let req = prepare(&mut r, 200, 3, &mut queried).unwrap();
        assert_eq!(queried, 1, "the state is asked once, on the reset");
        assert_eq!(wqe_index(&r, 0), Some(0), "the WQE after the reset is WQE 0 in slot 0");
        assert_eq!(wqe_index(&r, 3), None, "nothing written at the old producer counter");
        assert_eq!(dbrec_store(&req), 1, "the doorbell record rings 1 WQEBB");
        assert_eq!(r.s.wrids, HashMap::from([(0, 200)]), "the old wr_ids are gone, the new one kept");
        assert_eq!((r.s.sq.tail, r.s.sq.inflight.len()), (0, 1), "only the new WQE in flight");
        assert_eq!(req.commit.rollback_id, 1 << 32);
        ring_it(&mut r, &req);
        let req = prepare(&mut r, 201, 3, &mut queried).unwrap();
        assert_eq!((queried, wqe_index(&r, 1), dbrec_store(&req)), (1, Some(1), 2), "then on as usual");
        assert_eq!(r.s.complete(1), Some(201));
        assert!(r.s.wrids.is_empty());
    }

    #[test]
    fn no_reset_no_query_and_the_counter_goes_on() {
        let mut r = ring();
        let mut queried = 0;
        // Rings left pending in a stream (the record still 0, then behind): never a reset.
        let mut reqs = Vec::new();
        for i in 0..3u64 {
            reqs.push(prepare(&mut r, 100 + i, 3, &mut queried).unwrap());
        }
        assert_eq!(r.s.sq.cur_post, 3);
        ring_it(&mut r, &reqs[0]);
        let req = prepare(&mut r, 103, 3, &mut queried).unwrap();
        assert_eq!((wqe_index(&r, 3), dbrec_store(&req)), (Some(3), 4));
        assert_eq!(r.s.sq.rung, 1, "the first ring was seen in the record");
        assert_eq!(r.s.complete(0), Some(100));
        assert_eq!(r.s.complete(2), Some(102), "in-order completion retires 1 (wr_id 101) too");
        assert_eq!(r.s.wrids, HashMap::from([(3, 103)]), "the wr_id of an older WQE is stale once a later completes");
        for q in reqs.iter().skip(1).chain([&req]) {
            ring_it(&mut r, q);
        }
        let req = prepare(&mut r, 104, 3, &mut queried).unwrap();
        assert_eq!((wqe_index(&r, 0), dbrec_store(&req)), (Some(4), 5), "slot 0 holds WQE 4 after the wrap");
        assert_eq!(queried, 0, "the state is never asked without a reset");
    }

    #[test]
    fn a_qp_left_in_reset_or_error_takes_no_send() {
        for bad in [verbs::IBV_QPS_RESET, verbs::IBV_QPS_ERR] {
            let mut r = ring();
            let mut queried = 0;
            for i in 0..2 {
                let req = prepare(&mut r, i, 3, &mut queried).unwrap();
                ring_it(&mut r, &req);
            }
            let _ = prepare(&mut r, 2, 3, &mut queried).unwrap();
            provider_reset(&mut r);
            r.buf.fill(POISON);
            assert_eq!(prepare(&mut r, 9, bad, &mut queried).err(), Some(Errno::EINVAL));
            assert_eq!((r.s.sq.cur_post, r.s.wrids.len()), (0, 0), "reset taken, nothing posted");
            assert_eq!(wqe_index(&r, 0), None);
            assert_eq!(prepare(&mut r, 9, bad, &mut queried).err(), Some(Errno::EINVAL), "asked again");
            let req = prepare(&mut r, 10, 3, &mut queried).unwrap();
            assert_eq!((queried, wqe_index(&r, 0), dbrec_store(&req)), (3, Some(0), 1), "RTS again: posted at 0");
            prepare(&mut r, 11, 3, &mut queried).unwrap();
            assert_eq!(queried, 3, "not asked once usable");
        }
    }

    #[test]
    fn reset_on_a_multiple_of_2_16_needs_no_move() {
        // The last ring stored 0 (counter 0x10000): a reset leaves the record as it was, and the
        // next WQE (index 0, slot 0) is already where the reset QP expects it; only the
        // wr_id/in-flight bookkeeping of the dropped WQEs differs, and it goes at the next
        // completion.
        let mut r = ring_at(0xfffe);
        let mut queried = 0;
        for i in 0..2 {
            let req = prepare(&mut r, 100 + i, 3, &mut queried).unwrap();
            ring_it(&mut r, &req);
        }
        assert_eq!(r.db[1], 0, "the ring at 0x10000 stores 0");
        provider_reset(&mut r);
        r.buf.fill(POISON);
        let req = prepare(&mut r, 200, 3, &mut queried).unwrap();
        assert_eq!(queried, 0, "nothing to see");
        assert_eq!((wqe_index(&r, 0), dbrec_store(&req)), (Some(0), 1), "WQE 0 in slot 0, record 1");
        assert_eq!(r.s.wrids.len(), 3, "the two dropped wr_ids are still kept");
        assert_eq!(r.s.complete(0), Some(200));
        assert!(r.s.wrids.is_empty(), "retired with the first completion after the reset");
        assert_eq!(r.s.sq.tail, r.s.sq.cur_post);
        // The same reset after a completion past the multiple is seen: the completed tail
        // (0x10001) bounds the last ring, and no ring from there on stores 0.
        let mut r = ring_at(0xfffe);
        for i in 0..3 {
            let req = prepare(&mut r, 100 + i, 3, &mut queried).unwrap();
            ring_it(&mut r, &req);
        }
        assert_eq!(r.s.complete(0), Some(102));
        assert_eq!((r.s.sq.rung, r.s.sq.tail), (0x10000, 0x10001), "the ring storing 0 seen, the next completed");
        provider_reset(&mut r);
        let req = prepare(&mut r, 200, 3, &mut queried).unwrap();
        assert_eq!((queried, dbrec_store(&req), r.s.sq.cur_post), (1, 1, 1), "seen across the 16-bit wrap");
        assert_eq!(r.s.wrids, HashMap::from([(0, 200)]));
    }

    #[test]
    fn rings_left_pending_across_a_reset_stay_in_bounds() {
        let mut r = ring();
        let mut queried = 0;
        let a = prepare(&mut r, 1, 3, &mut queried).unwrap();
        ring_it(&mut r, &a);
        let b = prepare(&mut r, 2, 3, &mut queried).unwrap(); // left pending in a stream
        let c = prepare(&mut r, 3, 3, &mut queried).unwrap();
        assert_eq!(r.s.sq.rung, 1);
        provider_reset(&mut r); // the application's error: resetting under pending work
        let d = prepare(&mut r, 4, 3, &mut queried).unwrap();
        assert_eq!((queried, dbrec_store(&d)), (1, 1));
        // The stale rings run after the reset: the record holds a value none of ours stores.
        ring_it(&mut r, &b);
        ring_it(&mut r, &c);
        assert!(!r.s.rollback(b.commit.rollback_id), "a rollback from before the reset is ignored");
        assert_eq!(r.s.sq.cur_post, 1);
        for i in 0..3 {
            let e = prepare(&mut r, 5 + i, 3, &mut queried).unwrap();
            assert_eq!(dbrec_store(&e), 2 + i as u32, "going on at our own counter");
        }
        assert_eq!(prepare(&mut r, 9, 3, &mut queried).err(), Some(Errno::ENOMEM), "ring full, not overrun");
        assert_eq!(queried, 1);
        assert_eq!(r.buf.len(), 256);
    }

    /// libmlx5's view of a synthetic CQ for the poll hook's `orig_poll`: a second consumer of
    /// the same ring (`dv::Cq::poll` without the 0xF0 rewrite, publishing its consumer index in
    /// the doorbell record), and a reset to run just before its next poll (a racing clean).
    struct LibCq {
        cq: Cq,
        clean_first: Option<u32>,
    }

    thread_local! {
        static LIB: RefCell<Option<LibCq>> = const { RefCell::new(None) };
    }

    /// libmlx5's `wr_id` for a CQE (its own table; ours replaces it for our QP's sends).
    const LIB_WRID: u64 = 0x11b0_0000;
    const CQES: u32 = 8;

    unsafe extern "C" fn lib_poll(_cq: *mut c_void, n: c_int, wc: *mut Wc) -> c_int {
        assert_eq!(n, 1, "the hook lets libmlx5 consume one CQE at a time");
        LIB.with(|l| {
            let mut l = l.borrow_mut();
            let lib = l.as_mut().expect("a synthetic CQ");
            if let Some(qpn) = lib.clean_first.take() {
                lib_clean(&mut lib.cq, qpn);
            }
            let Some(c) = lib.cq.poll(&mem()) else { return 0 };
            // SAFETY: all-zero is a valid Wc; `wc` is the hook's out slot.
            unsafe {
                let mut w: Wc = std::mem::zeroed();
                w.wr_id = LIB_WRID | c.wqe_counter as u64;
                w.qp_num = c.qpn;
                wc.write(w);
            }
            1
        })
    }

    /// What `mlx5_cq_clean` does to the ring on a reset of QP `qpn` (modelled from its
    /// documented effect): the QP's unpolled CQEs are dropped, the others move up by the number
    /// dropped after them (keeping the owner bit of the slot they land in), and the consumer
    /// index moves past the freed entries into the doorbell record. Returns how many went.
    fn lib_clean(lib: &mut Cq, qpn: u32) -> u32 {
        let m = mem();
        let ci = lib.cons_index;
        let mut prod = ci;
        while prod != ci.wrapping_add(lib.cqe_cnt) && lib.of_lap(&m, prod) {
            prod = prod.wrapping_add(1);
        }
        let mut freed = 0u32;
        for i in (0..prod.wrapping_sub(ci)).rev().map(|j| ci.wrapping_add(j)) {
            let mut e = [0u8; 64];
            m.read(lib.buf + lib.cqe64(i), &mut e);
            if u32::from_be_bytes(e[56..60].try_into().unwrap()) & 0xff_ffff == qpn {
                freed += 1;
            } else if freed > 0 {
                let to = lib.buf + lib.cqe64(i.wrapping_add(freed));
                let mut own = [0u8; 1];
                m.read(to + 63, &mut own);
                e[63] = (e[63] & !1) | (own[0] & 1);
                m.write(to, &e);
            }
        }
        lib.cons_index = ci.wrapping_add(freed);
        m.write(lib.dbrec, &(lib.cons_index & 0xff_ffff).to_be_bytes());
        freed
    }

    /// A synthetic CQ of 8 64-byte CQEs in real memory behind the provider's poll hook.
    struct CqRing {
        buf: Vec<u8>,
        _db: Box<[u32; 2]>,
        busy: Vec<u32>,
        c: M5Cq,
    }

    fn cq_ring(sq: Option<Arc<Mutex<SqState>>>) -> CqRing {
        let (buf, db, busy) = (vec![0xf0u8; CQES as usize * 64], Box::new([0u32; 2]), vec![0u32; CQES as usize]);
        let (b, d) = (buf.as_ptr() as usize, db.as_ptr() as usize);
        let lib = Cq::new(b, CQES, 64, d, true).unwrap();
        LIB.with(|l| *l.borrow_mut() = Some(LibCq { cq: lib, clean_first: None }));
        let c = M5Cq {
            cq: 0xc0,
            orig_poll: lib_poll,
            ring_id: 1,
            busy: busy.as_ptr() as usize,
            busy_id: 2,
            npeek: CQES,
            sq,
            inner: Mutex::new(CqInner {
                cq: Cq::new(b, CQES, 64, d, false).unwrap(),
                peeks: HashMap::new(),
                stale: Vec::new(),
                free: (0..CQES).rev().collect(),
                dead: false,
                foreign_said: false,
            }),
        };
        CqRing { buf, _db: db, busy, c }
    }

    /// The hardware writes CQE `n` (a requester completion of QP `qpn`'s WQE `wqe`).
    fn hw_cqe(r: &CqRing, n: u32, qpn: u32, wqe: u16) {
        let mut c = [0u8; 64];
        c[56..60].copy_from_slice(&qpn.to_be_bytes());
        c[60..62].copy_from_slice(&wqe.to_be_bytes());
        c[63] = u8::from(n & CQES != 0);
        mem().write(r.buf.as_ptr() as usize + (n % CQES) as usize * 64, &c);
    }

    /// `gds_prepare_wait_cq` on CQE `n`: the request, or the error.
    fn wait_on(r: &CqRing, n: u32) -> Result<Box<WaitRequest>> {
        // SAFETY: all-zero is a valid WaitRequest.
        let mut req: Box<WaitRequest> = Box::new(unsafe { std::mem::zeroed() });
        req.peek.entries = 2;
        req.peek.whence = IBV_EXP_PEER_PEEK_ABSOLUTE;
        req.peek.offset = n;
        r.c.prepare_wait(&mut req).map(|_| req)
    }

    /// The stream reaching the wait: true (and its busy flag cleared) when its poll passes.
    fn gpu_runs(r: &CqRing, w: &WaitRequest) -> bool {
        // SAFETY: both ops of a wait fill dword_va.
        let (p, st) = unsafe { (w.wr[0].wr.dword_va, w.wr[1].wr.dword_va) };
        let word = u32::from_le_bytes(r.buf[p.offset..p.offset + 4].try_into().unwrap());
        let cond = match w.wr[0].type_ {
            IBV_EXP_PEER_OP_POLL_AND_DWORD => GDS_WAIT_COND_AND,
            IBV_EXP_PEER_OP_POLL_NOR_DWORD => GDS_WAIT_COND_NOR,
            _ => GDS_WAIT_COND_GEQ,
        };
        let ok = crate::engine::cpu::condition_holds(cond, word, p.data).unwrap();
        if ok {
            mem().write(r.busy.as_ptr() as usize + st.offset, &0u32.to_ne_bytes());
        }
        ok
    }

    /// `ibv_poll_cq` through the hook: (qp_num, wr_id) of each completion.
    fn poll_cq(r: &CqRing) -> Vec<(u32, u64)> {
        // SAFETY: all-zero is a valid Wc.
        let mut wc: [Wc; 8] = unsafe { std::mem::zeroed() };
        let k = r.c.poll(8, wc.as_mut_ptr());
        assert!(k >= 0);
        wc[..k as usize].iter().map(|w| (w.qp_num, w.wr_id)).collect()
    }

    fn op_own(r: &CqRing, n: u32) -> u8 {
        r.buf[(n % CQES) as usize * 64 + 63]
    }

    /// Runs `f` on the ring's send-queue state while it is shared with a CQ.
    fn with_sq<T>(r: &mut Ring, s: &Arc<Mutex<SqState>>, f: impl FnOnce(&mut Ring) -> T) -> T {
        std::mem::swap(&mut r.s, &mut *lock(s));
        let v = f(r);
        std::mem::swap(&mut r.s, &mut *lock(s));
        v
    }

    #[test]
    fn qp_reset_cq_clean_is_followed_and_its_cqes_never_delivered() {
        let mut r = ring(); // QP 7
        let mut queried = 0;
        for i in 0..3 {
            let req = prepare(&mut r, 100 + i, 3, &mut queried).unwrap();
            ring_it(&mut r, &req);
        }
        let sqs = Arc::new(Mutex::new(SqState::new(r.s.sq.clone())));
        std::mem::swap(&mut r.s, &mut *lock(&sqs));
        let q = cq_ring(Some(sqs.clone()));
        // The send CQ is shared with QP 9: its completions interleave with ours.
        for (n, qpn, wqe) in [(0, 7, 0), (1, 9, 5), (2, 7, 1), (3, 9, 6), (4, 7, 2)] {
            hw_cqe(&q, n, qpn, wqe);
        }
        let w: Vec<_> = (0..5).map(|n| wait_on(&q, n).unwrap()).collect();
        assert!(gpu_runs(&q, &w[0]));
        assert_eq!(poll_cq(&q), [(7, 100)], "CQE 1 held back: its wait has not run");
        // ibv_modify_qp(QP 7, RESET): the send doorbell record zeroed, and mlx5_cq_clean.
        provider_reset(&mut r);
        let freed = LIB.with(|l| lib_clean(&mut l.borrow_mut().as_mut().unwrap().cq, 7));
        assert_eq!(freed, 2, "QP 7's unpolled CQEs 2 and 4 removed, QP 9's moved to 3 and 4");
        assert_eq!(poll_cq(&q), [], "the removed span is walked only once its waits ran");
        {
            let g = lock(&q.c.inner);
            assert_eq!((g.cq.cons_index, g.cq.lib_ci, g.cq.removed_from), (1, 3, 1), "libmlx5's index followed");
        }
        assert_eq!(wait_on(&q, 2).err(), Some(Errno::EINVAL), "a new wait on a removed CQE is refused");
        assert_eq!(wait_on(&q, 1).err(), Some(Errno::EINVAL));
        assert!(gpu_runs(&q, &w[1]) && gpu_runs(&q, &w[2]), "pending waits on removed CQEs pass, never hang");
        assert_eq!(poll_cq(&q), [], "QP 9's moved CQE 3 is held until its wait runs");
        assert!(gpu_runs(&q, &w[3]) && gpu_runs(&q, &w[4]));
        assert_eq!(
            poll_cq(&q),
            [(9, LIB_WRID | 5), (9, LIB_WRID | 6)],
            "QP 9's CQEs in order, with libmlx5's wr_ids; none of reset QP 7's"
        );
        {
            let g = lock(&q.c.inner);
            assert_eq!((g.cq.cons_index, g.cq.lib_ci), (5, 5));
            assert_eq!(g.free.len(), CQES as usize, "every peek entry back");
        }
        for n in 0..5 {
            assert_eq!(op_own(&q, n), 0xf0, "CQE {n} consumed or walked: invalid for the next lap");
        }
        assert_eq!(poll_cq(&q), []);
        // QP 7 back in RTS: its send queue restarts at WQE 0 and the CQ view agrees with it.
        let req = with_sq(&mut r, &sqs, |r| prepare(r, 200, 3, &mut queried)).unwrap();
        assert_eq!((queried, dbrec_store(&req)), (1, 1), "the SQ reset seen too");
        hw_cqe(&q, 5, 7, 0);
        let w5 = wait_on(&q, 5).unwrap();
        assert!(gpu_runs(&q, &w5));
        assert_eq!(poll_cq(&q), [(7, 200)]);
        assert!(lock(&sqs).sq.inflight.is_empty() && lock(&sqs).wrids.is_empty());
    }

    #[test]
    fn a_cq_clean_racing_the_poll_is_followed() {
        let sqs = Arc::new(Mutex::new(SqState::new(ring().s.sq)));
        {
            let mut s = lock(&sqs);
            s.sq.inflight.push_back((0, 1));
            s.sq.cur_post = 1;
            s.remember(0, 100, true);
        }
        let q = cq_ring(Some(sqs.clone()));
        hw_cqe(&q, 0, 7, 0);
        hw_cqe(&q, 1, 9, 5);
        hw_cqe(&q, 2, 9, 6);
        let w0 = wait_on(&q, 0).unwrap();
        assert!(gpu_runs(&q, &w0));
        // QP 7 reset between the hook's look at CQE 0 and libmlx5's poll.
        LIB.with(|l| l.borrow_mut().as_mut().unwrap().clean_first = Some(7));
        assert_eq!(poll_cq(&q), [(9, LIB_WRID | 5), (9, LIB_WRID | 6)], "the CQE libmlx5 polled, as it is");
        assert_eq!(lock(&sqs).wrids.len(), 1, "QP 7's WQE 0 not completed by QP 9's CQE");
        let g = lock(&q.c.inner);
        assert_eq!((g.cq.cons_index, g.cq.lib_ci), (3, 3));
        assert!(g.cq.removed(0) && !g.cq.removed(3));
        assert_eq!(g.free.len() + g.stale.len(), CQES as usize, "no peek entry lost");
    }

    #[test]
    fn exp_wr_to_wqe() {
        // SAFETY: all-zero is a valid ExpSendWr.
        let mut e: ExpSendWr = unsafe { std::mem::zeroed() };
        let data = *b"0123456789";
        let mut sg = [Sge { addr: data.as_ptr() as u64, length: 10, lkey: 3 }];
        e.sg_list = sg.as_mut_ptr();
        e.num_sge = 1;
        e.exp_opcode = 5; // CMP_AND_SWP
        e.wr = [0x1000, 7, 9, 0x42];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: valid wr over live buffers.
        let w = unsafe { to_wqe(&e, true, 1, &mut a, &mut b) }.unwrap();
        assert_eq!((w.opcode, w.raddr, w.atomic, w.signaled), (0x11, Some((0x1000, 0x42)), Some((9, 7)), true));
        e.exp_opcode = 2;
        e.exp_send_flags = 8;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: as above.
        let w = unsafe { to_wqe(&e, false, 1, &mut a, &mut b) }.unwrap();
        assert_eq!((w.opcode, w.inline, w.raddr, w.signaled), (0x0a, Some(&b"0123456789"[..]), None, false));
        e.exp_opcode = 9;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: as above.
        assert!(unsafe { to_wqe(&e, false, 1, &mut a, &mut b) }.is_err());
        // More gather entries than the QP's max_send_sge: refused (inline data is not bounded by it).
        let mut sg2 = [sg[0], sg[0]];
        e.sg_list = sg2.as_mut_ptr();
        e.num_sge = 2;
        e.exp_opcode = 2;
        e.exp_send_flags = 0;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: as above.
        assert!(unsafe { to_wqe(&e, false, 1, &mut a, &mut b) }.is_err(), "2 SGEs on a 1-SGE QP");
        // SAFETY: as above.
        assert!(unsafe { to_wqe(&e, false, 2, &mut a, &mut b) }.is_ok());
        e.exp_send_flags = 8;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        // SAFETY: as above.
        assert!(unsafe { to_wqe(&e, false, 1, &mut a, &mut b) }.is_ok(), "inline: the SGE limit does not apply");
    }
}
