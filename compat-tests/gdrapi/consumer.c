/*
 * consumer.c: uses libgdrapi the way its real consumers do, and asserts every documented failure.
 *
 * Built three ways by run.sh:
 *   -DCONSUMER_DLOPEN   as NCCL does: dlopen("libgdrapi.so") and dlopen("libgdrapi.so.2") with
 *                       RTLD_NOW, dlsym of each entry point, version checks;
 *   (default)           as UCX does: linked with -lgdrapi (pkg-config) or statically (libgdrapi.a).
 *
 * What it checks:
 *   - version queries (gdr_runtime_get_version >= 2.1, equal to the header's macros);
 *   - gdr_open: on a machine without /dev/gdrdrv it returns NULL without crashing, prints the reason
 *     on stderr when GDRCOPY_ENABLE_LOGGING is set, and prints nothing when it is not;
 *   - NULL and invalid arguments to every exported function, each answered with the errno that
 *     docs/return-values.md documents (never a crash);
 *   - with /dev/gdrdrv (the VM): the same with a live gdr_t, and, when /dev/gpusim is there too, with
 *     real pinned buffers: mapping-type requests, double map/unmap, copies outside the mapping,
 *     stale and foreign handles, data written through gdr_copy_to_mapping as the GPU sees it.
 *
 * Environment: EXPECT_OPEN=fail|ok|any (default any), EXPECT_LIB=<path> (dlopen mode: the file the
 * loaded library must resolve to).  Exit status 0 only if every check passed; 2 = unusable setup.
 */
#define _GNU_SOURCE
#include <gdrapi.h>
#include <gdrconfig.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef CONSUMER_DLOPEN
#include <dlfcn.h>
#endif
#ifdef HAVE_GPUSIM
#include "gpusim_uapi.h"
#endif

/* The pre-2.4 struct that the exported gdr_get_info symbol fills (NCCL still declares this one). */
struct gdr_info_v1 {
    uint64_t va;
    uint64_t mapped_size;
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
};

/* Every exported function, reached through pointers so that both build modes share the checks. */
struct api {
    gdr_t (*open)(void);
    int (*close)(gdr_t);
    int (*pin_buffer)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *);
    int (*pin_buffer_v2)(gdr_t, unsigned long, size_t, uint32_t, gdr_mh_t *);
    int (*unpin_buffer)(gdr_t, gdr_mh_t);
    int (*get_callback_flag)(gdr_t, gdr_mh_t, int *);
    int (*get_info_v2)(gdr_t, gdr_mh_t, gdr_info_v2_t *);
    int (*get_info_v1)(gdr_t, gdr_mh_t, struct gdr_info_v1 *);
    int (*map)(gdr_t, gdr_mh_t, void **, size_t);
    int (*map_v2)(gdr_t, gdr_mh_t, void **, size_t, int);
    int (*unmap)(gdr_t, gdr_mh_t, void *, size_t);
    int (*copy_to_mapping)(gdr_mh_t, void *, const void *, size_t);
    int (*copy_from_mapping)(gdr_mh_t, void *, const void *, size_t);
    void (*runtime_get_version)(int *, int *);
    int (*driver_get_version)(gdr_t, int *, int *);
    int (*get_attribute)(gdr_t, gdr_attr_t, int *);
    int (*get_mapping_type_string)(gdr_mapping_type_t, const char **);
};

static struct api A;
static int checks, failures;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        checks++;                                                               \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

#define EXPECT_RC(want, call)                                                   \
    do {                                                                        \
        int rc_ = (call);                                                       \
        CHECK(rc_ == (want), "%s returned %d (%s), want %d (%s)", #call, rc_,   \
              rc_ > 0 ? strerror(rc_) : "-", (want), strerror(want));           \
    } while (0)

static void section(const char *name)
{
    printf("# %s\n", name);
    fflush(stdout);
}

#ifdef CONSUMER_DLOPEN
static void *lib;

static void *sym(void *h, const char *name)
{
    void *p;
    dlerror();
    p = dlsym(h, name);
    CHECK(p != NULL, "dlsym(%s): %s", name, dlerror());
    return p;
}

/* Resolve like NCCL (its 11 symbols, RTLD_NOW), then the rest of the 2.6 API. */
static void load_api(void)
{
    void *lib2;
    Dl_info di;
    const char *expect = getenv("EXPECT_LIB");

    section("dlopen libgdrapi.so / libgdrapi.so.2 (RTLD_NOW)");
    lib = dlopen("libgdrapi.so", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "FAIL dlopen(libgdrapi.so): %s\n", dlerror());
        exit(1);
    }
    /* A bare-pointer-to-function cast through memcpy keeps -pedantic quiet about object->function. */
