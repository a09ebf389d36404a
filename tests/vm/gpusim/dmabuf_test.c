// SPDX-License-Identifier: MIT
/*
 * dmabuf_test - gpusim's dma-buf export (GPUSIM_IOC_EXPORT_DMABUF) inside the test VM: what the
 * exported file is, mmap (allowed and refused), offsets and sub-ranges, bad requests, and the
 * lifetime of the memory behind a dma-buf whose allocation is freed while it is exported, mapped
 * or attached by an importer (kmod/gpusim/test/dmabuf_import.ko).
 *
 *   dmabuf_test            run every test
 *   dmabuf_test NAME...    run the named tests (table at the bottom)
 *
 * Prints "ok - NAME" / "not ok - NAME: reason" and exits non-zero if any failed. Tests that need
 * the importer module fail (not skip) when its device is missing: the suite always loads it.
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpusim_uapi.h"
#include "dmabuf_import.h"
#include "../lib/check.h"

#define GPAGE 0x10000ULL
#define ENOTSUPP_KERNEL 524   /* the kernel-internal ENOTSUPP that NVIDIA's mmap leaks */
#define PARAM "/sys/module/gpusim/parameters/dmabuf_mmap"
#define STATS "/sys/kernel/debug/gpusim/stats"

static const char *cur_test;

/* ------------------------------------------------------------------------- helpers --- */

static int gs_alloc(int fd, uint64_t size, uint64_t *va)
{
	struct gpusim_alloc a = { .size = size };

	if (ioctl(fd, GPUSIM_IOC_ALLOC, &a))
		return -1;
	*va = a.gpu_va;
	return 0;
}

static int gs_free(int fd, uint64_t va)
{
	struct gpusim_free f = { .gpu_va = va };

	return ioctl(fd, GPUSIM_IOC_FREE, &f);
}

/* The dma-buf fd, or -1 with errno. */
static int gs_export(int fd, uint64_t va, uint64_t size, uint32_t flags)
{
	struct gpusim_export_dmabuf e = { .gpu_va = va, .size = size, .flags = flags, .fd = -7 };

	if (ioctl(fd, GPUSIM_IOC_EXPORT_DMABUF, &e))
		return -1;
	return e.fd;
}

static volatile uint64_t *map_fd(int fd, uint64_t len, uint64_t off)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);

	return p == MAP_FAILED ? NULL : p;
}

static uint64_t pattern(uint64_t seed, uint64_t i)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ULL + i;

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	return x ^ (x >> 29);
}

static void fill(volatile uint64_t *p, uint64_t len, uint64_t seed, uint64_t first)
{
	for (uint64_t i = 0; i < len / 8; i++)
		p[i] = pattern(seed, first + i);
}

/* Index of the first word of p that is not pattern(seed, first + i), or -1. */
static long verify(volatile uint64_t *p, uint64_t len, uint64_t seed, uint64_t first)
{
	for (uint64_t i = 0; i < len / 8; i++)
		if (p[i] != pattern(seed, first + i))
			return (long)i;
	return -1;
}

static long stat_of(const char *key)
{
	char line[256];
	size_t n = strlen(key);
	long v = -1;
	FILE *f = fopen(STATS, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 0);
	fclose(f);
	return v;
}

static int set_mmap_param(int on)
{
	FILE *f = fopen(PARAM, "w");

	if (!f)
		return -1;
	fprintf(f, "%d\n", on);
	return fclose(f);
}

/* One process-wide /dev/gpusim file: the GPU address space of this process. */
static int gfd = -1;

/* A fresh allocation of len bytes, filled with pattern(seed) through the simulator's mapping. */
static int alloc_filled(uint64_t len, uint64_t seed, uint64_t *va)
{
	volatile uint64_t *p;

	if (gs_alloc(gfd, len, va))
		return -1;
	p = map_fd(gfd, len, *va);
	if (!p)
		return -1;
	fill(p, len, seed, 0);
	munmap((void *)p, len);
	return 0;
}

/* ---------------------------------------------------------------------------- tests --- */

