// SPDX-License-Identifier: MIT
/*
 * dmabuf_mr_test - gpusim's dma-bufs registered through the kernel's ib_umem_dmabuf importer
 * (kmod/dmabuf_mr), pinned and dynamic, read back through the DMA addresses the importer
 * produced. Every test runs in both modes.
 *
 *   dmabuf_mr_test [COUNT]     COUNT random registrations per mode (default 200)
 * Prints "ok - NAME" / "not ok - NAME: reason"; exit status 0 only on success.
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

#include "gpusim_uapi.h"
#include "dmabuf_mr.h"
#include "../lib/check.h"

#define GPAGE 0x10000ULL
#define CPAGE 0x1000ULL
#define GSTATS "/sys/kernel/debug/gpusim/stats"

static char cur_test[64];
static int gfd, mfd;

static uint64_t rnd(void)
{
	static uint64_t s = 0xD1B54A32D192ED03ULL;

	s ^= s << 13;
	s ^= s >> 7;
	s ^= s << 17;
	return s;
}

static long long gstat(const char *key)
{
	char line[128];
	size_t kl = strlen(key);
	long long v = -1;
	FILE *f = fopen(GSTATS, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':')
			v = strtoll(line + kl + 1, NULL, 10);
	fclose(f);
	return v;
}

static uint64_t pattern(uint64_t va, uint64_t seed)
{
	return (va * 0x9E3779B97F4A7C15ULL) ^ seed;
}

static int gs_alloc_fill(uint64_t size, uint64_t seed, uint64_t *va)
{
	struct gpusim_alloc a = { .size = size };
	uint64_t *p, i;

	if (ioctl(gfd, GPUSIM_IOC_ALLOC, &a))
		return -1;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, gfd, (off_t)a.gpu_va);
	if (p == MAP_FAILED)
		return -1;
	for (i = 0; i < size / 8; i++)
		p[i] = pattern(a.gpu_va + i * 8, seed);
	munmap(p, size);
	*va = a.gpu_va;
	return 0;
}

static int gs_free(uint64_t va)
{
	struct gpusim_free f = { .gpu_va = va };

	return ioctl(gfd, GPUSIM_IOC_FREE, &f);
}

static int gs_export(uint64_t va, uint64_t size)
{
	struct gpusim_export_dmabuf e = { .gpu_va = va, .size = size };

	if (ioctl(gfd, GPUSIM_IOC_EXPORT_DMABUF, &e))
		return -1;
	return e.fd;
}

static int mr_reg(int fd, int mode, uint64_t off, uint64_t size, struct dmr_reg *r)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
	r->mode = mode;
	r->offset = off;
	r->size = size;
	r->access = 1;
	return ioctl(mfd, DMR_IOC_REG, r);
}

static int mr_dereg(uint32_t h)
{
	return ioctl(mfd, DMR_IOC_DEREG, &h);
}

/* Reads MR words at its ends and in between; @base_va is the GPU VA of dma-buf offset 0. */
static int check_reads(const struct dmr_reg *r, uint64_t base_va, uint64_t seed)
{
	uint64_t start = r->offset, first = (start + 7) & ~7ULL;
	uint64_t last = (start + r->size - 8) & ~7ULL;
	int i;

	if (last < first)
		return 0;
	for (i = 0; i < 6; i++) {
		uint64_t o = i == 0 ? first : i == 1 ? last : first + ((rnd() % (last - first + 8)) & ~7ULL);
		struct dmr_read rd = { .handle = r->handle, .offset = o - start };

		if (ioctl(mfd, DMR_IOC_READ, &rd))
			FAIL("read at +0x%" PRIx64 ": %s", o - start, strerror(errno));
		if (rd.value != pattern(base_va + o, seed))
			FAIL("dma-buf offset 0x%" PRIx64 ": read 0x%llx want 0x%" PRIx64, o,
			     (unsigned long long)rd.value, pattern(base_va + o, seed));
	}
	return 0;
}

static int t_random(int mode, int n)
{
	int k;

	for (k = 0; k < n; k++) {
		uint64_t npg = 1 + rnd() % 4, va, seed = rnd(), sub_off, sub_len, off, size, end;
		struct dmr_reg r;
		int fd;

		if (gs_alloc_fill(npg * GPAGE, seed, &va))
			FAIL("alloc: %s", strerror(errno));
		/* a sub-range export every other time */
		sub_off = (k & 1) ? (rnd() % (npg * GPAGE / CPAGE)) * CPAGE : 0;
		sub_len = npg * GPAGE - sub_off;
		if (k & 1)
			sub_len = CPAGE * (1 + rnd() % (sub_len / CPAGE));
		fd = gs_export(va + sub_off, sub_len);
		CHECK(fd >= 0, "export: %s", strerror(errno));
		off = rnd() % sub_len;
		if (k % 4 == 0)
			off &= ~(CPAGE - 1);
		size = 1 + rnd() % (sub_len - off);
		if (mr_reg(fd, mode, off, size, &r))
			FAIL("reg off 0x%" PRIx64 " size 0x%" PRIx64 " of 0x%" PRIx64 ": %s", off, size,
			     sub_len, strerror(errno));
		end = off + size;
		CHECK(r.mapped == ((end + CPAGE - 1) & ~(CPAGE - 1)) - (off & ~(CPAGE - 1)),
		      "importer span 0x%llx for [0x%" PRIx64 ", 0x%" PRIx64 ")",
		      (unsigned long long)r.mapped, off, end);
		if (check_reads(&r, va + sub_off, seed))
			return -1;
		CHECK(mr_dereg(r.handle) == 0, "dereg: %s", strerror(errno));
		close(fd);
		CHECK(gs_free(va) == 0, "free");
	}
	return 0;
}

