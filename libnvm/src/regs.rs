//! NVMe register offsets and field decoders (spec §B1), shared below the controller code.

#![forbid(unsafe_code)]

pub const CAP: usize = 0x00;
pub const VS: usize = 0x08;
pub const CC: usize = 0x14;
pub const CSTS: usize = 0x1c;
pub const AQA: usize = 0x24;
pub const ASQ: usize = 0x28;
pub const ACQ: usize = 0x30;
pub const DOORBELLS: usize = 0x1000;

pub const CC_EN: u32 = 1;
pub const CSTS_RDY: u32 = 1;
pub const CSTS_CFS: u32 = 2;

/// CAP decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub mqes: u16,
    pub cqr: bool,
    pub to: u8,
    pub dstrd: u8,
    pub mpsmin: u8,
    pub mpsmax: u8,
}

impl Cap {
    pub fn decode(v: u64) -> Cap {
        Cap {
            mqes: v as u16,
            cqr: (v >> 16) & 1 != 0,
            to: (v >> 24) as u8,
            dstrd: ((v >> 32) & 0xf) as u8,
            mpsmin: ((v >> 48) & 0xf) as u8,
            mpsmax: ((v >> 52) & 0xf) as u8,
        }
    }
}

/// Byte offset of a queue's doorbell.
pub fn doorbell(dstrd: u8, qid: u16, cq: bool) -> usize {
    DOORBELLS + (2 * usize::from(qid) + usize::from(cq)) * (4usize << dstrd)
}

/// The CC value that enables the controller with `page_size` pages and 64/16-byte entries.
pub fn cc_enable(page_size: usize) -> u32 {
    let mps = (page_size >> 12).trailing_zeros();
    (4 << 20) | (6 << 16) | (mps << 7) | CC_EN
}

/// AQA with the admin CQ size in ACQS (27:16) and the SQ size in ASQS (11:0), both 0-based.
pub fn aqa(acq_entries: u32, asq_entries: u32) -> u32 {
    ((acq_entries - 1) & 0xfff) << 16 | ((asq_entries - 1) & 0xfff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_cap_decodes() {
        let c = Cap::decode(0x0240_1820_0F01_07FF);
        assert_eq!(c, Cap { mqes: 2047, cqr: true, to: 15, dstrd: 0, mpsmin: 0, mpsmax: 4 });
    }

    #[test]
    fn register_values() {
        assert_eq!(cc_enable(4096), 0x0046_0001);
        assert_eq!(aqa(256, 64), 0x00ff_003f);
        assert_eq!(doorbell(0, 0, false), 0x1000);
        assert_eq!(doorbell(0, 1, true), 0x100c);
        assert_eq!(doorbell(2, 1, false), 0x1020);
    }
}
