// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * p2ptest - drives gpusim's nvidia_p2p_* exports from the calling process, like gdrdrv.
 *
 * Locking mirrors gdrdrv's so that the test also proves gpusim's callback rules: each open file
 * has a mutex that PIN holds across nvidia_p2p_get_pages, and the free callback takes the same
 * mutex. UNPIN takes the mutex to detach the page table and calls put_pages after dropping it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>
#include <linux/pci.h>

#include "nv-p2p.h"
#include "p2ptest.h"

struct p2pt_slot {
	struct p2pt_file *owner;
	bool used;
	bool cb_fired;
	bool unpinning;   /* slot stays used until put_pages returned, so no PIN reuses it */
	u32 mode;
	u64 va;
	u64 len;
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dm;     /* live peer mapping */
	struct nvidia_p2p_dma_mapping *dm_old; /* the last one, for stale-pointer tests */
	struct pci_dev *peer;                  /* referenced while dm is set */
	bool cb_leave;
	int free_dma_ret;
};

struct p2pt_file {
	struct mutex lock;
	struct p2pt_slot slots[P2PT_SLOTS];
};

static void p2pt_free_callback(void *data)
{
	struct p2pt_slot *slot = data;
	struct p2pt_file *pf = slot->owner;
	int ret;

	mutex_lock(&pf->lock);
	slot->cb_fired = true;
	slot->free_dma_ret = 1;
	if (slot->dm) {
		if (!slot->cb_leave)
			slot->free_dma_ret = nvidia_p2p_free_dma_mapping(slot->dm);
		slot->dm = NULL;
		pci_dev_put(slot->peer);
		slot->peer = NULL;
	}
	if (slot->pt) {
		ret = nvidia_p2p_free_page_table(slot->pt);
		if (ret)
			pr_err("nvidia_p2p_free_page_table returned %d\n", ret);
		slot->pt = NULL;
	}
	mutex_unlock(&pf->lock);
}

static bool p2pt_persistent(u32 mode)
{
	return mode == P2PT_MODE_PERSISTENT || mode == P2PT_MODE_PERSISTENT_BAR1 ||
	       mode == P2PT_MODE_BAD_FLAGS;
}

static long p2pt_pin(struct p2pt_file *pf, struct p2pt_pin *arg)
{
	struct p2pt_slot *slot = NULL;
	int i, ret;

	mutex_lock(&pf->lock);
	for (i = 0; i < P2PT_SLOTS; i++) {
		if (!pf->slots[i].used) {
			slot = &pf->slots[i];
			break;
		}
	}
	if (!slot) {
		mutex_unlock(&pf->lock);
		return -ENOSPC;
	}
	slot->used = true;
	slot->cb_fired = false;
	slot->mode = arg->mode;
	slot->va = arg->va;
	slot->len = arg->len;
	slot->pt = NULL;
	slot->dm = NULL;
	slot->dm_old = NULL;
	slot->peer = NULL;
	slot->free_dma_ret = 1;

	/* The lock stays held across the call, as gdrdrv holds its region lock. */
	switch (arg->mode) {
	case P2PT_MODE_GET_PAGES:
		ret = nvidia_p2p_get_pages(0, 0, arg->va, arg->len, &slot->pt, p2pt_free_callback,
					   slot);
		break;
	case P2PT_MODE_PERSISTENT:
		ret = nvidia_p2p_get_pages_persistent(arg->va, arg->len, &slot->pt, 0);
		break;
	case P2PT_MODE_PERSISTENT_BAR1:
		ret = nvidia_p2p_get_pages_persistent(arg->va, arg->len, &slot->pt,
						      NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING);
		break;
	case P2PT_MODE_NULL_CALLBACK:
		ret = nvidia_p2p_get_pages(0, 0, arg->va, arg->len, &slot->pt, NULL, NULL);
		break;
	case P2PT_MODE_TOKEN:
		ret = nvidia_p2p_get_pages(1, 0, arg->va, arg->len, &slot->pt, p2pt_free_callback,
					   slot);
		break;
	case P2PT_MODE_BAD_FLAGS:
		ret = nvidia_p2p_get_pages_persistent(arg->va, arg->len, &slot->pt, 0x2);
		break;
	case P2PT_MODE_NULL_TABLE:
		ret = nvidia_p2p_get_pages(0, 0, arg->va, arg->len, NULL, p2pt_free_callback, slot);
		break;
	default:
		ret = -EINVAL;
	}
	if (ret == 0 && (!slot->pt || !NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(slot->pt))) {
		pr_err("get_pages succeeded but returned an unusable page table\n");
		ret = -EPROTO;   /* leaks the pin on purpose: the suite's pin counter will notice */
	}
	if (ret) {
		slot->used = false;
		slot->pt = NULL;
	} else {
		arg->slot = i;
	}
	mutex_unlock(&pf->lock);
	return ret;
}

