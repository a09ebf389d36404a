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
//! ignored. Not handled: libmlx5 also removes the QP's unpolled CQEs from its CQs on RESET
//! (`mlx5_cq_clean`), which moves its consumer index past ours; poll the CQs empty before a reset.
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
use crate::verbs::mlx5::dv::{self as mlx5dv, Cq, Dbrec, Mem, Sq, Wqe};

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
    fn poll(&self, n: c_int, out: *mut Wc) -> c_int {
        // SAFETY: the ring of a live CQ (dead CQs are skipped below).
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
            let idx = g.cq.cons_index;
            let at = g.cq.buf + g.cq.cqe64(idx);
            let mut c = [0u8; 64];
            m.read(at, &mut c);
            let opcode = c[63] >> 4;
            if opcode == mlx5dv::MLX5_CQE_INVALID || (c[63] & 1 != 0) != (idx & g.cq.cqe_cnt != 0) {
                break;
            }
            if let Some(es) = g.peeks.get(&idx) {
                if es.iter().any(|&e| is_busy(busy, e)) {
                    break;
                }
                let es = g.peeks.remove(&idx).unwrap_or_default();
                g.free.extend(es);
            }
            let wqe_counter = u16::from_be_bytes([c[60], c[61]]);
            // SAFETY: live CQ; one completion written at out + k (< n).
            let r = unsafe { (self.orig_poll)(self.cq as *mut c_void, 1, out.add(k)) };
            if r != 1 {
                if r < 0 && k == 0 {
                    return r;
                }
                break;
            }
            if let Some(sq) = &self.sq
                && let Some(id) = lock(sq).complete(wqe_counter)
            {
                // SAFETY: written by the poll above.
                unsafe { (*out.add(k)).wr_id = id };
            }
            // A consumed entry must not satisfy a later-lap GEQ wait (libmlx5 does not rewrite it).
            m.write(at + 63, &[mlx5dv::MLX5_CQE_INVALID << 4]);
            g.cq.cons_index = idx.wrapping_add(1);
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
        let mut r = ring();
        r.s.sq.cur_post = 0xfffe;
        r.s.sq.committed = 0xfffe;
        r.s.sq.tail = 0xfffe;
        r.s.sq.rung = 0xfffe;
        r.db[1] = 0xfffeu32.to_be();
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
        let mut r = ring();
        r.s.sq.cur_post = 0xfffe;
        r.s.sq.committed = 0xfffe;
        r.s.sq.tail = 0xfffe;
        r.s.sq.rung = 0xfffe;
        r.db[1] = 0xfffeu32.to_be();
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
