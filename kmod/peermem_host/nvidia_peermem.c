// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Test-only stand-in for the peer-memory host's suite (never packaged): a module named
 * nvidia_peermem, as NVIDIA's, for what the suite cannot get from the real one.
 *   mode=0: registers a client named nv_mem that claims nothing (the name clash nv_peer_mem
 *           must refuse to load next to);
 *   mode=1: registers a client without dma_unmap (the host must refuse it; insmod fails);
 *   mode=2: registers "bad_mem", which claims every GPU VA and maps it with a misaligned DMA
 *           address (the host must reject the MR and count the violation).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/peer_mem.h>

static int mode;
module_param(mode, int, 0444);

static void *handle;

static int sb_acquire(unsigned long addr, size_t size, void *p, char *n, void **ctx)
{
	if (mode != 2 || addr < 0x200000000000ULL)
		return 0;
	*ctx = (void *)1;
	return 1;
}

static int sb_get_pages(unsigned long addr, size_t size, int write, int force,
			struct sg_table *sg, void *ctx, u64 core_context)
{
	return 0;
}

static int sb_dma_map(struct sg_table *sg, void *ctx, struct device *dev, int dmasync, int *nmap)
{
	int ret = sg_alloc_table(sg, 1, GFP_KERNEL);

	if (ret)
		return ret;
	sg_set_page(sg->sgl, NULL, 0x10000, 0);
	sg->sgl->dma_address = 0x10008;   /* not PAGE_SIZE aligned: breaks the contract */
	sg_dma_len(sg->sgl) = 0x10000;
	*nmap = 1;
	return 0;
}

static int sb_dma_unmap(struct sg_table *sg, void *ctx, struct device *dev)
{
	return 0;
}

static void sb_put_pages(struct sg_table *sg, void *ctx)
{
	sg_free_table(sg);
}

static unsigned long sb_page_size(void *ctx)
{
	return 0x10000;
}

static struct peer_memory_client sb_client = {
	.version = "0.0-standin",
	.acquire = sb_acquire,
	.get_pages = sb_get_pages,
	.dma_map = sb_dma_map,
	.dma_unmap = sb_dma_unmap,
	.put_pages = sb_put_pages,
	.get_page_size = sb_page_size,
};

static int __init sb_init(void)
{
	strscpy(sb_client.name, mode == 2 ? "bad_mem" : "nv_mem", sizeof(sb_client.name));
	if (mode == 1)
		sb_client.dma_unmap = NULL;
	handle = ib_register_peer_memory_client(&sb_client, NULL);
	return handle ? 0 : -EINVAL;
}

static void __exit sb_exit(void)
{
	ib_unregister_peer_memory_client(handle);
}

module_init(sb_init);
module_exit(sb_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("Test-only stand-in client for the peer-memory host's suite");
