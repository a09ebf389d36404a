// Shared by the C benches of the public copy calls (ab_public_copy.c, public_copy_floor.c): a
// device allocation from the simulated (or real) libcuda, a library loaded with dlopen and one
// mapping of that allocation through it, a clock, a median.
#ifndef PUBLIC_COPY_C_H
#define PUBLIC_COPY_C_H
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned long h; } gdr_mh_t;
typedef int (*copy_fn)(gdr_mh_t, void *, const void *, size_t);

// One library's copy calls on its own mapping of the shared allocation.
struct lib_mapping {
    copy_fn from, to;
    gdr_mh_t mh;
    char *va;
};

static inline double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline void die(const char *what) {
    fprintf(stderr, "%s failed\n", what);
    exit(1);
}

// 64 KiB of device memory, 64 KiB aligned (what gdr_pin_buffer wants), allocated once.
static inline uint64_t device_buffer(void) {
    static uint64_t d;
    if (d)
        return d;
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cu)
        die("dlopen(libcuda.so.1)");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cu, "cuInit");
    int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
    int (*set_current)(void *) = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
    int (*alloc)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(cu, "cuMemAlloc_v2");
    void *ctx;
    if (!init || !retain || !set_current || !alloc || init(0) || retain(&ctx, 0) || set_current(ctx) ||
        alloc(&d, 1 << 20))
        die("CUDA setup");
    d = (d + 65535) & ~65535ull;
    return d;
}

// Loads the library at `path` on its own (RTLD_LOCAL: two builds can sit side by side) and maps
// the shared allocation through it.
static inline struct lib_mapping map_with(const char *path) {
    uint64_t d = device_buffer();
    void *g = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g)
        die(path);
    void *(*open)(void) = (void *(*)(void))dlsym(g, "gdr_open");
    int (*pin)(void *, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *) =
        (int (*)(void *, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *))dlsym(g, "gdr_pin_buffer");
    int (*map)(void *, gdr_mh_t, void **, size_t) = (int (*)(void *, gdr_mh_t, void **, size_t))dlsym(g, "gdr_map");
    struct lib_mapping m;
    void *gg = open ? open() : NULL;
    if (!gg || !pin || !map || pin(gg, d, 65536, 0, 0, &m.mh) || map(gg, m.mh, (void **)&m.va, 65536))
        die("gdr_open/gdr_pin_buffer/gdr_map");
    m.from = (copy_fn)dlsym(g, "gdr_copy_from_mapping");
    m.to = (copy_fn)dlsym(g, "gdr_copy_to_mapping");
    return m;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Median of `v[0..n)` (sorts `v`).
static inline double median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return v[n / 2];
}

#endif
