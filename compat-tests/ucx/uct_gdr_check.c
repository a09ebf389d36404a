/*
 * Data check of UCX's gdr_copy transport over our libgdrapi, written as a UCX user writes a UCT
 * program: find the gdr_copy component, open its memory domain and interface, register GPU memory
 * (cuMemAlloc), pack and unpack its remote key, then put_short/get_short at many offsets and
 * sizes. Every byte is checked through the CUDA driver (cuMemcpyDtoH/HtoD), never through the
 * mapping under test, with poisoned margins around each window so that a copy that writes too
 * much, too little or to the wrong place fails.
 *
 * Phases:
 *   1. one registration of the whole buffer: random and edge offsets/sizes, put then get;
 *   2. registrations of sub-ranges at odd addresses (the rkey's vaddr/bar_ptr arithmetic);
 *   3. free and reallocate: cuMemFree of a registered (cached) buffer, cuMemAlloc again, register
 *      and check again. UCX's registration cache learns of the free only through its CUDA memory
 *      hooks; a stale cache entry would send the data to the freed memory, and the check fails.
 *
 *   uct_gdr_check [--iters N] [--seed S] [--size BYTES] [--expect-no-gdr]
 *
 * --expect-no-gdr: pass only if the gdr_copy component offers no memory domain (gdr_open fails).
 * Prints "uct_gdr_check: OK ..." on success; exits 1 at the first wrong byte, 2 on setup errors,
 * 77 when the environment lacks what the check needs (a CUDA device).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#define MARGIN 256

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    /* xorshift64*: reproducible from --seed. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rng() >> 56);
}

static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("uct_gdr_check: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

#define CU(call)                                                                           \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS)                                                            \
            die(2, "%s failed: CUresult %d (line %d)", #call, (int)r_, __LINE__);          \
    } while (0)

#define UCS(call)                                                                          \
    do {                                                                                   \
        ucs_status_t s_ = (call);                                                          \
        if (s_ != UCS_OK)                                                                  \
            die(2, "%s failed: %s (line %d)", #call, ucs_status_string(s_), __LINE__);     \
    } while (0)

struct gdr_tl {
    uct_component_h component;
    uct_md_h md;
    uct_md_attr_t md_attr;
    uct_iface_h iface;
    uct_ep_h ep;
};

struct reg {
    uct_mem_h memh;
    uct_rkey_bundle_t rkey;
};

static uint64_t bytes_checked, puts_done, gets_done;

/* Finds the gdr_copy component; returns 0 and leaves *md_name empty when it offers no MD. */
static int find_gdr_component(uct_component_h *components, unsigned n, uct_component_h *out,
                              char *md_name, size_t md_name_len)
{
    md_name[0] = '\0';
    for (unsigned i = 0; i < n; i++) {
        uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                                                   UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        UCS(uct_component_query(components[i], &attr));
        if (strcmp(attr.name, "gdr_copy") != 0)
            continue;
        *out = components[i];
        if (attr.md_resource_count == 0)
            return 1;
        uct_md_resource_desc_t *res = calloc(attr.md_resource_count, sizeof(*res));
        if (res == NULL)
            die(2, "out of memory");
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        attr.md_resources = res;
        UCS(uct_component_query(components[i], &attr));
        snprintf(md_name, md_name_len, "%s", res[0].md_name);
        free(res);
        return 1;
    }
    return 0;
}

static void open_gdr_tl(uct_component_h component, const char *md_name, uct_worker_h worker,
                        struct gdr_tl *tl)
{
    uct_md_config_t *md_config;
    uct_iface_config_t *iface_config;
    uct_tl_resource_desc_t *tl_res;
    unsigned n_tl, i;

