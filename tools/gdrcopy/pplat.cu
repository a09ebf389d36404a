/*
 * gdrcopy_pplat: ping-pong latency between the CPU and a running GPU kernel, with the
 * GPU-memory objects reached by the CPU through gdrcopy (pin + map + gdr_copy_*_mapping).
 *
 * Options follow gdrcopy 2.6's pplat. Every round trip carries data that is checked: in mode 0
 * the kernel verifies what the CPU wrote, in mode 1 the CPU verifies what the kernel wrote; a
 * mismatch ends the program with status 1.
 *
 * Protocol per iteration i (1-based), all flags 32-bit:
 *   mode 0 (CPU produces, GPU consumes): CPU writes the data for i, then gpu_flag = i; every
 *     block waits for gpu_flag >= i, checks its slice, and the last block to finish sets
 *     cpu_flag = i; the CPU waits for cpu_flag == i.
 *   mode 1 (GPU produces, CPU consumes): CPU sets gpu_flag = i; every block waits for it,
 *     writes its slice of the data for i, and the last block sets cpu_flag = i; the CPU waits
 *     for cpu_flag == i and reads the data back.
 */
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <gdrapi.h>

#define CHECK_CU(stmt)                                                                             \
    do {                                                                                           \
        CUresult r_ = (stmt);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *n_ = nullptr;                                                              \
            cuGetErrorName(r_, &n_);                                                               \
            fprintf(stderr, "CUDA error: %s in %s at %s:%d\n", n_ ? n_ : "?", #stmt, __FILE__,     \
                    __LINE__);                                                                     \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

#define CHECK_RT(stmt)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (stmt);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error: %s in %s at %s:%d\n", cudaGetErrorName(e_), #stmt,        \
                    __FILE__, __LINE__);                                                           \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

