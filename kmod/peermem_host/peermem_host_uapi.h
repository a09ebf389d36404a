/* SPDX-License-Identifier: MIT */
/*
 * Test interface of the test-only peer-memory host (kmod/peermem_host): /dev/peermem_host.
 * One file = one simulated HCA user context; every MR a file holds is deregistered when it is
 * closed. The simulated HCA's DMA device is a real PCI device of the VM (module parameter).
 */
#ifndef PEERMEM_HOST_UAPI_H
#define PEERMEM_HOST_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define PMH_DEVICE_PATH "/dev/peermem_host"

/* struct pmh_reg.access: as IB access flags */
#define PMH_ACCESS_LOCAL_WRITE  0x1
#define PMH_ACCESS_ON_DEMAND    0x40

/* struct pmh_reg.flags */
#define PMH_REG_INVAL_SUPP      0x1   /* caller supports invalidation (mlx5 MRs do) */
#define PMH_REG_DEFER_ACTIVATE  0x2   /* keep the mapping lock until PMH_IOC_ACTIVATE */

struct pmh_reg {
	__u64 addr;        /* in: user virtual address (a GPU VA for peer memory) */
	__u64 size;        /* in */
	__u32 access;      /* in: PMH_ACCESS_* */
	__u32 flags;       /* in: PMH_REG_* */
	__u32 handle;      /* out: MR handle (peer MRs only) */
	__u32 is_peer;     /* out: 1 peer memory, 0 ordinary pinned host memory (not kept) */
	__u32 nents;       /* out: SG entries after trimming */
	__u32 nmap;        /* out: *nmap from the client's dma_map */
	__u64 page_size;   /* out: the client's get_page_size */
	__u64 mapped;      /* out: sum of SG DMA lengths after trimming */
	__u64 dma_first;   /* out: DMA address of the first byte of the first SG */
	char client[64];   /* out: name of the client that took the range */
};

struct pmh_read {
	__u32 handle;      /* in */
	__u32 pad;
	__u64 offset;      /* in: byte offset from the MR's addr; addr + offset 8-byte aligned */
	__u64 value;       /* out: 8 bytes read through the MR's DMA address */
};

#define PMH_IOC_MAGIC 0xEA
#define PMH_IOC_REG      _IOWR(PMH_IOC_MAGIC, 1, struct pmh_reg)
#define PMH_IOC_READ     _IOWR(PMH_IOC_MAGIC, 2, struct pmh_read)
#define PMH_IOC_DEREG    _IOW(PMH_IOC_MAGIC, 3, __u32)
#define PMH_IOC_ACTIVATE _IOW(PMH_IOC_MAGIC, 4, __u32)

/*
 * /sys/kernel/debug/peermem_host/stats: "key: value" lines: live_umems, violations (client
 * contract breaks the host caught; must stay 0 for a correct client), invalidations,
 * stale_invalidations, revoked_reads.
 */
#endif
