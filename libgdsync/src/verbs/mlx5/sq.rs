//! The send queue of an mlx5 direct QP, as this provider drives it (rdma-core's post path in
//! `qp.c`, without its doorbell): work requests checked and written as WQEs at the provider's own
//! producer counter, all or nothing, with the `wr_id` of each signaled WQE kept for its CQE
//! (libmlx5's table is filled only by its own post_send), and the commit's ring returned as peer
//! ops (doorbell record store, fence, BlueFlame store) for a stream or the CPU to execute.
//!
//! QP reset: the application drives the QP with plain `ibv_modify_qp`, which does not go through
//! the context's ops table, so it cannot be hooked. On RESET libmlx5 zeroes its indices and both
//! words of the doorbell record; we see that lazily, on our own post path: each prepare reads
//! `dbrec[1]` back ([`Sq::check_dbrec`]; one 4-byte read, no call) and compares it with what
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

use std::collections::HashMap;
use std::ffi::c_void;

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::memops::PeerOp;
use crate::verbs::exp::ExpSendWr;
use crate::verbs::ibv::{self as verbs, Sge};
use crate::verbs::mlx5::dv::{self as mlx5dv, Dbrec, Mem, Sq, Wqe};

pub(super) struct SqState {
    pub(super) sq: Sq,
    pub(super) wrids: HashMap<u16, u64>,
    /// A reset was seen and the QP not yet found out of RESET/ERR: its state is queried on every
    /// prepare until it is.
    recheck: bool,
    /// The doorbell record's foreign value was reported (once until it is ours again).
    foreign_said: bool,
}

/// What a prepare needs of the QP besides its send queue.
pub(super) struct SendCfg {
    pub(super) sig_all: bool,
    /// `cap.max_send_sge` the QP was created with.
    pub(super) max_send_sge: u32,
    /// Range ids of the doorbell record and the BlueFlame register.
    pub(super) dbr_id: u64,
    pub(super) bf_id: u64,
}

impl SqState {
    pub(super) fn new(sq: Sq) -> SqState {
        SqState { sq, wrids: HashMap::new(), recheck: false, foreign_said: false }
    }

    /// Keeps the `wr_id` of the WQE at `idx` for its CQE; only a signaled WQE gets one (an
    /// unsignaled one's entry would never be consumed). Returns whether it was kept.
    pub(super) fn remember(&mut self, idx: u16, wr_id: u64, signaled: bool) -> bool {
        if signaled {
            self.wrids.insert(idx, wr_id);
        }
        signaled
    }

    /// A send CQE naming `wqe_counter`: its `wr_id`, and the WQEs up to it retired. The older
    /// WQEs retired with it had their own CQEs first (a send queue completes in order), so a
    /// `wr_id` still kept for one of them is stale (left by a reset we could not see): dropped.
    pub(super) fn complete(&mut self, wqe_counter: u16) -> Option<u64> {
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
    pub(super) fn rollback(&mut self, id: u64) -> bool {
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
    pub(super) unsafe fn prepare(
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

/// One `gds_send_wr` as an mlx5 WQE description; inline payloads gathered into `buf`.
///
/// # Safety
/// As `proxy::wr::translate_wr`.
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::verbs::mlx5::ffi::RawMem;

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
    pub(crate) struct Ring {
        buf: Vec<u8>,
        db: Box<[u32; 2]>,
        _bf: Vec<u8>,
        pub(crate) s: SqState,
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

    pub(crate) fn ring() -> Ring {
        let (buf, db, bf) = (vec![POISON; 4 * 64], Box::new([0u32; 2]), vec![0u8; 512]);
        let sq = Sq::new(buf.as_ptr() as usize, 4, db.as_ptr() as usize, bf.as_ptr() as usize, 256, 7, 64).unwrap();
        Ring { buf, db, _bf: bf, s: SqState::new(sq) }
    }

    pub(crate) fn mem() -> RawMem {
        // SAFETY: the tests only pass addresses inside a live `Ring`.
        unsafe { RawMem::new() }
    }

    /// Prepares one signaled SEND carrying `wr_id`; `state` answers the QP state query and
    /// counts its calls.
    pub(crate) fn prepare(r: &mut Ring, wr_id: u64, state: u32, queried: &mut u32) -> Result<Box<SendRequest>> {
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
    pub(crate) fn dbrec_store(req: &SendRequest) -> u32 {
        assert_eq!(req.commit.entries, 3);
        assert_eq!(req.wr[0].type_, IBV_EXP_PEER_OP_STORE_DWORD);
        // SAFETY: a STORE_DWORD op fills dword_va.
        let d = unsafe { req.wr[0].wr.dword_va };
        assert_eq!((d.target_id, d.offset), (11, 4), "dbrec[1]");
        u32::from_be_bytes(d.data.to_ne_bytes())
    }

    /// The stream (or CPU) executing the request's doorbell-record store.
    pub(crate) fn ring_it(r: &mut Ring, req: &SendRequest) {
        // SAFETY: a STORE_DWORD op fills dword_va.
        r.db[1] = unsafe { req.wr[0].wr.dword_va.data };
    }

    /// rdma-core's `ibv_modify_qp(RESET)` as seen from our memory: both doorbell words zeroed.
    pub(crate) fn provider_reset(r: &mut Ring) {
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
