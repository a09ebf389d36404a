// SPDX-License-Identifier: MIT
/*
 * libnvm_fuzz - hostile, seeded stress of the libnvm helper module (/dev/libnvmN, kmod/libnvm)
 * with GPU memory from gpusim.
 *
 *   libnvm_fuzz --dev=/dev/libnvmN [--seed=N] [--ops=N] [--procs=N] [--threads=N]
 *
 * Forks --procs worker processes of --threads threads each; every thread draws its operations
 * from its own generator, derived from (seed, process, thread), and shares its process's tables
 * (helper files, gpusim allocations, remembered window addresses) with the other threads, so
 * operations on one object race. Operations:
 *   - structure-aware MAP_HOST / MAP_DEVICE: addresses inside, across the edges of and outside
 *     the process's host arena and its gpusim allocations (live and freed), page counts from 0
 *     to past the limit, address arrays that are valid, NULL, read-only, kernel addresses or
 *     straddle an unmapped page; UNMAP of live, stale and made-up addresses; GET_VERSION (exact);
 *   - raw ioctls: random numbers of the module's type and others, random argument bytes and
 *     pointers;
 *   - mmap of BAR0 (lengths, offsets, shared/private; reads of CAP through it, checked against
 *     the first read), munmap;
 *   - enabling the controller with admin queue addresses from remembered windows (never a
 *     doorbell, so it never starts a transfer), which makes every later release stop it;
 *   - gpusim frees mapped allocations and whole GPU spaces at random moments (free callbacks:
 *     windows revoked), helper files closed with live windows, fork children that map through
 *     inherited files and exit without unmapping.
 * Every result is checked against the errors that operation may return. The seed is printed
 * first; --seed replays it (each thread's choices follow from it; the interleaving is the
 * scheduler's). Exit 0 only if no check failed and no worker died; the kernel side (no window,
 * pin or DMA mapping left, clean dmesg, unload) is checked by tests/vm/suites/62-libnvm-fuzz.sh.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libnvm_ioctl.h"
#include "gpusim_uapi.h"

#define PG 4096ULL
#define GPG 0x10000ULL
#define NFILES 3
#define NALLOCS 6
#define NADDRS 64
#define ARENA_PAGES 256
#define MAX_THREADS 8

static uint64_t opt_seed, opt_ops = 20000;
static int opt_procs = 3, opt_threads = 3;
static const char *opt_dev;

enum op {
	OP_MAP_HOST, OP_MAP_DEV, OP_UNMAP, OP_VERSION, OP_RAW, OP_MMAP, OP_ENABLE, OP_GS_ALLOC,
	OP_GS_FREE, OP_GS_RESET, OP_REOPEN, OP_FORK, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
	"map_host", "map_device", "unmap", "version", "raw_ioctl", "mmap_bar", "enable",
	"gpusim_alloc", "gpusim_free", "gpusim_reset", "reopen", "fork",
};
static const int op_weight[OP_COUNT] = { 20, 14, 16, 3, 10, 5, 3, 6, 5, 1, 3, 1 };

struct counters {
	uint64_t ops[OP_COUNT], ok[OP_COUNT], failures;
};
static struct counters *shared;
#define OKC(op) __atomic_add_fetch(&shared->ok[op], 1, __ATOMIC_RELAXED)

struct proc {
	pthread_mutex_t lock;
	int files[NFILES];
	int gs_fd;
	uint64_t allocs[NALLOCS], alloc_size[NALLOCS];
	uint64_t freed[NALLOCS];             /* freed GPU VAs, for stale mappings */
	uint64_t addrs[NADDRS];              /* addresses of windows (live or stale) */
	uint64_t bus[NADDRS];                /* a bus address each window returned */
	uint8_t *arena;                      /* ARENA_PAGES host pages, the last one unmapped */
	void *ro;                            /* a read-only page */
	volatile uint32_t *bar;              /* BAR0 mapping kept for the whole run */
	uint64_t cap;
	int id;
};
static struct proc P;

static __thread uint64_t rng;
static uint64_t next(void)
{
	/* splitmix64 */
	uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return n ? next() % n : 0; }

