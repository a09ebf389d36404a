// SPDX-License-Identifier: MIT
/*
 * gpusim_test - exercises /dev/gpusim (and, when p2ptest.ko is loaded, gpusim's nvidia_p2p_*
 * exports through /dev/gpusim_p2ptest) inside the test VM.
 *
 *   gpusim_test            run every test
 *   gpusim_test NAME...    run the named tests (see the table at the bottom)
 *
 * Prints "ok - NAME" / "not ok - NAME: reason" per test and exits non-zero if any failed.
 * Tests that need p2ptest are skipped with a message when its device node is missing.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpusim_uapi.h"
#include "p2ptest.h"
#include "../lib/check.h"

#define GPAGE 0x10000ULL

static int failures;
static const char *cur_test;

static int gs_open(void)
{
	return open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
}

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

static int gs_info(int fd, struct gpusim_info *info)
{
	memset(info, 0xa5, sizeof(*info));
	return ioctl(fd, GPUSIM_IOC_INFO, info);
}

static void *gs_map(int fd, uint64_t va, uint64_t len)
{
	return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)va);
}

static uint64_t pattern(uint64_t seed, uint64_t i)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ULL + i;

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	return x ^ (x >> 29);
}

static void fill(volatile uint64_t *p, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len / 8; i++)
		p[i] = pattern(seed, i);
}

/* index of the first mismatching word, or -1 */
static long verify(volatile uint64_t *p, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len / 8; i++)
		if (p[i] != pattern(seed, i))
			return (long)i;
	return -1;
}

/* Free bytes when this test started: other tests' leftovers would show up as a mismatch. */
static uint64_t free_now(void)
{
	struct gpusim_info info;
	int fd = gs_open();
	uint64_t r = 0;

	if (fd >= 0 && gs_info(fd, &info) == 0)
		r = info.free_bytes;
	if (fd >= 0)
		close(fd);
	return r;
}

static uint64_t pins_now(void)
{
	struct gpusim_info info;
	int fd = gs_open();
	uint64_t r = ~0ULL;

	if (fd >= 0 && gs_info(fd, &info) == 0)
		r = info.active_pins;
	if (fd >= 0)
		close(fd);
	return r;
}

/* A counter from /sys/kernel/debug/gpusim/stats, or ~0 if unreadable. */
static uint64_t stat_now(const char *key)
{
	char line[256];
	uint64_t r = ~0ULL;
	size_t kl = strlen(key);
	FILE *f = fopen("/sys/kernel/debug/gpusim/stats", "r");

	if (!f)
		return r;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, kl) == 0 && line[kl] == ':')
			r = strtoull(line + kl + 1, NULL, 0);
	fclose(f);
	return r;
}

/* ------------------------------------------------------------------------------ tests --- */

static int t_info(void)
{
	struct gpusim_info info;
	int fd = gs_open();

	CHECK(fd >= 0, "open: %s", strerror(errno));
	CHECK_OK(gs_info(fd, &info));
	CHECK(info.bar_size >= 16 * GPAGE && info.bar_size % GPAGE == 0, "bar_size 0x%llx",
	      (unsigned long long)info.bar_size);
	CHECK(info.bar_phys != 0 && info.bar_phys % GPAGE == 0, "bar_phys 0x%llx",
	      (unsigned long long)info.bar_phys);
	CHECK(info.free_bytes == info.bar_size, "free 0x%llx of 0x%llx at start (leak?)",
	      (unsigned long long)info.free_bytes, (unsigned long long)info.bar_size);
	CHECK(info.active_pins == 0, "active_pins %llu", (unsigned long long)info.active_pins);
	CHECK(info.pci_function < 8 && info.pci_device < 32, "bdf %u:%u.%u", info.pci_bus,
	      info.pci_device, info.pci_function);
	/* the PCI address reported must be an ivshmem device in sysfs */
	char path[128], buf[32] = "";
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x/device",
		 info.pci_domain, info.pci_bus, info.pci_device, info.pci_function);
	FILE *f = fopen(path, "r");
	CHECK(f, "%s: %s", path, strerror(errno));
	CHECK(fgets(buf, sizeof(buf), f), "read %s", path);
	fclose(f);
	CHECK(strncmp(buf, "0x1110", 6) == 0, "device id %s", buf);
	close(fd);
	return 0;
}

static int t_alloc_free(void)
{
	struct gpusim_info info;
	uint64_t va, va2, before;
	int fd = gs_open();

	CHECK(fd >= 0, "open: %s", strerror(errno));
	before = free_now();
	CHECK_OK(gs_alloc(fd, 1, &va));
	CHECK(va % GPAGE == 0 && va >= GPUSIM_VA_BASE && va < GPUSIM_VA_BASE + GPUSIM_VA_SPAN,
	      "va 0x%llx", (unsigned long long)va);
	CHECK_OK(gs_info(fd, &info));
	CHECK(info.free_bytes == before - GPAGE, "1 byte must take one 64 KiB page");

	struct gpusim_query q = { .gpu_va = va + 123 };
	CHECK_OK(ioctl(fd, GPUSIM_IOC_QUERY, &q));
	CHECK(q.base == va && q.size == GPAGE, "query base 0x%llx size 0x%llx",
	      (unsigned long long)q.base, (unsigned long long)q.size);

	CHECK_OK(gs_alloc(fd, 3 * GPAGE + 1, &va2));
	CHECK(va2 != va && (va2 >= va + GPAGE || va2 + 4 * GPAGE <= va), "overlapping VAs");
	q.gpu_va = va2 + 4 * GPAGE - 1;
	CHECK_OK(ioctl(fd, GPUSIM_IOC_QUERY, &q));
	CHECK(q.base == va2 && q.size == 4 * GPAGE, "query of last byte");
	q.gpu_va = va2 + 4 * GPAGE;
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_QUERY, &q), EINVAL);

	CHECK_ERR(gs_free(fd, va2 + GPAGE), EINVAL);   /* not the start */
	CHECK_OK(gs_free(fd, va2));
	CHECK_ERR(gs_free(fd, va2), EINVAL);           /* double free */
	q.gpu_va = va2;
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_QUERY, &q), EINVAL);
	CHECK_OK(gs_free(fd, va));

	/* VAs are never reused */
	uint64_t va3;
	CHECK_OK(gs_alloc(fd, GPAGE, &va3));
	CHECK(va3 != va && va3 != va2, "VA reused");
	CHECK_OK(gs_free(fd, va3));
	CHECK(free_now() == before, "free bytes not restored");
	close(fd);
	return 0;
}

