/*
 * gdrcopy_apiperf: average time of gdr_pin_buffer, gdr_map_v2, gdr_get_info, gdr_unmap and
 * gdr_unpin_buffer for buffer sizes 64 KiB, 128 KiB, ... up to -s, plus a 10-bin histogram of
 * the pin latency. Options, defaults and output follow gdrcopy 2.6's apiperf. Each size also
 * checks the data once through a fresh mapping (exit 1 on a mismatch).
 */
#define _GNU_SOURCE
#include "common.h"

#include <string.h>
#include <unistd.h>

#define NBINS 10

static void usage(const char *prog)
{
    printf("Usage: %s [-h][-s <max-size>][-d <gpu>][-n <iters>][-w <iters>][-a <fn>][-M <type>]\n", prog);
    printf("  -s <size>    maximum buffer size (default 16777216)\n");
    printf("  -d <gpu>     GPU ordinal (default 0)\n");
    printf("  -n <iters>   timed iterations per size (default 100)\n");
    printf("  -w <iters>   warm-up iterations per size (default 10)\n");
    printf("  -a <fn>      GPU allocator: cuMemAlloc (default) or cuMemCreate\n");
    printf("  -M <type>    mapping type requested from gdr_map_v2: default, wc, cache, device\n");
    printf("  -h           this help\n");
}

