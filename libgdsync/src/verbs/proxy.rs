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

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::ranges::{Range, ranges};
use crate::sync::lock;
use crate::verbs::Provider;
use crate::verbs::area::{Area, alloc_area, free_area, load, store};
use crate::verbs::exp::*;
use crate::verbs::hook::{self, install_hook};
use crate::verbs::ibv::{self as verbs, PollCqFn, QpCap, QpInitAttr, SendWr, Sge, Wc, verbs};

/// Longest list of work requests one call may pass (a guard against cyclic lists).
const MAX_WRS_PER_CALL: usize = 1 << 16;

/// exp opcode → (ibv_wr_opcode, ibv_wc_opcode of its completion).
fn map_opcode(op: u32) -> Option<(u32, u32)> {
    Some(match op {
        0 | 1 => (op, 1), // RDMA_WRITE(_WITH_IMM) → IBV_WC_RDMA_WRITE
        2 | 3 => (op, 0), // SEND(_WITH_IMM) → IBV_WC_SEND
        4 => (4, 2),      // RDMA_READ
        5 => (5, 3),      // ATOMIC_CMP_AND_SWP → IBV_WC_COMP_SWAP
        6 => (6, 4),      // ATOMIC_FETCH_AND_ADD
        // MOFED numbers these from IBV_EXP_START_ENUM (0x40); rdma-core's IBV_WR_* values differ.
        0x48 => (9, 0),  // SEND_WITH_INV → IBV_WR_SEND_WITH_INV, completes as IBV_WC_SEND
        0x4a => (7, 6),  // LOCAL_INV → IBV_WR_LOCAL_INV, IBV_WC_LOCAL_INV
        0x4f => (10, 7), // TSO
        _ => return None,
    })
}

/// One `gds_send_wr` translated into an `ibv_send_wr` whose pointers refer to owned copies.
struct PreparedWr {
    wr: SendWr,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    wc_opcode: u32,
    signaled: bool,
}

/// Checks and copies one work request (spec: upstream's ibv_exp_post_send checks).
///
/// # Safety
/// `w` points to a readable `gds_send_wr` whose `sg_list` has `num_sge` entries and whose
/// inline buffers are readable.
unsafe fn translate_wr(w: *const ExpSendWr, cap: &QpCap, sig_all: bool) -> std::result::Result<PreparedWr, String> {
    // SAFETY: readable per the contract.
    let e = unsafe { &*w };
    if e.comp_mask != 0 {
        return Err(format!("comp_mask {:#x} is not supported", e.comp_mask));
    }
    let (opcode, wc_opcode) = map_opcode(e.exp_opcode)
        .ok_or_else(|| format!("opcode {:#x} is not supported by the proxy provider", e.exp_opcode))?;
    let known = IBV_EXP_SEND_FENCE
        | IBV_EXP_SEND_SIGNALED
        | IBV_EXP_SEND_SOLICITED
        | IBV_EXP_SEND_INLINE
        | IBV_EXP_SEND_IP_CSUM;
    if e.exp_send_flags & !known != 0 {
        return Err(format!("send flags {:#x} are not supported", e.exp_send_flags));
    }
    let mut send_flags = (e.exp_send_flags & 0xf) as u32;
    if e.exp_send_flags & IBV_EXP_SEND_IP_CSUM != 0 {
        send_flags |= IBV_SEND_IP_CSUM;
    }
    let n = e.num_sge;
    if n < 0 || (n > 0 && e.sg_list.is_null()) {
        return Err(format!("bad scatter/gather list ({n} entries at {:p})", e.sg_list));
    }
    if send_flags & IBV_SEND_INLINE == 0 && n as u32 > cap.max_send_sge {
        return Err(format!("{n} scatter/gather entries, the QP takes {}", cap.max_send_sge));
    }
    let sges: Vec<Sge> = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: `n` entries at sg_list per the contract (non-NULL when n > 0).
        unsafe { std::slice::from_raw_parts(e.sg_list, n as usize) }.to_vec()
    };
    let mut inline = Vec::new();
    let mut out_sges = sges.clone();
    if send_flags & IBV_SEND_INLINE != 0 {
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        if total > cap.max_inline_data as u64 {
            return Err(format!("{total} bytes of inline data, the QP takes {}", cap.max_inline_data));
        }
        // Upstream copies inline data into the WQE at prepare time; we copy it now too, so the
        // application may reuse its buffer as soon as the call returns.
        inline.reserve(total as usize);
        for s in &sges {
            if s.length > 0 {
                // SAFETY: an inline SGE names `length` readable bytes at `addr` (verbs contract).
                inline.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                });
            }
        }
        out_sges =
            if inline.is_empty() { Vec::new() } else { vec![Sge { addr: 0, length: inline.len() as u32, lkey: 0 }] };
    }
    let mut wr = SendWr {
        wr_id: e.wr_id,
        opcode,
        send_flags,
        imm_data: e.imm_data,
        wr: e.wr,
        qp_type: e.qp_type,
        num_sge: out_sges.len() as c_int,
        ..SendWr::default()
    };
    if opcode == 10 {
        wr.ext[0] = e.bind_tso[0];
        wr.ext[1] = e.bind_tso[1];
    }
    let signaled = sig_all || send_flags & (IBV_EXP_SEND_SIGNALED as u32) != 0;
    Ok(PreparedWr { wr, sges: out_sges, inline, wc_opcode, signaled })
}

