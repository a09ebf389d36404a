// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libnvm helper module: lets a user-space NVMe driver (libnvm, cunvme, BaM) use a controller.
 *
 * ioctl-compatible with libnvm's own helper (module version 0.3): binds NVMe controllers by PCI
 * class 0x010802, gives each one /dev/libnvmN, maps BAR0 into the caller (mmap), and pins host
 * memory (NVM_MAP_HOST_MEMORY) or GPU memory (NVM_MAP_DEVICE_MEMORY, through nvidia_p2p_*) and
 * hands out the bus addresses the controller must use. The ABI is in libnvm_ioctl.h; what
 * differs from upstream, and why, is in docs/libnvm-module.md.
 *
 * Objects
 *   lnvm_ctrl    one bound controller. Refcounted: the PCI binding holds one reference and
 *                every open file one, so a file outlives an unbind safely (it then gets ENODEV).
 *   lnvm_file    one open file description. Windows belong to it (not to a thread, as upstream)
 *                and die with its last close: no pin can outlive its users.
 *   lnvm_window  one MAP call: pinned host pages + their DMA addresses, or a GPU page table + its
 *                peer DMA mapping for the controller.
 *
 * Locking (outer to inner): lnvm.lock (controller list, minors) -> ctrl->lock (file list,
 * removed flag) -> file->lock (windows) -> ctrl->hw_lock (controller registers).
 *   - file->lock is held across nvidia_p2p_get_pages() and nvidia_p2p_dma_map_pages(), and the
 *     GPU free callback takes it, so a callback never sees a half-built window.
 *   - nvidia_p2p_dma_unmap_pages()/put_pages() may wait for a running free callback, which needs
 *     file->lock: they are called only after file->lock is dropped, with the window unlinked
 *     and marked RELEASING, so that the callback leaves it alone. The window is freed only after
 *     put_pages() has returned, i.e. after any callback on it has returned.
 *   - copy_to_user() of the addresses happens without file->lock.
 *
 * Memory handed to someone else must not stay reachable by the controller. Whenever the module
 * itself has to drop windows the controller may still be using - the GPU driver reclaims a
 * mapped GPU buffer (free callback), the last close of a file that still has windows (e.g. the
 * process died), or the controller is unbound - it first stops the controller: CC.EN = 0 and a
 * wait for CSTS.RDY = 0 (at most CAP.TO), which aborts every command and deletes every queue,
 * and only then unmaps and unpins. If the controller does not stop in time, bus mastering is
 * turned off as well. An explicit NVM_UNMAP_MEMORY is the caller's statement that the controller
 * no longer uses the window and stops nothing.
 */
#define pr_fmt(fmt) "libnvm: " fmt

#include <linux/module.h>
#include <linux/pci.h>
#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/kref.h>
#include <linux/idr.h>
#include <linux/delay.h>
#include <linux/jiffies.h>
#include <linux/uaccess.h>
#include <linux/sched.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/dma-mapping.h>

#include "libnvm_ioctl.h"
#include "compat.h"
#ifdef LNVM_NV_P2P
#include "nv-p2p.h"
#endif

#define DRIVER_NAME "libnvm helper"
#define LNVM_GPU_PAGE_SIZE 0x10000ULL
/* One MAP call pins at most this many pages (4 GiB of host memory, 64 GiB of GPU memory). */
#define LNVM_MAX_PAGES (1UL << 20)

/* NVMe registers used to stop a controller (NVMe base spec, controller registers). */
#define NVME_REG_CAP  0x00
#define NVME_REG_CC   0x14
#define NVME_REG_CSTS 0x1c
#define NVME_CC_EN    0x1
#define NVME_CSTS_RDY 0x1

static int num_ctrls = 8;
module_param(num_ctrls, int, 0);
MODULE_PARM_DESC(num_ctrls, "number of controller device nodes (default 8)");

struct lnvm_ctrl {
	struct list_head node;          /* in lnvm.ctrls */
	struct kref ref;
	struct pci_dev *pdev;           /* referenced */
	struct cdev *cdev;
	struct device *dev;
	dev_t devt;
	int number;
	resource_size_t bar_start;
	resource_size_t bar_len;

	struct mutex lock;              /* files, removed */
	struct list_head files;
	bool removed;

	struct mutex hw_lock;           /* regs, stopping the controller */
	void __iomem *regs;
};

enum lnvm_wstate {
	W_LIVE,         /* linked, pinned, mapped */
	W_RELEASING,    /* unlinked; the releasing thread owns pages and mappings */
	W_REVOKED,      /* GPU memory reclaimed by the GPU driver; nothing held */
};

