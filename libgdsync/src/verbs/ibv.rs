//! rdma-core's libibverbs, loaded at run time (`dlopen("libibverbs.so.1")`): the only module
//! that calls verbs or reads verbs objects.
//!
//! Why dlopen and not `-libverbs`: the library must load (and its memory-operation half work) on
//! machines without rdma-core, and the consumer's `ibv_context`/`ibv_pd` come from the process's
//! one libibverbs anyway, which dlopen finds already mapped. Exported functions are used where
//! rdma-core 44 has them (`ibv_create_cq`, `ibv_create_qp`, `ibv_destroy_*`); the data-path
//! calls (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) are inline functions in verbs.h that
//! call through `struct ibv_context_ops`, so we do the same with the offsets below (x86-64 layout
//! of rdma-core's verbs.h; checked against the header by `compat-tests/gdsync/verbs_layout.c`).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use gpudirect_common::Errno;
use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;

/// `offsetof(struct ibv_context, ops)`.
pub const CTX_OPS: usize = 8;
/// `offsetof(struct ibv_context_ops, poll_cq)`.
pub const OPS_POLL_CQ: usize = 88;
/// `offsetof(struct ibv_context_ops, post_send)`.
pub const OPS_POST_SEND: usize = 200;
/// `offsetof(struct ibv_context_ops, post_recv)`.
pub const OPS_POST_RECV: usize = 208;
/// `offsetof(struct ibv_device, name)` (char[64]).
pub const DEV_NAME: usize = 24;
/// `offsetof(struct ibv_qp, qp_num)`.
pub const QP_NUM: usize = 52;
/// `offsetof(struct ibv_cq, cqe)`.
pub const CQ_CQE: usize = 28;
/// `enum ibv_qp_state`: the states a send is refused in after a reset (see `verbs::mlx5`).
pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_ERR: u32 = 6;
/// `IBV_QP_STATE` (attr_mask bit of `ibv_query_qp`).
const IBV_QP_STATE: c_int = 1;
/// `sizeof(struct ibv_qp_attr)` is 144 (`qp_state` first); `ibv_query_qp`'s out buffers are
/// taken larger than the structs.
const QP_ATTR_BUF: usize = 256;
const QP_INIT_ATTR_BUF: usize = 128;

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes). `wr` is the rdma/atomic/ud union (32 bytes), `ext` the
/// bind_mw/tso union (48 bytes), both copied as raw words.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub qp_type: u32,
    pub pad: u32,
    pub ext: [u64; 6],
}

impl Default for SendWr {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: [0; 4],
            qp_type: 0,
            pad: 0,
            ext: [0; 6],
        }
    }
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub pad: [u8; 2],
}

pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_LOC_QP_OP_ERR: u32 = 2;

pub type PollCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;
pub type PostSendFn = unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int;
pub type PostRecvFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int;
type CreateCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocTdFn = unsafe extern "C" fn(*mut c_void, *mut TdInitAttr) -> *mut c_void;
type AllocParentDomainFn = unsafe extern "C" fn(*mut c_void, *mut ParentDomainInitAttr) -> *mut c_void;
type CreateQpFn = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void;

// rdma-core's `struct verbs_context` (x86-64): the extended ops live *before* the
// `struct ibv_context` it embeds; verbs.h's inline `ibv_alloc_td`/`ibv_alloc_parent_domain`
// reach them through `verbs_get_ctx_op` (checked in compat-tests/gdsync/verbs_layout.c).
/// `offsetof(struct verbs_context, context)`.
pub const VCTX_CONTEXT: usize = 320;
/// `sizeof(struct verbs_context)`.
pub const VCTX_SIZE: usize = 648;
/// `offsetof(struct verbs_context, sz)`.
pub const VCTX_SZ: usize = 312;
/// `offsetof(struct verbs_context, alloc_parent_domain)`.
pub const VCTX_ALLOC_PARENT_DOMAIN: usize = 112;
/// `offsetof(struct verbs_context, dealloc_td)`.
pub const VCTX_DEALLOC_TD: usize = 120;
/// `offsetof(struct verbs_context, alloc_td)`.
pub const VCTX_ALLOC_TD: usize = 128;
/// `offsetof(struct ibv_context, abi_compat)`; `(void *)-1` marks an extended context.
pub const CTX_ABI_COMPAT: usize = 320;