/* The exported file: a dma-buf named as NVIDIA's, O_RDWR | O_CLOEXEC, of the requested size. */
static int t_export_file(void)
{
	uint64_t va;
	char path[64], name[256];
	int fd, flags;
	ssize_t n;
	FILE *f;

	CHECK_OK(gs_alloc(gfd, 4 * GPAGE, &va));
	CHECK_OK(fd = gs_export(gfd, va, 4 * GPAGE, 0));
	flags = fcntl(fd, F_GETFL);
	CHECK((flags & O_ACCMODE) == O_RDWR, "file flags 0x%x", flags);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "descriptor without FD_CLOEXEC");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, name, sizeof(name) - 1);
	CHECK(n > 0, "readlink %s: %s", path, strerror(errno));
	name[n] = 0;
	CHECK(!strncmp(name, "/dmabuf:", 8), "fd links to %s, not a dma-buf", name);
	CHECK(lseek(fd, 0, SEEK_END) == (off_t)(4 * GPAGE), "dma-buf size by lseek %ld",
	      (long)lseek(fd, 0, SEEK_END));
	/* The exporter name as the dma-buf core reports it. */
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	CHECK(f, "open %s", path);
	bool named = false;
	while (fgets(name, sizeof(name), f))
		if (!strncmp(name, "exp_name:", 9) && strstr(name, "nv_dmabuf"))
			named = true;
	fclose(f);
	CHECK(named, "fdinfo has no exp_name nv_dmabuf");
	CHECK(stat_of("active_dmabufs") == 1, "active_dmabufs %ld", stat_of("active_dmabufs"));
	close(fd);
	CHECK(stat_of("active_dmabufs") == 0, "active_dmabufs %ld after close", stat_of("active_dmabufs"));
	CHECK_OK(gs_free(gfd, va));
	return 0;
}

/* Mapped dma-buf and simulator see the same bytes, at every offset and for sub-ranges. */
static int t_mmap_data(void)
{
	const uint64_t len = 8 * GPAGE;
	volatile uint64_t *dm, *gm;
	uint64_t va;
	long bad;
	int fd;

	CHECK_OK(alloc_filled(len, 11, &va));
	CHECK_OK(fd = gs_export(gfd, va, len, 0));
	dm = map_fd(fd, len, 0);
	CHECK(dm, "mmap of the dma-buf: %s", strerror(errno));
	bad = verify(dm, len, 11, 0);
	CHECK(bad < 0, "word %ld read through the dma-buf differs", bad);
	/* Written through the dma-buf, read by the simulated GPU. */
	fill(dm, len, 12, 0);
	gm = map_fd(gfd, len, va);
	CHECK(gm, "mmap of /dev/gpusim");
	bad = verify(gm, len, 12, 0);
	CHECK(bad < 0, "word %ld written through the dma-buf not seen by the GPU", bad);
	munmap((void *)dm, len);
	/* A mapping at a page offset into the dma-buf. */
	dm = map_fd(fd, 3 * 4096, 5 * 4096);
	CHECK(dm, "mmap at offset 5 pages: %s", strerror(errno));
	bad = verify(dm, 3 * 4096, 12, 5 * 4096 / 8);
	CHECK(bad < 0, "offset mapping word %ld", bad);
	munmap((void *)dm, 3 * 4096);
	/* Beyond the end, or private: refused. */
	errno = 0;
	CHECK(mmap(NULL, 2 * 4096, PROT_READ, MAP_SHARED, fd, (off_t)(len - 4096)) == MAP_FAILED &&
	      errno == EINVAL, "mapping past the end: errno %d", errno);
	errno = 0;
	CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) == MAP_FAILED &&
	      errno == EINVAL, "private mapping: errno %d", errno);
	close(fd);

	/* A sub-range export that starts inside a GPU page and crosses into the next two. */
	uint64_t off = GPAGE - 3 * 4096, sub = GPAGE + 5 * 4096;

	CHECK_OK(fd = gs_export(gfd, va + off, sub, 0));
	CHECK(lseek(fd, 0, SEEK_END) == (off_t)sub, "sub-range size");
	dm = map_fd(fd, sub, 0);
	CHECK(dm, "mmap of the sub-range dma-buf: %s", strerror(errno));
	bad = verify(dm, sub, 12, off / 8);
	CHECK(bad < 0, "sub-range word %ld", bad);
	dm[0] = 0x1122334455667788ULL;
	CHECK(gm[off / 8] == 0x1122334455667788ULL, "sub-range write not seen at GPU offset 0x%" PRIx64, off);
	munmap((void *)dm, sub);
	close(fd);
	munmap((void *)gm, len);
	CHECK_OK(gs_free(gfd, va));
	return 0;
}