struct lnvm_file;

struct lnvm_window {
	struct list_head node;          /* in file->windows */
	struct lnvm_file *file;
	u64 id;                         /* unique in its file: found again without a stale pointer */
	bool counted;                   /* in the stats */
	u64 vaddr;                      /* page-aligned start (the UNMAP key) */
	u64 page_size;
	unsigned long n;
	bool gpu;
	enum lnvm_wstate state;
	/* host */
	struct page **pages;
	dma_addr_t *dma;
	unsigned long n_dma;            /* pages DMA-mapped so far */
#ifdef LNVM_NV_P2P
	/* GPU */
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dm;
#endif
};

struct lnvm_file {
	struct list_head node;          /* in ctrl->files */
	struct lnvm_ctrl *ctrl;         /* referenced */
	struct file *filp;              /* its BAR mappings are zapped through filp->f_mapping */
	struct mutex lock;
	struct list_head windows;
	u64 next_id;
};

static struct {
	struct mutex lock;
	struct list_head ctrls;
	struct ida minors;
	dev_t region;
	struct class *class;
	struct dentry *debugfs;
	atomic64_t host_windows, host_pages, gpu_windows, gpu_pages;
	atomic64_t revoked_windows, stops, stop_timeouts, open_files, total_maps;
} lnvm = {
	.lock = __MUTEX_INITIALIZER(lnvm.lock),
	.ctrls = LIST_HEAD_INIT(lnvm.ctrls),
};

static void lnvm_ctrl_free(struct kref *ref)
{
	struct lnvm_ctrl *c = container_of(ref, struct lnvm_ctrl, ref);

	pci_dev_put(c->pdev);
	kfree(c);
}

static void lnvm_ctrl_put(struct lnvm_ctrl *c)
{
	kref_put(&c->ref, lnvm_ctrl_free);
}

/* ------------------------------------------------------------ stopping the controller --- */

/*
 * Stops all DMA of the controller: clear CC.EN and wait for CSTS.RDY = 0 within CAP.TO (500 ms
 * units). A controller that is already disabled is left alone. Sleeps.
 */
static void lnvm_stop_controller(struct lnvm_ctrl *c, const char *why)
{
	unsigned long deadline;
	u32 cc, csts, to;
	u64 cap;

	mutex_lock(&c->hw_lock);
	if (!c->regs)
		goto out;
	cap = lo_hi_readq(c->regs + NVME_REG_CAP);
	cc = readl(c->regs + NVME_REG_CC);
	csts = readl(c->regs + NVME_REG_CSTS);
	if (cc == ~0U || csts == ~0U) {
		dev_warn(&c->pdev->dev, "controller not responding (%s): bus mastering off\n", why);
		pci_clear_master(c->pdev);
		goto out;
	}
	if (!(cc & NVME_CC_EN) && !(csts & NVME_CSTS_RDY))
		goto out;
	atomic64_inc(&lnvm.stops);
	dev_info(&c->pdev->dev, "stopping the controller: %s\n", why);
	writel(cc & ~NVME_CC_EN, c->regs + NVME_REG_CC);
	to = (cap >> 24) & 0xff;
	deadline = jiffies + msecs_to_jiffies(max_t(u32, to, 1) * 500);
	for (;;) {
		csts = readl(c->regs + NVME_REG_CSTS);
		if (csts == ~0U || !(csts & NVME_CSTS_RDY))
			break;
		/* user space may set EN again meanwhile (it owns the registers too): insist */
		cc = readl(c->regs + NVME_REG_CC);
		if (cc != ~0U && (cc & NVME_CC_EN))
			writel(cc & ~NVME_CC_EN, c->regs + NVME_REG_CC);
		if (time_after(jiffies, deadline)) {
			atomic64_inc(&lnvm.stop_timeouts);
			dev_warn(&c->pdev->dev,
				 "controller still ready after CAP.TO (%u ms): bus mastering off\n",
				 max_t(u32, to, 1) * 500);
			pci_clear_master(c->pdev);
			break;
		}
		usleep_range(1000, 2000);
	}
out:
	mutex_unlock(&c->hw_lock);
}

/* ----------------------------------------------------------------------- windows --- */

static void lnvm_window_free(struct lnvm_window *w)
{
	kvfree(w->pages);
	kvfree(w->dma);
	kfree(w);
}