static void failf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "libnvm-fuzz: proc %d FAIL: ", P.id);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	__atomic_add_fetch(&shared->failures, 1, __ATOMIC_RELAXED);
}

/* rc/errno of a call must be 0 or one of the listed errnos (list ends with 0) */
static bool allowed(enum op op, long rc, int err, ...)
{
	va_list ap;
	int e;

	if (rc == 0)
		return true;
	va_start(ap, err);
	while ((e = va_arg(ap, int)) != 0) {
		if (e == err) {
			va_end(ap);
			return true;
		}
	}
	va_end(ap);
	failf("%s returned %ld errno %d (%s)", op_names[op], rc, err, strerror(err));
	return false;
}

static int pick_file(void)
{
	pthread_mutex_lock(&P.lock);
	int fd = P.files[below(NFILES)];
	pthread_mutex_unlock(&P.lock);
	return fd;
}

static void remember(uint64_t va, uint64_t bus)
{
	pthread_mutex_lock(&P.lock);
	int i = below(NADDRS);
	P.addrs[i] = va;
	P.bus[i] = bus;
	pthread_mutex_unlock(&P.lock);
}

/* an address array: valid, NULL, read-only, kernel, straddling the arena's unmapped page */
static uint64_t *addr_array(uint64_t *buf, uint64_t n, bool *valid)
{
	*valid = false;
	switch (below(10)) {
	case 0: return NULL;
	case 1: return P.ro;
	case 2: return (uint64_t *)0xffff888000001000ULL;
	case 3:   /* the last word before the hole: one address fits, more run into the hole */
		*valid = n == 1;
		return (uint64_t *)(P.arena + ARENA_PAGES * PG - 8);
	default:
		*valid = n <= 1024;
		return *valid ? buf : (uint64_t *)(P.arena + ARENA_PAGES * PG - 8);
	}
}

static uint64_t pick_count(void)
{
	switch (below(12)) {
	case 0: return 0;
	case 1: return (1ULL << 20) + below(1000);
	case 2: return ~0ULL - below(4);
	case 3: return 1ULL << 52;
	default: return 1 + below(40);
	}
}

static void op_map_host(void)
{
	uint64_t buf[1024], va, n = pick_count();
	bool valid;
	struct nvm_ioctl_map m;

	switch (below(8)) {
	case 0: va = (uint64_t)(uintptr_t)P.ro; break;
	case 1: va = 0xffff888000000000ULL + below(1 << 20) * PG; break;
	case 2: va = next(); break;
	case 3: va = 0; break;
	default: va = (uint64_t)(uintptr_t)P.arena + below(ARENA_PAGES) * PG + below(PG); break;
	}
	m.vaddr_start = va;
	m.n_pages = n;
	m.ioaddrs = (uint64_t)(uintptr_t)addr_array(buf, n, &valid);
	errno = 0;
	long rc = ioctl(pick_file(), NVM_MAP_HOST_MEMORY, &m);
	int err = errno;
	if (!allowed(OP_MAP_HOST, rc, err, EFAULT, EINVAL, ENOMEM, EBADF, 0))
		return;
	if (rc == 0) {
		OKC(OP_MAP_HOST);
		if (!valid) {
			failf("map_host succeeded with a bad address array %p",
			      (void *)(uintptr_t)m.ioaddrs);
			return;
		}
		/* the arena word is shared with other threads: only our own buffer is checked */
		const uint64_t *out = (const uint64_t *)(uintptr_t)m.ioaddrs;
		for (uint64_t i = 0; out == buf && i < n; i++) {
			if (!out[i] || (out[i] & (PG - 1))) {
				failf("map_host: bus address %llu is 0x%llx", (unsigned long long)i,
				      (unsigned long long)out[i]);
				return;
			}
		}
		remember(va, out == buf ? buf[0] : 0);
	}
}

static uint64_t pick_gpu_va(uint64_t *size)
{
	pthread_mutex_lock(&P.lock);
	int i = below(NALLOCS);
	uint64_t va = P.allocs[i], sz = P.alloc_size[i];
	if (!va || below(5) == 0) {
		va = P.freed[i] ? P.freed[i] : GPUSIM_VA_BASE + below(64) * GPG;
		sz = 4 * GPG;
	}
	pthread_mutex_unlock(&P.lock);
	*size = sz;
	return va;
}