static int t_bad_ioctls(void)
{
	struct gpusim_info info;
	uint64_t va, before = free_now();
	int fd = gs_open();

	CHECK(fd >= 0, "open: %s", strerror(errno));
	CHECK_ERR(ioctl(fd, _IOWR(GPUSIM_IOC_MAGIC, 99, struct gpusim_alloc), &info), ENOTTY);
	CHECK_ERR(ioctl(fd, _IOWR('x', 1, struct gpusim_alloc), &info), ENOTTY);
	CHECK_ERR(ioctl(fd, _IOR(GPUSIM_IOC_MAGIC, 3, uint32_t), &info), ENOTTY); /* wrong size */
	CHECK_ERR(ioctl(fd, 0, 0), ENOTTY);

	struct gpusim_alloc a = { .size = 0 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), EINVAL);
	a = (struct gpusim_alloc){ .size = GPAGE, .flags = 2 };   /* unknown flag */
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), EINVAL);
	a = (struct gpusim_alloc){ .size = GPAGE, .flags = ~0ULL };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), EINVAL);
	struct gpusim_invalidate inv = { .gpu_va = GPUSIM_VA_BASE - GPAGE, .size = 8 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_INVALIDATE, &inv), EINVAL);   /* no allocation there */
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_INVALIDATE, NULL), EFAULT);
	a = (struct gpusim_alloc){ .size = ~0ULL };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), EINVAL);
	a = (struct gpusim_alloc){ .size = ~0ULL - 2 * GPAGE };   /* rounds fine, but too big */
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), ENOMEM);
	CHECK_OK(gs_info(fd, &info));
	a = (struct gpusim_alloc){ .size = info.bar_size + 1 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, &a), ENOMEM);

	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, (void *)8), EFAULT);
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_INFO, NULL), EFAULT);
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_QUERY, (void *)-4096L), EFAULT);
	/* ALLOC whose result cannot be written back must not leak the allocation */
	int mfd = memfd_create("alloc-arg", MFD_CLOEXEC);
	CHECK(mfd >= 0, "memfd_create: %s", strerror(errno));
	struct gpusim_alloc ra = { .size = GPAGE };
	CHECK(write(mfd, &ra, sizeof(ra)) == sizeof(ra), "write");
	void *ro = mmap(NULL, 4096, PROT_READ, MAP_SHARED, mfd, 0);
	CHECK(ro != MAP_FAILED, "mmap");
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_ALLOC, ro), EFAULT);
	CHECK(free_now() == before, "ALLOC failing with EFAULT leaked the allocation");
	munmap(ro, 4096);
	close(mfd);

	CHECK_ERR(gs_free(fd, 0), EINVAL);
	CHECK_ERR(gs_free(fd, GPUSIM_VA_BASE + 12345 * GPAGE), EINVAL);
	CHECK_ERR(gs_free(fd, ~0ULL), EINVAL);
	struct gpusim_query q = { .gpu_va = 0x1000 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_QUERY, &q), EINVAL);

	/* mmap errors */
	CHECK_OK(gs_alloc(fd, 2 * GPAGE, &va));
	CHECK(gs_map(fd, va + 0x123000, 4096) == MAP_FAILED && errno == EINVAL, "mmap past end");
	CHECK(gs_map(fd, va, 3 * GPAGE) == MAP_FAILED && errno == EINVAL, "mmap longer than alloc");
	CHECK(gs_map(fd, GPUSIM_VA_BASE - GPAGE, 4096) == MAP_FAILED && errno == EINVAL,
	      "mmap unknown");
	CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)va) == MAP_FAILED &&
	      errno == EINVAL, "MAP_PRIVATE must be refused");
	CHECK_OK(gs_free(fd, va));
	close(fd);
	CHECK(free_now() == before, "leak after bad ioctls");
	return 0;
}

static int t_mmap_two_mappings(void)
{
	const uint64_t len = 8 * GPAGE;
	uint64_t va, before = free_now();
	int fd = gs_open();
	int fd2 = gs_open();   /* a second file of the same process shares its address space */

	CHECK(fd >= 0 && fd2 >= 0, "open: %s", strerror(errno));
	CHECK_OK(gs_alloc(fd, len, &va));
	volatile uint64_t *m1 = gs_map(fd, va, len);
	CHECK(m1 != MAP_FAILED, "mmap 1: %s", strerror(errno));
	volatile uint64_t *m2 = gs_map(fd2, va, len);
	CHECK(m2 != MAP_FAILED, "mmap 2: %s", strerror(errno));
	CHECK(m1 != m2, "distinct mappings");
	fill(m1, len, 1);
	long bad = verify(m2, len, 1);
	CHECK(bad < 0, "word %ld differs across mappings", bad);
	fill(m2, len, 2);
	CHECK(verify(m1, len, 2) < 0, "writes through mapping 2 not seen in 1");

	/* a sub-range at an offset inside the allocation sees the same bytes */
	volatile uint64_t *sub = gs_map(fd, va + 3 * GPAGE + 4096, 2 * GPAGE);
	CHECK(sub != MAP_FAILED, "sub mmap: %s", strerror(errno));
	CHECK(sub[0] == pattern(2, (3 * GPAGE + 4096) / 8), "sub-range content");
	sub[5] = 0x1122334455667788ULL;
	CHECK(m1[(3 * GPAGE + 4096) / 8 + 5] == 0x1122334455667788ULL, "sub-range write");
	munmap((void *)sub, 2 * GPAGE);

	/* data survives unmap and remap (it lives in the BAR, not in the mapping) */
	fill(m1, len, 3);
	munmap((void *)m1, len);
	m1 = gs_map(fd, va, len);
	CHECK(m1 != MAP_FAILED, "remap");
	CHECK(verify(m1, len, 3) < 0, "data lost across remap");

	/* another allocation does not alias this one */
	uint64_t vb;
	CHECK_OK(gs_alloc(fd, len, &vb));
	volatile uint64_t *mb = gs_map(fd, vb, len);
	CHECK(mb != MAP_FAILED, "mmap b");
	fill(mb, len, 4);
	CHECK(verify(m1, len, 3) < 0, "allocations alias");
	munmap((void *)mb, len);
	munmap((void *)m1, len);
	munmap((void *)m2, len);
	CHECK_OK(gs_free(fd, vb));
	CHECK_OK(gs_free(fd2, va));   /* either file of the process may free */
	close(fd);
	close(fd2);
	CHECK(free_now() == before, "leak");
	return 0;
}

static sigjmp_buf jb;
static volatile sig_atomic_t got_sig;

static void on_sig(int sig)
{
	got_sig = sig;
	siglongjmp(jb, 1);
}

/* Reads *p; returns the signal it raised, or 0. */
static int probe_read(volatile uint64_t *p)
{
	struct sigaction sa = { .sa_handler = on_sig }, obus, osegv;

	got_sig = 0;
	sigaction(SIGBUS, &sa, &obus);
	sigaction(SIGSEGV, &sa, &osegv);
	if (sigsetjmp(jb, 1) == 0)
		(void)*p;
	sigaction(SIGBUS, &obus, NULL);
	sigaction(SIGSEGV, &osegv, NULL);
	return got_sig;
}

static int t_free_zaps_mapping(void)
{
	uint64_t va, before = free_now();
	int fd = gs_open();

	CHECK(fd >= 0, "open");
	CHECK_OK(gs_alloc(fd, 4 * GPAGE, &va));
	volatile uint64_t *m = gs_map(fd, va, 4 * GPAGE);
	CHECK(m != MAP_FAILED, "mmap");
	m[0] = 42;
	CHECK(probe_read(m) == 0, "live mapping faulted");
	CHECK_OK(gs_free(fd, va));
	CHECK(probe_read(m) == SIGBUS, "access after free: signal %d, expected SIGBUS", got_sig);
	CHECK(probe_read(m + 3 * GPAGE / 8) == SIGBUS, "untouched page after free");
	munmap((void *)m, 4 * GPAGE);
	/* mapping a freed allocation is refused */
	CHECK(gs_map(fd, va, GPAGE) == MAP_FAILED && errno == EINVAL, "mmap after free");
	close(fd);
	CHECK(free_now() == before, "leak");
	return 0;
}