/* 1: the callback had already released the pages; 0: put succeeded; <0: put failed. */
static long p2pt_unpin_slot(struct p2pt_file *pf, struct p2pt_slot *slot)
{
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dm;
	struct pci_dev *peer;
	long ret;

	mutex_lock(&pf->lock);
	if (!slot->used || slot->unpinning) {
		mutex_unlock(&pf->lock);
		return -EINVAL;
	}
	pt = slot->pt;
	dm = slot->dm;
	peer = slot->peer;
	slot->dm = NULL;
	slot->peer = NULL;
	slot->pt = NULL;
	slot->unpinning = true;
	mutex_unlock(&pf->lock);

	/*
	 * A client unmaps before it unpins, without its lock: a racing free callback waits for
	 * that lock, and gpusim makes the unmap wait for the callback (then fails with -EINVAL).
	 */
	if (pt && dm) {
		ret = nvidia_p2p_dma_unmap_pages(peer, pt, dm);
		if (ret && ret != -EINVAL)
			pr_err("dma_unmap_pages before put_pages returned %ld\n", ret);
	}
	pci_dev_put(peer);

	if (!pt)
		ret = 1;
	else if (p2pt_persistent(slot->mode))
		ret = nvidia_p2p_put_pages_persistent(slot->va, pt, 0);
	else
		/*
		 * Races with the free callback: gpusim lets exactly one side release the pin; if
		 * the callback won, put_pages fails with -EINVAL after waiting for it.
		 */
		ret = nvidia_p2p_put_pages(0, 0, slot->va, pt) == 0 ? 0 : 1;

	mutex_lock(&pf->lock);
	slot->unpinning = false;
	slot->used = false;
	mutex_unlock(&pf->lock);
	return ret;
}

static long p2pt_status(struct p2pt_file *pf, struct p2pt_status *st)
{
	struct p2pt_slot *slot;
	struct nvidia_p2p_page_table *pt;
	u32 i;

	if (st->slot >= P2PT_SLOTS)
		return -EINVAL;
	slot = &pf->slots[st->slot];
	mutex_lock(&pf->lock);
	if (!slot->used) {
		mutex_unlock(&pf->lock);
		return -EINVAL;
	}
	st->cb_fired = slot->cb_fired;
	pt = slot->pt;
	st->pinned = pt != NULL;
	if (pt) {
		st->version = pt->version;
		st->page_size = pt->page_size;
		st->entries = pt->entries;
		st->flags = pt->flags;
		st->uuid_nonzero = memchr_inv(pt->gpu_uuid, 0, NVIDIA_P2P_GPU_UUID_LEN) != NULL;
		st->phys_min = U64_MAX;
		st->phys_max = 0;
		st->contiguous = 1;
		for (i = 0; i < pt->entries; i++) {
			u64 p = pt->pages[i]->physical_address;

			st->phys_min = min(st->phys_min, p);
			st->phys_max = max(st->phys_max, p);
			if (i && p != pt->pages[i - 1]->physical_address + 0x10000)
				st->contiguous = 0;
		}
	}
	mutex_unlock(&pf->lock);
	return 0;
}

