// SPDX-License-Identifier: MIT OR GPL-2.0
/* Probe: vm_flags_set() exists (Linux 6.3+, vm_flags became read-only). */
#include <linux/mm.h>

void gdrdrv_probe(struct vm_area_struct *vma);
void gdrdrv_probe(struct vm_area_struct *vma)
{
	vm_flags_set(vma, VM_DONTCOPY);
}
