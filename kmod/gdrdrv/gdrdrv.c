// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * gdrdrv - map pinned GPU memory into user space (GPUDirect RDMA copy driver).
 *
 * User space pins a range of GPU virtual memory through the NVIDIA kernel p2p API, then mmap()s
 * the GPU BAR pages that back it, so that the CPU can read and write GPU memory directly. The
 * character device /dev/gdrdrv speaks the gdrdrv 2.6 ioctl ABI (gdrdrv.h).
 *
 * Objects and lifetimes:
 *  - struct gdr_file: one per open file. It owns every region pinned through that file, remembers
 *    the thread group that opened it (only that thread group may use the file), and carries a
 *    private address_space that replaces filp->f_mapping, so that zapping a handle's file range
 *    only reaches VMAs created through this file.
 *  - struct gdr_region: one pinned range. It lives on its file's list from the pin ioctl until
 *    unpin or the file's release. The NVIDIA free callback may run at any time while it is
 *    pinned (non-persistent mode) and invalidates it in place.
 *  - VMAs: created by mmap of offset (handle << PAGE_SHIFT). PTEs are inserted by the fault
 *    handler only (see the mmap section for why). Each VMA holds a reference on the file, so a
 *    file is never released while any of its mappings exists. A region counts the VMA pieces of
 *    its current mapping (splits and mremap call ->open), so a partial munmap never makes a
 *    still-mapped region look unmapped. Regions are never reached through a VMA pointer: the
 *    VMA hooks look the region up by file offset, so a VMA that outlives its region (after
 *    unpin) is harmless: it faults into SIGBUS.
 *
 * Locking (see docs/gdrdrv.md):
 *  - gdr_file.lock (mutex): the region list and the handle counter. A region found under it is
 *    locked (region.sem) before the mutex is dropped, and removal from the list happens under
 *    it, so a region found by a lookup cannot be freed under the finder.
 *  - gdr_region.sem (rw_semaphore): read for the queries and the fault handler; write for mmap,
 *    the mapping-type request, VMA open/close, unpin, release and the free callback. The free
 *    callback takes only this semaphore, never the mutex, so it cannot deadlock against ioctls.
 *  - Order: mmap_lock -> gdr_file.lock -> gdr_region.sem -> i_mmap_rwsem. Nothing copies to or
 *    from user space while holding either lock, and the NVIDIA put-pages call is never made
 *    while holding region.sem (it waits for a callback in flight, which needs that semaphore).
 *  - A page table pointer is owned by exactly one party: whoever takes it out of the region
 *    (under region.sem) releases it, so the free callback and unpin/release never both do.
 */

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/overflow.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/uaccess.h>
#include <linux/atomic.h>
#include <linux/pci.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/timex.h>

#include "gdrdrv.h"
#include "gdrdrv_compat.h"

#define DEVNAME "gdrdrv"

/* NVIDIA's p2p API works in 64 KiB GPU pages. */
#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1ULL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

/*
 * Handles are file page offsets: handle << PAGE_SHIFT must be a valid, non-negative off_t.
 * Once the counter would leave that range, no more pins are accepted on the file.
 */
#define GDRDRV_HANDLE_MASK ((u64)LLONG_MAX >> PAGE_SHIFT)

/* ---- module parameters --------------------------------------------------------------------- */

static int dbg_enabled;
module_param(dbg_enabled, int, 0000);
MODULE_PARM_DESC(dbg_enabled, "enable debug tracing");

static int info_enabled;
module_param(info_enabled, int, 0000);
MODULE_PARM_DESC(info_enabled, "enable info tracing");

static int use_persistent_mapping = 1;
module_param(use_persistent_mapping, int, 0000);
MODULE_PARM_DESC(use_persistent_mapping,
		 "use persistent mapping instead of traditional (non-persistent) mapping");

/* ---- logging: every line is "gdrdrv:<function>:<message>" ------------------------------------ */

