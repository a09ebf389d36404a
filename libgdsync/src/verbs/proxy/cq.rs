//! The CQs of the CPU-proxy provider: completions moved by the proxy thread from the real CQ
//! into a software queue and counted in a registered word (what a stream wait polls), the busy
//! flags of prepared waits (upstream's peek entries), and the application's `ibv_poll_cq` on
//! that queue through the `poll_cq` hook. Also the provider's failed state (see the module doc):
//! set by the thread, it is what a CQ poll and every later lookup answer to.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::ranges::{Range, ranges};
use crate::sync::lock;
use crate::verbs::area::{Area, load, store};
use crate::verbs::ibv::{self as verbs, PollCqFn, Wc};

const PEEK_TAG: u64 = 0x7065_656b << 32;

pub(super) struct CqInner {
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
    pub(super) sq: VecDeque<bool>,
    pub(super) dead: bool,
}

pub(super) struct ProxyCq {
    pub(super) cq: usize,
    orig_poll: PollCqFn,
    ring: u32,
    counter: usize,
    pub(super) counter_id: u64,
    busy: usize,
    pub(super) busy_id: u64,
    npeek: u32,
    is_send: bool,
    pub(super) inner: Mutex<CqInner>,
}

impl ProxyCq {
    fn busy_addr(&self, e: u32) -> usize {
        self.busy + 4 * e as usize
    }

    fn is_busy(&self, e: u32) -> bool {
        // SAFETY: e < npeek, inside this CQ's registered area (alive while the CQ is).
        unsafe { load(self.busy_addr(e)) != 0 }
    }

    pub(super) fn push(&self, g: &mut CqInner, wc: Wc) {
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
    pub(super) fn drain(&self, g: &mut CqInner) -> bool {
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

    pub(super) fn prepare_wait(&self, request: &mut WaitRequest) -> Result<()> {
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
    pub(super) fn release_all_waits(&self) {
        let g = lock(&self.inner);
        // SAFETY: the counter word of this CQ's live area.
        unsafe { store(self.counter, g.consumed.wrapping_add(self.ring)) };
    }

    pub(super) fn abort_wait(&self, peek_id: u64) -> Result<()> {
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

/// The poll_cq hook's question ([`crate::verbs::hook::Claim`]): is `cq` one of ours?
pub(crate) fn poll_claim(cq: *mut c_void, n: c_int, wc: *mut Wc) -> Option<c_int> {
    let ours = lock(cqs()).get(&(cq as usize)).cloned()?;
    Some(ours.poll_app(n, wc))
}

pub(super) fn cqs() -> &'static Mutex<HashMap<usize, Arc<ProxyCq>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<ProxyCq>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Set once the proxy thread has failed: see the module documentation.
pub(super) static FAILED: AtomicBool = AtomicBool::new(false);

/// `EIO` (with its line) once the proxy thread has failed.
pub(super) fn check_alive(origin: &str) -> Result<()> {
    if FAILED.load(Ordering::Acquire) {
        gds_err!(origin, "the CPU-proxy thread has failed earlier (see above): EIO");
        return Err(Errno::EIO);
    }
    Ok(())
}

pub(super) fn find_cq(cq: NonNull<GdsCq>) -> Result<Arc<ProxyCq>> {
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
pub(super) unsafe fn make_cq(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Completions the fake `poll_cq` hands out (the "device").
    static FAKE_WCS: Mutex<VecDeque<Wc>> = Mutex::new(VecDeque::new());

    /// The device's `poll_cq`: hands out up to `n` queued completions.
    ///
    /// # Safety
    /// `out` is valid for `n` `Wc` writes, as `ibv_poll_cq` requires.
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
