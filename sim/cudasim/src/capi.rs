//! The exported C ABI: argument checks, out-pointer writes and the panic guard around the
//! driver core. Names, signatures and result codes follow `cuda.h`.
#![allow(non_snake_case)]

use crate::driver::{self, Kind, R};
use crate::exec::Elem;
use crate::stream::Op;
use crate::types::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// cudasim's side of the C boundary: a panic is logged as an internal error of the function and
/// returned as `CUDA_ERROR_UNKNOWN` (see the `CUresult` return below).
pub(crate) struct CudaSim;

impl gpudirect_common::boundary::Library for CudaSim {
    type Error = CUresult;
    fn panicked(function: &str, _message: &str) {
        crate::log!("{function}: internal error (panic)");
    }
    /// Unused: every cudasim export returns a `CUresult`, never an `int`.
    fn errno(_function: &str, e: CUresult) -> c_int {
        e as c_int
    }
}

/// An API body's `Err` becomes its code; failures are logged when CUDASIM_LOG=1, successes too
/// at CUDASIM_LOG=2.
impl gpudirect_common::boundary::CReturn<CudaSim> for CUresult {
    type Body = R<()>;
    fn on_panic() -> Self {
        err::UNKNOWN
    }
    fn finish(name: &str, body: impl FnOnce() -> R<()>) -> Self {
        match body() {
            Ok(()) => {
                if crate::log_level() >= 2 {
                    crate::log!("{name} -> CUDA_SUCCESS");
                }
                err::SUCCESS
            }
            Err(e) => {
                // NOT_READY is a normal answer; cuGetProcAddress logs its misses itself.
                if e != err::NOT_READY && !name.starts_with("cuGetProcAddress") {
                    crate::log!("{name} -> {} ({e})", error_entry(e).map_or("?", |x| x.1));
                }
                e
            }
        }
    }
}

