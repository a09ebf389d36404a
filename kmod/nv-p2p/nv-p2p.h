/* SPDX-License-Identifier: MIT */
/*
 * nv-p2p.h - declarations of the NVIDIA kernel peer-to-peer (GPUDirect RDMA) API.
 *
 * Written for this project from the published interface facts (names, constant values, struct
 * layouts and prototypes) of the NVIDIA driver's nv-p2p API, page-table version 2.0 (driver
 * r580 and later). It lets gdrdrv build without the NVIDIA driver source and is the contract
 * that kmod/gpusim (the simulated GPU used in tests) implements. gdrdrv must also build against
 * NVIDIA's own header, so only upstream's names are used here and nothing is added that a
 * consumer could come to depend on.
 */
#ifndef _NV_P2P_H_
#define _NV_P2P_H_

#include <linux/types.h>

struct pci_dev;

/* --- versions ------------------------------------------------------------------------------ */

#define NVIDIA_P2P_MAJOR_VERSION_MASK 0xffff0000
#define NVIDIA_P2P_MINOR_VERSION_MASK 0x0000ffff

#define NVIDIA_P2P_MAJOR_VERSION(v) (((v) & NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16)
#define NVIDIA_P2P_MINOR_VERSION(v) (((v) & NVIDIA_P2P_MINOR_VERSION_MASK))

#define NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION((p)->version) == NVIDIA_P2P_MAJOR_VERSION(v))

/* Same major version and a minor version at least as new as v. */
#define NVIDIA_P2P_VERSION_COMPATIBLE(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) && \
	 (NVIDIA_P2P_MINOR_VERSION((p)->version) >= NVIDIA_P2P_MINOR_VERSION(v)))

/* --- capabilities and flags ------------------------------------------------------------------ */

/* nvidia_p2p_get_pages_persistent()/nvidia_p2p_put_pages_persistent() exist (r535+). */
#define NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API

/* Flags of nvidia_p2p_get_pages_persistent()/nvidia_p2p_put_pages_persistent(). */
#define NVIDIA_P2P_FLAGS_DEFAULT            0
#define NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING 1   /* r570+: map through BAR1 even on C2C systems */

/* --- legacy mapping interface ---------------------------------------------------------------- */

typedef enum {
	NVIDIA_P2P_ARCHITECTURE_TESLA = 0,
	NVIDIA_P2P_ARCHITECTURE_FERMI,
	NVIDIA_P2P_ARCHITECTURE_CURRENT = NVIDIA_P2P_ARCHITECTURE_FERMI
} nvidia_p2p_architecture_t;

typedef enum {
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_GPU = 0,
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_THIRD_PARTY_DEVICE,
	NVIDIA_P2P_PARAMS_ADDRESS_INDEX_MAX = NVIDIA_P2P_PARAMS_ADDRESS_INDEX_THIRD_PARTY_DEVICE
} nvidia_p2p_params_address_index_t;

#define NVIDIA_P2P_PARAMS_VERSION 0x00010001

typedef struct nvidia_p2p_params {
	u32 version;
	u32 architecture;
	union nvidia_p2p_mailbox_addresses {
		struct {
			u64 wmb_addr;
			u64 wmb_data;
			u64 rreq_addr;
			u64 rcomp_addr;
			u64 reserved[2];
		} fermi;
	} addresses[NVIDIA_P2P_PARAMS_ADDRESS_INDEX_MAX + 1];
} nvidia_p2p_params_t;

int nvidia_p2p_init_mapping(u64 p2p_token, struct nvidia_p2p_params *params,
			    void (*destroy_callback)(void *data), void *data);
int nvidia_p2p_destroy_mapping(u64 p2p_token);

/* --- page tables ----------------------------------------------------------------------------- */

enum nvidia_p2p_page_size_type {
	NVIDIA_P2P_PAGE_SIZE_4KB = 0,
	NVIDIA_P2P_PAGE_SIZE_64KB,
	NVIDIA_P2P_PAGE_SIZE_128KB,
	NVIDIA_P2P_PAGE_SIZE_COUNT
};

