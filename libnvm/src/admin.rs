//! The admin queue pair and the admin RPC: one reference serialises every admin command of a
//! controller (spec §A5.3–A5.4), plus the admin commands built on it.
//!
//! Departures from upstream, each invisible to a correct consumer (docs/storage.md):
//! the ACQ head doorbell is written after every completion (upstream never writes it, so its
//! 64th command times out), completions are matched by CID (a late completion of a timed-out
//! command is discarded instead of answering the next one), the SQ head follows the controller's
//! SQHD, and a failed reset fails `nvm_aq_create`.

#![forbid(unsafe_code)]

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use gpudirect_common::Errno;

use crate::abi::{NVM_CMD_NS_ALL, NvmCmd, NvmCpl, NvmCtrlInfo, NvmNsInfo, NvmQueue, admin_op};
use crate::ctrl::Controller;
use crate::mmio::Ring;
use crate::queue;
use crate::regs;
use crate::status::{ETIME, Error, Result, check};

#[derive(Debug)]
struct Local {
    acq: NvmQueue,
    asq: NvmQueue,
    acq_ring: Ring,
    asq_ring: Ring,
    /// Commands submitted whose completion has not been seen (timed out).
    stale: u32,
}

/// An admin queue reference (`nvm_aq_ref`).
#[derive(Debug)]
pub struct AdminQueue {
    ctrl: Arc<Controller>,
    /// The local queue pair: this build's only transport (a cluster binding answers
    /// `EOPNOTSUPP`, see [`AdminQueue::bind_cluster`]).
    local: Mutex<Local>,
}

/// A 4 KiB buffer the controller can write (identify, log pages): CPU address and bus address.
#[derive(Debug, Clone, Copy)]
pub struct DataBuf<'a> {
    pub cpu: &'a [std::cell::Cell<u8>],
    pub ioaddr: u64,
}

impl AdminQueue {
    /// `nvm_aq_create`: page 0 of the window becomes the ACQ, page 1 the ASQ; both are zeroed,
    /// the controller is reset and enabled with them.
    ///
    /// `acq_ring`/`asq_ring` are the CPU views of those pages, `ioaddrs` their bus addresses.
    pub fn create(
        ctrl: Arc<Controller>,
        acq_ring: Ring,
        asq_ring: Ring,
        acq_io: u64,
        asq_io: u64,
    ) -> Result<AdminQueue> {
        acq_ring.zero();
        asq_ring.zero();
        let h = ctrl.handle();
        let mut acq = NvmQueue::default();
        let mut asq = NvmQueue::default();
        let ps = ctrl.page_size();
        queue::clear(
            &mut acq,
            h.max_entries,
            ps,
            (h.mm_ptr, h.mm_size),
            h.dstrd,
            true,
            0,
            std::ptr::null_mut(),
            acq_io,
        );
        queue::clear(
            &mut asq,
            h.max_entries,
            ps,
            (h.mm_ptr, h.mm_size),
            h.dstrd,
            false,
            0,
            std::ptr::null_mut(),
            asq_io,
        );
        ctrl.reset(acq_io, asq_io)?;
        let local = Local { acq, asq, acq_ring, asq_ring, stale: 0 };
        Ok(AdminQueue { ctrl, local: Mutex::new(local) })
    }