#define LOAD(field, name)                                                       \
    do {                                                                        \
        void *p_ = sym(lib, name);                                              \
        memcpy(&A.field, &p_, sizeof(p_));                                      \
    } while (0)
    /* The set NCCL resolves (src/misc/gdrwrap.cc), in its order. */
    LOAD(open, "gdr_open");
    LOAD(close, "gdr_close");
    LOAD(pin_buffer, "gdr_pin_buffer");
    LOAD(unpin_buffer, "gdr_unpin_buffer");
    LOAD(get_info_v1, "gdr_get_info");
    LOAD(map, "gdr_map");
    LOAD(unmap, "gdr_unmap");
    LOAD(copy_to_mapping, "gdr_copy_to_mapping");
    LOAD(copy_from_mapping, "gdr_copy_from_mapping");
    LOAD(runtime_get_version, "gdr_runtime_get_version");
    LOAD(driver_get_version, "gdr_driver_get_version");
    /* The rest of 2.6. */
    LOAD(pin_buffer_v2, "gdr_pin_buffer_v2");
    LOAD(get_callback_flag, "gdr_get_callback_flag");
    LOAD(get_info_v2, "gdr_get_info_v2");
    LOAD(map_v2, "gdr_map_v2");
    LOAD(get_attribute, "gdr_get_attribute");
    LOAD(get_mapping_type_string, "gdr_get_mapping_type_string");
#undef LOAD
    if (failures)
        exit(1);

    /* Internal helpers of upstream must not leak into our dynamic symbol table. */
    CHECK(dlsym(lib, "gdr_msg") == NULL, "gdr_msg is exported");
    CHECK(dlsym(lib, "memcpy_uncached_store_avx") == NULL, "copy kernels are exported");

    lib2 = dlopen("libgdrapi.so.2", RTLD_NOW);
    CHECK(lib2 != NULL, "dlopen(libgdrapi.so.2): %s", dlerror());
    if (lib2) {
        CHECK(dlsym(lib2, "gdr_open") == dlsym(lib, "gdr_open"),
              "libgdrapi.so and libgdrapi.so.2 resolved to different libraries");
    }

    {
        void *p;
        memcpy(&p, &A.open, sizeof(p));
        if (dladdr(p, &di) && di.dli_fname) {
            char real[PATH_MAX];
            printf("# gdr_open comes from %s\n", di.dli_fname);
            if (expect && *expect) {
                char want[PATH_MAX];
                CHECK(realpath(di.dli_fname, real) && realpath(expect, want) && !strcmp(real, want),
                      "loaded %s, expected %s", di.dli_fname, expect);
            }
        } else {
            CHECK(0, "dladdr(gdr_open) failed");
        }
    }
}
#else
#undef gdr_get_info
int gdr_get_info(gdr_t g, gdr_mh_t handle, struct gdr_info_v1 *info);

static void load_api(void)
{
    A.open = gdr_open;
    A.close = gdr_close;
    A.pin_buffer = gdr_pin_buffer;
    A.pin_buffer_v2 = gdr_pin_buffer_v2;
    A.unpin_buffer = gdr_unpin_buffer;
    A.get_callback_flag = gdr_get_callback_flag;
    A.get_info_v2 = gdr_get_info_v2;
    A.get_info_v1 = gdr_get_info;
    A.map = gdr_map;
    A.map_v2 = gdr_map_v2;
    A.unmap = gdr_unmap;
    A.copy_to_mapping = gdr_copy_to_mapping;
    A.copy_from_mapping = gdr_copy_from_mapping;
    A.runtime_get_version = gdr_runtime_get_version;
    A.driver_get_version = gdr_driver_get_version;
    A.get_attribute = gdr_get_attribute;
    A.get_mapping_type_string = gdr_get_mapping_type_string;
}
#endif