static void op_map_device(void)
{
	uint64_t buf[1024], size, va = pick_gpu_va(&size), n;
	bool valid;
	struct nvm_ioctl_map m;

	if (below(4)) {   /* mostly inside the allocation */
		uint64_t pages = size / GPG;
		uint64_t first = below(pages);
		va += first * GPG + below(3) * 0x1000 * (below(2));
		n = 1 + below(pages - first + (below(4) == 0));   /* sometimes one too many */
	} else {
		n = pick_count();
		va += below(3) ? 0 : next() % (1ULL << 40);
	}
	m.vaddr_start = va;
	m.n_pages = n;
	m.ioaddrs = (uint64_t)(uintptr_t)addr_array(buf, n, &valid);
	errno = 0;
	long rc = ioctl(pick_file(), NVM_MAP_DEVICE_MEMORY, &m);
	int err = errno;
	if (!allowed(OP_MAP_DEV, rc, err, EINVAL, EFAULT, ENOMEM, EIO, EBADF, 0))
		return;
	if (rc == 0) {
		OKC(OP_MAP_DEV);
		if (!valid) {
			failf("map_device succeeded with a bad address array");
			return;
		}
		const uint64_t *out = (const uint64_t *)(uintptr_t)m.ioaddrs;
		for (uint64_t i = 0; out == buf && i < n; i++) {
			if (!out[i] || (out[i] & (GPG - 1))) {
				failf("map_device: bus address %llu is 0x%llx", (unsigned long long)i,
				      (unsigned long long)out[i]);
				return;
			}
		}
		remember(va, out == buf ? buf[0] : 0);
	}
}

static void op_unmap(void)
{
	uint64_t a;

	pthread_mutex_lock(&P.lock);
	a = P.addrs[below(NADDRS)];
	for (int i = 0; i < 8 && !a; i++)   /* prefer a remembered window */
		a = P.addrs[below(NADDRS)];
	pthread_mutex_unlock(&P.lock);
	if (below(5) == 0)
		a = next();
	else if (below(3) == 0)
		a += below(GPG);
	errno = 0;
	long rc = below(30) ? ioctl(pick_file(), NVM_UNMAP_MEMORY, &a) :
		  ioctl(pick_file(), NVM_UNMAP_MEMORY, below(2) ? NULL : (void *)0xffff888000000000ULL);
	if (allowed(OP_UNMAP, rc, errno, EINVAL, EFAULT, EBADF, 0) && rc == 0)
		OKC(OP_UNMAP);
}

static void op_version(void)
{
	struct nvm_ioctl_version v;

	memset(&v, 0xee, sizeof(v));
	errno = 0;
	long rc = ioctl(pick_file(), NVM_GET_VERSION, &v);
	if (!allowed(OP_VERSION, rc, errno, EBADF, 0) || rc)
		return;
	if (v.abi_major != NVM_ABI_MAJOR || v.abi_minor != NVM_ABI_MINOR || v.reserved ||
	    !(v.features & NVM_FEATURE_DEVICE_MEMORY))
		failf("version %u.%u features 0x%x reserved %u", v.abi_major, v.abi_minor,
		      v.features, v.reserved);
	OKC(OP_VERSION);
}

