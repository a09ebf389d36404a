//! C types, constants and struct layouts of the CUDA driver API that cudasim implements.
//!
//! Values and layouts are those of the public `cuda.h` (CUDA 12/13); the layout tests at the
//! bottom pin the sizes and offsets that consumers (libgdsync, gdrcopy) hand us.

use std::ffi::c_void;

pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
/// `void (*)(CUstream, CUresult, void *)`
pub type CUstreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;
/// `void (*)(void *)`
pub type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `CUresult` values.
pub mod err {
    use super::CUresult;
    pub const SUCCESS: CUresult = 0;
    pub const INVALID_VALUE: CUresult = 1;
    pub const OUT_OF_MEMORY: CUresult = 2;
    pub const NOT_INITIALIZED: CUresult = 3;
    pub const DEINITIALIZED: CUresult = 4;
    pub const NO_DEVICE: CUresult = 100;
    pub const INVALID_DEVICE: CUresult = 101;
    pub const INVALID_CONTEXT: CUresult = 201;
    pub const CONTEXT_ALREADY_CURRENT: CUresult = 202;
    pub const ALREADY_MAPPED: CUresult = 208;
    pub const NOT_MAPPED: CUresult = 211;
    pub const OPERATING_SYSTEM: CUresult = 304;
    pub const INVALID_HANDLE: CUresult = 400;
    pub const NOT_FOUND: CUresult = 500;
    pub const NOT_READY: CUresult = 600;
    pub const ILLEGAL_ADDRESS: CUresult = 700;
    pub const LAUNCH_TIMEOUT: CUresult = 702;
    pub const PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
    pub const CONTEXT_IS_DESTROYED: CUresult = 709;
    pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
    pub const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
    pub const NOT_PERMITTED: CUresult = 800;
    pub const NOT_SUPPORTED: CUresult = 801;
    pub const UNKNOWN: CUresult = 999;
}