    tl->component = component;
    UCS(uct_md_config_read(component, NULL, NULL, &md_config));
    UCS(uct_md_open(component, md_name, md_config, &tl->md));
    uct_config_release(md_config);
    UCS(uct_md_query(tl->md, &tl->md_attr));
    if (!(tl->md_attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        die(1, "md %s does not register CUDA memory", md_name);

    UCS(uct_md_query_tl_resources(tl->md, &tl_res, &n_tl));
    for (i = 0; i < n_tl; i++)
        if (strcmp(tl_res[i].tl_name, "gdr_copy") == 0)
            break;
    if (i == n_tl)
        die(1, "md %s lists no gdr_copy transport (%u resources)", md_name, n_tl);

    UCS(uct_md_iface_config_read(tl->md, "gdr_copy", NULL, NULL, &iface_config));
    uct_iface_params_t params = {
        .field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                      UCT_IFACE_PARAM_FIELD_FEATURES,
        .open_mode = UCT_IFACE_OPEN_MODE_DEVICE,
        .mode.device = {.tl_name = tl_res[i].tl_name, .dev_name = tl_res[i].dev_name},
        .features = UCT_IFACE_FEATURE_PUT | UCT_IFACE_FEATURE_GET,
    };
    UCS(uct_iface_open(tl->md, worker, &params, iface_config, &tl->iface));
    printf("uct_gdr_check: md %s, transport %s/%s\n", md_name, tl_res[i].tl_name,
           tl_res[i].dev_name);
    uct_config_release(iface_config);
    uct_release_tl_resource_list(tl_res);

    uct_iface_attr_t iface_attr;
    UCS(uct_iface_query(tl->iface, &iface_attr));
    uint64_t need = UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_GET_SHORT |
                    UCT_IFACE_FLAG_CONNECT_TO_IFACE;
    if ((iface_attr.cap.flags & need) != need)
        die(1, "gdr_copy iface lacks put/get short or connect-to-iface (flags 0x%" PRIx64 ")",
            (uint64_t)iface_attr.cap.flags);

    uct_device_addr_t *dev_addr = calloc(1, iface_attr.device_addr_len + 1);
    uct_iface_addr_t *iface_addr = calloc(1, iface_attr.iface_addr_len + 1);
    if (dev_addr == NULL || iface_addr == NULL)
        die(2, "out of memory");
    UCS(uct_iface_get_device_address(tl->iface, dev_addr));
    UCS(uct_iface_get_address(tl->iface, iface_addr));
    uct_ep_params_t ep_params = {
        .field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                      UCT_EP_PARAM_FIELD_IFACE_ADDR,
        .iface = tl->iface,
        .dev_addr = dev_addr,
        .iface_addr = iface_addr,
    };
    UCS(uct_ep_create(&ep_params, &tl->ep));
    free(dev_addr);
    free(iface_addr);
}

static void reg_mem(struct gdr_tl *tl, CUdeviceptr p, size_t len, struct reg *r)
{
    UCS(uct_md_mem_reg(tl->md, (void *)(uintptr_t)p, len, UCT_MD_MEM_ACCESS_ALL, &r->memh));
    void *packed = calloc(1, tl->md_attr.rkey_packed_size + 1);
    if (packed == NULL)
        die(2, "out of memory");
    UCS(uct_md_mkey_pack(tl->md, r->memh, packed));
    UCS(uct_rkey_unpack(tl->component, packed, &r->rkey));
    free(packed);
}

static void dereg_mem(struct gdr_tl *tl, struct reg *r)
{
    UCS(uct_rkey_release(tl->component, &r->rkey));
    UCS(uct_md_mem_dereg(tl->md, r->memh));
}

static void report_mismatch(const char *what, size_t at, uint8_t want, uint8_t got, size_t off,
                            size_t len)
{
    die(1, "%s: byte %zu is 0x%02x, expected 0x%02x (copy at offset %zu, %zu bytes)", what, at,
        got, want, off, len);
}

/*
 * One put and one get of len bytes at dev+off (dev covers [dev, dev+size), registered as r).
 * scratch holds at least len + 2*MARGIN bytes, three times over.
 */
static void check_one(struct gdr_tl *tl, const struct reg *r, CUdeviceptr dev, size_t size,
                      size_t off, size_t len, uint8_t *scratch)
{
    size_t lo = off > MARGIN ? off - MARGIN : 0;
    size_t hi = off + len + MARGIN < size ? off + len + MARGIN : size;
    size_t win = hi - lo;
    uint8_t *before = scratch, *src = scratch + win, *after = scratch + 2 * win;
    uint8_t *dst = after; /* reused for the get: after is free by then */

    /* Put: poison the window through the driver, copy in through gdr_copy, read back. */
    fill_random(before, win);
    CU(cuMemcpyHtoD(dev + lo, before, win));
    fill_random(src, len);
    UCS(uct_ep_put_short(tl->ep, src, (unsigned)len, (uint64_t)(dev + off), r->rkey.rkey));
    puts_done++;
    memset(after, 0, win);
    CU(cuMemcpyDtoH(after, dev + lo, win));
    for (size_t i = 0; i < win; i++) {
        size_t at = lo + i;
        uint8_t want = (at >= off && at < off + len) ? src[at - off] : before[i];
        if (after[i] != want)
            report_mismatch("put", at, want, after[i], off, len);
    }

    /* Get: fresh device bytes, poisoned host margins, copy out through gdr_copy. */
    fill_random(before, win);
    CU(cuMemcpyHtoD(dev + lo, before, win));
    uint8_t guard = (uint8_t)rng();
    memset(dst, guard, win);
    uint8_t *out = dst + (off - lo);
    UCS(uct_ep_get_short(tl->ep, out, (unsigned)len, (uint64_t)(dev + off), r->rkey.rkey));
    gets_done++;
    for (size_t i = 0; i < win; i++) {
        size_t at = lo + i;
        int inside = at >= off && at < off + len;
        uint8_t want = inside ? before[i] : guard;
        if (dst[i] != want)
            report_mismatch(inside ? "get" : "get (host margin)", at, want, dst[i], off, len);
    }
    bytes_checked += 2 * len;
}

static size_t pick_len(size_t room, size_t max_len)
{
    size_t cap = room < max_len ? room : max_len;
    switch (rng() % 4) {
    case 0: return 1 + rng() % (cap < 16 ? cap : 16);      /* tiny */
    case 1: return 1 + rng() % (cap < 512 ? cap : 512);    /* UCP's short range */
    default: return 1 + rng() % cap;
    }
}

int main(int argc, char **argv)
{
    unsigned iters = 400;
    size_t size = (1u << 20) + (64u << 10);
    int expect_no_gdr = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = (unsigned)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 0) | 1;
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--expect-no-gdr"))
            expect_no_gdr = 1;
        else
            die(2, "usage: %s [--iters N] [--seed S] [--size BYTES] [--expect-no-gdr]", argv[0]);
    }
    if (size < 4 * MARGIN)
        die(2, "--size must be at least %d", 4 * MARGIN);

