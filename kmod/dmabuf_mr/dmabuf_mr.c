// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * dmabuf_mr - test-only: dma-buf MRs through the kernel's ib_umem_dmabuf importer (uapi in
 * dmabuf_mr.h). The ib_device is never registered: the importer uses only its dma_device,
 * which here is the VM's NVMe controller (a real PCI function with its own DMA mask). The VM has
 * no IOMMU, so a DMA address is the bus address of gpusim's BAR, and a read maps it and loads.
 * MRs belong to the open file and are released when it is closed.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/xarray.h>
#include <linux/uaccess.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/scatterlist.h>
#include <linux/version.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>

#include "dmabuf_mr.h"

static char *dma_dev = "nvme";
module_param(dma_dev, charp, 0444);
MODULE_PARM_DESC(dma_dev, "PCI device acting as the ib_device's DMA device: nvme or ivshmem");

struct dmr_mr {
	struct ib_umem_dmabuf *ud;
	bool dynamic;
	bool invalidated;   /* move_notify came (dynamic); under the resv lock */
	u64 offset, size;
};

struct dmr_file {
	struct mutex lock;
	struct xarray mrs;
};

static struct ib_device *dmr_ibdev;
static struct pci_dev *dmr_dma_pdev, *dmr_gpu_pdev;

/* Called with the dma-buf's resv held, as mlx5's: stop access, then unmap. */
static void dmr_move_notify(struct dma_buf_attachment *attach)
{
	struct ib_umem_dmabuf *ud = attach->importer_priv;
	struct dmr_mr *mr = ud->private;

	pr_info("move_notify: unmapping MR at dma-buf offset 0x%llx\n", mr->offset);
	mr->invalidated = true;
	ib_umem_dmabuf_unmap_pages(ud);
}

static const struct dma_buf_attach_ops dmr_ops = {
	.allow_peer2peer = true,
	.move_notify = dmr_move_notify,
};

static long dmr_reg(struct dmr_file *f, struct dmr_reg *r)
{
	struct ib_umem_dmabuf *ud;
	struct scatterlist *sg;
	struct dmr_mr *mr;
	unsigned int i;
	u32 handle;
	int ret;

	if (r->mode > DMR_DYNAMIC)
		return -EINVAL;
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return -ENOMEM;
	mr->dynamic = r->mode == DMR_DYNAMIC;
	mr->offset = r->offset;
	mr->size = r->size;
	if (!mr->dynamic) {
		ud = ib_umem_dmabuf_get_pinned(dmr_ibdev, r->offset, r->size, r->fd, r->access);
		if (IS_ERR(ud)) {
			kfree(mr);
			return PTR_ERR(ud);
		}
		ud->private = mr;
	} else {
		ud = ib_umem_dmabuf_get(dmr_ibdev, r->offset, r->size, r->fd, r->access, &dmr_ops);
		if (IS_ERR(ud)) {
			kfree(mr);
			return PTR_ERR(ud);
		}
		ud->private = mr;
		dma_resv_lock(ud->attach->dmabuf->resv, NULL);
		ret = ib_umem_dmabuf_map_pages(ud);
		dma_resv_unlock(ud->attach->dmabuf->resv);
		if (ret) {
			ib_umem_release(&ud->umem);
			kfree(mr);
			return ret;
		}
	}
	mr->ud = ud;
	r->nents = ud->umem.sgt_append.sgt.nents;
	r->mapped = 0;
	for_each_sg(ud->umem.sgt_append.sgt.sgl, sg, r->nents, i)
		r->mapped += sg_dma_len(sg);
	r->dma_first = sg_dma_address(ud->umem.sgt_append.sgt.sgl);
	ret = xa_alloc(&f->mrs, &handle, mr, xa_limit_32b, GFP_KERNEL);
	if (ret) {
		ib_umem_release(&ud->umem);
		kfree(mr);
		return ret;
	}
	r->handle = handle;
	return 0;
}

static void dmr_release_mr(struct dmr_mr *mr)
{
	ib_umem_release(&mr->ud->umem);   /* unmaps (dynamic: under the resv), unpins, detaches */
	kfree(mr);
}

static long dmr_read(struct dmr_file *f, struct dmr_read *rd)
{
	resource_size_t bar_start = pci_resource_start(dmr_gpu_pdev, 2);
	resource_size_t bar_end = pci_resource_end(dmr_gpu_pdev, 2);
	struct ib_umem *umem;
	struct scatterlist *sg;
	struct dmr_mr *mr;
	void __iomem *p;
	u64 pos, addr = 0;
	unsigned int i;

	mr = xa_load(&f->mrs, rd->handle);
	if (!mr)
		return -ENOENT;
	if (((mr->offset + rd->offset) & 7) || rd->offset > mr->size || rd->offset + 8 > mr->size)
		return -EINVAL;
	if (mr->invalidated)
		return -EIO;
	umem = &mr->ud->umem;
	/* The importer's list starts at the host page holding the MR's first byte. */
	pos = (mr->offset & ~PAGE_MASK) + rd->offset;
	for_each_sg(umem->sgt_append.sgt.sgl, sg, umem->sgt_append.sgt.nents, i) {
		if (pos < sg_dma_len(sg)) {
			addr = sg_dma_address(sg) + pos;
			break;
		}
		pos -= sg_dma_len(sg);
	}
	if (!addr || pos + 8 > sg_dma_len(sg)) {
		pr_err("MR %u: no DMA address for offset 0x%llx\n", rd->handle, rd->offset);
		return -EFAULT;
	}
	if (addr < bar_start || addr + 8 > bar_end + 1) {
		pr_err("MR %u: DMA address 0x%llx is outside the GPU BAR\n", rd->handle, addr);
		return -EFAULT;
	}
	p = ioremap_wc(addr, 8);
	if (!p)
		return -ENOMEM;
	rd->value = readq(p);
	iounmap(p);
	return 0;
}