#define CHECK_GDR(call)                                                                            \
    do {                                                                                           \
        int _ret = (call);                                                                         \
        if (_ret != 0) {                                                                           \
            fprintf(stderr, "%s failed: %d (%s)\n", #call, _ret, strerror(_ret));                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    size_t max_size = 16 * 1024 * 1024;
    long iters = 100, warmup = 10;
    int dev_id = 0, map_flag = GDR_MAP_FLAG_DEFAULT;
    gpu_alloc_kind_t alloc = GPU_ALLOC_CUMEMALLOC;
    int c;
    while ((c = getopt(argc, argv, "hs:d:n:w:a:M:")) != -1) {
        switch (c) {
        case 's': max_size = (size_t)parse_long("-s", optarg); break;
        case 'd': dev_id = (int)parse_long("-d", optarg); break;
        case 'n': iters = parse_long("-n", optarg); break;
        case 'w': warmup = parse_long("-w", optarg); break;
        case 'a': if (parse_alloc_option(optarg, &alloc)) return 1; break;
        case 'M': if (parse_map_option(optarg, &map_flag)) return 1; break;
        case 'h': usage(argv[0]); return 0;
        default: fprintf(stderr, "Invalid option\n"); usage(argv[0]); return 1;
        }
    }
    if (iters <= 0 || warmup < 0 || max_size < GPU_PAGE_SIZE) {
        fprintf(stderr, "need -n > 0, -w >= 0 and -s >= %lu\n", GPU_PAGE_SIZE);
        return 1;
    }

    CUdevice dev;
    CUcontext ctx;
    if (bench_select_device(dev_id, alloc, &dev, &ctx))
        return 1;

    gdr_t g = bench_gdr_open();
    if (!g) {
        return 1;
    }
    double *pin_t = calloc((size_t)iters, sizeof(double));
    ASSERT(pin_t);
    int errors = 0;

    for (size_t size = GPU_PAGE_SIZE; size <= max_size; size *= 2) {
        gpu_buf_t b;
        ASSERTDRV(gpu_mem_alloc(&b, size, alloc, dev));
        unsigned char *pattern = malloc(size), *back = malloc(size);
        ASSERT(pattern && back);

        /* Data check, outside the timed loops. */
        {
            gdr_mh_t mh;
            void *va = NULL;
            fill_pattern(pattern, size, (uint32_t)size);
            CHECK_GDR(gdr_pin_buffer(g, b.ptr, size, 0, 0, &mh));
            CHECK_GDR(gdr_map_v2(g, mh, &va, size, map_flag));
            CHECK_GDR(gdr_copy_to_mapping(mh, va, pattern, size));
            memset(back, 0xEE, size);
            ASSERTDRV(cuMemcpyDtoH(back, b.ptr, size));
            long bad = first_mismatch(pattern, back, size);
            if (bad < 0) {
                memset(back, 0xCD, size);
                CHECK_GDR(gdr_copy_from_mapping(mh, back, va, size));
                bad = first_mismatch(pattern, back, size);
            }
            if (bad >= 0) {
                fprintf(stderr, "ERROR: data mismatch for size %zu at byte %ld\n", size, bad);
                errors++;
            }
            CHECK_GDR(gdr_unmap(g, mh, va, size));
            CHECK_GDR(gdr_unpin_buffer(g, mh));
        }

        for (long i = 0; i < warmup; i++) {
            gdr_mh_t mh;
            void *va = NULL;
            gdr_info_t info;
            CHECK_GDR(gdr_pin_buffer(g, b.ptr, size, 0, 0, &mh));
            CHECK_GDR(gdr_map_v2(g, mh, &va, size, map_flag));
            CHECK_GDR(gdr_get_info(g, mh, &info));
            CHECK_GDR(gdr_unmap(g, mh, va, size));
            CHECK_GDR(gdr_unpin_buffer(g, mh));
        }

        double sum_pin = 0, sum_map = 0, sum_info = 0, sum_unmap = 0, sum_unpin = 0;
        for (long i = 0; i < iters; i++) {
            gdr_mh_t mh;
            void *va = NULL;
            gdr_info_t info;
            double t0 = now_s();
            CHECK_GDR(gdr_pin_buffer(g, b.ptr, size, 0, 0, &mh));
            double t1 = now_s();
            CHECK_GDR(gdr_map_v2(g, mh, &va, size, map_flag));
            double t2 = now_s();
            CHECK_GDR(gdr_get_info(g, mh, &info));
            double t3 = now_s();
            CHECK_GDR(gdr_unmap(g, mh, va, size));
            double t4 = now_s();
            CHECK_GDR(gdr_unpin_buffer(g, mh));
            double t5 = now_s();
            pin_t[i] = (t1 - t0) * 1e6;
            sum_pin += pin_t[i];
            sum_map += (t2 - t1) * 1e6;
            sum_info += (t3 - t2) * 1e6;
            sum_unmap += (t4 - t3) * 1e6;
            sum_unpin += (t5 - t4) * 1e6;
        }
        double n = (double)iters;
        printf("Size(B)\tpin.Time(us)\tmap.Time(us)\tget_info.Time(us)\tunmap.Time(us)\tunpin.Time(us)\n");
        printf("%zu\t%f\t%f\t%f\t%f\t%f\n", size, sum_pin / n, sum_map / n, sum_info / n, sum_unmap / n,
               sum_unpin / n);

        /* Histogram of the pin latency: 10 equal bins between the fastest and slowest call. */
        double lo = pin_t[0], hi = pin_t[0];
        for (long i = 1; i < iters; i++) {
            lo = pin_t[i] < lo ? pin_t[i] : lo;
            hi = pin_t[i] > hi ? pin_t[i] : hi;
        }
        long bins[NBINS] = {0};
        double width = (hi - lo) / NBINS;
        for (long i = 0; i < iters; i++) {
            int k = width > 0 ? (int)((pin_t[i] - lo) / width) : 0;
            bins[k >= NBINS ? NBINS - 1 : k]++;
        }
        printf("Histogram of gdr_pin_buffer latency for %zu bytes\n", size);
        for (int k = 0; k < NBINS; k++) {
            printf("[%f\t-\t%f]\t%ld\n", lo + width * k, lo + width * (k + 1), bins[k]);
        }
        printf("\n");

        free(pattern);
        free(back);
        ASSERTDRV(gpu_mem_free(&b));
        if (size > max_size / 2) {
            break;
        }
    }
    free(pin_t);
    bench_close(g);
    return bench_exit_status(errors);
}
