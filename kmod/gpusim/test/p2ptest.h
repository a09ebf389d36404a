/* SPDX-License-Identifier: MIT */
/*
 * p2ptest: a test-only module that drives the nvidia_p2p_* API exported by gpusim on behalf of
 * user space, in the caller's process context, the way gdrdrv does. /dev/gpusim_p2ptest.
 */
#ifndef GPUSIM_P2PTEST_H
#define GPUSIM_P2PTEST_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PT_DEVICE_PATH "/dev/gpusim_p2ptest"
#define P2PT_SLOTS 64

enum p2pt_mode {
	P2PT_MODE_GET_PAGES = 0,        /* nvidia_p2p_get_pages(0, 0, va, len, &pt, cb, slot) */
	P2PT_MODE_PERSISTENT = 1,       /* nvidia_p2p_get_pages_persistent(va, len, &pt, 0) */
	P2PT_MODE_PERSISTENT_BAR1 = 2,  /* ... flags NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING */
	P2PT_MODE_NULL_CALLBACK = 3,    /* get_pages with a NULL callback (must fail) */
	P2PT_MODE_TOKEN = 4,            /* get_pages with p2p_token 1 (must fail) */
	P2PT_MODE_BAD_FLAGS = 5,        /* get_pages_persistent with unknown flag 0x2 (must fail) */
	P2PT_MODE_NULL_TABLE = 6,       /* get_pages with page_table == NULL (must fail) */
};

struct p2pt_pin {
	__u64 va;          /* in */
	__u64 len;         /* in */
	__u32 mode;        /* in: enum p2pt_mode */
	__u32 slot;        /* out */
};

struct p2pt_status {
	__u32 slot;        /* in */
	__u32 cb_fired;    /* out: free callback ran */
	__u32 pinned;      /* out: page table held */
	__u32 version;     /* out: page table fields */
	__u32 page_size;
	__u32 entries;
	__u32 flags;
	__u32 uuid_nonzero;
	__u64 phys_min;    /* out: lowest and highest page physical address */
	__u64 phys_max;
	__u32 contiguous;  /* out: all pages physically consecutive */
	__u32 pad;
};

/* Read or write 8 bytes at byte offset `offset` of a pinned range through its BAR address. */
struct p2pt_peek {
	__u32 slot;        /* in */
	__u32 pad;
	__u64 offset;      /* in: 8-byte aligned, < pinned length */
	__u64 value;       /* out (PEEK) / in (POKE) */
	__u64 phys;        /* out: physical address accessed */
};

#define P2PT_IOC_MAGIC 0xE8
#define P2PT_IOC_PIN      _IOWR(P2PT_IOC_MAGIC, 1, struct p2pt_pin)
#define P2PT_IOC_UNPIN    _IOW(P2PT_IOC_MAGIC, 2, __u32)
#define P2PT_IOC_STATUS   _IOWR(P2PT_IOC_MAGIC, 3, struct p2pt_status)
#define P2PT_IOC_PEEK     _IOWR(P2PT_IOC_MAGIC, 4, struct p2pt_peek)
#define P2PT_IOC_POKE     _IOW(P2PT_IOC_MAGIC, 5, struct p2pt_peek)
/* Calls the unsupported/legacy exports and checks their documented errors; 0 if all matched. */
#define P2PT_IOC_SELFTEST _IO(P2PT_IOC_MAGIC, 6)

#endif