/// `struct ibv_td_init_attr` (4 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TdInitAttr {
    pub comp_mask: u32,
}

/// `struct ibv_parent_domain_init_attr` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ParentDomainInitAttr {
    pub pd: *mut c_void,
    pub td: *mut c_void,
    pub comp_mask: u32,
    pub alloc: usize,
    pub free: usize,
    pub pd_context: *mut c_void,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const QP_INIT_ATTR_PD: u32 = 1;

/// `verbs_get_ctx_op(ctx, op)`: the extended op at `off` of the context's `verbs_context`, or
/// `None` when the context is not extended, is too old to have that op, or the provider lacks it.
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub unsafe fn extended_op(ctx: *mut c_void, off: usize) -> Option<usize> {
    let base = ctx as usize;
    // SAFETY: abi_compat lies inside the live context.
    let compat = unsafe { std::ptr::read((base + CTX_ABI_COMPAT) as *const usize) };
    if compat != usize::MAX {
        return None;
    }
    let vctx = base - VCTX_CONTEXT;
    // SAFETY: an extended context is embedded in a verbs_context of at least `sz` bytes ending
    // at the context: the sz field and the op slot checked against it lie inside it.
    let sz = unsafe { std::ptr::read((vctx + VCTX_SZ) as *const usize) };
    if sz < VCTX_SIZE - off {
        return None;
    }
    // SAFETY: as above.
    let f = unsafe { std::ptr::read((vctx + off) as *const usize) };
    (f != 0).then_some(f)
}

/// `ibv_alloc_td(ctx, {0})`: a thread domain (for mlx5: a UAR of its own).
///
/// # Safety
/// `ctx` is a live context.
pub unsafe fn alloc_td(ctx: *mut c_void) -> Result<*mut c_void, Errno> {
    // SAFETY: live context.
    let f = unsafe { extended_op(ctx, VCTX_ALLOC_TD) }.ok_or(Errno(libc::EOPNOTSUPP))?;
    let mut a = TdInitAttr::default();
    // SAFETY: the provider's alloc_td(struct ibv_context *, struct ibv_td_init_attr *).
    let td = unsafe { std::mem::transmute::<usize, AllocTdFn>(f)(ctx, &mut a) };
    if td.is_null() { Err(nonzero(Errno::last())) } else { Ok(td) }
}

/// The provider's `dealloc_td`.
///
/// # Safety
/// `td` came from [`alloc_td`] on `ctx` and is no longer used.
pub unsafe fn dealloc_td(ctx: *mut c_void, td: *mut c_void) -> Result<(), Errno> {
    // SAFETY: live context.
    let f = unsafe { extended_op(ctx, VCTX_DEALLOC_TD) }.ok_or(Errno(libc::EOPNOTSUPP))?;
    // SAFETY: dealloc_td(struct ibv_td *).
    rc(unsafe { std::mem::transmute::<usize, DestroyFn>(f)(td) })
}

/// `ibv_alloc_parent_domain(ctx, {pd, td})`: a PD whose objects use the thread domain.
///
/// # Safety
/// `ctx` is live; `pd` and `td` are live objects of it.
pub unsafe fn alloc_parent_domain(ctx: *mut c_void, pd: *mut c_void, td: *mut c_void) -> Result<*mut c_void, Errno> {
    // SAFETY: live context.
    let f = unsafe { extended_op(ctx, VCTX_ALLOC_PARENT_DOMAIN) }.ok_or(Errno(libc::EOPNOTSUPP))?;
    let mut a = ParentDomainInitAttr { pd, td, comp_mask: 0, alloc: 0, free: 0, pd_context: std::ptr::null_mut() };
    // SAFETY: alloc_parent_domain(struct ibv_context *, struct ibv_parent_domain_init_attr *).
    let p = unsafe { std::mem::transmute::<usize, AllocParentDomainFn>(f)(ctx, &mut a) };
    if p.is_null() { Err(nonzero(Errno::last())) } else { Ok(p) }
}