static void op_raw(void)
{
	uint64_t buf[8];
	unsigned long cmd;
	void *arg;

	for (int i = 0; i < 8; i++)
		buf[i] = below(3) ? next() : (uint64_t)(uintptr_t)P.arena + below(ARENA_PAGES) * PG;
	buf[1] &= below(2) ? 0x3f : ~0ULL;   /* page counts: sometimes small */
	switch (below(5)) {
	case 0: cmd = next(); break;
	case 1: cmd = _IOC(below(4), NVM_IOCTL_TYPE, below(256), below(64)); break;
	case 2: cmd = _IOC(below(4), below(256), below(4), below(64)); break;
	default: {
		static const unsigned long cmds[] = { NVM_MAP_HOST_MEMORY, NVM_MAP_DEVICE_MEMORY,
						      NVM_UNMAP_MEMORY, NVM_GET_VERSION };
		cmd = cmds[below(4)];
	}
	}
	switch (below(4)) {
	case 0: arg = NULL; break;
	case 1: arg = (void *)0xffff888000000000ULL; break;
	case 2: arg = P.arena + ARENA_PAGES * PG - 8; break;
	default: arg = buf; break;
	}
	errno = 0;
	long rc = ioctl(pick_file(), (unsigned int)cmd, arg);
	/* random numbers may hit the VFS's own ioctls (FIONBIO, FICLONE, ...), hence the tail */
	if (allowed(OP_RAW, rc, errno, EINVAL, EFAULT, ENOMEM, EIO, EBADF, ENOTTY, EOPNOTSUPP,
		    EXDEV, EPERM, ENOSPC, 0) && rc == 0) {
		OKC(OP_RAW);
		if ((unsigned int)cmd == NVM_MAP_HOST_MEMORY || (unsigned int)cmd == NVM_MAP_DEVICE_MEMORY)
			remember(buf[0], 0);
	}
}

static void op_mmap(void)
{
	size_t len = below(4) ? 0x1000 * (1 + below(5)) : 1 + below(1 << 16);
	off_t off = below(6) ? 0 : (off_t)(below(4) * PG);
	int flags = below(8) ? MAP_SHARED : MAP_PRIVATE;
	errno = 0;
	void *p = mmap(NULL, len, PROT_READ, flags, pick_file(), off);
	if (p == MAP_FAILED) {
		allowed(OP_MMAP, -1, errno, EINVAL, EBADF, ENOMEM, 0);
		return;
	}
	OKC(OP_MMAP);
	if (off || flags != MAP_SHARED || len > 0x4000)
		failf("mmap of BAR0 accepted offset %lld flags %d length %zu", (long long)off, flags,
		      len);
	else if ((((volatile uint32_t *)p)[0] | (uint64_t)((volatile uint32_t *)p)[1] << 32) != P.cap)
		failf("CAP through a fresh BAR0 mapping differs");
	munmap(p, len);
}

/* Program admin queue addresses from remembered windows and enable; never ring a doorbell. */
static void op_enable(void)
{
	uint64_t asq, acq;

	pthread_mutex_lock(&P.lock);
	asq = acq = 0;
	for (int i = 0; i < 16 && !(asq && acq); i++) {
		if (!asq)
			asq = P.bus[below(NADDRS)] & ~(PG - 1);
		if (!acq)
			acq = P.bus[below(NADDRS)] & ~(PG - 1);
	}
	pthread_mutex_unlock(&P.lock);
	if (!asq || !acq)
		return;
	volatile uint32_t *r = P.bar;
	if (r[0x1c / 4] & 1)
		return;   /* enabled already: leave it */
	r[0x24 / 4] = (15u << 16) | 15u;
	r[0x28 / 4] = (uint32_t)asq;
	r[0x2c / 4] = asq >> 32;
	r[0x30 / 4] = (uint32_t)acq;
	r[0x34 / 4] = acq >> 32;
	r[0x14 / 4] = (4u << 20) | (6u << 16) | 1u;
	OKC(OP_ENABLE);
}

static void op_gs_alloc(void)
{
	struct gpusim_alloc a = { .size = GPG * (1 + below(8)) };

	pthread_mutex_lock(&P.lock);
	int i = below(NALLOCS);
	if (!P.allocs[i] && ioctl(P.gs_fd, GPUSIM_IOC_ALLOC, &a) == 0) {
		P.allocs[i] = a.gpu_va;
		P.alloc_size[i] = a.size;
		OKC(OP_GS_ALLOC);
	}
	pthread_mutex_unlock(&P.lock);
}