/// Writes an out-parameter.
///
/// # Safety
/// `p` is NULL (rejected) or valid for a write of `T` (alignment not required).
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(err::INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes an optional out-parameter (NULL means "not wanted").
///
/// # Safety
/// As [`put`], but NULL is accepted.
pub(crate) unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL and valid per the caller's contract.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads an in-parameter.
///
/// # Safety
/// `p` is NULL (rejected) or valid for a read of `T`.
unsafe fn get<T: Copy>(p: *const T) -> R<T> {
    if p.is_null() {
        return Err(err::INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the caller's contract.
    Ok(unsafe { p.read_unaligned() })
}

/// Copies `s` into a C buffer of `len` bytes, truncating, always NUL-terminated.
///
/// # Safety
/// `buf` is valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_int, s: &str) -> R<()> {
    if buf.is_null() || len <= 0 {
        return Err(err::INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: n + 1 <= len bytes are written to the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

macro_rules! export {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block)*) => {$(
        // The implementation lives in a module named after the export (modules and functions
        // have separate namespaces); the export itself is a patchable entry stub (entry.rs).
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        mod $name {
            use super::*;
            pub(super) unsafe extern "C" fn imp($($arg: $ty),*) -> CUresult {
                gpudirect_common::guarded!(CudaSim, stringify!($name), -> CUresult { $body })
            }
        }
        crate::entry::patchable_entry! {
            #[doc = concat!("`", stringify!($name), "` of the CUDA driver API (simulated).")]
            ///
            /// # Safety
            /// Called from C under the CUDA driver API contract: pointer arguments are NULL or
            /// valid for the accesses that the function documents.
            fn $name($($arg: $ty),*) -> CUresult => $name::imp
        }
    )*};
}
pub(crate) use export;

fn d() -> R<std::sync::Arc<driver::Driver>> {
    driver::get()
}

// ----- initialisation, version, errors ------------------------------------------------------

export! {
    fn cuInit(flags: c_uint) { driver::init(flags) }

    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(version, driver::driver_version()) }
    }

    fn cuGetErrorName(code: CUresult, pstr: *mut *const c_char) {
        match error_entry(code) {
            // SAFETY: out-pointer from the caller; NULL is rejected.
            Some(e) => unsafe { put(pstr, name_cstr(e.1).as_ptr()) },
            None => {
                // SAFETY: as above.
                unsafe { put_opt(pstr, std::ptr::null()) };
                Err(err::INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorString(code: CUresult, pstr: *mut *const c_char) {
        match error_entry(code) {
            // SAFETY: out-pointer from the caller; NULL is rejected.
            Some(e) => unsafe { put(pstr, desc_cstr(e.2).as_ptr()) },
            None => {
                // SAFETY: as above.
                unsafe { put_opt(pstr, std::ptr::null()) };
                Err(err::INVALID_VALUE)
            }
        }
    }
}

/// NUL-terminated copies of the error table's strings, made once and kept for the process
/// lifetime (cuGetErrorName/String return pointers to static strings).
fn cstr_table(idx: usize) -> &'static [std::ffi::CString] {
    use std::sync::OnceLock;
    static T: [OnceLock<Vec<std::ffi::CString>>; 2] = [OnceLock::new(), OnceLock::new()];
    T[idx].get_or_init(|| {
        ERROR_TABLE
            .iter()
            .map(|e| std::ffi::CString::new(if idx == 0 { e.1 } else { e.2 }).expect("no NUL in table"))
            .collect()
    })
}

fn name_cstr(name: &str) -> &'static CStr {
    let i = ERROR_TABLE.iter().position(|e| e.1 == name).expect("from the table");
    &cstr_table(0)[i]
}

fn desc_cstr(desc: &str) -> &'static CStr {
    let i = ERROR_TABLE.iter().position(|e| e.2 == desc).expect("from the table");
    &cstr_table(1)[i]
}

// ----- devices ------------------------------------------------------------------------------

export! {
    fn cuDeviceGetCount(count: *mut c_int) {
        let d = d()?;
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(count, d.cfg.device_count) }
    }

    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        let d = d()?;
        if device.is_null() {
            return Err(err::INVALID_VALUE);
        }
        d.check_device(ordinal)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(device, ordinal) }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = d()?;
        d.check_device(dev)?;
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { put_str(name, len, "cudasim GPU") }
    }

    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        let d = d()?;
        if pi.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let v = d.device_attribute(attrib, dev)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(pi, v) }
    }

    fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) {
        let d = d()?;
        if prop.is_null() {
            return Err(err::INVALID_VALUE);
        }
        use crate::types::attr as a;
        let g = |x| d.device_attribute(x, dev);
        let p = CUdevprop {
            max_threads_per_block: g(a::MAX_THREADS_PER_BLOCK)?,
            max_threads_dim: [g(a::MAX_BLOCK_DIM_X)?, g(a::MAX_BLOCK_DIM_Y)?, g(a::MAX_BLOCK_DIM_Z)?],
            max_grid_size: [g(a::MAX_GRID_DIM_X)?, g(a::MAX_GRID_DIM_Y)?, g(a::MAX_GRID_DIM_Z)?],
            shared_mem_per_block: g(a::MAX_SHARED_MEMORY_PER_BLOCK)?,
            total_constant_memory: g(a::TOTAL_CONSTANT_MEMORY)?,
            simd_width: g(a::WARP_SIZE)?,
            mem_pitch: g(a::MAX_PITCH)?,
            regs_per_block: g(a::MAX_REGISTERS_PER_BLOCK)?,
            clock_rate: g(a::CLOCK_RATE)?,
            texture_align: g(a::TEXTURE_ALIGNMENT)?,
        };
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(prop, p) }
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
        let d = d()?;
        d.check_device(dev)?;
        if major.is_null() || minor.is_null() {
            return Err(err::INVALID_VALUE);
        }
        // SAFETY: out-pointers from the caller, checked non-NULL.
        unsafe {
            put(major, 9)?;
            put(minor, 0)
        }
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let d = d()?;
        d.check_device(dev)?;
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(bytes, d.mem_info().0 as usize) }
    }

    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) { device_uuid(uuid, dev) }
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) { device_uuid(uuid, dev) }

    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) {
        let d = d()?;
        d.check_device(dev)?;
        let (dom, bus, pdev) = d.pci(dev);
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { put_str(bus_id, len, &format!("{dom:04x}:{bus:02x}:{pdev:02x}.0")) }
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) {
        let d = d()?;
        if dev.is_null() || bus_id.is_null() {
            return Err(err::INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let want = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy().to_ascii_lowercase();
        for i in 0..d.cfg.device_count {
            let (dom, bus, pdev) = d.pci(i);
            let full = format!("{dom:04x}:{bus:02x}:{pdev:02x}.0");
            if want == full || want == format!("{:08x}:{bus:02x}:{pdev:02x}.0", dom) || want == full[5..] {
                // SAFETY: out-pointer from the caller, checked non-NULL.
                return unsafe { put(dev, i) };
            }
        }
        Err(err::INVALID_DEVICE)
    }
}

fn device_uuid(uuid: *mut [u8; 16], dev: CUdevice) -> R<()> {
    let d = d()?;
    d.check_device(dev)?;
    let mut u = *b"cudasim-gpu-\0\0\0\0";
    u[12..].copy_from_slice(&(dev as u32).to_be_bytes());
    // SAFETY: out-pointer from the caller; NULL is rejected.
    unsafe { put(uuid, u) }
}

// ----- contexts -----------------------------------------------------------------------------

fn ctx_ptr(h: u64) -> CUcontext {
    h as usize as CUcontext
}

export! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        let d = d()?;
        if pctx.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let h = d.primary_retain(dev)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(pctx, ctx_ptr(h)) }
    }

    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { d()?.primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { d()?.primary_release(dev) }
    fn cuDevicePrimaryCtxReset(dev: CUdevice) { d()?.primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) { d()?.primary_reset(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) { d()?.primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) { d()?.primary_set_flags(dev, flags) }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let d = d()?;
        if flags.is_null() || active.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let (f, a) = d.primary_state(dev)?;
        // SAFETY: out-pointers from the caller, checked non-NULL.
        unsafe {
            put(flags, f)?;
            put(active, a as c_int)
        }
    }

    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) { ctx_create(pctx, flags, dev) }

    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(err::INVALID_VALUE);
        }
        if num_params > 0 {
            crate::log!("cuCtxCreate_v3: execution affinity is not simulated");
            return Err(err::NOT_SUPPORTED);
        }
        ctx_create(pctx, flags, dev)
    }

    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *const CUctxCreateParams, flags: c_uint, dev: CUdevice) {
        if !params.is_null() {
            // SAFETY: non-NULL params struct from the caller.
            let p = unsafe { get(params)? };
            if p.num_exec_affinity_params != 0 || !p.cig_params.is_null() {
                crate::log!("cuCtxCreate_v4: execution affinity / CIG parameters are not simulated");
                return Err(err::NOT_SUPPORTED);
            }
        }
        ctx_create(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: CUcontext) { d()?.ctx_destroy(ctx as u64) }
    fn cuCtxDestroy_v2(ctx: CUcontext) { d()?.ctx_destroy(ctx as u64) }

    // A NULL context means the calling thread's current one, as in the driver.
    fn cuCtxGetId(ctx: CUcontext, ctx_id: *mut u64) {
        let d = d()?;
        if ctx_id.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let c = if ctx.is_null() { d.current()? } else { d.context(ctx as u64)? };
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(ctx_id, c.id) }
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        let _d = d()?;
        let h = driver::with_stack(|s| s.last().copied()).unwrap_or(0);
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(pctx, ctx_ptr(h)) }
    }

    fn cuCtxSetCurrent(ctx: CUcontext) {
        let d = d()?;
        let h = ctx as u64;
        if h == 0 {
            driver::with_stack(|s| s.pop());
            return Ok(());
        }
        d.context(h)?;
        driver::with_stack(|s| match s.last_mut() {
            Some(top) => *top = h,
            None => s.push(h),
        });
        Ok(())
    }

    fn cuCtxPushCurrent(ctx: CUcontext) { ctx_push(ctx) }
    fn cuCtxPushCurrent_v2(ctx: CUcontext) { ctx_push(ctx) }
    fn cuCtxPopCurrent(pctx: *mut CUcontext) { ctx_pop(pctx) }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) { ctx_pop(pctx) }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = d()?;
        if dev.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let c = d.current()?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(dev, c.device) }
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        let d = d()?;
        if flags.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let c = d.current()?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(flags, c.flags) }
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) {
        let d = d()?;
        if version.is_null() {
            return Err(err::INVALID_VALUE);
        }
        if ctx.is_null() { d.current()?; } else { d.context(ctx as u64)?; }
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(version, 3020) }
    }

    fn cuCtxSynchronize() {
        let d = d()?;
        let c = d.current()?;
        match d.ctx_synchronize(&c) {
            err::SUCCESS => Ok(()),
            e => Err(e),
        }
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        let d = d()?;
        d.current()?;
        // SAFETY: optional out-pointers from the caller.
        unsafe {
            put_opt(least, 0);
            put_opt(greatest, -5);
        }
        Ok(())
    }
}

