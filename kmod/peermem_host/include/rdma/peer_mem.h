/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Peer-memory client ABI, as MLNX_OFED / DOCA-OFED and Ubuntu's SAUCE kernels declare it in
 * rdma/peer_mem.h: same names, constants, prototypes and x86-64 layout (struct
 * peer_memory_client: 136 bytes; struct peer_memory_client_ex: 152 bytes). Written for the
 * test-only host kmod/peermem_host; a client built against it links against that host's
 * Module.symvers, and against a real OFED tree's header and Module.symvers elsewhere.
 */
#ifndef RDMA_PEER_MEM_H
#define RDMA_PEER_MEM_H

#include <linux/types.h>
#include <linux/scatterlist.h>

#define IB_PEER_MEMORY_NAME_MAX 64
#define IB_PEER_MEMORY_VER_MAX 16

/* core_context is a u64 token (an id the core hands out), not a pointer. */
#define PEER_MEM_U64_CORE_CONTEXT

struct device;

struct peer_memory_client {
	char name[IB_PEER_MEMORY_NAME_MAX];
	char version[IB_PEER_MEMORY_VER_MAX];	/* version[15] != 0: a peer_memory_client_ex */
	int (*acquire)(unsigned long addr, size_t size, void *peer_mem_private_data,
		       char *peer_mem_name, void **client_context);
	int (*get_pages)(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *sg_head, void *client_context, u64 core_context);
	int (*dma_map)(struct sg_table *sg_head, void *client_context,
		       struct device *dma_device, int dmasync, int *nmap);
	int (*dma_unmap)(struct sg_table *sg_head, void *client_context,
			 struct device *dma_device);
	void (*put_pages)(struct sg_table *sg_head, void *client_context);
	unsigned long (*get_page_size)(void *client_context);
	void (*release)(void *client_context);
};

enum {
	PEER_MEM_INVALIDATE_UNMAPS = 1 << 0,
};

struct peer_memory_client_ex {
	struct peer_memory_client client;
	size_t ex_size;
	u32 flags;
};

typedef int (*invalidate_peer_memory)(void *reg_handle, u64 core_context);

void *ib_register_peer_memory_client(const struct peer_memory_client *peer_client,
				     invalidate_peer_memory *invalidate_callback);
void ib_unregister_peer_memory_client(void *reg_handle);

#endif
