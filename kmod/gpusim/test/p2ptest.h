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

/*
 * nvidia_p2p_dma_map_pages() of a slot's page table for the PCI device domain:bus:devfn.
 * One mapping per slot. Its free callback hands the mapping back with
 * nvidia_p2p_free_dma_mapping() unless P2PT_DMA_CB_LEAVE is set (then gpusim must tear it down).
 */
#define P2PT_DMA_CB_LEAVE  0x1
#define P2PT_DMA_NULL_PEER 0x2   /* pass peer == NULL (must fail) */
#define P2PT_DMA_NULL_OUT  0x4   /* pass dma_mapping == NULL (must fail) */
#define P2PT_DMA_BAD_TABLE 0x8   /* pass a page table pointer gpusim never handed out */

struct p2pt_dma {
	__u32 slot;          /* in */
	__u32 flags;         /* in: P2PT_DMA_* */
	__u32 domain;        /* in: peer PCI device */
	__u32 bus;
	__u32 devfn;
	__u32 version;       /* out: mapping fields */
	__u32 page_size_type;
	__u32 entries;
	__u32 pci_dev_ok;    /* out: mapping->pci_dev is the peer */
	__u32 equal_phys;    /* out: pages whose bus address equals the page table's physical one */
	__u64 first;         /* out: bus address of page 0 and of the last page */
	__u64 last;
};

enum p2pt_dma_unmap_how {
	P2PT_UNMAP_OK = 0,          /* nvidia_p2p_dma_unmap_pages(peer, pt, m) */
	P2PT_UNMAP_WRONG_PEER = 1,  /* ... with the PCI device given in p2pt_dma_unmap (must fail) */
	P2PT_UNMAP_WRONG_TABLE = 2, /* ... with the page table of slot `other` (must fail) */
	P2PT_UNMAP_FREE = 3,        /* nvidia_p2p_free_dma_mapping(m) outside a callback (must fail) */
	P2PT_UNMAP_NULL = 4,        /* ... dma_unmap_pages(peer, pt, NULL) (must fail) */
	P2PT_UNMAP_STALE = 5,       /* unmap the slot's last mapping, already gone, for the PCI
				     * device given in p2pt_dma_unmap (must fail) */
};

struct p2pt_dma_unmap {
	__u32 slot;
	__u32 how;           /* enum p2pt_dma_unmap_how */
	__u32 other;         /* slot for WRONG_TABLE */
	__u32 domain;        /* peer for WRONG_PEER and STALE */
	__u32 bus;
	__u32 devfn;
};

/* what the slot's free callback saw */
struct p2pt_dma_cb {
	__u32 slot;          /* in */
	__u32 cb_fired;      /* out */
	__s32 free_dma_ret;  /* out: nvidia_p2p_free_dma_mapping() in the callback (1: not called) */
	__u32 mapped;        /* out: slot still holds a mapping */
};

#define P2PT_IOC_MAGIC 0xE8
#define P2PT_IOC_PIN      _IOWR(P2PT_IOC_MAGIC, 1, struct p2pt_pin)
#define P2PT_IOC_UNPIN    _IOW(P2PT_IOC_MAGIC, 2, __u32)
#define P2PT_IOC_STATUS   _IOWR(P2PT_IOC_MAGIC, 3, struct p2pt_status)
#define P2PT_IOC_PEEK     _IOWR(P2PT_IOC_MAGIC, 4, struct p2pt_peek)
#define P2PT_IOC_POKE     _IOW(P2PT_IOC_MAGIC, 5, struct p2pt_peek)
/* Calls the unsupported/legacy exports and checks their documented errors; 0 if all matched. */
#define P2PT_IOC_SELFTEST _IO(P2PT_IOC_MAGIC, 6)
#define P2PT_IOC_DMA_MAP   _IOWR(P2PT_IOC_MAGIC, 7, struct p2pt_dma)
#define P2PT_IOC_DMA_UNMAP _IOW(P2PT_IOC_MAGIC, 8, struct p2pt_dma_unmap)
#define P2PT_IOC_DMA_CB    _IOWR(P2PT_IOC_MAGIC, 9, struct p2pt_dma_cb)

#endif
