/*
 * abi_check.c: the layout and value contract of gdrapi.h / gdrconfig.h against gdrcopy 2.6
 * (values from shared/spec/gdrcopy.md §1.2, §1.3, §1.4, §2).
 *
 * Compiled as C (c99, c11) and as C++ (c++11, c++17) with -Wall -Wextra -Werror: a C++ consumer
 * must see the same layout as a C one.  Compile-time assertions stop the build on a mismatch of a
 * constant; the run-time part checks what only running code can see (bit-field positions) and
 * prints one line per fact, ending with "N passed, N failed".
 */
#include <gdrapi.h>
#include <gdrconfig.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
#define ALIGNOF(t) alignof(t)
#define STATIC_ASSERT(c, m) static_assert(c, m)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define ALIGNOF(t) _Alignof(t)
#define STATIC_ASSERT(c, m) _Static_assert(c, m)
#else
/* C99: GCC's __alignof__ (a documented extension that -pedantic accepts), array-size asserts. */
#define ALIGNOF(t) __alignof__(t)
#define SA_CAT2(a, b) a##b
#define SA_CAT(a, b) SA_CAT2(a, b)
#define STATIC_ASSERT(c, m) typedef char SA_CAT(static_assert_line_, __LINE__)[(c) ? 1 : -1]
#endif

static int checks, failures;

static void expect_u(const char *what, unsigned long long got, unsigned long long want)
{
    checks++;
    if (got != want) {
        failures++;
        printf("not ok - %s = %llu (0x%llx), want %llu (0x%llx)\n", what, got, got, want, want);
    } else {
        printf("ok - %s = %llu\n", what, got);
    }
}

#define SIZE(t, n) expect_u("sizeof(" #t ")", sizeof(t), n)
#define ALIGN(t, n) expect_u("alignof(" #t ")", ALIGNOF(t), n)
#define OFF(t, f, n) expect_u("offsetof(" #t ", " #f ")", offsetof(t, f), n)
#define VAL(e, n) expect_u(#e, (unsigned long long)(e), n)

/* Compile-time: fail the build, not just the run. */
STATIC_ASSERT(sizeof(gdr_info_v2_t) == 48, "gdr_info_v2_t is 48 bytes");
STATIC_ASSERT(sizeof(gdr_info_t) == 48, "gdr_info_t is gdr_info_v2_t");
STATIC_ASSERT(ALIGNOF(gdr_info_v2_t) == 8, "gdr_info_v2_t aligned to 8");
STATIC_ASSERT(offsetof(gdr_info_v2_t, mapping_type) == 40, "mapping_type at 40");
STATIC_ASSERT(sizeof(gdr_mh_t) == 8 && ALIGNOF(gdr_mh_t) == 8, "gdr_mh_t is one unsigned long");
STATIC_ASSERT(sizeof(gdr_t) == sizeof(void *), "gdr_t is a pointer");
STATIC_ASSERT(sizeof(gdr_pin_flags_t) == 4 && sizeof(gdr_mapping_type_t) == 4, "enums are int-sized");
STATIC_ASSERT(sizeof(gdr_map_flags_t) == 4 && sizeof(gdr_attr_t) == 4, "enums are int-sized");
STATIC_ASSERT(GDR_API_VERSION == 0x00020006, "API 2.6");
STATIC_ASSERT(MINIMUM_GDRDRV_VERSION == 0x00020000, "minimum gdrdrv 2.0");
STATIC_ASSERT(GPU_PAGE_SIZE == 65536UL, "64 KiB GPU pages");
STATIC_ASSERT(GPU_PAGE_MASK == ~0xFFFFUL, "GPU_PAGE_MASK");

/* Type of an expression: macro values must have upstream's C types (unsigned long, uint32_t). */
#ifdef __cplusplus
template <typename A, typename B> struct same { enum { value = 0 }; };
template <typename A> struct same<A, A> { enum { value = 1 }; };
#define IS_TYPE(e, t) (same<__typeof__(e), t>::value)
#else
#define IS_TYPE(e, t) __builtin_types_compatible_p(__typeof__(e), t)
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

