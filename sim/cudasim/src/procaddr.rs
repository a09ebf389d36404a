//! Symbol table of `cuGetProcAddress`: base name → the implementation whose ABI the requested
//! CUDA version expects (e.g. "cuMemAlloc" → `cuMemAlloc_v2` from 3.2 on, "cuCtxDestroy" →
//! `cuCtxDestroy_v2` from 4.0 on). Only functions cudasim really implements are listed; the
//! exported NOT_SUPPORTED stubs are deliberately absent, so probing consumers see "not found".
//!
//! `cuGetProcAddress` itself lives here, above the table of the functions it hands out, so that
//! `capi` never imports this module.

use crate::capi::*;
use crate::driver::R;
use crate::types::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

macro_rules! table {
    ($($name:literal => [$($ver:literal : $f:ident),+ $(,)?]),* $(,)?) => {
        /// (base name, [(first CUDA version with this ABI, implementation)], ascending)
        fn entries() -> Vec<(&'static str, Vec<(i32, *mut c_void)>)> {
            vec![$(($name, vec![$(($ver, $f as *mut c_void)),+])),*]
        }
        /// Every implementation name reachable through the table (for tests).
        #[cfg(test)]
        pub(crate) const NAMES: &[&str] = &[$($name),*];
    };
}

table! {
    "cuInit" => [2000: cuInit],
    "cuDriverGetVersion" => [2020: cuDriverGetVersion],
    "cuGetErrorName" => [6000: cuGetErrorName],
    "cuGetErrorString" => [6000: cuGetErrorString],
    "cuGetProcAddress" => [11030: cuGetProcAddress, 12000: cuGetProcAddress_v2],
    "cuDeviceGet" => [2000: cuDeviceGet],
    "cuDeviceGetCount" => [2000: cuDeviceGetCount],
    "cuDeviceGetName" => [2000: cuDeviceGetName],
    "cuDeviceGetAttribute" => [2000: cuDeviceGetAttribute],
    "cuDeviceGetProperties" => [2000: cuDeviceGetProperties],
    "cuDeviceComputeCapability" => [2000: cuDeviceComputeCapability],
    "cuDeviceTotalMem" => [3020: cuDeviceTotalMem_v2],
    "cuDeviceGetUuid" => [9020: cuDeviceGetUuid, 11040: cuDeviceGetUuid_v2],
    "cuDeviceGetPCIBusId" => [4010: cuDeviceGetPCIBusId],
    "cuDeviceGetByPCIBusId" => [4010: cuDeviceGetByPCIBusId],
    "cuDevicePrimaryCtxRetain" => [7000: cuDevicePrimaryCtxRetain],
    "cuDevicePrimaryCtxRelease" => [7000: cuDevicePrimaryCtxRelease, 11000: cuDevicePrimaryCtxRelease_v2],
    "cuDevicePrimaryCtxReset" => [7000: cuDevicePrimaryCtxReset, 11000: cuDevicePrimaryCtxReset_v2],
    "cuDevicePrimaryCtxSetFlags" => [7000: cuDevicePrimaryCtxSetFlags, 11000: cuDevicePrimaryCtxSetFlags_v2],
    "cuDevicePrimaryCtxGetState" => [7000: cuDevicePrimaryCtxGetState],
    "cuCtxCreate" => [3020: cuCtxCreate_v2, 11040: cuCtxCreate_v3, 12050: cuCtxCreate_v4],
    "cuCtxDestroy" => [2000: cuCtxDestroy, 4000: cuCtxDestroy_v2],
    "cuCtxPushCurrent" => [2000: cuCtxPushCurrent, 4000: cuCtxPushCurrent_v2],
    "cuCtxPopCurrent" => [2000: cuCtxPopCurrent, 4000: cuCtxPopCurrent_v2],
    "cuCtxGetCurrent" => [4000: cuCtxGetCurrent],
    "cuCtxGetId" => [12000: cuCtxGetId],
    "cuCtxSetCurrent" => [4000: cuCtxSetCurrent],
    "cuCtxGetDevice" => [2000: cuCtxGetDevice],
    "cuCtxGetFlags" => [7000: cuCtxGetFlags],
    "cuCtxGetApiVersion" => [3020: cuCtxGetApiVersion],
    "cuCtxSynchronize" => [2000: cuCtxSynchronize],
    "cuCtxGetStreamPriorityRange" => [5050: cuCtxGetStreamPriorityRange],
    "cuFlushGPUDirectRDMAWrites" => [11030: cuFlushGPUDirectRDMAWrites],
    "cuMemAlloc" => [3020: cuMemAlloc_v2],
    "cuMemFree" => [3020: cuMemFree_v2],
    "cuMemAllocHost" => [3020: cuMemAllocHost_v2],
    "cuMemHostAlloc" => [2020: cuMemHostAlloc],
    "cuMemFreeHost" => [2000: cuMemFreeHost],
    "cuMemHostRegister" => [4000: cuMemHostRegister, 6050: cuMemHostRegister_v2],
    "cuMemHostUnregister" => [4000: cuMemHostUnregister],
    "cuMemHostGetDevicePointer" => [3020: cuMemHostGetDevicePointer_v2],
    "cuMemHostGetFlags" => [2030: cuMemHostGetFlags],
    "cuMemGetInfo" => [3020: cuMemGetInfo_v2],
    "cuMemGetAddressRange" => [3020: cuMemGetAddressRange_v2],
    "cuMemGetHandleForAddressRange" => [11070: cuMemGetHandleForAddressRange],
    "cuMemcpy" => [4000: cuMemcpy],
    "cuMemcpyAsync" => [4000: cuMemcpyAsync],
    "cuMemcpyHtoD" => [3020: cuMemcpyHtoD_v2],
    "cuMemcpyDtoH" => [3020: cuMemcpyDtoH_v2],
    "cuMemcpyDtoD" => [3020: cuMemcpyDtoD_v2],
    "cuMemcpyHtoDAsync" => [3020: cuMemcpyHtoDAsync_v2],
    "cuMemcpyDtoHAsync" => [3020: cuMemcpyDtoHAsync_v2],
    "cuMemcpyDtoDAsync" => [3020: cuMemcpyDtoDAsync_v2],
    "cuMemsetD8" => [3020: cuMemsetD8_v2],
    "cuMemsetD16" => [3020: cuMemsetD16_v2],
    "cuMemsetD32" => [3020: cuMemsetD32_v2],
    "cuMemsetD8Async" => [3020: cuMemsetD8Async],
    "cuMemsetD16Async" => [3020: cuMemsetD16Async],
    "cuMemsetD32Async" => [3020: cuMemsetD32Async],
    "cuPointerGetAttribute" => [4000: cuPointerGetAttribute],
    "cuPointerSetAttribute" => [6000: cuPointerSetAttribute],
    "cuPointerGetAttributes" => [7000: cuPointerGetAttributes],
    "cuMemCreate" => [10020: cuMemCreate],
    "cuMemRelease" => [10020: cuMemRelease],
    "cuMemAddressReserve" => [10020: cuMemAddressReserve],
    "cuMemAddressFree" => [10020: cuMemAddressFree],
    "cuMemMap" => [10020: cuMemMap],
    "cuMemUnmap" => [10020: cuMemUnmap],
    "cuMemSetAccess" => [10020: cuMemSetAccess],
    "cuMemGetAllocationGranularity" => [10020: cuMemGetAllocationGranularity],
    "cuMemGetAllocationPropertiesFromHandle" => [10020: cuMemGetAllocationPropertiesFromHandle],
    "cuMemRetainAllocationHandle" => [11000: cuMemRetainAllocationHandle],
    "cuStreamCreate" => [2000: cuStreamCreate],
    "cuStreamCreateWithPriority" => [5050: cuStreamCreateWithPriority],
    "cuStreamDestroy" => [2000: cuStreamDestroy, 4000: cuStreamDestroy_v2],
    "cuStreamQuery" => [2000: cuStreamQuery],
    "cuStreamSynchronize" => [2000: cuStreamSynchronize],
    "cuStreamGetCtx" => [9020: cuStreamGetCtx],
    "cuStreamGetFlags" => [5050: cuStreamGetFlags],
    "cuStreamGetPriority" => [5050: cuStreamGetPriority],
    "cuStreamWaitEvent" => [3020: cuStreamWaitEvent],
    "cuStreamAddCallback" => [5000: cuStreamAddCallback],
    "cuLaunchHostFunc" => [10000: cuLaunchHostFunc],
    "cuEventCreate" => [2000: cuEventCreate],
    "cuEventRecord" => [2000: cuEventRecord],
    "cuEventRecordWithFlags" => [11010: cuEventRecordWithFlags],
    "cuEventQuery" => [2000: cuEventQuery],
    "cuEventSynchronize" => [2000: cuEventSynchronize],
    "cuEventDestroy" => [2000: cuEventDestroy, 4000: cuEventDestroy_v2],
    "cuEventElapsedTime" => [2000: cuEventElapsedTime, 12080: cuEventElapsedTime_v2],
    "cuStreamWriteValue32" => [8000: cuStreamWriteValue32, 11070: cuStreamWriteValue32_v2],
    "cuStreamWriteValue64" => [9000: cuStreamWriteValue64, 11070: cuStreamWriteValue64_v2],
    "cuStreamWaitValue32" => [8000: cuStreamWaitValue32, 11070: cuStreamWaitValue32_v2],
    "cuStreamWaitValue64" => [9000: cuStreamWaitValue64, 11070: cuStreamWaitValue64_v2],
    "cuStreamBatchMemOp" => [8000: cuStreamBatchMemOp, 11070: cuStreamBatchMemOp_v2],
}