static int t_errors(int mode)
{
	struct dmr_reg r;
	uint64_t va;
	int fd;

	CHECK(gs_alloc_fill(2 * GPAGE, 1, &va) == 0, "alloc");
	fd = gs_export(va, 2 * GPAGE);
	CHECK(fd >= 0, "export");
	CHECK(mr_reg(fd, mode, 2 * GPAGE - 8, 16, &r) == -1 && errno == EINVAL,
	      "past the end: %s", strerror(errno));
	CHECK(mr_reg(fd, mode, 0, 2 * GPAGE + 1, &r) == -1 && errno == EINVAL,
	      "longer than the dma-buf: %s", strerror(errno));
	CHECK(mr_reg(fd, mode, 0, 0, &r) == -1 && errno == EINVAL, "size 0: %s", strerror(errno));
	CHECK(mr_reg(fd, mode, ~0ULL - 4, 16, &r) == -1 && errno == EINVAL, "overflow: %s",
	      strerror(errno));
	CHECK(mr_reg(12345, mode, 0, 16, &r) == -1 && errno == EBADF, "bad fd: %s", strerror(errno));
	CHECK(mr_reg(gfd, mode, 0, 16, &r) == -1 && errno == EINVAL, "not a dma-buf: %s",
	      strerror(errno));
	close(fd);
	CHECK(gs_free(va) == 0, "free");
	return 0;
}

/* Freeing the allocation while an MR holds the dma-buf: pages stay (and keep their data). */
static int t_free_while_registered(int mode)
{
	long long free0 = gstat("free_pages"), bufs0 = gstat("active_dmabufs");
	struct dmr_reg r;
	uint64_t va;
	int fd;

	CHECK(free0 >= 0, "no " GSTATS);
	CHECK(gs_alloc_fill(3 * GPAGE, 77, &va) == 0, "alloc");
	fd = gs_export(va, 3 * GPAGE);
	CHECK(fd >= 0, "export");
	CHECK(mr_reg(fd, mode, GPAGE - 24, GPAGE + 48, &r) == 0, "reg: %s", strerror(errno));
	close(fd);
	CHECK(gs_free(va) == 0, "free: %s", strerror(errno));
	CHECK(gstat("free_pages") == free0 - 3, "pages came back while the MR holds them (%lld of %lld)",
	      gstat("free_pages"), free0);
	if (check_reads(&r, va, 77))
		FAIL("data changed under a live MR after the free");
	CHECK(mr_dereg(r.handle) == 0, "dereg");
	CHECK(gstat("free_pages") == free0 && gstat("active_dmabufs") == bufs0,
	      "pages %lld (want %lld), dma-bufs %lld (want %lld) after the MR went",
	      gstat("free_pages"), free0, gstat("active_dmabufs"), bufs0);
	return 0;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 200, mode, fails = 0;
	static const char *const names[] = { "pinned", "dynamic" };

	gfd = open(GPUSIM_DEVICE_PATH, O_RDWR);
	mfd = open(DMR_DEVICE_PATH, O_RDWR);
	if (gfd < 0 || mfd < 0) {
		fprintf(stderr, "not ok - open %s / %s: %s\n", GPUSIM_DEVICE_PATH, DMR_DEVICE_PATH,
			strerror(errno));
		return 1;
	}
	for (mode = DMR_PINNED; mode <= DMR_DYNAMIC; mode++) {
		snprintf(cur_test, sizeof(cur_test), "%s-random-%d", names[mode], n);
		if (t_random(mode, n))
			fails++;
		else
			printf("ok - %s\n", cur_test);
		snprintf(cur_test, sizeof(cur_test), "%s-errors", names[mode]);
		if (t_errors(mode))
			fails++;
		else
			printf("ok - %s\n", cur_test);
		snprintf(cur_test, sizeof(cur_test), "%s-free-while-registered", names[mode]);
		if (t_free_while_registered(mode))
			fails++;
		else
			printf("ok - %s\n", cur_test);
	}
	return fails ? 1 : 0;
}
