//! The CUDA driver as libgdsync sees it: a small safe trait ([`Cuda`]) over the entry points the
//! engine needs, implemented by [`RealCuda`] (libcuda.so.1 loaded at run time through
//! `gpudirect_common::cuda::Driver`, never linked) and by fakes in the unit tests.
//!
//! This is the only module of the crate that calls into libcuda; [`gdr`] is the only one calling
//! libgdrapi.

pub mod gdr;
#[cfg(test)]
pub mod testcuda;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use gpudirect_common::Errno;
use gpudirect_common::cuda::{CuResult, Driver, as_fn};

use crate::abi::BatchMemOpParams;

/// A driver call's result: the value, or the failing `CUresult`.
pub type CuRes<T> = Result<T, CuResult>;

pub use gpudirect_common::cuda::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY,
};
/// The two results only the registration cache tells apart (the workspace's shared set lacks them).
pub const CUDA_ERROR_ALREADY_MAPPED: CuResult = 208;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CuResult = 712;

pub const CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: c_int = 92;
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: c_int = 93;
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: c_int = 94;
pub const CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: c_int = 98;
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: c_int = 122;
pub const CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: c_int = 123;

pub const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x1;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: u32 = 0x2;
pub const CU_MEMHOSTREGISTER_IOMEMORY: u32 = 0x4;
pub const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;

/// The predefined stream handles: NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`.
pub fn is_predefined_stream(stream: usize) -> bool {
    stream <= 2
}

/// The driver entry points the engine uses. Handles (streams, contexts) and host addresses are
/// plain integers here: the engine never dereferences them, the driver validates them.
pub trait Cuda: Sync {
    /// Whether the batch entry point is the v2 one (CUDA ≥ 11.7: memops always enabled).
    fn has_v2_memops(&self) -> bool;
    fn ctx_get_current(&self) -> CuRes<usize>;
    /// `cuStreamGetCtx`; `Err(CUDA_ERROR_NOT_SUPPORTED)` when the driver lacks it.
    fn stream_get_ctx(&self, stream: usize) -> CuRes<usize>;
    fn ctx_push(&self, ctx: usize) -> CuRes<()>;
    fn ctx_pop(&self) -> CuRes<()>;
    fn ctx_get_device(&self) -> CuRes<i32>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> CuRes<i32>;
    fn device_get_attribute(&self, attr: c_int, dev: i32) -> CuRes<i32>;
    /// `cuStreamBatchMemOp`; the driver may write the `alias` fields, hence `&mut`.
    fn batch_mem_op(&self, stream: usize, ops: &mut [BatchMemOpParams], flags: u32) -> CuRes<()>;
    /// The batch entry point itself, for a caller that keeps it next to its other hot state
    /// ([`crate::engine::post_line`]); `None` where there is no driver entry point (the fakes).
    fn batch_entry(&self) -> Option<BatchEntry> {
        None
    }
    fn mem_host_register(&self, addr: usize, len: usize, flags: u32) -> CuRes<()>;
    fn mem_host_unregister(&self, addr: usize) -> CuRes<()>;
    fn mem_host_get_device_pointer(&self, addr: usize) -> CuRes<u64>;
    fn mem_alloc(&self, size: usize) -> CuRes<u64>;
    fn mem_free(&self, dptr: u64) -> CuRes<()>;
    /// `cuPointerSetAttribute(&1, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dptr)`.
    fn pointer_set_sync_memops(&self, dptr: u64) -> CuRes<()>;
    fn error_string(&self, r: CuResult) -> String;
}