static int t_fork(void)
{
	uint64_t va, before = free_now();
	int fd = gs_open();

	CHECK(fd >= 0, "open");
	CHECK_OK(gs_alloc(fd, 2 * GPAGE, &va));
	volatile uint64_t *m = gs_map(fd, va, 2 * GPAGE);
	CHECK(m != MAP_FAILED, "mmap");
	fill(m, 2 * GPAGE, 7);

	int pfd[2];
	CHECK_OK(pipe(pfd));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		/* child: codes name the first check that failed */
		struct gpusim_info info;
		uint64_t cva;
		int code = 0;

		if (probe_read(m) != SIGSEGV)          /* mappings are not inherited */
			code = 1;
		else if (!(gs_info(fd, &info) == -1 && errno == EACCES))  /* parent's file */
			code = 2;
		else if (!(gs_free(fd, va) == -1 && errno == EACCES))
			code = 3;
		else if (gs_map(fd, va, GPAGE) != MAP_FAILED || errno != EACCES)
			code = 4;
		if (!code) {
			int cfd = gs_open();   /* own address space */
			struct gpusim_query q = { .gpu_va = va };

			if (cfd < 0)
				code = 5;
			else if (!(ioctl(cfd, GPUSIM_IOC_QUERY, &q) == -1 && errno == EINVAL))
				code = 6;   /* parent's VA is not in the child's space */
			else if (gs_alloc(cfd, 4 * GPAGE, &cva))
				code = 7;
			else {
				volatile uint64_t *cm = gs_map(cfd, cva, 4 * GPAGE);

				if (cm == MAP_FAILED)
					code = 8;
				else
					fill(cm, 4 * GPAGE, 8);
				/* exit without freeing: teardown must reclaim it */
			}
		}
		if (write(pfd[1], &code, sizeof(code)) != sizeof(code))
			_exit(99);
		_exit(code);
	}
	close(pfd[1]);
	int status, code = -1;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(read(pfd[0], &code, sizeof(code)) == sizeof(code), "child reported nothing");
	close(pfd[0]);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed check %d (status 0x%x)",
	      code, status);
	CHECK(verify(m, 2 * GPAGE, 7) < 0, "parent data changed by child");
	CHECK(free_now() == before - 2 * GPAGE, "child's allocation not reclaimed at exit");
	munmap((void *)m, 2 * GPAGE);
	CHECK_OK(gs_free(fd, va));
	close(fd);
	CHECK(free_now() == before, "leak");
	return 0;
}

/* An inherited fd keeps the parent's space alive after the parent closed its copy. */
static int t_close_frees(void)
{
	uint64_t va, before = free_now();
	int fd = gs_open();

	CHECK(fd >= 0, "open");
	CHECK_OK(gs_alloc(fd, 16 * GPAGE, &va));
	int fd2 = dup(fd);
	close(fd);
	CHECK(free_now() == before - 16 * GPAGE, "dup'ed fd must keep allocations");
	close(fd2);
	CHECK(free_now() == before, "last close must free allocations");
	return 0;
}

static int t_exhaust(void)
{
	struct gpusim_info info;
	int fd = gs_open();
	uint64_t *vas, n = 0, va, chunk = 16 * GPAGE;

	CHECK(fd >= 0, "open");
	CHECK_OK(gs_info(fd, &info));
	vas = calloc(info.bar_size / chunk + 2, sizeof(*vas));
	CHECK(vas, "calloc");
	while (gs_alloc(fd, chunk, &va) == 0)
		vas[n++] = va;
	CHECK(errno == ENOMEM, "exhaustion errno %d", errno);
	CHECK(n == info.free_bytes / chunk, "got %llu chunks of %llu", (unsigned long long)n,
	      (unsigned long long)(info.free_bytes / chunk));
	CHECK(free_now() == 0, "pool should be empty");
	CHECK_ERR(gs_alloc(fd, 1, &va), ENOMEM);
	/* free every other chunk, then allocate across the holes: pages need not be contiguous */
	for (uint64_t i = 0; i < n; i += 2)
		CHECK_OK(gs_free(fd, vas[i]));
	uint64_t big = ((n + 1) / 2) * chunk;
	CHECK_OK(gs_alloc(fd, big, &va));
	volatile uint64_t *m = gs_map(fd, va, big);
	CHECK(m != MAP_FAILED, "mmap fragmented allocation");
	fill(m, big, 9);
	CHECK(verify(m, big, 9) < 0, "fragmented allocation data");
	munmap((void *)m, big);
	CHECK_OK(gs_free(fd, va));
	for (uint64_t i = 1; i < n; i += 2)
		CHECK_OK(gs_free(fd, vas[i]));
	free(vas);
	close(fd);
	CHECK(free_now() == info.free_bytes, "leak");
	return 0;
}

/* --- many processes and threads ---------------------------------------------------------- */

struct worker_arg {
	int fd;
	unsigned seed;
	int iters;
	int err;
};

static void *worker(void *p)
{
	struct worker_arg *w = p;

	for (int i = 0; i < w->iters && !w->err; i++) {
		uint64_t size = ((rand_r(&w->seed) % (32 * GPAGE)) + 1), va;
		uint64_t len = (size + GPAGE - 1) & ~(GPAGE - 1);

		if (gs_alloc(w->fd, size, &va)) {
			if (errno == ENOMEM)
				continue;   /* other workers hold the pool */
			w->err = 1;
			break;
		}
		volatile uint64_t *m = gs_map(w->fd, va, len);
		if (m == MAP_FAILED) {
			w->err = 2;
			break;
		}
		fill(m, len, va ^ w->seed);
		if (verify(m, len, va ^ w->seed) >= 0)
			w->err = 3;
		munmap((void *)m, len);
		if (gs_free(w->fd, va))
			w->err = 4;
	}
	return NULL;
}

static int run_workers(int nthreads, int iters, unsigned seed)
{
	pthread_t th[16];
	struct worker_arg wa[16];
	int fd = gs_open(), err = 0;

	if (fd < 0)
		return 10;
	for (int t = 0; t < nthreads; t++) {
		wa[t] = (struct worker_arg){ .fd = fd, .seed = seed * 31 + t, .iters = iters };
		if (pthread_create(&th[t], NULL, worker, &wa[t]))
			return 11;
	}
	for (int t = 0; t < nthreads; t++) {
		pthread_join(th[t], NULL);
		if (wa[t].err && !err)
			err = wa[t].err;
	}
	close(fd);
	return err;
}

static int t_many_processes(void)
{
	const int nproc = 8;
	uint64_t before = free_now();
	pid_t pids[8];

	for (int i = 0; i < nproc; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0, "fork");
		if (pids[i] == 0)
			_exit(run_workers(i % 2 ? 4 : 1, 40, (unsigned)getpid()));
	}
	int bad = 0;
	for (int i = 0; i < nproc; i++) {
		int st;

		CHECK(waitpid(pids[i], &st, 0) == pids[i], "waitpid");
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad = bad ? bad : st;
	}
	CHECK(!bad, "a worker failed (status 0x%x)", bad);
	CHECK(free_now() == before, "leak after parallel workers");

	/* processes killed in the middle of their work are cleaned up too */
	for (int i = 0; i < nproc; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0, "fork");
		if (pids[i] == 0)
			_exit(run_workers(2, 1000000, (unsigned)getpid()));
	}
	usleep(300000);
	for (int i = 0; i < nproc; i++)
		kill(pids[i], SIGKILL);
	for (int i = 0; i < nproc; i++)
		waitpid(pids[i], NULL, 0);
	CHECK(free_now() == before, "leak after killed workers");
	return 0;
}

