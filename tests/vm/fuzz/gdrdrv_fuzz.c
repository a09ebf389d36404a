// SPDX-License-Identifier: MIT
/*
 * gdrdrv_fuzz - hostile, seeded stress of /dev/gdrdrv (kmod/gdrdrv) with GPU memory from gpusim.
 *
 *   gdrdrv_fuzz [--seed=N] [--ops=N] [--procs=N] [--threads=N] [--persistent=0|1]
 *
 * Forks --procs worker processes of --threads threads each. Every thread draws its operations
 * from its own generator, derived from (seed, process, thread), and shares its process's tables
 * of gdrdrv files, handles (live, stale and made up) and gpusim allocations with the other
 * threads, so that operations on one object race each other. Operations:
 *   - structure-aware ioctls: PIN (v1, v2) with addresses and lengths inside, across, at the
 *     edges of and far outside allocations, up to overflowing the address space; UNPIN, queries
 *     and mapping-type requests on live, stale and random handles;
 *   - raw ioctls: every command number with random direction/size encodings, random commands of
 *     the driver's type, argument pointers that are NULL, kernel addresses, or structures that
 *     straddle an unmapped page;
 *   - mmap (MAP_FIXED into the thread's own arena, shared or private, odd lengths and offsets),
 *     munmap (whole or partial), mremap (move, shrink, grow, DONTUNMAP), mprotect (whole or a
 *     piece: VMA splits), madvise, accesses to the mappings from user space (SIGBUS/SIGSEGV
 *     caught) and from the kernel (pipe I/O, /proc/self/mem);
 *   - gpusim frees pinned allocations and the process's whole GPU space at random moments
 *     (invalidation callbacks in non-persistent mode), gdrdrv files are closed with live pins and
 *     mappings, and fork children poke at inherited files and mappings.
 * Every result is checked: an error must be one the operation can legitimately return, and some
 * results are exact (the version, an unknown command, a fork child using its parent's file).
 * The seed is printed first; --seed replays it (with --procs=1 --threads=1 the whole sequence
 * is deterministic; with more, each thread's choices are, the interleaving is the scheduler's).
 * Exit status 0 only if no check failed and no worker died; the kernel side (warnings, pins,
 * pages, module unload) is checked by tests/vm/suites/60-gdrdrv-fuzz.sh.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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

#include "gdrdrv.h"
#include "gpusim_uapi.h"

#define GPAGE 0x10000ULL
#define MAX_PROCS 16
#define MAX_THREADS 16
#define NFILES 3		/* gdrdrv files per process */
#define NALLOCS 8		/* gpusim allocations per process */
#define NHANDLES 32		/* remembered handles per process */
#define NSLOTS 8		/* mapping slots per thread */
#define SLOT_SIZE (2ULL << 20)	/* larger than any allocation: mappings fit */
#define MAX_ALLOC (1ULL << 20)

/* ---- options and shared counters ---------------------------------------------------------- */

static uint64_t opt_seed;
static uint64_t opt_ops = 20000;
static int opt_procs = 2, opt_threads = 3, opt_persistent = 1;
static uint64_t page_size;

enum op {
	OP_PIN, OP_UNPIN, OP_QUERY, OP_REQ_TYPE, OP_RAW_IOCTL, OP_MMAP, OP_UNMAP, OP_MREMAP,
	OP_MPROTECT, OP_ACCESS, OP_KACCESS, OP_GS_FREE, OP_GS_RESET, OP_REOPEN, OP_FORK, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
	"pin", "unpin", "query", "req_type", "raw_ioctl", "mmap", "unmap", "mremap", "mprotect",
	"access", "kaccess", "gpusim_free", "gpusim_reset", "reopen", "fork",
};

/* In a MAP_SHARED page: every worker process adds to it. */
struct counters {
	uint64_t ops[OP_COUNT];
	uint64_t ok[OP_COUNT];
	uint64_t pins_ok, maps_ok, sigbus, sigsegv, callbacks_seen, fork_children;
	uint64_t failures;
};
static struct counters *ctr;

/* ---- random numbers: splitmix64, one state per thread ------------------------------------- */

static uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

struct rng {
	uint64_t s;
};

static uint64_t rnd(struct rng *r)
{
	return mix(&r->s);
}

static uint64_t below(struct rng *r, uint64_t n)
{
	return n ? rnd(r) % n : 0;
}

static bool chance(struct rng *r, unsigned int percent)
{
	return below(r, 100) < percent;
}

/* ---- per-process state ------------------------------------------------------------------ */

struct alloc {
	uint64_t va, size;	/* va 0: empty */
};

struct handle {
	uint64_t h, size;	/* size: the pinned (64 KiB-rounded) length */
	int file;		/* index into files[], -1 unused */
	bool live;		/* pinned and not unpinned or closed since, as far as we know */
};

struct thread;

struct proc {
	int index;
	pthread_mutex_t lock;	/* the tables below; never held across a syscall that can block */
	int files[NFILES];	/* gdrdrv fds, -1 closed */
	int gs;			/* gpusim fd */
	unsigned gs_gen;	/* op_gs_reset's count: a number alone can come back (see gs_replaced) */
	struct alloc allocs[NALLOCS];
	struct handle handles[NHANDLES];
	struct thread *threads;
	int nthreads;
	int pipefd[2];
	int memfd;		/* /proc/self/mem */
	unsigned char *guard;	/* page followed by a PROT_NONE page */
	pid_t children[64];
	int nchildren;
};

struct thread {
	struct proc *p;
	int index;
	struct rng rng;
	pthread_t tid;
	unsigned char *arena;	/* NSLOTS * SLOT_SIZE, reserved PROT_NONE */
	uint64_t slot_len[NSLOTS];	/* bytes believed mapped at the slot start, 0 none */
	uint64_t ops;
	bool failed;
};

static struct proc proc;