static void check_versions(void)
{
    int major = -1, minor = -1;

    section("gdr_runtime_get_version");
    A.runtime_get_version(&major, &minor);
    CHECK(major == GDR_API_MAJOR_VERSION && minor == GDR_API_MINOR_VERSION,
          "runtime version %d.%d, header says %d.%d", major, minor, GDR_API_MAJOR_VERSION,
          GDR_API_MINOR_VERSION);
    /* NCCL refuses libraries older than 2.1. */
    CHECK(major > 2 || (major == 2 && minor >= 1), "runtime version %d.%d < 2.1", major, minor);
    CHECK(((unsigned)major << MAJOR_VERSION_SHIFT | (unsigned)minor) == GDR_API_VERSION,
          "GDR_API_VERSION disagrees");
    /* NULL out pointers are ignored, one at a time. */
    A.runtime_get_version(NULL, NULL);
    minor = -1;
    A.runtime_get_version(NULL, &minor);
    CHECK(minor == GDR_API_MINOR_VERSION, "minor %d with NULL major", minor);
    major = -1;
    A.runtime_get_version(&major, NULL);
    CHECK(major == GDR_API_MAJOR_VERSION, "major %d with NULL minor", major);
}

static void check_mapping_type_strings(void)
{
    static const char *const names[] = { "None", "Write Combining", "Caching", "Device" };
    const char *s;
    int t;
    const int bad[] = { GDR_MAPPING_TYPE_MAX, -1, 5, 1000, INT_MIN, INT_MAX };
    size_t i;

    section("gdr_get_mapping_type_string");
    for (t = GDR_MAPPING_TYPE_NONE; t < GDR_MAPPING_TYPE_MAX; t++) {
        s = NULL;
        EXPECT_RC(0, A.get_mapping_type_string((gdr_mapping_type_t)t, &s));
        CHECK(s && !strcmp(s, names[t]), "type %d named \"%s\", want \"%s\"", t, s ? s : "(null)",
              names[t]);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = (const char *)&t; /* must stay untouched */
        EXPECT_RC(EINVAL, A.get_mapping_type_string((gdr_mapping_type_t)bad[i], &s));
        CHECK(s == (const char *)&t, "pstr written for bad type %d", bad[i]);
    }
    EXPECT_RC(EINVAL, A.get_mapping_type_string(GDR_MAPPING_TYPE_WC, NULL));
}

/* Captures what the library writes to stderr while `fn` runs. */
static gdr_t open_capturing(char *buf, size_t len)
{
    FILE *tmp = tmpfile();
    int saved, n;
    gdr_t g;

    fflush(stderr);
    if (!tmp) {
        perror("tmpfile");
        exit(2);
    }
    saved = dup(2);
    dup2(fileno(tmp), 2);
    g = A.open();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    n = (int)fread(buf, 1, len - 1, tmp);
    buf[n < 0 ? 0 : n] = '\0';
    fclose(tmp);
    return g;
}

static gdr_t check_open(void)
{
    char log[8192];
    const char *expect = getenv("EXPECT_OPEN");
    int logging = getenv("GDRCOPY_ENABLE_LOGGING") != NULL;
    int have_dev = access("/dev/gdrdrv", F_OK) == 0;
    gdr_t g;

    section("gdr_open");
    g = open_capturing(log, sizeof(log));
    printf("# gdr_open() = %p (/dev/gdrdrv %s, logging %s)\n", (void *)g,
           have_dev ? "present" : "absent", logging ? "on" : "off");
    if (*log)
        printf("# library stderr:\n%s", log);
    if (expect && !strcmp(expect, "fail"))
        CHECK(g == NULL, "gdr_open succeeded but EXPECT_OPEN=fail");
    if (expect && !strcmp(expect, "ok"))
        CHECK(g != NULL, "gdr_open failed but EXPECT_OPEN=ok");
    if (logging) {
        /* Threshold: GDRCOPY_LOG_LEVEL parsed like atoi (non-numeric = 0: everything), default 4
         * (errors only). Logging is on whenever the variable exists, even as "0" or "". */
        const char *lvl_s = getenv("GDRCOPY_LOG_LEVEL");
        int lvl = lvl_s ? atoi(lvl_s) : 4;
        if (lvl > 2)
            CHECK(strstr(log, "INFO: ") == NULL, "INFO lines printed at log level %d", lvl);
        if (lvl > 1)
            CHECK(strstr(log, "DBG:  ") == NULL, "DBG lines printed at log level %d", lvl);
        if (lvl <= 2 && !g && !have_dev)
            CHECK(strstr(log, "INFO: gdrdrv is not installed or loaded") != NULL,
                  "no INFO line about the missing gdrdrv at log level %d", lvl);
        if (lvl <= 1 && g)
            CHECK(strstr(log, "DBG:  ") != NULL, "no DBG line at log level %d", lvl);
    }
    if (!g) {
        if (logging) {
            /* The reason, in upstream's words: the driver could not be opened, and no backend. */
            if (!have_dev) {
                /* Upstream's words exactly: errno and strerror(), nothing more. */
                CHECK(strstr(log, "ERR:  error opening driver (errno=2/No such file or directory)\n") != NULL,
                      "no 'error opening driver (errno=2/No such file or directory)' line in stderr");
            }
            CHECK(strstr(log, "gdrcopy requires gdrdrv or CUDA driver with dmabuf mmap support") != NULL,
                  "no 'requires gdrdrv or CUDA driver' line in stderr");
        } else {
            CHECK(*log == '\0', "gdr_open printed without GDRCOPY_ENABLE_LOGGING");
        }
    } else if (logging) {
        const char *lvl = getenv("GDRCOPY_LOG_LEVEL");
        if (lvl && atoi(lvl) <= 2)
            CHECK(strstr(log, "INFO: Using gdrdrv backend") || strstr(log, "INFO: Using dma-buf backend"),
                  "no 'Using ... backend' line at log level %s", lvl);
    } else {
        CHECK(*log == '\0', "gdr_open printed without GDRCOPY_ENABLE_LOGGING");
    }
    return g;
}