/* Prototypes: each function must convert to exactly upstream's pointer type (-Werror). */
static void check_prototypes(void)
{
    gdr_t (*p_open)(void) = gdr_open;
    int (*p_close)(gdr_t) = gdr_close;
    int (*p_pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *) = gdr_pin_buffer;
    int (*p_pin2)(gdr_t, unsigned long, size_t, uint32_t, gdr_mh_t *) = gdr_pin_buffer_v2;
    int (*p_unpin)(gdr_t, gdr_mh_t) = gdr_unpin_buffer;
    int (*p_cb)(gdr_t, gdr_mh_t, int *) = gdr_get_callback_flag;
    int (*p_info2)(gdr_t, gdr_mh_t, gdr_info_v2_t *) = gdr_get_info_v2;
    int (*p_info)(gdr_t, gdr_mh_t, gdr_info_t *) = gdr_get_info; /* the macro → v2 */
    int (*p_map)(gdr_t, gdr_mh_t, void **, size_t) = gdr_map;
    int (*p_map2)(gdr_t, gdr_mh_t, void **, size_t, int) = gdr_map_v2;
    int (*p_unmap)(gdr_t, gdr_mh_t, void *, size_t) = gdr_unmap;
    int (*p_to)(gdr_mh_t, void *, const void *, size_t) = gdr_copy_to_mapping;
    int (*p_from)(gdr_mh_t, void *, const void *, size_t) = gdr_copy_from_mapping;
    void (*p_rtv)(int *, int *) = gdr_runtime_get_version;
    int (*p_drv)(gdr_t, int *, int *) = gdr_driver_get_version;
    int (*p_attr)(gdr_t, gdr_attr_t, int *) = gdr_get_attribute;
    int (*p_str)(gdr_mapping_type_t, const char **) = gdr_get_mapping_type_string;
    /* Referenced so that the link proves every symbol exists. */
    const void *all[17];
    size_t i, n = 0;
    memcpy(&all[n++], &p_open, sizeof(void *));
    memcpy(&all[n++], &p_close, sizeof(void *));
    memcpy(&all[n++], &p_pin, sizeof(void *));
    memcpy(&all[n++], &p_pin2, sizeof(void *));
    memcpy(&all[n++], &p_unpin, sizeof(void *));
    memcpy(&all[n++], &p_cb, sizeof(void *));
    memcpy(&all[n++], &p_info2, sizeof(void *));
    memcpy(&all[n++], &p_info, sizeof(void *));
    memcpy(&all[n++], &p_map, sizeof(void *));
    memcpy(&all[n++], &p_map2, sizeof(void *));
    memcpy(&all[n++], &p_unmap, sizeof(void *));
    memcpy(&all[n++], &p_to, sizeof(void *));
    memcpy(&all[n++], &p_from, sizeof(void *));
    memcpy(&all[n++], &p_rtv, sizeof(void *));
    memcpy(&all[n++], &p_drv, sizeof(void *));
    memcpy(&all[n++], &p_attr, sizeof(void *));
    memcpy(&all[n++], &p_str, sizeof(void *));
    for (i = 0; i < n; i++)
        expect_u("prototype resolved", all[i] != NULL, 1);
}