/* ---- failure reporting ------------------------------------------------------------------ */

static void fail(struct thread *t, const char *fmt, ...)
{
	va_list ap;
	char buf[512];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "FUZZ FAIL seed=0x%" PRIx64 " proc=%d thread=%d op#%" PRIu64 ": %s\n",
		opt_seed, proc.index, t ? t->index : -1, t ? t->ops : 0, buf);
	__atomic_add_fetch(&ctr->failures, 1, __ATOMIC_RELAXED);
	if (t)
		t->failed = true;
}

static void count(enum op op, bool ok)
{
	__atomic_add_fetch(&ctr->ops[op], 1, __ATOMIC_RELAXED);
	if (ok)
		__atomic_add_fetch(&ctr->ok[op], 1, __ATOMIC_RELAXED);
}

/*
 * Errors every gdrdrv call may see here besides its own: another thread closed the file (EBADF)
 * or the number now names a different file (gpusim answers ENOTTY/EINVAL to foreign commands).
 */
static bool allowed(int err, const int *list)
{
	if (err == EBADF || err == ENOTTY)
		return true;
	for (; *list; list++)
		if (*list == err)
			return true;
	return false;
}

#define ALLOWED(t, opname, err, ...) do { \
	static const int list_[] = { __VA_ARGS__, 0 }; \
	if (!allowed((err), list_)) \
		fail((t), "%s: unexpected errno %d (%s)", (opname), (err), strerror(err)); \
} while (0)

/* ---- memory probes: faults are expected, caught per thread ------------------------------- */

static __thread sigjmp_buf probe_jmp;
static __thread volatile sig_atomic_t probe_active;

