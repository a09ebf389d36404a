// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * peermem_host - a test-only peer-memory host (never packaged).
 *
 * Provides ib_register_peer_memory_client() / ib_unregister_peer_memory_client() with the ABI of
 * OFED's rdma/peer_mem.h (include/rdma/peer_mem.h here) and drives the registered clients the
 * way the OFED 5.5+ core (peer_mem.c + umem.c) does for an mlx5 MR: pin attempt first, acquire
 * in registration order under one mutex, get_pages, dma_map for the HCA's DMA device, then
 * get_page_size and in-place trimming of the first and last SG; invalidation through a cyclic
 * id, the per-umem mapping lock held until the HCA "activates", old-style and new-style
 * (PEER_MEM_INVALIDATE_UNMAPS) invalidation, deregistration and the /sys/kernel/mm/memory_peers
 * counters. The simulated HCA is a real PCI device of the VM: its struct device is what the
 * clients map for, and a read of an MR goes through the DMA addresses the client produced.
 *
 * It is no kinder than the real core: where the core trusts the client (SG alignment and
 * coverage, dma_unmap's return, a get_page_size to call) this host checks, logs
 * "peermem_host: VIOLATION" and counts it in debugfs; the suites require the count to stay 0.
 * Module parameters: sysfs (1: memory_peers tree and unique names, as OFED <= 23.10 and Ubuntu;
 * 0: as OFED 24.04+), core_order (55: OFED 5.5+; 51: OFED 5.1-2 .. 5.4 and Ubuntu focal, where
 * get_page_size comes before dma_map and nothing is trimmed), dma_dev ("nvme" or "ivshmem").
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/semaphore.h>
#include <linux/kref.h>
#include <linux/xarray.h>
#include <linux/kobject.h>
#include <linux/sysfs.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <linux/scatterlist.h>

#include <rdma/peer_mem.h>
#include "peermem_host_uapi.h"

static bool sysfs = true;
module_param(sysfs, bool, 0444);
MODULE_PARM_DESC(sysfs, "memory_peers sysfs tree and unique client names (OFED <= 23.10)");
static int core_order = 55;
module_param(core_order, int, 0444);
MODULE_PARM_DESC(core_order, "55: OFED 5.5+ call order (default); 51: OFED 5.1-5.4 / Ubuntu");
static char *dma_dev = "nvme";
module_param(dma_dev, charp, 0444);
MODULE_PARM_DESC(dma_dev, "PCI device acting as the HCA's DMA device: nvme or ivshmem");

#define PMH_NO_INVALIDATION_ID 0xFFFFFFFFU
#define PMH_MAX_BYTES (1ULL << 32)

struct pmh_client {
	struct list_head node;
	const struct peer_memory_client *ops;
	char name[IB_PEER_MEMORY_NAME_MAX];
	bool inval_required;
	bool accepting;          /* false once unregistration started */
	long users;              /* 1 for the registration + 1 per live umem; under pmh_list_lock */
	wait_queue_head_t wq;
	struct xarray ids;       /* core_context ids of invalidating umems */
	u32 next_id;
	struct kobject *kobj;
	atomic64_t num_alloc_mrs, num_dealloc_mrs, num_reg_pages, num_dereg_pages;
	atomic64_t num_reg_bytes, num_dereg_bytes;
	unsigned long num_free_callbacks;   /* under ids' lock, as the core counts it */
};

enum pmh_state { PMH_MAPPED, PMH_UNMAPPED, PMH_INVALIDATED };

struct pmh_umem {
	struct kref ref;
	struct pmh_client *client;
	void *ctx;
	unsigned long addr;
	size_t size;
	bool writable;
	u32 id;
	/* The core's mapping_lock. A semaphore: it stays held across syscalls until activation. */
	struct semaphore map_sem;
	bool activated;          /* invalidation notifier active (the HCA programmed the MR) */
	enum pmh_state state;
	struct sg_table sgt;     /* the table the client fills (header owned by the core) */
	int nmap;
	unsigned long page_size;
	unsigned long sg_base;   /* user VA the first SG entry starts at */
	/* saved originals of the trimmed entries */
	struct scatterlist *first_sg, *last_sg;
	dma_addr_t first_dma;
	unsigned int first_len, first_dma_len, last_len, last_dma_len;
	bool trimmed;
	/* The simulated HCA: reads hold io_lock shared; revoking the MR takes it exclusive. */
	struct rw_semaphore io_lock;
	bool revoked;
};

struct pmh_file {
	struct xarray mrs;
};

static LIST_HEAD(pmh_clients);
static DEFINE_SPINLOCK(pmh_list_lock);     /* the list, users, kobj lookups */
static DEFINE_MUTEX(pmh_peer_mutex);       /* the core's peer_memory_mutex */
static struct kobject *pmh_peers_kobj;     /* /sys/kernel/mm/memory_peers */
static DEFINE_MUTEX(pmh_sysfs_mutex);
static struct pci_dev *pmh_dma_pdev;       /* the HCA's DMA device */
static struct pci_dev *pmh_gpu_pdev;       /* gpusim's BAR: where reads may land */
static struct dentry *pmh_debugfs;
static atomic64_t pmh_live_umems, pmh_violations, pmh_invalidations, pmh_stale, pmh_revoked_reads;

#define pmh_violation(c, fmt, ...) do {						\
	atomic64_inc(&pmh_violations);						\
	pr_err("VIOLATION by client %s: " fmt "\n", (c)->name, ##__VA_ARGS__);	\
} while (0)

static bool pmh_client_is_ex(const struct peer_memory_client *ops)
{
	const struct peer_memory_client_ex *ex;

	if (!ops->version[IB_PEER_MEMORY_VER_MAX - 1])
		return false;
	ex = container_of(ops, const struct peer_memory_client_ex, client);
	return ex->ex_size >= offsetofend(struct peer_memory_client_ex, flags) &&
	       (ex->flags & PEER_MEM_INVALIDATE_UNMAPS);
}

/* ---- sysfs ------------------------------------------------------------------------------- */

static struct pmh_client *pmh_client_by_kobj(struct kobject *kobj)
{
	struct pmh_client *c;

	list_for_each_entry(c, &pmh_clients, node)
		if (c->kobj == kobj)
			return c;
	return NULL;
}

#define PMH_COUNTER_ATTR(field)							\
static ssize_t field##_show(struct kobject *kobj, struct kobj_attribute *a, char *buf)	\
{										\
	struct pmh_client *c;							\
	ssize_t n = -ENODEV;							\
	spin_lock(&pmh_list_lock);						\
	c = pmh_client_by_kobj(kobj);						\
	if (c)									\
		n = sysfs_emit(buf, "%llu\n", (unsigned long long)atomic64_read(&c->field)); \
	spin_unlock(&pmh_list_lock);						\
	return n;								\
}										\
static struct kobj_attribute field##_attr = __ATTR_RO(field)

PMH_COUNTER_ATTR(num_alloc_mrs);
PMH_COUNTER_ATTR(num_dealloc_mrs);
PMH_COUNTER_ATTR(num_reg_pages);
PMH_COUNTER_ATTR(num_dereg_pages);
PMH_COUNTER_ATTR(num_reg_bytes);
PMH_COUNTER_ATTR(num_dereg_bytes);

static ssize_t version_show(struct kobject *kobj, struct kobj_attribute *a, char *buf)
{
	struct pmh_client *c;
	ssize_t n = -ENODEV;

	spin_lock(&pmh_list_lock);
	c = pmh_client_by_kobj(kobj);
	if (c)
		n = sysfs_emit(buf, "%.*s\n", IB_PEER_MEMORY_VER_MAX, c->ops->version);
	spin_unlock(&pmh_list_lock);
	return n;
}
static struct kobj_attribute version_attr = __ATTR_RO(version);

static ssize_t num_free_callbacks_show(struct kobject *kobj, struct kobj_attribute *a, char *buf)
{
	struct pmh_client *c;
	ssize_t n = -ENODEV;

	spin_lock(&pmh_list_lock);
	c = pmh_client_by_kobj(kobj);
	if (c)
		n = sysfs_emit(buf, "%lu\n", READ_ONCE(c->num_free_callbacks));
	spin_unlock(&pmh_list_lock);
	return n;
}
static struct kobj_attribute num_free_callbacks_attr = __ATTR_RO(num_free_callbacks);

static struct attribute *pmh_attrs[] = {
	&version_attr.attr, &num_alloc_mrs_attr.attr, &num_dealloc_mrs_attr.attr,
	&num_reg_pages_attr.attr, &num_dereg_pages_attr.attr, &num_reg_bytes_attr.attr,
	&num_dereg_bytes_attr.attr, &num_free_callbacks_attr.attr, NULL,
};
static const struct attribute_group pmh_group = { .attrs = pmh_attrs };

/*
 * The core hangs memory_peers under /sys/kernel/mm. Kernels that do not export mm_kobj (6.12)
 * get it under /sys/kernel instead, where the consumers' probes do not look (stated at load).
 */
static struct kobject *pmh_parent_kobj(void)
{
#ifdef PMH_HAVE_MM_KOBJ
	return mm_kobj;
#else
	return kernel_kobj;
#endif
}

/* Creates memory_peers on first use and the client's directory; 0 or -errno. */
static int pmh_sysfs_add(struct pmh_client *c)
{
	struct kobject *k;
	int ret;

	mutex_lock(&pmh_sysfs_mutex);
	if (!pmh_peers_kobj) {
		pmh_peers_kobj = kobject_create_and_add("memory_peers", pmh_parent_kobj());
		if (!pmh_peers_kobj) {
			mutex_unlock(&pmh_sysfs_mutex);
			return -ENOMEM;
		}
	}
	k = kobject_create_and_add(c->name, pmh_peers_kobj);
	if (!k) {
		mutex_unlock(&pmh_sysfs_mutex);
		return -ENOMEM;
	}
	ret = sysfs_create_group(k, &pmh_group);
	if (ret) {
		kobject_put(k);
		mutex_unlock(&pmh_sysfs_mutex);
		return ret;
	}
	spin_lock(&pmh_list_lock);
	c->kobj = k;
	spin_unlock(&pmh_list_lock);
	mutex_unlock(&pmh_sysfs_mutex);
	return 0;
}

static void pmh_sysfs_del(struct pmh_client *c, bool list_empty)
{
	struct kobject *k;

	mutex_lock(&pmh_sysfs_mutex);
	spin_lock(&pmh_list_lock);
	k = c->kobj;
	c->kobj = NULL;
	spin_unlock(&pmh_list_lock);
	if (k) {
		sysfs_remove_group(k, &pmh_group);
		kobject_put(k);
	}
	if (list_empty && pmh_peers_kobj) {
		kobject_put(pmh_peers_kobj);
		pmh_peers_kobj = NULL;
	}
	mutex_unlock(&pmh_sysfs_mutex);
}

/* ---- client registration ----------------------------------------------------------------- */

static int pmh_invalidate(void *reg_handle, u64 core_context);

void *ib_register_peer_memory_client(const struct peer_memory_client *peer_client,
				     invalidate_peer_memory *invalidate_callback)
{
	static const char * const mandatory[] = { "acquire", "get_pages", "put_pages",
						  "dma_map", "dma_unmap" };
	struct pmh_client *c, *o;
	const void *fns[5];
	int i;

	if (!peer_client)
		return NULL;
	fns[0] = peer_client->acquire;
	fns[1] = peer_client->get_pages;
	fns[2] = peer_client->put_pages;
	fns[3] = peer_client->dma_map;
	fns[4] = peer_client->dma_unmap;
	for (i = 0; i < 5; i++) {
		if (!fns[i]) {
			pr_err("Peer memory %.*s is missing mandatory function %s\n",
			       IB_PEER_MEMORY_NAME_MAX, peer_client->name, mandatory[i]);
			return NULL;
		}
	}
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return NULL;
	c->ops = peer_client;
	strscpy(c->name, peer_client->name, sizeof(c->name));
	c->accepting = true;
	c->users = 1;
	init_waitqueue_head(&c->wq);
	xa_init_flags(&c->ids, XA_FLAGS_ALLOC);
	if (invalidate_callback) {
		*invalidate_callback = pmh_invalidate;
		c->inval_required = true;
	}

	mutex_lock(&pmh_peer_mutex);
	if (sysfs) {
		/*
		 * The real core finds a duplicate when kobject_add fails (and sysfs dumps a stack);
		 * the outcome, a NULL handle, is the same.
		 */
		spin_lock(&pmh_list_lock);
		list_for_each_entry(o, &pmh_clients, node) {
			if (!strcmp(o->name, c->name)) {
				spin_unlock(&pmh_list_lock);
				mutex_unlock(&pmh_peer_mutex);
				pr_err("peer memory client %s is already registered\n", c->name);
				kfree(c);
				return NULL;
			}
		}
		spin_unlock(&pmh_list_lock);
		if (pmh_sysfs_add(c)) {
			mutex_unlock(&pmh_peer_mutex);
			pr_err("cannot create memory_peers/%s\n", c->name);
			kfree(c);
			return NULL;
		}
	}
	spin_lock(&pmh_list_lock);
	list_add_tail(&c->node, &pmh_clients);
	spin_unlock(&pmh_list_lock);
	mutex_unlock(&pmh_peer_mutex);
	pr_info("registered peer memory client %s version %.*s (%s%s)\n", c->name,
		IB_PEER_MEMORY_VER_MAX - 1, peer_client->version,
		c->inval_required ? "invalidating" : "non-invalidating",
		c->inval_required ? (pmh_client_is_ex(peer_client) ? ", new-style" : ", old-style") : "");
	return c;
}
EXPORT_SYMBOL(ib_register_peer_memory_client);

/* Under pmh_list_lock. */
static bool pmh_client_known_locked(struct pmh_client *c)
{
	struct pmh_client *o;

	list_for_each_entry(o, &pmh_clients, node)
		if (o == c)
			return true;
	return false;
}

static void pmh_client_unuse(struct pmh_client *c)
{
	spin_lock(&pmh_list_lock);
	c->users--;
	spin_unlock(&pmh_list_lock);
	wake_up_all(&c->wq);
}

static bool pmh_client_idle(struct pmh_client *c)
{
	bool idle;

	spin_lock(&pmh_list_lock);
	idle = c->users == 0;
	spin_unlock(&pmh_list_lock);
	return idle;
}

void ib_unregister_peer_memory_client(void *reg_handle)
{
	struct pmh_client *c = reg_handle;
	bool empty;

	mutex_lock(&pmh_peer_mutex);
	spin_lock(&pmh_list_lock);
	if (!c || !pmh_client_known_locked(c) || !c->accepting) {
		spin_unlock(&pmh_list_lock);
		mutex_unlock(&pmh_peer_mutex);
		pr_err("unregister of an unknown peer memory handle %p\n", reg_handle);
		atomic64_inc(&pmh_violations);
		return;
	}
	c->accepting = false;   /* no new acquires from here on */
	c->users--;
	spin_unlock(&pmh_list_lock);
	mutex_unlock(&pmh_peer_mutex);

	/* As the core: block until every umem of this client is gone. */
	wait_event(c->wq, pmh_client_idle(c));

	spin_lock(&pmh_list_lock);
	list_del(&c->node);
	empty = list_empty(&pmh_clients);
	spin_unlock(&pmh_list_lock);
	if (sysfs)
		pmh_sysfs_del(c, empty);
	xa_destroy(&c->ids);
	pr_info("unregistered peer memory client %s\n", c->name);
	kfree(c);
}
EXPORT_SYMBOL(ib_unregister_peer_memory_client);

/* ---- umem mapping ------------------------------------------------------------------------ */

static void pmh_umem_free(struct kref *ref)
{
	kfree(container_of(ref, struct pmh_umem, ref));
}

static void pmh_restore_sg(struct pmh_umem *u)
{
	if (!u->trimmed)
		return;
	u->first_sg->dma_address = u->first_dma;
	u->first_sg->length = u->first_len;
	sg_dma_len(u->first_sg) = u->first_dma_len;
	if (u->last_sg != u->first_sg) {
		u->last_sg->length = u->last_len;
		sg_dma_len(u->last_sg) = u->last_dma_len;
	}
	u->trimmed = false;
}

static void pmh_count_unmap(struct pmh_umem *u)
{
	struct pmh_client *c = u->client;

	atomic64_inc(&c->num_dealloc_mrs);
	atomic64_add(u->size, &c->num_dereg_bytes);
	/* 5.5+ reads nents after zeroing the table, so it adds 0; 5.1-5.4 used the saved nmap. */
	if (core_order == 51)
		atomic64_add(u->nmap, &c->num_dereg_pages);
}

/* dma_unmap then put_pages; the table must be restored already. Never touched afterwards. */
static void pmh_client_unmap(struct pmh_umem *u)
{
	struct pmh_client *c = u->client;
	int ret;

	ret = c->ops->dma_unmap(&u->sgt, u->ctx, &pmh_dma_pdev->dev);
	if (ret)
		pmh_violation(c, "dma_unmap returned %d (the contract says 0)", ret);
	c->ops->put_pages(&u->sgt, u->ctx);
	memset(&u->sgt, 0, sizeof(u->sgt));
}

/* The simulated HCA stops reading through the MR's DMA addresses. */
static void pmh_hca_revoke(struct pmh_umem *u)
{
	down_write(&u->io_lock);
	u->revoked = true;
	up_write(&u->io_lock);
}

/* Checks the client's dma_map output against the header contract and trims per 5.5+. */
static int pmh_check_and_trim(struct pmh_umem *u)
{
	struct pmh_client *c = u->client;
	unsigned long p = u->page_size, start, end, off, trim;
	struct scatterlist *sg, *last = NULL;
	u64 total = 0;
	unsigned int i;

	if (!u->sgt.sgl || u->nmap < 1 || u->sgt.nents != (unsigned int)u->nmap) {
		pmh_violation(c, "dma_map produced no usable table (sgl %p nents %u nmap %d)",
			      u->sgt.sgl, u->sgt.nents, u->nmap);
		return -EINVAL;
	}
	if (p < PAGE_SIZE || !is_power_of_2(p)) {
		pmh_violation(c, "get_page_size returned %lu", p);
		return -EINVAL;
	}
	for_each_sg(u->sgt.sgl, sg, u->sgt.nents, i) {
		if ((sg_dma_address(sg) & ~PAGE_MASK) || (sg_dma_len(sg) & ~PAGE_MASK) ||
		    !sg_dma_len(sg)) {
			pmh_violation(c, "SG %u: dma 0x%llx len 0x%x not PAGE_SIZE aligned", i,
				      (u64)sg_dma_address(sg), sg_dma_len(sg));
			return -EINVAL;
		}
		total += sg_dma_len(sg);
		last = sg;
	}
	start = ALIGN_DOWN(u->addr, p);
	end = ALIGN(u->addr + u->size, p);
	if (total < end - start) {
		pmh_violation(c, "mapped 0x%llx bytes, the range needs 0x%lx", total, end - start);
		return -EINVAL;
	}
	u->sg_base = start;
	if (core_order == 51 || p == PAGE_SIZE)
		return 0;

	off = ALIGN_DOWN(u->addr, PAGE_SIZE) - start;
	trim = end - ALIGN(u->addr + u->size, PAGE_SIZE);
	u->first_sg = u->sgt.sgl;
	u->last_sg = last;
	if (off >= sg_dma_len(u->first_sg) ||
	    trim >= sg_dma_len(last) - (last == u->first_sg ? off : 0)) {
		pmh_violation(c, "first/last SG too short for a page size of 0x%lx", p);
		return -EINVAL;
	}
	u->first_dma = u->first_sg->dma_address;
	u->first_len = u->first_sg->length;
	u->first_dma_len = sg_dma_len(u->first_sg);
	u->last_len = last->length;
	u->last_dma_len = sg_dma_len(last);
	u->first_sg->dma_address += off;
	u->first_sg->length -= off;
	sg_dma_len(u->first_sg) -= off;
	last->length -= trim;
	sg_dma_len(last) -= trim;
	u->trimmed = true;
	u->sg_base = ALIGN_DOWN(u->addr, PAGE_SIZE);
	return 0;
}

/* ib_peer_umem_get: returns the umem with map_sem held (invalidating, not yet activated) or not. */
static struct pmh_umem *pmh_peer_umem_get(unsigned long addr, size_t size, bool writable,
					  bool inval_supp, int pin_err)
{
	struct pmh_client *c, *owner = NULL;
	struct pmh_umem *u;
	void *ctx = NULL;
	int ret;

	mutex_lock(&pmh_peer_mutex);
	list_for_each_entry(c, &pmh_clients, node) {
		if (!c->accepting || (c->inval_required && !inval_supp))
			continue;
		ctx = NULL;
		ret = c->ops->acquire(addr, size, NULL, NULL, &ctx);
		if (ret > 0) {
			owner = c;
			spin_lock(&pmh_list_lock);
			c->users++;
			spin_unlock(&pmh_list_lock);
			break;
		}
	}
	mutex_unlock(&pmh_peer_mutex);
	if (!owner)
		return ERR_PTR(pin_err);
	c = owner;

	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u) {
		ret = -ENOMEM;
		goto release;
	}
	kref_init(&u->ref);
	u->client = c;
	u->ctx = ctx;
	u->addr = addr;
	u->size = size;
	u->writable = writable;
	u->id = PMH_NO_INVALIDATION_ID;
	sema_init(&u->map_sem, 0);   /* taken from before get_pages until activation */
	init_rwsem(&u->io_lock);
	if (c->inval_required) {
		ret = xa_alloc_cyclic(&c->ids, &u->id, u, XA_LIMIT(0, PMH_NO_INVALIDATION_ID - 1),
				      &c->next_id, GFP_KERNEL);
		if (ret < 0)
			goto free;
	}
	ret = c->ops->get_pages(addr, size, 1, !writable, NULL, ctx, u->id);
	if (ret) {
		if (ret > 0) {
			pmh_violation(c, "get_pages returned %d", ret);
			ret = -EINVAL;
		}
		goto erase;
	}
	if (core_order == 51) {
		if (!c->ops->get_page_size) {
			pmh_violation(c, "no get_page_size (the core would oops)");
			ret = -EINVAL;
			goto put;
		}
		u->page_size = c->ops->get_page_size(ctx);
	}
	ret = c->ops->dma_map(&u->sgt, ctx, &pmh_dma_pdev->dev, 0, (int *)&u->sgt.nents);
	if (ret) {
		if (ret > 0) {
			pmh_violation(c, "dma_map returned %d", ret);
			ret = -EINVAL;
		}
		goto put;
	}
	u->nmap = u->sgt.nents;
	if (core_order != 51) {
		if (!c->ops->get_page_size) {
			pmh_violation(c, "no get_page_size (the core would oops)");
			ret = -EINVAL;
			goto unmap;
		}
		u->page_size = c->ops->get_page_size(ctx);
	}
	ret = pmh_check_and_trim(u);
	if (ret)
		goto unmap;
	u->state = PMH_MAPPED;
	atomic64_inc(&c->num_alloc_mrs);
	atomic64_add(u->nmap, &c->num_reg_pages);
	atomic64_add(size, &c->num_reg_bytes);
	atomic64_inc(&pmh_live_umems);
	if (!c->inval_required)
		up(&u->map_sem);
	return u;

unmap:
	pmh_client_unmap(u);
	goto erase;
put:
	c->ops->put_pages(&u->sgt, ctx);
	memset(&u->sgt, 0, sizeof(u->sgt));
erase:
	if (u->id != PMH_NO_INVALIDATION_ID)
		xa_erase(&c->ids, u->id);
free:
	kfree(u);
release:
	if (c->ops->release)
		c->ops->release(ctx);
	pmh_client_unuse(c);
	return ERR_PTR(ret);
}

