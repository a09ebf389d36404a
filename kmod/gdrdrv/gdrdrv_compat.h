/* SPDX-License-Identifier: MIT OR GPL-2.0 */
/*
 * gdrdrv_compat.h - every difference between kernel versions, architectures and NVIDIA header
 * versions that gdrdrv.c cares about. gdrdrv.c itself contains no version checks.
 *
 * Kernel features are answered by build-time probes (probes/<feature>.c, compiled against the
 * target kernel by probes/run.sh into gdrdrv_probes.h); NVIDIA header features by the macros the
 * NVIDIA header defines.
 */
#ifndef GDRDRV_COMPAT_H
#define GDRDRV_COMPAT_H

#include <linux/version.h>
#include <linux/mm.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/timex.h>
#include <linux/io.h>
#include <asm/io.h>

#include "gdrdrv_probes.h"
#include "nv-p2p.h"

#if !defined(CONFIG_X86) && !defined(CONFIG_PPC64) && !defined(CONFIG_ARM64)
#error "gdrdrv supports x86, ppc64 and arm64 only"
#endif

/* ---- NVIDIA nv-p2p header ------------------------------------------------------------------- */

#if !defined(NVIDIA_P2P_PAGE_TABLE_VERSION)
#error "nv-p2p.h does not define NVIDIA_P2P_PAGE_TABLE_VERSION"
#endif

/* Page tables of major version 1 and 2 are understood; anything else is refused at build time. */
#if NVIDIA_P2P_MAJOR_VERSION(NVIDIA_P2P_PAGE_TABLE_VERSION) == 1
#define GDRDRV_NV_PT_HAS_FLAGS (NVIDIA_P2P_MINOR_VERSION(NVIDIA_P2P_PAGE_TABLE_VERSION) >= 3)
#elif NVIDIA_P2P_MAJOR_VERSION(NVIDIA_P2P_PAGE_TABLE_VERSION) == 2
#define GDRDRV_NV_PT_HAS_FLAGS 1
#else
#error "unsupported nv-p2p page table version (need major version 1 or 2)"
#endif

/* Does the page table say that the CPU may map it cacheable? */
#if GDRDRV_NV_PT_HAS_FLAGS && defined(NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE)
static inline bool gdrdrv_pt_cpu_cacheable(const struct nvidia_p2p_page_table *pt)
{
	return pt->flags & NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE;
}
#else
static inline bool gdrdrv_pt_cpu_cacheable(const struct nvidia_p2p_page_table *pt)
{
	return false;
}
#endif

/*
 * Persistent pinning: either the dedicated API (r535+), or on older drivers get_pages with a
 * NULL callback when the driver advertises nvidia_p2p_cap_persistent_pages at run time.
 */
#if defined(NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API)
#define GDRDRV_NV_HAS_PERSISTENT_API 1
static inline bool gdrdrv_nv_persistent_supported(void)
{
	return true;
}
#elif defined(NVIDIA_P2P_CAP_PERSISTENT_PAGES)
#define GDRDRV_NV_HAS_PERSISTENT_API 0
static inline bool gdrdrv_nv_persistent_supported(void)
{
	return nvidia_p2p_cap_persistent_pages != 0;
}
#else
#define GDRDRV_NV_HAS_PERSISTENT_API 0
static inline bool gdrdrv_nv_persistent_supported(void)
{
	return false;
}
#endif

/* FORCE_PCIE pins need the r570+ BAR1 flag. */
#if defined(NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING)
#define GDRDRV_NV_HAS_FORCE_BAR1 1
#define GDRDRV_NV_FLAG_FORCE_BAR1 NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING
#else
#define GDRDRV_NV_HAS_FORCE_BAR1 0
#define GDRDRV_NV_FLAG_FORCE_BAR1 0
#endif

/* ---- NVIDIA driver flavor ------------------------------------------------------------------- */

/*
 * The open-source NVIDIA driver exports its p2p API GPL-only, so a module built for it may use
 * GPL-only kernel symbols as well. A module built for the proprietary driver must not, or the
 * kernel refuses to load it next to the proprietary module.
 */
#if defined(GDRDRV_OPENSOURCE_NVIDIA)
#define GDRDRV_FLAVOR "opensource"
#else
#define GDRDRV_FLAVOR "proprietary"
#endif

/* ---- VMA flags (vm_flags is read-only since 6.3) ------------------------------------------ */

#if defined(GDRDRV_HAVE_VM_FLAGS_SET)
static inline void gdrdrv_vm_flags_set(struct vm_area_struct *vma, unsigned long flags)
{
	vm_flags_set(vma, flags);
}
#else
static inline void gdrdrv_vm_flags_set(struct vm_area_struct *vma, unsigned long flags)
{
	vma->vm_flags |= flags;
}
#endif

/* ---- procfs (struct proc_ops since 5.6) ---------------------------------------------------- */

#if defined(GDRDRV_HAVE_PROC_OPS)
#define GDRDRV_PROC_OPS(name, openfn)			\
	static const struct proc_ops name = {		\
		.proc_open = openfn,			\
		.proc_read = seq_read,			\
		.proc_lseek = seq_lseek,		\
		.proc_release = single_release,		\
	}
typedef struct proc_ops gdrdrv_proc_ops_t;
#else
#define GDRDRV_PROC_OPS(name, openfn)			\
	static const struct file_operations name = {	\
		.owner = THIS_MODULE,			\
		.open = openfn,				\
		.read = seq_read,			\
		.llseek = seq_lseek,			\
		.release = single_release,		\
	}
typedef struct file_operations gdrdrv_proc_ops_t;
#endif

/* ---- cycle counter used for the pin timing -------------------------------------------------- */