static long p2pt_access(struct p2pt_file *pf, struct p2pt_peek *pk, bool write)
{
	struct p2pt_slot *slot;
	struct nvidia_p2p_page_table *pt;
	void __iomem *io;
	u64 phys;
	long ret = 0;

	if (pk->slot >= P2PT_SLOTS || (pk->offset & 7))
		return -EINVAL;
	slot = &pf->slots[pk->slot];
	mutex_lock(&pf->lock);
	pt = slot->used ? slot->pt : NULL;
	if (!slot->used) {
		ret = -EINVAL;
		goto out;
	}
	if (!pt || pk->offset >= (u64)pt->entries << 16) {
		ret = pt ? -EINVAL : -ENXIO;
		goto out;
	}
	phys = pt->pages[pk->offset >> 16]->physical_address + (pk->offset & 0xffff);
	/* Same memtype as every other mapping of the BAR (gpusim reserves it WC). */
	io = ioremap_wc(phys & PAGE_MASK, PAGE_SIZE);
	if (!io) {
		ret = -ENOMEM;
		goto out;
	}
	if (write) {
		writeq(pk->value, io + (phys & ~PAGE_MASK));
		wmb();
	} else {
		pk->value = readq(io + (phys & ~PAGE_MASK));
	}
	iounmap(io);
	pk->phys = phys;
out:
	mutex_unlock(&pf->lock);
	return ret;
}

static struct pci_dev *p2pt_get_pdev(u32 domain, u32 bus, u32 devfn)
{
	if (bus > 255 || devfn > 255)
		return NULL;
	return pci_get_domain_bus_and_slot(domain, bus, devfn);
}

static long p2pt_dma_map(struct p2pt_file *pf, struct p2pt_dma *a)
{
	static struct nvidia_p2p_page_table bogus;
	struct nvidia_p2p_dma_mapping *m = NULL;
	struct p2pt_slot *slot;
	struct pci_dev *peer;
	long ret;
	u32 i;

	if (a->slot >= P2PT_SLOTS)
		return -ENOENT;
	peer = p2pt_get_pdev(a->domain, a->bus, a->devfn);
	if (!peer)
		return -ENODEV;
	slot = &pf->slots[a->slot];
	mutex_lock(&pf->lock);
	if (!slot->used || !slot->pt || slot->dm) {
		ret = -ENOENT;
		goto out;
	}
	ret = nvidia_p2p_dma_map_pages((a->flags & P2PT_DMA_NULL_PEER) ? NULL : peer,
				       (a->flags & P2PT_DMA_BAD_TABLE) ? &bogus : slot->pt,
				       (a->flags & P2PT_DMA_NULL_OUT) ? NULL : &m);
	if (ret)
		goto out;
	if (!m) {
		pr_err("dma_map_pages succeeded without a mapping\n");
		ret = -EPROTO;
		goto out;
	}
	slot->dm = m;
	slot->dm_old = m;
	slot->peer = peer;
	peer = NULL;   /* the slot holds the reference now */
	slot->cb_leave = a->flags & P2PT_DMA_CB_LEAVE;
	a->version = m->version;
	a->page_size_type = m->page_size_type;
	a->entries = m->entries;
	a->pci_dev_ok = m->pci_dev == slot->peer;
	a->equal_phys = 0;
	for (i = 0; i < m->entries && i < slot->pt->entries; i++)
		a->equal_phys += m->dma_addresses[i] == slot->pt->pages[i]->physical_address;
	a->first = m->entries ? m->dma_addresses[0] : 0;
	a->last = m->entries ? m->dma_addresses[m->entries - 1] : 0;
out:
	mutex_unlock(&pf->lock);
	pci_dev_put(peer);
	return ret;
}