#define gdr_msg(level, fmt, ...) \
	printk(level DEVNAME ":%s:" fmt, __func__, ##__VA_ARGS__)

/* Levels follow the original driver. Errors are logged at debug level and rate limited (user
 * space can trigger them at will). Refusals that are routine for a working program (an mmap of an
 * unaligned or invalidated pin, a file used by a process that did not open it, an attribute or
 * mapping type this machine lacks) and traces go through gdr_dbg, printed only with
 * dbg_enabled=1; per-pin and per-map events through gdr_info (info_enabled=1).
 */
#define gdr_err(fmt, ...) \
	printk_ratelimited(KERN_DEBUG DEVNAME ":%s:" fmt, __func__, ##__VA_ARGS__)

#define gdr_dbg(fmt, ...)						\
	do {								\
		if (dbg_enabled)					\
			gdr_msg(KERN_DEBUG, fmt, ##__VA_ARGS__);	\
	} while (0)

#define gdr_info(fmt, ...)						\
	do {								\
		if (info_enabled)					\
			gdr_msg(KERN_INFO, fmt, ##__VA_ARGS__);		\
	} while (0)

/* ---- state ------------------------------------------------------------------------------- */

static int gdrdrv_major;
static bool cpu_could_cache_gpu_mappings;
static bool cpu_must_use_device_mapping;
static struct proc_dir_entry *gdrdrv_proc_dir;

/* NVIDIA pins we hold and have not given back, all files together. */
static atomic64_t nv_get_pages_refcount = ATOMIC64_INIT(0);

struct gdr_file {
	struct mutex lock;		/* regions, next_handle, handles_exhausted */
	struct list_head regions;
	u64 next_handle;
	bool handles_exhausted;
	/*
	 * The thread group allowed to use this file: its global id and its leader's start time
	 * (ids are reused; the pair is not). Not a struct pid reference: put_pid() is GPL-only,
	 * and the proprietary-flavor build must not use GPL-only symbols.
	 */
	pid_t owner_tgid;
	u64 owner_start_time;
	struct address_space mapping;	/* replaces filp->f_mapping */
};

struct gdr_region {
	struct list_head node;		/* in gdr_file.regions, under gdr_file.lock */
	struct gdr_file *file;
	gdr_hnd_t handle;
	bool published;			/* handle assigned and on the list (see region_zap) */

	/* Immutable after the pin ioctl. */
	u64 va;				/* pinned start, 64 KiB aligned */
	u64 mapped_size;		/* pinned length, 64 KiB multiple */
	u64 offset;			/* user address - va; non-zero makes mmap fail */
	u64 p2p_token;
	u32 va_space;
	bool persistent;
	bool force_pcie;
	u64 tm_cycles;
	u32 tsc_khz;

	/* Protected by sem. */
	struct rw_semaphore sem;
	struct nvidia_p2p_page_table *page_table;	/* NULL once released or invalidated */
	bool cb_flag;			/* the free callback ran */
	unsigned int vma_count;		/* VMA pieces of the current mapping */
	gdr_mr_type_t mapping_type;	/* of the current mapping, NONE if none */
	gdr_mr_type_t req_mapping_type;	/* for the next mmap, NONE = default */
	struct gdr_wc_range {
		u64 phys, len;
	} *wc;				/* PAT WC reservations of the current mapping */
	u32 nr_wc;
};

static bool persistent_mode(void)
{
	return use_persistent_mapping && gdrdrv_nv_persistent_supported();
}

static bool force_pcie_supported(void)
{
	return GDRDRV_NV_HAS_FORCE_BAR1 && persistent_mode();
}

static u64 current_group_start_time(void)
{
	/* exec by a non-leader thread hands the leader's start time to the new leader. */
	return current->group_leader->start_time;
}

static bool caller_owns(const struct gdr_file *gf)
{
	return task_tgid_nr(current) == gf->owner_tgid &&
	       current_group_start_time() == gf->owner_start_time;
}

/* Number of file pages a region occupies in its file's offset space. */
static u64 region_file_pages(u64 mapped_size)
{
	return max_t(u64, 1, mapped_size >> PAGE_SHIFT);
}

/* ---- region lookup --------------------------------------------------------------------- */

/*
 * Find a region and lock it (write or read): the one whose handle is key, or, when !exact, the
 * one whose file range contains key (a VMA piece may start inside a region). The semaphore is
 * taken while the file mutex is held, so the region cannot be unlinked and freed in between.
 */
static struct gdr_region *region_lookup(struct gdr_file *gf, u64 key, bool exact, bool write)
{
	struct gdr_region *r, *found = NULL;

	mutex_lock(&gf->lock);
	list_for_each_entry(r, &gf->regions, node) {
		if (exact ? r->handle == key :
		    key >= r->handle && key - r->handle < region_file_pages(r->mapped_size)) {
			found = r;
			break;
		}
	}
	if (found) {
		if (write)
			down_write(&found->sem);
		else
			down_read(&found->sem);
	}
	mutex_unlock(&gf->lock);
	return found;
}

static struct gdr_region *region_get(struct gdr_file *gf, gdr_hnd_t handle, bool write)
{
	return region_lookup(gf, handle, true, write);
}

static struct gdr_region *region_get_by_pgoff(struct gdr_file *gf, unsigned long pgoff,
					      bool write)
{
	return region_lookup(gf, pgoff, false, write);
}

static void region_unreserve(struct gdr_region *r);

/*
 * Remove every user PTE of the region's file range. Handles never share file ranges, so this
 * touches no other region, and it also reaches VMA pieces left by a partial munmap.
 */
static void region_zap(struct gdr_region *r)
{
	lockdep_assert_held(&r->sem);
	/*
	 * A free callback may run before the pin ioctl has assigned the handle. Such a region has
	 * never been mapped (mmap finds regions through the list), and its handle field does not
	 * name its file range yet.
	 */
	if (READ_ONCE(r->published))
		unmap_mapping_range(&r->file->mapping, (loff_t)r->handle << PAGE_SHIFT,
				    r->mapped_size, 1);
	r->mapping_type = GDR_MR_NONE;
	region_unreserve(r);
}

/* ---- NVIDIA calls ----------------------------------------------------------------------- */

static void gdrdrv_free_callback(void *data);

static int nv_get_pages(struct gdr_region *r, u32 nv_flags, struct nvidia_p2p_page_table **pt)
{
	if (!r->persistent)
		return nvidia_p2p_get_pages(r->p2p_token, r->va_space, r->va, r->mapped_size, pt,
					    gdrdrv_free_callback, r);
#if GDRDRV_NV_HAS_PERSISTENT_API
	return nvidia_p2p_get_pages_persistent(r->va, r->mapped_size, pt, nv_flags);
#else
	/* Older drivers pin persistently when no callback is given. */
	return nvidia_p2p_get_pages(0, 0, r->va, r->mapped_size, pt, NULL, NULL);
#endif
}

static int nv_put_pages(struct gdr_region *r, struct nvidia_p2p_page_table *pt)
{
	if (!r->persistent)
		return nvidia_p2p_put_pages(r->p2p_token, r->va_space, r->va, pt);
#if GDRDRV_NV_HAS_PERSISTENT_API
	return nvidia_p2p_put_pages_persistent(r->va, pt, 0);
#else
	return nvidia_p2p_put_pages(0, 0, r->va, pt);
#endif
}

/*
 * Give a page table back to NVIDIA. Called without region.sem held: put-pages waits for a free
 * callback in flight, and that callback needs the semaphore. Once it returns, NVIDIA will not
 * call the callback for this region any more.
 */
static void region_release_pages(struct gdr_region *r, struct nvidia_p2p_page_table *pt)
{
	int ret;

	ret = nv_put_pages(r, pt);
	if (ret)
		gdr_err("put pages of va 0x%llx failed: %d (freed concurrently?)\n", r->va, ret);
	/* The pin is no longer ours either way; nothing else could give it back. */
	atomic64_dec(&nv_get_pages_refcount);
}

/*
 * Unlinked region (no lookup can find it): tear down its mappings, give the pages back, free
 * it. The free callback may still be running or about to run; it finds the page table gone.
 */
static void region_destroy(struct gdr_region *r)
{
	struct nvidia_p2p_page_table *pt;

	down_write(&r->sem);
	region_zap(r);
	pt = r->page_table;
	r->page_table = NULL;
	up_write(&r->sem);

	if (pt)
		region_release_pages(r, pt);
	kfree(r);
}

/*
 * NVIDIA calls this when the pinned GPU memory is freed while still pinned (non-persistent
 * mode only). The region stays on its file's list, marked invalid; user mappings lose their
 * PTEs (later accesses raise SIGBUS) and the handle can only be queried and unpinned.
 */
static void gdrdrv_free_callback(void *data)
{
	struct gdr_region *r = data;
	struct nvidia_p2p_page_table *pt;
	u64 va;

	down_write(&r->sem);
	r->cb_flag = true;
	pt = r->page_table;
	r->page_table = NULL;
	/* The pages are going away: no user PTE may point at them after we return. */
	region_zap(r);
	va = r->va;
	gdr_dbg("invalidating handle 0x%llx va 0x%llx\n", r->handle, va);
	up_write(&r->sem);
	/*
	 * From here on r may be gone: an unpin that finds the page table already taken frees the
	 * region without waiting for us.
	 */
	if (pt) {
		int ret = nvidia_p2p_free_page_table(pt);

		if (ret)
			gdr_err("free page table of va 0x%llx failed: %d\n", va, ret);
		atomic64_dec(&nv_get_pages_refcount);
	}
}

/* ---- mapping types ---------------------------------------------------------------------- */

static bool region_supports_caching(const struct gdr_region *r)
{
	const struct nvidia_p2p_page_table *pt = r->page_table;

	if (!cpu_could_cache_gpu_mappings || r->force_pcie)
		return false;
	if (!pt || pt->entries == 0)
		return false;
	return gdrdrv_pfn_is_ram(pt->pages[0]->physical_address >> PAGE_SHIFT) ||
	       gdrdrv_pt_cpu_cacheable(pt);
}

static gdr_mr_type_t region_choose_type(const struct gdr_region *r)
{
	if (r->req_mapping_type != GDR_MR_NONE)
		return r->req_mapping_type;
	if (region_supports_caching(r))
		return GDR_MR_CACHING;
	if (cpu_must_use_device_mapping)
		return GDR_MR_DEVICE;
	return GDR_MR_WC;
}

/* ---- ioctls ------------------------------------------------------------------------------ */

static int pin_region(struct gdr_file *gf, u64 addr, u64 size, u64 p2p_token, u32 va_space,
		      u32 flags, gdr_hnd_t *handle_out)
{
	struct nvidia_p2p_page_table *pt = NULL;
	struct gdr_region *r;
	u64 end, t0, t1;
	u32 nv_flags = 0;
	int ret;

	if (!addr) {
		gdr_err("NULL device pointer\n");
		return -EINVAL;
	}
	if (flags & ~GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE) {
		gdr_err("unknown pin flags 0x%x\n", flags);
		return -EINVAL;
	}
	/* The original leaves this to NVIDIA; we refuse ranges whose end does not exist. */
	if (check_add_overflow(addr, size, &end) || end > (U64_MAX & GPU_PAGE_MASK)) {
		gdr_err("range 0x%llx + 0x%llx overflows\n", addr, size);
		return -EINVAL;
	}

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	init_rwsem(&r->sem);
	r->file = gf;
	r->va = addr & GPU_PAGE_MASK;
	r->mapped_size = ALIGN(end, GPU_PAGE_SIZE) - r->va;
	r->offset = addr - r->va;
	r->p2p_token = p2p_token;
	r->va_space = va_space;
	r->mapping_type = GDR_MR_NONE;
	r->req_mapping_type = GDR_MR_NONE;
	r->persistent = persistent_mode();

	if (r->persistent) {
		if (p2p_token || va_space) {
			gdr_err("p2p_token and va_space are deprecated in persistent mode\n");
			ret = -EINVAL;
			goto out_free;
		}
		if (flags & GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE) {
			if (!GDRDRV_NV_HAS_FORCE_BAR1) {
				gdr_err("FORCE_PCIE needs an NVIDIA driver with BAR1 forcing\n");
				ret = -EINVAL;
				goto out_free;
			}
			nv_flags |= GDRDRV_NV_FLAG_FORCE_BAR1;
			r->force_pcie = true;
		}
	} else if (flags) {
		gdr_err("flags are not supported in non persistent mode\n");
		ret = -EINVAL;
		goto out_free;
	}

	/* Cheap early refusal; re-checked when the handle is assigned. */
	mutex_lock(&gf->lock);
	ret = gf->handles_exhausted ? -ENOMEM : 0;
	mutex_unlock(&gf->lock);
	if (ret) {
		gdr_err("No address space left for BAR1 mapping\n");
		goto out_free;
	}

	/* Held across get-pages so that an early free callback waits for the setup below. */
	down_write(&r->sem);
	t0 = GDRDRV_HAVE_PIN_TIMING ? get_cycles() : 0;
	ret = nv_get_pages(r, nv_flags, &pt);
	t1 = GDRDRV_HAVE_PIN_TIMING ? get_cycles() : 0;
	if (ret) {
		up_write(&r->sem);
		gdr_err("get pages of va 0x%llx size 0x%llx failed: %d\n", r->va, r->mapped_size,
			ret);
		goto out_free;
	}
	atomic64_inc(&nv_get_pages_refcount);
	r->page_table = pt;
	r->tm_cycles = t1 - t0;
	r->tsc_khz = gdrdrv_tsc_khz();

	if (!pt || !NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(pt)) {
		gdr_err("incompatible page table version 0x%08x\n", pt ? pt->version : 0);
		ret = -EFAULT;
	} else if (pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB) {
		gdr_err("unsupported GPU page size type %u\n", pt->page_size);
		ret = -EINVAL;
	} else if (pt->entries && !pt->pages) {
		gdr_err("page table without pages\n");
		ret = -EINVAL;
	}
	if (ret) {
		/* Unpublished region: only a racing free callback can see it. */
		pt = r->page_table;
		r->page_table = NULL;
		up_write(&r->sem);
		if (pt)
			region_release_pages(r, pt);
		goto out_free;
	}
	up_write(&r->sem);

	mutex_lock(&gf->lock);
	if (gf->handles_exhausted) {
		mutex_unlock(&gf->lock);
		gdr_err("No address space left for BAR1 mapping\n");
		region_destroy(r);
		return -ENOMEM;
	}
	r->handle = gf->next_handle;
	gf->next_handle = (r->handle + region_file_pages(r->mapped_size)) & GDRDRV_HANDLE_MASK;
	if (gf->next_handle <= r->handle)
		gf->handles_exhausted = true;
	WRITE_ONCE(r->published, true);
	list_add(&r->node, &gf->regions);
	mutex_unlock(&gf->lock);

	gdr_info("pinned handle 0x%llx va 0x%llx size 0x%llx offset 0x%llx%s\n", r->handle,
		 r->va, r->mapped_size, r->offset, r->persistent ? " persistent" : "");
	*handle_out = r->handle;
	return 0;

out_free:
	kfree(r);
	return ret;
}

static int unpin_region(struct gdr_file *gf, gdr_hnd_t handle)
{
	struct gdr_region *r, *found = NULL;

	mutex_lock(&gf->lock);
	list_for_each_entry(r, &gf->regions, node) {
		if (r->handle == handle) {
			found = r;
			break;
		}
	}
	if (found) {
		/* Wait for anyone who found it before us, then make it unfindable. */
		down_write(&found->sem);
		list_del(&found->node);
		up_write(&found->sem);
	}
	mutex_unlock(&gf->lock);

	if (!found) {
		gdr_err("unknown handle 0x%llx\n", handle);
		return -EINVAL;
	}
	region_destroy(found);
	return 0;
}

/*
 * Copy a PIN reply (the caller's parameters with the new handle) back to user space; a handle
 * the caller can never learn would leak, so it is unpinned when the copy fails.
 */
static int pin_reply(struct gdr_file *gf, void __user *arg, const void *p, size_t size,
		     gdr_hnd_t handle)
{
	if (copy_to_user(arg, p, size)) {
		unpin_region(gf, handle);
		return -EFAULT;
	}
	return 0;
}

static int ioctl_pin_buffer(struct gdr_file *gf, void __user *arg)
{
	struct GDRDRV_IOC_PIN_BUFFER_PARAMS p;
	int ret;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	ret = pin_region(gf, p.addr, p.size, p.p2p_token, p.va_space, 0, &p.handle);
	if (ret)
		return ret;
	return pin_reply(gf, arg, &p, sizeof(p), p.handle);
}

static int ioctl_pin_buffer_v2(struct gdr_file *gf, void __user *arg)
{
	struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS p;
	int ret;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	ret = pin_region(gf, p.addr, p.size, 0, 0, p.flags, &p.handle);
	if (ret)
		return ret;
	return pin_reply(gf, arg, &p, sizeof(p), p.handle);
}

static int ioctl_unpin_buffer(struct gdr_file *gf, void __user *arg)
{
	struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS p;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	return unpin_region(gf, p.handle);
}

static int ioctl_get_cb_flag(struct gdr_file *gf, void __user *arg)
{
	struct GDRDRV_IOC_GET_CB_FLAG_PARAMS p;
	struct gdr_region *r;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	r = region_get(gf, p.handle, false);
	if (!r) {
		gdr_err("unknown handle 0x%llx\n", p.handle);
		return -EINVAL;
	}
	p.flag = r->cb_flag ? 1 : 0;
	up_read(&r->sem);
	if (copy_to_user(arg, &p, sizeof(p)))
		return -EFAULT;
	return 0;
}

/*
 * GET_INFO and GET_INFO_V2 lay out the same fields up to tm_cycles and differ only in how they
 * report the mapping type (two flags, or the type itself), so one handler serves both.
 */
union get_info_params {
	struct GDRDRV_IOC_GET_INFO_PARAMS v1;
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS v2;
};

static int ioctl_get_info(struct gdr_file *gf, void __user *arg, bool v2)
{
	union get_info_params p;
	/* The shared fields, written through either member: their offsets are checked below. */
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS *c = &p.v2;
	size_t size = v2 ? sizeof(p.v2) : sizeof(p.v1);
	struct gdr_region *r;

	BUILD_BUG_ON(offsetof(struct GDRDRV_IOC_GET_INFO_PARAMS, tm_cycles) !=
		     offsetof(struct GDRDRV_IOC_GET_INFO_V2_PARAMS, tm_cycles));
	if (copy_from_user(&p, arg, size))
		return -EFAULT;
	r = region_get(gf, c->handle, false);
	if (!r) {
		gdr_err("unknown handle 0x%llx\n", c->handle);
		return -EINVAL;
	}
	c->va = r->va;
	c->mapped_size = r->mapped_size;
	c->page_size = GPU_PAGE_SIZE;	/* nothing else is accepted at pin time */
	c->tsc_khz = r->tsc_khz;
	c->tm_cycles = r->tm_cycles;
	if (v2) {
		p.v2.mapping_type = r->mapping_type;
	} else {
		p.v1.mapped = r->mapping_type != GDR_MR_NONE;
		p.v1.wc_mapping = r->mapping_type == GDR_MR_WC;
	}
	up_read(&r->sem);
	if (copy_to_user(arg, &p, size))
		return -EFAULT;
	return 0;
}

static int ioctl_get_attr(void __user *arg)
{
	struct GDRDRV_IOC_GET_ATTR_PARAMS p;
	int ret = 0;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	switch (p.attr) {
	case GDRDRV_ATTR_USE_PERSISTENT_MAPPING:
		p.val = persistent_mode();
		break;
	case GDRDRV_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE:
		p.val = force_pcie_supported();
		break;
	default:
		gdr_dbg("unknown attribute %u\n", p.attr);
		ret = -EINVAL;
		break;
	}
	/* Copied back even for an unknown attribute (val unchanged), as the original does. */
	if (copy_to_user(arg, &p, sizeof(p)))
		return -EFAULT;
	return ret;
}

static int ioctl_req_mapping_type(struct gdr_file *gf, void __user *arg)
{
	struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS p;
	struct gdr_region *r;
	int ret = 0;

	if (copy_from_user(&p, arg, sizeof(p)))
		return -EFAULT;
	if (p.mapping_type > GDR_MR_DEVICE) {
		gdr_err("invalid mapping type %u\n", p.mapping_type);
		return -EINVAL;
	}
	r = region_get(gf, p.handle, true);
	if (!r) {
		gdr_err("unknown handle 0x%llx\n", p.handle);
		return -EINVAL;
	}
	if (r->mapping_type != GDR_MR_NONE) {
		ret = -EBUSY;
	} else {
		switch (p.mapping_type) {
		case GDR_MR_CACHING:
			if (!region_supports_caching(r))
				ret = -EOPNOTSUPP;
			break;
		case GDR_MR_WC:
			if (cpu_must_use_device_mapping)
				ret = -EOPNOTSUPP;
			break;
		case GDR_MR_DEVICE:
			if (!cpu_must_use_device_mapping)
				ret = -EOPNOTSUPP;
			break;
		default:
			break;
		}
	}
	if (!ret)
		r->req_mapping_type = p.mapping_type;
	up_write(&r->sem);
	if (ret)
		gdr_dbg("mapping type %u refused for handle 0x%llx: %d\n", p.mapping_type,
			p.handle, ret);
	return ret;
}

static int ioctl_get_version(void __user *arg)
{
	struct GDRDRV_IOC_GET_VERSION_PARAMS p = {
		.gdrdrv_version = GDRDRV_VERSION,
		.minimum_gdr_api_version = MINIMUM_GDR_API_VERSION,
	};

	if (copy_to_user(arg, &p, sizeof(p)))
		return -EFAULT;
	return 0;
}

static long gdrdrv_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct gdr_file *gf = filp->private_data;
	void __user *uarg = (void __user *)arg;

	if (_IOC_TYPE(cmd) != GDRDRV_IOCTL)
		return -EINVAL;
	if (!gf)
		return -EIO;
	if (!caller_owns(gf)) {
		gdr_dbg("file opened by another process\n");
		return -EACCES;
	}

	/* The encoded sizes are not the structure sizes for most commands; they are ignored. */
	switch (cmd) {
	case GDRDRV_IOC_PIN_BUFFER:
		return ioctl_pin_buffer(gf, uarg);
	case GDRDRV_IOC_PIN_BUFFER_V2:
		return ioctl_pin_buffer_v2(gf, uarg);
	case GDRDRV_IOC_UNPIN_BUFFER:
		return ioctl_unpin_buffer(gf, uarg);
	case GDRDRV_IOC_GET_CB_FLAG:
		return ioctl_get_cb_flag(gf, uarg);
	case GDRDRV_IOC_GET_INFO:
		return ioctl_get_info(gf, uarg, false);
	case GDRDRV_IOC_GET_INFO_V2:
		return ioctl_get_info(gf, uarg, true);
	case GDRDRV_IOC_GET_ATTR:
		return ioctl_get_attr(uarg);
	case GDRDRV_IOC_REQ_MAPPING_TYPE:
		return ioctl_req_mapping_type(gf, uarg);
	case GDRDRV_IOC_GET_VERSION:
		return ioctl_get_version(uarg);
	default:
		gdr_err("unsupported ioctl 0x%x\n", cmd);
		return -ENOTTY;
	}
}

/* ---- mmap --------------------------------------------------------------------------------- */

/*
 * Why a fault handler instead of remapping everything in ->mmap (as the original driver does):
 * the VMA handed to ->mmap is linked into the file's address_space only after ->mmap returns. A
 * free callback running in that window cannot find it with unmap_mapping_range(), and PTEs
 * inserted by ->mmap would then keep pointing at freed GPU memory. Here PTEs are only ever
 * inserted by the fault handler, under the region semaphore, after checking that the region is
 * still valid, and a fault can only happen once the VMA is linked; so every zap reaches every
 * PTE, and a zapped mapping faults into SIGBUS.
 */

/* Drop the PAT reservations of the current mapping (no PTE can use them any more). */
static void region_unreserve(struct gdr_region *r)
{
	u32 i;

	lockdep_assert_held(&r->sem);
	for (i = 0; i < r->nr_wc; i++)
		gdrdrv_memtype_free_wc(r->wc[i].phys, r->wc[i].len);
	kvfree(r->wc);
	r->wc = NULL;
	r->nr_wc = 0;
}

/* VMA pieces come and go by split and mremap; only the last one ends the mapping. */
static void gdrdrv_vma_open(struct vm_area_struct *vma)
{
	struct gdr_file *gf = vma->vm_file->private_data;
	struct gdr_region *r = region_get_by_pgoff(gf, vma->vm_pgoff, true);

	if (!r)
		return;
	r->vma_count++;
	up_write(&r->sem);
}

static void gdrdrv_vma_close(struct vm_area_struct *vma)
{
	struct gdr_file *gf = vma->vm_file->private_data;
	struct gdr_region *r = region_get_by_pgoff(gf, vma->vm_pgoff, true);

	/* No region: it was unpinned while mapped, and its PTEs are long gone. */
	if (!r)
		return;
	if (r->vma_count && --r->vma_count == 0) {
		r->mapping_type = GDR_MR_NONE;
		region_unreserve(r);
	}
	up_write(&r->sem);
}

/* Insert the PTEs of the 64 KiB GPU page containing the faulting address (within the VMA). */
static vm_fault_t gdrdrv_vma_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct gdr_file *gf = vma->vm_file->private_data;
	struct gdr_region *r = region_get_by_pgoff(gf, vmf->pgoff, false);
	const struct nvidia_p2p_page_table *pt;
	unsigned long base, start, end, addr;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	u64 off, phys;

	/* Unpinned: nothing may be mapped here any more. */
	if (!r)
		return VM_FAULT_SIGBUS;
	pt = r->page_table;
	/* Invalidated or unmapped (only stale VMA pieces remain). */
	if (!pt || r->mapping_type == GDR_MR_NONE)
		goto out;
	off = (u64)(vmf->pgoff - r->handle) << PAGE_SHIFT;
	if (off >= r->mapped_size || (off >> GPU_PAGE_SHIFT) >= pt->entries)
		goto out;
	phys = pt->pages[off >> GPU_PAGE_SHIFT]->physical_address;

	base = vmf->address - (unsigned long)(off & GPU_PAGE_OFFSET);
	start = max(base, vma->vm_start);
	end = min_t(unsigned long, base + GPU_PAGE_SIZE, vma->vm_end);
	for (addr = start; addr < end; addr += PAGE_SIZE) {
		ret = gdrdrv_insert_pfn(vma, addr, (phys + (addr - base)) >> PAGE_SHIFT,
					vma->vm_page_prot);
		if (ret != VM_FAULT_NOPAGE)
			break;
	}
out:
	up_read(&r->sem);
	return ret;
}

static const struct vm_operations_struct gdrdrv_vm_ops = {
	.open = gdrdrv_vma_open,
	.close = gdrdrv_vma_close,
	.fault = gdrdrv_vma_fault,
};

/*
 * Check that the first @size bytes of the region are backed by page-aligned BAR pages and, for
 * WC mappings, register each physically contiguous run as write-combining.
 */
static int region_prepare_map(struct gdr_region *r, unsigned long size, bool wc)
{
	const struct nvidia_p2p_page_table *pt = r->page_table;
	u32 nr_gpu_pages = DIV_ROUND_UP(size, GPU_PAGE_SIZE);
	u32 i, n = 0;
	int ret;

	region_unreserve(r);	/* nothing is registered here; keeps the invariant obvious */
	if (wc) {
		/* One entry per run, at most one per GPU page; large mappings need vmalloc. */
		r->wc = kvcalloc(nr_gpu_pages, sizeof(*r->wc), GFP_KERNEL);
		if (!r->wc)
			return -ENOMEM;
	}
	for (i = 0; i < nr_gpu_pages;) {
		u64 phys = pt->pages[i]->physical_address;
		u64 run = GPU_PAGE_SIZE;

		for (i++; i < nr_gpu_pages; i++) {
			if (pt->pages[i]->physical_address != phys + run)
				break;
			run += GPU_PAGE_SIZE;
		}
		if (phys & ~PAGE_MASK) {
			gdr_err("BAR address 0x%llx is not page aligned\n", phys);
			ret = -EINVAL;
			goto fail;
		}
		if (!wc)
			continue;
		ret = gdrdrv_memtype_reserve_wc(phys, run);
		if (ret) {
			gdr_err("cannot make 0x%llx bytes at 0x%llx write-combining: %d\n", run,
				phys, ret);
			ret = -EAGAIN;
			goto fail;
		}
		r->wc[n].phys = phys;
		r->wc[n].len = run;
		r->nr_wc = ++n;
	}
	return 0;
fail:
	region_unreserve(r);
	return ret;
}

static int gdrdrv_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct gdr_file *gf = filp->private_data;
	unsigned long size = vma->vm_end - vma->vm_start;
	struct gdr_region *r;
	gdr_mr_type_t type;
	pgprot_t prot;
	int ret = -EINVAL;

	if (!gf)
		return -EIO;
	if (!caller_owns(gf)) {
		gdr_dbg("file opened by another process\n");
		return -EACCES;
	}
	r = region_get(gf, vma->vm_pgoff, true);
	if (!r) {
		gdr_dbg("unknown handle 0x%lx\n", vma->vm_pgoff);
		return -EINVAL;
	}

	if (r->mapping_type != GDR_MR_NONE || r->vma_count) {
		gdr_dbg("handle 0x%llx is already mapped\n", r->handle);
		goto out;
	}
	if (r->cb_flag) {
		gdr_dbg("handle 0x%llx was invalidated by its free callback\n", r->handle);
		goto out;
	}
	if (!r->page_table || !r->page_table->entries) {
		gdr_dbg("handle 0x%llx has no pages\n", r->handle);
		goto out;
	}
	if (r->offset) {
		gdr_dbg("pinned address is not 64 KiB aligned (offset 0x%llx)\n", r->offset);
		goto out;
	}
	if (size > (u64)r->page_table->entries * GPU_PAGE_SIZE || size > r->mapped_size) {
		gdr_dbg("mapping of 0x%lx bytes exceeds the pinned 0x%llx\n", size,
			r->mapped_size);
		goto out;
	}
	/*
	 * Private mappings would be copy-on-write, which PFN mappings cannot be. The library
	 * always maps MAP_SHARED.
	 */
	if (!(vma->vm_flags & VM_SHARED)) {
		gdr_dbg("only MAP_SHARED mappings are supported\n");
		goto out;
	}

	type = region_choose_type(r);
	switch (type) {
	case GDR_MR_WC:
		prot = gdrdrv_pgprot_wc(vma->vm_page_prot);
		break;
	case GDR_MR_CACHING:
		/* Normal cacheable memory: keep vm_page_prot. */
		prot = vma->vm_page_prot;
		break;
	case GDR_MR_DEVICE:
		if (!GDRDRV_HAVE_DEVICE_MAPPING) {
			gdr_err("device mappings are not available on this architecture\n");
			goto out;
		}
		prot = gdrdrv_pgprot_device(vma->vm_page_prot);
		break;
	default:
		goto out;
	}

	ret = region_prepare_map(r, size, type == GDR_MR_WC);
	if (ret)
		goto out;

	/*
	 * PFN mapping of I/O memory, never expanded, dumped or inherited by fork(): a child must
	 * not reach the parent's pinned memory.
	 */
	gdrdrv_vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_page_prot = gdrdrv_pgprot_io(prot);
	vma->vm_ops = &gdrdrv_vm_ops;
	r->vma_count = 1;
	r->mapping_type = type;
	gdr_info("mapped handle 0x%llx at 0x%lx size 0x%lx type %d\n", r->handle,
		 vma->vm_start, size, type);
out:
	up_write(&r->sem);
	return ret;
}

/* ---- open / release ------------------------------------------------------------------------ */

static int gdrdrv_open(struct inode *inode, struct file *filp)
{
	struct gdr_file *gf;

	if (iminor(inode) != 0) {
		gdr_err("minor %u does not exist\n", iminor(inode));
		return -ENXIO;
	}
	gf = kzalloc(sizeof(*gf), GFP_KERNEL);
	if (!gf)
		return -ENOMEM;
	mutex_init(&gf->lock);
	INIT_LIST_HEAD(&gf->regions);
	gf->owner_tgid = task_tgid_nr(current);
	gf->owner_start_time = current_group_start_time();

	/* VMAs of this file are linked here, so zapping a handle reaches only this file's. */
	address_space_init_once(&gf->mapping);
	gf->mapping.host = inode;
	gf->mapping.a_ops = inode->i_mapping->a_ops;
	filp->f_mapping = &gf->mapping;
	filp->private_data = gf;
	return 0;
}

/*
 * Last reference to the file gone. Every VMA holds a file reference, so no mapping of this
 * file exists any more; only NVIDIA free callbacks can still reach the regions.
 */
static int gdrdrv_release(struct inode *inode, struct file *filp)
{
	struct gdr_file *gf = filp->private_data;
	struct gdr_region *r, *tmp;
	LIST_HEAD(regions);

	if (!gf)
		return 0;
	mutex_lock(&gf->lock);
	list_splice_init(&gf->regions, &regions);
	mutex_unlock(&gf->lock);

	list_for_each_entry_safe(r, tmp, &regions, node) {
		list_del(&r->node);
		region_destroy(r);
	}
	filp->private_data = NULL;
	filp->f_mapping = inode->i_mapping;
	kfree(gf);
	return 0;
}

static const struct file_operations gdrdrv_fops = {
	.owner = THIS_MODULE,
	.open = gdrdrv_open,
	.release = gdrdrv_release,
	.unlocked_ioctl = gdrdrv_ioctl,
	.mmap = gdrdrv_mmap,
};

/* ---- procfs -------------------------------------------------------------------------------- */

static int params_show(struct seq_file *m, void *v)
{
	seq_printf(m, "Version: %s\n", GDRDRV_VERSION_STRING);
	seq_printf(m, "Built for NVIDIA driver flavor: %s\n", GDRDRV_FLAVOR);
	seq_printf(m, "Use persistent mapping: %s\n", persistent_mode() ? "yes" : "no");
	seq_printf(m, "dbg_enabled: %d\n", dbg_enabled);
	seq_printf(m, "info_enabled: %d\n", info_enabled);
	return 0;
}

static int params_open(struct inode *inode, struct file *file)
{
	return single_open(file, params_show, NULL);
}

static int refcount_show(struct seq_file *m, void *v)
{
	seq_printf(m, "%lld\n", (long long)atomic64_read(&nv_get_pages_refcount));
	return 0;
}

static int refcount_open(struct inode *inode, struct file *file)
{
	return single_open(file, refcount_show, NULL);
}

GDRDRV_PROC_OPS(params_proc_ops, params_open);
GDRDRV_PROC_OPS(refcount_proc_ops, refcount_open);

/* procfs is informational: failures are logged and otherwise ignored. */
static void gdrdrv_proc_init(void)
{
	gdrdrv_proc_dir = proc_mkdir_mode("driver/" DEVNAME, 0555, NULL);
	if (!gdrdrv_proc_dir) {
		gdr_err("cannot create /proc/driver/" DEVNAME "\n");
		return;
	}
	if (!proc_create("params", 0444, gdrdrv_proc_dir, &params_proc_ops))
		gdr_err("cannot create the params proc file\n");
	if (dbg_enabled &&
	    !proc_create("nv_get_pages_refcount", 0440, gdrdrv_proc_dir, &refcount_proc_ops))
		gdr_err("cannot create the nv_get_pages_refcount proc file\n");
}

/* ---- module ---------------------------------------------------------------------------- */

static bool detect_device_mapping_needed(void)
{
#if GDRDRV_HAVE_DEVICE_MAPPING
	/* BlueField-3 root devices cannot take cacheable or WC stores to GPU memory. */
	static const unsigned short bf3_ids[] = { 0xa2da, 0xa2db };
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(bf3_ids); i++) {
		struct pci_dev *pdev = pci_get_device(0x15b3, bf3_ids[i], NULL);

		if (pdev) {
			pci_dev_put(pdev);
			return true;
		}
	}
#endif
	return false;
}

