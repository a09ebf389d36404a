// SPDX-License-Identifier: MIT
/*
 * peermem_test - nv_peer_mem on the test-only peer-memory host (kmod/peermem_host) over gpusim,
 * inside the test VM. Registers GPU memory through /dev/peermem_host as an mlx5 MR would, reads
 * it back through the DMA addresses nv_peer_mem produced, and checks the memory_peers counters,
 * gpusim's pin accounting and the host's contract checks.
 *
 *   peermem_test NAME [COUNT]     NAME: errors cycles-nv_mem cycles-nv_mem_nc invalidate
 *                                 persistent defer races busy
 * Prints "ok - NAME" or "not ok - NAME: reason"; exit status 0 only on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gpusim_uapi.h"
#include "peermem_host_uapi.h"
#include "../lib/check.h"

#define GPAGE 0x10000ULL
#define CPAGE 0x1000ULL
#define PEERS "/sys/kernel/mm/memory_peers"
#define HOST_STATS "/sys/kernel/debug/peermem_host/stats"

static const char *cur_test;
static int gfd, hfd;

static uint64_t rnd(void)
{
	static uint64_t s = 0x9E3779B97F4A7C15ULL;

	s ^= s << 13;
	s ^= s >> 7;
	s ^= s << 17;
	return s;
}

static long long read_num(const char *path)
{
	char buf[64] = "";
	FILE *f = fopen(path, "r");
	long long v = -1;

	if (f) {
		if (fgets(buf, sizeof(buf), f))
			v = strtoll(buf, NULL, 10);
		fclose(f);
	}
	return v;
}

static long long stat_of(const char *path, const char *key)
{
	char line[128];
	size_t kl = strlen(key);
	long long v = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':')
			v = strtoll(line + kl + 1, NULL, 10);
	fclose(f);
	return v;
}

struct counters {
	long long alloc, dealloc, reg_pages, dereg_pages, reg_bytes, dereg_bytes, free_cb;
};

static void counters(const char *client, struct counters *c)
{
	char p[256];

#define RD(field, file) snprintf(p, sizeof(p), PEERS "/%s/" file, client); c->field = read_num(p)
	RD(alloc, "num_alloc_mrs");
	RD(dealloc, "num_dealloc_mrs");
	RD(reg_pages, "num_reg_pages");
	RD(dereg_pages, "num_dereg_pages");
	RD(reg_bytes, "num_reg_bytes");
	RD(dereg_bytes, "num_dereg_bytes");
	RD(free_cb, "num_free_callbacks");
#undef RD
}

static int gs_info(struct gpusim_info *i)
{
	return ioctl(gfd, GPUSIM_IOC_INFO, i);
}

static int gs_alloc(uint64_t size, uint64_t *va)
{
	struct gpusim_alloc a = { .size = size };

	if (ioctl(gfd, GPUSIM_IOC_ALLOC, &a))
		return -1;
	*va = a.gpu_va;
	return 0;
}

static int gs_free(uint64_t va)
{
	struct gpusim_free f = { .gpu_va = va };

	return ioctl(gfd, GPUSIM_IOC_FREE, &f);
}

static uint64_t pattern(uint64_t va, uint64_t seed)
{
	return (va * 0x100000001B3ULL) ^ seed;
}

/* Fills [va, va+size) of GPU memory with pattern(address, seed) through gpusim's CPU mapping. */
static int gs_fill(uint64_t va, uint64_t size, uint64_t seed)
{
	uint64_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, gfd, (off_t)va);
	uint64_t i;

	if (p == MAP_FAILED)
		return -1;
	for (i = 0; i < size / 8; i++)
		p[i] = pattern(va + i * 8, seed);
	munmap(p, size);
	return 0;
}

static int reg(uint64_t addr, uint64_t size, uint32_t flags, struct pmh_reg *r)
{
	memset(r, 0, sizeof(*r));
	r->addr = addr;
	r->size = size;
	r->access = PMH_ACCESS_LOCAL_WRITE;
	r->flags = flags;
	return ioctl(hfd, PMH_IOC_REG, r);
}

static int mr_read(uint32_t h, uint64_t off, uint64_t *v)
{
	struct pmh_read rd = { .handle = h, .offset = off };

	if (ioctl(hfd, PMH_IOC_READ, &rd))
		return -1;
	*v = rd.value;
	return 0;
}