static long p2pt_dma_unmap(struct p2pt_file *pf, struct p2pt_dma_unmap *a)
{
	struct pci_dev *other_peer = NULL;
	struct p2pt_slot *slot;
	long ret;

	if (a->slot >= P2PT_SLOTS || a->other >= P2PT_SLOTS)
		return -ENOENT;
	if (a->how == P2PT_UNMAP_WRONG_PEER || a->how == P2PT_UNMAP_STALE) {
		other_peer = p2pt_get_pdev(a->domain, a->bus, a->devfn);
		if (!other_peer)
			return -ENODEV;
	}
	slot = &pf->slots[a->slot];
	mutex_lock(&pf->lock);
	if (!slot->used || !slot->pt ||
	    (a->how == P2PT_UNMAP_STALE ? !slot->dm_old : !slot->dm)) {
		ret = -ENOENT;
		goto out;
	}
	switch (a->how) {
	case P2PT_UNMAP_OK: {
		struct nvidia_p2p_page_table *pt = slot->pt;
		struct nvidia_p2p_dma_mapping *dm = slot->dm;
		struct pci_dev *peer = slot->peer;

		/* as in unpin: the call may wait for a running free callback, so drop the lock */
		slot->dm = NULL;
		slot->peer = NULL;
		mutex_unlock(&pf->lock);
		ret = nvidia_p2p_dma_unmap_pages(peer, pt, dm);
		pci_dev_put(peer);
		pci_dev_put(other_peer);
		return ret;
	}
	case P2PT_UNMAP_WRONG_PEER:
		ret = nvidia_p2p_dma_unmap_pages(other_peer, slot->pt, slot->dm);
		break;
	case P2PT_UNMAP_WRONG_TABLE:
		ret = pf->slots[a->other].pt ?
		      nvidia_p2p_dma_unmap_pages(slot->peer, pf->slots[a->other].pt, slot->dm) :
		      -ENOENT;
		break;
	case P2PT_UNMAP_FREE:
		ret = nvidia_p2p_free_dma_mapping(slot->dm);
		break;
	case P2PT_UNMAP_NULL:
		ret = nvidia_p2p_dma_unmap_pages(slot->peer, slot->pt, NULL);
		break;
	case P2PT_UNMAP_STALE:
		/* the pointer is never dereferenced by gpusim: it is looked up first */
		ret = nvidia_p2p_dma_unmap_pages(other_peer, slot->pt, slot->dm_old);
		break;
	default:
		ret = -ENOENT;
	}
out:
	mutex_unlock(&pf->lock);
	pci_dev_put(other_peer);
	return ret;
}