/* ib_umem_activate_invalidation_notifier: the HCA is done reading the SG list. */
static void pmh_activate(struct pmh_umem *u)
{
	u->activated = true;
	up(&u->map_sem);
}

/* mlx5 dereg: revoke, ib_umem_stop_invalidation_notifier, ib_umem_release. */
static void pmh_dereg(struct pmh_umem *u)
{
	struct pmh_client *c = u->client;
	bool new_style = c->inval_required && pmh_client_is_ex(c->ops);
	bool was_mapped = false;

	pmh_hca_revoke(u);
	/* An invalidating umem never activated still holds map_sem from registration. */
	if (!c->inval_required || u->activated)
		down(&u->map_sem);
	u->activated = false;
	if (u->state == PMH_MAPPED) {
		u->state = PMH_UNMAPPED;
		pmh_count_unmap(u);
		was_mapped = true;
	}
	if (!new_style && was_mapped) {
		pmh_restore_sg(u);
		pmh_client_unmap(u);
	}
	up(&u->map_sem);
	if (new_style && was_mapped) {
		/* Outside the lock: this may race with the client's own teardown (allowed). */
		pmh_restore_sg(u);
		pmh_client_unmap(u);
	}
	/* release */
	if (u->id != PMH_NO_INVALIDATION_ID)
		xa_erase(&c->ids, u->id);
	if (c->ops->release)
		c->ops->release(u->ctx);
	atomic64_dec(&pmh_live_umems);
	pmh_client_unuse(c);
	kref_put(&u->ref, pmh_umem_free);
}

