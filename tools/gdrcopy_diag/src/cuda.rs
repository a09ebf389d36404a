//! What the CUDA driver says: version, GPUs, the attributes GPUDirect depends on, and device
//! memory for the end-to-end check. libcuda is loaded at run time through the project's one
//! loader (gpudirect_common::cuda), never linked.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use gpudirect_common::cuda::{CUDA_SUCCESS, CuResult, Driver, as_fn};

/// CUDA device attributes read here (values from cuda.h).
pub mod attr {
    pub const CAN_USE_STREAM_MEM_OPS_V1: i32 = 92;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS_V1: i32 = 93;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR_V1: i32 = 94;
    pub const CAN_FLUSH_REMOTE_WRITES: i32 = 98;
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: i32 = 122;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR: i32 = 123;
    pub const DMA_BUF_SUPPORTED: i32 = 124;
}

/// The first CUDA driver whose dma-buf exports can be mmap'ed by the CPU (gdrcopy 2.6's backend).
pub const DMABUF_MMAP_MIN_VERSION: i32 = 13030;

type Init = unsafe extern "C" fn(c_uint) -> CuResult;
type DeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type DeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult;
type DeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> CuResult;
type DeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;
type DeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult;
type PrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
type PrimaryCtxRelease = unsafe extern "C" fn(c_int) -> CuResult;
type CtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> CuResult;
type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type MemFree = unsafe extern "C" fn(u64) -> CuResult;

/// One GPU as the driver describes it.
#[derive(Debug, Clone, Default)]
pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    pub total_mem: u64,
    /// "dddd:bb:dd.f" in lower case, as sysfs names PCI devices.
    pub pci_bus_id: Option<String>,
    /// Attribute value, or None when the driver refused the query (older drivers).
    pub attrs: Vec<(i32, Option<i32>)>,
}

impl Gpu {
    pub fn attr(&self, a: i32) -> Option<i32> {
        self.attrs.iter().find(|(k, _)| *k == a).and_then(|(_, v)| *v)
    }
}

/// What the driver library told us.
pub struct Cuda {
    drv: Driver,
    pub version: Option<i32>,
    /// cuInit's result (0 = success).
    pub init: CuResult,
    pub gpus: Vec<Gpu>,
    /// The stream memory-operation entry points of CUDA ≥ 11.7 (`_v2`), which need no module
    /// parameter, resolved for CUDA 12 callers.
    pub memops_v2_entry_points: bool,
}