/* Values that are not a live gdr_t / gdr_mh_t. */
static unsigned char fake_gdr[48];
static unsigned char fake_memh[104];

/* Every function with a bad `g` (and a valid everything else); outputs must stay untouched. */
static void check_bad_instance(gdr_t g, gdr_mh_t h, const char *what)
{
    gdr_mh_t out = { 0x5a5a5a5aUL };
    gdr_info_v2_t info;
    struct gdr_info_v1 info1;
    int flag = 77, major = 77, minor = 77, v = 77;
    void *va = (void *)&flag;

    printf("# invalid gdr_t: %s\n", what);
    EXPECT_RC(EINVAL, A.close(g));
    EXPECT_RC(EINVAL, A.pin_buffer(g, 0x10000, 0x10000, 0, 0, &out));
    CHECK(out.h == 0x5a5a5a5aUL, "handle written by failing gdr_pin_buffer");
    EXPECT_RC(EINVAL, A.pin_buffer_v2(g, 0x10000, 0x10000, GDR_PIN_FLAG_DEFAULT, &out));
    EXPECT_RC(EINVAL, A.pin_buffer_v2(g, 0x10000, 0x10000, GDR_PIN_FLAG_FORCE_PCIE, &out));
    CHECK(out.h == 0x5a5a5a5aUL, "handle written by failing gdr_pin_buffer_v2");
    EXPECT_RC(EINVAL, A.unpin_buffer(g, h));
    EXPECT_RC(EINVAL, A.get_callback_flag(g, h, &flag));
    CHECK(flag == 77, "flag written by failing gdr_get_callback_flag");
    memset(&info, 0xa5, sizeof(info));
    EXPECT_RC(EINVAL, A.get_info_v2(g, h, &info));
    CHECK(info.va == 0xa5a5a5a5a5a5a5a5ULL, "info written by failing gdr_get_info_v2");
    memset(&info1, 0xa5, sizeof(info1));
    EXPECT_RC(EINVAL, A.get_info_v1(g, h, &info1));
    CHECK(info1.va == 0xa5a5a5a5a5a5a5a5ULL, "info written by failing gdr_get_info");
    EXPECT_RC(EINVAL, A.map(g, h, &va, 0x10000));
    CHECK(va == (void *)&flag, "va written by failing gdr_map");
    EXPECT_RC(EINVAL, A.map_v2(g, h, &va, 0x10000, GDR_MAP_FLAG_REQ_WC_MAPPING));
    EXPECT_RC(EINVAL, A.map_v2(g, h, &va, 0x10000, 99));
    CHECK(va == (void *)&flag, "va written by failing gdr_map_v2");
    EXPECT_RC(EINVAL, A.unmap(g, h, fake_memh, 0x10000));
    EXPECT_RC(EINVAL, A.driver_get_version(g, &major, &minor));
    CHECK(major == 77 && minor == 77, "version written by failing gdr_driver_get_version");
    /* gdr_get_attribute writes *v = 0 before anything else, as upstream. */
    EXPECT_RC(EINVAL, A.get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v));
    CHECK(v == 0, "*v = %d after failing gdr_get_attribute, want 0", v);
    EXPECT_RC(EINVAL, A.get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v));
}

