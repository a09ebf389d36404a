/*
 * gdrcopy_copybw: bandwidth of gdr_copy_to_mapping / gdr_copy_from_mapping through a mapping
 * of GPU memory. Options, defaults and output follow gdrcopy 2.6's copybw. Unlike a pure
 * benchmark it also checks the data: what was written is read back through CUDA and through
 * the mapping, and any mismatch ends the program with status 1 (in a simulated GPU the timings
 * mean little; the data must still be right).
 */
#define _GNU_SOURCE
#include "common.h"

#include <string.h>
#include <unistd.h>

static size_t round_down_pow2(size_t x)
{
    size_t p = 1;
    while (p <= x / 2) {
        p *= 2;
    }
    return x ? p : 0;
}

static void usage(const char *prog)
{
    printf("Usage: %s [-h][-s <size>][-c <size>][-o <offset>][-d <gpu>][-w <iters>][-r <iters>][-a <fn>][-l][-M <type>]\n", prog);
    printf("  -s <size>    buffer allocation size (default 131072)\n");
    printf("  -c <size>    copy size (default: the buffer size; with -l the upper bound)\n");
    printf("  -o <offset>  copy offset in bytes, a multiple of 4 (default 0)\n");
    printf("  -l           run copy sizes 1, 2, 4, ... below the copy size\n");
    printf("  -d <gpu>     GPU ordinal (default 0)\n");
    printf("  -w <iters>   write iterations (default 10000)\n");
    printf("  -r <iters>   read iterations (default 100)\n");
    printf("  -a <fn>      GPU allocator: cuMemAlloc (default) or cuMemCreate\n");
    printf("  -M <type>    mapping type requested from gdr_map_v2: default, wc, cache, device\n");
    printf("  -h           this help\n");
}

