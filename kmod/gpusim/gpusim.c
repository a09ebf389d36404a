// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * gpusim - a simulated NVIDIA GPU for tests.
 *
 * Binds QEMU's ivshmem-plain PCI device (1af4:1110) and uses its 64-bit prefetchable BAR 2 as
 * "device memory", cut into 64 KiB GPU pages. It offers:
 *   - /dev/gpusim (uapi in gpusim_uapi.h): per-process GPU virtual address spaces, allocation,
 *     free, query, device info, and mmap of an allocation for the simulated GPU's own accesses;
 *   - the nvidia_p2p_* kernel API (kmod/nv-p2p/nv-p2p.h) with NVIDIA's names and signatures, so
 *     that gdrdrv links against this module exactly as it links against nvidia.ko.
 *
 * Objects
 *   gs_space  one per thread group that opened /dev/gpusim; holds its allocations and a private
 *             address_space that all of its files use, so that freeing an allocation zaps exactly
 *             that process's CPU mappings of it (GPU VAs of different processes overlap).
 *   gs_alloc  one allocation: GPU VA range and the BAR page index of each 64 KiB page.
 *   gs_pin    one nvidia_p2p page table handed out. Non-persistent pins hang off their allocation
 *             and own no page references; persistent pins take a reference on every BAR page they
 *             cover, so the pages stay reserved after the allocation is freed.
 *   gs_dmabuf one exported dma-buf (GPUSIM_IOC_EXPORT_DMABUF): the BAR pages of the exported
 *             range, each referenced, so they outlive the allocation until the dma-buf is released.
 *   gs_dma    one nvidia_p2p_dma_mapping handed out: the bus addresses of a pin's pages for one
 *             peer PCI device (dma_map_resource), hanging off its pin and torn down with it.
 *   page_ref  per BAR page reference count: one for the owning allocation, one per persistent
 *             pin and one per dma-buf covering it. A page is free when its count is zero.
 *
 * Locking
 *   gs.lock (mutex) protects everything above: space list, allocation lists, page_ref, the pin
 *   registry (gs.pins, every live page table), pin state and the counters. It is held only for
 *   bookkeeping and for inserting PTEs in the fault handler; it is never held while
 *     - calling a client's free callback,
 *     - copying from/to user space (which may fault and take mmap_lock),
 *     - zapping CPU mappings (unmap_mapping_range takes i_mmap_rwsem).
 *   Lock order: mmap_lock -> gs.lock (fault handler). Nothing takes mmap_lock under gs.lock.
 *
 *   Free callbacks: a client (gdrdrv) holds its own region lock around nvidia_p2p_get_pages, and its
 *   callback takes that same region lock. Freeing an allocation therefore (1) unlinks it and marks
 *   its pins GS_PIN_CALLBACK under gs.lock, (2) drops gs.lock, (3) calls each callback with no
 *   gpusim lock held, (4) retakes gs.lock to drop the pins from the registry and release the pages,
 *   then wakes gs.wq. Exactly one of "put_pages succeeds" and "the callback runs" happens for a pin:
 *   put_pages on a pin already in GS_PIN_CALLBACK waits (without locks) on gs.wq until the callback
 *   has returned and then fails with -EINVAL, so a client never counts the release twice. A
 *   put_pages from inside the pin's own callback returns -EINVAL at once instead of waiting.
 *   GPUSIM_IOC_INVALIDATE (a sub-allocation of a shared region freed in user space) runs steps
 *   (1)-(4) for the non-persistent pins overlapping a range only, leaving the allocation, its
 *   pages and its CPU mappings alone.
 *   nvidia_p2p_free_page_table() takes no lock (it is a no-op, as in current NVIDIA drivers, where
 *   the driver frees the table itself after the callback returns).
 *
 * Memory type: the whole BAR is reserved write-combining with PAT at probe time
 * (arch_io_reserve_memtype_wc), and /dev/gpusim mappings are pgprot_writecombine, the same type
 * gdrdrv uses for its user mappings, so PAT never sees two memtypes for one page.
 *
 * dma-buf lifetime follows NVIDIA's open driver (nv-dmabuf.c), where an export duplicates the
 * memory handles under the dma-buf's own client and undups them only in the dma-buf's release:
 * freeing the allocation while it is exported, mapped or attached neither revokes nor moves
 * anything (the attachment is static, no move_notify); the pages stay reserved, and CPU mappings
 * of the dma-buf stay valid, until the last file reference goes (the fd, every VMA, every
 * importer's attachment all hold one). Only then do the pages return to the pool, so no mapping
 * or DMA address can outlive the memory behind it.
 *
 * CPU mappings of an allocation are populated by a fault handler that looks the allocation up
 * under gs.lock at fault time; freeing unlinks first and zaps afterwards, and pages are returned
 * to the free pool only after the zap and the callbacks, so no PTE can outlive its allocation.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/pci.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/io.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/mutex.h>
#include <linux/wait.h>
#include <linux/sched.h>
#include <linux/pid.h>
#include <linux/uuid.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/uaccess.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/scatterlist.h>
#include <linux/file.h>

#include "gpusim_uapi.h"
#include "nv-p2p.h"
#include "compat.h"

#define GS_PAGE_SHIFT 16
#define GS_PAGE_SIZE (1ULL << GS_PAGE_SHIFT)
#define GS_PAGE_MASK (GS_PAGE_SIZE - 1)

static int verbose;
module_param(verbose, int, 0644);
MODULE_PARM_DESC(verbose, "0: errors only, 1: allocations and pins, 2: also faults");

static bool scatter_pages;
module_param(scatter_pages, bool, 0644);
MODULE_PARM_DESC(scatter_pages,
		 "take an allocation's BAR pages in descending order, so that consecutive GPU pages are never physically contiguous");

static bool dmabuf_mmap = true;
module_param(dmabuf_mmap, bool, 0644);
MODULE_PARM_DESC(dmabuf_mmap,
		 "1: dma-bufs exported from now on can be mmap()ed (the CUDA 13.3+ drivers gdrcopy's dma-buf backend needs); 0: their mmap fails with ENOTSUPP (524), as driver 580 on a discrete GPU");

#define gs_dbg(lvl, fmt, ...) \
	do { if (verbose >= (lvl)) pr_info(fmt, ##__VA_ARGS__); } while (0)

struct gs_space {
	struct list_head node;        /* in gs.spaces */
	struct pid *tgid;             /* owning thread group (referenced) */
	unsigned int files;           /* open files of this space */
	struct list_head allocs;
	u64 next_va;
	struct address_space mapping; /* f_mapping of every file of this space */
};

struct gs_alloc {
	struct list_head node;        /* in space->allocs */
	u64 va;
	u64 size;
	u32 npages;
	u32 *pages;                   /* BAR page index of each GPU page */
	struct list_head pins;        /* non-persistent pins */
};

enum gs_pin_state { GS_PIN_ACTIVE, GS_PIN_CALLBACK, GS_PIN_DONE };

struct gs_pin {
	struct nvidia_p2p_page_table pt;  /* what clients see; container_of() back to the pin */
	struct list_head reg_node;        /* in gs.pins */
	struct list_head alloc_node;      /* in alloc->pins (non-persistent) or local lists */
	bool persistent;
	enum gs_pin_state state;
	unsigned int refs;                /* 1 while registered + 1 per put_pages waiter */
	struct task_struct *cb_task;      /* task running the callback (GS_PIN_CALLBACK) */
	u64 va;
	u64 len;
	u32 *bar_pages;                   /* persistent: referenced pages */
	void (*free_callback)(void *data);
	void *data;
	struct nvidia_p2p_page *page_array;
	struct nvidia_p2p_page **page_ptrs;
	u8 uuid[NVIDIA_P2P_GPU_UUID_LEN];
	struct list_head dmas;            /* its gs_dma peer mappings */
};

struct gs_dma {
	struct nvidia_p2p_dma_mapping m;  /* what clients see */
	struct list_head reg_node;        /* in gs.dmas */
	struct list_head pin_node;        /* in pin->dmas */
	struct gs_pin *pin;
	u32 mapped;                       /* pages mapped so far (teardown unmaps these) */
	u64 *addrs;
};

static struct {
	struct mutex lock;
	wait_queue_head_t wq;
	struct pci_dev *pdev;
	bool present;
	bool wc_reserved;
	u64 bar_phys;
	u64 bar_size;
	u32 npages;
	u32 free_pages;
	u32 alloc_cursor;
	u32 *page_ref;
	struct list_head spaces;
	struct list_head pins;
	struct list_head dmas;
	u64 active_dma_mappings;
	u64 total_dma_mappings;
	u64 active_pins;
	u64 total_pins;
	u64 callbacks_run;
	u64 active_dmabufs;
	u64 dmabuf_pages;            /* page references held by live dma-bufs */
	u64 dmabuf_attachments;
	u64 total_dmabufs;
	u8 uuid[NVIDIA_P2P_GPU_UUID_LEN];
	struct dentry *debugfs;
} gs = {
	.lock = __MUTEX_INITIALIZER(gs.lock),
	.wq = __WAIT_QUEUE_HEAD_INITIALIZER(gs.wq),
	.spaces = LIST_HEAD_INIT(gs.spaces),
	.pins = LIST_HEAD_INIT(gs.pins),
	.dmas = LIST_HEAD_INIT(gs.dmas),
};

static void gs_pin_drop_dmas_locked(struct gs_pin *pin);

/* ---------------------------------------------------------------- BAR page pool (gs.lock) --- */

static void gs_put_page_locked(u32 idx)
{
	if (WARN_ON(idx >= gs.npages || gs.page_ref[idx] == 0))
		return;
	if (--gs.page_ref[idx] == 0)
		gs.free_pages++;
}

/* Takes n free pages; pages need not be contiguous. */
static int gs_take_pages_locked(u32 *out, u32 n)
{
	u32 got = 0, i, idx;

	if (n > gs.free_pages)
		return -ENOMEM;
	if (scatter_pages) {
		for (idx = gs.npages; idx-- > 0 && got < n;)
			if (gs.page_ref[idx] == 0)
				out[got++] = idx;
	} else {
		/* next fit from a moving cursor: contiguous while the pool is not fragmented */
		for (i = 0; i < gs.npages && got < n; i++) {
			idx = (gs.alloc_cursor + i) % gs.npages;
			if (gs.page_ref[idx] == 0)
				out[got++] = idx;
		}
		gs.alloc_cursor = (idx + 1) % gs.npages;
	}
	if (WARN_ON(got != n))
		return -ENOMEM;
	for (i = 0; i < n; i++)
		gs.page_ref[out[i]] = 1;
	gs.free_pages -= n;
	return 0;
}

/* -------------------------------------------------------------- spaces and allocations --- */

static struct gs_space *gs_space_find_locked(struct pid *tgid)
{
	struct gs_space *sp;

	list_for_each_entry(sp, &gs.spaces, node)
		if (sp->tgid == tgid)
			return sp;
	return NULL;
}

/* Allocation that fully contains [va, va + len), or NULL. len may be 0 (point lookup). */
static struct gs_alloc *gs_alloc_find_locked(struct gs_space *sp, u64 va, u64 len)
{
	struct gs_alloc *a;

	if (len && va + len < va)
		return NULL;
	list_for_each_entry(a, &sp->allocs, node) {
		if (va >= a->va && va - a->va < a->size) {
			if (len && va + len > a->va + a->size)
				return NULL;
			return a;
		}
	}
	return NULL;
}

static void gs_pin_free(struct gs_pin *pin)
{
	if (!pin)
		return;
	kvfree(pin->page_ptrs);
	kvfree(pin->page_array);
	kvfree(pin->bar_pages);
	kfree(pin);
}

/* Under gs.lock. */
static void gs_pin_unref_locked(struct gs_pin *pin)
{
	if (--pin->refs == 0)
		gs_pin_free(pin);
}

/*
 * Tears an allocation down. Called without gs.lock, with @a already unlinked from its space and
 * its pins moved to @pins (state GS_PIN_CALLBACK). Zaps the owner's CPU mappings, runs the free
 * callbacks, then releases the pins and the BAR pages.
 */
/*
 * Runs the free callbacks of @pins (state GS_PIN_CALLBACK, already off their allocation's list)
 * without gs.lock, as a GPU driver calls them, then takes gs.lock and takes the pins out of the
 * registry. Returns with gs.lock held.
 */
static void gs_run_free_callbacks(struct list_head *pins, u64 freed_va, u64 freed_len)
{
	struct gs_pin *pin, *tmp;

	list_for_each_entry(pin, pins, alloc_node) {
		gs_dbg(1, "free callback (0x%llx+0x%llx freed): pid %d va 0x%llx len 0x%llx\n",
		       freed_va, freed_len, task_tgid_nr(current), pin->va, pin->len);
		pin->free_callback(pin->data);
	}

	mutex_lock(&gs.lock);
	list_for_each_entry_safe(pin, tmp, pins, alloc_node) {
		gs_pin_drop_dmas_locked(pin);
		list_del(&pin->reg_node);
		list_del_init(&pin->alloc_node);
		pin->state = GS_PIN_DONE;
		gs.active_pins--;
		gs.callbacks_run++;
		gs_pin_unref_locked(pin);
	}
}

static void gs_alloc_destroy(struct gs_space *sp, struct gs_alloc *a, struct list_head *pins)
{
	u32 i;

	unmap_mapping_range(&sp->mapping, a->va, a->size, 1);
	gs_run_free_callbacks(pins, a->va, a->size);
	for (i = 0; i < a->npages; i++)
		gs_put_page_locked(a->pages[i]);
	mutex_unlock(&gs.lock);
	wake_up_all(&gs.wq);

	kvfree(a->pages);
	kfree(a);
}

/* Under gs.lock: unlink @a and hand its pins to @pins for gs_alloc_destroy(). */
static void gs_alloc_detach_locked(struct gs_alloc *a, struct list_head *pins)
{
	struct gs_pin *pin;

	list_del(&a->node);
	list_for_each_entry(pin, &a->pins, alloc_node) {
		pin->state = GS_PIN_CALLBACK;
		pin->cb_task = current;
	}
	list_splice_init(&a->pins, pins);
}

static int gs_ioc_alloc(struct gs_space *sp, struct gpusim_alloc *arg)
{
	struct gs_alloc *a;
	u64 size, va;
	int ret;

	if (arg->size == 0 || (arg->flags & ~GPUSIM_ALLOC_ALIGN_2M) ||
	    arg->size > U64_MAX - GS_PAGE_MASK)
		return -EINVAL;
	size = (arg->size + GS_PAGE_MASK) & ~GS_PAGE_MASK;
	if (size > gs.bar_size)
		return -ENOMEM;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	a->size = size;
	a->npages = size >> GS_PAGE_SHIFT;
	INIT_LIST_HEAD(&a->pins);
	a->pages = kvmalloc_array(a->npages, sizeof(u32), GFP_KERNEL);
	if (!a->pages) {
		kfree(a);
		return -ENOMEM;
	}

	mutex_lock(&gs.lock);
	/* VAs are never reused; a one-page hole between allocations catches overruns. */
	va = sp->next_va;
	if (arg->flags & GPUSIM_ALLOC_ALIGN_2M)
		va = ALIGN(va, 2ULL << 20);
	if (va + size > GPUSIM_VA_BASE + GPUSIM_VA_SPAN) {
		ret = -ENOMEM;
		goto unlock;
	}
	ret = gs_take_pages_locked(a->pages, a->npages);
	if (ret)
		goto unlock;
	a->va = va;
	sp->next_va = va + size + GS_PAGE_SIZE;
	list_add_tail(&a->node, &sp->allocs);
	arg->gpu_va = a->va;
	gs_dbg(1, "alloc: pid %d va 0x%llx size 0x%llx first page %u\n",
	       task_tgid_nr(current), a->va, size, a->pages[0]);
	mutex_unlock(&gs.lock);
	return 0;

unlock:
	mutex_unlock(&gs.lock);
	kvfree(a->pages);
	kfree(a);
	return ret;
}

static int gs_ioc_free(struct gs_space *sp, u64 va)
{
	struct gs_alloc *a;
	LIST_HEAD(pins);

	mutex_lock(&gs.lock);
	a = gs_alloc_find_locked(sp, va, 0);
	if (!a || a->va != va) {
		mutex_unlock(&gs.lock);
		return -EINVAL;
	}
	gs_alloc_detach_locked(a, &pins);
	mutex_unlock(&gs.lock);
	gs_dbg(1, "free: pid %d va 0x%llx\n", task_tgid_nr(current), va);
	gs_alloc_destroy(sp, a, &pins);
	return 0;
}

/*
 * GPUSIM_IOC_INVALIDATE: the free callbacks of the non-persistent pins overlapping the range,
 * with the same protocol as gs_alloc_destroy() (state GS_PIN_CALLBACK under gs.lock, callbacks
 * without it, then the pins leave the registry), but the allocation, its pages and the CPU
 * mappings stay.
 */
static int gs_ioc_invalidate(struct gs_space *sp, u64 va, u64 len)
{
	struct gs_alloc *a;
	struct gs_pin *pin, *tmp;
	LIST_HEAD(pins);

	if (len == 0)
		return -EINVAL;
	mutex_lock(&gs.lock);
	a = gs_alloc_find_locked(sp, va, len);
	if (!a) {
		mutex_unlock(&gs.lock);
		return -EINVAL;
	}
	list_for_each_entry_safe(pin, tmp, &a->pins, alloc_node) {
		if (pin->va < va + len && va < pin->va + pin->len) {
			pin->state = GS_PIN_CALLBACK;
			pin->cb_task = current;
			list_move_tail(&pin->alloc_node, &pins);
		}
	}
	mutex_unlock(&gs.lock);

	gs_run_free_callbacks(&pins, va, len);
	mutex_unlock(&gs.lock);
	wake_up_all(&gs.wq);
	return 0;
}

/* ----------------------------------------------------------------------- dma-buf export --- */

struct gs_dmabuf {
	u64 va;            /* exported GPU VA (for logs) */
	u64 size;          /* bytes, host-page multiple */
	u64 skip;          /* offset of byte 0 inside the first GPU page */
	u32 npages;        /* GPU pages referenced */
	u32 *bar_pages;    /* BAR page index of each, one page_ref each */
	bool can_mmap;     /* dmabuf_mmap at export time */
};

/* Physical address of byte @off of the dma-buf and the bytes contiguous from there (<= 64 KiB). */
static phys_addr_t gs_dmabuf_phys(const struct gs_dmabuf *d, u64 off, u64 *contig)
{
	u64 p = off + d->skip;
	u64 within = p & GS_PAGE_MASK;

	*contig = min(GS_PAGE_SIZE - within, d->size - off);
	return gs.bar_phys + ((u64)d->bar_pages[p >> GS_PAGE_SHIFT] << GS_PAGE_SHIFT) + within;
}

/*
 * BAR memory has no struct page. A dynamic importer (one with move_notify) must declare that it
 * can take peer-to-peer addresses, as NVIDIA's attach demands; a static importer gets the
 * addresses from map_dma_buf. (NVIDIA also checks the PCIe topology between GPU and importer;
 * a simulated BAR on QEMU's root bus has no topology to check.)
 */
static int gs_dmabuf_attach(struct dma_buf *buf, struct dma_buf_attachment *at)
{
	if (at->importer_ops && !at->peer2peer) {
		gs_dbg(1, "dma-buf attach by %s refused: dynamic importer without peer2peer\n",
		       dev_name(at->dev));
		return -ENOTSUPP;
	}
	mutex_lock(&gs.lock);
	gs.dmabuf_attachments++;
	mutex_unlock(&gs.lock);
	return 0;
}

static void gs_dmabuf_detach(struct dma_buf *buf, struct dma_buf_attachment *at)
{
	mutex_lock(&gs.lock);
	gs.dmabuf_attachments--;
	mutex_unlock(&gs.lock);
}

static void gs_dmabuf_unmap_sg(struct device *dev, struct sg_table *sgt, unsigned int n)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sg(sgt->sgl, sg, n, i)
		dma_unmap_resource(dev, sg_dma_address(sg), sg_dma_len(sg), DMA_BIDIRECTIONAL,
				   DMA_ATTR_SKIP_CPU_SYNC);
}

/* One scatterlist entry per (part of a) GPU page, DMA-mapped for the importer's device. */
static struct sg_table *gs_dmabuf_map(struct dma_buf_attachment *at, enum dma_data_direction dir)
{
	struct gs_dmabuf *d = at->dmabuf->priv;
	struct scatterlist *sg;
	struct sg_table *sgt;
	unsigned int i;
	u64 off = 0, len;
	int ret;

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(sgt, d->npages, GFP_KERNEL);
	if (ret) {
		kfree(sgt);
		return ERR_PTR(ret);
	}
	for_each_sg(sgt->sgl, sg, d->npages, i) {
		phys_addr_t phys = gs_dmabuf_phys(d, off, &len);
		dma_addr_t addr = dma_map_resource(at->dev, phys, len, DMA_BIDIRECTIONAL,
						   DMA_ATTR_SKIP_CPU_SYNC);

		if (dma_mapping_error(at->dev, addr)) {
			gs_dmabuf_unmap_sg(at->dev, sgt, i);
			sg_free_table(sgt);
			kfree(sgt);
			return ERR_PTR(-EIO);
		}
		sg_dma_address(sg) = addr;
		sg_dma_len(sg) = len;
		off += len;
	}
	gs_dbg(1, "dma-buf va 0x%llx mapped for %s: %u entries\n", d->va, dev_name(at->dev),
	       d->npages);
	return sgt;
}

static void gs_dmabuf_unmap(struct dma_buf_attachment *at, struct sg_table *sgt,
			    enum dma_data_direction dir)
{
	gs_dmabuf_unmap_sg(at->dev, sgt, sgt->orig_nents);
	sg_free_table(sgt);
	kfree(sgt);
}

/* The last reference went: only now are the exported BAR pages released. */
static void gs_dmabuf_release(struct dma_buf *buf)
{
	struct gs_dmabuf *d = buf->priv;
	u32 i;

	mutex_lock(&gs.lock);
	for (i = 0; i < d->npages; i++)
		gs_put_page_locked(d->bar_pages[i]);
	gs.dmabuf_pages -= d->npages;
	gs.active_dmabufs--;
	mutex_unlock(&gs.lock);
	gs_dbg(1, "dma-buf va 0x%llx size 0x%llx released\n", d->va, d->size);
	kvfree(d->bar_pages);
	kfree(d);
}

static int gs_dmabuf_mmap(struct dma_buf *buf, struct vm_area_struct *vma)
{
	struct gs_dmabuf *d = buf->priv;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	unsigned long addr = vma->vm_start;
	u64 chunk;
	int ret;

	if (!d->can_mmap)
		return -ENOTSUPP;   /* what driver 580 answers on a discrete GPU */
	/* dma_buf_mmap_internal() checked the range already; this is the exporter's own guard. */
	if (off > d->size || len > d->size - off || !(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	gs_vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	/* The pages are ours until release, which cannot run while this VMA holds the file. */
	for (; len; len -= chunk, off += chunk, addr += chunk) {
		phys_addr_t phys = gs_dmabuf_phys(d, off, &chunk);

		chunk = min(chunk, len);
		ret = io_remap_pfn_range(vma, addr, phys >> PAGE_SHIFT, chunk, vma->vm_page_prot);
		if (ret)
			return ret;
	}
	gs_dbg(1, "dma-buf va 0x%llx mmap offset 0x%llx len 0x%lx\n", d->va,
	       (u64)vma->vm_pgoff << PAGE_SHIFT, vma->vm_end - vma->vm_start);
	return 0;
}

static const struct dma_buf_ops gs_dmabuf_ops = {
	.attach = gs_dmabuf_attach,
	.detach = gs_dmabuf_detach,
	.map_dma_buf = gs_dmabuf_map,
	.unmap_dma_buf = gs_dmabuf_unmap,
	.release = gs_dmabuf_release,
	.mmap = gs_dmabuf_mmap,
};

/* Builds the dma-buf of [va, va + size) of @sp; returns it with one reference (its file). */
static struct dma_buf *gs_dmabuf_export(struct gs_space *sp, u64 va, u64 size, u32 flags)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct gs_dmabuf *d;
	struct dma_buf *buf;
	struct gs_alloc *a;
	u64 first, i;

	if (flags & ~(u32)GPUSIM_EXPORT_FORCE_PCIE || size == 0 || (va & ~PAGE_MASK) ||
	    (size & ~PAGE_MASK) || va + size < va)
		return ERR_PTR(-EINVAL);
	if (flags & GPUSIM_EXPORT_FORCE_PCIE)
		return ERR_PTR(-EOPNOTSUPP);   /* a Grace-only mapping type */
	if (size > gs.bar_size)
		return ERR_PTR(-EINVAL);

	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return ERR_PTR(-ENOMEM);
	d->va = va;
	d->size = size;
	d->skip = va & GS_PAGE_MASK;
	d->npages = ((va + size - 1) >> GS_PAGE_SHIFT) - (va >> GS_PAGE_SHIFT) + 1;
	d->can_mmap = READ_ONCE(dmabuf_mmap);
	d->bar_pages = kvmalloc_array(d->npages, sizeof(u32), GFP_KERNEL);
	if (!d->bar_pages) {
		kfree(d);
		return ERR_PTR(-ENOMEM);
	}

	mutex_lock(&gs.lock);
	a = gs_alloc_find_locked(sp, va, size);
	if (!a) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "dma-buf export: pid %d va 0x%llx size 0x%llx: not inside one allocation\n",
		       task_tgid_nr(current), va, size);
		kvfree(d->bar_pages);
		kfree(d);
		return ERR_PTR(-EINVAL);
	}
	first = (va - a->va) >> GS_PAGE_SHIFT;
	for (i = 0; i < d->npages; i++) {
		d->bar_pages[i] = a->pages[first + i];
		gs.page_ref[d->bar_pages[i]]++;
	}
	gs.dmabuf_pages += d->npages;
	gs.active_dmabufs++;
	gs.total_dmabufs++;
	mutex_unlock(&gs.lock);

	info.exp_name = "nv_dmabuf";            /* NVIDIA's exporter name */
	info.ops = &gs_dmabuf_ops;
	info.size = size;
	info.flags = O_RDWR | O_CLOEXEC;        /* NVIDIA's file flags */
	info.priv = d;
	buf = dma_buf_export(&info);
	if (IS_ERR(buf)) {
		/* Not exported: release would never run, so drop what it would drop. */
		mutex_lock(&gs.lock);
		for (i = 0; i < d->npages; i++)
			gs_put_page_locked(d->bar_pages[i]);
		gs.dmabuf_pages -= d->npages;
		gs.active_dmabufs--;
		mutex_unlock(&gs.lock);
		kvfree(d->bar_pages);
		kfree(d);
		return buf;
	}
	gs_dbg(1, "dma-buf export: pid %d va 0x%llx size 0x%llx, %u GPU pages, mmap %s\n",
	       task_tgid_nr(current), va, size, d->npages, d->can_mmap ? "allowed" : "refused");
	return buf;
}

static int gs_ioc_export_dmabuf(struct gs_space *sp, struct gpusim_export_dmabuf __user *up)
{
	struct gpusim_export_dmabuf arg;
	struct dma_buf *buf;
	int fd;

	if (copy_from_user(&arg, up, sizeof(arg)))
		return -EFAULT;
	buf = gs_dmabuf_export(sp, arg.gpu_va, arg.size, arg.flags);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	/* Reserve the descriptor, report it, and only then make it live: no half-done export. */
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(buf);
		return fd;
	}
	if (put_user(fd, &up->fd)) {
		put_unused_fd(fd);
		dma_buf_put(buf);
		return -EFAULT;
	}
	fd_install(fd, buf->file);   /* the file's reference is the dma-buf's */
	return 0;
}

