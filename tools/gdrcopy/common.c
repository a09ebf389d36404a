/* Helpers shared by the gdrcopy test programs (see common.h). */
#define _GNU_SOURCE
#include "common.h"

#include <errno.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int gdrtools_verbose = 0;
int gdrtools_forked_child = 0;

_Noreturn void gdrtools_fail(void)
{
    fflush(NULL);
    if (gdrtools_forked_child) {
        _exit(EXIT_FAILURE);
    }
    exit(EXIT_FAILURE);
}

const char *cuda_err_name(CUresult r)
{
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) {
        return "CUDA_ERROR_UNKNOWN_CODE";
    }
    return name;
}

const char *gpu_alloc_name(gpu_alloc_kind_t kind)
{
    return kind == GPU_ALLOC_CUMEMCREATE ? "cuMemCreate" : "cuMemAlloc";
}

int gpu_alloc_parse(const char *s)
{
    if (strcmp(s, "cuMemAlloc") == 0) {
        return GPU_ALLOC_CUMEMALLOC;
    }
    if (strcmp(s, "cuMemCreate") == 0) {
        return GPU_ALLOC_CUMEMCREATE;
    }
    return -1;
}

int map_flag_parse(const char *s)
{
    if (strcmp(s, "default") == 0) {
        return GDR_MAP_FLAG_DEFAULT;
    }
    if (strcmp(s, "wc") == 0) {
        return GDR_MAP_FLAG_REQ_WC_MAPPING;
    }
    if (strcmp(s, "cache") == 0) {
        return GDR_MAP_FLAG_REQ_CACHE_MAPPING;
    }
    if (strcmp(s, "device") == 0) {
        return GDR_MAP_FLAG_REQ_DEVICE_MAPPING;
    }
    return -1;
}

const char *map_flag_name(int flag)
{
    switch (flag) {
    case GDR_MAP_FLAG_DEFAULT: return "default";
    case GDR_MAP_FLAG_REQ_WC_MAPPING: return "wc";
    case GDR_MAP_FLAG_REQ_CACHE_MAPPING: return "cache";
    case GDR_MAP_FLAG_REQ_DEVICE_MAPPING: return "device";
    default: return "invalid";
    }
}

CUresult cuda_init_device(int dev_id, CUdevice *dev, CUcontext *ctx)
{
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuInit failed: %s\n", cuda_err_name(r));
        return r;
    }
    int n = 0;
    r = cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    if (dev_id < 0 || dev_id >= n) {
        fprintf(stderr, "GPU %d does not exist (%d GPUs found)\n", dev_id, n);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    r = cuDeviceGet(dev, dev_id);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    r = cuDevicePrimaryCtxRetain(ctx, *dev);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    return cuCtxSetCurrent(*ctx);
}

static void vmm_prop(CUmemAllocationProp *prop, CUdevice dev)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->allocFlags.gpuDirectRDMACapable = 1;
}