static int dereg(uint32_t h)
{
	return ioctl(hfd, PMH_IOC_DEREG, &h);
}

/* Reads the MR at its first and last word and a few in between; compares with the pattern. */
static int check_reads(const struct pmh_reg *r, uint64_t seed)
{
	uint64_t first = (r->addr + 7) & ~7ULL, last = (r->addr + r->size - 8) & ~7ULL;
	uint64_t offs[6], v;
	int i;

	if (last < first)
		return 0;
	offs[0] = first;
	offs[1] = last;
	for (i = 2; i < 6; i++)
		offs[i] = first + ((rnd() % (last - first + 8)) & ~7ULL);
	for (i = 0; i < 6; i++) {
		if (mr_read(r->handle, offs[i] - r->addr, &v))
			FAIL("read of MR %u at +0x%" PRIx64 ": %s", r->handle, (uint64_t)(offs[i] - r->addr),
			     strerror(errno));
		if (v != pattern(offs[i], seed))
			FAIL("MR %u at va 0x%" PRIx64 ": read 0x%" PRIx64 ", expected 0x%" PRIx64,
			     r->handle, offs[i], v, pattern(offs[i], seed));
	}
	return 0;
}

/* ---------------------------------------------------------------------------- tests --- */

static int t_errors(int n)
{
	static char host[3 * 4096];
	struct pmh_reg r;
	uint64_t va;

	(void)n;
	CHECK(reg((uintptr_t)host, sizeof(host), PMH_REG_INVAL_SUPP, &r) == 0 && r.is_peer == 0,
	      "host memory must pin normally, not go to a peer client (is_peer %u)", r.is_peer);
	CHECK(reg(0x7ff000000000ULL, GPAGE, PMH_REG_INVAL_SUPP, &r) == -1 && errno == EFAULT,
	      "unmapped non-GPU memory: expected the pin's EFAULT, got %s", strerror(errno));
	CHECK(gs_alloc(GPAGE, &va) == 0, "alloc: %s", strerror(errno));
	CHECK(reg(va, 0, PMH_REG_INVAL_SUPP, &r) == -1 && errno == EINVAL, "size 0: %s",
	      strerror(errno));
	memset(&r, 0, sizeof(r));
	r.addr = va;
	r.size = GPAGE;
	r.access = PMH_ACCESS_ON_DEMAND;
	CHECK(ioctl(hfd, PMH_IOC_REG, &r) == -1 && errno == EOPNOTSUPP, "ODP: %s",
	      strerror(errno));
	CHECK(reg(va, 2 * GPAGE, PMH_REG_INVAL_SUPP, &r) == -1 && errno == EFAULT,
	      "a range past the allocation is nobody's: %s", strerror(errno));
	CHECK(dereg(12345) == -1 && errno == ENOENT, "dereg of an unknown MR: %s", strerror(errno));
	CHECK(gs_free(va) == 0, "free");
	return 0;
}