/// (value, enum name, our own one-line description) of every `CUresult` that
/// `cuGetErrorName`/`cuGetErrorString` know.
pub const ERROR_TABLE: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    (4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
    (5, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"),
    (34, "CUDA_ERROR_STUB_LIBRARY", "stub library loaded instead of the driver"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device unavailable"),
    (100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device not licensed"),
    (200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"),
    (205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"),
    (206, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"),
    (208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for the device"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"),
    (211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "resource not mapped as array"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "resource not mapped as pointer"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "limit not supported"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access not supported"),
    (218, "CUDA_ERROR_INVALID_PTX", "invalid PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid graphics context"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler not found"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "unsupported PTX version"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation disabled"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "execution affinity not supported"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "device-side sync not supported"),
    (300, "CUDA_ERROR_INVALID_SOURCE", "invalid kernel source"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM", "an operating system call failed"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (401, "CUDA_ERROR_ILLEGAL_STATE", "operation not valid in the current state"),
    (402, "CUDA_ERROR_LOSSY_QUERY", "lossy query"),
    (500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "incompatible texturing mode"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context already active"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"),
    (710, "CUDA_ERROR_ASSERT", "device-side assert triggered"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS", "too many peers"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "invalid address space"),
    (718, "CUDA_ERROR_INVALID_PC", "invalid program counter"),
    (719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "cooperative launch too large"),
    (800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver and kernel module versions differ"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility not supported"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted while capturing"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream capture invalidated"),
    (909, "CUDA_ERROR_TIMEOUT", "wait timed out"),
    (999, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

/// Looks a result code up in [`ERROR_TABLE`].
pub fn error_entry(code: CUresult) -> Option<&'static (CUresult, &'static str, &'static str)> {
    ERROR_TABLE.iter().find(|e| e.0 == code)
}

/// `CUdevice_attribute` values cudasim answers (the rest of the enum gets 0 or an error).
pub mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_PITCH: i32 = 11;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const GPU_OVERLAP: i32 = 15;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const INTEGRATED: i32 = 18;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const COMPUTE_MODE: i32 = 20;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: i32 = 78;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
    pub const MANAGED_MEMORY: i32 = 83;
    pub const PAGEABLE_MEMORY_ACCESS: i32 = 88;
    pub const CONCURRENT_MANAGED_ACCESS: i32 = 89;
    pub const CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: i32 = 91;
    pub const CAN_USE_STREAM_MEM_OPS_V1: i32 = 92;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS_V1: i32 = 93;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR_V1: i32 = 94;
    pub const CAN_FLUSH_REMOTE_WRITES: i32 = 98;
    pub const HOST_REGISTER_SUPPORTED: i32 = 99;
    pub const PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: i32 = 100;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: i32 = 103;
    pub const GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: i32 = 110;
    pub const READ_ONLY_HOST_REGISTER_SUPPORTED: i32 = 113;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: i32 = 117;
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: i32 = 118;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: i32 = 122;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR: i32 = 123;
    pub const DMA_BUF_SUPPORTED: i32 = 124;
    /// One past the highest value cudasim accepts (CUDA 13 headers go a bit beyond 140).
    pub const MAX: i32 = 150;
}

/// `CUpointer_attribute` values.
pub mod ptr_attr {
    pub const CONTEXT: u32 = 1;
    pub const MEMORY_TYPE: u32 = 2;
    pub const DEVICE_POINTER: u32 = 3;
    pub const HOST_POINTER: u32 = 4;
    pub const P2P_TOKENS: u32 = 5;
    pub const SYNC_MEMOPS: u32 = 6;
    pub const BUFFER_ID: u32 = 7;
    pub const IS_MANAGED: u32 = 8;
    pub const DEVICE_ORDINAL: u32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub const RANGE_START_ADDR: u32 = 11;
    pub const RANGE_SIZE: u32 = 12;
    pub const MAPPED: u32 = 13;
    pub const ALLOWED_HANDLE_TYPES: u32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
    pub const ACCESS_FLAGS: u32 = 16;
    pub const MEMPOOL_HANDLE: u32 = 17;
    pub const MAPPING_SIZE: u32 = 18;
    pub const MAPPING_BASE_ADDR: u32 = 19;
    pub const MEMORY_BLOCK_ID: u32 = 20;
}

/// `CUmemorytype`
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// `cuMemHostAlloc` flags.
pub const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x1;
pub const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x2;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: u32 = 0x4;
/// `cuMemHostRegister` flags.
pub const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x1;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: u32 = 0x2;
pub const CU_MEMHOSTREGISTER_IOMEMORY: u32 = 0x4;
pub const CU_MEMHOSTREGISTER_READ_ONLY: u32 = 0x8;

/// Special stream handles.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

/// `CUevent_flags`
pub const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
pub const CU_EVENT_INTERPROCESS: u32 = 0x4;

/// `CUstreamBatchMemOpType`
pub mod memop {
    pub const WAIT_VALUE_32: u32 = 1;
    pub const WRITE_VALUE_32: u32 = 2;
    pub const FLUSH_REMOTE_WRITES: u32 = 3;
    pub const WAIT_VALUE_64: u32 = 4;
    pub const WRITE_VALUE_64: u32 = 5;
    pub const BARRIER: u32 = 6;
}
/// `CUstreamWaitValue_flags`
pub const CU_STREAM_WAIT_VALUE_GEQ: u32 = 0x0;
pub const CU_STREAM_WAIT_VALUE_EQ: u32 = 0x1;
pub const CU_STREAM_WAIT_VALUE_AND: u32 = 0x2;
pub const CU_STREAM_WAIT_VALUE_NOR: u32 = 0x3;
pub const CU_STREAM_WAIT_VALUE_FLUSH: u32 = 1 << 30;
/// `CUstreamWriteValue_flags`
pub const CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: u32 = 0x1;
/// `CUstreamMemoryBarrier_flags`
pub const CU_STREAM_MEMORY_BARRIER_TYPE_SYS: u32 = 0x0;
pub const CU_STREAM_MEMORY_BARRIER_TYPE_GPU: u32 = 0x1;

/// `union { cuuint32_t value; cuuint64_t value64; }` inside the wait/write parameter structs.
#[repr(C)]
#[derive(Clone, Copy)]
pub union MemOpValue {
    pub value: u32,
    pub value64: u64,
}

/// `CUstreamMemOpWaitValueParams_st` / `CUstreamMemOpWriteValueParams_st` (same layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemOpValueParams {
    pub operation: u32,
    pub address: CUdeviceptr,
    pub v: MemOpValue,
    pub flags: u32,
    pub alias: CUdeviceptr,
}

/// `CUstreamMemOpFlushRemoteWritesParams_st` / `CUstreamMemOpMemoryBarrierParams_st`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemOpFlagsParams {
    pub operation: u32,
    pub flags: u32,
}

/// `CUstreamBatchMemOpParams` (v1): a 48-byte union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUstreamBatchMemOpParams {
    pub operation: u32,
    pub wait_value: MemOpValueParams,
    pub write_value: MemOpValueParams,
    pub flush_remote_writes: MemOpFlagsParams,
    pub memory_barrier: MemOpFlagsParams,
    pub pad: [u64; 6],
}

/// `CUdevprop` (legacy device properties).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUdevprop {
    pub max_threads_per_block: i32,
    pub max_threads_dim: [i32; 3],
    pub max_grid_size: [i32; 3],
    pub shared_mem_per_block: i32,
    pub total_constant_memory: i32,
    pub simd_width: i32,
    pub mem_pitch: i32,
    pub regs_per_block: i32,
    pub clock_rate: i32,
    pub texture_align: i32,
}

/// `CUDA_POINTER_ATTRIBUTE_P2P_TOKENS`
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct P2pTokens {
    pub p2p_token: u64,
    pub va_space_token: u32,
}

/// `CUmemLocation`
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct CUmemLocation {
    pub type_: u32,
    pub id: i32,
}
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;

/// `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct CUmemAllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: CUmemAllocFlags,
}

/// `CUmemAccessDesc`
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: u32,
}
/// `CUmemAccess_flags`
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: u32 = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: u32 = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: u32 = 3;

/// `CUmemRangeHandleType` / flags of `cuMemGetHandleForAddressRange`.
pub const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: u32 = 1;
pub const CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: u64 = 1;

/// `CUdriverProcAddress_flags`
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CUdriverProcAddressQueryResult`
pub const CU_GET_PROC_ADDRESS_SUCCESS: u32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: u32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: u32 = 2;

/// `CUctxCreateParams` (cuCtxCreate_v4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUctxCreateParams {
    pub exec_affinity_params: *mut c_void,
    pub num_exec_affinity_params: i32,
    pub cig_params: *mut c_void,
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn batch_memop_union_matches_cuda_h() {
        assert_eq!(size_of::<CUstreamBatchMemOpParams>(), 48);
        assert_eq!(std::mem::align_of::<CUstreamBatchMemOpParams>(), 8);
        assert_eq!(size_of::<MemOpValueParams>(), 40);
        assert_eq!(offset_of!(MemOpValueParams, operation), 0);
        assert_eq!(offset_of!(MemOpValueParams, address), 8);
        assert_eq!(offset_of!(MemOpValueParams, v), 16);
        assert_eq!(offset_of!(MemOpValueParams, flags), 24);
        assert_eq!(offset_of!(MemOpValueParams, alias), 32);
        assert_eq!(offset_of!(MemOpFlagsParams, flags), 4);
    }

    #[test]
    fn vmm_and_misc_structs_match_cuda_h() {
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(offset_of!(CUmemAllocationProp, alloc_flags), 24);
        assert_eq!(offset_of!(CUmemAllocFlags, gpu_direct_rdma_capable), 1);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUdevprop>(), 56);
        assert_eq!(size_of::<P2pTokens>(), 16);
        assert_eq!(size_of::<CUctxCreateParams>(), 24);
    }

    #[test]
    fn error_table_is_sorted_and_unique() {
        for w in ERROR_TABLE.windows(2) {
            assert!(w[0].0 < w[1].0, "{} then {}", w[0].1, w[1].1);
        }
        assert_eq!(error_entry(801).unwrap().1, "CUDA_ERROR_NOT_SUPPORTED");
        assert!(error_entry(12345).is_none());
    }
}