int main(int argc, char **argv)
{
    size_t size = 128 * 1024, copy_size = 0, copy_offset = 0;
    long num_write_iters = 10000, num_read_iters = 100;
    int dev_id = 0, do_loop = 0, map_flag = GDR_MAP_FLAG_DEFAULT;
    gpu_alloc_kind_t alloc = GPU_ALLOC_CUMEMALLOC;
    int c;
    while ((c = getopt(argc, argv, "hs:c:o:d:w:r:a:lM:")) != -1) {
        switch (c) {
        case 's': size = (size_t)parse_long("-s", optarg); break;
        case 'c': copy_size = (size_t)parse_long("-c", optarg); break;
        case 'o': copy_offset = (size_t)parse_long("-o", optarg); break;
        case 'd': dev_id = (int)parse_long("-d", optarg); break;
        case 'w': num_write_iters = parse_long("-w", optarg); break;
        case 'r': num_read_iters = parse_long("-r", optarg); break;
        case 'l': do_loop = 1; break;
        case 'a': if (parse_alloc_option(optarg, &alloc)) return 1; break;
        case 'M': if (parse_map_option(optarg, &map_flag)) return 1; break;
        case 'h': usage(argv[0]); return 0;
        default: fprintf(stderr, "Invalid option\n"); usage(argv[0]); return 1;
        }
    }
    if (copy_size == 0) {
        copy_size = size;
    }
    if (copy_offset % 4 != 0) {
        fprintf(stderr, "copy offset (%zu) must be a multiple of 4\n", copy_offset);
        return 1;
    }
    if (copy_offset + copy_size > size) {
        fprintf(stderr, "copy offset (%zu) + copy size (%zu) exceeds the buffer size (%zu)\n", copy_offset,
                copy_size, size);
        return 1;
    }
    if (size == 0 || num_write_iters < 0 || num_read_iters < 0) {
        fprintf(stderr, "sizes must be positive and iteration counts non-negative\n");
        return 1;
    }

    CUdevice dev;
    CUcontext ctx;
    if (bench_select_device(dev_id, alloc, &dev, &ctx))
        return 1;

    printf("testing size: %zu\n", size);
    printf("rounded size: %zu\n", (size_t)ROUND_UP(size, GPU_PAGE_SIZE));
    printf("gpu alloc fn: %s\n", gpu_alloc_name(alloc));
    gpu_buf_t b;
    ASSERTDRV(gpu_mem_alloc(&b, size, alloc, dev));
    printf("device ptr: 0x%llx\n", (unsigned long long)b.ptr);

    unsigned char *init_buf = malloc(size), *read_buf = malloc(size), *check = malloc(size);
    ASSERT(init_buf && read_buf && check);
    fill_pattern(init_buf, size, 42);
    ASSERTDRV(cuMemsetD8(b.ptr, 0, size));

    gdr_t g = bench_gdr_open();
    if (!g) {
        return 1;
    }
    gdr_mh_t mh;
    ASSERT_EQ(gdr_pin_buffer(g, b.ptr, size, 0, 0, &mh), 0);
    ASSERT_NEQ(mh.h, 0);
    void *map_d_ptr = NULL;
    gdr_info_t info;
    uint32_t *buf_ptr = (uint32_t *)bench_map(g, mh, b.ptr, size, map_flag, &map_d_ptr, &info);
    printf("user-space pointer:%p\n", (void *)buf_ptr);

    int errors = 0;
    /* With -l: 1, 2, 4, ... strictly below the largest power of two <= min(copy size, buffer size). */
    size_t bound = round_down_pow2(copy_size < size ? copy_size : size);
    size_t first = do_loop ? 1 : copy_size;
    for (size_t cs = first; do_loop ? cs < bound : cs == copy_size; cs = do_loop ? cs * 2 : 0) {
        char *dst = (char *)buf_ptr + copy_offset;
        printf("writing test, size=%zu offset=%zu num_iters=%ld\n", cs, copy_offset, num_write_iters);
        double t0 = now_s();
        for (long i = 0; i < num_write_iters; i++) {
            int ret = gdr_copy_to_mapping(mh, dst, init_buf, cs);
            if (ret) {
                fprintf(stderr, "gdr_copy_to_mapping failed: %d\n", ret);
                return 1;
            }
        }
        double dt = now_s() - t0;
        printf("write BW: %fMB/s\n", dt > 0 ? (double)cs * (double)num_write_iters / dt / (1024.0 * 1024.0) : 0.0);

        /* Check: the GPU holds what was written (at least one write ran). */
        if (num_write_iters > 0) {
            memset(check, 0xEE, size);
            ASSERTDRV(cuMemcpyDtoH(check, b.ptr + copy_offset, cs));
            long bad = first_mismatch(init_buf, check, cs);
            if (bad >= 0) {
                fprintf(stderr, "ERROR: data mismatch after writing %zu bytes at offset %zu: byte %ld\n", cs,
                        copy_offset, bad);
                errors++;
            }
        } else {
            ASSERTDRV(cuMemcpyHtoD(b.ptr + copy_offset, init_buf, cs));
        }

        printf("reading test, size=%zu offset=%zu num_iters=%ld\n", cs, copy_offset, num_read_iters);
        memset(read_buf, 0xCD, size);
        t0 = now_s();
        for (long i = 0; i < num_read_iters; i++) {
            int ret = gdr_copy_from_mapping(mh, read_buf, dst, cs);
            if (ret) {
                fprintf(stderr, "gdr_copy_from_mapping failed: %d\n", ret);
                return 1;
            }
        }
        dt = now_s() - t0;
        printf("read BW: %fMB/s\n", dt > 0 ? (double)cs * (double)num_read_iters / dt / (1024.0 * 1024.0) : 0.0);
        if (num_read_iters > 0) {
            long bad = first_mismatch(init_buf, read_buf, cs);
            if (bad >= 0) {
                fprintf(stderr, "ERROR: data mismatch after reading %zu bytes at offset %zu: byte %ld\n", cs,
                        copy_offset, bad);
                errors++;
            }
        }
    }

    bench_teardown(g, mh, map_d_ptr, size, &b);
    free(init_buf);
    free(read_buf);
    free(check);
    return bench_exit_status(errors);
}