#define CHECK_GDR(stmt)                                                                            \
    do {                                                                                           \
        int g_ = (stmt);                                                                           \
        if (g_ != 0) {                                                                             \
            fprintf(stderr, "%s failed: %d (%s) at %s:%d\n", #stmt, g_, strerror(g_), __FILE__,   \
                    __LINE__);                                                                     \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

static double now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

__host__ __device__ static inline uint32_t word_value(uint32_t iter, uint32_t idx)
{
    return iter * 0x9E3779B1u ^ idx;
}

/* One object the CPU and the GPU share: in GPU memory (pinned + mapped by gdrcopy) or in
 * host memory (cuMemHostAlloc, mapped into the device). */
struct shared_obj {
    bool gpumem = false;
    size_t size = 0;
    CUdeviceptr dptr = 0;     /* what the kernel uses */
    CUdeviceptr base = 0;     /* allocation to free (gpumem) */
    size_t alloc_size = 0;
    CUmemGenericAllocationHandle vmm = 0;
    bool is_vmm = false;
    gdr_mh_t mh{};
    void *map = nullptr;      /* gdr mapping (gpumem) */
    void *host = nullptr;     /* host pointer (hostmem) */
};

static gdr_t g_gdr;
static int g_map_flag = GDR_MAP_FLAG_DEFAULT;
static bool g_use_vmm = false;
static CUdevice g_dev;

static void obj_alloc(shared_obj &o, size_t size, bool gpumem)
{
    o.gpumem = gpumem;
    o.size = (size + GPU_PAGE_SIZE - 1) & GPU_PAGE_MASK;
    if (!gpumem) {
        CHECK_CU(cuMemHostAlloc(&o.host, o.size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
        memset(o.host, 0, o.size);
        CHECK_CU(cuMemHostGetDevicePointer(&o.dptr, o.host, 0));
        return;
    }
    if (g_use_vmm) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g_dev;
        prop.allocFlags.gpuDirectRDMACapable = 1;
        size_t gran = 0;
        CHECK_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        gran = std::max(gran, (size_t)GPU_PAGE_SIZE);
        o.alloc_size = (o.size + gran - 1) / gran * gran;
        CHECK_CU(cuMemCreate(&o.vmm, o.alloc_size, &prop, 0));
        CHECK_CU(cuMemAddressReserve(&o.base, o.alloc_size, gran, 0, 0));
        CHECK_CU(cuMemMap(o.base, o.alloc_size, 0, o.vmm, 0));
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof(acc));
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = g_dev;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK_CU(cuMemSetAccess(o.base, o.alloc_size, &acc, 1));
        o.is_vmm = true;
        o.dptr = o.base;
    } else {
        o.alloc_size = o.size + GPU_PAGE_SIZE - 1;
        CHECK_CU(cuMemAlloc(&o.base, o.alloc_size));
        o.dptr = (o.base + GPU_PAGE_SIZE - 1) & GPU_PAGE_MASK;
        unsigned int one = 1;
        CHECK_CU(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, o.dptr));
    }
    CHECK_CU(cuMemsetD8(o.dptr, 0, o.size));
    CHECK_GDR(gdr_pin_buffer(g_gdr, o.dptr, o.size, 0, 0, &o.mh));
    CHECK_GDR(gdr_map_v2(g_gdr, o.mh, &o.map, o.size, g_map_flag));
}

static void obj_free(shared_obj &o)
{
    if (!o.gpumem) {
        CHECK_CU(cuMemFreeHost(o.host));
        return;
    }
    CHECK_GDR(gdr_unmap(g_gdr, o.mh, o.map, o.size));
    CHECK_GDR(gdr_unpin_buffer(g_gdr, o.mh));
    if (o.is_vmm) {
        CHECK_CU(cuMemUnmap(o.base, o.alloc_size));
        CHECK_CU(cuMemAddressFree(o.base, o.alloc_size));
        CHECK_CU(cuMemRelease(o.vmm));
    } else {
        CHECK_CU(cuMemFree(o.base));
    }
}

static void obj_write(shared_obj &o, size_t off, const void *src, size_t n)
{
    if (o.gpumem) {
        CHECK_GDR(gdr_copy_to_mapping(o.mh, (char *)o.map + off, src, n));
    } else {
        memcpy((char *)o.host + off, src, n);
        __sync_synchronize();
    }
}

static void obj_read(shared_obj &o, size_t off, void *dst, size_t n)
{
    if (o.gpumem) {
        CHECK_GDR(gdr_copy_from_mapping(o.mh, dst, (char *)o.map + off, n));
    } else {
        __sync_synchronize();
        memcpy(dst, (const char *)o.host + off, n);
    }
}

__device__ static inline uint32_t ld_volatile(const uint32_t *p)
{
    return *(const volatile uint32_t *)p;
}

/* The persistent kernel: runs every iteration of the ping-pong. counter and error live in
 * device memory (cudaMalloc'd, zeroed). */
__global__ void pp_kernel(uint32_t *gpu_flag, uint32_t *cpu_flag, uint32_t *data, uint32_t nwords,
                          uint32_t iters, int mode, unsigned int *counter, unsigned int *error)
{
    const uint32_t nblocks = gridDim.x;
    for (uint32_t i = 1; i <= iters; i++) {
        if (threadIdx.x == 0) {
            while (ld_volatile(gpu_flag) < i) {
            }
        }
        __syncthreads();
        __threadfence_system();
        /* This block's slice of the data. */
        uint32_t per = (nwords + nblocks - 1) / nblocks;
        uint32_t lo = blockIdx.x * per, hi = min(nwords, lo + per);
        for (uint32_t w = lo + threadIdx.x; w < hi; w += blockDim.x) {
            if (mode == 0) {
                if (ld_volatile(&data[w]) != word_value(i, w)) {
                    atomicExch(error, i);
                }
            } else {
                ((volatile uint32_t *)data)[w] = word_value(i, w);
            }
        }
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned int done = atomicAdd(counter, 1u) + 1u;
            if (done == i * nblocks) {
                __threadfence_system();
                *(volatile uint32_t *)cpu_flag = i;
                __threadfence_system();
            }
        }
    }
}