fn cstr_buf(buf: &[c_char]) -> String {
    // SAFETY: the buffer is NUL-terminated (zero-filled before the call, last byte never written).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

impl Cuda {
    /// Loads `libcuda.so.1` and reads everything the checks need. Err is dlerror's text.
    pub fn probe() -> Result<Cuda, String> {
        let drv = Driver::load("libcuda.so.1").map_err(|e| e.to_string())?;
        let version = drv.driver_version().ok();
        let mut c = Cuda { drv, version, init: CUDA_SUCCESS, gpus: Vec::new(), memops_v2_entry_points: false };
        c.memops_v2_entry_points = ["cuStreamWriteValue32", "cuStreamWaitValue32", "cuStreamBatchMemOp"]
            .iter()
            .all(|n| c.sym(n, 12000).is_some());
        let Some(init) = c.f::<Init>("cuInit", 2000) else {
            c.init = gpudirect_common::cuda::CUDA_ERROR_NOT_FOUND;
            return Ok(c);
        };
        // SAFETY: cuInit(unsigned) with flags 0.
        c.init = unsafe { init(0) };
        if c.init == CUDA_SUCCESS {
            c.gpus = c.read_gpus();
        }
        Ok(c)
    }

    fn sym(&self, name: &str, version: c_int) -> Option<std::ptr::NonNull<c_void>> {
        let n = std::ffi::CString::new(name).ok()?;
        self.drv.resolve(&n, version).ok()
    }

    /// Resolves `name` as a function of type `F`.
    fn f<F: Copy>(&self, name: &str, version: c_int) -> Option<F> {
        // SAFETY: every caller names F as the documented signature of `name` at `version`.
        self.sym(name, version).map(|p| unsafe { as_fn::<F>(p) })
    }

    fn read_gpus(&self) -> Vec<Gpu> {
        let (Some(count_f), Some(get), Some(attr_f)) = (
            self.f::<DeviceGetCount>("cuDeviceGetCount", 2000),
            self.f::<DeviceGet>("cuDeviceGet", 2000),
            self.f::<DeviceGetAttribute>("cuDeviceGetAttribute", 2000),
        ) else {
            return Vec::new();
        };
        let name_f = self.f::<DeviceGetName>("cuDeviceGetName", 2000);
        let mem_f = self.f::<DeviceTotalMem>("cuDeviceTotalMem", 3020);
        let bus_f = self.f::<DeviceGetPciBusId>("cuDeviceGetPCIBusId", 4010);
        let mut n: c_int = 0;
        // SAFETY: valid out pointer.
        if unsafe { count_f(&mut n) } != CUDA_SUCCESS {
            return Vec::new();
        }
        (0..n)
            .filter_map(|ordinal| {
                let mut dev: c_int = 0;
                // SAFETY: valid out pointer, ordinal below the count.
                if unsafe { get(&mut dev, ordinal) } != CUDA_SUCCESS {
                    return None;
                }
                let mut g = Gpu { ordinal, ..Gpu::default() };
                if let Some(f) = name_f {
                    let mut buf = [0 as c_char; 256];
                    // SAFETY: the buffer holds 256 bytes; we pass 255 so the last stays NUL.
                    if unsafe { f(buf.as_mut_ptr(), 255, dev) } == CUDA_SUCCESS {
                        g.name = cstr_buf(&buf);
                    }
                }
                if let Some(f) = mem_f {
                    let mut bytes = 0usize;
                    // SAFETY: valid out pointer.
                    if unsafe { f(&mut bytes, dev) } == CUDA_SUCCESS {
                        g.total_mem = bytes as u64;
                    }
                }
                if let Some(f) = bus_f {
                    let mut buf = [0 as c_char; 64];
                    // SAFETY: 64-byte buffer, 63 passed so it stays NUL-terminated.
                    if unsafe { f(buf.as_mut_ptr(), 63, dev) } == CUDA_SUCCESS {
                        g.pci_bus_id = Some(cstr_buf(&buf).to_ascii_lowercase());
                    }
                }
                use attr::*;
                for a in [
                    CAN_USE_STREAM_MEM_OPS_V1,
                    CAN_USE_64_BIT_STREAM_MEM_OPS_V1,
                    CAN_USE_STREAM_WAIT_VALUE_NOR_V1,
                    CAN_FLUSH_REMOTE_WRITES,
                    GPU_DIRECT_RDMA_SUPPORTED,
                    CAN_USE_64_BIT_STREAM_MEM_OPS,
                    CAN_USE_STREAM_WAIT_VALUE_NOR,
                    DMA_BUF_SUPPORTED,
                ] {
                    let mut v: c_int = 0;
                    // SAFETY: valid out pointer; unknown attributes return an error, not UB.
                    let ok = unsafe { attr_f(&mut v, a, dev) } == CUDA_SUCCESS;
                    g.attrs.push((a, ok.then_some(v)));
                }
                Some(g)
            })
            .collect()
    }

    /// Device memory on GPU 0 in its primary context, for the end-to-end check.
    pub fn alloc(&self, size: usize) -> Result<DeviceBuffer<'_>, String> {
        let retain = self.f::<PrimaryCtxRetain>("cuDevicePrimaryCtxRetain", 7000);
        let release = self.f::<PrimaryCtxRelease>("cuDevicePrimaryCtxRelease", 11000);
        let set = self.f::<CtxSetCurrent>("cuCtxSetCurrent", 4000);
        let alloc = self.f::<MemAlloc>("cuMemAlloc", 3020);
        let free = self.f::<MemFree>("cuMemFree", 3020);
        let (Some(retain), Some(release), Some(set), Some(alloc), Some(free)) = (retain, release, set, alloc, free)
        else {
            return Err("the driver lacks a context or allocation entry point".into());
        };
        let dev = self.gpus.first().ok_or("no GPU")?.ordinal;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; dev is an ordinal the driver listed.
        let r = unsafe { retain(&mut ctx, dev) };
        if r != CUDA_SUCCESS {
            return Err(format!("cuDevicePrimaryCtxRetain failed (CUresult {r})"));
        }
        // SAFETY: ctx was just retained.
        let r = unsafe { set(ctx) };
        let mut dptr: u64 = 0;
        // SAFETY: valid out pointer; a current context is set (checked below).
        let r = if r == CUDA_SUCCESS { unsafe { alloc(&mut dptr, size) } } else { r };
        if r != CUDA_SUCCESS {
            // SAFETY: balances the retain above.
            unsafe { release(dev) };
            return Err(format!("cuMemAlloc of {size} bytes failed (CUresult {r})"));
        }
        Ok(DeviceBuffer { ptr: dptr, dev, free, release, _cuda: self })
    }
}

/// Device memory that is freed (and its context released) on drop.
pub struct DeviceBuffer<'a> {
    pub ptr: u64,
    dev: c_int,
    free: MemFree,
    release: PrimaryCtxRelease,
    _cuda: &'a Cuda,
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc in the retained primary context of dev, which is
        // still current on this thread; both are given back exactly once.
        unsafe {
            (self.free)(self.ptr);
            (self.release)(self.dev);
        }
    }
}
