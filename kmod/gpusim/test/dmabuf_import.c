// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * dmabuf_import - a test-only dma-buf importer (uapi in dmabuf_import.h).
 *
 * Each open file has DBI_SLOTS slots; a slot holds one dma-buf reference, one attachment to the
 * ivshmem device (the simulated GPU, acting as its own peer) and one mapping. Everything a file
 * still holds is released when it is closed, so a crashing test leaks nothing.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>
#include <linux/dma-buf.h>
#include <linux/scatterlist.h>
#include <linux/version.h>

#include "dmabuf_import.h"

struct dbi_slot {
	struct dma_buf *buf;
	struct dma_buf_attachment *at;
	struct sg_table *sgt;
};

struct dbi_file {
	struct mutex lock;
	struct dbi_slot slots[DBI_SLOTS];
};

static struct pci_dev *dbi_pdev;   /* the importing device */

/* The exporter never moves its buffers; a notification would mean it revoked one. */
static void dbi_move_notify(struct dma_buf_attachment *at)
{
	pr_info("move_notify on a %s dma-buf\n", at->dmabuf->exp_name);
}

static const struct dma_buf_attach_ops dbi_ops_p2p = {
	.allow_peer2peer = true,
	.move_notify = dbi_move_notify,
};

static const struct dma_buf_attach_ops dbi_ops_no_p2p = {
	.allow_peer2peer = false,
	.move_notify = dbi_move_notify,
};

static void dbi_slot_release(struct dbi_slot *s)
{
	if (!s->buf)
		return;
	if (s->sgt)
		dma_buf_unmap_attachment_unlocked(s->at, s->sgt, DMA_BIDIRECTIONAL);
	if (s->at)
		dma_buf_detach(s->buf, s->at);
	dma_buf_put(s->buf);
	memset(s, 0, sizeof(*s));
}

static long dbi_import(struct dbi_file *f, struct dbi_import *arg)
{
	struct dbi_slot *s = NULL;
	struct scatterlist *sg;
	unsigned int i;
	long ret;

	if (arg->mode > DBI_DYNAMIC_NO_P2P)
		return -EINVAL;
	for (i = 0; i < DBI_SLOTS; i++) {
		if (!f->slots[i].buf) {
			s = &f->slots[i];
			break;
		}
	}
	if (!s)
		return -ENOSPC;
	s->buf = dma_buf_get(arg->fd);
	if (IS_ERR(s->buf)) {
		ret = PTR_ERR(s->buf);
		s->buf = NULL;
		return ret;
	}
	if (arg->mode == DBI_STATIC)
		s->at = dma_buf_attach(s->buf, &dbi_pdev->dev);
	else
		s->at = dma_buf_dynamic_attach(s->buf, &dbi_pdev->dev,
					       arg->mode == DBI_DYNAMIC_P2P ? &dbi_ops_p2p : &dbi_ops_no_p2p,
					       f);
	if (IS_ERR(s->at)) {
		ret = PTR_ERR(s->at);
		s->at = NULL;
		goto fail;
	}
	s->sgt = dma_buf_map_attachment_unlocked(s->at, DMA_BIDIRECTIONAL);
	if (IS_ERR(s->sgt)) {
		ret = PTR_ERR(s->sgt);
		s->sgt = NULL;
		goto fail;
	}
	arg->slot = i;
	arg->size = s->buf->size;
	arg->nents = s->sgt->nents;
	arg->mapped = 0;
	arg->dma_min = U64_MAX;
	arg->dma_max = 0;
	for_each_sgtable_dma_sg(s->sgt, sg, i) {
		arg->mapped += sg_dma_len(sg);
		arg->dma_min = min_t(u64, arg->dma_min, sg_dma_address(sg));
		arg->dma_max = max_t(u64, arg->dma_max, sg_dma_address(sg));
	}
	strscpy(arg->exp_name, s->buf->exp_name ? s->buf->exp_name : "", sizeof(arg->exp_name));
	return 0;

fail:
	dbi_slot_release(s);
	return ret;
}