/* ------------------------------------------------------------------------ /dev/gpusim --- */

static int gs_open(struct inode *inode, struct file *file)
{
	struct gs_space *sp, *fresh;
	struct pid *tgid = task_tgid(current);

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL);
	if (!fresh)
		return -ENOMEM;

	mutex_lock(&gs.lock);
	if (!gs.present) {
		mutex_unlock(&gs.lock);
		kfree(fresh);
		return -ENODEV;
	}
	sp = gs_space_find_locked(tgid);
	if (!sp) {
		sp = fresh;
		fresh = NULL;
		sp->tgid = get_pid(tgid);
		INIT_LIST_HEAD(&sp->allocs);
		sp->next_va = GPUSIM_VA_BASE;
		address_space_init_once(&sp->mapping);
		sp->mapping.host = inode;
		sp->mapping.a_ops = inode->i_mapping->a_ops;
		list_add(&sp->node, &gs.spaces);
	}
	sp->files++;
	mutex_unlock(&gs.lock);
	kfree(fresh);

	file->private_data = sp;
	file->f_mapping = &sp->mapping;
	return 0;
}

static int gs_release(struct inode *inode, struct file *file)
{
	struct gs_space *sp = file->private_data;
	struct gs_alloc *a;
	LIST_HEAD(pins);

	mutex_lock(&gs.lock);
	if (--sp->files) {
		mutex_unlock(&gs.lock);
		return 0;
	}
	list_del(&sp->node);
	/* No file of this space is left, so nobody can add allocations any more. */
	while (!list_empty(&sp->allocs)) {
		a = list_first_entry(&sp->allocs, struct gs_alloc, node);
		gs_alloc_detach_locked(a, &pins);
		mutex_unlock(&gs.lock);
		gs_alloc_destroy(sp, a, &pins);
		INIT_LIST_HEAD(&pins);
		mutex_lock(&gs.lock);
	}
	mutex_unlock(&gs.lock);
	gs_dbg(1, "space of pid %d torn down\n", pid_nr(sp->tgid));
	put_pid(sp->tgid);
	kfree(sp);
	return 0;
}

