//! The Rust API over the same core as the C ABI: [`Controller`], [`DmaWindow`], [`AdminQueue`]
//! (re-exported from the core, whose methods are safe), plus [`IoQueuePair`], an I/O queue pair
//! in host memory driven from one thread.

#![forbid(unsafe_code)]

use std::ffi::c_void;

use gpudirect_common::Errno;

use crate::abi::{NvmCmd, NvmCpl, NvmQueue};
pub use crate::admin::AdminQueue;
pub use crate::ctrl::Controller;
pub use crate::dma::DmaWindow;
use crate::mmio::{Regs, Ring};
use crate::queue;
use crate::regs;
use crate::status::Result;

/// An I/O submission/completion queue pair whose rings are host memory this process can read.
#[derive(Debug)]
pub struct IoQueuePair {
    pub sq: NvmQueue,
    pub cq: NvmQueue,
    sq_ring: Ring,
    cq_ring: Ring,
    regs: Regs,
    dstrd: u8,
}

impl IoQueuePair {
    /// Creates CQ `id` and SQ `id` (bound to it) on the controller. `cq_ring`/`sq_ring` are the
    /// CPU views of one page each, `cq_io`/`sq_io` their bus addresses; the rings are zeroed here.
    pub fn create(
        aq: &AdminQueue,
        id: u16,
        cq_ring: Ring,
        cq_io: u64,
        sq_ring: Ring,
        sq_io: u64,
    ) -> Result<IoQueuePair> {
        cq_ring.zero();
        sq_ring.zero();
        let cq = aq.cq_create(id, cq_ring.slot_ptr(0), cq_io)?;
        let sq = match aq.sq_create(&cq, id, sq_ring.slot_ptr(0), sq_io) {
            Ok(sq) => sq,
            Err(e) => {
                let mut cq = cq;
                let _ = aq.cq_delete(&mut cq);
                return Err(e);
            }
        };
        let c = aq.controller();
        Ok(IoQueuePair { sq, cq, sq_ring, cq_ring, regs: *c.regs(), dstrd: c.cap().dstrd })
    }

    /// Queues a command (its CID is set to the slot's default CID, returned); `EAGAIN` when full.
    /// Nothing reaches the controller before [`submit`](Self::submit).
    pub fn enqueue(&mut self, cmd: &NvmCmd) -> Result<u16> {
        let slot = queue::sq_enqueue(&mut self.sq).ok_or(Errno::EAGAIN)?;
        let cid = queue::default_cid(&self.sq);
        let mut c = *cmd;
        c.set_cid(cid);
        self.sq_ring.write_cmd(slot, &c);
        Ok(cid)
    }

    /// Rings the SQ doorbell once for everything enqueued since the last ring.
    pub fn submit(&mut self) {
        if self.sq.last != self.sq.tail {
            self.regs.write32(regs::doorbell(self.dstrd, self.sq.no, false), self.sq.tail);
            self.sq.last = self.sq.tail;
        }
    }

    /// Takes one completion if posted, frees its SQ slot (from SQHD) and updates the CQ head
    /// doorbell.
    pub fn poll(&mut self) -> Option<NvmCpl> {
        let slot = queue::cq_dequeue(&mut self.cq, &self.cq_ring)?;
        let cpl = self.cq_ring.read_cpl(slot);
        self.sq.head = u32::from(cpl.sqhd()) % u32::from(self.sq.max_entries);
        self.regs.write32(regs::doorbell(self.dstrd, self.cq.no, true), self.cq.head);
        self.cq.last = self.cq.head;
        Some(cpl)
    }

    /// Waits up to `timeout_ms` for one completion.
    pub fn wait(&mut self, timeout_ms: u64) -> Option<NvmCpl> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
        loop {
            if let Some(c) = self.poll() {
                return Some(c);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Deletes the SQ, then the CQ.
    pub fn delete(mut self, aq: &AdminQueue) -> Result<()> {
        aq.sq_delete(&mut self.sq, &self.cq)?;
        aq.cq_delete(&mut self.cq)
    }

    /// Address of the SQ ring (for callers that build PRP lists next to it).
    pub fn sq_vaddr(&self) -> *mut c_void {
        self.sq.vaddr
    }
}