// ---------------------------------------------------------------------------------------------
// CQs

const PEEK_TAG: u64 = 0x7065_656b << 32;

struct CqInner {
    /// Completions moved out of the real CQ, not yet returned to the application.
    queue: VecDeque<Wc>,
    /// Completions moved so far (mod 2^32) = the value of the counter word.
    produced: u32,
    /// Completions returned to the application so far (the consumer index).
    consumed: u32,
    /// CQE index → busy-flag entries of the waits prepared for it.
    peeks: HashMap<u32, Vec<u32>>,
    /// Entries of waits prepared for CQEs already consumed: freed when released.
    stale: Vec<u32>,
    free: Vec<u32>,
    /// Send CQs: signaled flag of every posted-but-uncompleted send, oldest first (SQ space).
    sq: VecDeque<bool>,
    dead: bool,
}

pub struct ProxyCq {
    cq: usize,
    orig_poll: PollCqFn,
    ring: u32,
    counter: usize,
    counter_id: u64,
    busy: usize,
    busy_id: u64,
    npeek: u32,
    is_send: bool,
    inner: Mutex<CqInner>,
}

impl ProxyCq {
    fn busy_addr(&self, e: u32) -> usize {
        self.busy + 4 * e as usize
    }

    fn is_busy(&self, e: u32) -> bool {
        // SAFETY: e < npeek, inside this CQ's registered area (alive while the CQ is).
        unsafe { load(self.busy_addr(e)) != 0 }
    }

    fn push(&self, g: &mut CqInner, wc: Wc) {
        if self.is_send {
            // A send completion retires every unsignaled send before it and the signaled one.
            while let Some(s) = g.sq.pop_front() {
                if s {
                    break;
                }
            }
        }
        g.queue.push_back(wc);
        g.produced = g.produced.wrapping_add(1);
        // SAFETY: the counter word of this CQ's live area.
        unsafe { store(self.counter, g.produced) };
    }

    /// Moves completions from the real CQ into the software queue. Returns whether any came.
    fn drain(&self, g: &mut CqInner) -> bool {
        if g.dead {
            return false;
        }
        let mut any = false;
        let mut buf = [Wc::default(); 16];
        loop {
            // SAFETY: the CQ is live (not dead: destroy marks it dead under this lock first);
            // the buffer holds 16 entries.
            let n = unsafe { (self.orig_poll)(self.cq as *mut c_void, buf.len() as c_int, buf.as_mut_ptr()) };
            if n < 0 {
                gds_err!("gds_proxy", "ibv_poll_cq failed ({n}) on CQ {:#x}", self.cq);
                return any;
            }
            for wc in &buf[..n as usize] {
                if wc.status != verbs::IBV_WC_SUCCESS {
                    gds_dbg!("gds_proxy", "CQ {:#x}: completion wr_id {:#x} status {}", self.cq, wc.wr_id, wc.status);
                }
                self.push(g, *wc);
                any = true;
            }
            if (n as usize) < buf.len() {
                return any;
            }
        }
    }

    fn sweep_stale(&self, g: &mut CqInner) {
        let mut i = 0;
        while i < g.stale.len() {
            if self.is_busy(g.stale[i]) {
                i += 1;
            } else {
                let e = g.stale.swap_remove(i);
                g.free.push(e);
            }
        }
    }

    /// The application's `ibv_poll_cq`: returns queued completions in order, stopping at one
    /// that a prepared stream wait has not released yet.
    fn poll_app(&self, n: c_int, out: *mut Wc) -> c_int {
        if FAILED.load(Ordering::Acquire) {
            gds_warn_once!("ibv_poll_cq", "CQ of a CPU-proxy QP polled after the proxy thread failed: error");
            return -libc::EIO;
        }
        let mut g = lock(&self.inner);
        self.drain(&mut g);
        self.sweep_stale(&mut g);
        let mut k = 0usize;
        while (k as c_int) < n && !g.queue.is_empty() {
            let idx = g.consumed;
            if let Some(es) = g.peeks.get(&idx) {
                if es.iter().any(|&e| self.is_busy(e)) {
                    break;
                }
                let es = g.peeks.remove(&idx).unwrap_or_default();
                g.free.extend(es);
            }
            let Some(wc) = g.queue.pop_front() else { break };
            // SAFETY: the caller passed room for `n` completions; k < n.
            unsafe { out.add(k).write(wc) };
            g.consumed = idx.wrapping_add(1);
            k += 1;
        }
        k as c_int
    }

