// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * nv_peer_mem - peer-memory client for NVIDIA GPU memory, a drop-in for Mellanox's
 * nv_peer_memory 1.3 (module nv_peer_mem, clients "nv_mem" and "nv_mem_nc", version "1.3-0").
 *
 * The RDMA core (MLNX_OFED/DOCA-OFED's peer_mem.c, or a kernel carrying it) offers a user range
 * that ordinary pinning refused to every registered client; this one claims ranges the NVIDIA
 * driver knows (acquire probes with nvidia_p2p_get_pages), pins them in 64 KiB GPU pages
 * (get_pages) and maps them for the HCA (dma_map through nvidia_p2p_dma_map_pages).
 *
 *  - nv_mem: invalidating, new-style (PEER_MEM_INVALIDATE_UNMAPS). When the GPU memory is freed
 *    the driver calls our free callback, which asks the core to invalidate; the core then stops
 *    the HCA and makes no client calls, and we drop the mapping ourselves. So the core's
 *    dma_unmap/put_pages are no-ops when they run inside that callback.
 *  - nv_mem_nc: non-invalidating, persistent pins (the core offers it only ranges whose user
 *    cannot handle invalidation: CQs, QPs, doorbells). Registered when the driver provides
 *    persistent pins: legacy drivers (515-530) through nvidia_p2p_get_pages with no callback
 *    when nvidia_p2p_cap_persistent_pages is set; drivers with
 *    NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API (535+) through nvidia_p2p_get_pages_persistent,
 *    where 1.3 itself would register nv_mem only.
 *
 * Each acquired range holds a module reference, so rmmod is refused while any MR exists.
 * Contexts are reference counted: the core may release a context while the free callback that
 * invalidated it is still finishing.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/pci.h>
#include <linux/kref.h>
#include <linux/mutex.h>
#include <linux/namei.h>
#include <linux/sched.h>
#include <linux/scatterlist.h>

#include <rdma/peer_mem.h>
#include "nv-p2p.h"

#define DRV_NAME "nv_mem"
#define DRV_VERSION "1.3-0"
#define NC_NAME DRV_NAME "_nc"

MODULE_AUTHOR("gpudirect-rs (nv_peer_memory 1.3 compatible)");
MODULE_DESCRIPTION("NVIDIA GPU memory plug-in");
MODULE_LICENSE("Dual BSD/GPL");
MODULE_VERSION(DRV_VERSION);

static int enable_dbg;
module_param(enable_dbg, int, 0000);
MODULE_PARM_DESC(enable_dbg, "enable debug tracing");

#define peer_err(fmt, ...) \
	pr_err(DRV_NAME " %s:%d " fmt, __func__, __LINE__, ##__VA_ARGS__)
#define peer_dbg(fmt, ...) do {							\
	if (enable_dbg)								\
		pr_err(DRV_NAME " DBG %s:%d " fmt, __func__, __LINE__, ##__VA_ARGS__); \
} while (0)

#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

#if defined(NVIDIA_P2P_CAP_PERSISTENT_PAGES)
#define NVPM_NC_LEGACY 1
#elif defined(NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API)
#define NVPM_NC_PERSISTENT_API 1
#endif

struct nv_mem_context {
	struct kref ref;
	struct mutex lock;       /* dma_map against the free callback */
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *dma_mapping;
	struct pci_dev *pdev;
	u64 core_context;
	u64 page_virt_start;
	u64 page_virt_end;
	size_t mapped_size;
	unsigned long npages;
	unsigned long page_size;
	struct task_struct *callback_task;
	bool persistent;
	bool freed;              /* the driver's free callback ran to its end */
	int sg_allocated;
	struct sg_table sg_head; /* copy of the header we filled, to recognise it later */
};

static void *reg_handle;
static void *reg_handle_nc;
static invalidate_peer_memory mem_invalidate_callback;

static void nv_mem_context_free(struct kref *ref)
{
	struct nv_mem_context *ctx = container_of(ref, struct nv_mem_context, ref);

	memset(ctx, 0, sizeof(*ctx));
	kfree(ctx);
}

/* Callback of acquire's probe pin: nothing is built on that pin. */
static void nv_mem_dummy_callback(void *data)
{
	struct nvidia_p2p_page_table *pt = data;

	nvidia_p2p_free_page_table(pt);
}

static void nv_get_p2p_free_callback(void *data)
{
	struct nv_mem_context *ctx = data;
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *m;

	__module_get(THIS_MODULE);
	if (!ctx) {
		peer_err("nv_get_p2p_free_callback -- invalid nv_mem_context\n");
		goto out;
	}
	kref_get(&ctx->ref);
	mutex_lock(&ctx->lock);
	pt = ctx->page_table;
	m = ctx->dma_mapping;
	if (!pt || !m) {
		/* Freed before dma_map: dma_map must not touch the page table any more. */
		ctx->freed = true;
		mutex_unlock(&ctx->lock);
		if (!pt)
			peer_err("nv_get_p2p_free_callback -- invalid page_table\n");
		else
			peer_err("nv_get_p2p_free_callback -- invalid dma_mapping\n");
		goto put;
	}
	WRITE_ONCE(ctx->callback_task, current);
	mutex_unlock(&ctx->lock);
	peer_dbg("free callback for va 0x%llx\n", ctx->page_virt_start);
	/* New-style core: no client calls from in here; dma_unmap/put_pages below are ours. */
	mem_invalidate_callback(reg_handle, ctx->core_context);
	WRITE_ONCE(ctx->callback_task, NULL);
	nvidia_p2p_free_dma_mapping(m);
	nvidia_p2p_free_page_table(pt);
	WRITE_ONCE(ctx->freed, true);
put:
	kref_put(&ctx->ref, nv_mem_context_free);
out:
	module_put(THIS_MODULE);
}

static int nv_mem_acquire(unsigned long addr, size_t size, void *peer_mem_private_data,
			  char *peer_mem_name, void **client_context)
{
	struct nvidia_p2p_page_table *pt = NULL;
	struct nv_mem_context *ctx;
	int ret;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return 0;
	kref_init(&ctx->ref);
	mutex_init(&ctx->lock);
	ctx->page_virt_start = addr & GPU_PAGE_MASK;
	ctx->page_virt_end = (addr + size + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
	ctx->mapped_size = ctx->page_virt_end - ctx->page_virt_start;

	/* Probe: does the NVIDIA driver know this range? Host memory falls through. */
	ret = nvidia_p2p_get_pages(0, 0, ctx->page_virt_start, ctx->mapped_size, &pt,
				   nv_mem_dummy_callback, NULL);
	if (ret < 0)
		goto not_mine;
	ret = nvidia_p2p_put_pages(0, 0, ctx->page_virt_start, pt);
	if (ret < 0) {
		/* The probe pin went with a concurrent free; the range is not usable. */
		goto not_mine;
	}
	*client_context = ctx;
	__module_get(THIS_MODULE);
	peer_dbg("acquired va 0x%lx size 0x%zx\n", addr, size);
	return 1;

not_mine:
	kfree(ctx);
	return 0;
}

static int nv_mem_get_pages(unsigned long addr, size_t size, int write, int force,
			    struct sg_table *sg_head, void *client_context, u64 core_context)
{
	struct nv_mem_context *ctx = client_context;
	int ret;

	if (!ctx)
		return -EINVAL;
	ctx->core_context = core_context;
	ctx->page_size = GPU_PAGE_SIZE;
	/* The acquire range, not addr/size; the table is read only in dma_map (races the free). */
	ret = nvidia_p2p_get_pages(0, 0, ctx->page_virt_start, ctx->mapped_size,
				   &ctx->page_table, nv_get_p2p_free_callback, ctx);
	if (ret < 0) {
		peer_err("error %d while calling nvidia_p2p_get_pages()\n", ret);
		return ret;
	}
	return 0;
}

#if defined(NVPM_NC_LEGACY) || defined(NVPM_NC_PERSISTENT_API)
static int nv_mem_get_pages_nc(unsigned long addr, size_t size, int write, int force,
			       struct sg_table *sg_head, void *client_context, u64 core_context)
{
	struct nv_mem_context *ctx = client_context;
	int ret;

	if (!ctx)
		return -EINVAL;
	ctx->core_context = core_context;
	ctx->page_size = GPU_PAGE_SIZE;
	ctx->persistent = true;
#ifdef NVPM_NC_LEGACY
	ret = nvidia_p2p_get_pages(0, 0, ctx->page_virt_start, ctx->mapped_size,
				   &ctx->page_table, NULL, NULL);
#else
	ret = nvidia_p2p_get_pages_persistent(ctx->page_virt_start, ctx->mapped_size,
					      &ctx->page_table, 0);
#endif
	if (ret < 0) {
		peer_err("error %d while calling nvidia_p2p_get_pages() with NULL callback\n", ret);
		return ret;
	}
	return 0;
}
#endif

static int nv_dma_map(struct sg_table *sg_head, void *client_context, struct device *dma_device,
		      int dmasync, int *nmap)
{
	struct nv_mem_context *ctx = client_context;
	struct nvidia_p2p_dma_mapping *m = NULL;
	struct scatterlist *sg;
	struct pci_dev *pdev;
	unsigned int i;
	int ret;

	if (!ctx || !dma_device)
		return -EINVAL;
	if (!dev_is_pci(dma_device)) {
		peer_err("DMA device %s is not a PCI device\n", dev_name(dma_device));
		return -EINVAL;
	}
	pdev = to_pci_dev(dma_device);
	/* Held against the free callback: while we hold it the page table cannot go away. */
	mutex_lock(&ctx->lock);
	if (ctx->freed || !ctx->page_table) {
		mutex_unlock(&ctx->lock);
		peer_err("GPU memory of va 0x%llx was freed before dma_map\n", ctx->page_virt_start);
		return -EINVAL;
	}
	if (ctx->page_table->page_size != NVIDIA_P2P_PAGE_SIZE_64KB) {
		peer_err("assumption of 64KB pages failed size_id=%u\n",
			 ctx->page_table->page_size);
		ret = -EINVAL;
		goto unlock;
	}
	ret = nvidia_p2p_dma_map_pages(pdev, ctx->page_table, &m);
	if (ret) {
		peer_err("error %d in nvidia_p2p_dma_map_pages\n", ret);
		goto unlock;
	}
	if (!NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(m)) {
		peer_err("incompatible dma mapping version 0x%08x\n", m->version);
		nvidia_p2p_dma_unmap_pages(pdev, ctx->page_table, m);
		ret = -EINVAL;
		goto unlock;
	}
	ctx->npages = m->entries;
	ret = sg_alloc_table(sg_head, m->entries, GFP_KERNEL);
	if (ret) {
		nvidia_p2p_dma_unmap_pages(pdev, ctx->page_table, m);
		goto unlock;
	}
	for_each_sg(sg_head->sgl, sg, m->entries, i) {
		sg_set_page(sg, NULL, GPU_PAGE_SIZE, 0);
		sg->dma_address = m->dma_addresses[i];
		sg_dma_len(sg) = GPU_PAGE_SIZE;
	}
	ctx->pdev = pdev;
	ctx->sg_head = *sg_head;
	ctx->sg_allocated = 1;
	ctx->dma_mapping = m;
	*nmap = ctx->npages;
	peer_dbg("mapped %lu GPU pages of va 0x%llx for %s\n", ctx->npages,
		 ctx->page_virt_start, pci_name(pdev));
unlock:
	mutex_unlock(&ctx->lock);
	return ret;
}

static int nv_dma_unmap(struct sg_table *sg_head, void *client_context, struct device *dma_device)
{
	struct nv_mem_context *ctx = client_context;
	struct nvidia_p2p_dma_mapping *m;

	if (!ctx)
		return -EINVAL;
	if (WARN_ON(memcmp(sg_head, &ctx->sg_head, sizeof(*sg_head))))
		return -EINVAL;
	if (READ_ONCE(ctx->callback_task) == current || READ_ONCE(ctx->freed))
		return 0;
	m = READ_ONCE(ctx->dma_mapping);
	if (m) {
		/* Fails with -EINVAL when the free callback won the race; it tears down then. */
		nvidia_p2p_dma_unmap_pages(ctx->pdev, ctx->page_table, m);
	}
	return 0;
}

static void nv_mem_put_pages(struct sg_table *sg_head, void *client_context)
{
	struct nv_mem_context *ctx = client_context;
	int ret;

	if (!ctx) {
		peer_err("put_pages -- invalid nv_mem_context\n");
		return;
	}
	if (WARN_ON(memcmp(sg_head, &ctx->sg_head, sizeof(*sg_head))))
		return;
	if (READ_ONCE(ctx->callback_task) == current || READ_ONCE(ctx->freed))
		return;
	if (!ctx->page_table)
		return;
#if defined(NVPM_NC_PERSISTENT_API)
	if (ctx->persistent) {
		ret = nvidia_p2p_put_pages_persistent(ctx->page_virt_start, ctx->page_table, 0);
		if (ret)
			peer_err("nvidia_p2p_put_pages_persistent failed: %d\n", ret);
		return;
	}
#endif
	/* A concurrent free callback makes this fail: the pin is released there instead. */
	ret = nvidia_p2p_put_pages(0, 0, ctx->page_virt_start, ctx->page_table);
	peer_dbg("nvidia_p2p_put_pages: %d\n", ret);
}

static unsigned long nv_mem_get_page_size(void *client_context)
{
	struct nv_mem_context *ctx = client_context;

	return ctx->page_size;
}

static void nv_mem_release(void *client_context)
{
	struct nv_mem_context *ctx = client_context;

	if (ctx->sg_allocated) {
		sg_free_table(&ctx->sg_head);
		ctx->sg_allocated = 0;
	}
	kref_put(&ctx->ref, nv_mem_context_free);
	module_put(THIS_MODULE);
}

static struct peer_memory_client_ex nv_mem_client_ex = {
	.client = {
		.acquire = nv_mem_acquire,
		.get_pages = nv_mem_get_pages,
		.dma_map = nv_dma_map,
		.dma_unmap = nv_dma_unmap,
		.put_pages = nv_mem_put_pages,
		.get_page_size = nv_mem_get_page_size,
		.release = nv_mem_release,
	},
};

#if defined(NVPM_NC_LEGACY) || defined(NVPM_NC_PERSISTENT_API)
static struct peer_memory_client nv_mem_client_nc = {
	.acquire = nv_mem_acquire,
	.get_pages = nv_mem_get_pages_nc,
	.dma_map = nv_dma_map,
	.dma_unmap = nv_dma_unmap,
	.put_pages = nv_mem_put_pages,
	.get_page_size = nv_mem_get_page_size,
	.release = nv_mem_release,
};
#endif

static bool nv_mem_persistent_supported(void)
{
#if defined(NVPM_NC_LEGACY)
	return nvidia_p2p_cap_persistent_pages != 0;
#elif defined(NVPM_NC_PERSISTENT_API)
	return true;
#else
	return false;
#endif
}

/* nvidia-peermem registers a client named nv_mem as well; only one of the two may be loaded. */
static bool nvidia_peermem_loaded(void)
{
	struct path p;

	if (kern_path("/sys/module/nvidia_peermem", LOOKUP_FOLLOW, &p))
		return false;
	path_put(&p);
	return true;
}

static void nv_mem_unregister(void)
{
	if (reg_handle) {
		ib_unregister_peer_memory_client(reg_handle);
		reg_handle = NULL;
	}
	if (reg_handle_nc) {
		ib_unregister_peer_memory_client(reg_handle_nc);
		reg_handle_nc = NULL;
	}
}

static int __init nv_mem_client_init(void)
{
	struct peer_memory_client *c = &nv_mem_client_ex.client;

	BUILD_BUG_ON(sizeof(DRV_NAME) > IB_PEER_MEMORY_NAME_MAX);
	/* 14 characters and the NUL: byte 15 is the extended-client flag. */
	BUILD_BUG_ON(sizeof(DRV_VERSION) > IB_PEER_MEMORY_VER_MAX - 1);

	if (nvidia_peermem_loaded()) {
		pr_err(DRV_NAME " nv_mem_client_init -- nvidia_peermem is loaded and provides the same client \"" DRV_NAME "\"; unload it first (only one of nv_peer_mem and nvidia-peermem may be loaded)\n");
		return -EBUSY;
	}

	strscpy(c->name, DRV_NAME, IB_PEER_MEMORY_NAME_MAX);
	strscpy(c->version, DRV_VERSION, IB_PEER_MEMORY_VER_MAX);
	c->version[IB_PEER_MEMORY_VER_MAX - 1] = 1;
	nv_mem_client_ex.ex_size = sizeof(struct peer_memory_client_ex);
	nv_mem_client_ex.flags = PEER_MEM_INVALIDATE_UNMAPS;
	reg_handle = ib_register_peer_memory_client(c, &mem_invalidate_callback);
	if (!reg_handle) {
		peer_err("nv_mem_client_init -- error while registering client (is another client named " DRV_NAME ", e.g. nvidia-peermem, registered?)\n");
		nv_mem_unregister();
		return -EINVAL;
	}

#if defined(NVPM_NC_LEGACY) || defined(NVPM_NC_PERSISTENT_API)
	if (nv_mem_persistent_supported()) {
		strscpy(nv_mem_client_nc.name, NC_NAME, IB_PEER_MEMORY_NAME_MAX);
		strscpy(nv_mem_client_nc.version, DRV_VERSION, IB_PEER_MEMORY_VER_MAX);
		reg_handle_nc = ib_register_peer_memory_client(&nv_mem_client_nc, NULL);
		if (!reg_handle_nc) {
			peer_err("nv_mem_client_init -- error while registering nc client\n");
			nv_mem_unregister();
			return -EINVAL;
		}
	}
#endif
	return 0;
}

static void __exit nv_mem_client_cleanup(void)
{
	nv_mem_unregister();
}

module_init(nv_mem_client_init);
module_exit(nv_mem_client_cleanup);