struct Table(Vec<(&'static str, Vec<(i32, *mut c_void)>)>);
// SAFETY: the table holds addresses of functions (immutable code), never dereferenced here.
unsafe impl Send for Table {}
// SAFETY: as above; the table is read-only after construction.
unsafe impl Sync for Table {}

/// Resolves `name` for `version`; `Err` carries the `CUdriverProcAddressQueryResult`.
pub fn lookup(name: &str, version: i32) -> Result<*mut c_void, u32> {
    static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    let t = T.get_or_init(|| Table(entries()));
    let (_, vs) = t.0.iter().find(|(n, _)| *n == name).ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    vs.iter().rev().find(|(v, _)| *v <= version).map(|(_, f)| *f).ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

// ----- cuGetProcAddress ---------------------------------------------------------------------

export! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_uint) {
        proc_address(symbol, pfn, version, flags, status)
    }
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> R<()> {
    if symbol.is_null()
        || pfn.is_null()
        || flags & !(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0
    {
        return Err(err::INVALID_VALUE);
    }
    // SAFETY: NUL-terminated symbol name from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (res, f, st) = match lookup(name, version) {
        Ok(f) => (Ok(()), f, CU_GET_PROC_ADDRESS_SUCCESS),
        Err(st) => {
            crate::log!("cuGetProcAddress({name:?}, version {version}): not found");
            (Err(err::NOT_FOUND), std::ptr::null_mut(), st)
        }
    };
    // SAFETY: out-pointers from the caller (pfn checked non-NULL; status optional).
    unsafe {
        put(pfn, f)?;
        put_opt(status, st);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_names_resolve_by_version() {
        assert_eq!(lookup("cuMemAlloc", 13000), Ok(cuMemAlloc_v2 as *mut c_void));
        assert_eq!(lookup("cuMemAlloc", 3000), Err(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        assert_eq!(lookup("cuCtxDestroy", 3020), Ok(cuCtxDestroy as *mut c_void));
        assert_eq!(lookup("cuCtxDestroy", 4000), Ok(cuCtxDestroy_v2 as *mut c_void));
        assert_eq!(lookup("cuDevicePrimaryCtxRelease", 13030), Ok(cuDevicePrimaryCtxRelease_v2 as *mut c_void));
        assert_eq!(lookup("cuStreamBatchMemOp", 11060), Ok(cuStreamBatchMemOp as *mut c_void));
        assert_eq!(lookup("cuStreamBatchMemOp", 12000), Ok(cuStreamBatchMemOp_v2 as *mut c_void));
        assert_eq!(lookup("cuLaunchKernel", 13000), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        assert_eq!(lookup("cuMemAlloc_v2", 13000), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        // Every base name resolves at the newest version.
        for n in NAMES {
            assert!(lookup(n, 13000).is_ok(), "{n}");
        }
    }
}
