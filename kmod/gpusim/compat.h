/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Kernel-version differences used by gpusim, decided by the probes in Kbuild.
 */
#ifndef GPUSIM_COMPAT_H
#define GPUSIM_COMPAT_H

#include <linux/mm.h>

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
