/*
 * gdrapi.h: the gdrcopy 2.6 user API, as implemented by the GPUDirect stack in Rust.
 *
 * CPU access to GPU memory: pin a range of GPU memory (gdr_pin_buffer*), map it into the
 * process (gdr_map*), then load/store through the mapping or use gdr_copy_to_mapping /
 * gdr_copy_from_mapping, which pick copy routines suited to write-combined PCIe BAR mappings.
 *
 * Environment variables read by the library:
 *   GDRCOPY_ENABLE_LOGGING   when set (any value), log messages to stderr
 *   GDRCOPY_LOG_LEVEL        minimum level printed: 1 debug, 2 info, 3 warning, 4 error (default)
 *   GDRCOPY_USE_DMABUF_MMAP  "1": use the CUDA dma-buf backend instead of /dev/gdrdrv
 *
 * All functions returning int return 0 on success or a positive errno value. This implementation
 * checks every gdr_t and gdr_mh_t it is given: unknown, closed or unpinned ones give EINVAL.
 * Copies are not ordered with respect to GPU work already running.
 */
#ifndef __GDRAPI_H__
#define __GDRAPI_H__

#include <stdint.h>
#include <stddef.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MAJOR_VERSION_SHIFT 16
#define MINOR_VERSION_MASK (((uint32_t)1 << MAJOR_VERSION_SHIFT) - 1)

#define GDR_API_MAJOR_VERSION 2
#define GDR_API_MINOR_VERSION 6
#define GDR_API_VERSION ((GDR_API_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | GDR_API_MINOR_VERSION)

#define MINIMUM_GDRDRV_MAJOR_VERSION 2
#define MINIMUM_GDRDRV_MINOR_VERSION 0
#define MINIMUM_GDRDRV_VERSION ((MINIMUM_GDRDRV_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | MINIMUM_GDRDRV_MINOR_VERSION)

#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

/* A library instance. */
struct gdr;
typedef struct gdr *gdr_t;

/* A pinned buffer, passed by value. A successful pin never yields h == 0. */
typedef struct gdr_mh_s {
    unsigned long h;
} gdr_mh_t;

typedef enum gdr_pin_flags {
    GDR_PIN_FLAG_DEFAULT = 0,
    GDR_PIN_FLAG_FORCE_PCIE = 1
} gdr_pin_flags_t;

typedef enum gdr_mapping_type {
    GDR_MAPPING_TYPE_NONE = 0,
    GDR_MAPPING_TYPE_WC = 1,
    GDR_MAPPING_TYPE_CACHING = 2,
    GDR_MAPPING_TYPE_DEVICE = 3,
    GDR_MAPPING_TYPE_MAX
} gdr_mapping_type_t;

typedef enum gdr_map_flags {
    GDR_MAP_FLAG_DEFAULT = 0,
    GDR_MAP_FLAG_REQ_WC_MAPPING = 1,
    GDR_MAP_FLAG_REQ_CACHE_MAPPING = 2,
    GDR_MAP_FLAG_REQ_DEVICE_MAPPING = 3
} gdr_map_flags_t;

typedef enum gdr_attr {
    GDR_ATTR_USE_PERSISTENT_MAPPING = 1,
    GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2,
    GDR_ATTR_USING_DMA_BUF_MMAP = 3,
    GDR_ATTR_MAX
} gdr_attr_t;

typedef struct gdr_info_v2 {
    uint64_t va;            /* GPU address of the pinned range (rounded down to the page) */
    uint64_t mapped_size;   /* pinned length after rounding */
    uint32_t page_size;     /* GPU page size */
    uint64_t tm_cycles;     /* deprecated: cycles spent pinning */
    uint32_t cycles_per_ms; /* deprecated */
    unsigned mapped:1;      /* currently mapped into the CPU */
    unsigned wc_mapping:1;  /* the mapping is write-combining */
    gdr_mapping_type_t mapping_type;
} gdr_info_v2_t;
typedef gdr_info_v2_t gdr_info_t;

/* Open an instance; NULL when neither /dev/gdrdrv nor dma-buf mmap support is available. */
gdr_t gdr_open(void);

/* Unpin everything still pinned on g, then free it. */
int gdr_close(gdr_t g);

/* Pin GPU memory [addr, addr + size). Only 64 KiB-aligned addresses can be mapped later.
 * p2p_token and va_space are ignored by gdrdrv 2.5 and newer. */
int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size, uint64_t p2p_token, uint32_t va_space, gdr_mh_t *handle);

/* As gdr_pin_buffer with gdr_pin_flags_t flags. */
int gdr_pin_buffer_v2(gdr_t g, unsigned long addr, size_t size, uint32_t flags, gdr_mh_t *handle);

/* Unpin; a live CPU mapping of the buffer is torn down (later accesses fault). */
int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle);

/* *flag = 1 when the GPU memory was freed while pinned (non-persistent pins only). */
int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag);

/* Facts about a pinned buffer. */
int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info);
#define gdr_get_info gdr_get_info_v2

/* Map size bytes from the start of the pinned range into the process. One mapping per handle. */
int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size);

/* As gdr_map, requesting a gdr_map_flags_t mapping type. */
int gdr_map_v2(gdr_t g, gdr_mh_t handle, void **ptr_va, size_t size, int flags);

/* Undo gdr_map; va and size must be those of the mapping. */
int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size);

/* Copy between host memory and a mapping (map_d_ptr must lie inside the handle's mapping). */
int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size);
int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size);

/* This library's API version. */
void gdr_runtime_get_version(int *major, int *minor);

/* The gdrdrv kernel module's version. */
int gdr_driver_get_version(gdr_t g, int *major, int *minor);

/* Query a gdr_attr_t; *v is set to 0 first. */
int gdr_get_attribute(gdr_t g, gdr_attr_t attr, int *v);

/* Human-readable name of a mapping type. */
int gdr_get_mapping_type_string(gdr_mapping_type_t mapping_type, const char **pstr);

#ifdef __cplusplus
}
#endif

#endif /* __GDRAPI_H__ */