/* Reads 8 bytes at @offset through the DMA address the exporter gave (== physical here). */
static long dbi_peek(struct dbi_file *f, struct dbi_peek *pk)
{
	resource_size_t bar_start = pci_resource_start(dbi_pdev, 2);
	resource_size_t bar_end = pci_resource_end(dbi_pdev, 2);
	struct scatterlist *sg;
	struct dbi_slot *s;
	u64 off, addr = 0;
	void __iomem *p;
	unsigned int i;

	if (pk->slot >= DBI_SLOTS || !f->slots[pk->slot].sgt || (pk->offset & 7))
		return -EINVAL;
	s = &f->slots[pk->slot];
	off = pk->offset;
	for_each_sgtable_dma_sg(s->sgt, sg, i) {
		if (off < sg_dma_len(sg)) {
			addr = sg_dma_address(sg) + off;
			break;
		}
		off -= sg_dma_len(sg);
	}
	if (!addr)
		return -EINVAL;
	/* Only the BAR: a wrong address must fail the test, not read random memory. */
	if (addr < bar_start || addr + 8 > bar_end + 1)
		return -EFAULT;
	p = ioremap_wc(addr, 8);
	if (!p)
		return -ENOMEM;
	pk->value = readq(p);
	iounmap(p);
	return 0;
}

static long dbi_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct dbi_file *f = file->private_data;
	void __user *up = (void __user *)uarg;
	long ret;

	switch (cmd) {
	case DBI_IOC_IMPORT: {
		struct dbi_import arg;

		if (copy_from_user(&arg, up, sizeof(arg)))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = dbi_import(f, &arg);
		if (!ret && copy_to_user(up, &arg, sizeof(arg))) {
			dbi_slot_release(&f->slots[arg.slot]);
			ret = -EFAULT;
		}
		mutex_unlock(&f->lock);
		return ret;
	}
	case DBI_IOC_PEEK: {
		struct dbi_peek pk;

		if (copy_from_user(&pk, up, sizeof(pk)))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = dbi_peek(f, &pk);
		mutex_unlock(&f->lock);
		if (!ret && copy_to_user(up, &pk, sizeof(pk)))
			return -EFAULT;
		return ret;
	}
	case DBI_IOC_RELEASE: {
		u32 slot;

		if (get_user(slot, (u32 __user *)up))
			return -EFAULT;
		if (slot >= DBI_SLOTS)
			return -EINVAL;
		mutex_lock(&f->lock);
		ret = f->slots[slot].buf ? 0 : -EINVAL;
		dbi_slot_release(&f->slots[slot]);
		mutex_unlock(&f->lock);
		return ret;
	}
	default:
		return -ENOTTY;
	}
}

static int dbi_open(struct inode *inode, struct file *file)
{
	struct dbi_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	file->private_data = f;
	return 0;
}

static int dbi_release(struct inode *inode, struct file *file)
{
	struct dbi_file *f = file->private_data;
	unsigned int i;

	for (i = 0; i < DBI_SLOTS; i++)
		dbi_slot_release(&f->slots[i]);
	kfree(f);
	return 0;
}

static const struct file_operations dbi_fops = {
	.owner = THIS_MODULE,
	.open = dbi_open,
	.release = dbi_release,
	.unlocked_ioctl = dbi_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice dbi_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpusim_dmabuf_import",
	.fops = &dbi_fops,
	.mode = 0666,
};

static int __init dbi_init(void)
{
	int ret;

	dbi_pdev = pci_get_device(0x1af4, 0x1110, NULL);
	if (!dbi_pdev) {
		pr_err("no ivshmem device to import with\n");
		return -ENODEV;
	}
	ret = misc_register(&dbi_misc);
	if (ret)
		pci_dev_put(dbi_pdev);
	return ret;
}

static void __exit dbi_exit(void)
{
	misc_deregister(&dbi_misc);
	pci_dev_put(dbi_pdev);
}

module_init(dbi_init);
module_exit(dbi_exit);

MODULE_LICENSE("Dual MIT/GPL");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
MODULE_DESCRIPTION("Test-only dma-buf importer for gpusim's exports");
