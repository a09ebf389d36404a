// SPDX-License-Identifier: MIT OR GPL-2.0
/* Probe: vmf_insert_pfn_prot() exists and returns vm_fault_t (Linux 4.20+). */
#include <linux/mm.h>

vm_fault_t gdrdrv_probe(struct vm_area_struct *vma, unsigned long addr, unsigned long pfn);
vm_fault_t gdrdrv_probe(struct vm_area_struct *vma, unsigned long addr, unsigned long pfn)
{
	return vmf_insert_pfn_prot(vma, addr, pfn, vma->vm_page_prot);
}