    fn prepare_wait(&self, request: &mut WaitRequest) -> Result<()> {
        const F: &str = "gds_prepare_wait_cq";
        if request.peek.whence != IBV_EXP_PEER_PEEK_ABSOLUTE {
            gds_err!(F, "only absolute peeks are supported");
            return Err(Errno::EINVAL);
        }
        if request.peek.entries < 2 {
            return Err(Errno(libc::ENOSPC));
        }
        let n = request.peek.offset;
        let mut g = lock(&self.inner);
        let ahead = n.wrapping_sub(g.consumed) as i32;
        if ahead > self.ring as i32 - 1 {
            gds_err!(F, "CQE {n} is more than one CQ ring ({}) ahead of the consumer index {}", self.ring, g.consumed);
            return Err(Errno(libc::E2BIG));
        }
        let Some(e) = g.free.pop() else {
            gds_err!(F, "no free peek entry ({} in use): poll the CQ", self.npeek);
            return Err(Errno::ENOMEM);
        };
        // SAFETY: e < npeek, inside this CQ's live area.
        unsafe { store(self.busy_addr(e), 1) };
        if ahead < 0 {
            g.stale.push(e);
        } else {
            g.peeks.entry(n).or_default().push(e);
        }
        request.wr[0].type_ = IBV_EXP_PEER_OP_POLL_GEQ_DWORD;
        request.wr[0].wr.dword_va = DwordVa { data: n.wrapping_add(1), target_id: self.counter_id, offset: 0 };
        request.wr[1].type_ = IBV_EXP_PEER_OP_STORE_DWORD;
        request.wr[1].wr.dword_va = DwordVa { data: 0, target_id: self.busy_id, offset: 4 * e as usize };
        request.wr[1].next = std::ptr::null_mut();
        request.peek.entries = 2;
        request.peek.peek_id = PEEK_TAG | e as u64;
        Ok(())
    }

    /// Sets the counter word past every CQE a prepared wait may name (at most one ring ahead of
    /// the consumer index, as `prepare_wait` enforces), so every stream wait on it passes.
    fn release_all_waits(&self) {
        let g = lock(&self.inner);
        // SAFETY: the counter word of this CQ's live area.
        unsafe { store(self.counter, g.consumed.wrapping_add(self.ring)) };
    }

    fn abort_wait(&self, peek_id: u64) -> Result<()> {
        let e = peek_id & 0xffff_ffff;
        if peek_id & !0xffff_ffff != PEEK_TAG || e >= self.npeek as u64 {
            gds_err!("gds_post_wait_cq", "invalid peek id {peek_id:#x}");
            return Err(Errno::EINVAL);
        }
        // SAFETY: e < npeek, inside this CQ's live area.
        unsafe { store(self.busy_addr(e as u32), 0) };
        Ok(())
    }
}

/// The poll_cq hook's question ([`super::hook::Claim`]): is `cq` one of ours?
pub(crate) fn poll_claim(cq: *mut c_void, n: c_int, wc: *mut Wc) -> Option<c_int> {
    let ours = lock(cqs()).get(&(cq as usize)).cloned()?;
    Some(ours.poll_app(n, wc))
}

fn cqs() -> &'static Mutex<HashMap<usize, Arc<ProxyCq>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<ProxyCq>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

// ---------------------------------------------------------------------------------------------
// QPs

struct Batch {
    seq: u32,
    wrs: Vec<PreparedWr>,
}

// SAFETY: the raw pointers inside a batch's SendWrs point into the batch's own heap buffers
// (linked just before posting); nothing is shared with other threads.
unsafe impl Send for Batch {}

struct QpInner {
    prepared: u32,
    posted: u32,
    /// A stale trigger value was seen (reported once per QP).
    stale_seen: bool,
    pending: VecDeque<Batch>,
    dead: bool,
}

pub struct ProxyQp {
    gds: usize,
    /// The verbs context (whose poll_cq hook this QP uses).
    ctx: usize,
    qp: usize,
    qp_num: u32,
    send: Arc<ProxyCq>,
    recv: Arc<ProxyCq>,
    trig: usize,
    trig_id: u64,
    area: Area,
    cap: QpCap,
    sig_all: bool,
    inner: Mutex<QpInner>,
}

fn qps() -> &'static Mutex<HashMap<usize, Arc<ProxyQp>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<ProxyQp>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The send a trigger value asks to post up to: `Some(trig)` when it names a prepared send of
/// this QP not posted yet (in the cyclic window `posted < trig <= prepared`), `None` when it
/// asks for nothing new, or for something this QP never prepared (a late write from a destroyed
/// QP that used the same page: ignored).
fn triggered(trig: u32, posted: u32, prepared: u32) -> Option<u32> {
    let ahead = trig.wrapping_sub(posted);
    (ahead != 0 && ahead <= prepared.wrapping_sub(posted)).then_some(trig)
}

/// Where a new QP starts numbering its sends: QPs are 2^24 sends apart, so a value a destroyed
/// QP's stream may still write is far outside a new QP's window.
fn next_seq_base() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1 << 24, Ordering::Relaxed)
}