/// The entry points we use.
pub struct Verbs {
    _lib: Library,
    create_cq: CreateCqFn,
    destroy_cq: DestroyFn,
    create_qp: CreateQpFn,
    destroy_qp: DestroyFn,
    dealloc_pd: DestroyFn,
    query_qp: QueryQpFn,
}

type QueryQpFn = unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, *mut c_void) -> c_int;

impl Verbs {
    fn open() -> Result<Verbs, String> {
        let lib = Library::open("libibverbs.so.1")?;
        let sym =
            |n: &std::ffi::CStr| lib.symbol(n).ok_or_else(|| format!("libibverbs.so.1 lacks {}", n.to_string_lossy()));
        // All as_fn below: rdma-core exports these (default version IBVERBS_1.1) with exactly
        // these C prototypes (verbs.h).
        // SAFETY: see above.
        let v = unsafe {
            Verbs {
                create_cq: as_fn::<CreateCqFn>(sym(c"ibv_create_cq")?),
                destroy_cq: as_fn::<DestroyFn>(sym(c"ibv_destroy_cq")?),
                create_qp: as_fn::<CreateQpFn>(sym(c"ibv_create_qp")?),
                destroy_qp: as_fn::<DestroyFn>(sym(c"ibv_destroy_qp")?),
                dealloc_pd: as_fn::<DestroyFn>(sym(c"ibv_dealloc_pd")?),
                query_qp: as_fn::<QueryQpFn>(sym(c"ibv_query_qp")?),
                _lib: lib,
            }
        };
        Ok(v)
    }