/* --- nvidia_p2p_* through p2ptest.ko ------------------------------------------------------ */

/* Wait for the child pid, which must exit with status 0. */
static int wait_child_ok(pid_t pid)
{
	int status;

	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
	return 0;
}

static int p2p_fd(void)
{
	return open(P2PT_DEVICE_PATH, O_RDWR | O_CLOEXEC);
}

static int p2p_pin(int pfd, uint64_t va, uint64_t len, uint32_t mode, uint32_t *slot)
{
	struct p2pt_pin p = { .va = va, .len = len, .mode = mode };
	int r = ioctl(pfd, P2PT_IOC_PIN, &p);

	if (r == 0 && slot)
		*slot = p.slot;
	return r;
}

static int p2p_status(int pfd, uint32_t slot, struct p2pt_status *st)
{
	memset(st, 0, sizeof(*st));
	st->slot = slot;
	return ioctl(pfd, P2PT_IOC_STATUS, st);
}

static int p2p_peek(int pfd, uint32_t slot, uint64_t off, uint64_t *val)
{
	struct p2pt_peek pk = { .slot = slot, .offset = off };
	int r = ioctl(pfd, P2PT_IOC_PEEK, &pk);

	*val = pk.value;
	return r;
}

static int p2p_poke(int pfd, uint32_t slot, uint64_t off, uint64_t val)
{
	struct p2pt_peek pk = { .slot = slot, .offset = off, .value = val };

	return ioctl(pfd, P2PT_IOC_POKE, &pk);
}

static int p2p_unpin(int pfd, uint32_t slot)
{
	return ioctl(pfd, P2PT_IOC_UNPIN, &slot);
}

/* gpusim's scatter_pages parameter: consecutive GPU pages are never physically adjacent */
static bool scatter_mode(void)
{
	char c = 'N';
	FILE *f = fopen("/sys/module/gpusim/parameters/scatter_pages", "r");

	if (f) {
		if (fread(&c, 1, 1, f) != 1)
			c = 'N';
		fclose(f);
	}
	return c == 'Y' || c == '1';
}

static bool have_p2ptest(void)
{
	if (access(P2PT_DEVICE_PATH, F_OK) == 0)
		return true;
	printf("# skipped: %s missing (load kmod/gpusim/test/p2ptest.ko)\n", P2PT_DEVICE_PATH);
	return false;
}

static int t_p2p_get_put(void)
{
	if (!have_p2ptest())
		return 0;
	const uint64_t len = 16 * GPAGE;
	struct gpusim_info info;
	struct p2pt_status st;
	uint64_t va, v;
	uint32_t slot = 0;
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK_OK(gs_info(fd, &info));
	CHECK_OK(gs_alloc(fd, len, &va));
	volatile uint64_t *m = gs_map(fd, va, len);
	CHECK(m != MAP_FAILED, "mmap");
	fill(m, len, 11);

	CHECK_OK(p2p_pin(pfd, va, len, P2PT_MODE_GET_PAGES, &slot));
	CHECK(pins_now() == 1, "active_pins %llu", (unsigned long long)pins_now());
	CHECK_OK(p2p_status(pfd, slot, &st));
	CHECK(st.pinned && !st.cb_fired, "state");
	CHECK(st.version == 0x00020000, "page table version 0x%x", st.version);
	CHECK(st.page_size == 1 /* NVIDIA_P2P_PAGE_SIZE_64KB */, "page_size %u", st.page_size);
	CHECK(st.entries == 16, "entries %u", st.entries);
	CHECK(st.flags == 0, "flags 0x%x (BAR memory is not CPU-cacheable)", st.flags);
	CHECK(st.uuid_nonzero, "gpu_uuid is all zero");
	if (scatter_mode())
		CHECK(!st.contiguous, "scatter_pages=1 but the pages are physically contiguous");
	CHECK(st.phys_min >= info.bar_phys && st.phys_max + GPAGE <= info.bar_phys + info.bar_size,
	      "page addresses 0x%llx..0x%llx outside the BAR", (unsigned long long)st.phys_min,
	      (unsigned long long)st.phys_max);
	/* the page table's addresses hold exactly what the simulated GPU's mapping holds */
	for (uint64_t off = 0; off < len; off += GPAGE / 2 + 8) {
		off &= ~7ULL;
		CHECK_OK(p2p_peek(pfd, slot, off, &v));
		CHECK(v == pattern(11, off / 8), "BAR read at 0x%llx", (unsigned long long)off);
	}
	CHECK_OK(p2p_poke(pfd, slot, 5 * GPAGE + 64, 0xfeedfacecafebeefULL));
	CHECK(m[(5 * GPAGE + 64) / 8] == 0xfeedfacecafebeefULL, "BAR write not visible in mapping");
	CHECK_ERR(p2p_peek(pfd, slot, len, &v), EINVAL);

	/* a sub-range pin */
	uint32_t s2 = 0;
	CHECK_OK(p2p_pin(pfd, va + 4 * GPAGE, 2 * GPAGE, P2PT_MODE_GET_PAGES, &s2));
	CHECK_OK(p2p_peek(pfd, s2, 8, &v));
	CHECK(v == pattern(11, 4 * GPAGE / 8 + 1), "sub-range pin data");
	CHECK(pins_now() == 2, "two pins");
	CHECK(p2p_unpin(pfd, s2) == 0, "put_pages");
	CHECK(p2p_unpin(pfd, slot) == 0, "put_pages");
	CHECK(pins_now() == 0, "pins after put");
	CHECK_ERR(p2p_unpin(pfd, slot), EINVAL);

	CHECK_OK(ioctl(pfd, P2PT_IOC_SELFTEST));
	munmap((void *)m, len);
	CHECK_OK(gs_free(fd, va));
	close(pfd);
	close(fd);
	return 0;
}

