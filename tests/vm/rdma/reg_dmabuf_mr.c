// SPDX-License-Identifier: MIT
/*
 * reg_dmabuf_mr - registers GPU memory (a gpusim dma-buf, what cuMemGetHandleForAddressRange
 * returns on gpusim) with an RDMA device, three ways, and records each answer:
 *   1. ibv_reg_dmabuf_mr()                    - rdma-core's API (provider first, then the kernel);
 *   2. UVERBS_METHOD_REG_DMABUF_MR directly   - the kernel's own answer, bypassing the provider
 *      (the ioctl builder is first proven on UVERBS_METHOD_QUERY_PORT, whose answer is checked
 *      against ibv_query_port, so a refusal is the kernel's and not a malformed request);
 *   3. ibv_reg_mr() on the dma-buf's CPU mapping - what an application might try instead.
 *
 *   reg_dmabuf_mr -d DEV [-e E1,E2,E3]
 * -e gives the expected errno of each way (0 = must succeed); an entry may name two accepted
 * values as A/B. Every answer is printed as
 * "answer <way>: ok|errno N (name)"; exits 0 only if each matched. A refusal that comes back as
 * success, or a NULL without errno, fails: refusals must be reported, not hidden.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include "gpusim_uapi.h"
#include "../lib/check.h"

#define LEN (256 * 1024)

static void answer(const char *way, int ok, int err, const int want[2])
{
	int got = ok ? 0 : err;

	if (ok)
		printf("answer %s: ok\n", way);
	else
		printf("answer %s: errno %d (%s)\n", way, err, strerror(err));
	if (!ok && err == 0)
		NOT_OK("%s: failed without an errno (a hidden refusal)", way);
	else if (got != want[0] && got != want[1])
		NOT_OK("%s: expected %s%d (or %d)", way, want[0] ? "errno " : "success ", want[0], want[1]);
	else
		check_report(1, "%s", way);
}

/* One uverbs ioctl: header plus attributes. */
struct uv_cmd {
	struct ib_uverbs_ioctl_hdr hdr;
	struct ib_uverbs_attr attrs[12];
};

static void uv_init(struct uv_cmd *c, uint16_t object, uint16_t method)
{
	memset(c, 0, sizeof(*c));
	c->hdr.object_id = object;
	c->hdr.method_id = method;
	c->hdr.driver_id = RDMA_DRIVER_RXE;
}

static void uv_attr(struct uv_cmd *c, uint16_t id, uint16_t len, uint64_t data)
{
	struct ib_uverbs_attr *a = &c->attrs[c->hdr.num_attrs++];

	a->attr_id = id;
	a->len = len;
	a->data = data;
}

static int uv_call(struct ibv_context *ctx, struct uv_cmd *c)
{
	c->hdr.length = sizeof(c->hdr) + c->hdr.num_attrs * sizeof(c->attrs[0]);
	return ioctl(ctx->cmd_fd, RDMA_VERBS_IOCTL, &c->hdr);
}

/* The builder on a method every device has: the answer must equal ibv_query_port's. */
static int builder_works(struct ibv_context *ctx)
{
	struct ib_uverbs_query_port_resp_ex resp;
	struct ibv_port_attr pa;
	struct uv_cmd c;

	if (ibv_query_port(ctx, 1, &pa)) {
		NOT_OK("ibv_query_port: %s", strerror(errno));
		return 0;
	}
	memset(&resp, 0xa5, sizeof(resp));
	uv_init(&c, UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT);
	uv_attr(&c, UVERBS_ATTR_QUERY_PORT_PORT_NUM, sizeof(uint64_t), 1);
	uv_attr(&c, UVERBS_ATTR_QUERY_PORT_RESP, sizeof(resp), (uintptr_t)&resp);
	if (uv_call(ctx, &c)) {
		NOT_OK("raw QUERY_PORT ioctl: %s", strerror(errno));
		return 0;
	}
	if (resp.legacy_resp.gid_tbl_len != (uint32_t)pa.gid_tbl_len ||
	    resp.legacy_resp.state != pa.state || resp.legacy_resp.max_mtu != pa.max_mtu) {
		NOT_OK("raw QUERY_PORT disagrees with ibv_query_port");
		return 0;
	}
	check_report(1, "the uverbs ioctl builder (QUERY_PORT matches ibv_query_port)");
	return 1;
}