type FnCtxGetCurrent = unsafe extern "C" fn(*mut usize) -> CuResult;
type FnStreamGetCtx = unsafe extern "C" fn(usize, *mut usize) -> CuResult;
type FnCtxPush = unsafe extern "C" fn(usize) -> CuResult;
type FnCtxPop = unsafe extern "C" fn(*mut usize) -> CuResult;
type FnCtxGetDevice = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;
type FnBatchMemOp = unsafe extern "C" fn(usize, c_uint, *mut BatchMemOpParams, c_uint) -> CuResult;
type FnMemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult;
type FnMemHostUnregister = unsafe extern "C" fn(*mut c_void) -> CuResult;
type FnMemHostGetDevicePointer = unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> CuResult;
type FnMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type FnMemFree = unsafe extern "C" fn(u64) -> CuResult;
type FnPointerSetAttribute = unsafe extern "C" fn(*const c_void, c_int, u64) -> CuResult;
type FnGetErrorString = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

/// `cuStreamBatchMemOp` as resolved from libcuda.so.1: a plain copyable function pointer, so that
/// a post can call the driver without reaching [`RealCuda`] (another cache line) first. Only
/// [`RealCuda::load`] makes one, from the symbol resolved for the prototype [`FnBatchMemOp`].
#[derive(Clone, Copy)]
pub struct BatchEntry(FnBatchMemOp);

impl BatchEntry {
    /// Submits `ops` on `stream` with the batch `flags`.
    #[inline]
    pub fn call(self, stream: usize, ops: &mut [BatchMemOpParams], flags: u32) -> CuRes<()> {
        let n = c_uint::try_from(ops.len()).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let p = if ops.is_empty() { std::ptr::null_mut() } else { ops.as_mut_ptr() };
        // SAFETY: the pointer is the driver's cuStreamBatchMemOp for this prototype (the only
        // constructor is RealCuda::load); `p` points to `n` initialised 48-byte
        // CUstreamBatchMemOpParams (layout tested in abi.rs) that stay alive for the call; the
        // stream handle is the application's.
        check(unsafe { (self.0)(stream, n, p, flags) })
    }
}

/// libcuda.so.1, with the entry points resolved once.
pub struct RealCuda {
    _driver: Driver,
    v2_memops: bool,
    ctx_get_current: FnCtxGetCurrent,
    stream_get_ctx: Option<FnStreamGetCtx>,
    ctx_push: FnCtxPush,
    ctx_pop: FnCtxPop,
    ctx_get_device: FnCtxGetDevice,
    device_count: FnDeviceGetCount,
    device_get_attribute: FnDeviceGetAttribute,
    batch_mem_op: BatchEntry,
    mem_host_register: FnMemHostRegister,
    mem_host_unregister: FnMemHostUnregister,
    mem_host_get_device_pointer: FnMemHostGetDevicePointer,
    mem_alloc: FnMemAlloc,
    mem_free: FnMemFree,
    pointer_set_attribute: FnPointerSetAttribute,
    get_error_string: Option<FnGetErrorString>,
}

/// The CUDA version our prototypes correspond to: 12.0 selects the `_v2` variants (cuMemAlloc_v2,
/// cuStreamBatchMemOp_v2, ...), whose signatures are the ones declared above.
const API_VERSION: c_int = 12000;
/// Fallback for drivers older than 12.0 (v1 memops, still the same prototypes).
const API_VERSION_OLD: c_int = 11000;