static int t_p2p_bad_args(void)
{
	if (!have_p2ptest())
		return 0;
	uint64_t va, vb;
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK_OK(gs_alloc(fd, 4 * GPAGE, &va));
	CHECK_OK(gs_alloc(fd, 4 * GPAGE, &vb));
	CHECK_ERR(p2p_pin(pfd, va + 4096, GPAGE, P2PT_MODE_GET_PAGES, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, GPAGE + 4096, P2PT_MODE_GET_PAGES, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, 0, P2PT_MODE_GET_PAGES, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, 5 * GPAGE, P2PT_MODE_GET_PAGES, NULL), EINVAL);  /* overruns */
	CHECK_ERR(p2p_pin(pfd, va + GPAGE, 4 * GPAGE, P2PT_MODE_PERSISTENT, NULL), EINVAL);
	uint64_t lo = va < vb ? va : vb, hi = va < vb ? vb : va;
	CHECK_ERR(p2p_pin(pfd, lo, hi + 4 * GPAGE - lo, P2PT_MODE_GET_PAGES, NULL), EINVAL); /* spans two */
	CHECK_ERR(p2p_pin(pfd, GPUSIM_VA_BASE - GPAGE, GPAGE, P2PT_MODE_GET_PAGES, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, 0xffffffffffff0000ULL, 2 * GPAGE, P2PT_MODE_PERSISTENT, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, GPAGE, P2PT_MODE_NULL_CALLBACK, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, GPAGE, P2PT_MODE_TOKEN, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, GPAGE, P2PT_MODE_BAD_FLAGS, NULL), EINVAL);
	CHECK_ERR(p2p_pin(pfd, va, GPAGE, P2PT_MODE_NULL_TABLE, NULL), EINVAL);
	CHECK(pins_now() == 0, "failed pins left pins behind");
	CHECK_OK(gs_free(fd, va));
	CHECK_ERR(p2p_pin(pfd, va, GPAGE, P2PT_MODE_GET_PAGES, NULL), EINVAL);     /* freed */
	CHECK_OK(gs_free(fd, vb));
	close(pfd);
	close(fd);
	return 0;
}

static int t_p2p_callback_on_free(void)
{
	if (!have_p2ptest())
		return 0;
	uint64_t va, before = free_now();
	struct p2pt_status st;
	uint32_t slot = 0, slot2 = 0;
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK_OK(gs_alloc(fd, 4 * GPAGE, &va));
	CHECK_OK(p2p_pin(pfd, va, 4 * GPAGE, P2PT_MODE_GET_PAGES, &slot));
	CHECK_OK(p2p_pin(pfd, va + GPAGE, GPAGE, P2PT_MODE_GET_PAGES, &slot2));
	CHECK(pins_now() == 2, "pins");
	CHECK_OK(gs_free(fd, va));
	CHECK_OK(p2p_status(pfd, slot, &st));
	CHECK(st.cb_fired && !st.pinned, "callback did not run on free");
	CHECK_OK(p2p_status(pfd, slot2, &st));
	CHECK(st.cb_fired && !st.pinned, "second callback did not run on free");
	CHECK(pins_now() == 0, "pins after callbacks: %llu", (unsigned long long)pins_now());
	CHECK(free_now() == before, "pages not released after callbacks");
	CHECK(p2p_unpin(pfd, slot) == 1, "unpin after callback must not put pages");
	CHECK(p2p_unpin(pfd, slot2) == 1, "unpin after callback must not put pages");

	/* process teardown: the owner exits while pinned -> callback runs */
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int cfd = gs_open(), cpfd = p2p_fd();
		uint64_t cva;
		uint32_t s;

		if (cfd < 0 || cpfd < 0 || gs_alloc(cfd, 8 * GPAGE, &cva) ||
		    p2p_pin(cpfd, cva, 8 * GPAGE, P2PT_MODE_GET_PAGES, &s))
			_exit(1);
		/* close the GPU first so the callback fires while the pin is held */
		close(cfd);
		struct p2pt_status cst;
		if (p2p_status(cpfd, s, &cst) || !cst.cb_fired)
			_exit(2);
		_exit(0);
	}
	if (wait_child_ok(pid))
		return -1;
	CHECK(pins_now() == 0 && free_now() == before, "teardown leak");

	/* a child exiting with pins and GPU memory in any order leaves nothing behind */
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int cpfd = p2p_fd(), cfd = gs_open();   /* p2p file closes first at exit */
		uint64_t cva;

		if (cfd < 0 || cpfd < 0 || gs_alloc(cfd, 8 * GPAGE, &cva) ||
		    p2p_pin(cpfd, cva, 8 * GPAGE, P2PT_MODE_GET_PAGES, NULL) ||
		    p2p_pin(cpfd, cva, 8 * GPAGE, P2PT_MODE_PERSISTENT, NULL))
			_exit(1);
		_exit(0);
	}
	if (wait_child_ok(pid))
		return -1;
	CHECK(pins_now() == 0 && free_now() == before, "teardown leak (2)");
	close(pfd);
	close(fd);
	return 0;
}

/* GPUSIM_ALLOC_ALIGN_2M: a 2 MiB-aligned VA, but only the rounded size in BAR pages. */
static int t_alloc_align_2m(void)
{
	uint64_t before = free_now(), va[3];
	int fd = gs_open();

	CHECK(fd >= 0, "open");
	for (int i = 0; i < 3; i++) {
		struct gpusim_alloc a = { .size = GPAGE + 1 };

		if (i == 1)
			a.flags = GPUSIM_ALLOC_ALIGN_2M;
		CHECK_OK(ioctl(fd, GPUSIM_IOC_ALLOC, &a));
		va[i] = a.gpu_va;
	}
	CHECK(va[1] % (2ULL << 20) == 0, "va 0x%llx not 2 MiB aligned", (unsigned long long)va[1]);
	CHECK(va[1] > va[0] && va[2] > va[1] + 2 * GPAGE, "VAs overlap or go backwards");
	CHECK(free_now() == before - 6 * GPAGE, "2 pages per allocation expected");
	volatile uint64_t *m = gs_map(fd, va[1], 2 * GPAGE);
	CHECK(m != MAP_FAILED, "mmap of the aligned allocation: %s", strerror(errno));
	fill(m, 2 * GPAGE, 5);
	CHECK(verify(m, 2 * GPAGE, 5) < 0, "data");
	munmap((void *)m, 2 * GPAGE);
	for (int i = 0; i < 3; i++)
		CHECK_OK(gs_free(fd, va[i]));
	CHECK(free_now() == before, "pages not returned");
	close(fd);
	return 0;
}

/*
 * GPUSIM_IOC_INVALIDATE: the non-persistent pins overlapping the range get their callback, the
 * others (disjoint or persistent) stay; the allocation, its data and its mapping stay.
 */