export! {
    fn cuFlushGPUDirectRDMAWrites(target: c_uint, scope: c_uint) {
        // target: CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX (0); scope: TO_OWNER (100)
        // or TO_ALL_DEVICES (200). Inbound writes land in coherent memory here: a fence does it.
        let d = d()?;
        if target != 0 || (scope != 100 && scope != 200) {
            return Err(err::INVALID_VALUE);
        }
        d.current()?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> R<()> {
    let d = d()?;
    if pctx.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let h = d.ctx_create(flags, dev)?;
    // SAFETY: out-pointer from the caller, checked non-NULL.
    unsafe { put(pctx, ctx_ptr(h)) }
}

fn ctx_push(ctx: CUcontext) -> R<()> {
    let d = d()?;
    if ctx.is_null() {
        return Err(err::INVALID_CONTEXT);
    }
    d.context(ctx as u64)?;
    driver::with_stack(|s| s.push(ctx as u64));
    Ok(())
}

fn ctx_pop(pctx: *mut CUcontext) -> R<()> {
    let _d = d()?;
    let h = driver::with_stack(|s| s.pop()).ok_or(err::INVALID_CONTEXT)?;
    // SAFETY: optional out-pointer from the caller.
    unsafe { put_opt(pctx, ctx_ptr(h)) };
    Ok(())
}

// ----- memory -------------------------------------------------------------------------------

export! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        let d = d()?;
        if dptr.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let p = d.mem_alloc(bytesize as u64)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(dptr, p) }
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        let d = d()?;
        if dptr == 0 {
            return Ok(());
        }
        d.free_range(dptr, &[Kind::Device], err::INVALID_VALUE)
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) { host_alloc(pp, bytesize, 0) }
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) { host_alloc(pp, bytesize, flags) }

    fn cuMemFreeHost(p: *mut c_void) {
        d()?.free_range(p as u64, &[Kind::Host], err::INVALID_VALUE)
    }

    fn cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: c_uint) { d()?.host_register(p as u64, bytesize as u64, flags) }
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) { d()?.host_register(p as u64, bytesize as u64, flags) }

    fn cuMemHostUnregister(p: *mut c_void) {
        let d = d()?;
        if p.is_null() {
            return Err(err::INVALID_VALUE);
        }
        d.free_range(p as u64, &[Kind::Registered], err::HOST_MEMORY_NOT_REGISTERED)
    }

    fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        let d = d()?;
        if pdptr.is_null() || p.is_null() || flags != 0 {
            return Err(err::INVALID_VALUE);
        }
        let t = d.tables();
        match t.find(p as u64) {
            Some(r) if matches!(r.kind, Kind::Host | Kind::Registered) => {}
            _ => return Err(err::INVALID_VALUE),
        }
        // Unified addressing: the host address is the device address.
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(pdptr, p as u64) }
    }

    fn cuMemHostGetFlags(pflags: *mut c_uint, p: *mut c_void) {
        let d = d()?;
        if pflags.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let t = d.tables();
        let f = match t.find(p as u64) {
            Some(r) if matches!(r.kind, Kind::Host | Kind::Registered) => r.flags,
            _ => return Err(err::INVALID_VALUE),
        };
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(pflags, f) }
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let d = d()?;
        d.current()?;
        if free.is_null() || total.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let (t, f) = d.mem_info();
        // SAFETY: out-pointers from the caller, checked non-NULL.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    }

    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        let d = d()?;
        let t = d.tables();
        let r = t.find(dptr).ok_or(err::NOT_FOUND)?;
        // SAFETY: optional out-pointers from the caller.
        unsafe {
            put_opt(pbase, r.base);
            put_opt(psize, r.size as usize);
        }
        Ok(())
    }

    fn cuMemGetHandleForAddressRange(handle: *mut c_void, dptr: CUdeviceptr, size: usize, handle_type: c_uint, flags: u64) {
        let d = d()?;
        if handle.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let fd = d.dmabuf_fd(dptr, size as u64, handle_type, flags)?;
        // SAFETY: for DMA_BUF_FD the handle points to an int.
        unsafe { put(handle as *mut c_int, fd) }
    }
}