static bool gs_caller_owns(struct gs_space *sp)
{
	return sp->tgid == task_tgid(current);
}

static long gs_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct gs_space *sp = file->private_data;
	void __user *up = (void __user *)uarg;
	long ret;

	if (_IOC_TYPE(cmd) != GPUSIM_IOC_MAGIC)
		return -ENOTTY;
	/* A forked child or a receiver of a passed fd has its own GPU address space. */
	if (!gs_caller_owns(sp))
		return -EACCES;

	switch (cmd) {
	case GPUSIM_IOC_ALLOC: {
		struct gpusim_alloc arg;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		ret = gs_ioc_alloc(sp, &arg);
		if (ret)
			return ret;
		if (copy_to_user(up, &arg, sizeof(arg))) {
			gs_ioc_free(sp, arg.gpu_va);
			return -EFAULT;
		}
		return 0;
	}
	case GPUSIM_IOC_FREE: {
		struct gpusim_free arg;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		return gs_ioc_free(sp, arg.gpu_va);
	}
	case GPUSIM_IOC_INFO: {
		struct gpusim_info info = {};

		mutex_lock(&gs.lock);
		info.bar_size = gs.bar_size;
		info.bar_phys = gs.bar_phys;
		info.free_bytes = (u64)gs.free_pages << GS_PAGE_SHIFT;
		info.active_pins = gs.active_pins;
		mutex_unlock(&gs.lock);
		info.pci_domain = pci_domain_nr(gs.pdev->bus);
		info.pci_bus = gs.pdev->bus->number;
		info.pci_device = PCI_SLOT(gs.pdev->devfn);
		info.pci_function = PCI_FUNC(gs.pdev->devfn);
		if (copy_to_user(up, &info, sizeof(info)))
			return -EFAULT;
		return 0;
	}
	case GPUSIM_IOC_QUERY: {
		struct gpusim_query arg;
		struct gs_alloc *a;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		mutex_lock(&gs.lock);
		a = gs_alloc_find_locked(sp, arg.gpu_va, 0);
		if (a) {
			arg.base = a->va;
			arg.size = a->size;
		}
		mutex_unlock(&gs.lock);
		if (!a)
			return -EINVAL;
		if (copy_to_user(up, &arg, sizeof(arg)))
			return -EFAULT;
		return 0;
	}
	case GPUSIM_IOC_INVALIDATE: {
		struct gpusim_invalidate arg;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		return gs_ioc_invalidate(sp, arg.gpu_va, arg.size);
	}
	case GPUSIM_IOC_EXPORT_DMABUF:
		return gs_ioc_export_dmabuf(sp, up);
	default:
		return -ENOTTY;
	}
}