    /// A reference over a cluster (SmartIO) binding. This build has no SISCI transport: the
    /// call answers `EOPNOTSUPP`, the value every cluster entry point of this library returns.
    pub fn bind_cluster(_ctrl: Arc<Controller>, _adapter: u32) -> Result<AdminQueue> {
        nvm_err!("nvm_dis_rpc_bind", "No SmartIO/SISCI support in this build");
        Err(Errno::EOPNOTSUPP.into())
    }

    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    fn local(&self) -> Result<MutexGuard<'_, Local>> {
        Ok(self.local.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs one admin command and returns its completion, whatever its status; the completion
    /// carries the caller's CID (as upstream restores it). `ETIME` when no completion arrives
    /// within CAP.TO.
    pub fn raw(&self, cmd: &NvmCmd) -> Result<NvmCpl> {
        let mut l = self.local()?;
        let l = &mut *l;
        let Some(slot) = queue::sq_enqueue(&mut l.asq) else {
            return Err(Errno::EAGAIN.into());
        };
        let cid = queue::default_cid(&l.asq);
        let mut c = *cmd;
        c.set_cid(cid);
        l.asq_ring.write_cmd(slot, &c);
        let regs = self.ctrl.regs();
        let dstrd = self.ctrl.cap().dstrd;
        regs.write32(regs::doorbell(dstrd, 0, false), l.asq.tail);
        l.asq.last = l.asq.tail;
        let timeout = self.ctrl.timeout_ms().max(1);
        loop {
            let Some(cslot) = queue::cq_dequeue_block(&mut l.acq, &l.acq_ring, timeout) else {
                l.stale += 1;
                nvm_err!("execute_command", "Waiting for admin queue completion timed out");
                return Err(Error::Os(ETIME));
            };
            let mut cpl = l.acq_ring.read_cpl(cslot);
            // Free the CQ slot at once, so the controller never finds the ACQ full.
            regs.write32(regs::doorbell(dstrd, 0, true), l.acq.head);
            l.acq.last = l.acq.head;
            l.asq.head = u32::from(cpl.sqhd()) % u32::from(l.asq.max_entries.max(1));
            if cpl.cid() != cid {
                l.stale = l.stale.saturating_sub(1);
                nvm_warn!("execute_command", "Discarding a late completion (CID {}, expected {cid})", cpl.cid());
                continue;
            }
            cpl.dword[3] = (cpl.dword[3] & 0xffff_0000) | u32::from(cmd.cid());
            return Ok(cpl);
        }
    }

    /// Runs a command and turns an error status into `Err`.
    pub fn run(&self, cmd: &NvmCmd) -> Result<NvmCpl> {
        check(self.raw(cmd)?)
    }

    /// Identify Controller (CNS 1) into `buf`, decoded with the register facts.
    pub fn ctrl_info(&self, buf: &[std::cell::Cell<u8>], ioaddr: u64) -> Result<NvmCtrlInfo> {
        if buf.len() < 4096 || ioaddr == 0 {
            return Err(Errno::EINVAL.into());
        }
        buf[..4096].iter().for_each(|b| b.set(0));
        let c = &self.ctrl;
        let h = c.handle();
        let regs = c.regs();
        let mut info = NvmCtrlInfo {
            nvme_version: regs.read32(regs::VS),
            page_size: h.page_size,
            db_stride: 1usize << h.dstrd,
            timeout: h.timeout,
            contiguous: i32::from(c.cap().cqr),
            max_entries: h.max_entries,
            ..Default::default()
        };
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::IDENTIFY, 0);
        cmd.data_ptr(ioaddr, 0);
        cmd.dword[10] = 1;
        self.run(&cmd)?;
        let b = |i: usize| buf[i].get();
        for i in 0..4 {
            info.pci_vendor[i] = b(i);
        }
        for i in 0..20 {
            info.serial_no[i] = b(4 + i);
        }
        for i in 0..40 {
            info.model_no[i] = b(24 + i);
        }
        for i in 0..8 {
            info.firmware[i] = b(64 + i);
        }
        let mdts = b(77);
        let min_page = 1usize << (12 + c.cap().mpsmin);
        info.max_data_size = if mdts == 0 {
            // "No limit": the most one command built with the PRP helpers can describe (PRP1
            // plus one list page), not upstream's single page.
            (1 + h.page_size / 8) * h.page_size
        } else {
            (1usize << mdts.min(20)) * min_page
        };
        info.max_data_pages = info.max_data_size / h.page_size;
        info.sq_entry_size = 1 << (b(512) & 0xf);
        info.cq_entry_size = 1 << (b(513) & 0xf);
        info.max_out_cmds = usize::from(u16::from_le_bytes([b(514), b(515)]));
        info.max_n_ns = u32::from_le_bytes([b(516), b(517), b(518), b(519)]) as usize;
        Ok(info)
    }