/* The VMM allocation properties for dev and their minimum granularity. */
static CUresult vmm_granularity(CUdevice dev, CUmemAllocationProp *prop, size_t *gran)
{
    vmm_prop(prop, dev);
    return cuMemGetAllocationGranularity(gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

bool vmm_supported(CUdevice dev, const char **why)
{
    int version = 0;
    if (cuDriverGetVersion(&version) != CUDA_SUCCESS || version < 11000) {
        *why = "the CUDA driver is older than 11.0 (no VMM API)";
        return false;
    }
    int attr = 0;
    CUresult r = cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
    if (r != CUDA_SUCCESS) {
        *why = "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) failed";
        return false;
    }
    if (!attr) {
        *why = "the device does not support GPUDirect RDMA with CUDA VMM allocations";
        return false;
    }
    CUmemAllocationProp prop;
    size_t gran = 0;
    if (vmm_granularity(dev, &prop, &gran) != CUDA_SUCCESS) {
        *why = "cuMemGetAllocationGranularity is not supported by this libcuda";
        return false;
    }
    return true;
}

CUresult gpu_mem_alloc(gpu_buf_t *b, size_t size, gpu_alloc_kind_t kind, CUdevice dev)
{
    CUresult r;
    memset(b, 0, sizeof(*b));
    b->kind = kind;
    if (kind == GPU_ALLOC_CUMEMALLOC) {
        /* Over-allocate by a GPU page minus one so that a 64 KiB-aligned start fits. */
        b->alloc_size = size + GPU_PAGE_SIZE - 1;
        r = cuMemAlloc(&b->base, b->alloc_size);
        if (r != CUDA_SUCCESS) {
            return r;
        }
        b->ptr = ROUND_UP(b->base, GPU_PAGE_SIZE);
        b->size = size;
        unsigned int flag = 1;
        r = cuPointerSetAttribute(&flag, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, b->ptr);
        if (r != CUDA_SUCCESS) {
            cuMemFree(b->base);
            return r;
        }
        b->live = true;
        DBG("cuMemAlloc: base=0x%llx ptr=0x%llx size=%zu\n", (unsigned long long)b->base,
            (unsigned long long)b->ptr, size);
        return CUDA_SUCCESS;
    }

    CUmemAllocationProp prop;
    size_t gran = 0;
    r = vmm_granularity(dev, &prop, &gran);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    if (gran < GPU_PAGE_SIZE) {
        gran = GPU_PAGE_SIZE;
    }
    /* Granularity is a power of two in practice; round by division to be safe. */
    size_t rounded = (size + gran - 1) / gran * gran;
    r = cuMemCreate(&b->vmm_handle, rounded, &prop, 0);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    r = cuMemAddressReserve(&b->base, rounded, gran, 0, 0);
    if (r != CUDA_SUCCESS) {
        cuMemRelease(b->vmm_handle);
        return r;
    }
    r = cuMemMap(b->base, rounded, 0, b->vmm_handle, 0);
    if (r != CUDA_SUCCESS) {
        cuMemAddressFree(b->base, rounded);
        cuMemRelease(b->vmm_handle);
        return r;
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemSetAccess(b->base, rounded, &access, 1);
    if (r != CUDA_SUCCESS) {
        cuMemUnmap(b->base, rounded);
        cuMemAddressFree(b->base, rounded);
        cuMemRelease(b->vmm_handle);
        return r;
    }
    b->alloc_size = rounded;
    b->ptr = b->base;
    b->size = size;
    b->live = true;
    if (b->ptr & GPU_PAGE_OFFSET) {
        /* Reserved with 64 KiB alignment or more; anything else breaks the callers' contract. */
        fprintf(stderr, "cuMemAddressReserve returned an address that is not 64 KiB aligned\n");
        gpu_mem_free(b);
        return CUDA_ERROR_INVALID_VALUE;
    }
    DBG("cuMemCreate: ptr=0x%llx size=%zu granularity=%zu\n", (unsigned long long)b->ptr, size, gran);
    return CUDA_SUCCESS;
}

CUresult gpu_mem_free(gpu_buf_t *b)
{
    if (!b->live) {
        return CUDA_SUCCESS;
    }
    b->live = false;
    if (b->kind == GPU_ALLOC_CUMEMALLOC) {
        return cuMemFree(b->base);
    }
    CUresult r = cuMemUnmap(b->base, b->alloc_size);
    CUresult r2 = cuMemAddressFree(b->base, b->alloc_size);
    CUresult r3 = cuMemRelease(b->vmm_handle);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    return r2 != CUDA_SUCCESS ? r2 : r3;
}

CUresult print_gpu_list(int *count)
{
    int n = 0;
    CUresult r = cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        return r;
    }
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        char name[256] = {0};
        int bus = 0, devno = 0, domain = 0;
        r = cuDeviceGet(&dev, i);
        if (r == CUDA_SUCCESS) {
            r = cuDeviceGetName(name, (int)sizeof(name) - 1, dev);
        }
        if (r == CUDA_SUCCESS) {
            r = cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
        }
        if (r == CUDA_SUCCESS) {
            r = cuDeviceGetAttribute(&devno, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
        }
        if (r == CUDA_SUCCESS) {
            r = cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
        }
        if (r != CUDA_SUCCESS) {
            return r;
        }
        printf("GPU id:%d; name: %s; Bus id: %04x:%02x:%02x\n", i, name, domain, bus, devno);
    }
    *count = n;
    return CUDA_SUCCESS;
}

void fill_pattern(void *buf, size_t size, uint32_t seed)
{
    /* xorshift32: cheap, and every byte position gets a value that depends on the seed. */
    uint32_t x = seed * 2654435761u + 0x9e3779b9u;
    if (x == 0) {
        x = 1;
    }
    unsigned char *p = buf;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 11);
    }
}