typedef struct nvidia_p2p_page {
	u64 physical_address;
	union nvidia_p2p_request_registers {
		struct {
			u32 wreqmb_h;
			u32 rreqmb_h;
			u32 rreqmb_0;
			u32 reserved[3];
		} fermi;
	} registers;
} nvidia_p2p_page_t;

/* 2.0 (r580.65.06+) added the flags field; 1.2 was used by r515-r575. */
#define NVIDIA_P2P_PAGE_TABLE_VERSION 0x00020000

#define NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_PAGE_TABLE_VERSION)

/* nvidia_p2p_page_table.flags: the CPU may map these pages cacheable (coherent platforms). */
#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE 0x1

#define NVIDIA_P2P_GPU_UUID_LEN 16

typedef struct nvidia_p2p_page_table {
	u32 version;
	u32 page_size;                    /* enum nvidia_p2p_page_size_type */
	struct nvidia_p2p_page **pages;
	u32 entries;
	u8 *gpu_uuid;                     /* NVIDIA_P2P_GPU_UUID_LEN bytes */
	u32 flags;                        /* NVIDIA_P2P_PAGE_TABLE_FLAGS_* */
} nvidia_p2p_page_table_t;

/*
 * Pin the GPU memory [virtual_address, virtual_address + length) of the caller's address space
 * and describe it in *page_table. free_callback(data) is called if the memory is freed while
 * pinned; it is required (NULL -> -EINVAL). p2p_token and va_space are legacy and passed as 0.
 */
int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address, u64 length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);

/* Pin without a free callback; the pages stay reserved until put_pages_persistent. May sleep. */
int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table, u32 flags);

int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table);

int nvidia_p2p_put_pages_persistent(u64 virtual_address,
				    struct nvidia_p2p_page_table *page_table, u32 flags);

/* Called from a free callback to release the page table the driver handed out. */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);

/* --- DMA mappings for a peer device ---------------------------------------------------------- */

#define NVIDIA_P2P_DMA_MAPPING_VERSION 0x00020003

#define NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_DMA_MAPPING_VERSION)

typedef struct nvidia_p2p_dma_mapping {
	u32 version;
	enum nvidia_p2p_page_size_type page_size_type;
	u32 entries;
	u64 *dma_addresses;
	void *private;
	struct pci_dev *pci_dev;
} nvidia_p2p_dma_mapping_t;

int nvidia_p2p_dma_map_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping);
int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping);
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping);

/* --- relaxed-ordering sync (POWER/NPU platforms) -------------------------------------------- */

#define NVIDIA_P2P_RSYNC_DRIVER_VERSION   0x00010001
#define NVIDIA_P2P_RSYNC_REG_INFO_VERSION 0x00020001

typedef struct nvidia_p2p_rsync_driver {
	u32 version;
	int (*get_relaxed_ordering_mode)(int *mode, void *data);
	void (*put_relaxed_ordering_mode)(int mode, void *data);
	void (*wait_for_rsync)(struct pci_dev *gpu, void *data);
} nvidia_p2p_rsync_driver_t;

typedef struct nvidia_p2p_rsync_reg {
	void *ptr;
	size_t size;
	struct pci_dev *ibmnpu;
	struct pci_dev *gpu;
	u32 cluster_id;
	u32 socket_id;
} nvidia_p2p_rsync_reg_t;

typedef struct nvidia_p2p_rsync_reg_info {
	u32 version;
	nvidia_p2p_rsync_reg_t *regs;
	size_t entries;
} nvidia_p2p_rsync_reg_info_t;

int nvidia_p2p_register_rsync_driver(nvidia_p2p_rsync_driver_t *driver, void *data);
void nvidia_p2p_unregister_rsync_driver(nvidia_p2p_rsync_driver_t *driver, void *data);
int nvidia_p2p_get_rsync_registers(nvidia_p2p_rsync_reg_info_t **reg_info);
void nvidia_p2p_put_rsync_registers(nvidia_p2p_rsync_reg_info_t *reg_info);

#endif /* _NV_P2P_H_ */