int main(int argc, char **argv)
{
	int want[3][2] = { { EOPNOTSUPP, EOPNOTSUPP }, { EOPNOTSUPP, EPROTONOSUPPORT }, { EFAULT, EFAULT } };
	const char *devname = NULL;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct gpusim_export_dmabuf ex = { 0 };
	struct gpusim_alloc al = { .size = LEN };
	struct ibv_mr *mr;
	struct ibv_pd *pd;
	int opt, n, gfd;
	void *cpu;

	while ((opt = getopt(argc, argv, "d:e:")) != -1) {
		if (opt == 'd')
			devname = optarg;
		else if (opt == 'e')
			for (int i = 0; i < 3 && optarg; i++) {
				char *end;

				want[i][0] = want[i][1] = (int)strtol(optarg, &end, 10);
				if (*end == '/')
					want[i][1] = (int)strtol(end + 1, &end, 10);
				optarg = *end == ',' ? end + 1 : NULL;
			}
		else
			return 2;
	}
	if (!devname) {
		fprintf(stderr, "usage: %s -d DEV [-e E1,E2,E3]\n", argv[0]);
		return 2;
	}

	/* GPU memory and its dma-buf, as cudasim gets it for cuMemGetHandleForAddressRange. */
	gfd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (gfd < 0 || ioctl(gfd, GPUSIM_IOC_ALLOC, &al)) {
		NOT_OK("gpusim allocation: %s", strerror(errno));
		return 1;
	}
	ex.gpu_va = al.gpu_va;
	ex.size = LEN;
	if (ioctl(gfd, GPUSIM_IOC_EXPORT_DMABUF, &ex)) {
		NOT_OK("gpusim dma-buf export: %s", strerror(errno));
		return 1;
	}
	cpu = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, ex.fd, 0);
	if (cpu == MAP_FAILED) {
		NOT_OK("mmap of the dma-buf (needs gpusim dmabuf_mmap=1): %s", strerror(errno));
		return 1;
	}

	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), devname))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		NOT_OK("RDMA device %s not found or not openable", devname);
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	if (!pd) {
		NOT_OK("ibv_alloc_pd: %s", strerror(errno));
		return 1;
	}
	/* The device works: ordinary host memory registers. */
	{
		void *host = calloc(1, 4096);
		struct ibv_mr *hmr = ibv_reg_mr(pd, host, 4096, IBV_ACCESS_LOCAL_WRITE);

		if (!hmr) {
			NOT_OK("ibv_reg_mr of host memory: %s", strerror(errno));
			return 1;
		}
		ibv_dereg_mr(hmr);
		free(host);
	}
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

	/* 1. rdma-core's API. */
	errno = 0;
	mr = ibv_reg_dmabuf_mr(pd, 0, LEN, 0, ex.fd, access);
	answer("ibv_reg_dmabuf_mr", mr != NULL, errno, want[0]);
	if (mr)
		ibv_dereg_mr(mr);

	/* 2. The kernel, without the provider in between. */
	if (builder_works(ctx)) {
		uint32_t lkey = 0, rkey = 0;
		struct uv_cmd c;
		int rc;

		uv_init(&c, UVERBS_OBJECT_MR, UVERBS_METHOD_REG_DMABUF_MR);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_HANDLE, 0, 0);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE, 0, pd->handle);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_OFFSET, sizeof(uint64_t), 0);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_LENGTH, sizeof(uint64_t), LEN);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_IOVA, sizeof(uint64_t), 0);
		/* The fd and the access flags are inline 32-bit inputs, as rdma-core sends them. */
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_FD, sizeof(uint32_t), (uint32_t)ex.fd);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS, sizeof(uint32_t), access);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY, sizeof(lkey), (uintptr_t)&lkey);
		uv_attr(&c, UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY, sizeof(rkey), (uintptr_t)&rkey);
		errno = 0;
		rc = uv_call(ctx, &c);
		answer("kernel UVERBS_METHOD_REG_DMABUF_MR", rc == 0, errno, want[1]);
		if (rc == 0)
			printf("# the kernel registered it: lkey 0x%x rkey 0x%x (freed with the context)\n", lkey, rkey);
	}

	/* 3. The CPU mapping of the dma-buf: PFN memory without struct pages. */
	errno = 0;
	mr = ibv_reg_mr(pd, cpu, LEN, access);
	answer("ibv_reg_mr of the dma-buf's CPU mapping", mr != NULL, errno, want[2]);
	if (mr)
		ibv_dereg_mr(mr);

	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	munmap(cpu, LEN);
	close(ex.fd);
	close(gfd);
	printf("reg_dmabuf_mr: %d failure(s)\n", check_failures);
	return check_failures ? 1 : 0;
}