/* Every function with NULL out pointers; g may be live or not (the pointer is checked first). */
static void check_null_outputs(gdr_t g, gdr_mh_t h)
{
    EXPECT_RC(EINVAL, A.pin_buffer(g, 0x10000, 0x10000, 0, 0, NULL));
    EXPECT_RC(EINVAL, A.pin_buffer_v2(g, 0x10000, 0x10000, 0, NULL));
    EXPECT_RC(EINVAL, A.get_callback_flag(g, h, NULL));
    EXPECT_RC(EINVAL, A.get_info_v2(g, h, NULL));
    EXPECT_RC(EINVAL, A.get_info_v1(g, h, NULL));
    EXPECT_RC(EINVAL, A.map(g, h, NULL, 0x10000));
    EXPECT_RC(EINVAL, A.map_v2(g, h, NULL, 0x10000, GDR_MAP_FLAG_DEFAULT));
    EXPECT_RC(EINVAL, A.get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, NULL));
    {
        int minor = 77, major = 77;
        EXPECT_RC(EINVAL, A.driver_get_version(g, NULL, &minor));
        EXPECT_RC(EINVAL, A.driver_get_version(g, &major, NULL));
        EXPECT_RC(EINVAL, A.driver_get_version(g, NULL, NULL));
        CHECK(major == 77 && minor == 77, "version written with a NULL out pointer");
    }
}

/* Copies need no gdr_t: a handle that is not live is EINVAL whatever the other arguments. */
static void check_bad_handle_copies(gdr_mh_t h, const char *what)
{
    char host[64];
    memset(host, 0x11, sizeof(host));
    printf("# copies with invalid handle: %s\n", what);
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, fake_memh, host, sizeof(host)));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h, host, fake_memh, sizeof(host)));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, fake_memh, host, 0));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h, host, fake_memh, 0));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, NULL, NULL, 16));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h, NULL, NULL, 16));
    CHECK(host[0] == 0x11 && host[63] == 0x11, "host buffer written by a failing copy");
}

static void check_without_instance(void)
{
    const gdr_mh_t handles[] = { { 0 }, { 1 }, { (unsigned long)(uintptr_t)fake_memh }, { ~0UL } };
    size_t i;

    section("invalid gdr_t and handles (no instance needed)");
    check_bad_instance(NULL, handles[0], "NULL");
    check_bad_instance((gdr_t)(uintptr_t)1, handles[1], "0x1");
    check_bad_instance((gdr_t)(void *)fake_gdr, handles[2], "pointer to a zeroed 48-byte struct");
    check_bad_instance((gdr_t)(uintptr_t)~(uintptr_t)0, handles[3], "all ones");
    check_null_outputs(NULL, handles[0]);
    for (i = 0; i < sizeof(handles) / sizeof(handles[0]); i++)
        check_bad_handle_copies(handles[i], i == 2 ? "pointer to a zeroed record" : "integer");
}

/* With a live instance but nothing pinned. */
static void check_live_instance(gdr_t g)
{
    const gdr_mh_t bogus[] = { { 0 }, { 1 }, { (unsigned long)(uintptr_t)fake_memh } };
    int major = -1, minor = -1, v, attr;
    size_t i;

    section("live gdr_t");
    EXPECT_RC(0, A.driver_get_version(g, &major, &minor));
    printf("# gdrdrv version %d.%d\n", major, minor);
    /* NCCL's check: driver at least 2.1. */
    CHECK(major > 2 || (major == 2 && minor >= 1), "driver version %d.%d < 2.1", major, minor);
    for (attr = GDR_ATTR_USE_PERSISTENT_MAPPING; attr < GDR_ATTR_MAX; attr++) {
        v = 77;
        EXPECT_RC(0, A.get_attribute(g, (gdr_attr_t)attr, &v));
        CHECK(v == 0 || v == 1, "attribute %d = %d", attr, v);
        printf("# attribute %d = %d\n", attr, v);
    }
    v = 77;
    EXPECT_RC(0, A.get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v));
    CHECK(v == 0, "dma-buf backend in use although /dev/gdrdrv opened");
    {
        const int bad_attrs[] = { 0, GDR_ATTR_MAX, -1, 1000, INT_MIN };
        for (i = 0; i < sizeof(bad_attrs) / sizeof(bad_attrs[0]); i++) {
            v = 77;
            EXPECT_RC(EINVAL, A.get_attribute(g, (gdr_attr_t)bad_attrs[i], &v));
            CHECK(v == 0, "*v = %d after bad attribute %d", v, bad_attrs[i]);
        }
    }
    check_null_outputs(g, bogus[0]);
    for (i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
        gdr_info_v2_t info;
        int flag = 77;
        void *va = NULL;
        EXPECT_RC(EINVAL, A.unpin_buffer(g, bogus[i]));
        EXPECT_RC(EINVAL, A.get_callback_flag(g, bogus[i], &flag));
        EXPECT_RC(EINVAL, A.get_info_v2(g, bogus[i], &info));
        EXPECT_RC(EINVAL, A.map(g, bogus[i], &va, 0x10000));
        EXPECT_RC(EINVAL, A.map_v2(g, bogus[i], &va, 0x10000, GDR_MAP_FLAG_REQ_WC_MAPPING));
        EXPECT_RC(EINVAL, A.unmap(g, bogus[i], fake_memh, 0x10000));
        CHECK(flag == 77 && va == NULL, "outputs written for a bogus handle");
    }
    /* gdrdrv refuses to pin the NULL GPU address. */
    {
        gdr_mh_t h = { 0x5a5a5a5aUL };
        EXPECT_RC(EINVAL, A.pin_buffer(g, 0, 0x10000, 0, 0, &h));
        EXPECT_RC(EINVAL, A.pin_buffer_v2(g, 0, 0x10000, 0, &h));
        CHECK(h.h == 0x5a5a5a5aUL, "handle written by a failing pin");
    }
}

