//! The C layouts of `nvm_types.h` and of the helper module's ioctl argument, shared by every
//! layer. Nothing here does anything; the sizes and offsets are checked at compile time against
//! the spec (and from C by compat-tests/libnvm).

#![forbid(unsafe_code)]

use std::ffi::c_void;
use std::mem::{align_of, offset_of, size_of};

/// `nvm_ctrl_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmCtrl {
    pub page_size: usize,
    pub dstrd: u8,
    pub timeout: u64,
    pub max_entries: u16,
    pub mm_size: usize,
    pub mm_ptr: *mut c_void,
}

/// `nvm_dma_t` without its flexible array `ioaddrs` (which starts at offset 24).
#[repr(C, align(32))]
#[derive(Debug)]
pub struct NvmDma {
    pub vaddr: *mut c_void,
    pub page_size: usize,
    pub n_ioaddrs: usize,
    pub ioaddrs: [u64; 0],
}

/// `nvm_queue_t`.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct NvmQueue {
    pub no: u16,
    pub max_entries: u16,
    pub entry_size: u16,
    pub head: u32,
    pub tail: u32,
    pub phase: i16,
    pub last: u32,
    pub db: *mut u32,
    pub vaddr: *mut c_void,
    pub ioaddr: u64,
}

impl Default for NvmQueue {
    fn default() -> Self {
        NvmQueue {
            no: 0,
            max_entries: 0,
            entry_size: 0,
            head: 0,
            tail: 0,
            phase: 0,
            last: 0,
            db: std::ptr::null_mut(),
            vaddr: std::ptr::null_mut(),
            ioaddr: 0,
        }
    }
}

/// `nvm_cpl_t`: a completion queue entry.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmCpl {
    pub dword: [u32; 4],
}

impl NvmCpl {
    pub fn cid(&self) -> u16 {
        self.dword[3] as u16
    }
    pub fn sqhd(&self) -> u16 {
        self.dword[2] as u16
    }
    pub fn sqid(&self) -> u16 {
        (self.dword[2] >> 16) as u16
    }
    /// The 16-bit status field (phase tag in bit 0).
    pub fn status(&self) -> u16 {
        (self.dword[3] >> 16) as u16
    }
}

/// `nvm_cmd_t`: a submission queue entry.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmCmd {
    pub dword: [u32; 16],
}

impl NvmCmd {
    /// DW0 and DW1 as `nvm_cmd_header` writes them.
    pub fn header(&mut self, cid: u16, opcode: u8, ns_id: u32) {
        self.dword[0] = (u32::from(cid) << 16) | u32::from(opcode & 0x7f);
        self.dword[1] = ns_id;
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.dword[0] = (self.dword[0] & 0xffff) | (u32::from(cid) << 16);
    }
    pub fn cid(&self) -> u16 {
        (self.dword[0] >> 16) as u16
    }
    /// PRP1/PRP2 as `nvm_cmd_data_ptr` writes them.
    pub fn data_ptr(&mut self, prp1: u64, prp2: u64) {
        self.dword[0] &= !((0x3 << 14) | (0x3 << 8));
        self.dword[6] = prp1 as u32;
        self.dword[7] = (prp1 >> 32) as u32;
        self.dword[8] = prp2 as u32;
        self.dword[9] = (prp2 >> 32) as u32;
    }
    /// SLBA and NLB as `nvm_cmd_rw_blks` writes them.
    pub fn rw_blks(&mut self, start_lba: u64, n_blks: u16) {
        self.dword[10] = start_lba as u32;
        self.dword[11] = (start_lba >> 32) as u32;
        self.dword[12] = (self.dword[12] & 0xffff_0000) | u32::from(n_blks.wrapping_sub(1));
    }
}

/// `struct nvm_ctrl_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmCtrlInfo {
    pub nvme_version: u32,
    pub page_size: usize,
    pub db_stride: usize,
    pub timeout: u64,
    pub contiguous: i32,
    pub max_entries: u16,
    pub pci_vendor: [u8; 4],
    pub serial_no: [u8; 20],
    pub model_no: [u8; 40],
    pub firmware: [u8; 8],
    pub max_data_size: usize,
    pub max_data_pages: usize,
    pub cq_entry_size: usize,
    pub sq_entry_size: usize,
    pub max_out_cmds: usize,
    pub max_n_ns: usize,
}

impl Default for NvmCtrlInfo {
    fn default() -> Self {
        NvmCtrlInfo {
            nvme_version: 0,
            page_size: 0,
            db_stride: 0,
            timeout: 0,
            contiguous: 0,
            max_entries: 0,
            pci_vendor: [0; 4],
            serial_no: [0; 20],
            model_no: [0; 40],
            firmware: [0; 8],
            max_data_size: 0,
            max_data_pages: 0,
            cq_entry_size: 0,
            sq_entry_size: 0,
            max_out_cmds: 0,
            max_n_ns: 0,
        }
    }
}