    /// `ibv_create_cq(ctx, cqe, NULL, NULL, 0)`; the error is the errno verbs set.
    ///
    /// # Safety
    /// `ctx` is a live `struct ibv_context *`.
    pub unsafe fn create_cq(&self, ctx: *mut c_void, cqe: c_int) -> Result<*mut c_void, Errno> {
        // SAFETY: live context per the contract; NULL channel/context are allowed.
        let cq = unsafe { (self.create_cq)(ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() { Err(nonzero(Errno::last())) } else { Ok(cq) }
    }

    /// # Safety
    /// `cq` is a CQ from `create_cq`, not used afterwards.
    pub unsafe fn destroy_cq(&self, cq: *mut c_void) -> Result<(), Errno> {
        // SAFETY: per the contract.
        rc(unsafe { (self.destroy_cq)(cq) })
    }

    /// `ibv_create_qp(pd, attr)`; rdma-core writes the actual capabilities back into `attr.cap`.
    ///
    /// # Safety
    /// `pd` is a live `struct ibv_pd *`; the CQs in `attr` are live.
    pub unsafe fn create_qp(&self, pd: *mut c_void, attr: &mut QpInitAttr) -> Result<*mut c_void, Errno> {
        // SAFETY: per the contract; attr is a valid ibv_qp_init_attr.
        let qp = unsafe { (self.create_qp)(pd, attr) };
        if qp.is_null() { Err(nonzero(Errno::last())) } else { Ok(qp) }
    }

    /// # Safety
    /// `qp` is a QP from `create_qp`, not used afterwards.
    pub unsafe fn destroy_qp(&self, qp: *mut c_void) -> Result<(), Errno> {
        // SAFETY: per the contract.
        rc(unsafe { (self.destroy_qp)(qp) })
    }

    /// `ibv_dealloc_pd` (also frees a parent domain).
    ///
    /// # Safety
    /// `pd` is a PD this library allocated, not used afterwards.
    pub unsafe fn dealloc_pd(&self, pd: *mut c_void) -> Result<(), Errno> {
        // SAFETY: per the contract.
        rc(unsafe { (self.dealloc_pd)(pd) })
    }
}

impl Verbs {
    /// The QP's current state as the kernel reports it (`ibv_query_qp(qp, &attr, IBV_QP_STATE,
    /// &init)`, `attr.qp_state`): a system call, for rare paths only.
    ///
    /// # Safety
    /// `qp` is a live `struct ibv_qp *`.
    pub unsafe fn query_qp_state(&self, qp: *mut c_void) -> Result<u32, Errno> {
        let mut attr = [0u64; QP_ATTR_BUF / 8];
        let mut init = [0u64; QP_INIT_ATTR_BUF / 8];
        // SAFETY: live QP per the contract; both out buffers are larger than the structs
        // ibv_query_qp fills (ibv_qp_attr 144 bytes, ibv_qp_init_attr 64) and 8-aligned.
        rc(unsafe { (self.query_qp)(qp, attr.as_mut_ptr().cast(), IBV_QP_STATE, init.as_mut_ptr().cast()) })?;
        // `qp_state` is the first member (a 4-byte enum).
        Ok(attr[0] as u32)
    }
}

fn nonzero(e: Errno) -> Errno {
    if e.0 == 0 { Errno::EINVAL } else { e }
}

/// verbs calls return 0, a positive errno, or -1 with errno set.
fn rc(r: c_int) -> Result<(), Errno> {
    match r {
        0 => Ok(()),
        r if r < 0 => Err(nonzero(Errno::last())),
        r => Err(Errno(r)),
    }
}

/// libibverbs, opened on first use; failure is reported once and then as `ENOSYS`.
pub fn verbs() -> Result<&'static Verbs, Errno> {
    static V: OnceLock<Result<Verbs, String>> = OnceLock::new();
    match V.get_or_init(Verbs::open) {
        Ok(v) => Ok(v),
        Err(e) => {
            gds_err!("gds_verbs", "cannot use libibverbs: {e}");
            Err(Errno::ENOSYS)
        }
    }
}

/// Address of the `ops` slot at byte `off` of a context's `struct ibv_context_ops`.
fn ops_slot(ctx: *mut c_void, off: usize) -> *mut usize {
    (ctx as usize + CTX_OPS + off) as *mut usize
}

/// Reads the function pointer in a context's ops slot.
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub unsafe fn context_op(ctx: *mut c_void, off: usize) -> usize {
    // SAFETY: the slot lies inside the live context (offsets of verbs.h); pointer-aligned.
    unsafe { std::ptr::read_volatile(ops_slot(ctx, off)) }
}

/// Replaces the function pointer in a context's ops slot (a single aligned store: a thread
/// calling through the slot concurrently sees either the old or the new function).
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`; `f` has the prototype of that slot.
pub unsafe fn set_context_op(ctx: *mut c_void, off: usize, f: usize) {
    // SAFETY: as context_op; the context is heap memory owned by libibverbs and writable.
    unsafe { std::ptr::write_volatile(ops_slot(ctx, off), f) }
}

/// The `context` member (first field) of an `ibv_qp` or `ibv_cq`.
///
/// # Safety
/// `obj` is a live `struct ibv_qp *` or `struct ibv_cq *`.
pub unsafe fn object_context(obj: *mut c_void) -> *mut c_void {
    // SAFETY: both structs start with `struct ibv_context *context`.
    unsafe { *(obj as *const *mut c_void) }
}

/// A u32 member of a verbs object at byte `off`.
///
/// # Safety
/// `obj` is live and has a u32 at `off`.
pub unsafe fn object_u32(obj: *mut c_void, off: usize) -> u32 {
    // SAFETY: per the contract.
    unsafe { *((obj as usize + off) as *const u32) }
}

/// The device name (`ibv_get_device_name(ctx->device)`).
///
/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub unsafe fn device_name(ctx: *mut c_void) -> String {
    // SAFETY: ctx->device is the first member; the device outlives its contexts.
    let dev = unsafe { *(ctx as *const *const u8) };
    if dev.is_null() {
        return String::new();
    }
    // SAFETY: `name` is a NUL-terminated char[64] inside the device.
    let name = unsafe { std::slice::from_raw_parts(dev.add(DEV_NAME), 64) };
    let n = name.iter().position(|&b| b == 0).unwrap_or(64);
    String::from_utf8_lossy(&name[..n]).into_owned()
}

/// `ibv_post_send` as verbs.h's inline does it.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid list whose buffers stay valid for the call.
pub unsafe fn post_send(qp: *mut c_void, wr: *mut SendWr, bad: *mut *mut SendWr) -> c_int {
    // SAFETY: live QP per the contract; the slot holds the provider's post_send.
    unsafe {
        let f: PostSendFn = std::mem::transmute::<usize, PostSendFn>(context_op(object_context(qp), OPS_POST_SEND));
        f(qp, wr, bad)
    }
}

/// `ibv_post_recv` as verbs.h's inline does it; its error number (errno where the provider
/// returned a negative value).
///
/// # Safety
/// `qp` is a live QP; `wr`/`bad` the application's pointers.
pub unsafe fn post_recv(qp: *mut c_void, wr: *mut c_void, bad: *mut *mut c_void) -> Result<(), Errno> {
    // SAFETY: live QP per the contract; the slot holds the provider's post_recv.
    let r = unsafe {
        let f: PostRecvFn = std::mem::transmute::<usize, PostRecvFn>(context_op(object_context(qp), OPS_POST_RECV));
        f(qp, wr, bad)
    };
    match r {
        0 => Ok(()),
        r if r < 0 => Err(Errno::last()),
        r => Err(Errno(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_verbs_layouts() {
        assert_eq!(std::mem::size_of::<TdInitAttr>(), 4);
        assert_eq!(std::mem::size_of::<ParentDomainInitAttr>(), 48);
        assert_eq!(std::mem::offset_of!(ParentDomainInitAttr, comp_mask), 16);
        assert_eq!(std::mem::offset_of!(ParentDomainInitAttr, pd_context), 40);
        assert_eq!(std::mem::size_of::<QpInitAttrEx>(), 136);
        assert_eq!(std::mem::offset_of!(QpInitAttrEx, cap), 32);
        assert_eq!(std::mem::offset_of!(QpInitAttrEx, comp_mask), 60);
        assert_eq!(std::mem::offset_of!(QpInitAttrEx, pd), 64);
        assert_eq!(std::mem::offset_of!(QpInitAttrEx, create_flags), 80);
        assert_eq!(std::mem::offset_of!(QpInitAttrEx, send_ops_flags), 128);
    }

    #[test]
    fn extended_ops_follow_verbs_get_ctx_op() {
        // A fake verbs_context + ibv_context in one buffer.
        let mut mem = vec![0usize; VCTX_SIZE / 8];
        let base = mem.as_mut_ptr() as usize;
        let ctx = (base + VCTX_CONTEXT) as *mut c_void;
        let put = |m: &mut Vec<usize>, off: usize, v: usize| m[off / 8] = v;
        put(&mut mem, VCTX_ALLOC_TD, 0x1111);
        put(&mut mem, VCTX_SZ, VCTX_SIZE);
        // SAFETY: ctx points into the fake, which covers every slot read.
        unsafe {
            assert_eq!(extended_op(ctx, VCTX_ALLOC_TD), None, "abi_compat not set: not extended");
            put(&mut mem, VCTX_CONTEXT + CTX_ABI_COMPAT, usize::MAX);
            assert_eq!(extended_op(ctx, VCTX_ALLOC_TD), Some(0x1111));
            assert_eq!(extended_op(ctx, VCTX_DEALLOC_TD), None, "provider lacks it");
            put(&mut mem, VCTX_SZ, VCTX_SIZE - VCTX_ALLOC_TD - 8);
            assert_eq!(extended_op(ctx, VCTX_ALLOC_TD), None, "context older than the op");
        }
    }

    #[test]
    fn struct_sizes_match_verbs_h() {
        assert_eq!(std::mem::size_of::<SendWr>(), 128);
        assert_eq!(std::mem::size_of::<Sge>(), 16);
        assert_eq!(std::mem::size_of::<QpInitAttr>(), 64);
        assert_eq!(std::mem::size_of::<Wc>(), 48);
        assert_eq!(std::mem::offset_of!(SendWr, wr), 40);
        assert_eq!(std::mem::offset_of!(SendWr, qp_type), 72);
        assert_eq!(std::mem::offset_of!(SendWr, ext), 80);
        assert_eq!(std::mem::offset_of!(QpInitAttr, cap), 32);
        assert_eq!(std::mem::offset_of!(QpInitAttr, qp_type), 52);
        assert_eq!(std::mem::offset_of!(Wc, qp_num), 28);
        assert_eq!(std::mem::offset_of!(Wc, wc_flags), 36);
    }
}
