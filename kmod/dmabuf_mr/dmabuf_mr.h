/* SPDX-License-Identifier: MIT */
/*
 * dmabuf_mr: a test-only module (never packaged) that registers dma-bufs through the kernel's own
 * RDMA importer (ib_umem_dmabuf_get_pinned, or ib_umem_dmabuf_get + ib_umem_dmabuf_map_pages)
 * for an ib_device whose DMA device is a PCI device of the VM (the NVMe controller), as efa
 * (pinned) and mlx5 (dynamic) do, and reads the memory back through the DMA addresses the
 * importer produced: /dev/dmabuf_mr.
 */
#ifndef DMABUF_MR_H
#define DMABUF_MR_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define DMR_DEVICE_PATH "/dev/dmabuf_mr"

enum dmr_mode { DMR_PINNED = 0, DMR_DYNAMIC = 1 };

struct dmr_reg {
	__s32 fd;          /* in: dma-buf */
	__u32 mode;        /* in: enum dmr_mode */
	__u64 offset;      /* in: byte offset in the dma-buf */
	__u64 size;        /* in */
	__u32 access;      /* in: IB access flags (1 = LOCAL_WRITE) */
	__u32 handle;      /* out */
	__u32 nents;       /* out: umem SG entries after the importer's trimming */
	__u32 pad;
	__u64 mapped;      /* out: sum of their DMA lengths */
	__u64 dma_first;   /* out: DMA address of the first entry */
};

struct dmr_read {
	__u32 handle;      /* in */
	__u32 pad;
	__u64 offset;      /* in: byte offset from the MR's start; dma-buf offset + this 8-aligned */
	__u64 value;       /* out */
};

#define DMR_IOC_MAGIC 0xEB
#define DMR_IOC_REG   _IOWR(DMR_IOC_MAGIC, 1, struct dmr_reg)
#define DMR_IOC_READ  _IOWR(DMR_IOC_MAGIC, 2, struct dmr_read)
#define DMR_IOC_DEREG _IOW(DMR_IOC_MAGIC, 3, __u32)

#endif