static void lnvm_window_count(struct lnvm_window *w)
{
	w->counted = true;
	atomic64_inc(w->gpu ? &lnvm.gpu_windows : &lnvm.host_windows);
	atomic64_add(w->n, w->gpu ? &lnvm.gpu_pages : &lnvm.host_pages);
	atomic64_inc(&lnvm.total_maps);
}

static void lnvm_window_uncount(struct lnvm_window *w)
{
	if (!w->counted)
		return;
	w->counted = false;
	atomic64_dec(w->gpu ? &lnvm.gpu_windows : &lnvm.host_windows);
	atomic64_sub(w->n, w->gpu ? &lnvm.gpu_pages : &lnvm.host_pages);
}

/* Releases what a window holds. Called without file->lock, on an unlinked window. */
static void lnvm_window_release(struct lnvm_ctrl *c, struct lnvm_window *w)
{
	unsigned long i;

	if (!w->gpu) {
		for (i = 0; i < w->n_dma; i++)
			dma_unmap_page(&c->pdev->dev, w->dma[i], PAGE_SIZE, DMA_BIDIRECTIONAL);
		unpin_user_pages_dirty_lock(w->pages, w->n, true);
	}
#ifdef LNVM_NV_P2P
	if (w->gpu && w->state == W_RELEASING) {
		int r1 = 0, r2;

		/*
		 * If the GPU driver frees the memory meanwhile, both calls wait for its callback
		 * (which leaves a RELEASING window alone) and fail: the driver then tore down the
		 * mapping and the page table itself, so failure here means "already released".
		 */
		if (w->dm)
			r1 = nvidia_p2p_dma_unmap_pages(c->pdev, w->pt, w->dm);
		r2 = nvidia_p2p_put_pages(0, 0, w->vaddr, w->pt);
		if (r1 || r2)
			pr_debug("GPU window 0x%llx released by the GPU driver first (%d, %d)\n",
				 w->vaddr, r1, r2);
	}
#endif
	lnvm_window_uncount(w);
	lnvm_window_free(w);
}

/*
 * Drops every window of @f. @stop: the controller may still be using them (close, unbind), so
 * stop it first if any window is live.
 */
static void lnvm_file_drop_windows(struct lnvm_file *f, bool stop, const char *why)
{
	struct lnvm_window *w, *tmp;
	LIST_HEAD(list);
	bool live = false;

	mutex_lock(&f->lock);
	list_for_each_entry(w, &f->windows, node) {
		if (w->state == W_LIVE) {
			w->state = W_RELEASING;
			live = true;
		}
	}
	list_splice_init(&f->windows, &list);
	mutex_unlock(&f->lock);

	if (live && stop)
		lnvm_stop_controller(f->ctrl, why);
	list_for_each_entry_safe(w, tmp, &list, node) {
		list_del(&w->node);
		lnvm_window_release(f->ctrl, w);
	}
}

static int lnvm_copy_addrs(u64 uptr, const u64 *addrs, unsigned long n)
{
	if (copy_to_user(u64_to_user_ptr(uptr), addrs, n * sizeof(u64)))
		return -EFAULT;
	return 0;
}

/*
 * Unlinks and releases the window @id if it is still in @f (after a failed copy_to_user). Found
 * by id, not by pointer: another thread may have unmapped it and a new window may sit at the
 * same address.
 */
static void lnvm_undo_window(struct lnvm_file *f, u64 id)
{
	struct lnvm_window *w, *found = NULL;

	mutex_lock(&f->lock);
	list_for_each_entry(w, &f->windows, node) {
		if (w->id == id) {
			found = w;
			break;
		}
	}
	if (found) {
		list_del(&found->node);
		if (found->state == W_LIVE)
			found->state = W_RELEASING;
	}
	mutex_unlock(&f->lock);
	/* not found: another thread unmapped it (or the controller went away) already */
	if (found)
		lnvm_window_release(f->ctrl, found);
}

static int lnvm_check_map_args(struct lnvm_ctrl *c, const struct nvm_ioctl_map *m,
			       u64 page_size, u64 *start)
{
	u64 va = m->vaddr_start & ~(page_size - 1);

	if (m->n_pages < 1) {
		dev_warn_ratelimited(&c->pdev->dev, "map: n_pages is 0\n");
		return -EINVAL;
	}
	if (m->n_pages > LNVM_MAX_PAGES) {
		dev_warn_ratelimited(&c->pdev->dev, "map: %llu pages exceed the limit of %lu\n",
				     m->n_pages, LNVM_MAX_PAGES);
		return -EINVAL;
	}
	if (va + m->n_pages * page_size < va) {
		dev_warn_ratelimited(&c->pdev->dev, "map: range 0x%llx + %llu pages wraps\n", va,
				     m->n_pages);
		return -EINVAL;
	}
	if (!access_ok(u64_to_user_ptr(m->ioaddrs), m->n_pages * sizeof(u64))) {
		dev_warn_ratelimited(&c->pdev->dev, "map: bad address array 0x%llx\n", m->ioaddrs);
		return -EFAULT;
	}
	*start = va;
	return 0;
}