    uct_component_h *components;
    unsigned n_components;
    uct_component_h gdr = NULL;
    char md_name[UCT_MD_NAME_MAX];
    UCS(uct_query_components(&components, &n_components));
    int have = find_gdr_component(components, n_components, &gdr, md_name, sizeof(md_name));
    if (expect_no_gdr) {
        if (have && md_name[0] != '\0')
            die(1, "gdr_copy offers memory domain %s where gdr_open should fail", md_name);
        printf("uct_gdr_check: OK: gdr_copy component %s, no memory domain\n",
               have ? "present" : "absent");
        uct_release_component_list(components);
        return 0;
    }
    if (!have)
        die(1, "UCX has no gdr_copy component (module libuct_cuda_gdrcopy not loaded?)");
    if (md_name[0] == '\0')
        die(1, "the gdr_copy component offers no memory domain (gdr_open failed?)");

    CUdevice cu_dev;
    CUcontext ctx;
    int n_dev = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n_dev) != CUDA_SUCCESS || n_dev < 1)
        die(77, "SKIP: no CUDA device");
    CU(cuDeviceGet(&cu_dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, cu_dev));
    CU(cuCtxSetCurrent(ctx));

    ucs_async_context_t *async;
    uct_worker_h worker;
    UCS(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async));
    UCS(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    struct gdr_tl tl;
    memset(&tl, 0, sizeof(tl));
    open_gdr_tl(gdr, md_name, worker, &tl);

    uint8_t *scratch = malloc(3 * (size + 2 * MARGIN));
    if (scratch == NULL)
        die(2, "out of memory");

    /* Phase 1: the whole buffer, edge cases first, then random offsets and sizes. */
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, size));
    struct reg whole;
    reg_mem(&tl, dev, size, &whole);
    static const size_t edge_off[] = {0, 1, 7, 8, 63, 64, 4095, 4096, 65535, 65536, 65537};
    static const size_t edge_len[] = {1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 65, 127, 128,
                                      255, 256, 4096, 65536, 65537};
    for (size_t a = 0; a < sizeof(edge_off) / sizeof(edge_off[0]); a++)
        for (size_t b = 0; b < sizeof(edge_len) / sizeof(edge_len[0]); b++)
            if (edge_off[a] + edge_len[b] <= size)
                check_one(&tl, &whole, dev, size, edge_off[a], edge_len[b], scratch);
    check_one(&tl, &whole, dev, size, 0, size, scratch);
    check_one(&tl, &whole, dev, size, size - 1, 1, scratch);
    for (unsigned i = 0; i < iters; i++) {
        size_t off = rng() % size;
        size_t len = pick_len(size - off, 128u << 10);
        check_one(&tl, &whole, dev, size, off, len, scratch);
    }
    dereg_mem(&tl, &whole);

    /* Phase 2: registrations of sub-ranges that start and end inside GPU pages. */
    for (unsigned i = 0; i < 16; i++) {
        size_t start = rng() % (size / 2);
        size_t rlen = 1 + rng() % (size - start);
        struct reg sub;
        reg_mem(&tl, dev + start, rlen, &sub);
        for (unsigned j = 0; j < 8; j++) {
            size_t off = start + rng() % rlen;
            size_t len = pick_len(start + rlen - off, 16u << 10);
            check_one(&tl, &sub, dev, size, off, len, scratch);
        }
        dereg_mem(&tl, &sub);
    }

    /* Phase 3: free a buffer the registration cache still holds, allocate again, check again. */
    unsigned reused = 0;
    for (unsigned round = 0; round < 4; round++) {
        CUdeviceptr old = dev;
        CU(cuMemFree(dev));
        CU(cuMemAlloc(&dev, size));
        reused += dev == old;
        struct reg again;
        reg_mem(&tl, dev, size, &again);
        for (unsigned j = 0; j < 16; j++) {
            size_t off = rng() % size;
            check_one(&tl, &again, dev, size, off, pick_len(size - off, 8u << 10), scratch);
        }
        dereg_mem(&tl, &again);
    }
    CU(cuMemFree(dev));

    uct_ep_destroy(tl.ep);
    uct_iface_close(tl.iface);
    uct_md_close(tl.md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_release_component_list(components);
    free(scratch);
    CU(cuDevicePrimaryCtxRelease(cu_dev));
    printf("uct_gdr_check: OK: %" PRIu64 " puts, %" PRIu64 " gets, %" PRIu64
           " bytes verified, 4 free/realloc rounds (%u at the same address)\n",
           puts_done, gets_done, bytes_checked, reused);
    return 0;
}