impl RealCuda {
    /// Loads libcuda.so.1 and resolves every entry point.
    pub fn load() -> Result<RealCuda, String> {
        let driver = Driver::load("libcuda.so.1").map_err(|e| e.to_string())?;
        let version = driver.driver_version().unwrap_or(0);
        let resolve = |name: &CStr| -> Result<std::ptr::NonNull<c_void>, String> {
            driver
                .resolve(name, API_VERSION)
                .or_else(|_| driver.resolve(name, API_VERSION_OLD))
                .map_err(|r| format!("{} not found in libcuda.so.1 (CUresult {r})", name.to_string_lossy()))
        };
        // SAFETY (for every as_fn below): each symbol is resolved for CUDA 12.0 (or 11.0), where its
        // prototype is exactly the function pointer type it is converted to.
        macro_rules! get {
            ($name:literal, $ty:ty) => {{
                let p = resolve($name)?;
                // SAFETY: see above.
                unsafe { as_fn::<$ty>(p) }
            }};
        }
        let stream_get_ctx = resolve(c"cuStreamGetCtx").ok().map(|p| {
            // SAFETY: cuStreamGetCtx(CUstream, CUcontext *) at version 12.0.
            unsafe { as_fn::<FnStreamGetCtx>(p) }
        });
        let get_error_string = resolve(c"cuGetErrorString").ok().map(|p| {
            // SAFETY: cuGetErrorString(CUresult, const char **).
            unsafe { as_fn::<FnGetErrorString>(p) }
        });
        Ok(RealCuda {
            v2_memops: version >= 11070,
            ctx_get_current: get!(c"cuCtxGetCurrent", FnCtxGetCurrent),
            stream_get_ctx,
            ctx_push: get!(c"cuCtxPushCurrent", FnCtxPush),
            ctx_pop: get!(c"cuCtxPopCurrent", FnCtxPop),
            ctx_get_device: get!(c"cuCtxGetDevice", FnCtxGetDevice),
            device_count: get!(c"cuDeviceGetCount", FnDeviceGetCount),
            device_get_attribute: get!(c"cuDeviceGetAttribute", FnDeviceGetAttribute),
            batch_mem_op: BatchEntry(get!(c"cuStreamBatchMemOp", FnBatchMemOp)),
            mem_host_register: get!(c"cuMemHostRegister", FnMemHostRegister),
            mem_host_unregister: get!(c"cuMemHostUnregister", FnMemHostUnregister),
            mem_host_get_device_pointer: get!(c"cuMemHostGetDevicePointer", FnMemHostGetDevicePointer),
            mem_alloc: get!(c"cuMemAlloc", FnMemAlloc),
            mem_free: get!(c"cuMemFree", FnMemFree),
            pointer_set_attribute: get!(c"cuPointerSetAttribute", FnPointerSetAttribute),
            get_error_string,
            _driver: driver,
        })
    }
}

fn check(r: CuResult) -> CuRes<()> {
    if r == 0 { Ok(()) } else { Err(r) }
}