static void probe_handler(int sig)
{
	if (probe_active) {
		probe_active = 0;
		siglongjmp(probe_jmp, sig);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

/* 0, or the signal the access raised. */
static int probe(volatile uint32_t *p, bool write, uint32_t v)
{
	int sig = sigsetjmp(probe_jmp, 1);

	if (sig)
		return sig;
	probe_active = 1;
	if (write)
		*p = v;
	else
		v = *p;
	__sync_synchronize();
	probe_active = 0;
	(void)v;
	return 0;
}

/* ---- choosing arguments ----------------------------------------------------------------- */

static int pick_file(struct thread *t, int *index)
{
	int i = (int)below(&t->rng, NFILES);

	if (index)
		*index = i;
	return __atomic_load_n(&t->p->files[i], __ATOMIC_RELAXED);
}

static struct alloc pick_alloc(struct thread *t)
{
	struct alloc a;

	pthread_mutex_lock(&t->p->lock);
	a = t->p->allocs[below(&t->rng, NALLOCS)];
	pthread_mutex_unlock(&t->p->lock);
	return a;
}

/* A handle: mostly one the driver gave out (maybe unpinned since), sometimes made up. */
static struct handle pick_handle(struct thread *t)
{
	struct handle h = { .file = -1 };

	if (chance(&t->rng, 10)) {
		static const uint64_t odd[] = { 0, 1, 0xffff, 1ULL << 51, UINT64_MAX, 1ULL << 63 };

		h.h = chance(&t->rng, 50) ? odd[below(&t->rng, 6)] : rnd(&t->rng);
		h.size = GPAGE;
		return h;
	}
	pthread_mutex_lock(&t->p->lock);
	h = t->p->handles[below(&t->rng, NHANDLES)];
	/* Mostly a live one, when there is one: that is where the interesting states are. */
	if (chance(&t->rng, 70)) {
		int tries;

		for (tries = 0; tries < 8 && !h.live; tries++)
			h = t->p->handles[below(&t->rng, NHANDLES)];
	}
	pthread_mutex_unlock(&t->p->lock);
	if (h.file < 0)
		h.h = below(&t->rng, 64);
	return h;
}

static void remember_handle(struct thread *t, int file, uint64_t h, uint64_t addr, uint64_t len)
{
	uint64_t size = ((addr + len + GPAGE - 1) & ~(GPAGE - 1)) - (addr & ~(GPAGE - 1));

	pthread_mutex_lock(&t->p->lock);
	t->p->handles[below(&t->rng, NHANDLES)] =
		(struct handle){ .h = h, .size = size, .file = file, .live = true };
	pthread_mutex_unlock(&t->p->lock);
}

/* The handle is gone (unpinned, or its file closed when file_only): keep it as a stale one. */
static void forget_handles(struct thread *t, int file, uint64_t h, bool file_only)
{
	int i;

	pthread_mutex_lock(&t->p->lock);
	for (i = 0; i < NHANDLES; i++)
		if (t->p->handles[i].file == file && (file_only || t->p->handles[i].h == h))
			t->p->handles[i].live = false;
	pthread_mutex_unlock(&t->p->lock);
}

static uint64_t pick_addr(struct thread *t, const struct alloc *a)
{
	uint64_t base = a->va ? a->va : GPUSIM_VA_BASE + below(&t->rng, 64) * GPAGE;
	uint64_t size = a->size ? a->size : GPAGE;

	switch (below(&t->rng, 12)) {
	case 0: return 0;
	case 1: return rnd(&t->rng);
	case 2: return UINT64_MAX & ~(GPAGE - 1);
	case 3: return base - GPAGE;
	case 4: return base + below(&t->rng, size);			/* unaligned inside */
	case 5: return base + (below(&t->rng, size / GPAGE + 2)) * GPAGE;	/* up to past the end */
	case 6: return 0xffff888000000000ULL;			/* a kernel address */
	default: return base;
	}
}

static uint64_t pick_len(struct thread *t, uint64_t addr, const struct alloc *a)
{
	uint64_t size = a->size ? a->size : GPAGE;

	switch (below(&t->rng, 12)) {
	case 0: return 0;
	case 1: return 1;
	case 2: return rnd(&t->rng);
	case 3: return UINT64_MAX - addr + 1;			/* end wraps to 0 */
	case 4: return (UINT64_MAX & ~(GPAGE - 1)) - addr;	/* end at the top */
	case 5: return size + GPAGE;
	case 6: return 1 + below(&t->rng, size);
	case 7: return GPAGE;
	default: return size - (a->va && addr > a->va && addr < a->va + size ? addr - a->va : 0);
	}
}

/* ---- operations ------------------------------------------------------------------------ */

static void op_pin(struct thread *t)
{
	struct alloc a = pick_alloc(t);
	uint64_t addr = pick_addr(t, &a), len = pick_len(t, addr, &a), handle = 0;
	int fi, fd = pick_file(t, &fi), err;
	bool v2 = chance(&t->rng, 50);
	uint32_t flags = 0;

	if (v2) {
		struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS p = { .addr = addr, .size = len };

		if (chance(&t->rng, 15))
			flags = chance(&t->rng, 50) ? GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE :
						      (uint32_t)rnd(&t->rng);
		p.flags = flags;
		p.pad = chance(&t->rng, 10) ? (uint32_t)rnd(&t->rng) : 0;
		err = ioctl(fd, GDRDRV_IOC_PIN_BUFFER_V2, &p) ? errno : 0;
		handle = p.handle;
	} else {
		struct GDRDRV_IOC_PIN_BUFFER_PARAMS p = { .addr = addr, .size = len };

		if (chance(&t->rng, 10)) {
			p.p2p_token = rnd(&t->rng);
			p.va_space = (uint32_t)rnd(&t->rng);
		}
		err = ioctl(fd, GDRDRV_IOC_PIN_BUFFER, &p) ? errno : 0;
		handle = p.handle;
	}
	count(OP_PIN, !err);
	if (!err) {
		__atomic_add_fetch(&ctr->pins_ok, 1, __ATOMIC_RELAXED);
		if (!addr)
			fail(t, "pin of address 0 succeeded");
		if (flags & ~GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE)
			fail(t, "pin with unknown flags 0x%x succeeded", flags);
		remember_handle(t, fi, handle, addr, len);
		return;
	}
	/* EFAULT: page table refused; EBUSY/EAGAIN: never from pin, but NVIDIA-side races. */
	ALLOWED(t, "pin", err, EINVAL, ENOMEM, EFAULT);
}

static void op_unpin(struct thread *t)
{
	struct handle h = pick_handle(t);
	struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS p = { .handle = h.h };
	bool own = h.file >= 0 && chance(&t->rng, 90);
	int fd = own ? t->p->files[h.file] : pick_file(t, NULL);
	int err = ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &p) ? errno : 0;

	count(OP_UNPIN, !err);
	if (!err && own)
		forget_handles(t, h.file, h.h, false);
	if (err)
		ALLOWED(t, "unpin", err, EINVAL);
}

static void op_query(struct thread *t)
{
	struct handle h = pick_handle(t);
	int fd = h.file >= 0 && chance(&t->rng, 90) ? t->p->files[h.file] : pick_file(t, NULL);
	int err = 0;

	switch (below(&t->rng, 5)) {
	case 0: {
		struct GDRDRV_IOC_GET_CB_FLAG_PARAMS p = { .handle = h.h, .flag = 7 };

		err = ioctl(fd, GDRDRV_IOC_GET_CB_FLAG, &p) ? errno : 0;
		if (!err && p.flag > 1)
			fail(t, "cb flag %u", p.flag);
		if (!err && p.flag)
			__atomic_add_fetch(&ctr->callbacks_seen, 1, __ATOMIC_RELAXED);
		break;
	}
	case 1: {
		struct GDRDRV_IOC_GET_INFO_PARAMS p = { .handle = h.h };

		err = ioctl(fd, GDRDRV_IOC_GET_INFO, &p) ? errno : 0;
		if (!err && (p.page_size != GPAGE || p.va % GPAGE || p.mapped_size % GPAGE ||
			     p.mapped > 1 || p.wc_mapping > 1))
			fail(t, "get_info: va 0x%llx size 0x%llx page %u mapped %u wc %u",
			     (unsigned long long)p.va, (unsigned long long)p.mapped_size,
			     p.page_size, p.mapped, p.wc_mapping);
		break;
	}
	case 2: {
		struct GDRDRV_IOC_GET_INFO_V2_PARAMS p = { .handle = h.h };

		err = ioctl(fd, GDRDRV_IOC_GET_INFO_V2, &p) ? errno : 0;
		if (!err && (p.page_size != GPAGE || p.mapping_type > GDR_MR_DEVICE))
			fail(t, "get_info_v2: page %u type %u", p.page_size, p.mapping_type);
		break;
	}
	case 3: {
		struct GDRDRV_IOC_GET_ATTR_PARAMS p = {
			.attr = chance(&t->rng, 70) ? (uint32_t)below(&t->rng, 4) :
						      (uint32_t)rnd(&t->rng),
		};

		err = ioctl(fd, GDRDRV_IOC_GET_ATTR, &p) ? errno : 0;
		if (!err && (p.attr < 1 || p.attr > 2 || p.val > 1))
			fail(t, "get_attr %u -> ok %u", p.attr, p.val);
		if (!err && p.attr == GDRDRV_ATTR_USE_PERSISTENT_MAPPING &&
		    p.val != (uint32_t)opt_persistent)
			fail(t, "persistent attribute %u, expected %d", p.val, opt_persistent);
		if (err == EINVAL && p.attr >= 1 && p.attr <= 2)
			fail(t, "get_attr %u refused", p.attr);
		break;
	}
	default: {
		struct GDRDRV_IOC_GET_VERSION_PARAMS p = { 0 };

		err = ioctl(fd, GDRDRV_IOC_GET_VERSION, &p) ? errno : 0;
		if (!err && (p.gdrdrv_version != GDRDRV_VERSION ||
			     p.minimum_gdr_api_version != MINIMUM_GDR_API_VERSION))
			fail(t, "version 0x%x/0x%x", p.gdrdrv_version, p.minimum_gdr_api_version);
		break;
	}
	}
	count(OP_QUERY, !err);
	if (err)
		ALLOWED(t, "query", err, EINVAL);
}

static void op_req_type(struct thread *t)
{
	struct handle h = pick_handle(t);
	int fd = h.file >= 0 ? t->p->files[h.file] : pick_file(t, NULL);
	struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS p = {
		.handle = h.h,
		.mapping_type = chance(&t->rng, 90) ? (uint32_t)below(&t->rng, 5) :
						      (uint32_t)rnd(&t->rng),
	};
	int err = ioctl(fd, GDRDRV_IOC_REQ_MAPPING_TYPE, &p) ? errno : 0;

	count(OP_REQ_TYPE, !err);
	if (!err && p.mapping_type > GDR_MR_DEVICE)
		fail(t, "mapping type %u accepted", p.mapping_type);
	if (err)
		ALLOWED(t, "req_mapping_type", err, EINVAL, EBUSY, EOPNOTSUPP);
}

/* Commands of other drivers' types that the VFS itself serves: never sent (freeze, clone...). */
static bool vfs_type(unsigned int type)
{
	return type == 0 || type == 'T' || type == 'X' || type == 'f' || type == 0x94 ||
	       type == 'v' || type == 0x15;
}

static void op_raw_ioctl(struct thread *t)
{
	static const unsigned int nrs[] = { 1, 2, 3, 4, 5, 6, 7, 8, 255, 0, 9, 254 };
	unsigned char buf[128];
	unsigned int cmd;
	unsigned long arg;
	int fd = pick_file(t, NULL), err;
	size_t i;

	switch (below(&t->rng, 4)) {
	case 0: case 1:	/* a known number with any direction and size */
		cmd = _IOC((unsigned int)below(&t->rng, 4), GDRDRV_IOCTL, nrs[below(&t->rng, 12)],
			   (unsigned int)below(&t->rng, 1u << _IOC_SIZEBITS));
		break;
	case 2:
		cmd = _IOC((unsigned int)below(&t->rng, 4), GDRDRV_IOCTL,
			   (unsigned int)below(&t->rng, 256), (unsigned int)below(&t->rng, 64));
		break;
	default:
		do
			cmd = (unsigned int)rnd(&t->rng);
		while (vfs_type(_IOC_TYPE(cmd)));
		break;
	}
	for (i = 0; i < sizeof(buf); i += 8) {
		uint64_t v = rnd(&t->rng);

		/* Half the time: a small plausible handle in the first word. */
		if (i == 0 && chance(&t->rng, 50))
			v = below(&t->rng, 64);
		memcpy(buf + i, &v, 8);
	}
	switch (below(&t->rng, 6)) {
	case 0: arg = 0; break;
	case 1: arg = 0xffff888000000000UL + below(&t->rng, 1 << 20); break;
	case 2: arg = (unsigned long)rnd(&t->rng); break;
	case 3:	/* the structure runs into an unmapped page */
		arg = (unsigned long)(t->p->guard + page_size - 1 - below(&t->rng, 40));
		break;
	default: arg = (unsigned long)buf; break;
	}
	err = ioctl(fd, cmd, arg) ? errno : 0;
	count(OP_RAW_IOCTL, !err);
	if (err)
		ALLOWED(t, "raw ioctl", err, EINVAL, EFAULT, ENOMEM, EBUSY, EOPNOTSUPP);
}

/* Refill a hole in the arena so that nothing else gets mapped there. */
static void reserve(void *addr, size_t len)
{
	void *p = mmap(addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
		       -1, 0);

	if (p != MAP_FAILED && p != addr)
		munmap(p, len);	/* old kernels without NOREPLACE: not ours */
}

static void op_mmap(struct thread *t)
{
	struct handle h = pick_handle(t);
	int fd = h.file >= 0 && chance(&t->rng, 90) ? t->p->files[h.file] : pick_file(t, NULL);
	int slot = (int)below(&t->rng, NSLOTS);
	unsigned char *at = t->arena + slot * SLOT_SIZE;
	uint64_t size = h.size ? h.size : GPAGE, len, off;
	int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_FIXED;
	void *m;
	int err;

	switch (below(&t->rng, 10)) {
	case 0: len = page_size; break;
	case 1: len = size + page_size; break;
	case 2: len = size > GPAGE ? size - GPAGE : size; break;
	case 3: len = (below(&t->rng, SLOT_SIZE / page_size) + 1) * page_size; break;
	default: len = size; break;
	}
	if (len > SLOT_SIZE)
		len = SLOT_SIZE;
	off = h.h * page_size;
	if (chance(&t->rng, 10))
		off += (below(&t->rng, 4) + 1) * page_size;
	if (chance(&t->rng, 10))
		flags = MAP_PRIVATE | MAP_FIXED;
	if (chance(&t->rng, 10))
		prot = (int)below(&t->rng, 4);
	m = mmap(at, len, prot, flags, fd, (off_t)off);
	err = m == MAP_FAILED ? errno : 0;
	count(OP_MMAP, !err);
	if (err) {
		/* A failed MAP_FIXED may have removed what was there. */
		reserve(at, SLOT_SIZE);
		t->slot_len[slot] = 0;
		ALLOWED(t, "mmap", err, EINVAL, EACCES, EAGAIN, ENOMEM, EOVERFLOW, ENODEV, EPERM);
		return;
	}
	if (m != at)
		fail(t, "MAP_FIXED mapped at %p, not %p", m, (void *)at);
	if (!(flags & MAP_SHARED))
		fail(t, "private mapping of a gdrdrv handle accepted");
	__atomic_add_fetch(&ctr->maps_ok, 1, __ATOMIC_RELAXED);
	t->slot_len[slot] = len;
}

static void op_unmap(struct thread *t)
{
	int slot = (int)below(&t->rng, NSLOTS);
	unsigned char *at = t->arena + slot * SLOT_SIZE;
	uint64_t len = t->slot_len[slot] ? t->slot_len[slot] : GPAGE;
	uint64_t start = 0, n = len;
	int err = 0;

	if (chance(&t->rng, 40)) {	/* a piece: splits the VMA */
		start = below(&t->rng, len / page_size) * page_size;
		n = (below(&t->rng, (len - start) / page_size) + 1) * page_size;
	}
	if (chance(&t->rng, 50)) {
		err = munmap(at + start, n) ? errno : 0;
		reserve(at + start, n);
	} else {
		void *m = mmap(at + start, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
			       -1, 0);

		err = m == MAP_FAILED ? errno : 0;
	}
	if (start == 0 && n >= len)
		t->slot_len[slot] = 0;
	count(OP_UNMAP, !err);
	if (err)
		fail(t, "unmap of %p+0x%" PRIx64 ": %s", (void *)(at + start), n, strerror(err));
}

static void op_mremap(struct thread *t)
{
	int from = (int)below(&t->rng, NSLOTS), to = (int)below(&t->rng, NSLOTS);
	unsigned char *src = t->arena + from * SLOT_SIZE, *dst = t->arena + to * SLOT_SIZE;
	uint64_t len = t->slot_len[from] ? t->slot_len[from] : page_size, newlen = len;
	void *m;
	int err;

	switch (below(&t->rng, 4)) {
	case 0: newlen = len + page_size; break;				/* grow: refused */
	case 1: newlen = len > page_size ? len - page_size : len; break;	/* shrink */
	default: break;
	}
	if (newlen > SLOT_SIZE)
		newlen = SLOT_SIZE;
	if (from == to || chance(&t->rng, 20)) {
		m = mremap(src, len, newlen, 0);
		to = from;
	} else if (chance(&t->rng, 10)) {
		/* Refused for PFN mappings; for an anonymous reservation the source stays mapped. */
		m = mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, dst);
		newlen = len;
		if (m != MAP_FAILED) {
			count(OP_MREMAP, true);
			t->slot_len[to] = 0;
			return;
		}
	} else {
		m = mremap(src, len, newlen, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
	}
	err = m == MAP_FAILED ? errno : 0;
	count(OP_MREMAP, !err);
	if (err) {
		ALLOWED(t, "mremap", err, EFAULT, EINVAL, ENOMEM, EAGAIN);
		return;
	}
	if (to != from) {
		reserve(src, SLOT_SIZE);
		t->slot_len[from] = 0;
	} else if (newlen < len) {
		reserve(src + newlen, len - newlen);
	}
	t->slot_len[to] = newlen;
}

static void op_mprotect(struct thread *t)
{
	int slot = (int)below(&t->rng, NSLOTS);
	unsigned char *at = t->arena + slot * SLOT_SIZE;
	uint64_t len = t->slot_len[slot] ? t->slot_len[slot] : page_size;
	static const int advice[] = { MADV_DONTNEED, MADV_DOFORK, MADV_DONTFORK, MADV_WILLNEED,
				      MADV_NORMAL, MADV_DONTDUMP, MADV_DODUMP, MADV_COLD };
	int err;

	if (chance(&t->rng, 25)) {	/* a piece: splits the VMA */
		uint64_t start = below(&t->rng, len / page_size) * page_size;

		err = mprotect(at + start, page_size, (int)below(&t->rng, 4)) ? errno : 0;
		count(OP_MPROTECT, !err);
		if (err)
			ALLOWED(t, "mprotect (piece)", err, EACCES, ENOMEM, EINVAL);
	} else if (chance(&t->rng, 50)) {
		err = mprotect(at, len, (int)below(&t->rng, 4)) ? errno : 0;
		count(OP_MPROTECT, !err);
		if (err)
			ALLOWED(t, "mprotect", err, EACCES, ENOMEM, EINVAL);
	} else {
		err = madvise(at, len, advice[below(&t->rng, 8)]) ? errno : 0;
		count(OP_MPROTECT, !err);
		if (err)
			ALLOWED(t, "madvise", err, EINVAL, ENOMEM, EAGAIN, EBADF, EPERM);
	}
}

/* An access from user space: any thread's slot for reads, our own for writes. */
static void op_access(struct thread *t)
{
	struct thread *owner = chance(&t->rng, 30) ?
		&t->p->threads[below(&t->rng, (uint64_t)t->p->nthreads)] : t;
	int slot = (int)below(&t->rng, NSLOTS), tries;
	uint64_t len;
	volatile uint32_t *p;
	int sig;

	for (tries = 0; tries < 8 && !owner->slot_len[slot]; tries++)
		slot = (int)below(&t->rng, NSLOTS);
	len = owner->slot_len[slot] ? owner->slot_len[slot] : page_size;
	p = (volatile uint32_t *)(owner->arena + slot * SLOT_SIZE + (below(&t->rng, len) & ~3ULL));
	sig = probe(p, owner == t && chance(&t->rng, 50), (uint32_t)rnd(&t->rng));

	count(OP_ACCESS, !sig);
	if (sig == SIGBUS)
		__atomic_add_fetch(&ctr->sigbus, 1, __ATOMIC_RELAXED);
	else if (sig == SIGSEGV)
		__atomic_add_fetch(&ctr->sigsegv, 1, __ATOMIC_RELAXED);
}

/* Accesses by the kernel on our behalf: copy_{from,to}_user through the fault handler. */
static void op_kaccess(struct thread *t)
{
	int slot = (int)below(&t->rng, NSLOTS);
	uint64_t len = t->slot_len[slot] ? t->slot_len[slot] : page_size;
	uint64_t off = below(&t->rng, len), n = 1 + below(&t->rng, 256);
	unsigned char *at = t->arena + slot * SLOT_SIZE + off;
	char sink[256];
	ssize_t r;
	int err;

	if (off + n > SLOT_SIZE)
		n = SLOT_SIZE - off;
	if (chance(&t->rng, 25)) {
		/* Remote access (ptrace, /proc/pid/mem) to a PFN mapping: refused, never a crash. */
		r = pread(t->p->memfd, sink, n, (off_t)(uintptr_t)at);
		count(OP_KACCESS, r >= 0);
		if (r < 0)
			ALLOWED(t, "/proc/self/mem read", errno, EIO, EFAULT);
		return;
	}
	pthread_mutex_lock(&t->p->lock);	/* the pipe is shared: keep it drained */
	r = write(t->p->pipefd[1], at, n);
	err = r < 0 ? errno : 0;
	if (r > 0) {
		ssize_t back = read(t->p->pipefd[0], chance(&t->rng, 50) ? (char *)at : sink,
				    (size_t)r);

		if (back < 0 && errno == EFAULT)	/* could not land in the mapping: drain */
			back = read(t->p->pipefd[0], sink, (size_t)r);
		if (back != r)
			fail(t, "pipe drain: %zd of %zd", back, r);
	}
	pthread_mutex_unlock(&t->p->lock);
	count(OP_KACCESS, !err);
	if (err)
		ALLOWED(t, "write from mapping", err, EFAULT);
}

/*
 * Whether op_gs_reset has replaced the gpusim file since this thread read p->gs together with
 * `gen`: then the number it holds may be closed, or reused by any file the process opened after
 * (a gdrdrv file from op_reopen answers a gpusim ioctl with EINVAL), and no answer through it is a
 * finding. The count, not the number, tells: after more resets and reopens, p->gs can be that
 * same number again, naming another gpusim file (seen once in CI, seed 0x6d5a08a9259cabce).
 */
static bool gs_replaced(struct proc *p, unsigned gen)
{
	bool replaced;

	pthread_mutex_lock(&p->lock);
	replaced = p->gs_gen != gen;
	pthread_mutex_unlock(&p->lock);
	return replaced;
}

static void op_gs_free(struct thread *t)
{
	struct proc *p = t->p;
	int i = (int)below(&t->rng, NALLOCS), err, gs;
	unsigned gen;
	struct gpusim_free f;
	struct gpusim_alloc a = { 0 };

	pthread_mutex_lock(&p->lock);
	gs = p->gs;
	gen = p->gs_gen;
	f.gpu_va = p->allocs[i].va ? p->allocs[i].va : rnd(&t->rng);
	p->allocs[i].va = 0;
	pthread_mutex_unlock(&p->lock);
	/* Free callbacks run inside this call, racing the other threads' use of the pins. */
	err = ioctl(gs, GPUSIM_IOC_FREE, &f) ? errno : 0;
	count(OP_GS_FREE, !err);
	if (err && err != EINVAL && err != EBADF && !gs_replaced(p, gen))
		fail(t, "gpusim free: %s", strerror(err));
	a.size = chance(&t->rng, 30) ? 1 + below(&t->rng, MAX_ALLOC) :
				       (1 + below(&t->rng, MAX_ALLOC / GPAGE)) * GPAGE;
	if (ioctl(gs, GPUSIM_IOC_ALLOC, &a) == 0) {
		pthread_mutex_lock(&p->lock);
		p->allocs[i] = (struct alloc){ .va = a.gpu_va, .size = (a.size + GPAGE - 1) & ~(GPAGE - 1) };
		pthread_mutex_unlock(&p->lock);
	} else if (errno != ENOMEM && errno != EBADF) {
		err = errno;
		if (!gs_replaced(p, gen))
			fail(t, "gpusim alloc of 0x%llx: %s", (unsigned long long)a.size, strerror(err));
	}
}

/* Close the process's GPU space: every allocation dies at once. */
static void op_gs_reset(struct thread *t)
{
	struct proc *p = t->p;
	int nfd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC), old;

	if (nfd < 0) {
		fail(t, "open gpusim: %s", strerror(errno));
		return;
	}
	pthread_mutex_lock(&p->lock);
	old = p->gs;
	p->gs = nfd;
	p->gs_gen++;
	memset(p->allocs, 0, sizeof(p->allocs));
	pthread_mutex_unlock(&p->lock);
	/* Other threads may still be using old's number: they see EBADF or whatever file gets it next. */
	close(old);
	count(OP_GS_RESET, true);
}