/* ib_invalidate_peer_memory */
static int pmh_invalidate(void *reg_handle, u64 core_context)
{
	struct pmh_client *c = reg_handle;
	struct pmh_umem *u = NULL;

	might_sleep();
	spin_lock(&pmh_list_lock);
	if (!c || !pmh_client_known_locked(c)) {
		spin_unlock(&pmh_list_lock);
		atomic64_inc(&pmh_violations);
		pr_err("VIOLATION: invalidate with unknown handle %p\n", reg_handle);
		return 0;
	}
	xa_lock(&c->ids);
	c->num_free_callbacks++;
	if (core_context < PMH_NO_INVALIDATION_ID)
		u = xa_load(&c->ids, core_context);
	if (u)
		kref_get(&u->ref);
	xa_unlock(&c->ids);
	spin_unlock(&pmh_list_lock);
	if (!u) {
		atomic64_inc(&pmh_stale);
		return 0;
	}
	atomic64_inc(&pmh_invalidations);

	down(&u->map_sem);   /* blocks while the registration is not activated */
	if (u->state == PMH_MAPPED) {
		if (u->activated)
			pmh_hca_revoke(u);
		pmh_restore_sg(u);
		pmh_count_unmap(u);
		if (pmh_client_is_ex(c->ops)) {
			memset(&u->sgt, 0, sizeof(u->sgt));
			u->state = PMH_INVALIDATED;
		} else {
			pmh_client_unmap(u);
			u->state = PMH_UNMAPPED;
		}
	}
	up(&u->map_sem);
	kref_put(&u->ref, pmh_umem_free);
	return 0;
}