long first_mismatch(const void *a, const void *b, size_t size)
{
    const unsigned char *x = a, *y = b;
    if (memcmp(x, y, size) == 0) {
        return -1;
    }
    for (size_t i = 0; i < size; i++) {
        if (x[i] != y[i]) {
            return (long)i;
        }
    }
    return -1;
}

long parse_long(const char *opt, const char *s)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0') {
        fprintf(stderr, "invalid number for %s: '%s'\n", opt, s);
        exit(EXIT_FAILURE);
    }
    return v;
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int parse_alloc_option(const char *arg, gpu_alloc_kind_t *out)
{
    int k = gpu_alloc_parse(arg);
    if (k < 0) {
        fprintf(stderr, "invalid allocator '%s' (cuMemAlloc or cuMemCreate)\n", arg);
        return -1;
    }
    *out = (gpu_alloc_kind_t)k;
    return 0;
}

int parse_map_option(const char *arg, int *out)
{
    int flag = map_flag_parse(arg);
    if (flag < 0) {
        fprintf(stderr, "invalid mapping type '%s' (default, wc, cache or device)\n", arg);
        return -1;
    }
    *out = flag;
    return 0;
}

int bench_select_device(int dev_id, gpu_alloc_kind_t alloc, CUdevice *dev, CUcontext *ctx)
{
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuInit failed: %s\n", cuda_err_name(r));
        return 1;
    }
    int ndev = 0;
    r = print_gpu_list(&ndev);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "CUDA error: %s\n", cuda_err_name(r));
        return 1;
    }
    if (dev_id >= ndev || dev_id < 0) {
        fprintf(stderr, "GPU %d does not exist\n", dev_id);
        return 1;
    }
    printf("selecting device %d\n", dev_id);
    r = cuda_init_device(dev_id, dev, ctx);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "CUDA error: %s\n", cuda_err_name(r));
        return 1;
    }
    if (alloc == GPU_ALLOC_CUMEMCREATE) {
        const char *why = NULL;
        if (!vmm_supported(*dev, &why)) {
            fprintf(stderr, "cuMemCreate cannot be used: %s\n", why);
            return 1;
        }
    }
    return 0;
}

gdr_t bench_gdr_open(void)
{
    gdr_t g = gdr_open();
    if (!g) {
        fprintf(stderr, "gdr_open failed: neither /dev/gdrdrv nor CUDA dma-buf mmap support is usable\n");
    }
    return g;
}

char *bench_map(gdr_t g, gdr_mh_t mh, CUdeviceptr ptr, size_t size, int map_flag, void **map,
                gdr_info_t *info)
{
    ASSERT_EQ(gdr_map_v2(g, mh, map, size, map_flag), 0);
    printf("map_d_ptr: %p\n", *map);
    ASSERT_EQ(gdr_get_info(g, mh, info), 0);
    printf("info.va: %llx\n", (unsigned long long)info->va);
    printf("info.mapped_size: %llu\n", (unsigned long long)info->mapped_size);
    printf("info.page_size: %u\n", info->page_size);
    printf("info.mapped: %u\n", info->mapped);
    printf("info.wc_mapping: %u\n", info->wc_mapping);
    /* Where the device pointer lies relative to the pinned range's start. */
    size_t off = (size_t)(ptr - info->va);
    printf("page offset: %zu\n", off);
    return (char *)*map + off;
}

void bench_teardown(gdr_t g, gdr_mh_t mh, void *map, size_t size, gpu_buf_t *b)
{
    printf("unmapping buffer\n");
    ASSERT_EQ(gdr_unmap(g, mh, map, size), 0);
    printf("unpinning buffer\n");
    ASSERT_EQ(gdr_unpin_buffer(g, mh), 0);
    bench_close(g);
    ASSERTDRV(gpu_mem_free(b));
}

void bench_close(gdr_t g)
{
    printf("closing gdrdrv\n");
    ASSERT_EQ(gdr_close(g), 0);
}

int bench_exit_status(int errors)
{
    if (errors) {
        fprintf(stderr, "ERROR: %d data check(s) failed\n", errors);
        return 1;
    }
    return 0;
}
