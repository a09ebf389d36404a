//! `#[repr(C)]` mirrors of the public C types (include/gdsync*, include/gdsync/peer_ops.h) and of
//! the CUDA stream-memop parameter union. Layouts are pinned by the tests at the bottom against the
//! numbers of the spec (`shared/spec/gdsync.md` §2–§3, §5.1); the C side is checked by
//! `compat-tests/gdsync/abi_layout.c`.

#![forbid(unsafe_code)]

use std::ffi::c_void;

/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUstream` (opaque driver handle).
pub type CuStream = *mut c_void;

// ---- gdsync/core.h ----

pub const GDS_API_MAJOR_VERSION: u32 = 2;
pub const GDS_API_MINOR_VERSION: u32 = 2;
pub const GDS_API_VERSION: u32 = (GDS_API_MAJOR_VERSION << 16) | GDS_API_MINOR_VERSION;

pub const GDS_PARAM_VERSION: i32 = 0;

pub const GDS_CREATE_QP_WQ_ON_GPU: i32 = 1 << 0;
pub const GDS_CREATE_QP_TX_CQ_ON_GPU: i32 = 1 << 1;
pub const GDS_CREATE_QP_RX_CQ_ON_GPU: i32 = 1 << 2;
pub const GDS_CREATE_QP_WQ_DBREC_ON_GPU: i32 = 1 << 5;

pub const GDS_MEMORY_GPU: i32 = 1;
pub const GDS_MEMORY_HOST: i32 = 2;
pub const GDS_MEMORY_IO: i32 = 4;
pub const GDS_MEMORY_MASK: i32 = 0x7;

pub const GDS_WAIT_POST_FLUSH_REMOTE: i32 = 1 << 3;
pub const GDS_WRITE_PRE_BARRIER_SYS: i32 = 1 << 4;
pub const GDS_WRITE_MEMORY_POST_BARRIER_SYS: i32 = 1 << 4;
pub const GDS_WRITE_MEMORY_PRE_BARRIER_SYS: i32 = 1 << 5;

pub const GDS_SEND_INFO_MAX_OPS: usize = 32;
pub const GDS_WAIT_INFO_MAX_OPS: usize = 32;

pub const GDS_WAIT_COND_GEQ: u32 = 0;
pub const GDS_WAIT_COND_EQ: u32 = 1;
pub const GDS_WAIT_COND_AND: u32 = 2;
pub const GDS_WAIT_COND_NOR: u32 = 3;

pub const GDS_TAG_SEND: u32 = 0;
pub const GDS_TAG_WAIT: u32 = 1;
pub const GDS_TAG_WAIT_VALUE32: u32 = 2;
pub const GDS_TAG_WRITE_VALUE32: u32 = 3;
pub const GDS_TAG_WRITE_MEMORY: u32 = 4;

// ---- peer_ops.h ----

pub const IBV_EXP_PEER_OP_FENCE: u32 = 0;
pub const IBV_EXP_PEER_OP_RESERVED1: u32 = 1;
pub const IBV_EXP_PEER_OP_STORE_QWORD: u32 = 2;
pub const IBV_EXP_PEER_OP_COPY_BLOCK: u32 = 3;
pub const IBV_EXP_PEER_OP_STORE_DWORD: u32 = 4;
pub const IBV_EXP_PEER_OP_POLL_AND_DWORD: u32 = 12;
pub const IBV_EXP_PEER_OP_POLL_NOR_DWORD: u32 = 13;
pub const IBV_EXP_PEER_OP_POLL_GEQ_DWORD: u32 = 14;

pub const IBV_EXP_PEER_FENCE_OP_READ: u64 = 1 << 0;
pub const IBV_EXP_PEER_FENCE_OP_WRITE: u64 = 1 << 1;
pub const IBV_EXP_PEER_FENCE_FROM_CPU: u64 = 1 << 2;
pub const IBV_EXP_PEER_FENCE_FROM_HCA: u64 = 1 << 3;
pub const IBV_EXP_PEER_FENCE_MEM_SYS: u64 = 1 << 4;
pub const IBV_EXP_PEER_FENCE_MEM_PEER: u64 = 1 << 5;

pub const IBV_EXP_PEER_PEEK_ABSOLUTE: u32 = 0;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DwordVa {
    pub data: u32,
    pub target_id: u64,
    pub offset: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QwordVa {
    pub data: u64,
    pub target_id: u64,
    pub offset: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyOp {
    pub src: *mut c_void,
    pub target_id: u64,
    pub offset: usize,
    pub len: usize,
}

/// The `wr` union of `struct peer_op_wr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union PeerOpUnion {
    pub fence_flags: u64,
    pub dword_va: DwordVa,
    pub qword_va: QwordVa,
    pub copy_op: CopyOp,
}

/// `struct peer_op_wr` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PeerOpWr {
    pub next: *mut PeerOpWr,
    pub type_: u32,
    pub wr: PeerOpUnion,
    pub comp_mask: u32,
}

/// `struct ibv_exp_peer_commit` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PeerCommit {
    pub storage: *mut PeerOpWr,
    pub entries: u32,
    pub rollback_id: u64,
    pub comp_mask: u32,
}

