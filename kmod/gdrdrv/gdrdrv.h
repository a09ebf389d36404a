/* SPDX-License-Identifier: MIT OR GPL-2.0 */
/*
 * gdrdrv.h - user/kernel interface of the gdrdrv character device (/dev/gdrdrv).
 *
 * The numeric values and structure layouts below are the gdrdrv 2.6 ABI: user-space libraries
 * built against the original driver must work unchanged with this one. Several commands encode
 * the size of a pointer instead of the size of their argument structure; that is part of the
 * ABI (the numbers are what matters), and the driver always copies the full structure.
 *
 * This header is shared by the kernel module and by user space, so it only uses __u32/__u64.
 */
#ifndef GDRDRV_H
#define GDRDRV_H

#ifdef __KERNEL__
#include <linux/ioctl.h>
#include <linux/types.h>
#else
#include <sys/ioctl.h>
#include <linux/types.h>
#endif

/* ---- versions ------------------------------------------------------------------------------- */

#define GDRDRV_STRINGIFY(s) #s
#define GDRDRV_TOSTRING(s) GDRDRV_STRINGIFY(s)

#define GDRDRV_MAJOR_VERSION_SHIFT 16
#define GDRDRV_MAJOR_VERSION 2
#define GDRDRV_MINOR_VERSION 6
#define GDRDRV_VERSION \
	((GDRDRV_MAJOR_VERSION << GDRDRV_MAJOR_VERSION_SHIFT) | GDRDRV_MINOR_VERSION)
#define GDRDRV_VERSION_STRING \
	GDRDRV_TOSTRING(GDRDRV_MAJOR_VERSION) "." GDRDRV_TOSTRING(GDRDRV_MINOR_VERSION)

/* Oldest user-space API version this driver talks to. */
#define MINIMUM_GDR_API_MAJOR_VERSION 2
#define MINIMUM_GDR_API_MINOR_VERSION 0
#define MINIMUM_GDR_API_VERSION \
	((MINIMUM_GDR_API_MAJOR_VERSION << GDRDRV_MAJOR_VERSION_SHIFT) | \
	 MINIMUM_GDR_API_MINOR_VERSION)

/* Driver versions that introduced the optional commands (the library gates on these). */
#define GDRDRV_MINIMUM_VERSION_WITH_GET_INFO_V2 \
	((2 << GDRDRV_MAJOR_VERSION_SHIFT) | 4)
#define GDRDRV_MINIMUM_VERSION_WITH_GET_ATTR \
	((2 << GDRDRV_MAJOR_VERSION_SHIFT) | 5)
#define GDRDRV_MINIMUM_VERSION_WITH_PIN_BUFFER_V2 \
	((2 << GDRDRV_MAJOR_VERSION_SHIFT) | 5)
#define GDRDRV_MINIMUM_VERSION_WITH_REQ_MAPPING_TYPE \
	((2 << GDRDRV_MAJOR_VERSION_SHIFT) | 5)

/* ---- ioctl interface ------------------------------------------------------------------------ */

#define GDRDRV_IOCTL 0xDA

typedef __u64 gdr_hnd_t;

/* Mapping types; same numbering as the library's gdr_mapping_type_t. */
typedef enum gdr_mr_type {
	GDR_MR_NONE = 0,
	GDR_MR_WC = 1,
	GDR_MR_CACHING = 2,
	GDR_MR_DEVICE = 3,
} gdr_mr_type_t;

/* Attributes for GDRDRV_IOC_GET_ATTR. */
typedef enum gdrdrv_attr {
	GDRDRV_ATTR_USE_PERSISTENT_MAPPING = 1,
	GDRDRV_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2,
} gdrdrv_attr_t;

/* Pin flags for GDRDRV_IOC_PIN_BUFFER_V2. */
#define GDRDRV_PIN_BUFFER_FLAG_DEFAULT    0x0
#define GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE 0x1

struct GDRDRV_IOC_PIN_BUFFER_PARAMS {
	/* in */
	__u64 addr;
	__u64 size;
	__u64 p2p_token;
	__u32 va_space;
	/* out */
	gdr_hnd_t handle;
};

#define GDRDRV_IOC_PIN_BUFFER \
	_IOWR(GDRDRV_IOCTL, 1, struct GDRDRV_IOC_PIN_BUFFER_PARAMS)

struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
	/* in */
	__u64 addr;
	__u64 size;
	__u32 flags;
	__u32 pad;	/* written as 0 by the library, ignored by the driver */
	/* out */
	gdr_hnd_t handle;
};

#define GDRDRV_IOC_PIN_BUFFER_V2 \
	_IOWR(GDRDRV_IOCTL, 7, struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS)

struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS {
	/* in */
	gdr_hnd_t handle;
};

/* The size argument is a pointer type on purpose: ABI value 0xC008DA02. */
#define GDRDRV_IOC_UNPIN_BUFFER \
	_IOWR(GDRDRV_IOCTL, 2, struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS *)

struct GDRDRV_IOC_GET_CB_FLAG_PARAMS {
	/* in */
	gdr_hnd_t handle;
	/* out */
	__u32 flag;
};

#define GDRDRV_IOC_GET_CB_FLAG \
	_IOWR(GDRDRV_IOCTL, 3, struct GDRDRV_IOC_GET_CB_FLAG_PARAMS *)

struct GDRDRV_IOC_GET_INFO_PARAMS {
	/* in */
	gdr_hnd_t handle;
	/* out */
	__u64 va;
	__u64 mapped_size;
	__u32 page_size;
	__u32 tsc_khz;
	__u64 tm_cycles;
	__u32 mapped;
	__u32 wc_mapping;
};

#define GDRDRV_IOC_GET_INFO \
	_IOWR(GDRDRV_IOCTL, 4, struct GDRDRV_IOC_GET_INFO_PARAMS *)

struct GDRDRV_IOC_GET_INFO_V2_PARAMS {
	/* in */
	gdr_hnd_t handle;
	/* out */
	__u64 va;
	__u64 mapped_size;
	__u32 page_size;
	__u32 tsc_khz;
	__u64 tm_cycles;
	__u32 mapping_type;	/* gdr_mr_type_t */
};

#define GDRDRV_IOC_GET_INFO_V2 \
	_IOWR(GDRDRV_IOCTL, 5, struct GDRDRV_IOC_GET_INFO_V2_PARAMS *)

struct GDRDRV_IOC_GET_ATTR_PARAMS {
	/* in */
	__u32 attr;	/* gdrdrv_attr_t */
	/* out */
	__u32 val;
};

#define GDRDRV_IOC_GET_ATTR \
	_IOWR(GDRDRV_IOCTL, 6, struct GDRDRV_IOC_GET_ATTR_PARAMS *)

struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
	/* in */
	gdr_hnd_t handle;
	__u32 mapping_type;	/* gdr_mr_type_t */
};

#define GDRDRV_IOC_REQ_MAPPING_TYPE \
	_IOWR(GDRDRV_IOCTL, 8, struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS *)

struct GDRDRV_IOC_GET_VERSION_PARAMS {
	/* out */
	__u32 gdrdrv_version;
	__u32 minimum_gdr_api_version;
};

#define GDRDRV_IOC_GET_VERSION \
	_IOWR(GDRDRV_IOCTL, 255, struct GDRDRV_IOC_GET_VERSION_PARAMS *)

#endif /* GDRDRV_H */