/* Close a gdrdrv file holding pins and mappings, open a new one in its place. */
static void op_reopen(struct thread *t)
{
	struct proc *p = t->p;
	int i = (int)below(&t->rng, NFILES);
	int nfd = open("/dev/gdrdrv", O_RDWR | O_CLOEXEC), old;

	if (nfd < 0) {
		fail(t, "open gdrdrv: %s", strerror(errno));
		return;
	}
	pthread_mutex_lock(&p->lock);
	old = p->files[i];
	p->files[i] = nfd;
	pthread_mutex_unlock(&p->lock);
	forget_handles(t, i, 0, true);
	close(old);
	count(OP_REOPEN, true);
}

/*
 * A child of a multithreaded process: only raw system calls. It must be refused every use of
 * the inherited files and must not see any gdrdrv mapping. Exit status: 0, or 1 + check number.
 */
static int child_main(struct thread *t)
{
	struct GDRDRV_IOC_GET_VERSION_PARAMS v;
	struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS pin = { .addr = GPUSIM_VA_BASE, .size = GPAGE };
	static char maps[4096];
	size_t keep = 0;
	ssize_t n;
	int i, mfd;

	for (i = 0; i < NFILES; i++) {
		int fd = t->p->files[i];

		if (ioctl(fd, GDRDRV_IOC_GET_VERSION, &v) == 0 || (errno != EACCES && errno != EBADF))
			return 2;
		if (ioctl(fd, GDRDRV_IOC_PIN_BUFFER_V2, &pin) == 0 ||
		    (errno != EACCES && errno != EBADF))
			return 3;
		if (mmap(NULL, GPAGE, PROT_READ, MAP_SHARED, fd, 0) != MAP_FAILED ||
		    (errno != EACCES && errno != EBADF && errno != ENODEV))
			return 4;
	}
	/* No gdrdrv mapping may have been inherited (VM_DONTCOPY; MADV_DOFORK must not undo it). */
	mfd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (mfd < 0)
		return 5;
	while ((n = read(mfd, maps + keep, sizeof(maps) - 1 - keep)) > 0) {
		size_t len = keep + (size_t)n;

		maps[len] = 0;
		if (strstr(maps, "/dev/gdrdrv"))
			return 6;
		/* Keep the tail: the name may straddle two reads. */
		keep = len < 16 ? len : 16;
		memmove(maps, maps + len - keep, keep);
	}
	close(mfd);
	/* Sometimes the child's exit is what drops the last reference of a file. */
	if (below(&t->rng, 2))
		for (i = 0; i < NFILES; i++)
			close(t->p->files[i]);
	else
		usleep((useconds_t)below(&t->rng, 2000));
	return 0;
}