static long lnvm_map_host(struct lnvm_file *f, const struct nvm_ioctl_map *m)
{
	struct lnvm_ctrl *c = f->ctrl;
	struct lnvm_window *w;
	unsigned long got = 0, i, n;
	u64 va, id, *addrs;
	long ret;

	ret = lnvm_check_map_args(c, m, PAGE_SIZE, &va);
	if (ret)
		return ret;
	if (va >= TASK_SIZE_MAX || m->n_pages > (TASK_SIZE_MAX - va) >> PAGE_SHIFT) {
		dev_warn_ratelimited(&c->pdev->dev, "map host: 0x%llx is not a user address\n", va);
		return -EFAULT;
	}
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return -ENOMEM;
	w->file = f;
	w->vaddr = va;
	w->page_size = PAGE_SIZE;
	w->n = m->n_pages;
	w->pages = kvmalloc_array(w->n, sizeof(*w->pages), GFP_KERNEL);
	w->dma = kvmalloc_array(w->n, sizeof(*w->dma), GFP_KERNEL);
	if (!w->pages || !w->dma) {
		lnvm_window_free(w);
		return -ENOMEM;
	}

	/* Long-term pins: the controller may use these pages for as long as the window lives. */
	lnvm_mmap_read_lock(current->mm);
	while (got < w->n) {
		ret = lnvm_pin_user_pages(va + got * PAGE_SIZE, w->n - got,
					  FOLL_WRITE | FOLL_LONGTERM, w->pages + got);
		if (ret <= 0)
			break;
		got += ret;
	}
	lnvm_mmap_read_unlock(current->mm);
	if (got < w->n) {
		/* upstream mapped the pages it got and left the rest 0; we refuse the whole range */
		dev_warn_ratelimited(&c->pdev->dev,
				    "map host: pinned %lu of %lu pages at 0x%llx (%ld)\n", got, w->n,
				    va, ret);
		if (got)
			unpin_user_pages(w->pages, got);
		lnvm_window_free(w);
		return ret < 0 ? ret : -EFAULT;
	}
	for (i = 0; i < w->n; i++) {
		w->dma[i] = dma_map_page(&c->pdev->dev, w->pages[i], 0, PAGE_SIZE,
					 DMA_BIDIRECTIONAL);
		if (dma_mapping_error(&c->pdev->dev, w->dma[i])) {
			dev_warn_ratelimited(&c->pdev->dev, "map host: dma_map_page failed\n");
			ret = -EIO;
			goto undo;
		}
		w->n_dma = i + 1;
	}
	/* u64 copies of the addresses (dma_addr_t is u64 on 64-bit kernels, not everywhere) */
	addrs = kvmalloc_array(w->n, sizeof(u64), GFP_KERNEL);
	if (!addrs) {
		ret = -ENOMEM;
		goto undo;
	}
	for (i = 0; i < w->n; i++)
		addrs[i] = w->dma[i];

	mutex_lock(&f->lock);
	if (READ_ONCE(c->removed)) {
		mutex_unlock(&f->lock);
		kvfree(addrs);
		ret = -ENODEV;
		goto undo;
	}
	w->state = W_LIVE;
	w->id = id = ++f->next_id;
	list_add_tail(&w->node, &f->windows);
	lnvm_window_count(w);
	n = w->n;
	mutex_unlock(&f->lock);

	ret = lnvm_copy_addrs(m->ioaddrs, addrs, n);
	kvfree(addrs);
	if (ret)
		lnvm_undo_window(f, id);   /* upstream leaked the mapping here */
	return ret;

undo:
	for (i = 0; i < w->n_dma; i++)
		dma_unmap_page(&c->pdev->dev, w->dma[i], PAGE_SIZE, DMA_BIDIRECTIONAL);
	unpin_user_pages(w->pages, w->n);
	lnvm_window_free(w);
	return ret;
}