static int t_bad_exports(void)
{
	uint64_t va, va2;

	CHECK_OK(gs_alloc(gfd, 2 * GPAGE, &va));
	CHECK_OK(gs_alloc(gfd, GPAGE, &va2));
	CHECK_ERR(gs_export(gfd, va + 100, 4096, 0), EINVAL);             /* unaligned address */
	CHECK_ERR(gs_export(gfd, va, 100, 0), EINVAL);                    /* unaligned size */
	CHECK_ERR(gs_export(gfd, va, 0, 0), EINVAL);                      /* empty */
	CHECK_ERR(gs_export(gfd, va, 3 * GPAGE, 0), EINVAL);              /* past the end */
	CHECK_ERR(gs_export(gfd, va, va2 - va + GPAGE, 0), EINVAL);       /* across two allocations */
	CHECK_ERR(gs_export(gfd, va - GPAGE, GPAGE, 0), EINVAL);          /* not allocated */
	CHECK_ERR(gs_export(gfd, va, GPAGE, 0x2), EINVAL);                /* unknown flag */
	CHECK_ERR(gs_export(gfd, va, GPAGE, GPUSIM_EXPORT_FORCE_PCIE), EOPNOTSUPP);
	CHECK_ERR(gs_export(gfd, ~0ULL & ~4095ULL, 8192, 0), EINVAL);     /* wraps */
	CHECK_ERR(ioctl(gfd, GPUSIM_IOC_EXPORT_DMABUF, (void *)16), EFAULT);
	CHECK_OK(gs_free(gfd, va2));
	CHECK_ERR(gs_export(gfd, va2, GPAGE, 0), EINVAL);                 /* freed */
	CHECK_OK(gs_free(gfd, va));
	CHECK(stat_of("active_dmabufs") == 0, "a failed export left a dma-buf");
	return 0;
}

/* dmabuf_mmap=0: mmap fails with ENOTSUPP (524) like driver 580; decided at export time. */
static int t_mmap_refused(void)
{
	uint64_t va;
	int before, after;
	void *p;

	CHECK_OK(alloc_filled(GPAGE, 3, &va));
	CHECK_OK(before = gs_export(gfd, va, GPAGE, 0));
	CHECK_OK(set_mmap_param(0));
	CHECK_OK(after = gs_export(gfd, va, GPAGE, 0));
	errno = 0;
	p = mmap(NULL, GPAGE, PROT_READ | PROT_WRITE, MAP_SHARED, after, 0);
	int e = errno;

	CHECK_OK(set_mmap_param(1));
	CHECK(p == MAP_FAILED && e == ENOTSUPP_KERNEL, "mmap with dmabuf_mmap=0: %p errno %d", p, e);
	/* The export made while mmap was allowed stays mappable. */
	volatile uint64_t *m = map_fd(before, GPAGE, 0);

	CHECK(m, "mmap of the earlier export: %s", strerror(errno));
	CHECK(verify(m, GPAGE, 3, 0) < 0, "earlier export's data");
	munmap((void *)m, GPAGE);
	close(before);
	close(after);
	CHECK_OK(gs_free(gfd, va));
	return 0;
}

/*
 * Freed while exported and mapped: the memory stays (NVIDIA's dma-buf holds its own reference on
 * the memory), data intact, pages not handed to anyone else, returned only when the last
 * reference (fd, then the mapping) goes.
 */