static int t_p2p_invalidate(void)
{
	if (!have_p2ptest())
		return 0;
	const uint64_t len = 4 * GPAGE;
	uint64_t va, v, before = free_now();
	struct p2pt_status st;
	uint32_t s0 = 0, s23 = 0, sp = 0, s1 = 0;
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK_OK(gs_alloc(fd, len, &va));
	volatile uint64_t *m = gs_map(fd, va, len);
	CHECK(m != MAP_FAILED, "mmap");
	fill(m, len, 33);
	CHECK_OK(p2p_pin(pfd, va, GPAGE, P2PT_MODE_GET_PAGES, &s0));
	CHECK_OK(p2p_pin(pfd, va + GPAGE, GPAGE, P2PT_MODE_GET_PAGES, &s1));
	CHECK_OK(p2p_pin(pfd, va + 2 * GPAGE, 2 * GPAGE, P2PT_MODE_GET_PAGES, &s23));
	CHECK_OK(p2p_pin(pfd, va, len, P2PT_MODE_PERSISTENT, &sp));
	CHECK(pins_now() == 4, "pins");

	struct gpusim_invalidate inv = { .gpu_va = va + 256, .size = 0 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_INVALIDATE, &inv), EINVAL);       /* size 0 */
	inv = (struct gpusim_invalidate){ .gpu_va = va + len - 256, .size = 512 };
	CHECK_ERR(ioctl(fd, GPUSIM_IOC_INVALIDATE, &inv), EINVAL);       /* past the allocation */
	CHECK(pins_now() == 4, "a refused invalidation touched pins");

	/* 256 bytes inside page 0, then bytes straddling pages 1 and 2 (the end is exclusive). */
	inv = (struct gpusim_invalidate){ .gpu_va = va + 256, .size = 256 };
	CHECK_OK(ioctl(fd, GPUSIM_IOC_INVALIDATE, &inv));
	CHECK_OK(p2p_status(pfd, s0, &st));
	CHECK(st.cb_fired && !st.pinned, "overlapping pin not invalidated");
	CHECK_OK(p2p_status(pfd, s1, &st));
	CHECK(st.pinned && !st.cb_fired, "disjoint pin invalidated");
	CHECK_OK(p2p_status(pfd, sp, &st));
	CHECK(st.pinned && !st.cb_fired, "persistent pin invalidated");
	CHECK(pins_now() == 3, "pins after the first invalidation: %llu", (unsigned long long)pins_now());
	inv = (struct gpusim_invalidate){ .gpu_va = va + 2 * GPAGE - 8, .size = 8 };
	CHECK_OK(ioctl(fd, GPUSIM_IOC_INVALIDATE, &inv));
	CHECK_OK(p2p_status(pfd, s1, &st));
	CHECK(st.cb_fired && !st.pinned, "pin of page 1 not invalidated");
	CHECK_OK(p2p_status(pfd, s23, &st));
	CHECK(st.pinned && !st.cb_fired, "pin starting at the range's end invalidated");

	/* Nothing was freed: data through the mapping and the remaining pins, same page count. */
	CHECK(verify(m, len, 33) < 0, "data changed by an invalidation");
	CHECK_OK(p2p_peek(pfd, s23, GPAGE + 8, &v));
	CHECK(v == pattern(33, (3 * GPAGE + 8) / 8), "data behind a surviving pin");
	CHECK(free_now() == before - len, "an invalidation released pages");
	CHECK(p2p_unpin(pfd, s0) == 1, "unpin after callback must not put pages");
	CHECK(p2p_unpin(pfd, s1) == 1, "unpin after callback must not put pages");
	CHECK(p2p_unpin(pfd, s23) == 0, "put_pages of a surviving pin");
	CHECK(p2p_unpin(pfd, sp) == 0, "put_pages_persistent");
	CHECK(pins_now() == 0, "pins left");
	munmap((void *)m, len);
	CHECK_OK(gs_free(fd, va));
	CHECK(free_now() == before, "pages not returned");
	close(pfd);
	close(fd);
	return 0;
}

static int t_p2p_persistent(void)
{
	if (!have_p2ptest())
		return 0;
	const uint64_t len = 4 * GPAGE;
	uint64_t va, v, before = free_now();
	struct p2pt_status st;
	uint32_t slot = 0, sbar = 0;
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK_OK(gs_alloc(fd, len, &va));
	volatile uint64_t *m = gs_map(fd, va, len);
	CHECK(m != MAP_FAILED, "mmap");
	fill(m, len, 21);
	CHECK_OK(p2p_pin(pfd, va, len, P2PT_MODE_PERSISTENT, &slot));
	CHECK_OK(p2p_pin(pfd, va, GPAGE, P2PT_MODE_PERSISTENT_BAR1, &sbar));
	CHECK(pins_now() == 2, "pins");
	CHECK_OK(gs_free(fd, va));
	CHECK(probe_read(m) == SIGBUS, "simulator mapping survives free");
	munmap((void *)m, len);
	CHECK_OK(p2p_status(pfd, slot, &st));
	CHECK(st.pinned && !st.cb_fired, "persistent pin must not get a callback");
	CHECK(free_now() == before - len, "persistent pin must keep the pages reserved");
	/* still the same bytes behind the pin */
	CHECK_OK(p2p_peek(pfd, slot, 3 * GPAGE + 16, &v));
	CHECK(v == pattern(21, (3 * GPAGE + 16) / 8), "persistent data after free");
	/* and nobody else gets those pages meanwhile */
	uint64_t vb;
	CHECK_OK(gs_alloc(fd, free_now(), &vb));
	volatile uint64_t *mb = gs_map(fd, vb, before - len);
	CHECK(mb != MAP_FAILED, "mmap rest");
	memset((void *)mb, 0, before - len);
	CHECK_OK(p2p_peek(pfd, slot, 3 * GPAGE + 16, &v));
	CHECK(v == pattern(21, (3 * GPAGE + 16) / 8), "pinned pages were handed out again");
	munmap((void *)mb, before - len);
	CHECK_OK(gs_free(fd, vb));

	CHECK(p2p_unpin(pfd, sbar) == 0, "put_pages_persistent (BAR1 pin)");
	CHECK(free_now() == before - len, "pages freed while still pinned");
	CHECK(p2p_unpin(pfd, slot) == 0, "put_pages_persistent");
	CHECK(free_now() == before && pins_now() == 0, "pages not released by put");
	close(pfd);
	close(fd);
	return 0;
}

/* A child cannot pin the parent's GPU memory: lookups use the caller's address space. */
static int t_p2p_foreign_va(void)
{
	if (!have_p2ptest())
		return 0;
	uint64_t va;
	int fd = gs_open();

	CHECK(fd >= 0, "open");
	CHECK_OK(gs_alloc(fd, GPAGE, &va));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int pfd = p2p_fd();

		if (pfd < 0)
			_exit(1);
		if (p2p_pin(pfd, va, GPAGE, P2PT_MODE_GET_PAGES, NULL) != -1 || errno != EINVAL)
			_exit(2);
		if (p2p_pin(pfd, va, GPAGE, P2PT_MODE_PERSISTENT, NULL) != -1 || errno != EINVAL)
			_exit(3);
		_exit(0);
	}
	if (wait_child_ok(pid))
		return -1;
	CHECK_OK(gs_free(fd, va));
	close(fd);
	return 0;
}

/* pin/unpin racing with free in several threads: no deadlock, no leak, exactly-once release */
struct race_arg {
	int iters;
	int err;
};

static void *race_worker(void *p)
{
	struct race_arg *ra = p;
	int fd = gs_open(), pfd = p2p_fd();

	if (fd < 0 || pfd < 0) {
		ra->err = 1;
		return NULL;
	}
	for (int i = 0; i < ra->iters && !ra->err; i++) {
		uint64_t va;
		uint32_t s;

		if (gs_alloc(fd, 2 * GPAGE, &va)) {
			ra->err = 2;
			break;
		}
		if (p2p_pin(pfd, va, 2 * GPAGE, i % 3 == 2 ? P2PT_MODE_PERSISTENT :
			    P2PT_MODE_GET_PAGES, &s)) {
			ra->err = 3;
			break;
		}
		if (i % 2) {
			int r = p2p_unpin(pfd, s);

			if (r != 0)
				ra->err = 4;
			if (gs_free(fd, va))
				ra->err = 5;
		} else {
			if (gs_free(fd, va))
				ra->err = 6;
			if (p2p_unpin(pfd, s) < 0)
				ra->err = 7;
		}
	}
	close(pfd);
	close(fd);
	return NULL;
}