#ifdef LNVM_NV_P2P
/*
 * The GPU driver reclaims the memory of a window (cudaFree, process exit). After this returns
 * the pages may belong to someone else, so the controller is stopped before the mapping goes.
 * The window stays in its file as REVOKED until unmapped or closed.
 */
static void lnvm_gpu_free_callback(void *data)
{
	struct lnvm_window *w = data;
	struct lnvm_file *f = w->file;

	mutex_lock(&f->lock);
	if (w->state == W_LIVE) {
		lnvm_stop_controller(f->ctrl, "GPU memory of a mapped window was freed");
		if (w->dm)
			nvidia_p2p_free_dma_mapping(w->dm);
		nvidia_p2p_free_page_table(w->pt);
		w->dm = NULL;
		w->pt = NULL;
		w->state = W_REVOKED;
		lnvm_window_uncount(w);
		atomic64_inc(&lnvm.revoked_windows);
		dev_info(&f->ctrl->pdev->dev,
			 "GPU driver reclaimed %lu GPU pages of window 0x%llx; window revoked\n",
			 w->n, w->vaddr);
	}
	/* RELEASING: the releasing thread's put_pages fails and it frees the window after us */
	mutex_unlock(&f->lock);
}

static long lnvm_map_device(struct lnvm_file *f, const struct nvm_ioctl_map *m)
{
	struct lnvm_ctrl *c = f->ctrl;
	struct lnvm_window *w;
	u64 va, id, *addrs = NULL;
	unsigned long i, n;
	long ret;

	ret = lnvm_check_map_args(c, m, LNVM_GPU_PAGE_SIZE, &va);
	if (ret)
		return ret;
	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return -ENOMEM;
	addrs = kvmalloc_array(m->n_pages, sizeof(u64), GFP_KERNEL);
	if (!addrs) {
		kfree(w);
		return -ENOMEM;
	}
	w->file = f;
	w->gpu = true;
	w->vaddr = va;
	w->page_size = LNVM_GPU_PAGE_SIZE;
	w->n = m->n_pages;
	w->state = W_RELEASING;   /* not LIVE until linked: a callback leaves it alone */

	mutex_lock(&f->lock);
	if (READ_ONCE(c->removed)) {
		ret = -ENODEV;
		goto fail_unlock;
	}
	ret = nvidia_p2p_get_pages(0, 0, va, w->n * LNVM_GPU_PAGE_SIZE, &w->pt,
				   lnvm_gpu_free_callback, w);
	if (ret) {
		dev_warn_ratelimited(&c->pdev->dev, "nvidia_p2p_get_pages(0x%llx, %lu pages): %ld\n",
				    va, w->n, ret);
		goto fail_unlock;
	}
	if (!NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(w->pt) ||
	    w->pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB || w->pt->entries != w->n) {
		dev_warn_ratelimited(&c->pdev->dev,
				     "unusable GPU page table (version 0x%x, page size %u, %u entries)\n",
				     w->pt->version, w->pt->page_size, w->pt->entries);
		ret = -EIO;
		goto fail_put;
	}
	ret = nvidia_p2p_dma_map_pages(c->pdev, w->pt, &w->dm);
	if (ret) {
		dev_warn_ratelimited(&c->pdev->dev, "nvidia_p2p_dma_map_pages: %ld\n", ret);
		w->dm = NULL;
		goto fail_put;
	}
	if (!NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(w->dm) || w->dm->entries != w->n) {
		dev_warn_ratelimited(&c->pdev->dev, "unusable GPU DMA mapping (version 0x%x, %u entries)\n",
				     w->dm->version, w->dm->entries);
		ret = -EIO;
		goto fail_put;
	}
	for (i = 0; i < w->n; i++)
		addrs[i] = w->dm->dma_addresses[i];
	w->state = W_LIVE;
	w->id = id = ++f->next_id;
	list_add_tail(&w->node, &f->windows);
	lnvm_window_count(w);
	n = w->n;
	mutex_unlock(&f->lock);

	ret = lnvm_copy_addrs(m->ioaddrs, addrs, n);
	kvfree(addrs);
	if (ret)
		lnvm_undo_window(f, id);
	return ret;

fail_put:
	/* unmap and put without file->lock: they may wait for a free callback that needs it */
	mutex_unlock(&f->lock);
	lnvm_window_release(c, w);
	kvfree(addrs);
	return ret;
fail_unlock:
	mutex_unlock(&f->lock);
	kvfree(addrs);
	kfree(w);
	return ret;
}
#endif /* LNVM_NV_P2P */