static vm_fault_t gs_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct gs_space *sp = vma->vm_private_data;
	u64 va = (u64)vmf->pgoff << PAGE_SHIFT;
	unsigned long addr, start, end;
	struct gs_alloc *a;
	vm_fault_t ret = VM_FAULT_NOPAGE;
	u64 page_va, phys;

	mutex_lock(&gs.lock);
	a = gs_alloc_find_locked(sp, va, 0);
	if (!a) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "fault on freed memory: pid %d va 0x%llx\n", task_tgid_nr(current), va);
		return VM_FAULT_SIGBUS;
	}
	/* Populate the whole 64 KiB GPU page (clamped to the VMA) in one fault. */
	page_va = va & ~GS_PAGE_MASK;
	phys = gs.bar_phys + ((u64)a->pages[(page_va - a->va) >> GS_PAGE_SHIFT] << GS_PAGE_SHIFT);
	start = vmf->address - (unsigned long)(va - page_va);
	end = start + GS_PAGE_SIZE;
	if (start < vma->vm_start) {
		phys += vma->vm_start - start;
		start = vma->vm_start;
	}
	end = min(end, vma->vm_end);
	for (addr = start; addr < end; addr += PAGE_SIZE, phys += PAGE_SIZE) {
		ret = vmf_insert_pfn_prot(vma, addr, phys >> PAGE_SHIFT, vma->vm_page_prot);
		if (ret != VM_FAULT_NOPAGE)
			break;
	}
	mutex_unlock(&gs.lock);
	gs_dbg(2, "fault: pid %d va 0x%llx -> ret 0x%x\n", task_tgid_nr(current), va, ret);
	return ret;
}