static void op_gs_free(void)
{
	/* under the lock: gpusim_reset may not close the space's file meanwhile */
	pthread_mutex_lock(&P.lock);
	int i = below(NALLOCS);
	uint64_t va = P.allocs[i];
	P.allocs[i] = 0;
	if (va) {
		struct gpusim_free f = { .gpu_va = va };
		if (ioctl(P.gs_fd, GPUSIM_IOC_FREE, &f))   /* runs the callbacks of windows on it */
			failf("gpusim free of 0x%llx: %s", (unsigned long long)va, strerror(errno));
		else
			OKC(OP_GS_FREE);
		P.freed[i] = va;
	}
	pthread_mutex_unlock(&P.lock);
}

/* the whole GPU space dies: every allocation freed, every window on it revoked */
static void op_gs_reset(void)
{
	pthread_mutex_lock(&P.lock);
	close(P.gs_fd);
	for (int i = 0; i < NALLOCS; i++) {
		if (P.allocs[i])
			P.freed[i] = P.allocs[i];
		P.allocs[i] = 0;
	}
	P.gs_fd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (P.gs_fd < 0)
		failf("reopen /dev/gpusim: %s", strerror(errno));
	else
		OKC(OP_GS_RESET);
	pthread_mutex_unlock(&P.lock);
}

/* a helper file closed with whatever windows it has */
static void op_reopen(void)
{
	pthread_mutex_lock(&P.lock);
	int i = below(NFILES);
	close(P.files[i]);
	P.files[i] = open(opt_dev, O_RDWR);
	if (P.files[i] < 0)
		failf("reopen %s: %s", opt_dev, strerror(errno));
	else
		OKC(OP_REOPEN);
	pthread_mutex_unlock(&P.lock);
}

/* a child maps through the inherited files, with its own memory, and exits */
static void op_fork(void)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return;
	if (pid == 0) {
		uint64_t buf[8];
		void *m = mmap(NULL, 8 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct nvm_ioctl_map mm = { .vaddr_start = (uintptr_t)m, .n_pages = 8,
					    .ioaddrs = (uintptr_t)buf };
		int fd = P.files[below(NFILES)];
		int rc = ioctl(fd, NVM_MAP_HOST_MEMORY, &mm);
		/* the inherited gpusim file is refused to a child: EACCES there, EINVAL here */
		struct nvm_ioctl_map gm = { .vaddr_start = P.allocs[0], .n_pages = 1,
					    .ioaddrs = (uintptr_t)buf };
		int rc2 = ioctl(fd, NVM_MAP_DEVICE_MEMORY, &gm);
		_exit((rc == 0 || errno == EBADF) && (rc2 != 0) ? 0 : 7);
	}
	int st;
	if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
		OKC(OP_FORK);
	else
		failf("fork child status 0x%x", st);
}

static void *worker(void *argp)
{
	int t = (int)(intptr_t)argp;
	uint64_t n = opt_ops / ((uint64_t)opt_procs * opt_threads);
	int total = 0;

	rng = opt_seed ^ ((uint64_t)P.id << 32) ^ ((uint64_t)t << 48) ^ 0x5deece66dULL;
	for (int i = 0; i < OP_COUNT; i++)
		total += op_weight[i];
	for (uint64_t i = 0; i < n && !__atomic_load_n(&shared->failures, __ATOMIC_RELAXED); i++) {
		int w = below(total), op = 0;
		while (w >= op_weight[op])
			w -= op_weight[op++];
		__atomic_add_fetch(&shared->ops[op], 1, __ATOMIC_RELAXED);
		switch (op) {
		case OP_MAP_HOST: op_map_host(); break;
		case OP_MAP_DEV: op_map_device(); break;
		case OP_UNMAP: op_unmap(); break;
		case OP_VERSION: op_version(); break;
		case OP_RAW: op_raw(); break;
		case OP_MMAP: op_mmap(); break;
		case OP_ENABLE: op_enable(); break;
		case OP_GS_ALLOC: op_gs_alloc(); break;
		case OP_GS_FREE: op_gs_free(); break;
		case OP_GS_RESET: op_gs_reset(); break;
		case OP_REOPEN: op_reopen(); break;
		case OP_FORK: op_fork(); break;
		}
	}
	return NULL;
}