static long lnvm_unmap(struct lnvm_file *f, u64 addr)
{
	struct lnvm_window *w, *found = NULL;
	int pass;

	mutex_lock(&f->lock);
	/* host windows first, then GPU windows, as upstream searches its two lists */
	for (pass = 0; pass < 2 && !found; pass++) {
		list_for_each_entry(w, &f->windows, node) {
			if (w->gpu == (pass == 1) && w->vaddr == (addr & ~(w->page_size - 1))) {
				found = w;
				break;
			}
		}
	}
	if (!found) {
		mutex_unlock(&f->lock);
		dev_warn_ratelimited(&f->ctrl->pdev->dev, "Mapping for address %llx not found\n", addr);
		return -EINVAL;
	}
	list_del(&found->node);
	if (found->state == W_LIVE)
		found->state = W_RELEASING;
	mutex_unlock(&f->lock);
	lnvm_window_release(f->ctrl, found);
	return 0;
}

/* ------------------------------------------------------------------ file operations --- */

static int lnvm_open(struct inode *inode, struct file *file)
{
	struct lnvm_ctrl *c, *found = NULL;
	struct lnvm_file *f;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	INIT_LIST_HEAD(&f->windows);

	mutex_lock(&lnvm.lock);
	list_for_each_entry(c, &lnvm.ctrls, node) {
		if (c->devt == inode->i_rdev) {
			found = c;
			kref_get(&c->ref);
			break;
		}
	}
	mutex_unlock(&lnvm.lock);
	if (!found) {
		kfree(f);
		return -ENODEV;
	}
	mutex_lock(&found->lock);
	if (found->removed) {
		mutex_unlock(&found->lock);
		lnvm_ctrl_put(found);
		kfree(f);
		return -ENODEV;
	}
	f->ctrl = found;
	f->filp = file;
	list_add_tail(&f->node, &found->files);
	mutex_unlock(&found->lock);
	atomic64_inc(&lnvm.open_files);

	file->private_data = f;
	return 0;
}

static int lnvm_release(struct inode *inode, struct file *file)
{
	struct lnvm_file *f = file->private_data;
	struct lnvm_ctrl *c = f->ctrl;

	mutex_lock(&c->lock);
	list_del(&f->node);
	mutex_unlock(&c->lock);
	lnvm_file_drop_windows(f, true, "last close of a file with live windows");
	atomic64_dec(&lnvm.open_files);
	kfree(f);
	lnvm_ctrl_put(c);
	return 0;
}

static long lnvm_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct lnvm_file *f = file->private_data;
	void __user *up = (void __user *)arg;

	if (READ_ONCE(f->ctrl->removed))
		return -ENODEV;

	switch (cmd) {
	case NVM_GET_VERSION: {
		struct nvm_ioctl_version v = {
			.abi_major = NVM_ABI_MAJOR,
			.abi_minor = NVM_ABI_MINOR,
			.features = NVM_FEATURE_RELEASE_ON_CLOSE | NVM_FEATURE_ANY_THREAD_UNMAP,
		};

#ifdef LNVM_NV_P2P
		v.features |= NVM_FEATURE_DEVICE_MEMORY;
#endif
		return copy_to_user(up, &v, sizeof(v)) ? -EFAULT : 0;
	}
	case NVM_MAP_HOST_MEMORY:
#ifdef LNVM_NV_P2P
	case NVM_MAP_DEVICE_MEMORY:
#endif
	{
		struct nvm_ioctl_map m;

		if (copy_from_user(&m, up, sizeof(m)))
			return -EFAULT;
#ifdef LNVM_NV_P2P
		if (cmd == NVM_MAP_DEVICE_MEMORY)
			return lnvm_map_device(f, &m);
#endif
		return lnvm_map_host(f, &m);
	}
	case NVM_UNMAP_MEMORY: {
		u64 addr;

		if (copy_from_user(&addr, up, sizeof(addr)))
			return -EFAULT;
		return lnvm_unmap(f, addr);
	}
	default:
		dev_warn_ratelimited(&f->ctrl->pdev->dev,
				    "Unknown ioctl command from process %d: %u\n",
				    task_pid_nr(current), cmd);
		return -EINVAL;
	}
}