static bool parse_loc(const char *s, bool *gpumem)
{
    if (strcmp(s, "gpumem") == 0) {
        *gpumem = true;
        return true;
    }
    if (strcmp(s, "hostmem") == 0) {
        *gpumem = false;
        return true;
    }
    return false;
}

static void usage(const char *prog)
{
    printf("Usage: %s [-h][-d <gpu>][-t <iters>][-u <timeout s>][-a <fn>][-s <size>][-B <nblocks>]"
           "[-T <threads>][-m <mode>][-G <loc>][-C <loc>][-D <loc>][-M <type>]\n", prog);
    printf("  -d <gpu>       GPU ordinal (default 0)\n");
    printf("  -t <iters>     iterations (default 1000)\n");
    printf("  -u <seconds>   timeout (default 10; 0 disables)\n");
    printf("  -a <fn>        GPU allocator: cuMemAlloc (default) or cuMemCreate\n");
    printf("  -s <size>      data size in bytes, a multiple of 4 (default 0: flag only)\n");
    printf("  -B <nblocks>   thread blocks (default 8; 1 when the size is 0)\n");
    printf("  -T <threads>   threads per block (default 1024)\n");
    printf("  -m <mode>      0: CPU produces, GPU consumes (default); 1: GPU produces, CPU consumes\n");
    printf("  -G/-C/-D <loc> where the GPU flag / CPU flag / data live: gpumem or hostmem\n");
    printf("                 (defaults gpumem, hostmem, gpumem)\n");
    printf("  -M <type>      mapping type requested from gdr_map_v2: default, wc, cache, device\n");
}

