/* SPDX-License-Identifier: MIT */
/*
 * dmabuf_import: a test-only dma-buf importer, /dev/gpusim_dmabuf_import. It attaches a dma-buf
 * (given by fd) to the simulated GPU's own PCI device, the way a peer device driver (an RDMA NIC
 * through ib_umem_dmabuf, another GPU) would, maps the attachment and reads the memory through
 * the DMA addresses it got. The VM has no IOMMU, so a DMA address is the BAR physical address.
 */
#ifndef GPUSIM_DMABUF_IMPORT_H
#define GPUSIM_DMABUF_IMPORT_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define DBI_DEVICE_PATH "/dev/gpusim_dmabuf_import"
#define DBI_SLOTS 16

enum dbi_mode {
	DBI_STATIC = 0,           /* dma_buf_attach */
	DBI_DYNAMIC_P2P = 1,      /* dma_buf_dynamic_attach, allow_peer2peer = true */
	DBI_DYNAMIC_NO_P2P = 2,   /* dma_buf_dynamic_attach, allow_peer2peer = false */
};

struct dbi_import {
	__s32 fd;          /* in: dma-buf */
	__u32 mode;        /* in: enum dbi_mode */
	__u32 slot;        /* out */
	__u32 nents;       /* out: mapped scatterlist entries */
	__u64 size;        /* out: dma-buf size */
	__u64 mapped;      /* out: sum of the entries' DMA lengths */
	__u64 dma_min;     /* out: lowest and highest DMA address */
	__u64 dma_max;
	char exp_name[32]; /* out: the exporter's name */
};

struct dbi_peek {
	__u32 slot;        /* in */
	__u32 pad;
	__u64 offset;      /* in: byte offset in the dma-buf, 8-byte aligned */
	__u64 value;       /* out */
};

#define DBI_IOC_MAGIC 0xE9
#define DBI_IOC_IMPORT  _IOWR(DBI_IOC_MAGIC, 1, struct dbi_import)
#define DBI_IOC_PEEK    _IOWR(DBI_IOC_MAGIC, 2, struct dbi_peek)
#define DBI_IOC_RELEASE _IOW(DBI_IOC_MAGIC, 3, __u32)

#endif