/* The exports gpusim does not implement must say so with the documented errors. */
static long p2pt_selftest(void)
{
	struct nvidia_p2p_dma_mapping *dm = NULL;
	struct nvidia_p2p_params params = {};
	nvidia_p2p_rsync_reg_info_t *ri = NULL;
	int fails = 0;

#define EXPECT(call, want) do { int r_ = (call); \
	if (r_ != (want)) { pr_err("%s returned %d, expected %d\n", #call, r_, want); fails++; } } while (0)
	EXPECT(nvidia_p2p_free_page_table(NULL), -EINVAL);
	EXPECT(nvidia_p2p_put_pages(0, 0, 0x200000000000ULL, NULL), -EINVAL);
	EXPECT(nvidia_p2p_put_pages_persistent(0x200000000000ULL, NULL, 0), -EINVAL);
	EXPECT(nvidia_p2p_dma_map_pages(NULL, NULL, &dm), -EINVAL);
	EXPECT(nvidia_p2p_dma_unmap_pages(NULL, NULL, NULL), -EINVAL);
	EXPECT(nvidia_p2p_free_dma_mapping(NULL), -EINVAL);
	EXPECT(nvidia_p2p_init_mapping(0, &params, NULL, NULL), -EOPNOTSUPP);
	EXPECT(nvidia_p2p_destroy_mapping(0), -EOPNOTSUPP);
	EXPECT(nvidia_p2p_get_rsync_registers(&ri), -EOPNOTSUPP);
#undef EXPECT
	return fails ? -EPROTO : 0;
}

static int p2pt_open(struct inode *inode, struct file *file)
{
	struct p2pt_file *pf = kzalloc(sizeof(*pf), GFP_KERNEL);
	int i;

	if (!pf)
		return -ENOMEM;
	mutex_init(&pf->lock);
	for (i = 0; i < P2PT_SLOTS; i++)
		pf->slots[i].owner = pf;
	file->private_data = pf;
	return 0;
}

static int p2pt_release(struct inode *inode, struct file *file)
{
	struct p2pt_file *pf = file->private_data;
	int i;

	for (i = 0; i < P2PT_SLOTS; i++)
		if (pf->slots[i].used)
			p2pt_unpin_slot(pf, &pf->slots[i]);
	kfree(pf);
	return 0;
}

static long p2pt_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct p2pt_file *pf = file->private_data;
	void __user *up = (void __user *)uarg;
	long ret;

	switch (cmd) {
	case P2PT_IOC_PIN: {
		struct p2pt_pin arg;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		ret = p2pt_pin(pf, &arg);
		if (ret == 0 && copy_to_user(up, &arg, sizeof(arg))) {
			p2pt_unpin_slot(pf, &pf->slots[arg.slot]);
			return -EFAULT;
		}
		return ret;
	}
	case P2PT_IOC_UNPIN: {
		u32 slot;

		if (get_user(slot, (u32 __user *)up))
			return -EFAULT;
		if (slot >= P2PT_SLOTS)
			return -EINVAL;
		return p2pt_unpin_slot(pf, &pf->slots[slot]);
	}
	case P2PT_IOC_STATUS: {
		struct p2pt_status st;

		if (copy_from_user(&st, up, sizeof(st)))
			return -EFAULT;
		ret = p2pt_status(pf, &st);
		if (ret == 0 && copy_to_user(up, &st, sizeof(st)))
			return -EFAULT;
		return ret;
	}
	case P2PT_IOC_PEEK:
	case P2PT_IOC_POKE: {
		struct p2pt_peek pk;

		if (copy_from_user(&pk, up, sizeof(pk)))
			return -EFAULT;
		ret = p2pt_access(pf, &pk, cmd == P2PT_IOC_POKE);
		if (ret == 0 && cmd == P2PT_IOC_PEEK && copy_to_user(up, &pk, sizeof(pk)))
			return -EFAULT;
		return ret;
	}
	case P2PT_IOC_SELFTEST:
		return p2pt_selftest();
	case P2PT_IOC_DMA_MAP: {
		struct p2pt_dma a;

		if (copy_from_user(&a, up, sizeof(a)))
			return -EFAULT;
		ret = p2pt_dma_map(pf, &a);
		if (ret == 0 && copy_to_user(up, &a, sizeof(a)))
			return -EFAULT;
		return ret;
	}
	case P2PT_IOC_DMA_UNMAP: {
		struct p2pt_dma_unmap a;

		if (copy_from_user(&a, up, sizeof(a)))
			return -EFAULT;
		return p2pt_dma_unmap(pf, &a);
	}
	case P2PT_IOC_DMA_CB: {
		struct p2pt_dma_cb a;
		struct p2pt_slot *slot;

		if (copy_from_user(&a, up, sizeof(a)))
			return -EFAULT;
		if (a.slot >= P2PT_SLOTS)
			return -ENOENT;
		slot = &pf->slots[a.slot];
		mutex_lock(&pf->lock);
		a.cb_fired = slot->cb_fired;
		a.free_dma_ret = slot->free_dma_ret;
		a.mapped = slot->dm != NULL;
		ret = slot->used ? 0 : -ENOENT;
		mutex_unlock(&pf->lock);
		if (ret == 0 && copy_to_user(up, &a, sizeof(a)))
			return -EFAULT;
		return ret;
	}
	default:
		return -ENOTTY;
	}
}

static const struct file_operations p2pt_fops = {
	.owner = THIS_MODULE,
	.open = p2pt_open,
	.release = p2pt_release,
	.unlocked_ioctl = p2pt_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice p2pt_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpusim_p2ptest",
	.fops = &p2pt_fops,
	.mode = 0666,
};

module_misc_device(p2pt_misc);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("Test driver for gpusim's nvidia_p2p_* exports");
