/*
 * Helpers shared by the gdrcopy test programs: CUDA error checks, the two GPU allocators the
 * programs use (cuMemAlloc and the VMM cuMemCreate path), device listing and timing.
 *
 * These programs are ordinary consumers of libgdrapi: they include only gdrapi.h and cuda.h.
 */
#ifndef GDRTOOLS_COMMON_H
#define GDRTOOLS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda.h>
#include <gdrapi.h>

#define EXIT_WAIVED 2

extern int gdrtools_verbose;
/* Set in a process forked from a test process: failures then leave with _exit, so that no
 * library destructor (CUDA's worker threads do not exist after fork) runs twice. */
extern int gdrtools_forked_child;
/* Leave the process with status 1 (see gdrtools_forked_child). */
_Noreturn void gdrtools_fail(void);

/* Round x up/down to a multiple of a (a power of two). */
#define ROUND_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define ROUND_DOWN(x, a) ((x) & ~((__typeof__(x))(a) - 1))

/* Print a debug line to stderr when -v was given. */
#define DBG(...)                                                                                   \
    do {                                                                                           \
        if (gdrtools_verbose) {                                                                    \
            fprintf(stderr, "DBG: " __VA_ARGS__);                                                  \
        }                                                                                          \
    } while (0)

/* Fail the current process: the assertion text first, as upstream prints it. */
#define ASSERT(x)                                                                                  \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "Assertion \"%s\" failed at %s:%d\n", #x, __FILE__, __LINE__);        \
            gdrtools_fail();                                                                       \
        }                                                                                          \
    } while (0)

/* Comparisons that also print both values, so a failure says what was seen. */
#define ASSERT_CMP(a, op, b)                                                                       \
    do {                                                                                           \
        long long _a = (long long)(a), _b = (long long)(b);                                        \
        if (!(_a op _b)) {                                                                         \
            fprintf(stderr, "Assertion \"%s %s %s\" failed at %s:%d (%lld vs %lld)\n", #a, #op,   \
                    #b, __FILE__, __LINE__, _a, _b);                                               \
            gdrtools_fail();                                                                       \
        }                                                                                          \
    } while (0)
#define ASSERT_EQ(a, b) ASSERT_CMP(a, ==, b)
#define ASSERT_NEQ(a, b) ASSERT_CMP(a, !=, b)

/* A CUDA call that must succeed: prints "CUDA error: <name>" and fails otherwise. */
#define ASSERTDRV(stmt)                                                                            \
    do {                                                                                           \
        CUresult _r = (stmt);                                                                      \
        if (_r != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "CUDA error: %s (%d) in %s\n", cuda_err_name(_r), (int)_r, #stmt);     \
        }                                                                                          \
        ASSERT(CUDA_SUCCESS == _r);                                                                \
    } while (0)

/* Waive the current process (exit 2) with a message naming what is missing. */
#define WAIVE(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "WAIVED: " __VA_ARGS__);                                                   \
        fprintf(stderr, "\n");                                                                     \
        exit(EXIT_WAIVED);                                                                         \
    } while (0)

const char *cuda_err_name(CUresult r);

/* Which allocator a GPU buffer comes from. */
typedef enum { GPU_ALLOC_CUMEMALLOC = 0, GPU_ALLOC_CUMEMCREATE = 1 } gpu_alloc_kind_t;

const char *gpu_alloc_name(gpu_alloc_kind_t kind);
/* Parse "cuMemAlloc" / "cuMemCreate"; returns -1 for anything else. */
int gpu_alloc_parse(const char *s);
/* Parse "default" / "wc" / "cache" / "device" into a gdr_map_flags_t; -1 otherwise. */
int map_flag_parse(const char *s);
const char *map_flag_name(int flag);

/* A GPU buffer whose usable start (ptr) is 64 KiB aligned. */
typedef struct {
    gpu_alloc_kind_t kind;
    CUdeviceptr ptr;        /* 64 KiB-aligned start handed to gdr_pin_buffer */
    size_t size;            /* usable bytes from ptr */
    CUdeviceptr base;       /* what the allocator returned */
    size_t alloc_size;      /* bytes reserved at base */
    CUmemGenericAllocationHandle vmm_handle;
    bool live;
} gpu_buf_t;

/* cuInit, select device ordinal dev_id, make its primary context current. */
CUresult cuda_init_device(int dev_id, CUdevice *dev, CUcontext *ctx);

/* Whether the VMM allocator with GPUDirect RDMA can be used on dev; when not, *why says why. */
bool vmm_supported(CUdevice dev, const char **why);

/* Allocate size bytes with the given allocator; the returned ptr is 64 KiB aligned. cuMemAlloc
 * buffers get CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set, as gdrcopy's programs do. */
CUresult gpu_mem_alloc(gpu_buf_t *b, size_t size, gpu_alloc_kind_t kind, CUdevice dev);
CUresult gpu_mem_free(gpu_buf_t *b);

/* Print "GPU id:<n>; name: <name>; Bus id: <dddd>:<bb>:<dd>" for every device. */
CUresult print_gpu_list(int *count);

/* Seconds on CLOCK_MONOTONIC. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Fill with a deterministic pseudo-random pattern derived from seed. */
void fill_pattern(void *buf, size_t size, uint32_t seed);

/* Index of the first differing byte, or -1 when equal. */
long first_mismatch(const void *a, const void *b, size_t size);

/* Options shared by copybw, copylat and apiperf: -a <allocator> and -M <mapping type>.
 * Each prints upstream-style complaints and returns 0, or -1 for a bad value. */
int parse_alloc_option(const char *arg, gpu_alloc_kind_t *out);
int parse_map_option(const char *arg, int *out);

/* Benchmark start-up shared by copybw, copylat and apiperf: cuInit, the "GPU id:" list,
 * "selecting device <n>", primary context of dev_id, and a VMM capability check when alloc is
 * cuMemCreate. Returns 0, or 1 after printing why it cannot go on. */
int bench_select_device(int dev_id, gpu_alloc_kind_t alloc, CUdevice *dev, CUcontext *ctx);

/* gdr_open, or NULL after saying that neither gdrdrv nor dma-buf mmap is usable. */
gdr_t bench_gdr_open(void);

/* Map the pinned mh (gdr_map_v2 with map_flag) into *map and print the mapping, its
 * gdr_get_info fields and the page offset of ptr, the device address that was pinned;
 * returns where ptr lies in the mapping. Failures fail the process. */
char *bench_map(gdr_t g, gdr_mh_t mh, CUdeviceptr ptr, size_t size, int map_flag, void **map,
                gdr_info_t *info);

/* Benchmark teardown, each step announced: unmap and unpin mh, close g (bench_close), then free
 * the GPU buffer. Failures fail the process. */
void bench_teardown(gdr_t g, gdr_mh_t mh, void *map, size_t size, gpu_buf_t *b);

/* "closing gdrdrv", then gdr_close, which must succeed. */
void bench_close(gdr_t g);

/* The exit status after a benchmark's data checks: 0, or 1 after reporting how many failed. */
int bench_exit_status(int errors);

/* Parse a number with strtol base 0; exits with a message when it is not one. */
long parse_long(const char *opt, const char *s);

/* Compare doubles, for qsort. */
int cmp_double(const void *a, const void *b);

#endif