int main(void)
{
    gdr_info_v2_t info;
    unsigned char bytes[sizeof(gdr_info_v2_t)];

    /* §1.3: gdr_info_v2_t */
    SIZE(gdr_info_v2_t, 48);
    ALIGN(gdr_info_v2_t, 8);
    SIZE(gdr_info_t, 48);
    OFF(gdr_info_v2_t, va, 0);
    OFF(gdr_info_v2_t, mapped_size, 8);
    OFF(gdr_info_v2_t, page_size, 16);
    OFF(gdr_info_v2_t, tm_cycles, 24);
    OFF(gdr_info_v2_t, cycles_per_ms, 32);
    OFF(gdr_info_v2_t, mapping_type, 40);
    SIZE(((gdr_info_v2_t *)0)->va, 8);
    SIZE(((gdr_info_v2_t *)0)->mapped_size, 8);
    SIZE(((gdr_info_v2_t *)0)->page_size, 4);
    SIZE(((gdr_info_v2_t *)0)->tm_cycles, 8);
    SIZE(((gdr_info_v2_t *)0)->cycles_per_ms, 4);
    SIZE(((gdr_info_v2_t *)0)->mapping_type, 4);
    expect_u("type of gdr_info_v2_t.mapping_type is gdr_mapping_type_t",
             IS_TYPE(info.mapping_type, gdr_mapping_type_t), 1);
    expect_u("gdr_info_t is gdr_info_v2_t", IS_TYPE(info, gdr_info_t), 1);
    /* Bit-fields: mapped = bit 0, wc_mapping = bit 1 of byte 36; no other byte touched. */
    memset(&info, 0, sizeof(info));
    info.mapped = 1;
    memcpy(bytes, &info, sizeof(info));
    expect_u("byte 36 with mapped=1", bytes[36], 0x01);
    memset(&info, 0, sizeof(info));
    info.wc_mapping = 1;
    memcpy(bytes, &info, sizeof(info));
    expect_u("byte 36 with wc_mapping=1", bytes[36], 0x02);
    {
        size_t i, others = 0;
        for (i = 0; i < sizeof(bytes); i++)
            others += i != 36 && bytes[i] != 0;
        expect_u("bytes other than 36 set by the bit-fields", others, 0);
    }

    /* gdr_mh_t, gdr_t */
    SIZE(gdr_mh_t, 8);
    ALIGN(gdr_mh_t, 8);
    OFF(gdr_mh_t, h, 0);
    {
        gdr_mh_t mh;
        mh.h = 0;
        expect_u("type of gdr_mh_t.h is unsigned long", IS_TYPE(mh.h, unsigned long), 1);
    }
    SIZE(gdr_t, sizeof(void *));

    /* Enums: sizes and every value. */
    SIZE(gdr_pin_flags_t, 4);
    SIZE(gdr_mapping_type_t, 4);
    SIZE(gdr_map_flags_t, 4);
    SIZE(gdr_attr_t, 4);
    VAL(GDR_PIN_FLAG_DEFAULT, 0);
    VAL(GDR_PIN_FLAG_FORCE_PCIE, 1);
    VAL(GDR_MAPPING_TYPE_NONE, 0);
    VAL(GDR_MAPPING_TYPE_WC, 1);
    VAL(GDR_MAPPING_TYPE_CACHING, 2);
    VAL(GDR_MAPPING_TYPE_DEVICE, 3);
    VAL(GDR_MAPPING_TYPE_MAX, 4);
    VAL(GDR_MAP_FLAG_DEFAULT, 0);
    VAL(GDR_MAP_FLAG_REQ_WC_MAPPING, 1);
    VAL(GDR_MAP_FLAG_REQ_CACHE_MAPPING, 2);
    VAL(GDR_MAP_FLAG_REQ_DEVICE_MAPPING, 3);
    VAL(GDR_ATTR_USE_PERSISTENT_MAPPING, 1);
    VAL(GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, 2);
    VAL(GDR_ATTR_USING_DMA_BUF_MMAP, 3);
    VAL(GDR_ATTR_MAX, 4);

    /* §1.2 macros: values and C types. */
    VAL(MAJOR_VERSION_SHIFT, 16);
    VAL(MINOR_VERSION_MASK, 0xFFFF);
    expect_u("type of MINOR_VERSION_MASK is uint32_t", IS_TYPE(MINOR_VERSION_MASK, uint32_t), 1);
    VAL(GDR_API_MAJOR_VERSION, 2);
    VAL(GDR_API_MINOR_VERSION, 6);
    VAL(GDR_API_VERSION, 0x00020006);
    VAL(MINIMUM_GDRDRV_MAJOR_VERSION, 2);
    VAL(MINIMUM_GDRDRV_MINOR_VERSION, 0);
    VAL(MINIMUM_GDRDRV_VERSION, 0x00020000);
    VAL(GPU_PAGE_SHIFT, 16);
    VAL(GPU_PAGE_SIZE, 65536);
    VAL(GPU_PAGE_OFFSET, 0xFFFF);
    VAL(GPU_PAGE_MASK, 0xFFFFFFFFFFFF0000ULL);
    expect_u("type of GPU_PAGE_SIZE is unsigned long", IS_TYPE(GPU_PAGE_SIZE, unsigned long), 1);
    expect_u("type of GPU_PAGE_OFFSET is unsigned long", IS_TYPE(GPU_PAGE_OFFSET, unsigned long), 1);
    expect_u("type of GPU_PAGE_MASK is unsigned long", IS_TYPE(GPU_PAGE_MASK, unsigned long), 1);
    expect_u("type of GDR_API_VERSION is int", IS_TYPE(GDR_API_VERSION, int), 1);
    /* gdr_get_info is a function-like alias of gdr_get_info_v2 for new sources. */
    expect_u("gdr_get_info expands to gdr_get_info_v2", strcmp(STR(gdr_get_info), "gdr_get_info_v2") == 0, 1);

    /* §2 gdrconfig.h: exactly one architecture macro, defined with no value. */
    {
        int n = 0;
#ifdef GDRAPI_X86
        n++;
        expect_u("GDRAPI_X86 defined empty", sizeof(STR(GDRAPI_X86)), 1);
#endif
#ifdef GDRAPI_ARM64
        n++;
        expect_u("GDRAPI_ARM64 defined empty", sizeof(STR(GDRAPI_ARM64)), 1);
#endif
#ifdef GDRAPI_POWER
        n++;
        expect_u("GDRAPI_POWER defined empty", sizeof(STR(GDRAPI_POWER)), 1);
#endif
        expect_u("architecture macros defined", (unsigned long long)n, 1);
#if defined(__x86_64__)
#ifndef GDRAPI_X86
        expect_u("GDRAPI_X86 on x86-64", 0, 1);
#endif
#endif
    }

    check_prototypes();

    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
