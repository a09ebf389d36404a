// A/B of two libgdrapi builds in one process: gdr_copy_{from,to}_mapping of 1/2/4/8 bytes through
// dlsym, as C consumers call them; nine interleaved rounds (the order swapped every round), median
// ns per call per library, direction and size. Both libraries map the same device memory.
//
// Build and run (simulated libcuda with dma-buf export, see docs/performance.md):
//   cc -O2 -o ab ab_public_copy.c -ldl
//   export LD_LIBRARY_PATH=<dir with cudasim as libcuda.so.1> CUDASIM_DMABUF=1
//   export CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1
//   taskset -c 3 ./ab A/libgdrapi.so B/libgdrapi.so [calls per cell, default 2000000]
#include "public_copy_c.h"

static char host[8192] __attribute__((aligned(4096)));

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s A/libgdrapi.so B/libgdrapi.so [calls per cell]\n", argv[0]);
        return 2;
    }
    struct lib_mapping lib[2] = { map_with(argv[1]), map_with(argv[2]) };
    enum { R = 9 };
    long n = argc > 3 ? atol(argv[3]) : 2000000;
    if (n < 1)
        die("calls per cell");
    int sizes[] = { 1, 2, 4, 8 };
    static double t[2][2][4][R];
    char *h = host + 2048; // not 4 KiB-aliased with the mapping's offset 0
    for (int r = 0; r < R; r++)
        for (int s = 0; s < 4; s++)
            for (int dir = 0; dir < 2; dir++)
                for (int l = 0; l < 2; l++) {
                    int k = (r & 1) ? 1 - l : l;
                    copy_fn volatile fv = dir ? lib[k].to : lib[k].from;
                    copy_fn g = fv;
                    size_t sz = sizes[s];
                    char *x = dir ? lib[k].va : h, *y = dir ? h : lib[k].va;
                    if (g(lib[k].mh, x, y, sz))
                        die("copy");
                    double a = now_ns();
                    for (long i = 0; i < n; i++)
                        g(lib[k].mh, x, y, sz);
                    t[k][dir][s][r] = (now_ns() - a) / n;
                }
    for (int dir = 0; dir < 2; dir++)
        for (int s = 0; s < 4; s++) {
            double m[2];
            for (int k = 0; k < 2; k++)
                m[k] = median(t[k][dir][s], R);
            printf("%s %d B: A %.2f ns  B %.2f ns  (B-A %+.2f)\n", dir ? "to  " : "from", sizes[s], m[0], m[1],
                   m[1] - m[0]);
        }
    return 0;
}