static void reap(struct proc *p, bool all)
{
	int i = 0;

	while (i < p->nchildren) {
		int st;
		pid_t r = waitpid(p->children[i], &st, all ? 0 : WNOHANG);

		if (r == 0) {
			i++;
			continue;
		}
		if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			fail(NULL, "fork child %d: status 0x%x (check %d)", p->children[i], st,
			     WIFEXITED(st) ? WEXITSTATUS(st) - 1 : -1);
		p->children[i] = p->children[--p->nchildren];
	}
}

static void op_fork(struct thread *t)
{
	struct proc *p = t->p;
	pid_t pid;

	pthread_mutex_lock(&p->lock);
	reap(p, false);
	if (p->nchildren >= (int)(sizeof(p->children) / sizeof(p->children[0]))) {
		pthread_mutex_unlock(&p->lock);
		return;
	}
	pid = fork();
	if (pid == 0)
		_exit(child_main(t));
	if (pid > 0)
		p->children[p->nchildren++] = pid;
	pthread_mutex_unlock(&p->lock);
	count(OP_FORK, pid > 0);
	if (pid < 0)
		fail(t, "fork: %s", strerror(errno));
	else
		__atomic_add_fetch(&ctr->fork_children, 1, __ATOMIC_RELAXED);
}

/* Relative weights: ioctls dominate, the expensive operations are rare. */
static const unsigned int weights[OP_COUNT] = {
	[OP_PIN] = 140, [OP_UNPIN] = 90, [OP_QUERY] = 120, [OP_REQ_TYPE] = 50,
	[OP_RAW_IOCTL] = 150, [OP_MMAP] = 110, [OP_UNMAP] = 60, [OP_MREMAP] = 40,
	[OP_MPROTECT] = 30, [OP_ACCESS] = 120, [OP_KACCESS] = 30, [OP_GS_FREE] = 40,
	[OP_GS_RESET] = 2, [OP_REOPEN] = 8, [OP_FORK] = 2,
};