/// `struct ibv_exp_peer_peek` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PeerPeek {
    pub storage: *mut PeerOpWr,
    pub entries: u32,
    pub whence: u32,
    pub offset: u32,
    pub peek_id: u64,
    pub comp_mask: u32,
}

/// `gds_send_request_t` (1824 bytes).
#[repr(C)]
pub struct SendRequest {
    pub commit: PeerCommit,
    pub wr: [PeerOpWr; GDS_SEND_INFO_MAX_OPS],
}

/// `gds_wait_request_t` (1832 bytes).
#[repr(C)]
pub struct WaitRequest {
    pub peek: PeerPeek,
    pub wr: [PeerOpWr; GDS_WAIT_INFO_MAX_OPS],
}

/// `struct gds_cq` (16 bytes).
#[repr(C)]
pub struct GdsCq {
    pub cq: *mut c_void,
    pub curr_offset: u32,
}

/// `struct gds_qp` (56 bytes).
#[repr(C)]
pub struct GdsQp {
    pub qp: *mut c_void,
    pub send_cq: GdsCq,
    pub recv_cq: GdsCq,
    pub res_domain: *mut c_void,
    pub dev_context: *mut c_void,
}

impl GdsQp {
    /// The `gds_qp` handed to the application for `qp` over its two CQs (no resource domain).
    pub fn new(qp: *mut c_void, send_cq: *mut c_void, recv_cq: *mut c_void, dev_context: *mut c_void) -> GdsQp {
        GdsQp {
            qp,
            send_cq: GdsCq { cq: send_cq, curr_offset: 0 },
            recv_cq: GdsCq { cq: recv_cq, curr_offset: 0 },
            res_domain: std::ptr::null_mut(),
            dev_context,
        }
    }
}

/// `gds_wait_value32_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WaitValue32 {
    pub ptr: *mut u32,
    pub value: u32,
    pub cond_flags: u32,
    pub flags: i32,
}

/// `gds_write_value32_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WriteValue32 {
    pub ptr: *mut u32,
    pub value: u32,
    pub flags: i32,
}

/// `gds_write_memory_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WriteMemory {
    pub dest: *mut u8,
    pub src: *const u8,
    pub count: usize,
    pub flags: i32,
}

/// The anonymous union of `gds_descriptor_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescriptorUnion {
    pub send: *mut SendRequest,
    pub wait: *mut WaitRequest,
    pub wait32: WaitValue32,
    pub write32: WriteValue32,
    pub writemem: WriteMemory,
}

/// `gds_descriptor_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Descriptor {
    pub tag: u32,
    pub u: DescriptorUnion,
}

// ---- gdsync/mlx5.h ----

/// `gds_mlx5_dword_wait_info_t` (16 bytes).
#[repr(C)]
pub struct Mlx5DwordWaitInfo {
    pub ptr: *mut u32,
    pub value: u32,
}

/// `gds_mlx5_send_info_t` (40 bytes); `membar` is bit 0 and `membar_full` bit 1 of `bits`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mlx5SendInfo {
    pub bits: u32,
    pub dbrec_ptr: *mut u32,
    pub dbrec_value: u32,
    pub db_ptr: *mut u64,
    pub db_value: u64,
}

/// `gds_mlx5_wait_info_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mlx5WaitInfo {
    pub cond: u32,
    pub cqe_ptr: *mut u32,
    pub cqe_value: u32,
    pub flag_ptr: *mut u32,
    pub flag_value: u32,
}

// ---- gdsync/tools.h ----

/// `gdr_mh_t` of gdrcopy ≥ 2 (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrMh {
    pub h: std::ffi::c_ulong,
}

/// `gds_mem_desc_t` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemDesc {
    pub d_ptr: CuDevicePtr,
    pub h_ptr: *mut c_void,
    pub bar_ptr: *mut c_void,
    pub flags: i32,
    pub alloc_size: usize,
    pub mh: GdrMh,
}

// ---- cuda.h: stream memory operations ----

pub const CU_STREAM_MEM_OP_WAIT_VALUE_32: u32 = 1;
pub const CU_STREAM_MEM_OP_WRITE_VALUE_32: u32 = 2;
pub const CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES: u32 = 3;
pub const CU_STREAM_MEM_OP_WAIT_VALUE_64: u32 = 4;
pub const CU_STREAM_MEM_OP_WRITE_VALUE_64: u32 = 5;
pub const CU_STREAM_WAIT_VALUE_FLUSH: u32 = 1 << 30;
pub const CU_STREAM_WRITE_VALUE_DEFAULT: u32 = 0;
pub const CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: u32 = 1;
/// The relaxed-ordering batch flag value upstream falls back to when cuda.h lacks it.
pub const CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING: u32 = 0x1;

