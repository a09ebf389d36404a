//! libmlx5's direct-verbs interface (rdma-core's `mlx5dv.h`): the object layouts
//! `mlx5dv_init_obj` fills, the attributes of `mlx5dv_create_qp`, the two functions loaded from
//! libmlx5.so.1 (dlopen, once), and [`RawMem`], the volatile access to the rings and registers
//! those objects describe. Nothing here knows a QP's or a CQ's state.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;
use gpudirect_common::{Errno, Result};

use crate::verbs::ibv::QpInitAttrEx;
use crate::verbs::mlx5::dv::Mem;

/// `struct mlx5dv_qp` (96 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct DvQp {
    pub(super) dbrec: usize,
    pub(super) sq_buf: usize,
    pub(super) sq_wqe_cnt: u32,
    pub(super) sq_stride: u32,
    pub(super) rq_buf: usize,
    pub(super) rq_wqe_cnt: u32,
    pub(super) rq_stride: u32,
    pub(super) bf_reg: usize,
    pub(super) bf_size: u32,
    pub(super) pad: u32,
    pub(super) comp_mask: u64,
    pub(super) uar_mmap_offset: i64,
    pub(super) tirn: u32,
    pub(super) tisn: u32,
    pub(super) rqn: u32,
    pub(super) sqn: u32,
    pub(super) tir_icm_addr: u64,
}

/// `struct mlx5dv_cq` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct DvCq {
    pub(super) buf: usize,
    pub(super) dbrec: usize,
    pub(super) cqe_cnt: u32,
    pub(super) cqe_size: u32,
    pub(super) cq_uar: usize,
    pub(super) cqn: u32,
    pub(super) pad: u32,
    pub(super) comp_mask: u64,
}

/// `struct mlx5dv_obj` (7 in/out pairs).
#[repr(C)]
pub(super) struct DvObj {
    pub(super) pairs: [[usize; 2]; 7],
}

pub(super) const MLX5DV_OBJ_QP: u64 = 1;
pub(super) const MLX5DV_OBJ_CQ: u64 = 2;

pub(super) type InitObjFn = unsafe extern "C" fn(*mut DvObj, u64) -> c_int;
pub(super) type CreateQpFn = unsafe extern "C" fn(*mut c_void, *mut QpInitAttrEx, *mut DvQpInitAttr) -> *mut c_void;

/// `struct mlx5dv_qp_init_attr` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct DvQpInitAttr {
    pub(super) comp_mask: u64,
    pub(super) create_flags: u32,
    pub(super) pad: u32,
    pub(super) dc_init_attr: [u64; 2],
    pub(super) send_ops_flags: u64,
}

pub(super) const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1;
/// Small receives and READ/atomic responses would otherwise land in the CQE itself and reach the
/// user buffer only when a CPU polls: a stream waiting on the CQE would then read stale data.
pub(super) const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;

pub(super) struct Dv {
    _lib: Library,
    pub(super) init_obj: InitObjFn,
    pub(super) create_qp: CreateQpFn,
}

pub(super) fn dv() -> Result<&'static Dv> {
    static D: OnceLock<std::result::Result<Dv, String>> = OnceLock::new();
    let r = D.get_or_init(|| {
        let lib = Library::open("libmlx5.so.1")?;
        let p = lib.symbol(c"mlx5dv_init_obj").ok_or("libmlx5.so.1 lacks mlx5dv_init_obj")?;
        // SAFETY: rdma-core's `int mlx5dv_init_obj(struct mlx5dv_obj *, uint64_t)`.
        let init_obj = unsafe { as_fn::<InitObjFn>(p) };
        let p = lib.symbol(c"mlx5dv_create_qp").ok_or("libmlx5.so.1 lacks mlx5dv_create_qp")?;
        // SAFETY: rdma-core's `struct ibv_qp *mlx5dv_create_qp(struct ibv_context *,
        // struct ibv_qp_init_attr_ex *, struct mlx5dv_qp_init_attr *)`.
        let create_qp = unsafe { as_fn::<CreateQpFn>(p) };
        Ok(Dv { _lib: lib, init_obj, create_qp })
    });
    r.as_ref().map_err(|e| {
        gds_err!("gds_mlx5", "cannot use libmlx5: {e}");
        Errno::ENOSYS
    })
}

/// Real memory: the rings and registers the device shares with us.
pub(super) struct RawMem(());

impl RawMem {
    /// # Safety
    /// Every address later passed to `write`/`read` must be mapped and writable/readable for
    /// the given length (rings and registers of live mlx5dv objects).
    pub(super) unsafe fn new() -> RawMem {
        RawMem(())
    }
}

impl Mem for RawMem {
    fn write(&self, addr: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: RawMem::new's contract.
            unsafe { std::ptr::write_volatile((addr + i) as *mut u8, *b) };
        }
    }
    fn read(&self, addr: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: RawMem::new's contract.
            *b = unsafe { std::ptr::read_volatile((addr + i) as *const u8) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dv_layouts() {
        assert_eq!(std::mem::size_of::<DvQp>(), 96);
        assert_eq!(std::mem::offset_of!(DvQp, bf_reg), 40);
        assert_eq!(std::mem::offset_of!(DvQp, bf_size), 48);
        assert_eq!(std::mem::offset_of!(DvQp, comp_mask), 56);
        assert_eq!(std::mem::offset_of!(DvQp, tir_icm_addr), 88);
        assert_eq!(std::mem::size_of::<DvCq>(), 48);
        assert_eq!(std::mem::offset_of!(DvCq, cqe_cnt), 16);
        assert_eq!(std::mem::offset_of!(DvCq, cqn), 32);
        assert_eq!(std::mem::size_of::<DvObj>(), 112);
        assert_eq!(std::mem::size_of::<DvQpInitAttr>(), 40);
        assert_eq!(std::mem::offset_of!(DvQpInitAttr, create_flags), 8);
        assert_eq!(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, 8);
    }
}
