//! Controllers: the handle (`nvm_ctrl_t`) read from CAP, over the helper module's file or a raw
//! BAR0 mapping, and the reset/enable sequence (spec §B2).

#![forbid(unsafe_code)]

use std::os::fd::{OwnedFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use gpudirect_common::Errno;

use crate::abi::{NVM_CTRL_MEM_MINSIZE, NvmCtrl};
use crate::kernel::{self, DeviceMapping};
use crate::mmio::Regs;
use crate::regs::{self, Cap};
use crate::status::{ETIME, Error, Result};

/// Where the register window came from.
#[derive(Debug)]
enum Backing {
    /// The caller owns the mapping (`nvm_raw_ctrl_init`).
    Raw,
    /// Our duplicate of the caller's descriptor and our mapping of it (`nvm_ctrl_init`).
    Device { fd: OwnedFd, _map: DeviceMapping },
}

/// A controller: its register window and what CAP said. The C handle (`nvm_ctrl_t`) is a copy
/// of [`Controller::handle`] that the C layer keeps next to it.
#[derive(Debug)]
pub struct Controller {
    regs: Regs,
    cap: Cap,
    page_size: usize,
    backing: Backing,
}

impl Controller {
    /// Over the helper module's device file (or any file whose offset 0 maps BAR0): duplicates
    /// `fd`, maps `NVM_CTRL_MEM_MINSIZE` bytes of it and reads CAP.
    pub fn from_fd(fd: RawFd) -> Result<Controller> {
        let fd = kernel::dup_fd(fd)?;
        let map = DeviceMapping::map(&fd, NVM_CTRL_MEM_MINSIZE)?;
        // The mapping lives in `backing` as long as the controller does.
        let regs = crate::mmio::regs_of_mapping(&map);
        Controller::new(regs, Backing::Device { fd, _map: map })
    }

    /// Over a register window the caller owns.
    pub fn from_regs(regs: Regs) -> Result<Controller> {
        if regs.len() < NVM_CTRL_MEM_MINSIZE {
            return Err(Errno::EINVAL.into());
        }
        Controller::new(regs, Backing::Raw)
    }

    fn new(regs: Regs, backing: Backing) -> Result<Controller> {
        let cap = Cap::decode(regs.read64(regs::CAP));
        if regs.read32(regs::CAP) == u32::MAX && regs.read32(regs::CAP + 4) == u32::MAX {
            // A device that has gone (or a file that is not BAR0) reads as all ones.
            return Err(Errno::ENODEV.into());
        }
        let page_size = kernel::host_page_size();
        let code = (page_size >> 12).trailing_zeros() as u8;
        if page_size < 4096 || code < cap.mpsmin || code > cap.mpsmax {
            return Err(Errno::ERANGE.into());
        }
        Ok(Controller { regs, cap, page_size, backing })
    }

    /// The C handle's contents.
    pub fn handle(&self) -> NvmCtrl {
        NvmCtrl {
            page_size: self.page_size,
            dstrd: self.cap.dstrd,
            timeout: self.timeout_ms(),
            max_entries: self.max_entries(),
            mm_size: self.regs.len(),
            mm_ptr: self.regs.base(),
        }
    }

    pub fn regs(&self) -> &Regs {
        &self.regs
    }
    pub fn cap(&self) -> Cap {
        self.cap
    }
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// CAP.TO in milliseconds.
    pub fn timeout_ms(&self) -> u64 {
        u64::from(self.cap.to) * 500
    }
    /// CAP.MQES + 1, kept at 65535 when MQES is 0xFFFF (upstream's u16 wraps to 0, spec §A11 #9).
    pub fn max_entries(&self) -> u16 {
        self.cap.mqes.saturating_add(1)
    }
    /// The helper module's file, when the controller was opened through it.
    pub fn device_fd(&self) -> Option<&OwnedFd> {
        match &self.backing {
            Backing::Device { fd, .. } => Some(fd),
            Backing::Raw => None,
        }
    }

    /// Entries of an admin (or one-page I/O) ring: min(MQES + 1, page / entry size).
    pub fn ring_entries(&self, entry_size: usize) -> u16 {
        let per_page = (self.page_size / entry_size).min(usize::from(u16::MAX)) as u16;
        self.max_entries().min(per_page)
    }

    /// The reset and enable sequence: clear EN, wait for RDY = 0, program the admin queues, set
    /// EN, wait for RDY = 1, each wait bounded by CAP.TO. `ETIME` on a timeout; `EIO` when the
    /// controller reports fatal status (CSTS.CFS).
    pub fn reset(&self, acq_ioaddr: u64, asq_ioaddr: u64) -> Result<()> {
        let r = &self.regs;
        let cc = r.read32(regs::CC);
        r.write32(regs::CC, cc & !regs::CC_EN);
        self.wait_ready(false)?;
        let acq = u32::from(self.ring_entries(16));
        let asq = u32::from(self.ring_entries(64));
        r.write32(regs::AQA, regs::aqa(acq, asq));
        r.write64(regs::ASQ, asq_ioaddr);
        r.write64(regs::ACQ, acq_ioaddr);
        r.write32(regs::CC, regs::cc_enable(self.page_size));
        self.wait_ready(true)?;
        if r.read32(regs::CSTS) & regs::CSTS_CFS != 0 {
            return Err(Errno::EIO.into());
        }
        Ok(())
    }

    /// Disables the controller (clears EN) and waits for RDY = 0.
    pub fn disable(&self) -> Result<()> {
        let cc = self.regs.read32(regs::CC);
        self.regs.write32(regs::CC, cc & !regs::CC_EN);
        self.wait_ready(false)
    }

    fn wait_ready(&self, ready: bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_millis(self.timeout_ms().max(1));
        let mut spins = 0u32;
        loop {
            let csts = self.regs.read32(regs::CSTS);
            if csts == u32::MAX {
                return Err(Errno::ENODEV.into());
            }
            if ready && csts & regs::CSTS_CFS != 0 {
                return Err(Errno::EIO.into());
            }
            if (csts & regs::CSTS_RDY != 0) == ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Os(ETIME));
            }
            spins += 1;
            if spins < 100 {
                thread::yield_now();
            } else {
                thread::sleep(Duration::from_micros(200));
            }
        }
    }
}