fn host_alloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> R<()> {
    let d = d()?;
    if pp.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let p = d.host_alloc(bytesize as u64, flags)?;
    // SAFETY: out-pointer from the caller, checked non-NULL.
    unsafe { put(pp, p as *mut c_void) }
}

// ----- copies and memsets -------------------------------------------------------------------

/// Which side of a copy must be tracked memory.
#[derive(Clone, Copy)]
enum Side {
    /// Must be device-accessible memory (device allocation, host allocation, registration).
    Dev,
    /// Any host pointer; checked against the range table only when it falls inside one.
    Any,
}

fn check_side(t: &driver::Tables, p: u64, n: u64, side: Side, write: bool) -> R<()> {
    if p == 0 {
        return Err(err::INVALID_VALUE);
    }
    match side {
        Side::Dev => t.check(p, n, write).map(|_| ()),
        Side::Any => match t.find(p) {
            Some(_) => t.check(p, n, write).map(|_| ()),
            None => Ok(()),
        },
    }
}

/// Queues a copy on `stream`; with `sync` waits for it.
fn copy(dst: u64, src: u64, n: usize, ds: Side, ss: Side, stream: CUstream, sync: bool) -> R<()> {
    let d = d()?;
    let s = d.stream(stream as usize)?;
    if n == 0 {
        return Ok(());
    }
    let n = n as u64;
    d.submit(&s, |t| {
        check_side(t, dst, n, ds, true)?;
        check_side(t, src, n, ss, false)?;
        Ok(Op::Copy { dst, src, len: n })
    })?;
    if sync { sync_result(s.synchronize()) } else { Ok(()) }
}

fn memset(dst: u64, count: usize, elem: Elem, stream: CUstream, sync: bool) -> R<()> {
    let d = d()?;
    let s = d.stream(stream as usize)?;
    if dst % elem.size() != 0 {
        return Err(err::INVALID_VALUE);
    }
    if count == 0 {
        return Ok(());
    }
    let bytes = (count as u64).checked_mul(elem.size()).ok_or(err::INVALID_VALUE)?;
    d.submit(&s, |t| {
        check_side(t, dst, bytes, Side::Dev, true)?;
        Ok(Op::Fill { dst, count: count as u64, elem })
    })?;
    if sync { sync_result(s.synchronize()) } else { Ok(()) }
}

fn sync_result(e: CUresult) -> R<()> {
    if e == err::SUCCESS { Ok(()) } else { Err(e) }
}

const NULL_STREAM: CUstream = std::ptr::null_mut();