static int t_p2p_race(void)
{
	if (!have_p2ptest())
		return 0;
	uint64_t before = free_now();
	pthread_t th[4];
	struct race_arg ra[4];

	for (int t = 0; t < 4; t++) {
		ra[t] = (struct race_arg){ .iters = 200 };
		CHECK(pthread_create(&th[t], NULL, race_worker, &ra[t]) == 0, "pthread_create");
	}
	for (int t = 0; t < 4; t++) {
		pthread_join(th[t], NULL);
		CHECK(!ra[t].err, "thread %d failed at step %d", t, ra[t].err);
	}
	CHECK(pins_now() == 0 && free_now() == before, "leak after race");
	return 0;
}

/* put_pages and the free callback racing for the same pin: exactly one of them releases it */
struct race2_ctx {
	int fd, pfd;
	pthread_barrier_t bar;
	uint64_t va;
	uint32_t slot;
	int unpin_ret, free_ret;
};

static void *race2_unpin(void *p)
{
	struct race2_ctx *c = p;

	pthread_barrier_wait(&c->bar);
	c->unpin_ret = p2p_unpin(c->pfd, c->slot);
	return NULL;
}

static void *race2_free(void *p)
{
	struct race2_ctx *c = p;

	pthread_barrier_wait(&c->bar);
	c->free_ret = gs_free(c->fd, c->va);
	return NULL;
}

static int t_p2p_put_vs_callback(void)
{
	if (!have_p2ptest())
		return 0;
	uint64_t before = free_now();
	struct race2_ctx c;
	int wins[2] = { 0, 0 };

	c.fd = gs_open();
	c.pfd = p2p_fd();
	CHECK(c.fd >= 0 && c.pfd >= 0, "open");
	for (int i = 0; i < 300; i++) {
		pthread_t a, b;

		CHECK_OK(gs_alloc(c.fd, GPAGE, &c.va));
		CHECK_OK(p2p_pin(c.pfd, c.va, GPAGE, P2PT_MODE_GET_PAGES, &c.slot));
		pthread_barrier_init(&c.bar, NULL, 2);
		pthread_create(&a, NULL, race2_unpin, &c);
		pthread_create(&b, NULL, race2_free, &c);
		pthread_join(a, NULL);
		pthread_join(b, NULL);
		pthread_barrier_destroy(&c.bar);
		CHECK(c.free_ret == 0, "free failed");
		CHECK(c.unpin_ret == 0 || c.unpin_ret == 1, "unpin returned %d", c.unpin_ret);
		wins[c.unpin_ret]++;
		CHECK(pins_now() == 0, "pin left after round %d", i);
	}
	printf("# put won %d times, callback won %d times\n", wins[0], wins[1]);
	CHECK(free_now() == before, "leak");
	close(c.pfd);
	close(c.fd);
	return 0;
}


/* --- nvidia_p2p_dma_map_pages and friends ------------------------------------------------- */

struct bdf { uint32_t domain, bus, devfn; char name[32]; };