static int run_proc(int id)
{
	P.id = id;
	pthread_mutex_init(&P.lock, NULL);
	for (int i = 0; i < NFILES; i++) {
		P.files[i] = open(opt_dev, O_RDWR);
		if (P.files[i] < 0) {
			failf("open %s: %s", opt_dev, strerror(errno));
			return 1;
		}
	}
	int barfd = open(opt_dev, O_RDWR);
	P.bar = mmap(NULL, 0x2000, PROT_READ | PROT_WRITE, MAP_SHARED, barfd, 0);
	if (barfd < 0 || P.bar == MAP_FAILED) {
		failf("BAR0: %s", strerror(errno));
		return 1;
	}
	P.cap = P.bar[0] | (uint64_t)P.bar[1] << 32;
	P.gs_fd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	P.arena = mmap(NULL, (ARENA_PAGES + 1) * PG, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	P.ro = mmap(NULL, PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (P.gs_fd < 0 || P.arena == MAP_FAILED || P.ro == MAP_FAILED) {
		failf("setup: %s", strerror(errno));
		return 1;
	}
	munmap(P.arena + ARENA_PAGES * PG, PG);   /* the hole after the arena */

	pthread_t th[MAX_THREADS];
	for (int t = 0; t < opt_threads; t++)
		pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
	for (int t = 0; t < opt_threads; t++)
		pthread_join(th[t], NULL);
	/* exit with whatever windows, allocations and mappings are left: the kernel cleans up */
	return 0;
}

int main(int argc, char **argv)
{
	bool seeded = false;

	for (int i = 1; i < argc; i++) {
		if (!strncmp(argv[i], "--seed=", 7)) {
			opt_seed = strtoull(argv[i] + 7, NULL, 0);
			seeded = true;
		} else if (!strncmp(argv[i], "--ops=", 6)) {
			opt_ops = strtoull(argv[i] + 6, NULL, 0);
		} else if (!strncmp(argv[i], "--procs=", 8)) {
			opt_procs = atoi(argv[i] + 8);
		} else if (!strncmp(argv[i], "--threads=", 10)) {
			opt_threads = atoi(argv[i] + 10);
		} else if (!strncmp(argv[i], "--dev=", 6)) {
			opt_dev = argv[i] + 6;
		} else {
			fprintf(stderr, "usage: %s --dev=/dev/libnvmN [--seed=N] [--ops=N] [--procs=N] [--threads=N]\n",
				argv[0]);
			return 2;
		}
	}
	if (!opt_dev || opt_procs < 1 || opt_procs > 16 || opt_threads < 1 ||
	    opt_threads > MAX_THREADS) {
		fprintf(stderr, "libnvm-fuzz: need --dev, 1..16 procs, 1..%d threads\n", MAX_THREADS);
		return 2;
	}
	if (!seeded) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		opt_seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("libnvm-fuzz: seed 0x%llx, %llu operations, %d processes x %d threads, %s\n",
	       (unsigned long long)opt_seed, (unsigned long long)opt_ops, opt_procs, opt_threads,
	       opt_dev);
	shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		      -1, 0);
	if (shared == MAP_FAILED)
		return 2;

	pid_t pids[16];
	for (int p = 0; p < opt_procs; p++) {
		fflush(NULL);
		pids[p] = fork();
		if (pids[p] == 0)
			_exit(run_proc(p));
	}
	int bad = 0;
	for (int p = 0; p < opt_procs; p++) {
		int st;
		if (waitpid(pids[p], &st, 0) != pids[p] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "libnvm-fuzz: worker %d ended with status 0x%x\n", p, st);
			bad++;
		}
	}
	for (int i = 0; i < OP_COUNT; i++)
		printf("# %-13s %8llu ops, %8llu succeeded\n", op_names[i],
		       (unsigned long long)shared->ops[i], (unsigned long long)shared->ok[i]);
	if (bad || shared->failures) {
		printf("libnvm-fuzz: FAIL (%llu failed checks, %d workers died; replay --seed=0x%llx)\n",
		       (unsigned long long)shared->failures, bad, (unsigned long long)opt_seed);
		return 1;
	}
	printf("libnvm-fuzz: PASS (seed 0x%llx)\n", (unsigned long long)opt_seed);
	return 0;
}
