//! The CUDA driver API, only what the benchmark needs: the device's primary context, device
//! memory for the BAR and write-combined host memory.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use gpudirect_common::cuda::CuResult;

use crate::dl;

pub(crate) const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x4;

pub(crate) struct Cuda {
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    pub(crate) host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    pub(crate) free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(crate) desc: String,
}

fn cuda_check(what: &str, r: CuResult) -> Result<(), String> {
    if r == 0 { Ok(()) } else { Err(format!("{what} returned CUresult {r}")) }
}

pub(crate) fn cuda_init() -> Result<Cuda, String> {
    let lib = dl::open("libcuda.so.1").map_err(|e| format!("libcuda.so.1 not loadable: {e}"))?;
    // SAFETY: every `sym` type below is the CUDA driver API prototype of that symbol, and every
    // driver call gets valid out-pointers to locals.
    unsafe {
        let init: unsafe extern "C" fn(c_uint) -> CuResult = dl::sym(lib, c"cuInit")?;
        let version: unsafe extern "C" fn(*mut c_int) -> CuResult = dl::sym(lib, c"cuDriverGetVersion")?;
        let dev_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult = dl::sym(lib, c"cuDeviceGet")?;
        let dev_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult = dl::sym(lib, c"cuDeviceGetName")?;
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
            dl::sym(lib, c"cuDevicePrimaryCtxRetain")?;
        let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = dl::sym(lib, c"cuCtxSetCurrent")?;
        let cuda = Cuda {
            mem_alloc: dl::sym(lib, c"cuMemAlloc_v2")?,
            host_alloc: dl::sym(lib, c"cuMemHostAlloc")?,
            free_host: dl::sym(lib, c"cuMemFreeHost")?,
            desc: String::new(),
        };
        cuda_check("cuInit", init(0))?;
        let mut v = 0;
        cuda_check("cuDriverGetVersion", version(&mut v))?;
        let mut dev = 0;
        cuda_check("cuDeviceGet(0)", dev_get(&mut dev, 0))?;
        let mut name = [0 as c_char; 128];
        cuda_check("cuDeviceGetName", dev_name(name.as_mut_ptr(), name.len() as c_int, dev))?;
        let mut ctx = std::ptr::null_mut();
        cuda_check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        cuda_check("cuCtxSetCurrent", set_current(ctx))?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        Ok(Cuda { desc: format!("{name}, CUDA driver {}.{}", v / 1000, v % 1000 / 10), ..cuda })
    }
}

const GPU_PAGE: u64 = 64 << 10;

/// Device memory of at least `len` bytes, 64 KiB aligned; never freed (lives with the process).
pub(crate) fn device_memory(cuda: &Cuda, len: usize) -> Result<u64, String> {
    let mut d: u64 = 0;
    // SAFETY: valid out-pointer.
    cuda_check("cuMemAlloc", unsafe { (cuda.mem_alloc)(&mut d, len + GPU_PAGE as usize) })?;
    Ok((d + GPU_PAGE - 1) & !(GPU_PAGE - 1))
}