    /// Identify Namespace (CNS 0) of `ns_id` into `buf`.
    pub fn ns_info(&self, ns_id: u32, buf: &[std::cell::Cell<u8>], ioaddr: u64) -> Result<NvmNsInfo> {
        if buf.len() < 4096 || ioaddr == 0 {
            return Err(Errno::EINVAL.into());
        }
        buf[..4096].iter().for_each(|b| b.set(0));
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::IDENTIFY, ns_id);
        cmd.data_ptr(ioaddr, 0);
        cmd.dword[10] = 0;
        self.run(&cmd)?;
        let u64_at = |o: usize| {
            let mut v = [0u8; 8];
            for (i, x) in v.iter_mut().enumerate() {
                *x = buf[o + i].get();
            }
            u64::from_le_bytes(v)
        };
        let flbas = usize::from(buf[26].get() & 0xf);
        let lbaf = 128 + 4 * flbas;
        let ms = u16::from_le_bytes([buf[lbaf].get(), buf[lbaf + 1].get()]);
        let lbads = buf[lbaf + 2].get();
        Ok(NvmNsInfo {
            ns_id,
            size: u64_at(0),
            capacity: u64_at(8),
            utilization: u64_at(16),
            lba_data_size: 1usize << lbads.min(63),
            metadata_size: usize::from(ms),
        })
    }

    /// Get Log Page `log_id` (4096 bytes: NUMDL 1023, upstream asks for 4100 with PRP2 = 0).
    pub fn get_log_page(
        &self,
        ns_id: u32,
        buf: &[std::cell::Cell<u8>],
        ioaddr: u64,
        log_id: u8,
        offset: u64,
    ) -> Result<()> {
        if buf.len() < 4096 || ioaddr == 0 {
            return Err(Errno::EINVAL.into());
        }
        buf[..4096].iter().for_each(|b| b.set(0));
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::GET_LOG_PAGE, ns_id);
        cmd.data_ptr(ioaddr, 0);
        cmd.dword[10] = (1023 << 16) | u32::from(log_id);
        cmd.dword[12] = offset as u32;
        cmd.dword[13] = (offset >> 32) as u32;
        self.run(&cmd).map(|_| ())
    }

    /// Set Features Number of Queues; returns the granted (CQs, SQs), decoded as the spec says
    /// (DW0 31:16 = NCQA, 15:0 = NSQA; upstream swaps them).
    pub fn request_num_queues(&self, n_cqs: u16, n_sqs: u16) -> Result<(u16, u16)> {
        if n_cqs == 0 || n_sqs == 0 {
            return Err(Errno::EINVAL.into());
        }
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::SET_FEATURES, 0);
        cmd.dword[10] = 0x07;
        cmd.dword[11] = (u32::from(n_cqs - 1) << 16) | u32::from(n_sqs - 1);
        let cpl = self.run(&cmd)?;
        Ok(decode_num_queues(cpl.dword[0]))
    }

    /// Get Features Number of Queues (current): (CQs, SQs).
    pub fn get_num_queues(&self) -> Result<(u16, u16)> {
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::GET_FEATURES, 0);
        cmd.dword[10] = 0x07;
        let cpl = self.run(&cmd)?;
        Ok(decode_num_queues(cpl.dword[0]))
    }

    /// Create I/O Completion Queue `id` (one page at `ioaddr`, physically contiguous, no
    /// interrupts). `qmem` is only recorded, never touched (it may be GPU memory).
    pub fn cq_create(&self, id: u16, qmem: *mut c_void, ioaddr: u64) -> Result<NvmQueue> {
        let mut q = self.new_queue(true, id, qmem, ioaddr)?;
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::CREATE_CQ, 0);
        cmd.data_ptr(ioaddr, 0);
        cmd.dword[10] = (u32::from(q.max_entries - 1) << 16) | u32::from(id);
        cmd.dword[11] = 1;
        self.run(&cmd)?;
        q.head = 0;
        Ok(q)
    }

    /// Create I/O Submission Queue `id` bound to `cq`.
    pub fn sq_create(&self, cq: &NvmQueue, id: u16, qmem: *mut c_void, ioaddr: u64) -> Result<NvmQueue> {
        let q = self.new_queue(false, id, qmem, ioaddr)?;
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::CREATE_SQ, 0);
        cmd.data_ptr(ioaddr, 0);
        cmd.dword[10] = (u32::from(q.max_entries - 1) << 16) | u32::from(id);
        cmd.dword[11] = (u32::from(cq.no) << 16) | 1;
        self.run(&cmd)?;
        Ok(q)
    }

    fn new_queue(&self, cq: bool, id: u16, qmem: *mut c_void, ioaddr: u64) -> Result<NvmQueue> {
        if id == 0 {
            return Err(Errno::EINVAL.into());
        }
        let c = &self.ctrl;
        let h = c.handle();
        let mut q = NvmQueue::default();
        queue::clear(&mut q, h.max_entries, h.page_size, (h.mm_ptr, h.mm_size), h.dstrd, cq, id, qmem, ioaddr);
        if q.db.is_null() {
            // The doorbell lies beyond the register mapping (upstream hands out a pointer past it).
            return Err(Errno::EINVAL.into());
        }
        if q.max_entries < 2 {
            return Err(Errno::EINVAL.into());
        }
        Ok(q)
    }

    /// Delete I/O Completion Queue; marks the descriptor deleted (db = NULL).
    pub fn cq_delete(&self, cq: &mut NvmQueue) -> Result<()> {
        if cq.db.is_null() {
            return Err(Errno::EINVAL.into());
        }
        self.delete(admin_op::DELETE_CQ, cq.no)?;
        cq.db = std::ptr::null_mut();
        Ok(())
    }

    /// Delete I/O Submission Queue; `cq` must still be live.
    pub fn sq_delete(&self, sq: &mut NvmQueue, cq: &NvmQueue) -> Result<()> {
        if sq.db.is_null() || cq.db.is_null() {
            return Err(Errno::EINVAL.into());
        }
        self.delete(admin_op::DELETE_SQ, sq.no)?;
        sq.db = std::ptr::null_mut();
        Ok(())
    }

    fn delete(&self, op: u8, id: u16) -> Result<()> {
        let mut cmd = NvmCmd::default();
        cmd.header(0, op, 0);
        cmd.dword[10] = u32::from(id);
        self.run(&cmd).map(|_| ())
    }

    /// Abort command `cid` of submission queue `sqid`; true when the controller aborted it.
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool> {
        let mut cmd = NvmCmd::default();
        cmd.header(0, admin_op::ABORT, 0);
        cmd.dword[10] = (u32::from(cid) << 16) | u32::from(sqid);
        let cpl = self.run(&cmd)?;
        Ok(cpl.dword[0] & 1 == 0)
    }

    /// Commands that timed out and whose completion has not arrived since.
    pub fn stale_commands(&self) -> u32 {
        self.local().map(|l| l.stale).unwrap_or(0)
    }
}

/// Number of Queues DW0 → (CQs, SQs): 31:16 NCQA, 15:0 NSQA, both 0-based.
pub fn decode_num_queues(dw0: u32) -> (u16, u16) {
    (((dw0 >> 16) as u16).saturating_add(1), (dw0 as u16).saturating_add(1))
}

/// The namespace id meaning "all", for callers of [`AdminQueue::get_log_page`].
pub const NS_ALL: u32 = NVM_CMD_NS_ALL;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_queues_decode_is_the_specs() {
        assert_eq!(decode_num_queues(0x0003_0007), (4, 8));
        assert_eq!(decode_num_queues(0x003f_003f), (64, 64));
    }
}