static long dmr_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct dmr_file *f = file->private_data;
	void __user *uptr = (void __user *)uarg;
	struct dmr_mr *mr;
	long ret;
	u32 h;

	switch (cmd) {
	case DMR_IOC_REG: {
		struct dmr_reg r;

		if (copy_from_user(&r, uptr, sizeof(r)))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = dmr_reg(f, &r);
		if (!ret && copy_to_user(uptr, &r, sizeof(r))) {
			dmr_release_mr(xa_erase(&f->mrs, r.handle));
			ret = -EFAULT;
		}
		mutex_unlock(&f->lock);
		return ret;
	}
	case DMR_IOC_READ: {
		struct dmr_read rd;

		if (copy_from_user(&rd, uptr, sizeof(rd)))
			return -EFAULT;
		mutex_lock(&f->lock);
		ret = dmr_read(f, &rd);
		mutex_unlock(&f->lock);
		if (!ret && copy_to_user(uptr, &rd, sizeof(rd)))
			return -EFAULT;
		return ret;
	}
	case DMR_IOC_DEREG:
		if (get_user(h, (u32 __user *)uptr))
			return -EFAULT;
		mutex_lock(&f->lock);
		mr = xa_erase(&f->mrs, h);
		if (mr)
			dmr_release_mr(mr);
		mutex_unlock(&f->lock);
		return mr ? 0 : -ENOENT;
	default:
		return -ENOTTY;
	}
}

static int dmr_open(struct inode *inode, struct file *file)
{
	struct dmr_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	xa_init_flags(&f->mrs, XA_FLAGS_ALLOC);
	file->private_data = f;
	return 0;
}

static int dmr_release(struct inode *inode, struct file *file)
{
	struct dmr_file *f = file->private_data;
	struct dmr_mr *mr;
	unsigned long h;

	xa_for_each(&f->mrs, h, mr) {
		xa_erase(&f->mrs, h);
		dmr_release_mr(mr);
	}
	xa_destroy(&f->mrs);
	kfree(f);
	return 0;
}

static const struct file_operations dmr_fops = {
	.owner = THIS_MODULE,
	.open = dmr_open,
	.release = dmr_release,
	.unlocked_ioctl = dmr_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice dmr_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "dmabuf_mr",
	.fops = &dmr_fops,
	.mode = 0600,
};

static int __init dmr_init(void)
{
	int ret;

	dmr_gpu_pdev = pci_get_device(0x1af4, 0x1110, NULL);
	if (!dmr_gpu_pdev) {
		pr_err("no ivshmem device (the simulated GPU)\n");
		return -ENODEV;
	}
	if (!strcmp(dma_dev, "ivshmem"))
		dmr_dma_pdev = pci_dev_get(dmr_gpu_pdev);
	else
		dmr_dma_pdev = pci_get_device(0x1b36, 0x0010, NULL);
	if (!dmr_dma_pdev) {
		pr_err("no %s PCI device for the ib_device's DMA device\n", dma_dev);
		ret = -ENODEV;
		goto put_gpu;
	}
	/* Never registered with the RDMA core: the importer reads only dma_device. */
	dmr_ibdev = kzalloc(sizeof(*dmr_ibdev), GFP_KERNEL);
	if (!dmr_ibdev) {
		ret = -ENOMEM;
		goto put_dma;
	}
	dmr_ibdev->dma_device = &dmr_dma_pdev->dev;
	ret = misc_register(&dmr_misc);
	if (ret)
		goto free_dev;
	pr_info("ib_device DMA device %s\n", pci_name(dmr_dma_pdev));
	return 0;

free_dev:
	kfree(dmr_ibdev);
put_dma:
	pci_dev_put(dmr_dma_pdev);
put_gpu:
	pci_dev_put(dmr_gpu_pdev);
	return ret;
}

static void __exit dmr_exit(void)
{
	misc_deregister(&dmr_misc);
	kfree(dmr_ibdev);
	pci_dev_put(dmr_dma_pdev);
	pci_dev_put(dmr_gpu_pdev);
}

module_init(dmr_init);
module_exit(dmr_exit);

MODULE_LICENSE("Dual MIT/GPL");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
MODULE_DESCRIPTION("Test-only dma-buf MRs through the kernel's ib_umem_dmabuf importer");
