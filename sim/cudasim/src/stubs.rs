//! Driver API entry points that cudasim does not simulate. They exist so that programs linked
//! against libcuda load and fail cleanly: each returns CUDA_ERROR_NOT_SUPPORTED (801) and, with
//! CUDASIM_LOG=1, names itself. `cuGetProcAddress` does not resolve them (reported as not found).
//!
//! They are declared without parameters: in the C calling convention the caller owns argument
//! registers and stack, so ignoring the arguments is sound.

use crate::types::{CUresult, err};

macro_rules! unsupported {
    ($($name:ident),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            pub(super) extern "C" fn imp() -> CUresult {
                crate::log!("{} is not simulated: CUDA_ERROR_NOT_SUPPORTED", stringify!($name));
                err::NOT_SUPPORTED
            }
        }
        // Patchable like every export: UCX hooks some of these (cuMemAllocManaged, ...).
        crate::entry::patchable_entry! {
            #[doc = concat!("`", stringify!($name), "`: not simulated, returns CUDA_ERROR_NOT_SUPPORTED.")]
            safe fn $name() -> CUresult => $name::imp
        }
    )*};
}

unsupported! {
    cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuLaunchCooperativeKernelMultiDevice,
    cuModuleLoad, cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary, cuModuleUnload,
    cuModuleGetFunction, cuModuleGetGlobal_v2, cuLibraryLoadData, cuLibraryLoadFromFile,
    cuLibraryUnload, cuLibraryGetKernel, cuLinkCreate_v2, cuLinkAddData_v2, cuLinkComplete, cuLinkDestroy,
    cuFuncGetAttribute, cuFuncSetAttribute, cuFuncSetCacheConfig,
    cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxPotentialBlockSize,
    cuMemAllocManaged, cuMemAllocPitch_v2, cuMemPrefetchAsync, cuMemPrefetchAsync_v2, cuMemAdvise,
    cuMemAdvise_v2, cuMemRangeGetAttribute, cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync,
    cuMemPoolCreate, cuMemPoolDestroy, cuDeviceGetDefaultMemPool, cuDeviceGetMemPool,
    cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle,
    cuIpcGetEventHandle, cuIpcOpenEventHandle, cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle, cuMemGetAccess, cuMemMapArrayAsync,
    cuDeviceCanAccessPeer, cuDeviceGetP2PAttribute, cuCtxEnablePeerAccess, cuCtxDisablePeerAccess,
    cuMemcpyPeer, cuMemcpyPeerAsync, cuMemcpy2D_v2, cuMemcpy2DAsync_v2, cuMemcpy2DUnaligned_v2,
    cuMemcpy3D_v2, cuMemcpy3DAsync_v2, cuMemcpyBatchAsync, cuArrayCreate_v2, cuArrayDestroy,
    cuGraphCreate, cuGraphDestroy, cuGraphInstantiate, cuGraphInstantiateWithFlags, cuGraphLaunch,
    cuGraphExecDestroy, cuStreamBeginCapture, cuStreamBeginCapture_v2, cuStreamEndCapture,
    cuStreamIsCapturing, cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v2, cuStreamGetAttribute,
    cuStreamSetAttribute, cuStreamAttachMemAsync, cuCtxSetLimit, cuCtxGetLimit, cuCtxSetCacheConfig,
    cuCtxGetCacheConfig, cuCtxResetPersistingL2Cache, cuStreamGetId,
    cuImportExternalMemory, cuDestroyExternalMemory, cuExternalMemoryGetMappedBuffer,
    cuImportExternalSemaphore, cuDestroyExternalSemaphore, cuSignalExternalSemaphoresAsync,
    cuWaitExternalSemaphoresAsync, cuProfilerStart, cuProfilerStop, cuTexObjectCreate,
    cuTexObjectDestroy, cuSurfObjectCreate, cuSurfObjectDestroy, cuMulticastCreate,
    cuDeviceGetLuid, cuDeviceGetExecAffinitySupport, cuGreenCtxCreate, cuStreamGetCtx_v2,
}
