// A/B of two libgdrapi builds in one process: gdr_copy_{from,to}_mapping of 1/2/4/8 bytes through
// dlsym, as C consumers call them; nine interleaved rounds (the order swapped every round), median
// ns per call per library, direction and size. Both libraries map the same device memory.
//
// Build and run (simulated libcuda with dma-buf export, see docs/performance.md):
//   cc -O2 -o ab ab_public_copy.c -ldl
//   export LD_LIBRARY_PATH=<dir with cudasim as libcuda.so.1> CUDASIM_DMABUF=1
//   export CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1
//   taskset -c 3 ./ab A/libgdrapi.so B/libgdrapi.so
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <dlfcn.h>
typedef struct { unsigned long h; } gdr_mh_t;
typedef int (*fn_t)(gdr_mh_t, void *, const void *, size_t);
static char host[8192] __attribute__((aligned(4096)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static uint64_t d;
static void lib(const char *path, fn_t *from, fn_t *to, gdr_mh_t *mh, char **va) {
    void *g = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *(*open)(void) = dlsym(g, "gdr_open");
    int (*pin)(void *, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *) = dlsym(g, "gdr_pin_buffer");
    int (*map)(void *, gdr_mh_t, void **, size_t) = dlsym(g, "gdr_map");
    void *gg = open();
    if (!gg || pin(gg, d, 65536, 0, 0, mh) || map(gg, *mh, (void **)va, 65536)) { puts("setup failed"); exit(1); }
    *from = (fn_t)dlsym(g, "gdr_copy_from_mapping"); *to = (fn_t)dlsym(g, "gdr_copy_to_mapping");
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s A/libgdrapi.so B/libgdrapi.so\n", argv[0]); return 2; }
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    int (*cuInit)(unsigned) = dlsym(cu, "cuInit");
    int (*retain)(void **, int) = dlsym(cu, "cuDevicePrimaryCtxRetain");
    int (*setc)(void *) = dlsym(cu, "cuCtxSetCurrent");
    int (*alloc)(uint64_t *, size_t) = dlsym(cu, "cuMemAlloc_v2");
    void *ctx; cuInit(0); retain(&ctx, 0); setc(ctx); alloc(&d, 1 << 20); d = (d + 65535) & ~65535ull;
    fn_t f[2][2]; gdr_mh_t mh[2]; char *va[2];
    lib(argv[1], &f[0][0], &f[0][1], &mh[0], &va[0]);
    lib(argv[2], &f[1][0], &f[1][1], &mh[1], &va[1]);
    enum { R = 9 }; long n = 2000000; int sizes[] = { 1, 2, 4, 8 };
    static double t[2][2][4][R];
    char *h = host + 2048;
    for (int r = 0; r < R; r++)
        for (int s = 0; s < 4; s++)
            for (int dir = 0; dir < 2; dir++)
                for (int l = 0; l < 2; l++) {
                    int k = (r & 1) ? 1 - l : l;
                    fn_t volatile fv = f[k][dir]; fn_t g = fv; size_t sz = sizes[s];
                    char *x = dir ? va[k] : h, *y = dir ? h : va[k];
                    if (g(mh[k], x, y, sz)) { puts("copy failed"); exit(1); }
                    double a = now();
                    for (long i = 0; i < n; i++) g(mh[k], x, y, sz);
                    t[k][dir][s][r] = (now() - a) / n;
                }
    for (int dir = 0; dir < 2; dir++)
        for (int s = 0; s < 4; s++) {
            double m[2];
            for (int k = 0; k < 2; k++) { qsort(t[k][dir][s], R, sizeof(double), cmp); m[k] = t[k][dir][s][R / 2]; }
            printf("%s %d B: A %.2f ns  B %.2f ns  (B-A %+.2f)\n", dir ? "to  " : "from", sizes[s], m[0], m[1], m[1] - m[0]);
        }
    return 0;
}