static int t_cycles(const char *client, int n)
{
	bool inval = !strcmp(client, "nv_mem");
	struct counters c0, c1;
	struct gpusim_info i0, i1;
	long long pages = 0, bytes = 0;
	int k;

	counters(client, &c0);
	CHECK(c0.alloc >= 0, "no " PEERS "/%s", client);
	CHECK(gs_info(&i0) == 0, "info");
	for (k = 0; k < n; k++) {
		uint64_t npg = 1 + rnd() % 5, va, seed = rnd(), off, size, end;
		struct pmh_reg r;
		uint64_t want_nents, want_mapped;

		CHECK(gs_alloc(npg * GPAGE, &va) == 0, "alloc: %s", strerror(errno));
		CHECK(gs_fill(va, npg * GPAGE, seed) == 0, "fill: %s", strerror(errno));
		off = rnd() % (npg * GPAGE - 1);
		if (k % 4 == 0)
			off &= ~(GPAGE - 1);   /* some aligned starts too */
		size = 1 + rnd() % (npg * GPAGE - off);
		if (reg(va + off, size, inval ? PMH_REG_INVAL_SUPP : 0, &r))
			FAIL("reg va 0x%" PRIx64 "+0x%" PRIx64 " size 0x%" PRIx64 ": %s", va, off,
			     size, strerror(errno));
		end = va + off + size;
		want_nents = (((end + GPAGE - 1) & ~(GPAGE - 1)) - ((va + off) & ~(GPAGE - 1))) / GPAGE;
		want_mapped = ((end + CPAGE - 1) & ~(CPAGE - 1)) - ((va + off) & ~(CPAGE - 1));
		CHECK(r.is_peer == 1 && !strcmp(r.client, client), "went to %s (peer %u)", r.client,
		      r.is_peer);
		CHECK(r.page_size == GPAGE, "page size 0x%llx", (unsigned long long)r.page_size);
		CHECK(r.nents == want_nents && r.nmap == want_nents, "nents %u nmap %u, want %llu",
		      r.nents, r.nmap, (unsigned long long)want_nents);
		CHECK(r.mapped == want_mapped, "trimmed span 0x%llx, want 0x%llx",
		      (unsigned long long)r.mapped, (unsigned long long)want_mapped);
		if (check_reads(&r, seed))
			return -1;
		CHECK(dereg(r.handle) == 0, "dereg: %s", strerror(errno));
		CHECK(gs_free(va) == 0, "free: %s", strerror(errno));
		pages += r.nmap;
		bytes += size;
	}
	counters(client, &c1);
	CHECK(c1.alloc - c0.alloc == n && c1.dealloc - c0.dealloc == n, "alloc +%lld dealloc +%lld",
	      c1.alloc - c0.alloc, c1.dealloc - c0.dealloc);
	CHECK(c1.reg_pages - c0.reg_pages == pages, "reg_pages +%lld, want %lld",
	      c1.reg_pages - c0.reg_pages, pages);
	CHECK(c1.dereg_pages == c0.dereg_pages, "num_dereg_pages moved (5.5+ core keeps it 0)");
	CHECK(c1.reg_bytes - c0.reg_bytes == bytes && c1.dereg_bytes - c0.dereg_bytes == bytes,
	      "reg_bytes +%lld dereg_bytes +%lld, want %lld", c1.reg_bytes - c0.reg_bytes,
	      c1.dereg_bytes - c0.dereg_bytes, bytes);
	CHECK(c1.free_cb == c0.free_cb, "free callbacks without any free");
	CHECK(gs_info(&i1) == 0 && i1.active_pins == i0.active_pins && i1.free_bytes == i0.free_bytes,
	      "pins %llu -> %llu, free bytes %llu -> %llu", (unsigned long long)i0.active_pins,
	      (unsigned long long)i1.active_pins, (unsigned long long)i0.free_bytes,
	      (unsigned long long)i1.free_bytes);
	return 0;
}

static int t_invalidate(int n)
{
	struct counters c0, c1;
	struct pmh_reg r;
	uint64_t va, v;

	(void)n;
	counters("nv_mem", &c0);
	CHECK(gs_alloc(3 * GPAGE, &va) == 0 && gs_fill(va, 3 * GPAGE, 7) == 0, "alloc");
	CHECK(reg(va + 100, 2 * GPAGE, PMH_REG_INVAL_SUPP, &r) == 0, "reg: %s", strerror(errno));
	CHECK(check_reads(&r, 7) == 0, "reads");
	CHECK(gs_free(va) == 0, "free: %s", strerror(errno));
	CHECK(mr_read(r.handle, 4, &v) == -1 && errno == EIO,   /* va + 104: 8-aligned */
	      "a read after the GPU free must fail as a revoked MR: %s", strerror(errno));
	counters("nv_mem", &c1);
	CHECK(c1.free_cb - c0.free_cb == 1 && c1.dealloc - c0.dealloc == 1,
	      "free_callbacks +%lld dealloc +%lld", c1.free_cb - c0.free_cb, c1.dealloc - c0.dealloc);
	CHECK(dereg(r.handle) == 0, "dereg after invalidation: %s", strerror(errno));
	counters("nv_mem", &c0);
	CHECK(c0.dealloc == c1.dealloc, "deregistering an invalidated MR counted again");
	return 0;
}