static int t_free_while_mapped(void)
{
	const uint64_t len = 4 * GPAGE;
	long free0, free_exported, held;
	volatile uint64_t *dm, *other;
	uint64_t va, va2, rest;
	int fd;

	free0 = stat_of("free_pages");
	CHECK_OK(alloc_filled(len, 21, &va));
	/* Export the middle two GPU pages only. */
	CHECK_OK(fd = gs_export(gfd, va + GPAGE, 2 * GPAGE, 0));
	dm = map_fd(fd, 2 * GPAGE, 0);
	CHECK(dm, "mmap: %s", strerror(errno));
	CHECK_OK(gs_free(gfd, va));
	free_exported = stat_of("free_pages");
	CHECK(free_exported == free0 - 2, "free pages %ld after freeing, expected %ld (2 held)",
	      free_exported, free0 - 2);
	held = stat_of("dmabuf_pages");
	CHECK(held == 2, "dmabuf_pages %ld", held);
	CHECK(verify(dm, 2 * GPAGE, 21, GPAGE / 8) < 0, "data changed after the allocation was freed");

	/* Everything else there is to allocate: none of it may be the held pages. */
	rest = (uint64_t)free_exported * GPAGE;
	CHECK_OK(gs_alloc(gfd, rest, &va2));
	other = map_fd(gfd, rest, va2);
	CHECK(other, "mmap of the rest of the BAR");
	for (uint64_t i = 0; i < rest / 8; i += GPAGE / 8)
		other[i] = ~0ULL;
	CHECK(verify(dm, 2 * GPAGE, 21, GPAGE / 8) < 0, "a new allocation overwrote held pages");
	munmap((void *)other, rest);
	CHECK_OK(gs_free(gfd, va2));

	/* Still writable, and the fd can go first: the mapping holds the dma-buf. */
	dm[0] = 42;
	close(fd);
	CHECK(stat_of("active_dmabufs") == 1, "dma-buf released while still mapped");
	CHECK(dm[0] == 42 && verify(dm + 1, 2 * GPAGE - 8, 21, GPAGE / 8 + 1) < 0, "data after close");
	munmap((void *)dm, 2 * GPAGE);
	CHECK(stat_of("active_dmabufs") == 0, "dma-buf not released after munmap");
	CHECK(stat_of("free_pages") == free0, "free pages %ld, expected %ld", stat_of("free_pages"), free0);
	return 0;
}

/* The exporting process closes /dev/gpusim and exits; the receiver of the fd still has the memory. */
static int t_exporter_exits(void)
{
	int sv[2], fd = -1, status;
	long free0 = stat_of("free_pages");
	pid_t pid;

	CHECK_OK(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv));
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int g = open(GPUSIM_DEVICE_PATH, O_RDWR), d;
		uint64_t va;
		volatile uint64_t *p;
		char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
		struct iovec io = { .iov_base = "x", .iov_len = 1 };
		struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf,
				    .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);

		if (g < 0 || gs_alloc(g, GPAGE, &va) || !(p = map_fd(g, GPAGE, va)))
			_exit(2);
		fill(p, GPAGE, 31, 0);
		d = gs_export(g, va, GPAGE, 0);
		if (d < 0)
			_exit(3);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &d, sizeof(int));
		_exit(sendmsg(sv[1], &m, 0) == 1 ? 0 : 4);   /* exit frees everything it owned */
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "exporting child status 0x%x", status);
	{
		char b, cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec io = { .iov_base = &b, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf,
				    .msg_controllen = sizeof(cbuf) };

		CHECK(recvmsg(sv[0], &m, 0) == 1, "recvmsg");
		memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
	}
	close(sv[0]);
	close(sv[1]);
	CHECK(stat_of("free_pages") == free0 - 1, "the page went back with its exporter");
	volatile uint64_t *dm = map_fd(fd, GPAGE, 0);

	CHECK(dm, "mmap of the received dma-buf: %s", strerror(errno));
	CHECK(verify(dm, GPAGE, 31, 0) < 0, "data of an exited process's export");
	munmap((void *)dm, GPAGE);
	close(fd);
	CHECK(stat_of("free_pages") == free0, "page not returned");
	return 0;
}