/* ---- test interface ---------------------------------------------------------------------- */

static long pmh_ioc_reg(struct pmh_file *f, struct pmh_reg *r)
{
	unsigned long npages, first;
	struct page **pages;
	struct pmh_umem *u;
	bool writable = r->access & PMH_ACCESS_LOCAL_WRITE;
	long pinned;
	int ret;
	u32 handle;

	if (r->flags & ~(u32)(PMH_REG_INVAL_SUPP | PMH_REG_DEFER_ACTIVATE))
		return -EINVAL;
	if (r->addr + r->size < r->addr || r->size > PMH_MAX_BYTES)
		return -EINVAL;
	if (r->access & PMH_ACCESS_ON_DEMAND)
		return -EOPNOTSUPP;
	first = r->addr >> PAGE_SHIFT;
	npages = r->size ? ((r->addr + r->size - 1) >> PAGE_SHIFT) - first + 1 : 0;
	if (!npages)
		return -EINVAL;

	/* Ordinary memory first, as __ib_umem_get; only a failed pin is offered to peers. */
	pages = kvmalloc_array(npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		return -ENOMEM;
	pinned = pin_user_pages_fast(first << PAGE_SHIFT, npages,
				     FOLL_LONGTERM | (writable ? FOLL_WRITE : 0), pages);
	if (pinned > 0)
		unpin_user_pages(pages, pinned);
	kvfree(pages);
	if (pinned == npages) {
		r->is_peer = 0;
		return 0;
	}
	ret = pinned < 0 ? pinned : -EFAULT;

	u = pmh_peer_umem_get(r->addr, r->size, writable, r->flags & PMH_REG_INVAL_SUPP, ret);
	if (IS_ERR(u))
		return PTR_ERR(u);
	/* The HCA reads the SG list (programs the MR), then activates. */
	{
		struct scatterlist *sg;
		unsigned int i;

		r->nents = u->sgt.nents;
		r->nmap = u->nmap;
		r->page_size = u->page_size;
		r->mapped = 0;
		for_each_sg(u->sgt.sgl, sg, u->sgt.nents, i)
			r->mapped += sg_dma_len(sg);
		r->dma_first = sg_dma_address(u->sgt.sgl);
		strscpy(r->client, u->client->name, sizeof(r->client));
	}
	if (u->client->inval_required && !(r->flags & PMH_REG_DEFER_ACTIVATE))
		pmh_activate(u);
	ret = xa_alloc(&f->mrs, &handle, u, xa_limit_32b, GFP_KERNEL);
	if (ret) {
		if (u->client->inval_required && (r->flags & PMH_REG_DEFER_ACTIVATE))
			pmh_activate(u);
		pmh_dereg(u);
		return ret;
	}
	r->handle = handle;
	r->is_peer = 1;
	return 0;
}

static long pmh_ioc_read(struct pmh_file *f, struct pmh_read *rd)
{
	resource_size_t bar_start = pci_resource_start(pmh_gpu_pdev, 2);
	resource_size_t bar_end = pci_resource_end(pmh_gpu_pdev, 2);
	struct scatterlist *sg;
	struct pmh_umem *u;
	void __iomem *p;
	u64 pos, addr = 0;
	unsigned int i;
	long ret = 0;

	xa_lock(&f->mrs);
	u = xa_load(&f->mrs, rd->handle);
	if (u)
		kref_get(&u->ref);
	xa_unlock(&f->mrs);
	if (!u)
		return -ENOENT;
	if (((u->addr + rd->offset) & 7) || rd->offset > u->size || rd->offset + 8 > u->size) {
		ret = -EINVAL;
		goto out;
	}
	down_read(&u->io_lock);
	if (u->revoked || (!u->activated && u->client->inval_required)) {
		/* A revoked mkey: the access completes with an error. */
		atomic64_inc(&pmh_revoked_reads);
		ret = -EIO;
		goto unlock;
	}
	pos = u->addr + rd->offset - u->sg_base;
	for_each_sg(u->sgt.sgl, sg, u->sgt.nents, i) {
		if (pos < sg_dma_len(sg)) {
			addr = sg_dma_address(sg) + pos;
			break;
		}
		pos -= sg_dma_len(sg);
	}
	if (!addr || (addr & 7) || pos + 8 > sg_dma_len(sg)) {
		pr_err("read at offset 0x%llx of MR %u: no DMA address covers it\n", rd->offset,
		       rd->handle);
		ret = -EFAULT;
		goto unlock;
	}
	/* No IOMMU in the VM: a DMA address is the bus = physical address of the BAR. */
	if (addr < bar_start || addr + 8 > bar_end + 1) {
		pr_err("MR %u: DMA address 0x%llx is outside the GPU BAR\n", rd->handle, addr);
		ret = -EFAULT;
		goto unlock;
	}
	p = ioremap_wc(addr, 8);
	if (!p) {
		ret = -ENOMEM;
		goto unlock;
	}
	rd->value = readq(p);
	iounmap(p);
unlock:
	up_read(&u->io_lock);
out:
	kref_put(&u->ref, pmh_umem_free);
	return ret;
}

static long pmh_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct pmh_file *f = file->private_data;
	void __user *uptr = (void __user *)uarg;
	struct pmh_umem *u;
	long ret;
	u32 h;

	switch (cmd) {
	case PMH_IOC_REG: {
		struct pmh_reg r;

		if (copy_from_user(&r, uptr, sizeof(r)))
			return -EFAULT;
		ret = pmh_ioc_reg(f, &r);
		if (ret)
			return ret;
		if (copy_to_user(uptr, &r, sizeof(r))) {
			if (r.is_peer) {
				u = xa_erase(&f->mrs, r.handle);
				if (u)
					pmh_dereg(u);
			}
			return -EFAULT;
		}
		return 0;
	}
	case PMH_IOC_READ: {
		struct pmh_read rd;

		if (copy_from_user(&rd, uptr, sizeof(rd)))
			return -EFAULT;
		ret = pmh_ioc_read(f, &rd);
		if (!ret && copy_to_user(uptr, &rd, sizeof(rd)))
			return -EFAULT;
		return ret;
	}
	case PMH_IOC_DEREG:
		if (get_user(h, (u32 __user *)uptr))
			return -EFAULT;
		u = xa_erase(&f->mrs, h);
		if (!u)
			return -ENOENT;
		pmh_dereg(u);
		return 0;
	case PMH_IOC_ACTIVATE:
		if (get_user(h, (u32 __user *)uptr))
			return -EFAULT;
		xa_lock(&f->mrs);
		u = xa_load(&f->mrs, h);
		ret = -ENOENT;
		if (u && u->client->inval_required && !u->activated && u->state != PMH_UNMAPPED) {
			/* only the file's owner activates; concurrent ACTIVATEs are a test bug */
			u->activated = true;
			ret = 0;
		} else if (u) {
			ret = -EINVAL;
		}
		xa_unlock(&f->mrs);
		if (!ret)
			up(&u->map_sem);
		return ret;
	default:
		return -ENOTTY;
	}
}

