// Where a public copy's nanoseconds go: C models of the library's 1-8-byte fast path, built up one
// layer at a time, next to the library's own gdr_copy_* calls, in one process, on one mapping.
//
//   inline     the access and its SFENCE in the timing loop, no call (the copy bench's `dispatch`)
//   call       the same behind a C call shaped like gdr_copy_*, through a function pointer: one
//              size-and-alignment test, the width, the access, the fence (`dispatch (C call)`)
//   +checks    plus the library's checks: the handle against the thread's words, the window, the
//              host pointer
//   +announce  plus the grace-period announcement: the handle stored to the thread's line before
//              the access and left there (what the copy/unmap safety promise costs; see
//              src/parking.rs for why no second store is needed)
//   +clear     the design before that: also 0 stored to the line after the fence
//   library    the library's gdr_copy_from_mapping / gdr_copy_to_mapping
//
// The models lay out their data as the library does (a 24-byte initial-exec TLS block, 128-byte
// handle slots, a 64-byte line per thread) and their branches too (8 bytes straight through, 4
// bytes one jump away, 1 and 2 out of line), so "library - +announce" is what the library's code
// adds beyond its design, and "+announce - call" what the design costs. Nine interleaved rounds,
// medians in ns per call.
//
// Build and run as ab_public_copy.c (see there):
//   cc -O2 -o floor public_copy_floor.c -ldl
//   taskset -c 3 ./floor path/to/libgdrapi.so [calls per cell, default 2000000]
#include "public_copy_c.h"

#include <string.h>

static char host[8192] __attribute__((aligned(4096)));

struct slot {
    uint64_t other[14];
    uint64_t addr, lim; // the fast-path window: [addr, addr + lim) holds every 1-8-byte start
} __attribute__((aligned(128)));
static struct slot slots[16];

struct line {
    volatile uintptr_t active;
} __attribute__((aligned(64)));
static struct line lines[8];

struct words {
    struct line *line;
    uintptr_t base, limit;
};
static __thread struct words tw __attribute__((tls_model("initial-exec")));

__attribute__((noinline)) static int general(void) { return 22; }

// One naturally aligned access of n = 1, 2, 4 or 8 bytes, laid out as the library's.
static inline __attribute__((always_inline)) void access1(int to, char *dev, char *hst, size_t n) {
#define ONE(T) \
    do { \
        if (to) \
            *(volatile T *)dev = *(volatile const T *)hst; \
        else \
            *(volatile T *)hst = *(volatile const T *)dev; \
    } while (0)
    if (__builtin_expect(n >= 4, 1)) {
        if (__builtin_expect(!(n & 4), 1))
            ONE(uint64_t);
        else
            ONE(uint32_t);
    } else if (n & 2) {
        ONE(uint16_t);
    } else {
        ONE(uint8_t);
    }
#undef ONE
}

// `level` 0: call, 1: +checks, 2: +announce, 3: +clear; `to`: direction. Both are constants in
// each wrapper.
static inline __attribute__((always_inline)) int model(int level, int to, gdr_mh_t mh, char *dev, char *hst,
                                                        size_t n) {
    volatile uintptr_t *line = NULL;
    if (level >= 1) {
        struct words *w = &tw;
        uintptr_t i = mh.h - w->base;
        i = (i >> 7) | (i << 57);
        if (__builtin_expect(i >= w->limit, 0))
            return general();
        if (level >= 2) {
            line = &w->line->active;
            *line = mh.h;
            __asm__ volatile("" ::: "memory");
        }
        const struct slot *s = (const struct slot *)mh.h;
        if (__builtin_expect(!hst || (uintptr_t)dev - s->addr >= s->lim, 0)) {
            if (level >= 3)
                *line = 0;
            return general();
        }
    }
    if (__builtin_expect(n - 1 < 8 && !((n | (uintptr_t)dev) & (n - 1)), 1)) {
        access1(to, dev, hst, n);
        __builtin_ia32_sfence();
        if (level >= 3)
            *line = 0;
        return 0;
    }
    if (level >= 3)
        *line = 0;
    return general();
}

#define WRAP(name, level) \
    __attribute__((noinline)) static int name##_from(gdr_mh_t mh, void *h, const void *d, size_t n) { \
        return model(level, 0, mh, (char *)d, h, n); \
    } \
    __attribute__((noinline)) static int name##_to(gdr_mh_t mh, void *d, const void *h, size_t n) { \
        return model(level, 1, mh, d, (char *)h, n); \
    }