static int dbi_fd(void)
{
	int fd = open(DBI_DEVICE_PATH, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		fprintf(stderr, "# %s: %s (dmabuf_import.ko not loaded?)\n", DBI_DEVICE_PATH, strerror(errno));
	return fd;
}

static int dbi_peek(int ifd, uint32_t slot, uint64_t off, uint64_t *v)
{
	struct dbi_peek pk = { .slot = slot, .offset = off };

	if (ioctl(ifd, DBI_IOC_PEEK, &pk))
		return -1;
	*v = pk.value;
	return 0;
}

/*
 * An importer (a peer device) attaches and maps: addresses inside the BAR, the right bytes behind
 * them, dynamic importers without peer2peer refused; the allocation freed and the fd closed
 * while attached leaves the importer's view intact until it detaches.
 */
static int t_importer(void)
{
	const uint64_t len = 3 * GPAGE;
	struct gpusim_info info;
	struct dbi_import im = { 0 };
	long free0 = stat_of("free_pages");
	uint64_t va, v;
	int ifd, fd;

	CHECK_OK(ifd = dbi_fd());
	CHECK_OK(ioctl(gfd, GPUSIM_IOC_INFO, &info));
	CHECK_OK(alloc_filled(len, 41, &va));
	CHECK_OK(fd = gs_export(gfd, va + 4096, len - 4096, 0));

	im.fd = fd;
	im.mode = DBI_DYNAMIC_NO_P2P;
	CHECK_ERR(ioctl(ifd, DBI_IOC_IMPORT, &im), ENOTSUPP_KERNEL);
	im.mode = DBI_DYNAMIC_P2P;
	CHECK_OK(ioctl(ifd, DBI_IOC_IMPORT, &im));
	CHECK(im.mapped == len - 4096 && im.size == len - 4096, "mapped %llu size %llu",
	      (unsigned long long)im.mapped, (unsigned long long)im.size);
	uint32_t dyn = im.slot;

	im.mode = DBI_STATIC;
	CHECK_OK(ioctl(ifd, DBI_IOC_IMPORT, &im));
	CHECK(!strcmp(im.exp_name, "nv_dmabuf"), "exporter name %s", im.exp_name);
	CHECK(im.nents == 3, "%u scatterlist entries, expected 3 (one per GPU page touched)", im.nents);
	CHECK(im.dma_min >= info.bar_phys && im.dma_max < info.bar_phys + info.bar_size,
	      "DMA addresses 0x%llx..0x%llx outside the BAR", (unsigned long long)im.dma_min,
	      (unsigned long long)im.dma_max);
	CHECK(stat_of("dmabuf_attachments") == 2, "attachments %ld", stat_of("dmabuf_attachments"));
	for (uint64_t off = 0; off < len - 4096; off += 4096 + 8) {
		CHECK_OK(dbi_peek(ifd, im.slot, off, &v));
		CHECK(v == pattern(41, (4096 + off) / 8), "importer reads 0x%" PRIx64 " at 0x%" PRIx64, v, off);
	}
	/* Gone from user space entirely: freed and closed. */
	CHECK_OK(gs_free(gfd, va));
	close(fd);
	CHECK(stat_of("active_dmabufs") == 1, "dma-buf released under its importer");
	CHECK(stat_of("free_pages") == free0 - 3, "pages %ld, expected %ld", stat_of("free_pages"), free0 - 3);
	CHECK_OK(dbi_peek(ifd, im.slot, len - 4096 - 8, &v));
	CHECK(v == pattern(41, len / 8 - 1), "importer's last word after free: 0x%" PRIx64, v);
	CHECK_ERR(dbi_peek(ifd, im.slot, len, &v), EINVAL);
	CHECK_OK(ioctl(ifd, DBI_IOC_RELEASE, &dyn));
	CHECK(stat_of("active_dmabufs") == 1, "released with one attachment left");
	close(ifd);   /* releases the static attachment too */
	CHECK(stat_of("active_dmabufs") == 0 && stat_of("dmabuf_attachments") == 0,
	      "dma-bufs %ld attachments %ld after the importer closed", stat_of("active_dmabufs"),
	      stat_of("dmabuf_attachments"));
	CHECK(stat_of("free_pages") == free0, "pages not returned");
	return 0;
}

/* Exports, mappings and frees racing in threads: nothing leaks, nothing faults. */
struct race_arg {
	uint64_t va;
	int stop;
	int errors;
	int exported;
};

static void *race_exporter(void *p)
{
	struct race_arg *a = p;

	while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
		uint64_t va = __atomic_load_n(&a->va, __ATOMIC_ACQUIRE);
		int fd = gs_export(gfd, va, GPAGE, 0);
		volatile uint64_t *m;

		if (fd < 0) {
			if (errno != EINVAL)
				__atomic_add_fetch(&a->errors, 1, __ATOMIC_RELAXED);
			continue;
		}
		__atomic_add_fetch(&a->exported, 1, __ATOMIC_RELAXED);
		m = map_fd(fd, GPAGE, 0);
		if (!m) {
			__atomic_add_fetch(&a->errors, 1, __ATOMIC_RELAXED);
		} else {
			(void)m[GPAGE / 8 - 1];
			munmap((void *)m, GPAGE);
		}
		close(fd);
	}
	return NULL;
}

