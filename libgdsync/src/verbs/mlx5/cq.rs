//! The CQs of an mlx5 direct QP (rdma-core's `cq.c` seen from the provider): the stream waits
//! prepared on a ring and the CPU's polls of it through the `poll_cq` hook, and the table of
//! this provider's CQs. The waits and the hook are outlined in the provider's module doc
//! (`mlx5/mod.rs`); here are the details of the poll and of what a QP reset does to a CQ.
//!
//! CQ side of a reset: libmlx5 also removes the QP's unpolled CQEs from its CQs
//! (`mlx5_cq_clean`: the QP's entries dropped, the other QPs' moved up towards the producer end,
//! its consumer index moved past the freed entries and published in the CQ doorbell record,
//! `dbrec[0]`, big-endian 24 bits). Each CQ keeps libmlx5's index beside ours and follows the
//! record lazily, at each poll step and each wait prepare ([`Cq::follow`]; one 4-byte read,
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

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::sync::lock;
use crate::verbs::ibv::{PollCqFn, Wc};
use crate::verbs::mlx5::dv::{self as mlx5dv, Cq, Follow, Mem};
use crate::verbs::mlx5::ffi::RawMem;
use crate::verbs::mlx5::sq::SqState;

pub(super) struct CqInner {
    cq: Cq,
    peeks: HashMap<u32, Vec<u32>>,
    stale: Vec<u32>,
    free: Vec<u32>,
    pub(super) dead: bool,
    /// libmlx5's consumer index was seen at a value no clean explains (reported once).
    foreign_said: bool,
}

pub(super) struct M5Cq {
    pub(super) cq: usize,
    orig_poll: PollCqFn,
    pub(super) ring_id: u64,
    busy: usize,
    pub(super) busy_id: u64,
    npeek: u32,
    /// The send queue this CQ completes, with its wqe index → wr_id table.
    sq: Option<Arc<Mutex<SqState>>>,
    pub(super) inner: Mutex<CqInner>,
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
    /// A CQ of this provider on libmlx5's CQ `cq` (polled through `orig_poll`) whose ring `ring`
    /// describes, registered as `ring_id`; one busy flag per CQE at `busy` (registered as
    /// `busy_id`); `sq`: the send queue whose completions it carries, if any.
    pub(super) fn new(
        cq: usize,
        orig_poll: PollCqFn,
        ring: Cq,
        ring_id: u64,
        busy: usize,
        busy_id: u64,
        sq: Option<Arc<Mutex<SqState>>>,
    ) -> M5Cq {
        let npeek = ring.cqe_cnt;
        M5Cq {
            cq,
            orig_poll,
            ring_id,
            busy,
            busy_id,
            npeek,
            sq,
            inner: Mutex::new(CqInner {
                cq: ring,
                peeks: HashMap::new(),
                stale: Vec::new(),
                free: (0..npeek).rev().collect(),
                dead: false,
                foreign_said: false,
            }),
        }
    }

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

pub(super) fn cqs() -> &'static Mutex<HashMap<usize, Arc<M5Cq>>> {
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

pub fn owns_cq(cq: NonNull<GdsCq>) -> bool {
    // SAFETY: a gds_cq from the application (C layer contract); only `cq` is read.
    let raw = unsafe { (*cq.as_ptr()).cq } as usize;
    lock(cqs()).contains_key(&raw)
}

fn find_cq(cq: NonNull<GdsCq>) -> Result<Arc<M5Cq>> {
    // SAFETY: a gds_cq from the application; only `cq` is read.
    let raw = unsafe { (*cq.as_ptr()).cq } as usize;
    lock(cqs()).get(&raw).cloned().ok_or(Errno::EINVAL)
}

pub fn prepare_wait(cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()> {
    find_cq(cq)?.prepare_wait(request)
}

pub fn abort_wait(cq: NonNull<GdsCq>, id: u64) -> Result<()> {
    find_cq(cq)?.abort_wait(id)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::verbs::mlx5::sq::tests::{Ring, dbrec_store, mem, prepare, provider_reset, ring, ring_it};

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

    /// libmlx5's `poll_cq` as the hook sees it: consumes one CQE of the test's table.
    ///
    /// # Safety
    /// `wc` is valid for one `Wc` write (the hook passes its own).
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
        let c = M5Cq::new(0xc0, lib_poll, Cq::new(b, CQES, 64, d, false).unwrap(), 1, busy.as_ptr() as usize, 2, sq);
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
}