/* the first PCI device with this vendor:device */
static bool find_pci(const char *vendor, const char *device, struct bdf *b)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	bool found = false;

	if (!d)
		return false;
	while (!found && (e = readdir(d))) {
		char path[512], v[16] = "", dv[16] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", e->d_name);
		if ((f = fopen(path, "r"))) { if (!fgets(v, sizeof(v), f)) v[0] = 0; fclose(f); }
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", e->d_name);
		if ((f = fopen(path, "r"))) { if (!fgets(dv, sizeof(dv), f)) dv[0] = 0; fclose(f); }
		unsigned dom, bus, dev, fn;
		if (strncmp(v, vendor, strlen(vendor)) == 0 && strncmp(dv, device, strlen(device)) == 0 &&
		    sscanf(e->d_name, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4) {
			b->domain = dom;
			b->bus = bus;
			b->devfn = (dev << 3) | fn;
			snprintf(b->name, sizeof(b->name), "%.31s", e->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* no IOMMU: bus address == physical address */
static bool have_iommu(void)
{
	DIR *d = opendir("/sys/kernel/iommu_groups");
	struct dirent *e;
	int n = 0;

	if (!d)
		return false;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n > 0;
}

static int p2p_dma_map(int pfd, uint32_t slot, const struct bdf *b, uint32_t flags,
		       struct p2pt_dma *out)
{
	struct p2pt_dma a = { .slot = slot, .flags = flags, .domain = b->domain, .bus = b->bus,
			      .devfn = b->devfn };
	int r = ioctl(pfd, P2PT_IOC_DMA_MAP, &a);

	if (out)
		*out = a;
	return r;
}

static int p2p_dma_unmap(int pfd, uint32_t slot, uint32_t how, uint32_t other, const struct bdf *b)
{
	struct p2pt_dma_unmap a = { .slot = slot, .how = how, .other = other,
				    .domain = b ? b->domain : 0, .bus = b ? b->bus : 0,
				    .devfn = b ? b->devfn : 0 };

	return ioctl(pfd, P2PT_IOC_DMA_UNMAP, &a);
}

static int p2p_dma_cb(int pfd, uint32_t slot, struct p2pt_dma_cb *out)
{
	out->slot = slot;
	return ioctl(pfd, P2PT_IOC_DMA_CB, out);
}

static int t_p2p_dma_map(void)
{
	if (!have_p2ptest())
		return 0;
	struct bdf gpu, peer;
	const uint64_t len = 8 * GPAGE;
	struct p2pt_dma m;
	struct p2pt_status st;
	struct p2pt_dma_cb cb;
	uint32_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
	uint64_t va, vb, before = free_now();
	int fd = gs_open(), pfd = p2p_fd();

	CHECK(fd >= 0 && pfd >= 0, "open");
	CHECK(find_pci("0x1af4", "0x1110", &gpu), "ivshmem device not found");
	/* the NVMe controller is the peer storage maps for; without one, the GPU itself */
	if (!find_pci("0x1b36", "0x0010", &peer)) {
		printf("# no NVMe controller: the ivshmem device stands in as the only peer\n");
		peer = gpu;
	}
	bool two = strcmp(gpu.name, peer.name) != 0, iommu = have_iommu();
	uint64_t base = stat_now("active_dma_mappings");
	CHECK(base == 0, "active_dma_mappings %llu at start (stats readable?)",
	      (unsigned long long)base);

	CHECK_OK(gs_alloc(fd, len, &va));
	CHECK_OK(p2p_pin(pfd, va, len, P2PT_MODE_GET_PAGES, &s1));
	CHECK_OK(p2p_pin(pfd, va + 2 * GPAGE, 2 * GPAGE, P2PT_MODE_GET_PAGES, &s2));
	CHECK_OK(p2p_pin(pfd, va, GPAGE, P2PT_MODE_GET_PAGES, &s3));

	/* bad arguments: nothing mapped, nothing leaked */
	CHECK_ERR(p2p_dma_map(pfd, s3, &peer, P2PT_DMA_NULL_PEER, NULL), EINVAL);
	CHECK_ERR(p2p_dma_map(pfd, s3, &peer, P2PT_DMA_NULL_OUT, NULL), EINVAL);
	CHECK_ERR(p2p_dma_map(pfd, s3, &peer, P2PT_DMA_BAD_TABLE, NULL), EINVAL);
	CHECK(stat_now("active_dma_mappings") == 0, "failed maps left a mapping");

	/* a mapping for the peer: NVIDIA's fields, and BAR addresses as the peer sees them */
	CHECK_OK(p2p_dma_map(pfd, s1, &peer, 0, &m));
	CHECK(m.version == 0x00020003, "mapping version 0x%x", m.version);
	CHECK(m.page_size_type == 1, "page_size_type %u (64 KiB expected)", m.page_size_type);
	CHECK(m.entries == 8, "entries %u", m.entries);
	CHECK(m.pci_dev_ok, "mapping->pci_dev is not the peer");
	CHECK_OK(p2p_status(pfd, s1, &st));
	if (!iommu) {
		CHECK(m.equal_phys == 8, "%u of 8 bus addresses equal the BAR physical addresses",
		      m.equal_phys);
	} else {
		printf("# IOMMU present: bus addresses are IOVAs (0x%llx..), not compared with the BAR\n",
		       (unsigned long long)m.first);
	}
	CHECK(stat_now("active_dma_mappings") == 1, "active_dma_mappings after map");
	/* a second table of the same memory, mapped for the GPU device itself */
	CHECK_OK(p2p_dma_map(pfd, s2, &gpu, P2PT_DMA_CB_LEAVE, &m));
	CHECK(m.entries == 2 && m.pci_dev_ok, "second mapping");
	if (!iommu)
		CHECK(m.equal_phys == 2, "second mapping addresses");
	CHECK(stat_now("active_dma_mappings") == 2, "active_dma_mappings after two maps");

	/* unmap with wrong arguments: refused, mapping kept */
	if (two)
		CHECK_ERR(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_WRONG_PEER, 0, &gpu), EINVAL);
	CHECK_ERR(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_WRONG_TABLE, s3, NULL), EINVAL);
	CHECK_ERR(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_FREE, 0, NULL), EINVAL);
	CHECK_ERR(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_NULL, 0, NULL), EINVAL);
	CHECK(stat_now("active_dma_mappings") == 2, "refused unmaps changed the mappings");
	/* the right unmap, then the same pointer again */
	CHECK_OK(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_OK, 0, NULL));
	CHECK(stat_now("active_dma_mappings") == 1, "unmap did not tear down");
	CHECK_ERR(p2p_dma_unmap(pfd, s1, P2PT_UNMAP_STALE, 0, &peer), EINVAL);

	/*
	 * Free with live mappings: s1's callback hands its mapping back with
	 * nvidia_p2p_free_dma_mapping(), s2's leaves it, and gpusim must tear both down.
	 */
	CHECK_OK(p2p_dma_map(pfd, s1, &peer, 0, &m));
	CHECK(stat_now("active_dma_mappings") == 2, "re-map");
	CHECK_OK(gs_free(fd, va));
	CHECK_OK(p2p_dma_cb(pfd, s1, &cb));
	CHECK(cb.cb_fired && cb.free_dma_ret == 0 && !cb.mapped,
	      "s1 callback: fired %u free_dma_mapping %d mapped %u", cb.cb_fired, cb.free_dma_ret,
	      cb.mapped);
	CHECK_OK(p2p_dma_cb(pfd, s2, &cb));
	CHECK(cb.cb_fired && cb.free_dma_ret == 1, "s2 callback: fired %u free_dma_mapping %d",
	      cb.cb_fired, cb.free_dma_ret);
	CHECK(stat_now("active_dma_mappings") == 0, "%llu mappings survived the free",
	      (unsigned long long)stat_now("active_dma_mappings"));
	CHECK(pins_now() == 0, "pins after free");
	CHECK(p2p_unpin(pfd, s1) == 1 && p2p_unpin(pfd, s2) == 1 && p2p_unpin(pfd, s3) == 1,
	      "unpin after callback");

	/* persistent pins map the same way; unpinning unmaps */
	CHECK_OK(gs_alloc(fd, 4 * GPAGE, &vb));
	CHECK_OK(p2p_pin(pfd, vb, 4 * GPAGE, P2PT_MODE_PERSISTENT, &s4));
	CHECK_OK(p2p_dma_map(pfd, s4, &peer, 0, &m));
	CHECK(m.entries == 4 && m.version == 0x00020003, "persistent mapping");
	CHECK(stat_now("active_dma_mappings") == 1, "persistent mapping counted");
	CHECK(p2p_unpin(pfd, s4) == 0, "persistent unpin");
	CHECK(stat_now("active_dma_mappings") == 0, "unpin left a mapping");

	/* closing the client with a live mapping releases everything */
	CHECK_OK(p2p_pin(pfd, vb, 4 * GPAGE, P2PT_MODE_GET_PAGES, &s4));
	CHECK_OK(p2p_dma_map(pfd, s4, &peer, 0, &m));
	close(pfd);
	CHECK(stat_now("active_dma_mappings") == 0 && pins_now() == 0, "close left a mapping/pin");
	CHECK_OK(gs_free(fd, vb));
	CHECK(free_now() == before, "BAR pages leaked");
	printf("# peer %s, gpu %s: %llu mappings made\n", peer.name, gpu.name,
	       (unsigned long long)stat_now("total_dma_mappings"));
	close(fd);
	return 0;
}

static const struct {
	const char *name;
	int (*fn)(void);
} tests[] = {
	{ "info", t_info },
	{ "alloc_free", t_alloc_free },
	{ "alloc_align_2m", t_alloc_align_2m },
	{ "bad_ioctls", t_bad_ioctls },
	{ "mmap_two_mappings", t_mmap_two_mappings },
	{ "free_zaps_mapping", t_free_zaps_mapping },
	{ "fork", t_fork },
	{ "close_frees", t_close_frees },
	{ "exhaust", t_exhaust },
	{ "many_processes", t_many_processes },
	{ "p2p_get_put", t_p2p_get_put },
	{ "p2p_bad_args", t_p2p_bad_args },
	{ "p2p_callback_on_free", t_p2p_callback_on_free },
	{ "p2p_invalidate", t_p2p_invalidate },
	{ "p2p_persistent", t_p2p_persistent },
	{ "p2p_foreign_va", t_p2p_foreign_va },
	{ "p2p_race", t_p2p_race },
	{ "p2p_put_vs_callback", t_p2p_put_vs_callback },
	{ "p2p_dma_map", t_p2p_dma_map },
};

int main(int argc, char **argv)
{
	size_t n = sizeof(tests) / sizeof(tests[0]);
	int ran = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < n; i++) {
		bool want = argc < 2;

		for (int a = 1; a < argc; a++)
			want |= strcmp(argv[a], tests[i].name) == 0;
		if (!want)
			continue;
		cur_test = tests[i].name;
		ran++;
		/* each test in its own process, so that a failed test's leftovers die with it */
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 2;
		}
		if (pid == 0)
			_exit(tests[i].fn() == 0 ? 0 : 1);
		int st;
		if (waitpid(pid, &st, 0) != pid) {
			perror("waitpid");
			return 2;
		}
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			printf("ok - %s\n", tests[i].name);
		} else {
			failures++;
			if (WIFSIGNALED(st))
				fprintf(stderr, "not ok - %s: killed by signal %d\n", tests[i].name,
					WTERMSIG(st));
		}
	}
	if (!ran) {
		fprintf(stderr, "no test matched\n");
		return 2;
	}
	printf("# %d of %d tests failed\n", failures, ran);
	return failures ? 1 : 0;
}