WRAP(call, 0)
WRAP(checks, 1)
WRAP(announce, 2)
WRAP(clear, 3)

enum { INLINE, CALL, CHECKS, ANNOUNCE, CLEAR, LIBRARY, VARIANTS };
static const char *names[VARIANTS] = { "inline", "call", "+checks", "+announce", "+clear", "library" };

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/libgdrapi.so [calls per cell]\n", argv[0]);
        return 2;
    }
    struct lib_mapping lib = map_with(argv[1]);
    tw.line = &lines[3];
    tw.base = (uintptr_t)slots;
    tw.limit = 16;
    slots[5].addr = (uintptr_t)lib.va;
    slots[5].lim = 65536 - 7;
    gdr_mh_t model_mh = { (uintptr_t)&slots[5] };
    copy_fn fns[2][VARIANTS] = {
        { NULL, call_from, checks_from, announce_from, clear_from, lib.from },
        { NULL, call_to, checks_to, announce_to, clear_to, lib.to },
    };
    enum { R = 9 };
    long iters = argc > 2 ? atol(argv[2]) : 2000000;
    if (iters < 1)
        die("calls per cell");
    int sizes[] = { 1, 2, 4, 8 };
    static double t[2][4][VARIANTS][R];
    char *h = host + 2048; // not 4 KiB-aliased with the mapping's offset 0
    memset(host, 1, sizeof host);
    for (int r = 0; r < R; r++)
        for (int s = 0; s < 4; s++)
            for (int dir = 0; dir < 2; dir++)
                for (int j = 0; j < VARIANTS; j++) {
                    int v = (j + r) % VARIANTS; // a different order every round
                    size_t n = sizes[s];
                    volatile size_t vn = n;
                    double a;
                    if (v == INLINE) {
                        n = vn; // as unknown to the compiler as the calls' sizes
                        a = now_ns();
                        for (long i = 0; i < iters; i++) {
                            char *d = lib.va;
                            __asm__ volatile("" : "+r"(d)); // a fresh pointer: no hoisting
                            if (n - 1 < 8 && !((n | (uintptr_t)d) & (n - 1)))
                                access1(dir, d, h, n);
                            __builtin_ia32_sfence();
                        }
                    } else {
                        copy_fn volatile fv = fns[dir][v];
                        copy_fn f = fv;
                        gdr_mh_t mh = v == LIBRARY ? lib.mh : model_mh;
                        char *x = dir ? lib.va : h, *y = dir ? h : lib.va;
                        // Once per cell, untimed: the call returns 0 and moves exactly its bytes.
                        for (size_t b = 0; b < 8; b++)
                            h[b] = (char)(r * 31 + s * 7 + v * 3 + b + 1), lib.va[b] = (char)~h[b];
                        if (f(mh, x, y, n) || memcmp(h, lib.va, n) || h[n] == lib.va[n])
                            die(names[v]);
                        a = now_ns();
                        for (long i = 0; i < iters; i++)
                            f(mh, x, y, n);
                    }
                    t[dir][s][v][r] = (now_ns() - a) / iters;
                }
    printf("median ns per call (%d rounds of %ld)\n", R, iters);
    printf("%-9s", "");
    for (int v = 0; v < VARIANTS; v++)
        printf(" %9s", names[v]);
    printf("   library-call  +announce-+checks  +clear-+announce  library-+announce\n");
    for (int dir = 0; dir < 2; dir++)
        for (int s = 0; s < 4; s++) {
            double m[VARIANTS];
            for (int v = 0; v < VARIANTS; v++)
                m[v] = median(t[dir][s][v], R);
            printf("%s %d B", dir ? "to  " : "from", sizes[s]);
            for (int v = 0; v < VARIANTS; v++)
                printf(" %9.2f", m[v]);
            printf("   %+12.2f  %+17.2f  %+16.2f  %+17.2f\n", m[LIBRARY] - m[CALL], m[ANNOUNCE] - m[CHECKS],
                   m[CLEAR] - m[ANNOUNCE], m[LIBRARY] - m[ANNOUNCE]);
        }
    return 0;
}