static int pmh_open(struct inode *inode, struct file *file)
{
	struct pmh_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	xa_init_flags(&f->mrs, XA_FLAGS_ALLOC);
	file->private_data = f;
	return 0;
}

static int pmh_release(struct inode *inode, struct file *file)
{
	struct pmh_file *f = file->private_data;
	struct pmh_umem *u;
	unsigned long h;

	xa_for_each(&f->mrs, h, u) {
		xa_erase(&f->mrs, h);
		pmh_dereg(u);
	}
	xa_destroy(&f->mrs);
	kfree(f);
	return 0;
}

static const struct file_operations pmh_fops = {
	.owner = THIS_MODULE,
	.open = pmh_open,
	.release = pmh_release,
	.unlocked_ioctl = pmh_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice pmh_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "peermem_host",
	.fops = &pmh_fops,
	.mode = 0600,
};

static int pmh_stats_show(struct seq_file *m, void *v)
{
	seq_printf(m, "live_umems: %lld\nviolations: %lld\ninvalidations: %lld\n"
		   "stale_invalidations: %lld\nrevoked_reads: %lld\ndma_device: %s\n",
		   atomic64_read(&pmh_live_umems), atomic64_read(&pmh_violations),
		   atomic64_read(&pmh_invalidations), atomic64_read(&pmh_stale),
		   atomic64_read(&pmh_revoked_reads), pci_name(pmh_dma_pdev));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(pmh_stats);

static int __init pmh_init(void)
{
	int ret;

	if (core_order != 55 && core_order != 51) {
		pr_err("core_order must be 55 or 51\n");
		return -EINVAL;
	}
	pmh_gpu_pdev = pci_get_device(0x1af4, 0x1110, NULL);
	if (!pmh_gpu_pdev) {
		pr_err("no ivshmem device (the simulated GPU)\n");
		return -ENODEV;
	}
	if (!strcmp(dma_dev, "nvme")) {
		pmh_dma_pdev = pci_get_device(0x1b36, 0x0010, NULL);
	} else if (!strcmp(dma_dev, "ivshmem")) {
		pmh_dma_pdev = pci_dev_get(pmh_gpu_pdev);
	} else {
		pr_err("dma_dev must be nvme or ivshmem\n");
		ret = -EINVAL;
		goto put_gpu;
	}
	if (!pmh_dma_pdev) {
		pr_err("no %s PCI device for the HCA's DMA device\n", dma_dev);
		ret = -ENODEV;
		goto put_gpu;
	}
	ret = misc_register(&pmh_misc);
	if (ret)
		goto put_dma;
	pmh_debugfs = debugfs_create_dir("peermem_host", NULL);
	debugfs_create_file("stats", 0444, pmh_debugfs, NULL, &pmh_stats_fops);
#ifndef PMH_HAVE_MM_KOBJ
	if (sysfs)
		pr_warn("mm_kobj is not exported by this kernel: the tree is /sys/kernel/memory_peers\n");
#endif
	pr_info("HCA DMA device %s (DMA mask 0x%llx), sysfs %d, core order %d\n",
		pci_name(pmh_dma_pdev), dma_get_mask(&pmh_dma_pdev->dev), sysfs, core_order);
	return 0;

put_dma:
	pci_dev_put(pmh_dma_pdev);
put_gpu:
	pci_dev_put(pmh_gpu_pdev);
	return ret;
}

static void __exit pmh_exit(void)
{
	debugfs_remove_recursive(pmh_debugfs);
	misc_deregister(&pmh_misc);
	pci_dev_put(pmh_dma_pdev);
	pci_dev_put(pmh_gpu_pdev);
}

module_init(pmh_init);
module_exit(pmh_exit);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("Test-only peer-memory host (OFED peer_mem core model) for gpusim tests");