impl ProxyQp {
    /// Posts the batches the trigger word asks for and drains both CQs. Returns whether
    /// anything happened.
    fn service(&self) -> bool {
        let mut g = lock(&self.inner);
        if g.dead {
            return false;
        }
        let mut any = false;
        // SAFETY: the trigger word of this QP's live area.
        let trig = unsafe { load(self.trig) };
        if trig != g.posted && triggered(trig, g.posted, g.prepared).is_none() && !g.stale_seen {
            g.stale_seen = true;
            gds_dbg!("gds_proxy", "QP {:#x}: trigger value {trig:#x} is not one of its sends: ignored", self.qp_num);
        }
        if let Some(trig) = triggered(trig, g.posted, g.prepared) {
            while g.posted != trig {
                let next = g.posted.wrapping_add(1);
                match g.pending.front() {
                    Some(b) if b.seq == next => {
                        let b = g.pending.pop_front();
                        if let Some(mut b) = b {
                            self.post(&mut b);
                            fault_injection_point();
                        }
                        g.posted = next;
                        any = true;
                    }
                    _ => {
                        gds_err!(
                            "gds_proxy",
                            "QP {:#x}: trigger {trig} but no prepared send {next}; ignored",
                            self.qp_num
                        );
                        g.posted = trig;
                        break;
                    }
                }
            }
        }
        drop(g);
        any |= self.send.drain(&mut lock(&self.send.inner));
        any |= self.recv.drain(&mut lock(&self.recv.inner));
        any
    }

    fn post(&self, b: &mut Batch) {
        let n = b.wrs.len();
        if n == 0 {
            return;
        }
        for i in 0..n {
            let (head, tail) = b.wrs.split_at_mut(i + 1);
            let p = &mut head[i];
            if !p.inline.is_empty() {
                p.sges[0].addr = p.inline.as_ptr() as u64;
            }
            p.wr.sg_list = if p.sges.is_empty() { std::ptr::null_mut() } else { p.sges.as_mut_ptr() };
            p.wr.next = tail.first_mut().map_or(std::ptr::null_mut(), |q| &mut q.wr as *mut SendWr);
        }
        let mut bad: *mut SendWr = std::ptr::null_mut();
        // SAFETY: live QP (not dead, checked by the caller under the lock); the list and its
        // buffers are owned by the batch and outlive the call (verbs copies or registers them).
        let r = unsafe { verbs::post_send(self.qp as *mut c_void, &mut b.wrs[0].wr, &mut bad) };
        if r == 0 {
            return;
        }
        let first_bad = b.wrs.iter().position(|p| std::ptr::eq(&p.wr, bad)).unwrap_or(0);
        let err = if r < 0 { Errno::last().0 } else { r };
        gds_err!(
            "gds_proxy",
            "ibv_post_send on QP {:#x} failed with {} for request {first_bad} of {n}: completing the rest with IBV_WC_LOC_QP_OP_ERR",
            self.qp_num,
            Errno(err).describe()
        );
        let mut g = lock(&self.send.inner);
        g.sq.clear();
        for p in &b.wrs[first_bad..] {
            if p.signaled {
                let wc = Wc {
                    wr_id: p.wr.wr_id,
                    status: verbs::IBV_WC_LOC_QP_OP_ERR,
                    opcode: p.wc_opcode,
                    vendor_err: err as u32,
                    qp_num: self.qp_num,
                    ..Wc::default()
                };
                self.send.push(&mut g, wc);
            }
        }
    }

    fn prepare_send(&self, wr: *mut c_void, bad_wr: *mut *mut c_void, request: &mut SendRequest) -> Result<()> {
        const F: &str = "gds_prepare_send";
        let set_bad = |p: *mut ExpSendWr| {
            if !bad_wr.is_null() {
                // SAFETY: non-NULL out pointer from the application.
                unsafe { *bad_wr = p.cast() };
            }
        };
        let mut wrs = Vec::new();
        let mut p = wr as *mut ExpSendWr;
        while !p.is_null() {
            if wrs.len() == MAX_WRS_PER_CALL {
                gds_err!(F, "more than {MAX_WRS_PER_CALL} work requests in one list");
                set_bad(p);
                return Err(Errno::EINVAL);
            }
            // SAFETY: a non-NULL element of the application's list (verbs contract).
            match unsafe { translate_wr(p, &self.cap, self.sig_all) } {
                Ok(w) => wrs.push(w),
                Err(why) => {
                    gds_err!(F, "work request {}: {why}", wrs.len());
                    set_bad(p);
                    return Err(Errno::EINVAL);
                }
            }
            // SAFETY: as above.
            p = unsafe { (*p).next };
        }
        if request.commit.entries < 2 {
            return Err(Errno(libc::ENOSPC));
        }
        let mut g = lock(&self.inner);
        if g.dead {
            return Err(Errno::EINVAL);
        }
        if wrs.is_empty() {
            request.commit.entries = 0;
            return Ok(());
        }
        {
            let mut s = lock(&self.send.inner);
            if s.sq.len() + wrs.len() > self.cap.max_send_wr as usize {
                gds_dbg!(F, "send queue full ({} outstanding, {} more)", s.sq.len(), wrs.len());
                set_bad(wr.cast());
                return Err(Errno::ENOMEM);
            }
            s.sq.extend(wrs.iter().map(|w| w.signaled));
        }
        g.prepared = g.prepared.wrapping_add(1);
        let seq = g.prepared;
        g.pending.push_back(Batch { seq, wrs });
        drop(g);
        request.wr[0].type_ = IBV_EXP_PEER_OP_FENCE;
        request.wr[0].wr.fence_flags =
            IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | IBV_EXP_PEER_FENCE_MEM_SYS;
        request.wr[1].type_ = IBV_EXP_PEER_OP_STORE_DWORD;
        request.wr[1].wr.dword_va = DwordVa { data: seq, target_id: self.trig_id, offset: 0 };
        request.wr[1].next = std::ptr::null_mut();
        request.commit.entries = 2;
        request.commit.rollback_id = seq as u64;
        wake();
        Ok(())
    }