static int t_persistent(int n)
{
	struct counters c0, c1;
	struct gpusim_info i0, i1;
	struct pmh_reg r;
	uint64_t va;
	int k;

	if (n <= 0)
		n = 20;
	counters("nv_mem_nc", &c0);
	CHECK(c0.alloc >= 0, "no nv_mem_nc client");
	CHECK(gs_info(&i0) == 0, "info");
	for (k = 0; k < n; k++) {
		CHECK(gs_alloc(2 * GPAGE, &va) == 0 && gs_fill(va, 2 * GPAGE, 99 + k) == 0, "alloc");
		CHECK(reg(va + 8, 2 * GPAGE - 16, 0, &r) == 0 && !strcmp(r.client, "nv_mem_nc"),
		      "reg: %s (%s)", strerror(errno), r.client);
		CHECK(gs_free(va) == 0, "free: %s", strerror(errno));
		/* A persistent pin survives the free: the pages stay and still hold the data. */
		if (check_reads(&r, 99 + k))
			FAIL("persistent MR lost its pages at the GPU free");
		CHECK(dereg(r.handle) == 0, "dereg: %s", strerror(errno));
	}
	counters("nv_mem_nc", &c1);
	CHECK(c1.free_cb == c0.free_cb && c1.alloc - c0.alloc == n && c1.dealloc - c0.dealloc == n,
	      "free_cb %lld->%lld alloc +%lld dealloc +%lld", c0.free_cb, c1.free_cb,
	      c1.alloc - c0.alloc, c1.dealloc - c0.dealloc);
	CHECK(gs_info(&i1) == 0 && i1.free_bytes == i0.free_bytes && i1.active_pins == i0.active_pins,
	      "BAR pages not returned after the last put");
	return 0;
}

struct freer {
	uint64_t va;
	volatile int done;
	int ret;
	pthread_barrier_t *bar;
};

static void *free_thread(void *arg)
{
	struct freer *f = arg;

	if (f->bar)
		pthread_barrier_wait(f->bar);
	f->ret = gs_free(f->va);
	f->done = 1;
	return NULL;
}

static int t_defer(int n)
{
	struct freer f = { 0 };
	struct pmh_reg r;
	pthread_t t;
	uint64_t v;
	uint32_t h;

	(void)n;
	CHECK(gs_alloc(GPAGE, &f.va) == 0 && gs_fill(f.va, GPAGE, 3) == 0, "alloc");
	CHECK(reg(f.va, GPAGE, PMH_REG_INVAL_SUPP | PMH_REG_DEFER_ACTIVATE, &r) == 0, "reg: %s",
	      strerror(errno));
	pthread_create(&t, NULL, free_thread, &f);
	usleep(300000);
	CHECK(!f.done, "the invalidation did not wait for the HCA to activate the MR");
	h = r.handle;
	CHECK(ioctl(hfd, PMH_IOC_ACTIVATE, &h) == 0, "activate: %s", strerror(errno));
	pthread_join(t, NULL);
	CHECK(f.ret == 0, "free failed");
	CHECK(mr_read(r.handle, 0, &v) == -1 && errno == EIO, "read after invalidation: %s",
	      strerror(errno));
	CHECK(dereg(r.handle) == 0, "dereg");
	return 0;
}

static int t_races(int n)
{
	struct counters c0, c1;
	struct gpusim_info i0, i1;
	pthread_barrier_t bar;
	int k, cb = 0;

	counters("nv_mem", &c0);
	CHECK(gs_info(&i0) == 0, "info");
	pthread_barrier_init(&bar, NULL, 2);
	for (k = 0; k < n; k++) {
		struct freer f = { .bar = &bar };
		struct pmh_reg r;
		pthread_t t;
		int dr;

		CHECK(gs_alloc((1 + k % 3) * GPAGE, &f.va) == 0, "alloc: %s", strerror(errno));
		CHECK(reg(f.va + (k % 7) * 8, (1 + k % 3) * GPAGE - (k % 7) * 8 - k % 5,
			  PMH_REG_INVAL_SUPP, &r) == 0, "iteration %d: reg: %s", k, strerror(errno));
		pthread_create(&t, NULL, free_thread, &f);
		pthread_barrier_wait(&bar);
		if (k & 1)
			usleep(rnd() % 50);
		dr = dereg(r.handle);
		pthread_join(t, NULL);
		CHECK(dr == 0 && f.ret == 0, "iteration %d: dereg %d free %d", k, dr, f.ret);
	}
	pthread_barrier_destroy(&bar);
	counters("nv_mem", &c1);
	cb = (int)(c1.free_cb - c0.free_cb);
	CHECK(c1.alloc - c0.alloc == n && c1.dealloc - c0.dealloc == n, "alloc +%lld dealloc +%lld",
	      c1.alloc - c0.alloc, c1.dealloc - c0.dealloc);
	CHECK(c1.reg_bytes - c0.reg_bytes == c1.dereg_bytes - c0.dereg_bytes, "bytes differ");
	CHECK(gs_info(&i1) == 0 && i1.active_pins == i0.active_pins && i1.free_bytes == i0.free_bytes,
	      "pins %llu -> %llu, free bytes %llu -> %llu", (unsigned long long)i0.active_pins,
	      (unsigned long long)i1.active_pins, (unsigned long long)i0.free_bytes,
	      (unsigned long long)i1.free_bytes);
	printf("# races: %d, free callbacks reached the core in %d\n", n, cb);
	return 0;
}