export! {
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { copy(dst, src, n, Side::Any, Side::Any, NULL_STREAM, true) }
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) { copy(dst, src, n, Side::Any, Side::Any, s, false) }
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) { copy(dst, src as u64, n, Side::Dev, Side::Any, NULL_STREAM, true) }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) { copy(dst as u64, src, n, Side::Any, Side::Dev, NULL_STREAM, true) }
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { copy(dst, src, n, Side::Dev, Side::Dev, NULL_STREAM, true) }
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) { copy(dst, src as u64, n, Side::Dev, Side::Any, s, false) }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) { copy(dst as u64, src, n, Side::Any, Side::Dev, s, false) }
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) { copy(dst, src, n, Side::Dev, Side::Dev, s, false) }

    fn cuMemsetD8_v2(dst: CUdeviceptr, uc: u8, n: usize) { memset(dst, n, Elem::U8(uc), NULL_STREAM, true) }
    fn cuMemsetD16_v2(dst: CUdeviceptr, us: u16, n: usize) { memset(dst, n, Elem::U16(us), NULL_STREAM, true) }
    fn cuMemsetD32_v2(dst: CUdeviceptr, ui: u32, n: usize) { memset(dst, n, Elem::U32(ui), NULL_STREAM, true) }
    fn cuMemsetD8Async(dst: CUdeviceptr, uc: u8, n: usize, s: CUstream) { memset(dst, n, Elem::U8(uc), s, false) }
    fn cuMemsetD16Async(dst: CUdeviceptr, us: u16, n: usize, s: CUstream) { memset(dst, n, Elem::U16(us), s, false) }
    fn cuMemsetD32Async(dst: CUdeviceptr, ui: u32, n: usize, s: CUstream) { memset(dst, n, Elem::U32(ui), s, false) }
}

// ----- pointer attributes -------------------------------------------------------------------

/// Writes one pointer attribute of the range containing `ptr` (or of an unknown pointer when
/// `range` is None: only cuPointerGetAttributes does that, writing "not CUDA memory" values).
///
/// # Safety
/// `data` is valid for a write of the attribute's type.
unsafe fn write_attr(t: &driver::Tables, range: Option<&driver::Range>, ptr: u64, a: u32, data: *mut c_void) -> R<()> {
    use crate::types::ptr_attr::*;
    if data.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let Some(r) = range else {
        // SAFETY: `data` is valid for the attribute's type (caller contract).
        unsafe {
            match a {
                CONTEXT | HOST_POINTER | MEMPOOL_HANDLE => put(data as *mut *mut c_void, std::ptr::null_mut())?,
                MEMORY_TYPE | ACCESS_FLAGS => put(data as *mut u32, 0)?,
                DEVICE_ORDINAL => put(data as *mut i32, -2)?,
                DEVICE_POINTER | BUFFER_ID | RANGE_START_ADDR | ALLOWED_HANDLE_TYPES | MAPPING_BASE_ADDR
                | MEMORY_BLOCK_ID => put(data as *mut u64, 0)?,
                RANGE_SIZE | MAPPING_SIZE => put(data as *mut usize, 0)?,
                P2P_TOKENS => put(data as *mut P2pTokens, P2pTokens::default())?,
                SYNC_MEMOPS | IS_MANAGED | IS_LEGACY_CUDA_IPC_CAPABLE | MAPPED | IS_GPU_DIRECT_RDMA_CAPABLE => {
                    put(data as *mut bool, false)?
                }
                _ => return Err(err::INVALID_VALUE),
            }
        }
        return Ok(());
    };
    let dev = r.is_device();
    let phys = match &r.backing {
        driver::Backing::Vmm { phys, .. } => t.phys.get(phys),
        _ => None,
    };
    // SAFETY: `data` is valid for the attribute's type (caller contract).
    unsafe {
        match a {
            CONTEXT => put(data as *mut CUcontext, r.ctx as usize as CUcontext),
            MEMORY_TYPE => put(data as *mut u32, if dev { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST }),
            DEVICE_POINTER => put(data as *mut u64, ptr),
            HOST_POINTER if dev => Err(err::INVALID_VALUE),
            HOST_POINTER => put(data as *mut *mut c_void, ptr as *mut c_void),
            P2P_TOKENS if dev => put(data as *mut P2pTokens, P2pTokens::default()),
            P2P_TOKENS => Err(err::INVALID_VALUE),
            SYNC_MEMOPS => put(data as *mut bool, r.sync_memops),
            BUFFER_ID | MEMORY_BLOCK_ID => put(data as *mut u64, r.buffer_id),
            IS_MANAGED => put(data as *mut bool, false),
            DEVICE_ORDINAL => put(data as *mut i32, r.device),
            IS_LEGACY_CUDA_IPC_CAPABLE => put(data as *mut bool, r.kind == Kind::Device),
            RANGE_START_ADDR | MAPPING_BASE_ADDR => put(data as *mut u64, r.base),
            RANGE_SIZE | MAPPING_SIZE => put(data as *mut usize, r.size as usize),
            MAPPED => put(data as *mut bool, true),
            ALLOWED_HANDLE_TYPES => put(data as *mut u64, phys.map_or(0, |p| p.prop.requested_handle_types as u64)),
            IS_GPU_DIRECT_RDMA_CAPABLE => put(
                data as *mut bool,
                match r.kind {
                    Kind::Device => true,
                    Kind::Vmm => phys.is_some_and(|p| p.prop.alloc_flags.gpu_direct_rdma_capable != 0),
                    _ => false,
                },
            ),
            ACCESS_FLAGS => put(data as *mut u32, r.access),
            MEMPOOL_HANDLE => put(data as *mut *mut c_void, std::ptr::null_mut()),
            _ => Err(err::INVALID_VALUE),
        }
    }
}