    fn rollback(&self, id: u64) -> Result<()> {
        let seq = id as u32;
        let mut g = lock(&self.inner);
        if (seq.wrapping_sub(g.posted) as i32) <= 0 {
            gds_err!("gds_rollback_send", "send {seq} of QP {:#x} was already posted", self.qp_num);
            return Err(Errno::ERANGE);
        }
        let mut dropped = 0usize;
        while g.pending.back().is_some_and(|b| (b.seq.wrapping_sub(seq) as i32) >= 0) {
            if let Some(b) = g.pending.pop_back() {
                dropped += b.wrs.len();
            }
        }
        g.prepared = seq.wrapping_sub(1);
        let mut s = lock(&self.send.inner);
        for _ in 0..dropped {
            s.sq.pop_back();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy thread

/// The proxy thread, started once; `None` (reported once) if it could not be started.
fn proxy_thread() -> Option<&'static std::thread::Thread> {
    static T: OnceLock<Option<std::thread::Thread>> = OnceLock::new();
    T.get_or_init(|| match std::thread::Builder::new().name("gds-proxy".into()).spawn(run) {
        Ok(h) => Some(h.thread().clone()),
        Err(e) => {
            gds_err!("gds_proxy", "cannot start the proxy thread: {e}");
            None
        }
    })
    .as_ref()
}

static STARTED: AtomicBool = AtomicBool::new(false);

fn wake() {
    if STARTED.load(Ordering::Acquire)
        && let Some(t) = proxy_thread()
    {
        t.unpark();
    }
}

fn run() {
    let mut idle = 0u32;
    loop {
        let list: Vec<Arc<ProxyQp>> = lock(qps()).values().cloned().collect();
        if list.is_empty() {
            std::thread::park_timeout(Duration::from_millis(100));
            continue;
        }
        let mut busy = false;
        for q in &list {
            let mut why = None;
            match gpudirect_common::boundary::guard(None, |m| why = Some(m.to_owned()), || Some(q.service())) {
                Some(b) => busy |= b,
                None => {
                    drop(list);
                    fail(why.unwrap_or_default());
                    return;
                }
            }
        }
        drop(list);
        if busy {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        // Spin a little (a stream write lands any moment), then back off to at most 200 µs
        // between looks so an idle process does not burn a core.
        if idle < 64 {
            std::hint::spin_loop();
        } else if idle < 256 {
            std::thread::yield_now();
        } else {
            let us = ((idle - 256) as u64 * 2).clamp(5, 200);
            std::thread::park_timeout(Duration::from_micros(us));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The provider

pub struct Proxy;

/// Set once the proxy thread has failed: see the module documentation.
static FAILED: AtomicBool = AtomicBool::new(false);

/// `EIO` (with its line) once the proxy thread has failed.
fn check_alive(origin: &str) -> Result<()> {
    if FAILED.load(Ordering::Acquire) {
        gds_err!(origin, "the CPU-proxy thread has failed earlier (see above): EIO");
        return Err(Errno::EIO);
    }
    Ok(())
}

/// The proxy thread is gone (a panic): release every prepared stream wait, fail later calls.
fn fail(why: String) {
    FAILED.store(true, Ordering::Release);
    gds_err!(
        "gds_proxy",
        "the CPU-proxy thread failed ({why}): stream waits on proxy CQs are released, their ibv_poll_cq returns an error, and gds calls on proxy QPs fail with EIO from now on"
    );
    let list: Vec<Arc<ProxyCq>> = lock(cqs()).values().cloned().collect();
    for c in list {
        c.release_all_waits();
    }
}

/// `GDS_TEST_PROXY_PANIC_AFTER=N`: the proxy thread panics after posting its N-th batch (fault
/// injection for the tests; unset in normal use).
fn fault_injection_point() {
    static AFTER: OnceLock<Option<u64>> = OnceLock::new();
    static POSTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let after = *AFTER.get_or_init(|| std::env::var("GDS_TEST_PROXY_PANIC_AFTER").ok().and_then(|v| v.parse().ok()));
    if let Some(n) = after
        && POSTED.fetch_add(1, Ordering::Relaxed) + 1 >= n
    {
        panic!("fault injected by GDS_TEST_PROXY_PANIC_AFTER={n}");
    }
}

fn find_qp(qp: NonNull<GdsQp>) -> Result<Arc<ProxyQp>> {
    check_alive("gds_proxy")?;
    lock(qps()).get(&(qp.as_ptr() as usize)).cloned().ok_or_else(|| {
        gds_err!("gds_proxy", "QP {:p} was not created by gds_create_qp (or was destroyed)", qp.as_ptr());
        Errno::EINVAL
    })
}

fn find_cq(cq: NonNull<GdsCq>) -> Result<Arc<ProxyCq>> {
    check_alive("gds_proxy")?;
    // SAFETY: the caller passes a gds_cq (C layer contract); only its `cq` member is read.
    let raw = unsafe { (*cq.as_ptr()).cq } as usize;
    lock(cqs()).get(&raw).cloned().ok_or_else(|| {
        gds_err!("gds_proxy", "CQ {raw:#x} is not a CQ of a gds QP");
        Errno::EINVAL
    })
}

/// Creates a CQ of `cqe` entries with its registered words at `area.cpu + word` (counter) and
/// `area.cpu + flags` (busy flags, `npeek` of them).
///
/// # Safety
/// `raw` is a live CQ.
unsafe fn make_cq(
    raw: *mut c_void,
    orig: PollCqFn,
    area: &Area,
    word: usize,
    flags: usize,
    npeek: u32,
    is_send: bool,
) -> ProxyCq {
    // SAFETY: live CQ from ibv_create_cq.
    let cqe = unsafe { verbs::object_u32(raw, verbs::CQ_CQE) }.max(1);
    let r = ranges();
    let counter_id = r.register(Range { cpu: area.cpu + word, dev: area.dev + word as u64, len: 4 });
    let busy_id = r.register(Range { cpu: area.cpu + flags, dev: area.dev + flags as u64, len: 4 * npeek as usize });
    ProxyCq {
        cq: raw as usize,
        orig_poll: orig,
        ring: (cqe + 1).next_power_of_two(),
        counter: area.cpu + word,
        counter_id,
        busy: area.cpu + flags,
        busy_id,
        npeek,
        is_send,
        inner: Mutex::new(CqInner {
            queue: VecDeque::new(),
            produced: 0,
            consumed: 0,
            peeks: HashMap::new(),
            stale: Vec::new(),
            free: (0..npeek).rev().collect(),
            sq: VecDeque::new(),
            dead: false,
        }),
    }
}

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
        if proxy_thread().is_none() {
            return Err(Errno(libc::EAGAIN));
        }
        STARTED.store(true, Ordering::Release);
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
        let mut ia = QpInitAttr {
            qp_context: a.qp_context,
            send_cq: scq,
            recv_cq: rcq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
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
        // Write back what upstream's create writes into the caller's attributes.
        a.send_cq = scq;
        a.recv_cq = rcq;
        a.pd = pd;
        a.comp_mask |= IBV_EXP_QP_INIT_ATTR_PD | IBV_EXP_QP_INIT_ATTR_PEER_DIRECT;
        a.cap = ia.cap;
        let gds = Box::into_raw(Box::new(GdsQp {
            qp,
            send_cq: GdsCq { cq: scq, curr_offset: 0 },
            recv_cq: GdsCq { cq: rcq, curr_offset: 0 },
            res_domain: std::ptr::null_mut(),
            dev_context: ctx,
        }));
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
            inner: Mutex::new({
                let base = next_seq_base();
                QpInner { prepared: base, posted: base, stale_seen: false, pending: VecDeque::new(), dead: false }
            }),
        });
        {
            let mut c = lock(cqs());
            c.insert(scq as usize, send);
            c.insert(rcq as usize, recv);
        }
        lock(qps()).insert(gds as usize, pq);
        wake();
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
        match unsafe { verbs::post_recv(q.qp as *mut c_void, wr, bad_wr) } {
            0 => Ok(()),
            r if r < 0 => Err(Errno::last()),
            r => Err(Errno(r)),
        }
    }
    unsafe fn prepare_send(
        &self,
        qp: NonNull<GdsQp>,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
    ) -> Result<()> {
        find_qp(qp)?.prepare_send(wr, bad_wr, request)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_layouts() {
        assert_eq!(std::mem::size_of::<ExpSendWr>(), 288);
        assert_eq!(std::mem::offset_of!(ExpSendWr, exp_opcode), 28);
        assert_eq!(std::mem::offset_of!(ExpSendWr, imm_data), 36);
        assert_eq!(std::mem::offset_of!(ExpSendWr, wr), 40);
        assert_eq!(std::mem::offset_of!(ExpSendWr, qp_type), 72);
        assert_eq!(std::mem::offset_of!(ExpSendWr, dc), 128);
        assert_eq!(std::mem::offset_of!(ExpSendWr, bind_tso), 152);
        assert_eq!(std::mem::offset_of!(ExpSendWr, exp_send_flags), 200);
        assert_eq!(std::mem::offset_of!(ExpSendWr, comp_mask), 208);
        assert_eq!(std::mem::size_of::<ExpQpInitAttr>(), 152);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, cap), 32);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, comp_mask), 60);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, pd), 64);
        assert_eq!(std::mem::offset_of!(ExpQpInitAttr, exp_create_flags), 80);
    }

    fn exp(opcode: u32, flags: u64, sg: &mut [Sge]) -> ExpSendWr {
        // SAFETY: all-zero is a valid ExpSendWr.
        let mut w: ExpSendWr = unsafe { std::mem::zeroed() };
        w.wr_id = 77;
        w.exp_opcode = opcode;
        w.exp_send_flags = flags;
        w.sg_list = sg.as_mut_ptr();
        w.num_sge = sg.len() as c_int;
        w.imm_data = 0x1234;
        w.wr = [0x1000, 0x55, 0, 0];
        w
    }

    #[test]
    fn translation_checks_and_copies() {
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 8 };
        let data = *b"abcdefgh";
        let mut sg = [
            Sge { addr: data.as_ptr() as u64, length: 5, lkey: 9 },
            Sge { addr: data.as_ptr() as u64 + 5, length: 3, lkey: 9 },
        ];
        // SAFETY: valid wrs over live buffers.
        unsafe {
            let w = exp(3, IBV_EXP_SEND_SIGNALED, &mut sg);
            let p = translate_wr(&w, &cap, false).unwrap();
            assert_eq!(
                (p.wr.opcode, p.wr.send_flags, p.wr.imm_data, p.wr.wr[0], p.wr.num_sge),
                (3, 2, 0x1234, 0x1000, 2)
            );
            assert!(p.signaled && p.inline.is_empty() && p.wc_opcode == 0);
            let w = exp(0, IBV_EXP_SEND_INLINE, &mut sg);
            let p = translate_wr(&w, &cap, true).unwrap();
            assert_eq!(p.inline, b"abcdefgh".to_vec(), "inline payload copied at prepare time");
            assert_eq!((p.sges.len(), p.sges[0].length, p.wc_opcode), (1, 8, 1));
            assert!(p.signaled, "sq_sig_all makes every request signaled");
            let mut sg9 = [Sge { addr: data.as_ptr() as u64, length: 9, lkey: 0 }];
            let w = exp(0, IBV_EXP_SEND_INLINE, &mut sg9);
            assert!(translate_wr(&w, &cap, false).is_err(), "inline above max_inline_data");
            let mut sg3 = [sg[0]; 3];
            assert!(translate_wr(&exp(2, 0, &mut sg3), &cap, false).is_err(), "too many SGEs");
            assert!(translate_wr(&exp(0x60, 0, &mut sg), &cap, false).is_err(), "SEND_ENABLE unsupported");
            assert!(translate_wr(&exp(2, 1 << 34, &mut sg), &cap, false).is_err(), "unknown flag");
            let mut w = exp(2, 0, &mut sg);
            w.comp_mask = 1;
            assert!(translate_wr(&w, &cap, false).is_err());
            let w = exp(0x4f, IBV_EXP_SEND_IP_CSUM, &mut sg);
            let p = translate_wr(&w, &cap, false).unwrap();
            assert_eq!((p.wr.opcode, p.wr.send_flags, p.wc_opcode), (10, IBV_SEND_IP_CSUM, 7));
        }
    }

    #[test]
    fn triggers_outside_the_window_are_ignored() {
        // Normal: posted 10, prepared 13: 11..=13 post, 10 is nothing new.
        assert_eq!(triggered(12, 10, 13), Some(12));
        assert_eq!(triggered(13, 10, 13), Some(13));
        assert_eq!(triggered(10, 10, 13), None);
        // Beyond what was prepared, or behind: a stale write from another QP's life.
        assert_eq!(triggered(14, 10, 13), None);
        assert_eq!(triggered(9, 10, 13), None);
        assert_eq!(triggered(0, 10, 13), None, "the zeroed word of a reused page");
        // Across the 2^32 wrap.
        assert_eq!(triggered(1, u32::MAX - 1, 2), Some(1));
        assert_eq!(triggered(3, u32::MAX - 1, 2), None);
        // A new QP's base keeps an old QP's values out of its window.
        let (a, b) = (next_seq_base(), next_seq_base());
        assert_eq!(b.wrapping_sub(a), 1 << 24);
        assert_eq!(triggered(a.wrapping_add(5), b, b.wrapping_add(3)), None);
        assert_eq!(triggered(b.wrapping_add(2), b, b.wrapping_add(3)), Some(b.wrapping_add(2)));
    }

    #[test]
    fn mofed_exp_opcodes_translate_to_rdma_core_ones() {
        // MOFED's IBV_EXP_WR_SEND_WITH_INV / LOCAL_INV / BIND_MW are 0x48 / 0x4a / 0x4e.
        assert_eq!(map_opcode(0x48), Some((9, 0)), "SEND_WITH_INV → IBV_WR_SEND_WITH_INV, IBV_WC_SEND");
        assert_eq!(map_opcode(0x4a), Some((7, 6)), "LOCAL_INV → IBV_WR_LOCAL_INV, IBV_WC_LOCAL_INV");
        assert_eq!(map_opcode(0x4e), None, "BIND_MW has no ibv_post_send form");
        for raw in [7, 8, 9, 10] {
            assert_eq!(map_opcode(raw), None, "rdma-core value {raw} is not an exp opcode");
        }
    }

    /// Completions the fake `poll_cq` hands out (the "device").
    static FAKE_WCS: Mutex<VecDeque<Wc>> = Mutex::new(VecDeque::new());

    unsafe extern "C" fn fake_poll(_cq: *mut c_void, n: c_int, out: *mut Wc) -> c_int {
        let mut q = lock(&FAKE_WCS);
        let mut k = 0;
        while k < n as usize {
            let Some(w) = q.pop_front() else { break };
            // SAFETY: the caller passes room for n completions.
            unsafe { out.add(k).write(w) };
            k += 1;
        }
        k as c_int
    }

    fn wc(id: u64) -> Wc {
        Wc { wr_id: id, ..Wc::default() }
    }

    #[test]
    fn cq_queue_blocking_peeks_and_sq_accounting() {
        // A fake ibv_cq (only `cqe` is read) and a plain host area standing in for the registered one.
        let mut fake_cq = [0u8; 64];
        fake_cq[verbs::CQ_CQE..verbs::CQ_CQE + 4].copy_from_slice(&7u32.to_ne_bytes());
        let mem = vec![0u32; 1024];
        let area = Area { cpu: mem.as_ptr() as usize, dev: 0x7000_0000, len: 4096 };
        // SAFETY: the fake CQ has `cqe` at its offset; the area outlives the CQ.
        let cq = unsafe { make_cq(fake_cq.as_mut_ptr().cast(), fake_poll, &area, 64, 256, 8, true) };
        assert_eq!((cq.ring, cq.npeek), (8, 8));
        // SAFETY: the counter word lies inside `mem`.
        let counter = |c: &ProxyCq| unsafe { load(c.counter) };
        let mut out = [Wc::default(); 8];
        // SAFETY: all-zero is a valid WaitRequest.
        let mut req: Box<WaitRequest> = Box::new(unsafe { std::mem::zeroed() });
        req.peek.entries = 32;
        req.peek.offset = 0;
        cq.prepare_wait(&mut req).unwrap();
        assert_eq!(req.peek.entries, 2);
        // SAFETY: union reads of the ops just written.
        let (p0, p1) = unsafe { (req.wr[0].wr.dword_va, req.wr[1].wr.dword_va) };
        assert_eq!((req.wr[0].type_, p0.data, p0.target_id), (IBV_EXP_PEER_OP_POLL_GEQ_DWORD, 1, cq.counter_id));
        assert_eq!((req.wr[1].type_, p1.data, p1.target_id), (IBV_EXP_PEER_OP_STORE_DWORD, 0, cq.busy_id));
        let r = ranges().get(cq.counter_id).unwrap();
        assert_eq!(r.dev_addr(0, 4).unwrap(), 0x7000_0000 + 64);
        let first_peek = req.peek.peek_id;
        lock(&cq.inner).sq.extend([false, true, false]);
        lock(&FAKE_WCS).extend([wc(10), wc(11)]);
        assert_eq!(cq.poll_app(8, out.as_mut_ptr()), 0, "CQE 0 is held until its wait runs");
        assert_eq!(counter(&cq), 2, "the counter the stream polls counts every completion");
        assert_eq!(lock(&cq.inner).sq.len(), 0, "two completions retired unsignaled+signaled, then the last");
        cq.abort_wait(first_peek).unwrap();
        assert_eq!(cq.poll_app(8, out.as_mut_ptr()), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (10, 11));
        // A wait for an already consumed CQE: its flag is reclaimed once released.
        req.peek.offset = 1;
        cq.prepare_wait(&mut req).unwrap();
        assert_eq!(lock(&cq.inner).stale.len(), 1);
        cq.abort_wait(req.peek.peek_id).unwrap();
        assert_eq!(cq.poll_app(8, out.as_mut_ptr()), 0);
        assert_eq!(lock(&cq.inner).stale.len(), 0);
        // More than one ring ahead of the consumer index (2): E2BIG; all flags taken: ENOMEM.
        req.peek.offset = 2 + 8;
        assert_eq!(cq.prepare_wait(&mut req), Err(Errno(libc::E2BIG)));
        for n in 2..10 {
            req.peek.offset = n;
            cq.prepare_wait(&mut req).unwrap();
        }
        req.peek.offset = 9;
        assert_eq!(cq.prepare_wait(&mut req), Err(Errno::ENOMEM));
        assert_eq!(cq.abort_wait(0x1234), Err(Errno::EINVAL), "foreign peek id");
        req.peek.whence = 1;
        assert_eq!(cq.prepare_wait(&mut req), Err(Errno::EINVAL), "relative peeks");
        let _ = ranges().unregister(cq.counter_id);
        let _ = ranges().unregister(cq.busy_id);
    }
}