/* While an MR lives nv_peer_mem holds a module reference: unloading it must be refused. */
static int t_busy(int n)
{
	struct pmh_reg r;
	uint64_t va;

	(void)n;
	CHECK(gs_alloc(GPAGE, &va) == 0, "alloc");
	CHECK(reg(va, GPAGE, PMH_REG_INVAL_SUPP, &r) == 0, "reg: %s", strerror(errno));
	CHECK(syscall(SYS_delete_module, "nv_peer_mem", O_NONBLOCK) == -1 &&
	      (errno == EWOULDBLOCK || errno == EBUSY),
	      "rmmod nv_peer_mem with a live MR: %s", strerror(errno));
	CHECK(syscall(SYS_delete_module, "peermem_host", O_NONBLOCK) == -1,
	      "rmmod of the host under its client succeeded");
	CHECK(dereg(r.handle) == 0, "dereg");
	CHECK(gs_free(va) == 0, "free");
	return 0;
}

/* A client that breaks the SG contract (the stand-in, mode=2) must not get an MR through. */
static int t_reject(int n)
{
	long long v0 = stat_of(HOST_STATS, "violations");
	struct pmh_reg r;
	uint64_t va;

	(void)n;
	CHECK(gs_alloc(GPAGE, &va) == 0, "alloc");
	CHECK(reg(va + 64, 256, 0, &r) == -1 && errno == EINVAL,
	      "an MR with a misaligned DMA address was accepted (%s)", strerror(errno));
	CHECK(stat_of(HOST_STATS, "violations") == v0 + 1, "violation not counted");
	CHECK(gs_free(va) == 0, "free");
	printf("ok - reject\n");
	return 0;
}

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[2]) : 100, ret;

	if (argc < 2) {
		fprintf(stderr, "usage: %s NAME [COUNT]\n", argv[0]);
		return 2;
	}
	cur_test = argv[1];
	gfd = open(GPUSIM_DEVICE_PATH, O_RDWR);
	hfd = open(PMH_DEVICE_PATH, O_RDWR);
	if (gfd < 0 || hfd < 0) {
		fprintf(stderr, "not ok - %s: open %s / %s: %s\n", cur_test, GPUSIM_DEVICE_PATH,
			PMH_DEVICE_PATH, strerror(errno));
		return 1;
	}
	if (!strcmp(cur_test, "errors"))
		ret = t_errors(n);
	else if (!strcmp(cur_test, "cycles-nv_mem"))
		ret = t_cycles("nv_mem", n);
	else if (!strcmp(cur_test, "cycles-nv_mem_nc"))
		ret = t_cycles("nv_mem_nc", n);
	else if (!strcmp(cur_test, "invalidate"))
		ret = t_invalidate(n);
	else if (!strcmp(cur_test, "persistent"))
		ret = t_persistent(n);
	else if (!strcmp(cur_test, "defer"))
		ret = t_defer(n);
	else if (!strcmp(cur_test, "races"))
		ret = t_races(n);
	else if (!strcmp(cur_test, "busy"))
		ret = t_busy(n);
	else if (!strcmp(cur_test, "reject"))
		return t_reject(n) ? 1 : 0;
	else {
		fprintf(stderr, "unknown test %s\n", cur_test);
		return 2;
	}
	if (!ret && stat_of(HOST_STATS, "violations") != 0) {
		fprintf(stderr, "not ok - %s: the peer-memory host counted %lld contract violations\n",
			cur_test, stat_of(HOST_STATS, "violations"));
		ret = -1;
	}
	if (!ret)
		printf("ok - %s%s%s\n", cur_test, argc > 2 ? " " : "", argc > 2 ? argv[2] : "");
	return ret ? 1 : 0;
}
