//! Backend 2: CUDA dma-buf export + `mmap` (no kernel module needed; CUDA driver 13.3 or newer).
//!
//! libcuda is loaded only when this backend is tried, through the shared loader's
//! `cuGetProcAddress` at version 13030, and released when the last instance using it closes.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use gpudirect_common::cuda::{self, CuResult, Driver};
use gpudirect_common::{Errno, Result};

use super::pin::{PinFacts, PinRequest};
use crate::abi::{GDR_PIN_FLAG_FORCE_PCIE, MappingType};
use crate::cpu_mapping::{self, CpuMapping, HostPage};

/// The CUDA version whose entry points we resolve, and the minimum driver that can mmap dma-bufs.
pub const CUDA_VERSION_REQUIRED: c_int = 13030;
const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 0x1;
const CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: u64 = 0x1;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: c_int = 100;
const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;

type CuDevice = c_int;
type CuContext = *mut c_void;

/// The CUDA entry points this backend uses.
struct CudaApi {
    _driver: Driver,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    mem_get_handle_for_address_range: unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

// SAFETY: the table holds plain function pointers and the library handle; the CUDA driver API is
// thread-safe.
unsafe impl Send for CudaApi {}
// SAFETY: see above.
unsafe impl Sync for CudaApi {}

/// One process-wide table, shared by all instances of this backend (upstream reference-counts it).
static SHARED_API: Mutex<Weak<CudaApi>> = Mutex::new(Weak::new());

/// Maps a CUresult to the errno we return (upstream leaks the raw CUresult; see
/// docs/upstream-behaviour.md).
fn errno_of(r: CuResult) -> Errno {
    match r {
        cuda::CUDA_ERROR_INVALID_VALUE => Errno::EINVAL,
        cuda::CUDA_ERROR_OUT_OF_MEMORY => Errno::ENOMEM,
        cuda::CUDA_ERROR_NOT_SUPPORTED => Errno::ENOTSUP,
        cuda::CUDA_ERROR_NOT_FOUND => Errno::ENOENT,
        _ => Errno::EIO,
    }
}

impl CudaApi {
    fn load() -> Result<CudaApi> {
        // Upstream opens only the unversioned development name; we also accept the runtime soname
        // so machines without the -dev symlink work (docs/upstream-behaviour.md).
        let mut errors = Vec::new();
        let mut driver = None;
        for name in ["libcuda.so.1", "libcuda.so"] {
            match Driver::load(name) {
                Ok(d) => {
                    driver = Some(d);
                    break;
                }
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        let Some(driver) = driver else {
            gdr_err!("Failed to open libcuda.so: {}", errors.join("; "));
            return Err(Errno::ENOENT);
        };
        let version = driver.driver_version().map_err(|r| {
            gdr_err!("cuDriverGetVersion failed with CUresult {r}");
            errno_of(r)
        })?;
        if version < CUDA_VERSION_REQUIRED {
            gdr_err!(
                "dma-buf mmap needs a CUDA 13.3 or newer driver; this driver supports CUDA {}.{}",
                version / 1000,
                version % 1000 / 10
            );
            return Err(Errno::ENOTSUP);
        }
        let get = |name: &CStr| -> Result<NonNull<c_void>> {
            driver.resolve(name, CUDA_VERSION_REQUIRED).map_err(|r| {
                gdr_err!("cuGetProcAddress({}) failed with CUresult {r}", name.to_string_lossy());
                Errno::ENOTSUP
            })
        };
        // SAFETY: (all casts below) each symbol is resolved by its CUDA name at CUDA 13.3, whose
        // signature is the one declared in the field's type.
        let api = unsafe {
            CudaApi {
                init: cuda::as_fn(get(c"cuInit")?),
                device_get: cuda::as_fn(get(c"cuDeviceGet")?),
                device_get_count: cuda::as_fn(get(c"cuDeviceGetCount")?),
                device_get_attribute: cuda::as_fn(get(c"cuDeviceGetAttribute")?),
                mem_get_handle_for_address_range: cuda::as_fn(get(c"cuMemGetHandleForAddressRange")?),
                ctx_get_current: cuda::as_fn(get(c"cuCtxGetCurrent")?),
                ctx_set_current: cuda::as_fn(get(c"cuCtxSetCurrent")?),
                primary_ctx_retain: cuda::as_fn(get(c"cuDevicePrimaryCtxRetain")?),
                primary_ctx_release: cuda::as_fn(get(c"cuDevicePrimaryCtxRelease")?),
                pointer_get_attribute: cuda::as_fn(get(c"cuPointerGetAttribute")?),
                get_error_string: cuda::as_fn(get(c"cuGetErrorString")?),
                get_error_name: cuda::as_fn(get(c"cuGetErrorName")?),
                _driver: driver,
            }
        };
        Ok(api)
    }

    /// Logs a failed call like upstream (call, numeric result, name, description) and converts it.
    fn check(&self, what: &str, r: CuResult) -> Result<()> {
        if r == cuda::CUDA_SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: p is a valid out pointer; on success the driver stores a static C string.
            if unsafe { f(r, &mut p) } == cuda::CUDA_SUCCESS && !p.is_null() {
                // SAFETY: non-NULL result of cuGetError* is a static NUL-terminated string.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            } else {
                "unknown".to_owned()
            }
        };
        gdr_err!("{what} failed: CUresult {r} ({}: {})", text(self.get_error_name), text(self.get_error_string));
        Err(errno_of(r))
    }

    fn attribute(&self, attr: c_int, dev: CuDevice) -> Result<c_int> {
        let mut v = 0;
        // SAFETY: v is a valid out pointer.
        self.check("cuDeviceGetAttribute", unsafe { (self.device_get_attribute)(&mut v, attr, dev) })?;
        Ok(v)
    }

    fn device(&self, ordinal: c_int) -> Result<CuDevice> {
        let mut d = 0;
        // SAFETY: d is a valid out pointer.
        self.check("cuDeviceGet", unsafe { (self.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }
}

/// An instance's use of the dma-buf backend.
pub struct DmaBuf {
    api: Arc<CudaApi>,
}

impl std::fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DmaBuf")
    }
}

/// Per-pin state of this backend: the exported dma-buf and the mapping type fixed at pin time.
#[derive(Debug)]
pub struct DmaBufPin {
    pub fd: OwnedFd,
    pub page_offset: u64,
    pub mapping_type: MappingType,
}

impl DmaBuf {
    /// Loads CUDA (once per process) and checks that some device supports dma-buf mmap.
    pub fn open() -> Result<DmaBuf> {
        let mut shared = SHARED_API.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(api) = shared.upgrade() {
            return Ok(DmaBuf { api });
        }
        let api = Arc::new(CudaApi::load()?);
        // SAFETY: plain driver call with flags 0.
        api.check("cuInit", unsafe { (api.init)(0) })?;
        let mut count = 0;
        // SAFETY: count is a valid out pointer.
        api.check("cuDeviceGetCount", unsafe { (api.device_get_count)(&mut count) })?;
        let mut any = false;
        for ordinal in 0..count {
            let dev = api.device(ordinal)?;
            any |= api.attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)? != 0;
        }
        if !any {
            gdr_info!("dma-buf mmap not supported on any of the devices");
            return Err(Errno::ENOTSUP);
        }
        *shared = Arc::downgrade(&api);
        Ok(DmaBuf { api })
    }

    /// Exports `[addr, addr + size)` rounded to host pages as a dma-buf.
    pub fn pin(&self, req: &PinRequest, page: HostPage) -> Result<(DmaBufPin, PinFacts)> {
        let api = &self.api;
        let aligned = req.addr & page.mask() as u64;
        let page_offset = req.addr - aligned;
        let aligned_size = req
            .size
            .checked_add(page_offset)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| page.round_up(s))
            .ok_or(Errno::EINVAL)?;
        let force_pcie = req.flags & GDR_PIN_FLAG_FORCE_PCIE != 0;
        let mut ordinal: c_int = 0;
        // SAFETY: the attribute is an int written to `ordinal`.
        api.check("cuPointerGetAttribute", unsafe {
            (api.pointer_get_attribute)((&raw mut ordinal).cast(), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, aligned)
        })?;
        let dev = api.device(ordinal)?;
        if api.attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)? == 0 {
            gdr_err!("device {ordinal} does not support dma-buf mmap");
            return Err(Errno::ENOTSUP);
        }
        let coherent =
            api.attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, dev).unwrap_or(0) != 0;
        let mapping_type = if coherent && !force_pcie { MappingType::Caching } else { MappingType::WriteCombined };
        let flags = if force_pcie { CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE } else { 0 };