static const struct vm_operations_struct gs_vm_ops = {
	.fault = gs_vm_fault,
};

static int gs_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct gs_space *sp = file->private_data;
	u64 va = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	struct gs_alloc *a;

	if (!gs_caller_owns(sp))
		return -EACCES;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;   /* private (COW) mappings of device memory make no sense */
	mutex_lock(&gs.lock);
	a = gs_alloc_find_locked(sp, va, len);
	mutex_unlock(&gs.lock);
	if (!a)
		return -EINVAL;

	gs_vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vma->vm_private_data = sp;
	vma->vm_ops = &gs_vm_ops;
	gs_dbg(1, "mmap: pid %d va 0x%llx len 0x%llx\n", task_tgid_nr(current), va, len);
	return 0;
}

static const struct file_operations gs_fops = {
	.owner = THIS_MODULE,
	.open = gs_open,
	.release = gs_release,
	.unlocked_ioctl = gs_ioctl,
	.mmap = gs_mmap,
	.llseek = noop_llseek,
};

static struct miscdevice gs_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpusim",
	.fops = &gs_fops,
	.mode = 0666,
};

/* ------------------------------------------------------------------ nvidia_p2p_* API --- */

static struct gs_pin *gs_pin_new(u64 va, u64 len)
{
	u32 n = len >> GS_PAGE_SHIFT, i;
	struct gs_pin *pin;