export! {
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr) {
        let d = d()?;
        let t = d.tables();
        let r = t.find(ptr).ok_or(err::INVALID_VALUE)?;
        // SAFETY: `data` is the caller's out-buffer for this attribute.
        unsafe { write_attr(&t, Some(r), ptr, attribute, data) }
    }

    fn cuPointerGetAttributes(n: c_uint, attrs: *const c_uint, data: *mut *mut c_void, ptr: CUdeviceptr) {
        let d = d()?;
        if n == 0 || attrs.is_null() || data.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let t = d.tables();
        let r = t.find(ptr);
        for i in 0..n as usize {
            // SAFETY: both arrays have `n` elements (caller contract).
            let (a, p) = unsafe { (*attrs.add(i), *data.add(i)) };
            // SAFETY: p is the caller's out-buffer for attribute a.
            unsafe { write_attr(&t, r, ptr, a, p)? };
        }
        Ok(())
    }

    fn cuPointerSetAttribute(value: *const c_void, attribute: c_uint, ptr: CUdeviceptr) {
        let d = d()?;
        if value.is_null() {
            return Err(err::INVALID_VALUE);
        }
        if attribute != crate::types::ptr_attr::SYNC_MEMOPS {
            return Err(err::INVALID_VALUE);
        }
        let mut t = d.tables();
        let r = t.find_mut(ptr).filter(|r| r.is_device()).ok_or(err::INVALID_VALUE)?;
        // SAFETY: for SYNC_MEMOPS the value is a boolean flag; one byte is read (the low byte
        // of an int on little-endian machines).
        r.sync_memops = unsafe { get(value as *const u8)? } != 0;
        Ok(())
    }
}

// ----- virtual memory management ------------------------------------------------------------