impl Cuda for RealCuda {
    fn has_v2_memops(&self) -> bool {
        self.v2_memops
    }
    fn ctx_get_current(&self) -> CuRes<usize> {
        let mut c = 0usize;
        // SAFETY: `c` is a valid out pointer (CUcontext is pointer-sized).
        check(unsafe { (self.ctx_get_current)(&mut c) })?;
        Ok(c)
    }
    fn stream_get_ctx(&self, stream: usize) -> CuRes<usize> {
        let f = self.stream_get_ctx.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let mut c = 0usize;
        // SAFETY: out pointer valid; the stream handle is the application's (the exported
        // functions' contract says it is a live stream or a predefined handle).
        check(unsafe { f(stream, &mut c) })?;
        Ok(c)
    }
    fn ctx_push(&self, ctx: usize) -> CuRes<()> {
        // SAFETY: ctx came from cuStreamGetCtx.
        check(unsafe { (self.ctx_push)(ctx) })
    }
    fn ctx_pop(&self) -> CuRes<()> {
        let mut c = 0usize;
        // SAFETY: valid out pointer.
        check(unsafe { (self.ctx_pop)(&mut c) })
    }
    fn ctx_get_device(&self) -> CuRes<i32> {
        let mut d: c_int = 0;
        // SAFETY: valid out pointer.
        check(unsafe { (self.ctx_get_device)(&mut d) })?;
        Ok(d)
    }
    fn device_count(&self) -> CuRes<i32> {
        let mut n: c_int = 0;
        // SAFETY: valid out pointer.
        check(unsafe { (self.device_count)(&mut n) })?;
        Ok(n)
    }
    fn device_get_attribute(&self, attr: c_int, dev: i32) -> CuRes<i32> {
        let mut v: c_int = 0;
        // SAFETY: valid out pointer; attr/dev are plain values the driver validates.
        check(unsafe { (self.device_get_attribute)(&mut v, attr, dev) })?;
        Ok(v)
    }
    fn batch_mem_op(&self, stream: usize, ops: &mut [BatchMemOpParams], flags: u32) -> CuRes<()> {
        self.batch_mem_op.call(stream, ops, flags)
    }
    fn batch_entry(&self) -> Option<BatchEntry> {
        Some(self.batch_mem_op)
    }
    fn mem_host_register(&self, addr: usize, len: usize, flags: u32) -> CuRes<()> {
        // SAFETY: the driver pins the pages itself and fails cleanly on unmapped addresses.
        check(unsafe { (self.mem_host_register)(addr as *mut c_void, len, flags) })
    }
    fn mem_host_unregister(&self, addr: usize) -> CuRes<()> {
        // SAFETY: addr is the base of a registration this library made.
        check(unsafe { (self.mem_host_unregister)(addr as *mut c_void) })
    }
    fn mem_host_get_device_pointer(&self, addr: usize) -> CuRes<u64> {
        let mut d = 0u64;
        // SAFETY: valid out pointer; addr lies in a registered range.
        check(unsafe { (self.mem_host_get_device_pointer)(&mut d, addr as *mut c_void, 0) })?;
        Ok(d)
    }
    fn mem_alloc(&self, size: usize) -> CuRes<u64> {
        let mut d = 0u64;
        // SAFETY: valid out pointer.
        check(unsafe { (self.mem_alloc)(&mut d, size) })?;
        Ok(d)
    }
    fn mem_free(&self, dptr: u64) -> CuRes<()> {
        // SAFETY: dptr came from mem_alloc.
        check(unsafe { (self.mem_free)(dptr) })
    }
    fn pointer_set_sync_memops(&self, dptr: u64) -> CuRes<()> {
        let one: c_uint = 1;
        // SAFETY: the attribute value is read from `one` during the call only.
        check(unsafe {
            (self.pointer_set_attribute)((&one as *const c_uint).cast(), CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dptr)
        })
    }
    fn error_string(&self, r: CuResult) -> String {
        let Some(f) = self.get_error_string else { return format!("CUDA error {r}") };
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: valid out pointer; on success the driver returns a static NUL-terminated string.
        if unsafe { f(r, &mut s) } != 0 || s.is_null() {
            return format!("CUDA error {r}");
        }
        // SAFETY: non-NULL string from the driver (see above).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// The process's driver, loaded on first use. Failure to load is reported once and then as `EIO`.
pub fn cuda() -> Result<&'static dyn Cuda, Errno> {
    static CUDA: OnceLock<Result<RealCuda, String>> = OnceLock::new();
    match CUDA.get_or_init(RealCuda::load) {
        Ok(c) => Ok(c),
        Err(e) => {
            gds_warn_once!("gds_cuda", "cannot use the CUDA driver: {e}");
            Err(Errno::EIO)
        }
    }
}

/// CUDA result → errno, as upstream's batch submitter maps it (spec §4.3).
pub fn errno_of(r: CuResult) -> Errno {
    match r {
        0 => Errno(0),
        CUDA_ERROR_NOT_SUPPORTED => Errno::EPERM,
        CUDA_ERROR_INVALID_VALUE => Errno::EINVAL,
        CUDA_ERROR_OUT_OF_MEMORY => Errno::ENOMEM,
        _ => Errno::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_errors_map_like_upstream() {
        assert_eq!(errno_of(801), Errno::EPERM);
        assert_eq!(errno_of(1), Errno::EINVAL);
        assert_eq!(errno_of(2), Errno::ENOMEM);
        assert_eq!(errno_of(999), Errno::EIO);
        assert_eq!(errno_of(201), Errno::EIO);
    }

    #[test]
    fn predefined_streams() {
        assert!(is_predefined_stream(0) && is_predefined_stream(1) && is_predefined_stream(2));
        assert!(!is_predefined_stream(0x5555_0000));
    }
}