/// `struct nvm_ns_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmNsInfo {
    pub ns_id: u32,
    pub size: u64,
    pub capacity: u64,
    pub utilization: u64,
    pub lba_data_size: usize,
    pub metadata_size: usize,
}

/// The helper module's `struct nvm_ioctl_map` (private to library and module in upstream).
#[repr(C)]
#[derive(Debug)]
pub struct IoctlMap {
    pub vaddr_start: u64,
    pub n_pages: usize,
    pub ioaddrs: *mut u64,
}

/// `NVM_MAP_HOST_MEMORY` = `_IOW(0x80, 1, struct nvm_ioctl_map)`.
pub const NVM_MAP_HOST_MEMORY: u64 = 0x4018_8001;
/// `NVM_MAP_DEVICE_MEMORY` = `_IOW(0x80, 2, struct nvm_ioctl_map)`.
pub const NVM_MAP_DEVICE_MEMORY: u64 = 0x4018_8002;
/// `NVM_UNMAP_MEMORY` = `_IOW(0x80, 3, uint64_t)`.
pub const NVM_UNMAP_MEMORY: u64 = 0x4008_8003;

/// Our module's `struct nvm_ioctl_version` (docs/libnvm-module.md); upstream 0.3 has no such
/// ioctl and answers it as an unknown command.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoctlVersion {
    pub abi_major: u32,
    pub abi_minor: u32,
    pub features: u32,
    pub reserved: u32,
}

/// `NVM_GET_VERSION` = `_IOR(0x80, 0x40, struct nvm_ioctl_version)`.
pub const NVM_GET_VERSION: u64 = 0x8010_8040;
/// The module ABI major this library speaks (upstream 0.3's ioctls are ABI 1.0).
pub const NVM_ABI_MAJOR: u32 = 1;

/// `NVM_CTRL_MEM_MINSIZE`.
pub const NVM_CTRL_MEM_MINSIZE: usize = 0x2000;
/// `NVM_CMD_NS_ALL`.
pub const NVM_CMD_NS_ALL: u32 = 0xffff_ffff;

/// Admin opcodes (`enum nvm_admin_command_set`).
pub mod admin_op {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
}

/// NVM command set opcodes (`enum nvm_io_command_set`).
pub mod io_op {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
}

// Layouts from the spec (§A3), x86-64 LP64.
const _: () = {
    assert!(size_of::<NvmCtrl>() == 48 && align_of::<NvmCtrl>() == 8);
    assert!(offset_of!(NvmCtrl, dstrd) == 8 && offset_of!(NvmCtrl, timeout) == 16);
    assert!(offset_of!(NvmCtrl, max_entries) == 24 && offset_of!(NvmCtrl, mm_size) == 32);
    assert!(offset_of!(NvmCtrl, mm_ptr) == 40);
    assert!(size_of::<NvmDma>() == 32 && align_of::<NvmDma>() == 32);
    assert!(offset_of!(NvmDma, page_size) == 8 && offset_of!(NvmDma, n_ioaddrs) == 16);
    assert!(offset_of!(NvmDma, ioaddrs) == 24);
    assert!(size_of::<NvmQueue>() == 64 && align_of::<NvmQueue>() == 64);
    assert!(offset_of!(NvmQueue, max_entries) == 2 && offset_of!(NvmQueue, entry_size) == 4);
    assert!(offset_of!(NvmQueue, head) == 8 && offset_of!(NvmQueue, tail) == 12);
    assert!(offset_of!(NvmQueue, phase) == 16 && offset_of!(NvmQueue, last) == 20);
    assert!(offset_of!(NvmQueue, db) == 24 && offset_of!(NvmQueue, vaddr) == 32);
    assert!(offset_of!(NvmQueue, ioaddr) == 40);
    assert!(size_of::<NvmCpl>() == 16 && align_of::<NvmCpl>() == 16);
    assert!(size_of::<NvmCmd>() == 64 && align_of::<NvmCmd>() == 64);
    assert!(size_of::<NvmCtrlInfo>() == 160);
    assert!(offset_of!(NvmCtrlInfo, contiguous) == 32 && offset_of!(NvmCtrlInfo, max_entries) == 36);
    assert!(offset_of!(NvmCtrlInfo, pci_vendor) == 38 && offset_of!(NvmCtrlInfo, serial_no) == 42);
    assert!(offset_of!(NvmCtrlInfo, model_no) == 62 && offset_of!(NvmCtrlInfo, firmware) == 102);
    assert!(offset_of!(NvmCtrlInfo, max_data_size) == 112 && offset_of!(NvmCtrlInfo, max_n_ns) == 152);
    assert!(size_of::<NvmNsInfo>() == 48 && offset_of!(NvmNsInfo, size) == 8);
    assert!(offset_of!(NvmNsInfo, lba_data_size) == 32 && offset_of!(NvmNsInfo, metadata_size) == 40);
    assert!(size_of::<IoctlMap>() == 24 && offset_of!(IoctlMap, ioaddrs) == 16);
    assert!(size_of::<IoctlVersion>() == 16 && offset_of!(IoctlVersion, features) == 8);
};