export! {
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        let d = d()?;
        if handle.is_null() || flags != 0 {
            return Err(err::INVALID_VALUE);
        }
        // SAFETY: the caller's property struct; NULL is rejected.
        let p = unsafe { get(prop)? };
        let h = d.vmm_create(size as u64, &p)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(handle, h) }
    }

    fn cuMemRelease(handle: CUmemGenericAllocationHandle) { d()?.vmm_release(handle) }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        let d = d()?;
        if ptr.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let p = d.vmm_reserve(size as u64, alignment as u64, addr, flags)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(ptr, p) }
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) { d()?.vmm_free_reservation(ptr, size as u64) }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        d()?.vmm_map(ptr, size as u64, offset as u64, handle, flags)
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) { d()?.vmm_unmap(ptr, size as u64) }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        let d = d()?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(err::INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` descriptors.
        let descs: Vec<CUmemAccessDesc> = (0..count).map(|i| unsafe { desc.add(i).read_unaligned() }).collect();
        d.vmm_set_access(ptr, size as u64, &descs)
    }

    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_uint) {
        let d = d()?;
        if granularity.is_null() || option > 1 {
            return Err(err::INVALID_VALUE);
        }
        // SAFETY: the caller's property struct; NULL is rejected.
        let p = unsafe { get(prop)? };
        if p.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(err::INVALID_VALUE);
        }
        d.check_device(p.location.id)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(granularity, driver::GPU_PAGE as usize) }
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        let d = d()?;
        let p = d.tables().phys.get(&handle).filter(|p| !p.released).map(|p| p.prop).ok_or(err::INVALID_VALUE)?;
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(prop, p) }
    }

    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        let d = d()?;
        if handle.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let t = d.tables();
        let phys = match t.find(addr as u64).map(|r| &r.backing) {
            Some(driver::Backing::Vmm { phys, .. }) => *phys,
            _ => return Err(err::INVALID_VALUE),
        };
        // Our handles are not reference counted per retain: a later cuMemRelease of this
        // value releases the allocation once (documented in docs/cudasim.md).
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(handle, phys) }
    }
}

// ----- streams and events -------------------------------------------------------------------

export! {
    fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) {
        let d = d()?;
        if ph.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let h = d.stream_create(flags, 0)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(ph, h as usize as CUstream) }
    }

    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, priority: c_int) {
        let d = d()?;
        if ph.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let h = d.stream_create(flags, priority)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(ph, h as usize as CUstream) }
    }

    fn cuStreamDestroy(s: CUstream) { d()?.stream_destroy(s as usize) }
    fn cuStreamDestroy_v2(s: CUstream) { d()?.stream_destroy(s as usize) }

    fn cuStreamQuery(s: CUstream) { sync_result(d()?.stream(s as usize)?.query()) }
    fn cuStreamSynchronize(s: CUstream) { sync_result(d()?.stream(s as usize)?.synchronize()) }

    fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) {
        let d = d()?;
        if pctx.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let st = d.stream(s as usize)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(pctx, ctx_ptr(st.ctx)) }
    }

    fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) {
        let st = d()?.stream(s as usize)?;
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(flags, st.flags) }
    }

    fn cuStreamGetPriority(s: CUstream, priority: *mut c_int) {
        let st = d()?.stream(s as usize)?;
        // SAFETY: out-pointer from the caller; NULL is rejected.
        unsafe { put(priority, st.priority) }
    }

    fn cuStreamWaitEvent(s: CUstream, ev: CUevent, flags: c_uint) {
        let d = d()?;
        if flags > 1 {
            return Err(err::INVALID_VALUE);
        }
        let st = d.stream(s as usize)?;
        let e = d.event(ev as usize)?;
        let generation = e.current_gen();
        if generation > 0 {
            st.enqueue(Op::WaitEvent { ev: e, generation });
        }
        Ok(())
    }

    fn cuStreamAddCallback(s: CUstream, cb: CUstreamCallback, data: *mut c_void, flags: c_uint) {
        let d = d()?;
        let f = cb.ok_or(err::INVALID_VALUE)?;
        if flags != 0 {
            return Err(err::INVALID_VALUE);
        }
        let st = d.stream(s as usize)?;
        st.enqueue(Op::Callback { f, stream: s as usize, data: data as usize });
        Ok(())
    }

    fn cuLaunchHostFunc(s: CUstream, f: CUhostFn, data: *mut c_void) {
        let d = d()?;
        let f = f.ok_or(err::INVALID_VALUE)?;
        let st = d.stream(s as usize)?;
        st.enqueue(Op::HostFn { f, data: data as usize });
        Ok(())
    }

    fn cuEventCreate(ph: *mut CUevent, flags: c_uint) {
        let d = d()?;
        if ph.is_null() {
            return Err(err::INVALID_VALUE);
        }
        let h = d.event_create(flags)?;
        // SAFETY: out-pointer from the caller, checked non-NULL.
        unsafe { put(ph, h as usize as CUevent) }
    }

    fn cuEventRecord(ev: CUevent, s: CUstream) { event_record(ev, s, 0) }
    fn cuEventRecordWithFlags(ev: CUevent, s: CUstream, flags: c_uint) { event_record(ev, s, flags) }

    fn cuEventQuery(ev: CUevent) { sync_result(d()?.event(ev as usize)?.query()) }

    fn cuEventSynchronize(ev: CUevent) {
        d()?.event(ev as usize)?.synchronize();
        Ok(())
    }

    fn cuEventDestroy(ev: CUevent) { d()?.event_destroy(ev as usize) }
    fn cuEventDestroy_v2(ev: CUevent) { d()?.event_destroy(ev as usize) }

    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }
}

fn event_record(ev: CUevent, s: CUstream, flags: c_uint) -> R<()> {
    let d = d()?;
    if flags != 0 {
        return Err(err::INVALID_VALUE);
    }
    let e = d.event(ev as usize)?;
    let st = d.stream(s as usize)?;
    let generation = e.begin_record();
    st.enqueue(Op::Record { ev: e, generation });
    Ok(())
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> R<()> {
    let d = d()?;
    if ms.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let (a, b) = (d.event(start as usize)?, d.event(end as usize)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(err::INVALID_HANDLE);
    }
    let (ta, tb) = (a.completed_time()?, b.completed_time()?);
    let v = if tb >= ta { (tb - ta).as_secs_f64() * 1e3 } else { -((ta - tb).as_secs_f64() * 1e3) };
    // SAFETY: out-pointer from the caller, checked non-NULL.
    unsafe { put(ms, v as f32) }
}

// ----- stream memory operations -------------------------------------------------------------

fn wait_op(t: &driver::Tables, addr: u64, value: u64, flags: u32, wide: bool) -> R<Op> {
    if flags & !(0x3 | CU_STREAM_WAIT_VALUE_FLUSH) != 0 {
        return Err(err::INVALID_VALUE);
    }
    let size = if wide { 8 } else { 4 };
    if addr % size != 0 {
        return Err(err::INVALID_VALUE);
    }
    t.check(addr, size, false)?;
    let (cond, flush) = (flags & 0x3, flags & CU_STREAM_WAIT_VALUE_FLUSH != 0);
    Ok(if wide {
        Op::Wait64 { addr, value, cond, flush }
    } else {
        Op::Wait32 { addr, value: value as u32, cond, flush }
    })
}

/// Which generation of the stream-memop entry points a call came through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOpApi {
    /// The original entry points (CUDA 8.0), which honour `NO_MEMORY_BARRIER`.
    V1,
    /// The `_v2` entry points (CUDA 11.7+, what cuda.h maps the names to): like the real driver
    /// they refuse `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` with CUDA_ERROR_INVALID_VALUE.
    V2,
}

fn write_op(t: &driver::Tables, addr: u64, value: u64, flags: u32, wide: bool, api: MemOpApi) -> R<Op> {
    let allowed = match api {
        MemOpApi::V1 => CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER,
        MemOpApi::V2 => 0,
    };
    if flags & !allowed != 0 {
        crate::log!("stream write: flags {flags:#x} not supported by this entry point");
        return Err(err::INVALID_VALUE);
    }
    let size = if wide { 8 } else { 4 };
    if addr % size != 0 {
        return Err(err::INVALID_VALUE);
    }
    t.check(addr, size, true)?;
    let barrier = flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER == 0;
    Ok(if wide { Op::Write64 { addr, value, barrier } } else { Op::Write32 { addr, value: value as u32, barrier } })
}

/// Translates one batch entry.
pub(crate) fn batch_op(t: &driver::Tables, p: &CUstreamBatchMemOpParams, api: MemOpApi) -> R<Op> {
    // SAFETY: every member of the union is plain old data; reading `operation` is always
    // valid, and the member read below is the one `operation` selects.
    unsafe {
        match p.operation {
            memop::WAIT_VALUE_32 => {
                wait_op(t, p.wait_value.address, p.wait_value.v.value as u64, p.wait_value.flags, false)
            }
            memop::WAIT_VALUE_64 => wait_op(t, p.wait_value.address, p.wait_value.v.value64, p.wait_value.flags, true),
            memop::WRITE_VALUE_32 => {
                write_op(t, p.write_value.address, p.write_value.v.value as u64, p.write_value.flags, false, api)
            }
            memop::WRITE_VALUE_64 => {
                write_op(t, p.write_value.address, p.write_value.v.value64, p.write_value.flags, true, api)
            }
            memop::FLUSH_REMOTE_WRITES if p.flush_remote_writes.flags == 0 => Ok(Op::Fence),
            memop::BARRIER if p.memory_barrier.flags <= CU_STREAM_MEMORY_BARRIER_TYPE_GPU => Ok(Op::Fence),
            op => {
                crate::log!("cuStreamBatchMemOp: unknown operation {op} or bad flags");
                Err(err::INVALID_VALUE)
            }
        }
    }
}

fn memop1(s: CUstream, build: impl FnOnce(&driver::Tables) -> R<Op>) -> R<()> {
    let d = d()?;
    let st = d.stream(s as usize)?;
    d.submit(&st, build).map(|_| ())
}

fn batch(s: CUstream, count: c_uint, params: *const CUstreamBatchMemOpParams, flags: c_uint, api: MemOpApi) -> R<()> {
    let d = d()?;
    if flags != 0 {
        // CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING et al. are not public: rejected as CUDA does.
        return Err(err::INVALID_VALUE);
    }
    let st = d.stream(s as usize)?;
    if count == 0 {
        return Ok(());
    }
    if params.is_null() {
        return Err(err::INVALID_VALUE);
    }
    d.submit(&st, |t| {
        let mut ops = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` parameter unions.
            let p = unsafe { params.add(i).read_unaligned() };
            ops.push(batch_op(t, &p, api).inspect_err(|_| crate::log!("cuStreamBatchMemOp: entry {i} rejected"))?);
        }
        Ok(Op::Batch(ops))
    })
    .map(|_| ())
}

