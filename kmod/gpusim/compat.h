/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Kernel-version differences used by gpusim, decided by the probes in Kbuild.
 */
#ifndef GPUSIM_COMPAT_H
#define GPUSIM_COMPAT_H

#include <linux/mm.h>
#include <linux/module.h>
#include <linux/version.h>

/* dma-buf symbols live in the DMA_BUF namespace since 5.16; 6.13 made the name a string. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
#define GS_MODULE_IMPORT_DMA_BUF_NS MODULE_IMPORT_NS("DMA_BUF")
#elif LINUX_VERSION_CODE >= KERNEL_VERSION(5, 16, 0)
#define GS_MODULE_IMPORT_DMA_BUF_NS MODULE_IMPORT_NS(DMA_BUF)
#else
#define GS_MODULE_IMPORT_DMA_BUF_NS
#endif

/* Linux 6.3 made vm_flags read-only and added vm_flags_set(). */
static inline void gs_vm_flags_set(struct vm_area_struct *vma, unsigned long flags)
{
#ifdef GS_HAVE_VM_FLAGS_SET
	vm_flags_set(vma, flags);
#else
	vma->vm_flags |= flags;
#endif
}

#endif /* GPUSIM_COMPAT_H */