        let raw_fd = self.with_context(dev, || {
            let mut fd: c_int = -1;
            // SAFETY: the handle type DMA_BUF_FD writes an int file descriptor into `fd`.
            let r = unsafe {
                (api.mem_get_handle_for_address_range)(
                    (&raw mut fd).cast(),
                    aligned,
                    aligned_size,
                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    flags,
                )
            };
            api.check("cuMemGetHandleForAddressRange", r).map(|()| fd)
        })?;
        if raw_fd < 0 {
            return Err(Errno::EIO);
        }
        // SAFETY: the driver returned a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
        let facts = PinFacts {
            va: aligned,
            mapped_size: aligned_size as u64,
            page_size: page.size as u32,
            tm_cycles: 0,
            cycles_per_ms: 0,
            mapping_type: MappingType::None,
        };
        Ok((DmaBufPin { fd, page_offset, mapping_type }, facts))
    }

    /// Runs `f` with a current context: the caller's, or the device's primary context for the call.
    fn with_context<T>(&self, dev: CuDevice, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let api = &self.api;
        let mut cur: CuContext = std::ptr::null_mut();
        // SAFETY: cur is a valid out pointer.
        api.check("cuCtxGetCurrent", unsafe { (api.ctx_get_current)(&mut cur) })?;
        if !cur.is_null() {
            return f();
        }
        let mut primary: CuContext = std::ptr::null_mut();
        // SAFETY: primary is a valid out pointer.
        api.check("cuDevicePrimaryCtxRetain", unsafe { (api.primary_ctx_retain)(&mut primary, dev) })?;
        // SAFETY: primary was just retained.
        let set = api.check("cuCtxSetCurrent", unsafe { (api.ctx_set_current)(primary) });
        let out = set.and_then(|()| f());
        // SAFETY: restore "no context" and drop our reference, whatever happened above.
        unsafe {
            (api.ctx_set_current)(std::ptr::null_mut());
            (api.primary_ctx_release)(dev);
        }
        out
    }

    /// Maps the exported buffer; a request for a type other than the pin-time one is refused.
    pub fn map(&self, pin: &DmaBufPin, len: usize, requested: MappingType, at: Option<usize>) -> Result<CpuMapping> {
        let m = cpu_mapping::map_shared(pin.fd.as_fd(), len, pin.page_offset, at)
            .inspect_err(|e| gdr_err!("mmap of the dma-buf failed (errno={})", e.0))?;
        if requested != MappingType::None && requested != pin.mapping_type {
            gdr_err!("requested mapping type {:?} differs from the dma-buf's type {:?}", requested, pin.mapping_type);
            cpu_mapping::undo_map(m, at);
            return Err(Errno::EINVAL);
        }
        Ok(m)
    }
}