int main(int argc, char **argv)
{
    int dev_id = 0, mode = 0, nblocks = 8, nthreads = 1024;
    long iters = 1000, timeout_s = 10, size = 0;
    bool gflag_gpu = true, cflag_gpu = false, data_gpu = true;
    int c;
    while ((c = getopt(argc, argv, "hd:t:u:a:s:B:T:m:G:C:D:M:")) != -1) {
        switch (c) {
        case 'd': dev_id = (int)strtol(optarg, nullptr, 0); break;
        case 't': iters = strtol(optarg, nullptr, 0); break;
        case 'u': timeout_s = strtol(optarg, nullptr, 0); break;
        case 's': size = strtol(optarg, nullptr, 0); break;
        case 'B': nblocks = (int)strtol(optarg, nullptr, 0); break;
        case 'T': nthreads = (int)strtol(optarg, nullptr, 0); break;
        case 'm': mode = (int)strtol(optarg, nullptr, 0); break;
        case 'a':
            if (strcmp(optarg, "cuMemAlloc") == 0) {
                g_use_vmm = false;
            } else if (strcmp(optarg, "cuMemCreate") == 0) {
                g_use_vmm = true;
            } else {
                fprintf(stderr, "invalid allocator '%s'\n", optarg);
                return 1;
            }
            break;
        case 'G':
        case 'C':
        case 'D':
            if (!parse_loc(optarg, c == 'G' ? &gflag_gpu : c == 'C' ? &cflag_gpu : &data_gpu)) {
                fprintf(stderr, "invalid location '%s' for -%c (gpumem or hostmem)\n", optarg, c);
                return 1;
            }
            break;
        case 'M':
            if (strcmp(optarg, "default") == 0) g_map_flag = GDR_MAP_FLAG_DEFAULT;
            else if (strcmp(optarg, "wc") == 0) g_map_flag = GDR_MAP_FLAG_REQ_WC_MAPPING;
            else if (strcmp(optarg, "cache") == 0) g_map_flag = GDR_MAP_FLAG_REQ_CACHE_MAPPING;
            else if (strcmp(optarg, "device") == 0) g_map_flag = GDR_MAP_FLAG_REQ_DEVICE_MAPPING;
            else {
                fprintf(stderr, "invalid mapping type '%s'\n", optarg);
                return 1;
            }
            break;
        case 'h': usage(argv[0]); return 0;
        default: fprintf(stderr, "Invalid option\n"); usage(argv[0]); return 1;
        }
    }
    if (iters <= 0 || size < 0 || size % 4 != 0 || (mode != 0 && mode != 1) || nblocks <= 0 ||
        nthreads <= 0 || timeout_s < 0 || iters > 0x7fffffff) {
        fprintf(stderr, "invalid arguments: need -t > 0, -s a non-negative multiple of 4, -m 0|1, -B/-T > 0\n");
        return 1;
    }
    if (iters > 100 && iters % 100 != 0) {
        long fixed = (iters / 100 + 1) * 100;
        fprintf(stderr, "WARNING: %ld iterations is not a multiple of 100; using %ld\n", iters, fixed);
        iters = fixed;
    }
    if (size == 0) {
        nblocks = 1;
    }

    CHECK_CU(cuInit(0));
    int ndev = 0;
    CHECK_CU(cuDeviceGetCount(&ndev));
    for (int i = 0; i < ndev; i++) {
        CUdevice d;
        char name[256] = {0};
        int bus = 0, devno = 0, dom = 0;
        CHECK_CU(cuDeviceGet(&d, i));
        CHECK_CU(cuDeviceGetName(name, sizeof(name) - 1, d));
        CHECK_CU(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d));
        CHECK_CU(cuDeviceGetAttribute(&devno, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d));
        CHECK_CU(cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d));
        printf("GPU id:%d; name: %s; Bus id: %04x:%02x:%02x\n", i, name, dom, bus, devno);
    }
    if (dev_id < 0 || dev_id >= ndev) {
        fprintf(stderr, "GPU %d does not exist\n", dev_id);
        return 1;
    }
    printf("selecting device %d\n", dev_id);
    CUcontext ctx;
    CHECK_CU(cuDeviceGet(&g_dev, dev_id));
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, g_dev));
    CHECK_CU(cuCtxSetCurrent(ctx));
    CHECK_RT(cudaSetDevice(dev_id));
    int max_threads = 0;
    CHECK_CU(cuDeviceGetAttribute(&max_threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, g_dev));
    if (nthreads > max_threads) {
        fprintf(stderr, "-T %d exceeds the device's maximum of %d threads per block\n", nthreads, max_threads);
        return 1;
    }

    g_gdr = gdr_open();
    if (!g_gdr) {
        fprintf(stderr, "gdr_open failed: neither /dev/gdrdrv nor CUDA dma-buf mmap support is usable\n");
        return 1;
    }

    shared_obj gflag, cflag, data;
    obj_alloc(gflag, sizeof(uint32_t), gflag_gpu);
    obj_alloc(cflag, sizeof(uint32_t), cflag_gpu);
    bool have_data = size > 0;
    if (have_data) {
        obj_alloc(data, (size_t)size, data_gpu);
    }
    unsigned int *counter = nullptr, *error = nullptr;
    CHECK_RT(cudaMalloc(&counter, sizeof(unsigned int)));
    CHECK_RT(cudaMalloc(&error, sizeof(unsigned int)));
    CHECK_RT(cudaMemset(counter, 0, sizeof(unsigned int)));
    CHECK_RT(cudaMemset(error, 0, sizeof(unsigned int)));
    CHECK_RT(cudaDeviceSynchronize());

    printf("Benchmark mode: %s\n", mode == 0 ? "CPU produces and GPU consumes" : "GPU produces and CPU consumes");
    printf("GPU flag in %s, CPU flag in %s, data (%ld bytes) in %s; %d block(s) x %d threads\n",
           gflag_gpu ? "GPU memory" : "host memory", cflag_gpu ? "GPU memory" : "host memory", size,
           data_gpu ? "GPU memory" : "host memory", nblocks, nthreads);
    if (mode == 0) {
        printf("Each iteration: the CPU writes the data and then the GPU flag; the running kernel waits for the\n"
               "flag, checks the data and answers through the CPU flag, which the CPU polls.\n");
    } else {
        printf("Each iteration: the CPU writes the GPU flag; the running kernel waits for it, writes the data\n"
               "and answers through the CPU flag, which the CPU polls before reading the data.\n");
    }

    uint32_t nwords = (uint32_t)(size / 4);
    std::vector<uint32_t> buf(nwords ? nwords : 1);
    cudaStream_t stream;
    CHECK_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    pp_kernel<<<nblocks, nthreads, 0, stream>>>((uint32_t *)gflag.dptr, (uint32_t *)cflag.dptr,
                                                 have_data ? (uint32_t *)data.dptr : nullptr, nwords,
                                                 (uint32_t)iters, mode, counter, error);
    CHECK_RT(cudaGetLastError());

    printf("Running %ld iterations ...\n", iters);
    fflush(stdout);
    std::vector<double> lat((size_t)iters);
    long bad_data = 0;
    for (uint32_t i = 1; i <= (uint32_t)iters; i++) {
        if (mode == 0 && have_data) {
            for (uint32_t w = 0; w < nwords; w++) {
                buf[w] = word_value(i, w);
            }
        }
        double t0 = now_us();
        if (mode == 0 && have_data) {
            obj_write(data, 0, buf.data(), (size_t)size);
        }
        obj_write(gflag, 0, &i, sizeof(i));
        uint32_t seen = 0;
        for (unsigned long spin = 0;; spin++) {
            obj_read(cflag, 0, &seen, sizeof(seen));
            if (seen == i) {
                break;
            }
            if (timeout_s && (spin & 0xfff) == 0 && now_us() - t0 > (double)timeout_s * 1e6) {
                printf("ERROR: TIMEOUT!!!\n");
                printf("cuStreamQuery(0) returned %d\n", (int)cuStreamQuery(0));
                fflush(stdout);
                abort();
            }
        }
        if (mode == 1 && have_data) {
            obj_read(data, 0, buf.data(), (size_t)size);
        }
        lat[i - 1] = now_us() - t0;
        if (mode == 1 && have_data) {
            for (uint32_t w = 0; w < nwords; w++) {
                if (buf[w] != word_value(i, w)) {
                    bad_data++;
                    break;
                }
            }
        }
    }
    CHECK_RT(cudaStreamSynchronize(stream));
    unsigned int gpu_err = 0;
    CHECK_RT(cudaMemcpy(&gpu_err, error, sizeof(gpu_err), cudaMemcpyDeviceToHost));

    std::sort(lat.begin(), lat.end());
    double median = lat.size() % 2 ? lat[lat.size() / 2] : (lat[lat.size() / 2 - 1] + lat[lat.size() / 2]) / 2;
    printf("Round-trip latency per iteration is (min) %.3f, (median) %.3f us\n", lat[0], median);

    CHECK_RT(cudaStreamDestroy(stream));
    CHECK_RT(cudaFree(counter));
    CHECK_RT(cudaFree(error));
    if (have_data) {
        obj_free(data);
    }
    obj_free(cflag);
    obj_free(gflag);
    printf("closing gdrdrv\n");
    CHECK_GDR(gdr_close(g_gdr));
    if (gpu_err) {
        fprintf(stderr, "ERROR: the GPU saw wrong data (last bad iteration %u)\n", gpu_err);
        return 1;
    }
    if (bad_data) {
        fprintf(stderr, "ERROR: the CPU read wrong data in %ld iteration(s)\n", bad_data);
        return 1;
    }
    return 0;
}