static int lnvm_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct lnvm_file *f = file->private_data;
	struct lnvm_ctrl *c = f->ctrl;
	unsigned long len = vma->vm_end - vma->vm_start;

	if (READ_ONCE(c->removed))
		return -ENODEV;
	if (vma->vm_pgoff != 0) {
		dev_warn_ratelimited(&c->pdev->dev, "mmap: offset must be 0\n");
		return -EINVAL;
	}
	if (len > c->bar_len) {
		dev_warn_ratelimited(&c->pdev->dev, "Invalid range size\n");
		return -EINVAL;
	}
	if (!(vma->vm_flags & VM_SHARED)) {
		/* a private copy-on-write view of registers means nothing */
		dev_warn_ratelimited(&c->pdev->dev, "mmap: BAR0 must be mapped MAP_SHARED\n");
		return -EINVAL;
	}
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	return vm_iomap_memory(vma, c->bar_start, len);
}

static const struct file_operations lnvm_fops = {
	.owner = THIS_MODULE,
	.open = lnvm_open,
	.release = lnvm_release,
	.unlocked_ioctl = lnvm_ioctl,
	.mmap = lnvm_mmap,
	.llseek = noop_llseek,
};

/* ---------------------------------------------------------------------------- PCI --- */

static int lnvm_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct lnvm_ctrl *c;
	int number, ret;

	number = ida_alloc_max(&lnvm.minors, num_ctrls - 1, GFP_KERNEL);
	if (number < 0) {
		dev_warn(&pdev->dev, "Maximum number of controller devices added\n");
		return -ENOSPC;
	}
	dev_info(&pdev->dev, "Adding controller device: %s\n", pci_name(pdev));
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c) {
		ret = -ENOMEM;
		goto err_ida;
	}
	kref_init(&c->ref);
	c->pdev = pci_dev_get(pdev);
	c->number = number;
	c->devt = MKDEV(MAJOR(lnvm.region), MINOR(lnvm.region) + number);
	mutex_init(&c->lock);
	mutex_init(&c->hw_lock);
	INIT_LIST_HEAD(&c->files);

	ret = pci_enable_device(pdev);
	if (ret)
		goto err_free;
	ret = pci_request_region(pdev, 0, DRIVER_NAME);
	if (ret)
		goto err_disable;
	c->bar_start = pci_resource_start(pdev, 0);
	c->bar_len = pci_resource_len(pdev, 0);
	c->regs = pci_iomap(pdev, 0, 0x1000);
	if (!c->regs) {
		ret = -ENOMEM;
		goto err_region;
	}
	/* upstream left the 32-bit default mask, which bounces through swiotlb above 4 GiB */
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(32));
	if (ret) {
		dev_err(&pdev->dev, "no usable DMA mask\n");
		goto err_iounmap;
	}

	c->cdev = cdev_alloc();
	if (!c->cdev) {
		ret = -ENOMEM;
		goto err_iounmap;
	}
	c->cdev->owner = THIS_MODULE;
	c->cdev->ops = &lnvm_fops;
	/* visible to open() before the node exists, so a fast open finds the controller */
	mutex_lock(&lnvm.lock);
	list_add_tail(&c->node, &lnvm.ctrls);
	mutex_unlock(&lnvm.lock);
	ret = cdev_add(c->cdev, c->devt, 1);
	if (ret)
		goto err_unlist;
	c->dev = device_create(lnvm.class, &pdev->dev, c->devt, NULL, "libnvm%d", number);
	if (IS_ERR(c->dev)) {
		ret = PTR_ERR(c->dev);
		goto err_cdev;
	}
	pci_set_master(pdev);
	pci_set_drvdata(pdev, c);
	dev_info(&pdev->dev, "Character device /dev/libnvm%d created (%d.%d)\n", number,
		 MAJOR(c->devt), MINOR(c->devt));
	return 0;

err_cdev:
	cdev_del(c->cdev);
err_unlist:
	mutex_lock(&lnvm.lock);
	list_del(&c->node);
	mutex_unlock(&lnvm.lock);
	if (ret == 0)
		ret = -ENOMEM;
err_iounmap:
	pci_iounmap(pdev, c->regs);
err_region:
	pci_release_region(pdev, 0);
err_disable:
	pci_disable_device(pdev);
err_free:
	lnvm_ctrl_put(c);
err_ida:
	ida_free(&lnvm.minors, number);
	return ret;
}