	pin = kzalloc(sizeof(*pin), GFP_KERNEL);
	if (!pin)
		return NULL;
	pin->va = va;
	pin->len = len;
	pin->page_array = kvcalloc(n, sizeof(*pin->page_array), GFP_KERNEL);
	pin->page_ptrs = kvmalloc_array(n, sizeof(*pin->page_ptrs), GFP_KERNEL);
	if (!pin->page_array || !pin->page_ptrs) {
		gs_pin_free(pin);
		return NULL;
	}
	for (i = 0; i < n; i++)
		pin->page_ptrs[i] = &pin->page_array[i];
	memcpy(pin->uuid, gs.uuid, sizeof(pin->uuid));
	pin->pt.version = NVIDIA_P2P_PAGE_TABLE_VERSION;
	pin->pt.page_size = NVIDIA_P2P_PAGE_SIZE_64KB;
	pin->pt.pages = pin->page_ptrs;
	pin->pt.entries = n;
	pin->pt.gpu_uuid = pin->uuid;
	pin->pt.flags = 0;   /* BAR memory over PCIe: never CPU-cacheable */
	INIT_LIST_HEAD(&pin->alloc_node);
	INIT_LIST_HEAD(&pin->dmas);
	pin->refs = 1;
	return pin;
}

/* Common part of both get_pages flavours. */
static int gs_get_pages(u64 va, u64 len, struct nvidia_p2p_page_table **page_table,
			void (*free_callback)(void *data), void *data, bool persistent)
{
	struct gs_space *sp;
	struct gs_alloc *a;
	struct gs_pin *pin;
	u32 i, first;

	if (!page_table || len == 0 || (va & GS_PAGE_MASK) || (len & GS_PAGE_MASK) ||
	    va + len < va)
		return -EINVAL;
	if (len > gs.bar_size)
		return -EINVAL;

	pin = gs_pin_new(va, len);
	if (!pin)
		return -ENOMEM;
	pin->persistent = persistent;
	pin->free_callback = free_callback;
	pin->data = data;
	if (persistent) {
		pin->bar_pages = kvmalloc_array(pin->pt.entries, sizeof(u32), GFP_KERNEL);
		if (!pin->bar_pages) {
			gs_pin_free(pin);
			return -ENOMEM;
		}
	}

	mutex_lock(&gs.lock);
	sp = gs.present ? gs_space_find_locked(task_tgid(current)) : NULL;
	a = sp ? gs_alloc_find_locked(sp, va, len) : NULL;
	if (!a) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "get_pages: pid %d va 0x%llx len 0x%llx: not inside one allocation\n",
		       task_tgid_nr(current), va, len);
		gs_pin_free(pin);
		return -EINVAL;
	}
	first = (va - a->va) >> GS_PAGE_SHIFT;
	for (i = 0; i < pin->pt.entries; i++) {
		u32 idx = a->pages[first + i];

		pin->page_array[i].physical_address = gs.bar_phys + ((u64)idx << GS_PAGE_SHIFT);
		if (persistent) {
			pin->bar_pages[i] = idx;
			gs.page_ref[idx]++;
		}
	}
	if (!persistent)
		list_add_tail(&pin->alloc_node, &a->pins);
	list_add_tail(&pin->reg_node, &gs.pins);
	gs.active_pins++;
	gs.total_pins++;
	*page_table = &pin->pt;
	mutex_unlock(&gs.lock);
	gs_dbg(1, "get_pages%s: pid %d va 0x%llx len 0x%llx -> %u pages\n",
	       persistent ? "_persistent" : "", task_tgid_nr(current), va, len, pin->pt.entries);
	return 0;
}

/* Under gs.lock: the live pin whose page table is @pt, or NULL. Never dereferences @pt. */
static struct gs_pin *gs_pin_lookup_locked(struct nvidia_p2p_page_table *pt)
{
	struct gs_pin *pin;

	list_for_each_entry(pin, &gs.pins, reg_node)
		if (&pin->pt == pt)
			return pin;
	return NULL;
}

static int gs_put_pages(u64 va, struct nvidia_p2p_page_table *pt, bool persistent)
{
	struct gs_pin *pin;
	u32 i;

	if (!pt)
		return -EINVAL;
	mutex_lock(&gs.lock);
	pin = gs_pin_lookup_locked(pt);
	if (!pin || pin->persistent != persistent || pin->va != va) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "put_pages%s: unknown page table %p or va 0x%llx\n",
		       persistent ? "_persistent" : "", pt, va);
		return -EINVAL;
	}
	if (pin->state == GS_PIN_CALLBACK) {
		if (pin->cb_task == current) {
			mutex_unlock(&gs.lock);
			return -EINVAL;
		}
		/* The allocation is being freed: the callback owns the release; wait for it. */
		pin->refs++;
		mutex_unlock(&gs.lock);
		wait_event(gs.wq, READ_ONCE(pin->state) == GS_PIN_DONE);
		mutex_lock(&gs.lock);
		gs_pin_unref_locked(pin);
		mutex_unlock(&gs.lock);
		return -EINVAL;
	}
	gs_pin_drop_dmas_locked(pin);
	list_del(&pin->reg_node);
	list_del(&pin->alloc_node);
	if (persistent)
		for (i = 0; i < pin->pt.entries; i++)
			gs_put_page_locked(pin->bar_pages[i]);
	gs.active_pins--;
	gs_pin_unref_locked(pin);
	mutex_unlock(&gs.lock);
	gs_dbg(1, "put_pages%s: pid %d va 0x%llx\n", persistent ? "_persistent" : "",
	       task_tgid_nr(current), va);
	return 0;
}

int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address, u64 length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	/* Tokens belong to the retired third-party mapping scheme; only 0/0 is meaningful here. */
	if (p2p_token || va_space) {
		gs_dbg(1, "get_pages: p2p tokens are not supported\n");
		return -EINVAL;
	}
	if (!free_callback)
		return -EINVAL;
	return gs_get_pages(virtual_address, length, page_table, free_callback, data, false);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages);

int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table, u32 flags)
{
	/* Every simulated mapping is a BAR mapping, so FORCE_BAR1_MAPPING changes nothing. */
	if (flags & ~(u32)NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING)
		return -EINVAL;
	might_sleep();
	return gs_get_pages(virtual_address, length, page_table, NULL, NULL, true);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages_persistent);

int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	return gs_put_pages(virtual_address, page_table, false);
}
EXPORT_SYMBOL(nvidia_p2p_put_pages);

int nvidia_p2p_put_pages_persistent(u64 virtual_address,
				    struct nvidia_p2p_page_table *page_table, u32 flags)
{
	if (flags & ~(u32)NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING)
		return -EINVAL;
	return gs_put_pages(virtual_address, page_table, true);
}
EXPORT_SYMBOL(nvidia_p2p_put_pages_persistent);

int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	/* The table is released by gpusim after the free callback returns, as NVIDIA does now. */
	return page_table ? 0 : -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_free_page_table);

/*
 * Peer DMA mappings: the bus addresses of a page table's BAR pages as one peer PCI device sees
 * them. Each page goes through dma_map_resource() for the peer, so without an IOMMU the address
 * is the BAR's physical address and with one it is an IOVA in the peer's domain. A mapping hangs
 * off its pin (pin->dmas) and is registered in gs.dmas, so that a stale or made-up pointer is
 * recognised without being dereferenced. Teardown:
 *   - nvidia_p2p_dma_unmap_pages() by the client, while the pin is live;
 *   - nvidia_p2p_free_dma_mapping() from the pin's free callback (the client says it is done);
 *   - gpusim itself after the free callback returned, and on put_pages, for whatever mapping
 *     the client left: NVIDIA's driver owns the mappings and tears them down with the pages.
 */
static struct gs_dma *gs_dma_lookup_locked(struct nvidia_p2p_dma_mapping *m)
{
	struct gs_dma *d;