/// `CUstreamBatchMemOpParams` (48-byte union), seen through its `waitValue`/`writeValue` member,
/// which every operation we emit uses (`flushRemoteWrites` only uses `operation` and `flags`...
/// at offset 4, see [`BatchMemOpParams::flush_remote_writes`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchMemOpParams {
    pub operation: u32,
    pub pad0: u32,
    pub address: CuDevicePtr,
    pub value64: u64,
    pub flags: u32,
    pub pad1: u32,
    pub alias: CuDevicePtr,
    pub pad2: u64,
}

impl BatchMemOpParams {
    /// A `CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES` entry (its `flags` field sits at offset 4).
    pub fn flush_remote_writes() -> Self {
        BatchMemOpParams { operation: CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn peer_types_match_the_spec() {
        assert_eq!(size_of::<PeerOpWr>(), 56);
        assert_eq!(offset_of!(PeerOpWr, type_), 8);
        assert_eq!(offset_of!(PeerOpWr, wr), 16);
        assert_eq!(offset_of!(PeerOpWr, comp_mask), 48);
        assert_eq!(size_of::<PeerOpUnion>(), 32);
        assert_eq!(offset_of!(DwordVa, target_id), 8);
        assert_eq!(offset_of!(DwordVa, offset), 16);
        assert_eq!(offset_of!(CopyOp, len), 24);
        assert_eq!(size_of::<PeerCommit>(), 32);
        assert_eq!(offset_of!(PeerCommit, rollback_id), 16);
        assert_eq!(offset_of!(PeerCommit, comp_mask), 24);
        assert_eq!(size_of::<PeerPeek>(), 40);
        assert_eq!(offset_of!(PeerPeek, whence), 12);
        assert_eq!(offset_of!(PeerPeek, offset), 16);
        assert_eq!(offset_of!(PeerPeek, peek_id), 24);
        assert_eq!(offset_of!(PeerPeek, comp_mask), 32);
    }

    #[test]
    fn gds_types_match_the_spec() {
        assert_eq!(size_of::<SendRequest>(), 1824);
        assert_eq!(offset_of!(SendRequest, wr), 32);
        assert_eq!(size_of::<WaitRequest>(), 1832);
        assert_eq!(offset_of!(WaitRequest, wr), 40);
        assert_eq!(align_of::<SendRequest>(), 8);
        assert_eq!(size_of::<GdsCq>(), 16);
        assert_eq!(size_of::<GdsQp>(), 56);
        assert_eq!(offset_of!(GdsQp, recv_cq), 24);
        assert_eq!(offset_of!(GdsQp, dev_context), 48);
        assert_eq!(size_of::<WaitValue32>(), 24);
        assert_eq!(offset_of!(WaitValue32, flags), 16);
        assert_eq!(size_of::<WriteValue32>(), 16);
        assert_eq!(offset_of!(WriteValue32, flags), 12);
        assert_eq!(size_of::<WriteMemory>(), 32);
        assert_eq!(offset_of!(WriteMemory, flags), 24);
        assert_eq!(size_of::<Descriptor>(), 40);
        assert_eq!(offset_of!(Descriptor, u), 8);
        assert_eq!(size_of::<Mlx5DwordWaitInfo>(), 16);
        assert_eq!(size_of::<Mlx5SendInfo>(), 40);
        assert_eq!(offset_of!(Mlx5SendInfo, dbrec_ptr), 8);
        assert_eq!(offset_of!(Mlx5SendInfo, db_value), 32);
        assert_eq!(size_of::<Mlx5WaitInfo>(), 40);
        assert_eq!(offset_of!(Mlx5WaitInfo, flag_ptr), 24);
        assert_eq!(offset_of!(Mlx5WaitInfo, flag_value), 32);
        assert_eq!(size_of::<MemDesc>(), 48);
        assert_eq!(offset_of!(MemDesc, alloc_size), 32);
        assert_eq!(offset_of!(MemDesc, mh), 40);
    }

    #[test]
    fn cuda_memop_params_match_cuda_h() {
        assert_eq!(size_of::<BatchMemOpParams>(), 48);
        assert_eq!(offset_of!(BatchMemOpParams, address), 8);
        assert_eq!(offset_of!(BatchMemOpParams, value64), 16);
        assert_eq!(offset_of!(BatchMemOpParams, flags), 24);
        assert_eq!(offset_of!(BatchMemOpParams, alias), 32);
    }
}

#[cfg(test)]
mod version_tests {
    /// The header's version macros are the one source: the crate version and our constants follow.
    #[test]
    fn header_cargo_and_constants_agree() {
        let h = include_str!("../../include/gdsync/core.h");
        let macro_value = |name: &str| -> u32 {
            h.lines()
                .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} not found in core.h"))
        };
        let (maj, min) = (macro_value("GDS_API_MAJOR_VERSION"), macro_value("GDS_API_MINOR_VERSION"));
        assert_eq!((maj, min), (super::GDS_API_MAJOR_VERSION, super::GDS_API_MINOR_VERSION));
        assert_eq!(env!("CARGO_PKG_VERSION"), format!("{maj}.{min}.0"));
        // libtool -version-info (maj+min):0:min -> soname major = maj+min-min = maj.
        assert!(include_str!("../build.rs").contains(&format!("libgdsync.so.{maj}\"")));
    }
}
