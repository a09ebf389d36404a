/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * libnvm_ioctl.h - the user/kernel ABI of the libnvm helper module (/dev/libnvmN).
 *
 * The three mapping ioctls, their numbers and the argument struct are those of libnvm's own
 * helper module (ssd-gpu-dma, module version 0.3), so either library works on either module.
 * NVM_GET_VERSION is ours: upstream's module answers it with EINVAL ("Unknown ioctl"), which a
 * library reads as "upstream module, ABI 1.0, no features". Usable from user space and kernel.
 */
#ifndef LIBNVM_IOCTL_H
#define LIBNVM_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define NVM_IOCTL_TYPE 0x80

/* 24 bytes on LP64 (upstream: uint64_t vaddr_start, size_t n_pages, uint64_t *ioaddrs). */
struct nvm_ioctl_map {
	__u64 vaddr_start;   /* in: rounded down to the page (4 KiB host, 64 KiB GPU) */
	__u64 n_pages;       /* in: pages to map, >= 1 */
	__u64 ioaddrs;       /* in: user pointer to n_pages u64s; out there: bus addresses */
};

/* The direction bits say "write" although MAP returns results through ioaddrs (upstream). */
#define NVM_MAP_HOST_MEMORY   _IOW(NVM_IOCTL_TYPE, 1, struct nvm_ioctl_map)  /* 0x40188001 */
#define NVM_MAP_DEVICE_MEMORY _IOW(NVM_IOCTL_TYPE, 2, struct nvm_ioctl_map)  /* 0x40188002 */
#define NVM_UNMAP_MEMORY      _IOW(NVM_IOCTL_TYPE, 3, __u64)                 /* 0x40088003 */

/*
 * ABI version. major changes when an existing ioctl changes meaning (a library must refuse a
 * module whose major differs); minor grows with additions. Number 0x40 stays clear of upstream's
 * 1..3 and of BaM's fork, which kept the same three.
 */
#define NVM_ABI_MAJOR 1
#define NVM_ABI_MINOR 0

/* features */
#define NVM_FEATURE_DEVICE_MEMORY   0x1   /* NVM_MAP_DEVICE_MEMORY works (built with nv-p2p) */
#define NVM_FEATURE_RELEASE_ON_CLOSE 0x2  /* mappings die with the last close of their file */
#define NVM_FEATURE_ANY_THREAD_UNMAP 0x4  /* any thread of the file may unmap (upstream: mapper) */

struct nvm_ioctl_version {
	__u32 abi_major;     /* out: NVM_ABI_MAJOR */
	__u32 abi_minor;     /* out: NVM_ABI_MINOR */
	__u32 features;      /* out: NVM_FEATURE_* */
	__u32 reserved;      /* out: 0 */
};

#define NVM_GET_VERSION _IOR(NVM_IOCTL_TYPE, 0x40, struct nvm_ioctl_version)  /* 0x80108040 */

#endif /* LIBNVM_IOCTL_H */