#if defined(CONFIG_X86)
static inline u32 gdrdrv_tsc_khz(void)
{
	return cpu_khz;
}
#define GDRDRV_HAVE_PIN_TIMING 1
#elif defined(CONFIG_PPC64)
static inline u32 gdrdrv_tsc_khz(void)
{
	/* There is no exported timebase frequency in kHz; this is what the original reports. */
	return get_cycles() / 1000;
}
#define GDRDRV_HAVE_PIN_TIMING 1
#else
static inline u32 gdrdrv_tsc_khz(void)
{
	return 0;
}
#define GDRDRV_HAVE_PIN_TIMING 0
#endif

/* ---- page protections for the three mapping types ---------------------------------------- */

#if defined(CONFIG_X86)
/* The PAT entry Linux programs for write-combining is selected by PWT alone. */
static inline pgprot_t gdrdrv_pgprot_wc(pgprot_t prot)
{
	pgprotval_t v = pgprot_val(prot);

	v &= ~(_PAGE_PSE | _PAGE_PCD | _PAGE_PWT);
	v |= _PAGE_PWT;
	return __pgprot(v);
}
#else
static inline pgprot_t gdrdrv_pgprot_wc(pgprot_t prot)
{
	return pgprot_writecombine(prot);
}
#endif

#if defined(CONFIG_ARM64)
#define GDRDRV_HAVE_DEVICE_MAPPING 1
static inline pgprot_t gdrdrv_pgprot_device(pgprot_t prot)
{
	return pgprot_device(prot);
}
#else
/* Device mappings are only ever chosen on arm64; callers check GDRDRV_HAVE_DEVICE_MAPPING. */
#define GDRDRV_HAVE_DEVICE_MAPPING 0
static inline pgprot_t gdrdrv_pgprot_device(pgprot_t prot)
{
	return prot;
}
#endif

/* ---- may the CPU cache GPU memory? ------------------------------------------------------- */

#if defined(CONFIG_ARM64)
static inline bool gdrdrv_cpu_could_cache_gpu_mappings(void)
{
	return true;
}
#elif defined(CONFIG_PPC64)
#include <asm/reg.h>
static inline bool gdrdrv_cpu_could_cache_gpu_mappings(void)
{
	return pvr_version_is(PVR_POWER9);
}
#else
static inline bool gdrdrv_cpu_could_cache_gpu_mappings(void)
{
	return false;
}
#endif

/* Is this PFN ordinary system RAM (coherent GPU memory shows up as RAM on such platforms)? */
#if defined(CONFIG_X86)
static inline bool gdrdrv_pfn_is_ram(unsigned long pfn)
{
	return false;
}
#elif defined(GDRDRV_OPENSOURCE_NVIDIA)
static inline bool gdrdrv_pfn_is_ram(unsigned long pfn)
{
	return page_is_ram(pfn);
}
#elif defined(CONFIG_PPC64)
/* page_is_ram() is GPL-only: approximate coherent memory by its physical address range. */
static inline bool gdrdrv_pfn_is_ram(unsigned long pfn)
{
	return gdrdrv_cpu_could_cache_gpu_mappings() &&
	       ((u64)pfn << PAGE_SHIFT) < (1ULL << 47);
}
#else
static inline bool gdrdrv_pfn_is_ram(unsigned long pfn)
{
	return false;
}
#endif

/* ---- inserting BAR pages into user mappings ------------------------------------------------ */

/*
 * BAR pages are inserted by the fault handler. MMIO must be mapped decrypted in memory-encrypted
 * guests; pgprot_decrypted() is GPL-only there, so the proprietary flavor clears the SME bit
 * itself (confidential-computing guests other than SME are then not fully supported).
 */
#if defined(CONFIG_X86) && defined(CONFIG_ARCH_HAS_CC_PLATFORM) && \
	!defined(GDRDRV_OPENSOURCE_NVIDIA)
#warning "gdrdrv: proprietary NVIDIA flavor: confidential-computing guests are not fully supported"
static inline pgprot_t gdrdrv_pgprot_io(pgprot_t prot)
{
	return __pgprot(__sme_clr(pgprot_val(prot)));
}
#else
static inline pgprot_t gdrdrv_pgprot_io(pgprot_t prot)
{
	return pgprot_decrypted(prot);
}
#endif

#if defined(GDRDRV_HAVE_VMF_INSERT_PFN_PROT)
static inline vm_fault_t gdrdrv_insert_pfn(struct vm_area_struct *vma, unsigned long addr,
					   unsigned long pfn, pgprot_t prot)
{
	return vmf_insert_pfn_prot(vma, addr, pfn, prot);
}
#else
/* Before 4.20 the function returned an errno. */
static inline vm_fault_t gdrdrv_insert_pfn(struct vm_area_struct *vma, unsigned long addr,
					   unsigned long pfn, pgprot_t prot)
{
	int err = vm_insert_pfn_prot(vma, addr, pfn, prot);

	if (err == -ENOMEM)
		return VM_FAULT_OOM;
	if (err < 0 && err != -EBUSY)
		return VM_FAULT_SIGBUS;
	return VM_FAULT_NOPAGE;
}
#endif

/*
 * PAT (x86): a PFN inserted by a fault handler gets the memory type registered for its physical
 * range, not the one in the VMA's protection. A write-combining mapping therefore registers its
 * BAR ranges as WC for as long as it can have PTEs. Elsewhere these are no-ops (linux/io.h).
 */
static inline int gdrdrv_memtype_reserve_wc(u64 phys, u64 size)
{
	return arch_io_reserve_memtype_wc(phys, size);
}

static inline void gdrdrv_memtype_free_wc(u64 phys, u64 size)
{
	arch_io_free_memtype_wc(phys, size);
}

#endif /* GDRDRV_COMPAT_H */