static int __init gdrdrv_init(void)
{
	int major;

	gdr_msg(KERN_INFO, "loading gdrdrv version %s built for %s NVIDIA driver\n",
		GDRDRV_VERSION_STRING, GDRDRV_FLAVOR);

	cpu_could_cache_gpu_mappings = gdrdrv_cpu_could_cache_gpu_mappings();
	if (cpu_could_cache_gpu_mappings)
		gdr_msg(KERN_INFO, "this platform may support CPU cached mappings of GPU memory\n");
	cpu_must_use_device_mapping = detect_device_mapping_needed();
	if (cpu_must_use_device_mapping)
		gdr_msg(KERN_INFO, "enabling use of CPU device mappings\n");

	major = register_chrdev(0, DEVNAME, &gdrdrv_fops);
	if (major < 0) {
		gdr_msg(KERN_ERR, "cannot register the character device: %d\n", major);
		return major;
	}
	gdrdrv_major = major;
	gdr_msg(KERN_INFO, "device registered with major number %d\n", gdrdrv_major);
	gdr_msg(KERN_INFO, "dbg traces %s, info traces %s\n",
		dbg_enabled ? "enabled" : "disabled", info_enabled ? "enabled" : "disabled");
	if (persistent_mode())
		gdr_msg(KERN_INFO, "Persistent mapping will be used\n");

	gdrdrv_proc_init();
	return 0;
}

static void __exit gdrdrv_exit(void)
{
	s64 pins;

	if (gdrdrv_proc_dir)
		proc_remove(gdrdrv_proc_dir);
	gdr_msg(KERN_INFO, "unregistering major number %d\n", gdrdrv_major);
	unregister_chrdev(gdrdrv_major, DEVNAME);

	/*
	 * Every open file holds a module reference and gives its pins back on release, so no pin
	 * can be outstanding here. The original treats it as a kernel bug; we report it.
	 */
	pins = atomic64_read(&nv_get_pages_refcount);
	if (pins) {
		gdr_msg(KERN_ERR, "%lld NVIDIA pins still outstanding at unload\n", pins);
		WARN_ON(dbg_enabled);
	}
}

module_init(gdrdrv_init);
module_exit(gdrdrv_exit);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION(GDRDRV_VERSION_STRING);
MODULE_DESCRIPTION("GDRCopy kernel-mode driver built for " GDRDRV_FLAVOR " NVIDIA driver");
MODULE_AUTHOR("GPUDirect user-space stack in Rust project");
