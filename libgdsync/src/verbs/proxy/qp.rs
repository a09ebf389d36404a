//! The QPs of the CPU-proxy provider: a prepared send is a batch of copied work requests
//! numbered in the QP's own sequence, rung by a store of its number to the QP's trigger word;
//! [`ProxyQp::service`] (the proxy thread, or the caller of `gds_post_send`) posts every batch up
//! to the trigger with `ibv_post_send`, in order, and drains the QP's two CQs.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::sync::lock;
use crate::verbs::area::{Area, load};
use crate::verbs::exp::ExpSendWr;
use crate::verbs::ibv::{self as verbs, QpCap, SendWr, Wc};
use crate::verbs::proxy::cq::{ProxyCq, check_alive};
use crate::verbs::proxy::wr::{MAX_WRS_PER_CALL, PreparedWr, translate_wr};

pub(super) struct Batch {
    seq: u32,
    wrs: Vec<PreparedWr>,
}

// SAFETY: the raw pointers inside a batch's SendWrs point into the batch's own heap buffers
// (linked just before posting); nothing is shared with other threads.
unsafe impl Send for Batch {}

pub(super) struct QpInner {
    prepared: u32,
    posted: u32,
    /// A stale trigger value was seen (reported once per QP).
    stale_seen: bool,
    pub(super) pending: VecDeque<Batch>,
    pub(super) dead: bool,
}

pub(super) struct ProxyQp {
    pub(super) gds: usize,
    /// The verbs context (whose poll_cq hook this QP uses).
    pub(super) ctx: usize,
    pub(super) qp: usize,
    pub(super) qp_num: u32,
    pub(super) send: Arc<ProxyCq>,
    pub(super) recv: Arc<ProxyCq>,
    pub(super) trig: usize,
    pub(super) trig_id: u64,
    pub(super) area: Area,
    pub(super) cap: QpCap,
    pub(super) sig_all: bool,
    pub(super) inner: Mutex<QpInner>,
}

pub(super) fn qps() -> &'static Mutex<HashMap<usize, Arc<ProxyQp>>> {
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

impl QpInner {
    /// A new QP's send state: nothing prepared or posted, numbered from its own base
    /// ([`next_seq_base`]).
    pub(super) fn new() -> QpInner {
        let base = next_seq_base();
        QpInner { prepared: base, posted: base, stale_seen: false, pending: VecDeque::new(), dead: false }
    }
}

impl ProxyQp {
    /// Posts the batches the trigger word asks for and drains both CQs. Returns whether
    /// anything happened.
    pub(super) fn service(&self) -> bool {
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

    pub(super) fn prepare_send(
        &self,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: &mut SendRequest,
    ) -> Result<()> {
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
        Ok(())
    }

    pub(super) fn rollback(&self, id: u64) -> Result<()> {
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

pub(super) fn find_qp(qp: NonNull<GdsQp>) -> Result<Arc<ProxyQp>> {
    check_alive("gds_proxy")?;
    lock(qps()).get(&(qp.as_ptr() as usize)).cloned().ok_or_else(|| {
        gds_err!("gds_proxy", "QP {:p} was not created by gds_create_qp (or was destroyed)", qp.as_ptr());
        Errno::EINVAL
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