static int t_race(void)
{
	struct race_arg a = { 0 };
	long free0 = stat_of("free_pages");
	pthread_t t[2];
	uint64_t va;

	CHECK_OK(gs_alloc(gfd, GPAGE, &va));
	a.va = va;
	for (int i = 0; i < 2; i++)
		CHECK(!pthread_create(&t[i], NULL, race_exporter, &a), "pthread_create");
	for (int i = 0; i < 300; i++) {
		uint64_t nva;

		CHECK_OK(gs_alloc(gfd, GPAGE, &nva));
		__atomic_store_n(&a.va, nva, __ATOMIC_RELEASE);
		usleep(100);   /* let the exporters catch some allocations alive */
		CHECK_OK(gs_free(gfd, va));
		va = nva;
	}
	__atomic_store_n(&a.stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	CHECK_OK(gs_free(gfd, va));
	CHECK(a.errors == 0, "%d unexpected export/mmap errors", a.errors);
	CHECK(a.exported > 0, "no export won a race: the test raced nothing");
	printf("# race: %d exports of allocations being freed\n", a.exported);
	CHECK(stat_of("active_dmabufs") == 0, "dma-bufs left");
	CHECK(stat_of("free_pages") == free0, "pages left");
	return 0;
}

static const struct {
	const char *name;
	int (*fn)(void);
} tests[] = {
	{ "export_file", t_export_file },
	{ "mmap_data", t_mmap_data },
	{ "bad_exports", t_bad_exports },
	{ "mmap_refused", t_mmap_refused },
	{ "free_while_mapped", t_free_while_mapped },
	{ "exporter_exits", t_exporter_exits },
	{ "importer", t_importer },
	{ "race", t_race },
};

int main(int argc, char **argv)
{
	int failed = 0, ran = 0;

	gfd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (gfd < 0) {
		perror(GPUSIM_DEVICE_PATH);
		return 1;
	}
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		bool want = argc < 2;

		for (int j = 1; j < argc; j++)
			want |= !strcmp(argv[j], tests[i].name);
		if (!want)
			continue;
		cur_test = tests[i].name;
		ran++;
		if (tests[i].fn() == 0) {
			printf("ok - %s\n", cur_test);
		} else {
			failed++;
			set_mmap_param(1);
		}
		fflush(stdout);
	}
	if (ran == 0) {
		fprintf(stderr, "no test matched\n");
		return 2;
	}
	printf("dmabuf_test: %d of %d failed\n", failed, ran);
	return failed ? 1 : 0;
}
