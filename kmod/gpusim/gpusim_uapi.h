/* SPDX-License-Identifier: MIT */
/*
 * User-space interface of gpusim, the test-only simulated GPU.
 *
 * gpusim turns the prefetchable BAR of QEMU's ivshmem-plain device into "GPU memory". User space
 * (sim/cudasim, our libcuda stand-in) allocates from it through /dev/gpusim; gdrdrv pins the same
 * memory through the nvidia_p2p_* kernel API that gpusim exports.
 *
 * Address model (mirrors CUDA's unified addressing):
 *  - Every process (thread group) that opens /dev/gpusim gets its own GPU virtual address space.
 *    GPUSIM_IOC_ALLOC returns a GPU VA, 64 KiB aligned, taken from
 *    [GPUSIM_VA_BASE, GPUSIM_VA_BASE + GPUSIM_VA_SPAN) and never reused by that process.
 *  - The simulated GPU's own view of an allocation is obtained by mmap()ing /dev/gpusim with
 *    offset == gpu_va (so vm_pgoff == gpu_va >> PAGE_SHIFT). cudasim maps it at address gpu_va
 *    (MAP_FIXED_NOREPLACE) so that device pointers are also valid CPU addresses for the simulator.
 *    A mapping may cover a prefix or any page-aligned sub-range of one allocation.
 *  - nvidia_p2p_get_pages(token, va_space, va, len, ...) resolves va in the address space of the
 *    calling thread group (current->tgid), like the real driver resolves it in the caller's
 *    CUDA context.
 *  - GPUSIM_IOC_FREE (and the last close of a process's /dev/gpusim files) frees the allocation:
 *    free callbacks of non-persistent pins run first; persistent pins keep the BAR pages reserved
 *    until nvidia_p2p_put_pages_persistent. The simulator's own mappings of a freed allocation
 *    are zapped.
 */
#ifndef GPUSIM_UAPI_H
#define GPUSIM_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define GPUSIM_DEVICE_PATH "/dev/gpusim"
#define GPUSIM_PAGE_SIZE 0x10000ULL          /* GPU page: 64 KiB, as NVIDIA's p2p API */
#define GPUSIM_VA_BASE 0x200000000000ULL      /* 32 TiB: clear of PIE, heap and mmap areas */
#define GPUSIM_VA_SPAN 0x010000000000ULL      /* 1 TiB of GPU VA per process */

#define GPUSIM_IOC_MAGIC 0xE7

/* Allocate size bytes (rounded up to 64 KiB) of device memory. */
struct gpusim_alloc {
	__u64 size;    /* in: bytes, > 0 */
	__u64 flags;   /* in: 0 or GPUSIM_ALLOC_ALIGN_2M */
	__u64 gpu_va;  /* out: GPU virtual address, 64 KiB aligned (2 MiB with the flag) */
};

/* The GPU VA is 2 MiB aligned (CUDA's large pages; cudasim's sub-allocation regions). Only the
 * address is aligned: the allocation still takes size rounded up to 64 KiB of BAR pages. */
#define GPUSIM_ALLOC_ALIGN_2M 0x1

/* Free an allocation by its exact start address. */
struct gpusim_free {
	__u64 gpu_va;  /* in */
};

/* Device facts, for cuDeviceGetAttribute/cuMemGetInfo. */
struct gpusim_info {
	__u64 bar_size;       /* out: bytes of simulated device memory */
	__u64 bar_phys;       /* out: BAR physical address (what page tables report) */
	__u64 free_bytes;     /* out: bytes not allocated or held by persistent pins */
	__u32 pci_domain;     /* out */
	__u32 pci_bus;        /* out */
	__u32 pci_device;     /* out */
	__u32 pci_function;   /* out */
	__u64 active_pins;    /* out: outstanding nvidia_p2p pins, all processes */
};

/* Look up which allocation contains gpu_va in the caller's address space. */
struct gpusim_query {
	__u64 gpu_va;     /* in: any address */
	__u64 base;       /* out: allocation start */
	__u64 size;       /* out: allocation size (64 KiB multiple) */
};