static void lnvm_remove(struct pci_dev *pdev)
{
	struct lnvm_ctrl *c = pci_get_drvdata(pdev);
	struct lnvm_file *f;

	device_destroy(lnvm.class, c->devt);
	cdev_del(c->cdev);
	mutex_lock(&lnvm.lock);
	list_del(&c->node);
	mutex_unlock(&lnvm.lock);

	/* Files may stay open: their windows go now, and their BAR mappings are zapped. */
	mutex_lock(&c->lock);
	WRITE_ONCE(c->removed, true);
	list_for_each_entry(f, &c->files, node) {
		lnvm_file_drop_windows(f, true, "controller unbound with live windows");
		unmap_mapping_range(f->filp->f_mapping, 0, 0, 1);
	}
	mutex_unlock(&c->lock);

	mutex_lock(&c->hw_lock);
	pci_iounmap(pdev, c->regs);
	c->regs = NULL;
	mutex_unlock(&c->hw_lock);
	pci_clear_master(pdev);
	pci_release_region(pdev, 0);
	pci_disable_device(pdev);
	ida_free(&lnvm.minors, c->number);
	dev_info(&pdev->dev, "Controller device removed: %s\n", pci_name(pdev));
	lnvm_ctrl_put(c);
}

static const struct pci_device_id lnvm_ids[] = {
	{ PCI_DEVICE_CLASS(0x010802, 0xffffff) },
	{ 0 }
};
MODULE_DEVICE_TABLE(pci, lnvm_ids);

static struct pci_driver lnvm_driver = {
	.name = DRIVER_NAME,
	.id_table = lnvm_ids,
	.probe = lnvm_probe,
	.remove = lnvm_remove,
};

/* -------------------------------------------------------------------------- debugfs --- */

static int lnvm_stats_show(struct seq_file *s, void *unused)
{
	struct lnvm_ctrl *c;
	int n = 0;

	mutex_lock(&lnvm.lock);
	list_for_each_entry(c, &lnvm.ctrls, node)
		n++;
	mutex_unlock(&lnvm.lock);
	seq_printf(s, "controllers: %d\n", n);
	seq_printf(s, "open_files: %lld\n", atomic64_read(&lnvm.open_files));
	seq_printf(s, "host_windows: %lld\nhost_pages: %lld\n", atomic64_read(&lnvm.host_windows),
		   atomic64_read(&lnvm.host_pages));
	seq_printf(s, "gpu_windows: %lld\ngpu_pages: %lld\n", atomic64_read(&lnvm.gpu_windows),
		   atomic64_read(&lnvm.gpu_pages));
	seq_printf(s, "revoked_windows: %lld\n", atomic64_read(&lnvm.revoked_windows));
	seq_printf(s, "controller_stops: %lld\nstop_timeouts: %lld\n",
		   atomic64_read(&lnvm.stops), atomic64_read(&lnvm.stop_timeouts));
	seq_printf(s, "total_maps: %lld\n", atomic64_read(&lnvm.total_maps));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(lnvm_stats);

/* ---------------------------------------------------------------------------- module --- */

static int __init lnvm_init(void)
{
	int ret;

	if (num_ctrls < 1 || num_ctrls > 256) {
		pr_err("num_ctrls must be 1..256, not %d\n", num_ctrls);
		return -EINVAL;
	}
	ida_init(&lnvm.minors);
	ret = alloc_chrdev_region(&lnvm.region, 0, num_ctrls, DRIVER_NAME);
	if (ret)
		return ret;
	lnvm.class = lnvm_class_create(DRIVER_NAME);
	if (IS_ERR(lnvm.class)) {
		ret = PTR_ERR(lnvm.class);
		goto err_region;
	}
	lnvm.debugfs = debugfs_create_dir("libnvm", NULL);
	debugfs_create_file("stats", 0444, lnvm.debugfs, NULL, &lnvm_stats_fops);
	ret = pci_register_driver(&lnvm_driver);
	if (ret)
		goto err_class;
	pr_info(DRIVER_NAME " loaded\n");
	return 0;

err_class:
	debugfs_remove_recursive(lnvm.debugfs);
	class_destroy(lnvm.class);
err_region:
	unregister_chrdev_region(lnvm.region, num_ctrls);
	return ret;
}

static void __exit lnvm_exit(void)
{
	pci_unregister_driver(&lnvm_driver);
	debugfs_remove_recursive(lnvm.debugfs);
	class_destroy(lnvm.class);
	unregister_chrdev_region(lnvm.region, num_ctrls);
	ida_destroy(&lnvm.minors);
	pr_info(DRIVER_NAME " unloaded\n");
}

module_init(lnvm_init);
module_exit(lnvm_exit);

MODULE_LICENSE("Dual BSD/GPL");
MODULE_DESCRIPTION("Set up DMA mappings for userspace buffers");
MODULE_VERSION("0.3");