export! {
    fn cuStreamWriteValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) { memop1(s, |t| write_op(t, addr, value as u64, flags, false, MemOpApi::V1)) }
    fn cuStreamWriteValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) { memop1(s, |t| write_op(t, addr, value as u64, flags, false, MemOpApi::V2)) }
    fn cuStreamWriteValue64(s: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) { memop1(s, |t| write_op(t, addr, value, flags, true, MemOpApi::V1)) }
    fn cuStreamWriteValue64_v2(s: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) { memop1(s, |t| write_op(t, addr, value, flags, true, MemOpApi::V2)) }
    fn cuStreamWaitValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) { memop1(s, |t| wait_op(t, addr, value as u64, flags, false)) }
    fn cuStreamWaitValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) { memop1(s, |t| wait_op(t, addr, value as u64, flags, false)) }
    fn cuStreamWaitValue64(s: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) { memop1(s, |t| wait_op(t, addr, value, flags, true)) }
    fn cuStreamWaitValue64_v2(s: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) { memop1(s, |t| wait_op(t, addr, value, flags, true)) }
    fn cuStreamBatchMemOp(s: CUstream, count: c_uint, params: *const CUstreamBatchMemOpParams, flags: c_uint) { batch(s, count, params, flags, MemOpApi::V1) }
    fn cuStreamBatchMemOp_v2(s: CUstream, count: c_uint, params: *const CUstreamBatchMemOpParams, flags: c_uint) { batch(s, count, params, flags, MemOpApi::V2) }
}
