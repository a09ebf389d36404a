/*
 * gdrcopy_copylat: per-call latency of gdr_copy_to_mapping / gdr_copy_from_mapping (and, with
 * -c, of cuMemcpy) for sizes 1, 2, 4, ... up to the buffer size. Options, defaults and output
 * follow gdrcopy 2.6's copylat: iterations are split into up to 100 buckets, and the median and
 * minimum per-call times over the buckets are printed. Every size's data is also checked
 * (exit 1 on a mismatch).
 */
#define _GNU_SOURCE
#include "common.h"

#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define MAX_BUCKETS 100

static int cold_cache = 0;

/* Evicts the mapped range from the CPU caches before a timed call (CACHING mappings only). */
static void flush_range(const void *p, size_t n)
{
    if (!cold_cache) {
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    for (size_t i = 0; i < n; i += 64) {
        _mm_clflush((const char *)p + i);
    }
    _mm_mfence();
#else
    /* No portable user-space line flush: touching a large buffer pushes the range out. */
    static char junk[64 << 20];
    for (size_t i = 0; i < sizeof(junk); i += 64) {
        junk[i]++;
    }
    (void)p;
    (void)n;
#endif
}

typedef enum { OP_GDR_TO, OP_GDR_FROM, OP_CU_H2D, OP_CU_D2H } op_t;

typedef struct {
    gdr_mh_t mh;
    char *map;
    CUdeviceptr dptr;
    unsigned char *host;
} ctx_t;

static int do_op(op_t op, ctx_t *c, size_t size)
{
    switch (op) {
    case OP_GDR_TO: return gdr_copy_to_mapping(c->mh, c->map, c->host, size);
    case OP_GDR_FROM: return gdr_copy_from_mapping(c->mh, c->host, c->map, size);
    case OP_CU_H2D: return cuMemcpyHtoD(c->dptr, c->host, size) == CUDA_SUCCESS ? 0 : -1;
    case OP_CU_D2H: return cuMemcpyDtoH(c->host, c->dptr, size) == CUDA_SUCCESS ? 0 : -1;
    }
    return -1;
}

/* Times iters calls in up to 100 buckets; writes median and minimum per-call microseconds. */
static int time_op(op_t op, ctx_t *c, size_t size, long iters, double *median, double *min)
{
    long nb = iters < MAX_BUCKETS ? iters : MAX_BUCKETS;
    if (nb <= 0) {
        *median = *min = 0;
        return 0;
    }
    long per = iters / nb;
    double t[MAX_BUCKETS];
    for (long b = 0; b < nb; b++) {
        flush_range(c->map, size);
        double t0 = now_s();
        for (long i = 0; i < per; i++) {
            if (do_op(op, c, size) != 0) {
                return -1;
            }
        }
        t[b] = (now_s() - t0) * 1e6 / (double)per;
    }
    qsort(t, (size_t)nb, sizeof(double), cmp_double);
    *median = nb % 2 ? t[nb / 2] : (t[nb / 2 - 1] + t[nb / 2]) / 2;
    *min = t[0];
    return 0;
}

static const char *op_name(op_t op)
{
    switch (op) {
    case OP_GDR_TO: return "gdr_copy_to_mapping";
    case OP_GDR_FROM: return "gdr_copy_from_mapping";
    case OP_CU_H2D: return "cuMemcpy_H2D";
    case OP_CU_D2H: return "cuMemcpy_D2H";
    }
    return "?";
}

static long fix_iters(const char *what, long iters)
{
    if (iters > MAX_BUCKETS && iters % MAX_BUCKETS != 0) {
        long fixed = (iters / MAX_BUCKETS + 1) * MAX_BUCKETS;
        fprintf(stderr, "WARNING: %s iterations %ld is not a multiple of %d; using %ld\n", what, iters,
                MAX_BUCKETS, fixed);
        return fixed;
    }
    return iters;
}

static void usage(const char *prog)
{
    printf("Usage: %s [-h][-c][-s <size>][-d <gpu>][-w <iters>][-r <iters>][-a <fn>][-M <type>][-C]\n", prog);
    printf("  -s <size>    buffer allocation size (default 16777216)\n");
    printf("  -c           also measure cuMemcpy H2D and D2H\n");
    printf("  -d <gpu>     GPU ordinal (default 0)\n");
    printf("  -w <iters>   gdr_copy_to_mapping iterations per size (default 10000)\n");
    printf("  -r <iters>   gdr_copy_from_mapping iterations per size (default 100)\n");
    printf("  -a <fn>      GPU allocator: cuMemAlloc (default) or cuMemCreate\n");
    printf("  -M <type>    mapping type requested from gdr_map_v2: default, wc, cache, device\n");
    printf("  -C           cold cache: flush the mapping from the CPU caches before each bucket (CACHING mappings only)\n");
    printf("  -h           this help\n");
}

/* Runs one table: every size from 1 to max doubling, checking the data of each size once. */
static int table(op_t op, ctx_t *c, size_t max, long iters, unsigned char *pattern, unsigned char *check,
                 int *errors)
{
    printf("\n");
    printf("Test \t\t\t Size(B) \t Median Time(us) \t Min. Time(us)\n");
    for (size_t size = 1; size <= max; size *= 2) {
        double med, mn;
        bool to_dev = op == OP_GDR_TO || op == OP_CU_H2D;
        if (to_dev) {
            memcpy(c->host, pattern, size);
        } else {
            ASSERTDRV(cuMemcpyHtoD(c->dptr, pattern, size));
            memset(c->host, 0xCD, size);
        }
        if (time_op(op, c, size, iters, &med, &mn) != 0) {
            fprintf(stderr, "%s failed at size %zu\n", op_name(op), size);
            return -1;
        }
        printf("%s \t %8zu \t %11.4f \t %11.4f\n", op_name(op), size, med, mn);
        if (iters > 0) {
            if (to_dev) {
                memset(check, 0xEE, size);
                ASSERTDRV(cuMemcpyDtoH(check, c->dptr, size));
            }
            long bad = first_mismatch(pattern, to_dev ? check : c->host, size);
            if (bad >= 0) {
                fprintf(stderr, "ERROR: %s data mismatch at size %zu, byte %ld\n", op_name(op), size, bad);
                (*errors)++;
            }
        }
        if (size > max / 2) {
            break;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t size = 16 * 1024 * 1024;
    long num_write_iters = 10000, num_read_iters = 100;
    int dev_id = 0, do_cumemcpy = 0, map_flag = GDR_MAP_FLAG_DEFAULT;
    gpu_alloc_kind_t alloc = GPU_ALLOC_CUMEMALLOC;
    int c;
    while ((c = getopt(argc, argv, "hcs:d:w:r:a:M:C")) != -1) {
        switch (c) {
        case 's': size = (size_t)parse_long("-s", optarg); break;
        case 'c': do_cumemcpy = 1; break;
        case 'd': dev_id = (int)parse_long("-d", optarg); break;
        case 'w': num_write_iters = parse_long("-w", optarg); break;
        case 'r': num_read_iters = parse_long("-r", optarg); break;
        case 'C': cold_cache = 1; break;
        case 'a': if (parse_alloc_option(optarg, &alloc)) return 1; break;
        case 'M': if (parse_map_option(optarg, &map_flag)) return 1; break;
        case 'h': usage(argv[0]); return 0;
        default: fprintf(stderr, "Invalid option\n"); usage(argv[0]); return 1;
        }
    }
    if (size == 0 || num_write_iters < 0 || num_read_iters < 0) {
        fprintf(stderr, "the size must be positive and iteration counts non-negative\n");
        return 1;
    }
    num_write_iters = fix_iters("write", num_write_iters);
    num_read_iters = fix_iters("read", num_read_iters);

    CUdevice dev;
    CUcontext ctx;
    if (bench_select_device(dev_id, alloc, &dev, &ctx))
        return 1;

    size_t rounded = ROUND_UP(size, GPU_PAGE_SIZE);
    gpu_buf_t b;
    ASSERTDRV(gpu_mem_alloc(&b, rounded, alloc, dev));
    printf("device ptr: 0x%llx\n", (unsigned long long)b.ptr);
    printf("allocated size: %zu\n", rounded);
    printf("gpu alloc fn: %s\n", gpu_alloc_name(alloc));

    gdr_t g = bench_gdr_open();
    if (!g) {
        return 1;
    }
    gdr_mh_t mh;
    ASSERT_EQ(gdr_pin_buffer(g, b.ptr, rounded, 0, 0, &mh), 0);
    void *map_d_ptr = NULL;
    gdr_info_t info;
    char *buf_ptr = bench_map(g, mh, b.ptr, rounded, map_flag, &map_d_ptr, &info);
    printf("user-space pointer: %p\n", (void *)buf_ptr);
    if (cold_cache && info.mapping_type != GDR_MAPPING_TYPE_CACHING) {
        fprintf(stderr, "ERROR: Cold cache has no effect on a mapping that is not CACHING (use -M cache on a "
                        "platform that supports it)\n");
        gdr_unmap(g, mh, map_d_ptr, rounded);
        gdr_unpin_buffer(g, mh);
        gdr_close(g);
        gpu_mem_free(&b);
        return 1;
    }
    printf("use cold cache: %s\n", cold_cache ? "yes" : "no");

    unsigned char *host = malloc(rounded), *pattern = malloc(rounded), *check = malloc(rounded);
    ASSERT(host && pattern && check);
    fill_pattern(pattern, rounded, 7);
    ctx_t cx = { .mh = mh, .map = buf_ptr, .dptr = b.ptr, .host = host };
    int errors = 0;

    if (do_cumemcpy) {
        printf("\ncuMemcpy num iters for each size: %ld\n", num_write_iters);
        if (table(OP_CU_H2D, &cx, rounded, num_write_iters, pattern, check, &errors) ||
            table(OP_CU_D2H, &cx, rounded, num_read_iters, pattern, check, &errors)) {
            return 1;
        }
    }
    printf("\ngdr_copy_to_mapping num iters for each size: %ld\n", num_write_iters);
    printf("WARNING: Measuring the API invocation overhead as observed by the CPU. Data might not be "
           "ordered all the way to the GPU internal visibility.\n");
    if (table(OP_GDR_TO, &cx, rounded, num_write_iters, pattern, check, &errors)) {
        return 1;
    }
    printf("\ngdr_copy_from_mapping num iters for each size: %ld\n", num_read_iters);
    if (table(OP_GDR_FROM, &cx, rounded, num_read_iters, pattern, check, &errors)) {
        return 1;
    }

    bench_teardown(g, mh, map_d_ptr, rounded, &b);
    free(host);
    free(pattern);
    free(check);
    return bench_exit_status(errors);
}