#ifdef HAVE_GPUSIM
/* GPU memory from the simulated GPU: an allocation and the GPU's own view of it. */
struct gpu_buf {
    int fd;
    uint64_t va;
    size_t size;
    unsigned char *view;
};

static int gpu_alloc(struct gpu_buf *b, size_t size)
{
    struct gpusim_alloc a;
    b->fd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
    if (b->fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.size = size;
    if (ioctl(b->fd, GPUSIM_IOC_ALLOC, &a) != 0) {
        perror("GPUSIM_IOC_ALLOC");
        close(b->fd);
        return -1;
    }
    b->va = a.gpu_va;
    b->size = size;
    b->view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, (off_t)a.gpu_va);
    if (b->view == MAP_FAILED) {
        perror("mmap /dev/gpusim");
        close(b->fd);
        return -1;
    }
    return 0;
}

static void gpu_free(struct gpu_buf *b)
{
    struct gpusim_free f;
    munmap(b->view, b->size);
    f.gpu_va = b->va;
    CHECK(ioctl(b->fd, GPUSIM_IOC_FREE, &f) == 0, "GPUSIM_IOC_FREE: %s", strerror(errno));
    close(b->fd);
}

static void check_with_gpu_memory(gdr_t g)
{
    const size_t size = 3 * GPU_PAGE_SIZE;
    struct gpu_buf b;
    gdr_mh_t h = { 0 }, h2 = { 0 }, hu = { 0 };
    gdr_info_v2_t info;
    unsigned char raw[48];
    struct gdr_info_v1 *info1 = (struct gdr_info_v1 *)(void *)raw;
    unsigned char *host, *back;
    void *va = NULL, *va2 = NULL;
    int flag = 77, force_pcie = 0, rc;
    gdr_t g2;
    size_t i;

    section("pinned GPU memory from /dev/gpusim");
    if (gpu_alloc(&b, size) != 0) {
        printf("# SKIP: no /dev/gpusim allocation (%s)\n", strerror(errno));
        return;
    }
    host = malloc(size);
    back = malloc(size);
    for (i = 0; i < size; i++)
        host[i] = (unsigned char)(i * 7 + 3);

    EXPECT_RC(0, A.pin_buffer(g, b.va, size, 0, 0, &h));
    CHECK(h.h != 0, "pinned handle is 0");

    memset(&info, 0xff, sizeof(info));
    EXPECT_RC(0, A.get_info_v2(g, h, &info));
    CHECK(info.va == b.va && info.mapped_size == size && info.page_size == GPU_PAGE_SIZE,
          "info va %#llx size %#llx page %u", (unsigned long long)info.va,
          (unsigned long long)info.mapped_size, info.page_size);
    CHECK(!info.mapped && !info.wc_mapping && info.mapping_type == GDR_MAPPING_TYPE_NONE,
          "unmapped buffer reports mapped=%u wc=%u type=%d", info.mapped, info.wc_mapping,
          (int)info.mapping_type);
    /* The legacy symbol fills exactly 40 bytes (old binaries pass a 40-byte struct). */
    memset(raw, 0xee, sizeof(raw));
    EXPECT_RC(0, A.get_info_v1(g, h, info1));
    CHECK(info1->va == b.va && info1->mapped_size == size && info1->page_size == GPU_PAGE_SIZE,
          "v1 info wrong");
    for (i = 40; i < sizeof(raw); i++)
        CHECK(raw[i] == 0xee, "gdr_get_info wrote byte %zu of a 40-byte struct", i);

    EXPECT_RC(0, A.get_callback_flag(g, h, &flag));
    CHECK(flag == 0, "callback flag %d on a live buffer", flag);

    /* Mapping flags: values outside the enum, and types x86 cannot provide. */
    EXPECT_RC(EINVAL, A.map_v2(g, h, &va, size, 4));
    EXPECT_RC(EINVAL, A.map_v2(g, h, &va, size, -1));
#ifdef GDRAPI_X86
    EXPECT_RC(EOPNOTSUPP, A.map_v2(g, h, &va, size, GDR_MAP_FLAG_REQ_CACHE_MAPPING));
    EXPECT_RC(EOPNOTSUPP, A.map_v2(g, h, &va, size, GDR_MAP_FLAG_REQ_DEVICE_MAPPING));
#endif
    /* More than was pinned. */
    EXPECT_RC(EINVAL, A.map(g, h, &va, size + GPU_PAGE_SIZE));
    CHECK(va == NULL, "va written by a failing map");

    EXPECT_RC(0, A.map_v2(g, h, &va, size, GDR_MAP_FLAG_REQ_WC_MAPPING));
    CHECK(va != NULL, "map returned NULL");
    EXPECT_RC(EAGAIN, A.map(g, h, &va2, size));
    EXPECT_RC(0, A.get_info_v2(g, h, &info));
    CHECK(info.mapped && info.wc_mapping && info.mapping_type == GDR_MAPPING_TYPE_WC,
          "mapped buffer reports mapped=%u wc=%u type=%d", info.mapped, info.wc_mapping,
          (int)info.mapping_type);

    /* Data: what we copy in is what the GPU sees, and back. */
    EXPECT_RC(0, A.copy_to_mapping(h, va, host, size));
    CHECK(memcmp(b.view, host, size) == 0, "GPU view differs after gdr_copy_to_mapping");
    for (i = 0; i < size; i += 4096)
        b.view[i] ^= 0xff;
    memset(back, 0, size);
    EXPECT_RC(0, A.copy_from_mapping(h, back, va, size));
    for (i = 0; i < size; i++)
        if (back[i] != (unsigned char)(i % 4096 ? host[i] : host[i] ^ 0xff))
            break;
    CHECK(i == size, "gdr_copy_from_mapping differs from the GPU view at byte %zu", i);
    /* Odd offsets and sizes. */
    EXPECT_RC(0, A.copy_to_mapping(h, (char *)va + 13, host + 5, 1001));
    CHECK(memcmp(b.view + 13, host + 5, 1001) == 0, "unaligned copy_to differs");
    EXPECT_RC(0, A.copy_from_mapping(h, back + 3, (char *)va + 13, 1001));
    CHECK(memcmp(back + 3, host + 5, 1001) == 0, "unaligned copy_from differs");
    EXPECT_RC(0, A.copy_to_mapping(h, va, host, 0));

    /* Copies must stay inside the mapping. */
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, (char *)va + size - 8, host, 16));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h, back, (char *)va - 1, 16));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, host, back, 16));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, va, NULL, 16));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h, NULL, va, 16));

    /* Foreign handle: h belongs to g, not to g2. */
    g2 = A.open();
    CHECK(g2 != NULL, "second gdr_open failed");
    if (g2) {
        EXPECT_RC(EINVAL, A.get_info_v2(g2, h, &info));
        EXPECT_RC(EINVAL, A.get_callback_flag(g2, h, &flag));
        EXPECT_RC(EINVAL, A.unmap(g2, h, va, size));
        EXPECT_RC(EINVAL, A.unpin_buffer(g2, h));
        EXPECT_RC(0, A.close(g2));
        EXPECT_RC(EINVAL, A.close(g2));
    }

    /* Unmap needs the mapping's own address and size. */
    EXPECT_RC(EINVAL, A.unmap(g, h, (char *)va + 4096, size - 4096));
    EXPECT_RC(EINVAL, A.unmap(g, h, va, size + GPU_PAGE_SIZE));
    EXPECT_RC(EINVAL, A.unmap(g, h, NULL, size));
    EXPECT_RC(0, A.unmap(g, h, va, size));
    EXPECT_RC(EINVAL, A.unmap(g, h, va, size));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, va, host, 16));
    EXPECT_RC(0, A.get_info_v2(g, h, &info));
    CHECK(!info.mapped && info.mapping_type == GDR_MAPPING_TYPE_NONE, "still mapped after unmap");

    /* A partial mapping: 8 bytes map one host page. */
    EXPECT_RC(0, A.map(g, h, &va, 8));
    EXPECT_RC(0, A.copy_to_mapping(h, va, host, 8));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, (char *)va + 4096, host, 8));
    EXPECT_RC(0, A.unmap(g, h, va, 8));

    /* A second pin of the same memory; an unaligned pin that cannot be mapped. */
    EXPECT_RC(0, A.pin_buffer_v2(g, b.va, size, GDR_PIN_FLAG_DEFAULT, &h2));
    CHECK(h2.h != h.h, "two pins share a handle");
    EXPECT_RC(0, A.pin_buffer(g, b.va + 4096, 100, 0, 0, &hu));
    EXPECT_RC(0, A.get_info_v2(g, hu, &info));
    CHECK(info.va == b.va && info.mapped_size == GPU_PAGE_SIZE, "unaligned pin info va %#llx size %#llx",
          (unsigned long long)info.va, (unsigned long long)info.mapped_size);
    va = NULL;
    EXPECT_RC(EINVAL, A.map(g, hu, &va, 4096));
    EXPECT_RC(0, A.unpin_buffer(g, hu));

    /* FORCE_PCIE works exactly when the attribute says so. */
    EXPECT_RC(0, A.get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &force_pcie));
    rc = A.pin_buffer_v2(g, b.va, GPU_PAGE_SIZE, GDR_PIN_FLAG_FORCE_PCIE, &hu);
    CHECK(rc == (force_pcie ? 0 : EINVAL), "FORCE_PCIE pin returned %d with attribute %d", rc,
          force_pcie);
    if (rc == 0)
        EXPECT_RC(0, A.unpin_buffer(g, hu));
    /* Unknown pin-flag bits are dropped by the library, as upstream does. */
    EXPECT_RC(0, A.pin_buffer_v2(g, b.va, GPU_PAGE_SIZE, 0x100, &hu));
    EXPECT_RC(0, A.unpin_buffer(g, hu));

    /* Stale handle after unpin. */
    EXPECT_RC(0, A.unpin_buffer(g, h2));
    EXPECT_RC(EINVAL, A.unpin_buffer(g, h2));
    EXPECT_RC(EINVAL, A.get_info_v2(g, h2, &info));
    EXPECT_RC(EINVAL, A.map(g, h2, &va, size));
    EXPECT_RC(EINVAL, A.copy_from_mapping(h2, back, b.view, 16));

    /* Close with a live mapping and pin: everything is released, g and h are stale. */
    EXPECT_RC(0, A.map(g, h, &va, size));
    EXPECT_RC(0, A.close(g));
    EXPECT_RC(EINVAL, A.get_info_v2(g, h, &info));
    EXPECT_RC(EINVAL, A.copy_to_mapping(h, va, host, 16));
    check_bad_instance(g, h, "closed instance");
    /* The VMA stays until the user unmaps it (the kernel zapped its pages). */
    munmap(va, size);

    gpu_free(&b);
    free(host);
    free(back);
}
#endif

int main(void)
{
    gdr_t g;

    setvbuf(stdout, NULL, _IOLBF, 0);
    load_api();
    check_versions();
    check_mapping_type_strings();
    g = check_open();
    check_without_instance();
    if (g) {
        check_live_instance(g);
#ifdef HAVE_GPUSIM
        if (access("/dev/gpusim", F_OK) == 0) {
            check_with_gpu_memory(g); /* closes g */
            g = NULL;
        } else {
            printf("# SKIP: pinned-memory checks need /dev/gpusim\n");
        }
#else
        printf("# SKIP: pinned-memory checks not built (no gpusim_uapi.h)\n");
#endif
        if (g) {
            EXPECT_RC(0, A.close(g));
            EXPECT_RC(EINVAL, A.close(g));
        }
    } else {
        printf("# SKIP: live-instance checks need /dev/gdrdrv\n");
    }
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