	list_for_each_entry(d, &gs.dmas, reg_node)
		if (&d->m == m)
			return d;
	return NULL;
}

/* Under gs.lock: unmap every page from the peer, unlink and free. */
static void gs_dma_destroy_locked(struct gs_dma *d)
{
	u32 i;

	for (i = 0; i < d->mapped; i++)
		dma_unmap_resource(&d->m.pci_dev->dev, d->addrs[i], GS_PAGE_SIZE,
				   DMA_BIDIRECTIONAL, 0);
	list_del(&d->reg_node);
	list_del(&d->pin_node);
	pci_dev_put(d->m.pci_dev);
	gs.active_dma_mappings--;
	kvfree(d->addrs);
	kfree(d);
}

/* Under gs.lock: whatever the client left mapped on @pin. */
static void gs_pin_drop_dmas_locked(struct gs_pin *pin)
{
	struct gs_dma *d, *tmp;

	list_for_each_entry_safe(d, tmp, &pin->dmas, pin_node) {
		gs_dbg(1, "tearing down dma mapping of va 0x%llx for %s\n", pin->va,
		       pci_name(d->m.pci_dev));
		gs_dma_destroy_locked(d);
	}
}

int nvidia_p2p_dma_map_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping)
{
	struct gs_pin *pin;
	struct gs_dma *d;
	u64 limit;
	u32 i, n;
	int ret;

	if (!peer || !page_table || !dma_mapping)
		return -EINVAL;

	mutex_lock(&gs.lock);
	pin = gs_pin_lookup_locked(page_table);
	if (!pin || pin->state != GS_PIN_ACTIVE) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "dma_map_pages: page table %p is not live\n", page_table);
		return -EINVAL;
	}
	n = pin->pt.entries;
	/*
	 * Without an IOMMU the peer reaches the BAR at its physical address, which must fit its
	 * DMA mask (the DMA API would only warn and fail); with one the IOMMU picks the address.
	 */
	limit = min_not_zero(dma_get_mask(&peer->dev), peer->dev.bus_dma_limit);
	if (!device_iommu_mapped(&peer->dev)) {
		for (i = 0; i < n; i++) {
			if (pin->page_array[i].physical_address + GS_PAGE_SIZE - 1 > limit) {
				mutex_unlock(&gs.lock);
				pr_warn("dma_map_pages: %s cannot reach BAR address 0x%llx (DMA mask 0x%llx)\n",
					pci_name(peer), pin->page_array[i].physical_address, limit);
				return -EINVAL;
			}
		}
	}
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (d)
		d->addrs = kvcalloc(n, sizeof(*d->addrs), GFP_KERNEL);
	if (!d || !d->addrs) {
		mutex_unlock(&gs.lock);
		if (d)
			kfree(d);
		return -ENOMEM;
	}
	d->m.version = NVIDIA_P2P_DMA_MAPPING_VERSION;
	d->m.page_size_type = pin->pt.page_size;
	d->m.entries = n;
	d->m.dma_addresses = d->addrs;
	d->m.private = pin;
	d->m.pci_dev = pci_dev_get(peer);
	d->pin = pin;
	INIT_LIST_HEAD(&d->pin_node);
	list_add_tail(&d->reg_node, &gs.dmas);
	gs.active_dma_mappings++;
	gs.total_dma_mappings++;
	for (i = 0; i < n; i++) {
		dma_addr_t a = dma_map_resource(&peer->dev, pin->page_array[i].physical_address,
						GS_PAGE_SIZE, DMA_BIDIRECTIONAL, 0);

		if (dma_mapping_error(&peer->dev, a)) {
			ret = -EIO;
			pr_warn("dma_map_pages: mapping BAR page 0x%llx for %s failed\n",
				pin->page_array[i].physical_address, pci_name(peer));
			gs_dma_destroy_locked(d);
			gs.total_dma_mappings--;
			mutex_unlock(&gs.lock);
			return ret;
		}
		d->addrs[i] = a;
		d->mapped = i + 1;
	}
	list_add_tail(&d->pin_node, &pin->dmas);
	*dma_mapping = &d->m;
	mutex_unlock(&gs.lock);
	gs_dbg(1, "dma_map_pages: va 0x%llx, %u pages for %s\n", pin->va, n, pci_name(peer));
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_dma_map_pages);

int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping)
{
	struct gs_pin *pin;
	struct gs_dma *d;

	if (!peer || !page_table || !dma_mapping)
		return -EINVAL;
	mutex_lock(&gs.lock);
	pin = gs_pin_lookup_locked(page_table);
	d = gs_dma_lookup_locked(dma_mapping);
	if (!pin || !d || d->pin != pin || d->m.pci_dev != peer) {
		mutex_unlock(&gs.lock);
		gs_dbg(1, "dma_unmap_pages: mapping %p does not belong to page table %p and peer %s\n",
		       dma_mapping, page_table, pci_name(peer));
		return -EINVAL;
	}
	if (pin->state == GS_PIN_CALLBACK && pin->cb_task != current) {
		/* The free callback owns the teardown (as with put_pages): wait for it, then fail. */
		pin->refs++;
		mutex_unlock(&gs.lock);
		wait_event(gs.wq, READ_ONCE(pin->state) == GS_PIN_DONE);
		mutex_lock(&gs.lock);
		gs_pin_unref_locked(pin);
		mutex_unlock(&gs.lock);
		return -EINVAL;
	}
	gs_dma_destroy_locked(d);
	mutex_unlock(&gs.lock);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_dma_unmap_pages);

int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping)
{
	struct gs_dma *d;

	if (!dma_mapping)
		return -EINVAL;
	mutex_lock(&gs.lock);
	d = gs_dma_lookup_locked(dma_mapping);
	if (!d || d->pin->state != GS_PIN_CALLBACK) {
		mutex_unlock(&gs.lock);
		/* Outside a free callback the client must use nvidia_p2p_dma_unmap_pages(). */
		gs_dbg(1, "free_dma_mapping: %p is not a mapping of a page table being freed\n",
		       dma_mapping);
		return -EINVAL;
	}
	gs_dma_destroy_locked(d);
	mutex_unlock(&gs.lock);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_free_dma_mapping);

int nvidia_p2p_init_mapping(u64 p2p_token, struct nvidia_p2p_params *params,
			    void (*destroy_callback)(void *data), void *data)
{
	return -EOPNOTSUPP;   /* legacy Tesla/Fermi mailbox scheme */
}
EXPORT_SYMBOL(nvidia_p2p_init_mapping);

int nvidia_p2p_destroy_mapping(u64 p2p_token)
{
	return -EOPNOTSUPP;
}
EXPORT_SYMBOL(nvidia_p2p_destroy_mapping);

int nvidia_p2p_register_rsync_driver(nvidia_p2p_rsync_driver_t *driver, void *data)
{
	return -EOPNOTSUPP;   /* POWER/NPU only */
}
EXPORT_SYMBOL(nvidia_p2p_register_rsync_driver);

void nvidia_p2p_unregister_rsync_driver(nvidia_p2p_rsync_driver_t *driver, void *data)
{
}
EXPORT_SYMBOL(nvidia_p2p_unregister_rsync_driver);

