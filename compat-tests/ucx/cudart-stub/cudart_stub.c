/*
 * Test-only libcudart.so.13: the twelve CUDA runtime functions that UCX's CUDA transports
 * (libuct_cuda) import, implemented over the driver API, so that they run over cudasim.
 * NVIDIA's libcudart from the wheel cannot: it reaches the driver through cuGetExportTable, a
 * private interface that no simulator can offer, and fails every call with
 * cudaErrorCallRequiresNewerDriver. UCX is linked against the wheel's library (the real
 * consumer's link); the tests load this one in its place. Never installed.
 *
 * Like the runtime, it makes device 0's primary context current where a thread has none.
 */
#include <cuda.h>
#include <stddef.h>

typedef int cudaError_t; /* the runtime's enum; only the values below are produced */
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};

static cudaError_t from_cu(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return cudaErrorHostMemoryAlreadyRegistered;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return cudaErrorHostMemoryNotRegistered;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
    }
}

/* cuInit, then device 0's primary context as the thread's current one if it has none. */
static CUresult ensure_context(void)
{
    CUcontext ctx = NULL;
    CUdevice dev;
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS)
        return r;
    if (cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != NULL)
        return CUDA_SUCCESS;
    if ((r = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS ||
        (r = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS)
        return r;
    return cuCtxSetCurrent(ctx);
}

#define WITH_CONTEXT(call)                                                                 \
    do {                                                                                   \
        CUresult r_ = ensure_context();                                                    \
        return from_cu(r_ != CUDA_SUCCESS ? r_ : (call));                                  \
    } while (0)

cudaError_t cudaGetDeviceCount(int *count)
{
    CUresult r;
    if (count == NULL)
        return cudaErrorInvalidValue;
    r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        *count = 0;
        return from_cu(r);
    }
    return from_cu(cuDeviceGetCount(count));
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

cudaError_t cudaEventCreateWithFlags(CUevent *event, unsigned int flags)
{
    /* cudaEventDefault/BlockingSync/DisableTiming/Interprocess share the driver's values. */
    WITH_CONTEXT(cuEventCreate(event, flags));
}

cudaError_t cudaEventDestroy(CUevent event) { WITH_CONTEXT(cuEventDestroy(event)); }
cudaError_t cudaEventQuery(CUevent event) { WITH_CONTEXT(cuEventQuery(event)); }
cudaError_t cudaEventRecord(CUevent event, CUstream stream) { WITH_CONTEXT(cuEventRecord(event, stream)); }

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    /* cudaHostRegisterDefault/Portable/Mapped/IoMemory/ReadOnly match CU_MEMHOSTREGISTER_*. */
    WITH_CONTEXT(cuMemHostRegister(ptr, size, flags));
}

cudaError_t cudaHostUnregister(void *ptr) { WITH_CONTEXT(cuMemHostUnregister(ptr)); }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, CUstream stream)
{
    (void)kind; /* unified addressing: the driver tells the sides apart (cudaMemcpyDefault) */
    WITH_CONTEXT(cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, count, stream));
}

cudaError_t cudaStreamCreateWithFlags(CUstream *stream, unsigned int flags)
{
    WITH_CONTEXT(cuStreamCreate(stream, flags));
}

cudaError_t cudaStreamDestroy(CUstream stream) { WITH_CONTEXT(cuStreamDestroy(stream)); }
cudaError_t cudaStreamSynchronize(CUstream stream) { WITH_CONTEXT(cuStreamSynchronize(stream)); }