static void (*const ops[OP_COUNT])(struct thread *) = {
	op_pin, op_unpin, op_query, op_req_type, op_raw_ioctl, op_mmap, op_unmap, op_mremap,
	op_mprotect, op_access, op_kaccess, op_gs_free, op_gs_reset, op_reopen, op_fork,
};

static void *thread_main(void *arg)
{
	struct thread *t = arg;
	unsigned int total = 0, i;
	uint64_t budget = opt_ops / (uint64_t)(opt_procs * opt_threads);

	for (i = 0; i < OP_COUNT; i++)
		total += weights[i];
	for (t->ops = 0; t->ops < budget && !t->failed; t->ops++) {
		unsigned int w = (unsigned int)below(&t->rng, total);

		for (i = 0; w >= weights[i]; i++)
			w -= weights[i];
		ops[i](t);
	}
	return NULL;
}

static int worker(int index)
{
	struct thread threads[MAX_THREADS];
	struct sigaction sa = { .sa_handler = probe_handler };
	struct proc *p = &proc;
	int i;

	memset(p, 0, sizeof(*p));
	p->index = index;
	pthread_mutex_init(&p->lock, NULL);
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_NODEFER;
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (pipe2(p->pipefd, O_CLOEXEC | O_NONBLOCK)) {
		fail(NULL, "pipe: %s", strerror(errno));
		return 1;
	}
	p->memfd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
	if (p->memfd < 0) {
		fail(NULL, "open /proc/self/mem: %s", strerror(errno));
		return 1;
	}
	p->guard = mmap(NULL, 2 * page_size, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p->guard == MAP_FAILED || mprotect(p->guard + page_size, page_size, PROT_NONE)) {
		fail(NULL, "guard page: %s", strerror(errno));
		return 1;
	}
	memset(p->guard, 0, page_size);
	p->gs = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (p->gs < 0) {
		fail(NULL, "open %s: %s", GPUSIM_DEVICE_PATH, strerror(errno));
		return 1;
	}
	for (i = 0; i < NFILES; i++) {
		p->files[i] = open("/dev/gdrdrv", O_RDWR | O_CLOEXEC);
		if (p->files[i] < 0) {
			fail(NULL, "open /dev/gdrdrv: %s", strerror(errno));
			return 1;
		}
	}
	for (i = 0; i < NHANDLES; i++)
		p->handles[i].file = -1;
	p->threads = threads;
	p->nthreads = opt_threads;
	memset(threads, 0, sizeof(threads));
	for (i = 0; i < opt_threads; i++) {
		struct thread *t = &threads[i];

		t->p = p;
		t->index = i;
		t->rng.s = opt_seed ^ ((uint64_t)index << 40) ^ ((uint64_t)i << 20);
		(void)rnd(&t->rng);
		t->arena = mmap(NULL, NSLOTS * SLOT_SIZE, PROT_NONE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (t->arena == MAP_FAILED) {
			fail(NULL, "arena: %s", strerror(errno));
			return 1;
		}
	}
	/* Allocations to start with. */
	for (i = 0; i < NALLOCS; i++)
		op_gs_free(&threads[0]);
	threads[0].failed = false;
	for (i = 0; i < opt_threads; i++)
		if (pthread_create(&threads[i].tid, NULL, thread_main, &threads[i])) {
			fail(NULL, "pthread_create");
			return 1;
		}
	for (i = 0; i < opt_threads; i++)
		pthread_join(threads[i].tid, NULL);
	reap(p, true);
	/* Leave with pins and mappings in place half the time: exit must clean them up. */
	if (opt_seed & (1ULL << index)) {
		for (i = 0; i < opt_threads; i++)
			munmap(threads[i].arena, NSLOTS * SLOT_SIZE);
		for (i = 0; i < NFILES; i++)
			close(p->files[i]);
		close(p->gs);
	}
	return __atomic_load_n(&ctr->failures, __ATOMIC_RELAXED) ? 1 : 0;
}

static uint64_t parse_u64(const char *s, const char *what)
{
	char *end;
	uint64_t v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || !*s || *end) {
		fprintf(stderr, "gdrdrv_fuzz: bad %s '%s'\n", what, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	bool have_seed = false;
	struct timespec t0, t1;
	pid_t pids[MAX_PROCS];
	int i, bad = 0;
	uint64_t total = 0;

	for (i = 1; i < argc; i++) {
		if (!strncmp(argv[i], "--seed=", 7)) {
			opt_seed = parse_u64(argv[i] + 7, "seed");
			have_seed = true;
		} else if (!strncmp(argv[i], "--ops=", 6)) {
			opt_ops = parse_u64(argv[i] + 6, "ops");
		} else if (!strncmp(argv[i], "--procs=", 8)) {
			opt_procs = (int)parse_u64(argv[i] + 8, "procs");
		} else if (!strncmp(argv[i], "--threads=", 10)) {
			opt_threads = (int)parse_u64(argv[i] + 10, "threads");
		} else if (!strncmp(argv[i], "--persistent=", 13)) {
			opt_persistent = (int)parse_u64(argv[i] + 13, "persistent");
		} else {
			fprintf(stderr, "usage: gdrdrv_fuzz [--seed=N] [--ops=N] [--procs=N] "
				"[--threads=N] [--persistent=0|1]\n");
			return 2;
		}
	}
	if (opt_procs < 1 || opt_procs > MAX_PROCS || opt_threads < 1 || opt_threads > MAX_THREADS) {
		fprintf(stderr, "gdrdrv_fuzz: 1..%d processes, 1..%d threads\n", MAX_PROCS,
			MAX_THREADS);
		return 2;
	}
	if (!have_seed) {
		int fd = open("/dev/urandom", O_RDONLY);

		if (fd < 0 || read(fd, &opt_seed, sizeof(opt_seed)) != sizeof(opt_seed))
			opt_seed = (uint64_t)time(NULL) * 2654435761ULL ^ (uint64_t)getpid();
		if (fd >= 0)
			close(fd);
	}
	page_size = (uint64_t)sysconf(_SC_PAGESIZE);
	/* First line, before anything can go wrong: how to replay this run. */
	printf("gdrdrv_fuzz: seed=0x%" PRIx64 " ops=%" PRIu64 " procs=%d threads=%d persistent=%d\n",
	       opt_seed, opt_ops, opt_procs, opt_threads, opt_persistent);
	fflush(stdout);

	ctr = mmap(NULL, sizeof(*ctr), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (ctr == MAP_FAILED) {
		perror("mmap counters");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < opt_procs; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			fflush(stderr);
			_exit(worker(i));
		}
		if (pids[i] < 0) {
			perror("fork");
			return 1;
		}
	}
	for (i = 0; i < opt_procs; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "FUZZ FAIL seed=0x%" PRIx64 ": worker %d status 0x%x%s\n",
				opt_seed, i, st, WIFSIGNALED(st) ? " (killed by a signal)" : "");
			bad = 1;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (i = 0; i < OP_COUNT; i++) {
		printf("  %-13s %8" PRIu64 " ops %8" PRIu64 " ok\n", op_names[i], ctr->ops[i],
		       ctr->ok[i]);
		total += ctr->ops[i];
	}
	printf("gdrdrv_fuzz: seed=0x%" PRIx64 " total ops %" PRIu64 " in %.1f s; pins %" PRIu64
	       ", mappings %" PRIu64 ", SIGBUS %" PRIu64 ", SIGSEGV %" PRIu64
	       ", invalidated handles seen %" PRIu64 ", fork children %" PRIu64 ", failures %" PRIu64
	       "\n", opt_seed, total,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
	       ctr->pins_ok, ctr->maps_ok, ctr->sigbus, ctr->sigsegv, ctr->callbacks_seen,
	       ctr->fork_children, ctr->failures);
	if (bad || ctr->failures) {
		printf("gdrdrv_fuzz: FAIL (replay: gdrdrv_fuzz --seed=0x%" PRIx64 " --ops=%" PRIu64
		       " --procs=%d --threads=%d --persistent=%d)\n", opt_seed, opt_ops, opt_procs,
		       opt_threads, opt_persistent);
		return 1;
	}
	printf("gdrdrv_fuzz: PASS\n");
	return 0;
}