int nvidia_p2p_get_rsync_registers(nvidia_p2p_rsync_reg_info_t **reg_info)
{
	return -EOPNOTSUPP;
}
EXPORT_SYMBOL(nvidia_p2p_get_rsync_registers);

void nvidia_p2p_put_rsync_registers(nvidia_p2p_rsync_reg_info_t *reg_info)
{
}
EXPORT_SYMBOL(nvidia_p2p_put_rsync_registers);

/* ------------------------------------------------------------------------------ debugfs --- */

static int gs_stats_show(struct seq_file *m, void *unused)
{
	struct gs_space *sp;
	struct gs_alloc *a;

	mutex_lock(&gs.lock);
	seq_printf(m, "bar_phys: 0x%llx\nbar_size: 0x%llx\npages: %u\nfree_pages: %u\n",
		   gs.bar_phys, gs.bar_size, gs.npages, gs.free_pages);
	seq_printf(m, "active_pins: %llu\ntotal_pins: %llu\ncallbacks_run: %llu\n",
		   gs.active_pins, gs.total_pins, gs.callbacks_run);
	seq_printf(m, "active_dma_mappings: %llu\ntotal_dma_mappings: %llu\n",
		   gs.active_dma_mappings, gs.total_dma_mappings);
	seq_printf(m, "active_dmabufs: %llu\ndmabuf_pages: %llu\ndmabuf_attachments: %llu\ntotal_dmabufs: %llu\n",
		   gs.active_dmabufs, gs.dmabuf_pages, gs.dmabuf_attachments, gs.total_dmabufs);
	list_for_each_entry(sp, &gs.spaces, node) {
		seq_printf(m, "space pid %d files %u\n", pid_nr(sp->tgid), sp->files);
		list_for_each_entry(a, &sp->allocs, node)
			seq_printf(m, "  alloc va 0x%llx size 0x%llx\n", a->va, a->size);
	}
	mutex_unlock(&gs.lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(gs_stats);

/* --------------------------------------------------------------------------------- PCI --- */

#define GS_BAR 2

static int gs_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	resource_size_t start = pci_resource_start(pdev, GS_BAR);
	resource_size_t size = pci_resource_len(pdev, GS_BAR);
	u32 *page_ref;
	int ret;

	if (gs.pdev) {
		dev_info(&pdev->dev, "gpusim already drives %s; ignoring this device\n",
			 pci_name(gs.pdev));
		return -EBUSY;
	}
	if (!(pci_resource_flags(pdev, GS_BAR) & IORESOURCE_MEM) || size < GS_PAGE_SIZE ||
	    (start & GS_PAGE_MASK) || (size & GS_PAGE_MASK)) {
		dev_err(&pdev->dev, "BAR %d (%pR) is not a 64 KiB-aligned memory BAR\n", GS_BAR,
			&pdev->resource[GS_BAR]);
		return -ENODEV;
	}
	ret = pci_enable_device_mem(pdev);
	if (ret)
		return ret;
	ret = pci_request_region(pdev, GS_BAR, "gpusim");
	if (ret)
		goto disable;
	page_ref = vzalloc(array_size(size >> GS_PAGE_SHIFT, sizeof(u32)));
	if (!page_ref) {
		ret = -ENOMEM;
		goto release;
	}
	/* A GPU addresses 64-bit DMA; the device is also the importer of its own dma-bufs in tests. */
	if (dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64)))
		dev_warn(&pdev->dev, "no 64-bit DMA mask\n");
	/* One memtype (WC) for every CPU mapping of the BAR, whoever creates it. */
	gs.wc_reserved = arch_io_reserve_memtype_wc(start, size) == 0;
	if (!gs.wc_reserved)
		dev_warn(&pdev->dev, "could not reserve the BAR as write-combining\n");

	mutex_lock(&gs.lock);
	gs.pdev = pdev;
	gs.bar_phys = start;
	gs.bar_size = size;
	gs.npages = size >> GS_PAGE_SHIFT;
	gs.free_pages = gs.npages;
	gs.alloc_cursor = 0;
	gs.page_ref = page_ref;
	gs.present = true;
	uuid_gen((uuid_t *)gs.uuid);
	mutex_unlock(&gs.lock);

	ret = misc_register(&gs_misc);
	if (ret) {
		mutex_lock(&gs.lock);
		gs.present = false;
		gs.pdev = NULL;
		gs.page_ref = NULL;
		mutex_unlock(&gs.lock);
		vfree(page_ref);
		goto unreserve;
	}
	gs.debugfs = debugfs_create_dir("gpusim", NULL);
	debugfs_create_file("stats", 0444, gs.debugfs, NULL, &gs_stats_fops);
	dev_info(&pdev->dev, "simulated GPU: %llu MiB of device memory at 0x%llx (%u pages of 64 KiB)\n",
		 (u64)size >> 20, (u64)start, gs.npages);
	return 0;

unreserve:
	if (gs.wc_reserved)
		arch_io_free_memtype_wc(start, size);
release:
	pci_release_region(pdev, GS_BAR);
disable:
	pci_disable_device(pdev);
	return ret;
}

static void gs_remove(struct pci_dev *pdev)
{
	struct gs_pin *pin, *tmp;

	if (pdev != gs.pdev)
		return;
	debugfs_remove_recursive(gs.debugfs);
	/* misc_deregister waits for nothing, but open files pin the module, so none exist. */
	misc_deregister(&gs_misc);

	mutex_lock(&gs.lock);
	gs.present = false;
	/* Only persistent pins leaked by a client can remain (a client module pins us). */
	list_for_each_entry_safe(pin, tmp, &gs.pins, reg_node) {
		pr_err("persistent pin va 0x%llx len 0x%llx leaked by a client\n", pin->va,
		       pin->len);
		list_del(&pin->reg_node);
		gs_pin_free(pin);
	}
	WARN_ON(!list_empty(&gs.spaces));
	vfree(gs.page_ref);
	gs.page_ref = NULL;
	gs.pdev = NULL;
	mutex_unlock(&gs.lock);

	if (gs.wc_reserved)
		arch_io_free_memtype_wc(gs.bar_phys, gs.bar_size);
	pci_release_region(pdev, GS_BAR);
	pci_disable_device(pdev);
}

static const struct pci_device_id gs_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },   /* QEMU ivshmem (plain) */
	{ }
};
MODULE_DEVICE_TABLE(pci, gs_ids);

static struct pci_driver gs_driver = {
	.name = "gpusim",
	.id_table = gs_ids,
	.probe = gs_probe,
	.remove = gs_remove,
	.driver.suppress_bind_attrs = true,   /* no manual unbind under open files */
};

static int __init gs_init(void)
{
	int ret = pci_register_driver(&gs_driver);

	if (ret)
		return ret;
	if (!gs.present) {
		pr_err("no ivshmem-plain device (1af4:1110) with a usable BAR %d found\n", GS_BAR);
		pci_unregister_driver(&gs_driver);
		return -ENODEV;
	}
	return 0;
}

static void __exit gs_exit(void)
{
	pci_unregister_driver(&gs_driver);
}

module_init(gs_init);
module_exit(gs_exit);

MODULE_LICENSE("Dual MIT/GPL");
GS_MODULE_IMPORT_DMA_BUF_NS;
MODULE_DESCRIPTION("Simulated NVIDIA GPU (nvidia_p2p_* over an ivshmem BAR) for tests");
MODULE_VERSION("1.0");