/*
 * Export [gpu_va, gpu_va + size) of one allocation of the caller's address space as a dma-buf, the
 * way NVIDIA's open driver does for cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD):
 * one dma-buf per export, exporter name "nv_dmabuf", file flags O_RDWR | O_CLOEXEC, the range
 * resolved to BAR (PCIe) physical pages. gpu_va and size must be multiples of the host page size.
 * The dma-buf holds its own reference on the memory: freeing the allocation (or closing
 * /dev/gpusim) does not free the BAR pages of an exported range until the dma-buf's last
 * reference (fd, mmap, importer attachment) goes.
 */
struct gpusim_export_dmabuf {
	__u64 gpu_va;  /* in: host-page aligned */
	__u64 size;    /* in: bytes, host-page multiple, > 0 */
	__u32 flags;   /* in: 0 or GPUSIM_EXPORT_FORCE_PCIE */
	__s32 fd;      /* out: the dma-buf file descriptor (O_CLOEXEC) */
};

/*
 * Run the free callbacks of the non-persistent pins that overlap [gpu_va, gpu_va + size) inside
 * one allocation, as freeing that part would, without freeing anything: cudasim sub-allocates
 * small cuMemAllocs from one gpusim allocation (a 2 MiB region, as CUDA does) and calls this when
 * one of them is freed while its neighbours live on. Each such pin is invalidated whole (the
 * pinned range, 64 KiB pages, may extend over neighbours); pins that do not overlap stay valid,
 * persistent pins are never affected. The caller's CPU mappings are left alone.
 */
struct gpusim_invalidate {
	__u64 gpu_va;  /* in: any address inside one allocation */
	__u64 size;    /* in: bytes, > 0, inside the same allocation */
};

/* CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: only coherent (Grace) platforms support it; this
 * simulated discrete GPU refuses it with EOPNOTSUPP, as the real driver does on x86. */
#define GPUSIM_EXPORT_FORCE_PCIE 0x1

#define GPUSIM_IOC_ALLOC _IOWR(GPUSIM_IOC_MAGIC, 1, struct gpusim_alloc)
#define GPUSIM_IOC_FREE  _IOW(GPUSIM_IOC_MAGIC, 2, struct gpusim_free)
#define GPUSIM_IOC_INFO  _IOR(GPUSIM_IOC_MAGIC, 3, struct gpusim_info)
#define GPUSIM_IOC_QUERY _IOWR(GPUSIM_IOC_MAGIC, 4, struct gpusim_query)
#define GPUSIM_IOC_EXPORT_DMABUF _IOWR(GPUSIM_IOC_MAGIC, 5, struct gpusim_export_dmabuf)
#define GPUSIM_IOC_INVALIDATE _IOW(GPUSIM_IOC_MAGIC, 6, struct gpusim_invalidate)

/*
 * Errors: EINVAL bad argument or unknown address; ENOMEM BAR exhausted or VA space exhausted;
 * ENOTTY unknown command; EFAULT bad user pointer; EACCES the file was opened by another process
 * (a fork child or the receiver of a passed fd must open /dev/gpusim itself: its GPU address
 * space is its own). mmap: EINVAL unless MAP_SHARED and the range lies inside one allocation;
 * EACCES as above. Mappings are not inherited across fork (VM_DONTCOPY) and are write-combining;
 * after FREE, access to an old mapping raises SIGBUS.
 * INVALIDATE: EINVAL size 0 or range not inside one allocation.
 * EXPORT_DMABUF: EINVAL unaligned or outside one allocation, bad flags; EOPNOTSUPP FORCE_PCIE;
 * EMFILE no free descriptor. mmap() of the dma-buf: ENOTSUPP (524) while the module parameter
 * dmabuf_mmap is 0 at export time (driver 580 on a discrete GPU); else a shared write-combining
 * mapping of any page range of the buffer (EINVAL beyond its end or for MAP_PRIVATE).
 */

#endif /* GPUSIM_UAPI_H */
