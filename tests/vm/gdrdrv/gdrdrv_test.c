// SPDX-License-Identifier: MIT
/*
 * gdrdrv_test - talks to /dev/gdrdrv directly through its ioctl ABI (kmod/gdrdrv/gdrdrv.h),
 * with GPU memory from the simulated GPU (/dev/gpusim, kmod/gpusim/gpusim_uapi.h).
 *
 *   gdrdrv_test --persistent=0|1 [NAME...]
 *
 * --persistent tells which mode the loaded module is expected to be in (module parameter
 * use_persistent_mapping); tests that only make sense in the other mode are skipped with a
 * message. Without names every test runs. Each test runs in its own child process, so a
 * crash or stray signal fails that test only. Prints "ok - NAME", "skip - NAME: why" or
 * "not ok - NAME: reason" and exits non-zero if any test failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gdrdrv.h"
#include "gpusim_uapi.h"
#include "../lib/check.h"

#define GPAGE 0x10000ULL
#define GDRDRV_PATH "/dev/gdrdrv"

/* The ABI numbers, checked against the values the original driver uses on 64-bit Linux. */
_Static_assert(GDRDRV_IOC_PIN_BUFFER == 0xC028DA01, "PIN_BUFFER");
_Static_assert(GDRDRV_IOC_UNPIN_BUFFER == 0xC008DA02, "UNPIN_BUFFER");
_Static_assert(GDRDRV_IOC_GET_CB_FLAG == 0xC008DA03, "GET_CB_FLAG");
_Static_assert(GDRDRV_IOC_GET_INFO == 0xC008DA04, "GET_INFO");
_Static_assert(GDRDRV_IOC_GET_INFO_V2 == 0xC008DA05, "GET_INFO_V2");
_Static_assert(GDRDRV_IOC_GET_ATTR == 0xC008DA06, "GET_ATTR");
_Static_assert(GDRDRV_IOC_PIN_BUFFER_V2 == 0xC020DA07, "PIN_BUFFER_V2");
_Static_assert(GDRDRV_IOC_REQ_MAPPING_TYPE == 0xC008DA08, "REQ_MAPPING_TYPE");
_Static_assert(GDRDRV_IOC_GET_VERSION == 0xC008DAFF, "GET_VERSION");
_Static_assert(sizeof(struct GDRDRV_IOC_PIN_BUFFER_PARAMS) == 40, "pin size");
_Static_assert(__builtin_offsetof(struct GDRDRV_IOC_PIN_BUFFER_PARAMS, handle) == 32, "pin handle");
_Static_assert(sizeof(struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS) == 32, "pin v2 size");
_Static_assert(__builtin_offsetof(struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS, handle) == 24, "pin v2 handle");
_Static_assert(sizeof(struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS) == 8, "unpin size");
_Static_assert(sizeof(struct GDRDRV_IOC_GET_CB_FLAG_PARAMS) == 16, "cb size");
_Static_assert(sizeof(struct GDRDRV_IOC_GET_INFO_PARAMS) == 48, "info size");
_Static_assert(__builtin_offsetof(struct GDRDRV_IOC_GET_INFO_PARAMS, wc_mapping) == 44, "info wc");
_Static_assert(sizeof(struct GDRDRV_IOC_GET_INFO_V2_PARAMS) == 48, "info v2 size");
_Static_assert(__builtin_offsetof(struct GDRDRV_IOC_GET_INFO_V2_PARAMS, mapping_type) == 40, "v2 type");
_Static_assert(sizeof(struct GDRDRV_IOC_GET_ATTR_PARAMS) == 8, "attr size");
_Static_assert(sizeof(struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS) == 16, "req size");
_Static_assert(sizeof(struct GDRDRV_IOC_GET_VERSION_PARAMS) == 8, "version size");
_Static_assert(GDRDRV_VERSION == 0x00020006 && MINIMUM_GDR_API_VERSION == 0x00020000, "versions");

static const char *cur_test;
static bool persistent;		/* mode the module is expected to run in */
static long page_size;

/* ---- /dev/gpusim ------------------------------------------------------------------------- */

static int gs_open(void)
{
	return open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
}

static int gs_alloc(int fd, uint64_t size, uint64_t *va)
{
	struct gpusim_alloc a = { .size = size };

	if (ioctl(fd, GPUSIM_IOC_ALLOC, &a))
		return errno;
	*va = a.gpu_va;
	return 0;
}

static int gs_free(int fd, uint64_t va)
{
	struct gpusim_free f = { .gpu_va = va };

	return ioctl(fd, GPUSIM_IOC_FREE, &f) ? errno : 0;
}

static uint64_t gs_active_pins(int fd)
{
	struct gpusim_info i;

	if (ioctl(fd, GPUSIM_IOC_INFO, &i))
		return UINT64_MAX;
	return i.active_pins;
}

/* The simulated GPU's own view of [va, va + len). */
static void *gs_map(int fd, uint64_t va, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)va);

	return p == MAP_FAILED ? NULL : p;
}

/* ---- /dev/gdrdrv ------------------------------------------------------------------------- */

static int gdr_open(void)
{
	return open(GDRDRV_PATH, O_RDWR | O_CLOEXEC);
}

static int pin_v1(int fd, uint64_t addr, uint64_t size, uint64_t token, uint32_t va_space,
		  uint64_t *handle)
{
	struct GDRDRV_IOC_PIN_BUFFER_PARAMS p = {
		.addr = addr, .size = size, .p2p_token = token, .va_space = va_space,
		.handle = 0xdeadbeef,
	};

	if (ioctl(fd, GDRDRV_IOC_PIN_BUFFER, &p))
		return errno;
	if (handle)
		*handle = p.handle;
	return 0;
}

static int pin_v2(int fd, uint64_t addr, uint64_t size, uint32_t flags, uint64_t *handle)
{
	struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS p = {
		.addr = addr, .size = size, .flags = flags, .handle = 0xdeadbeef,
	};

	if (ioctl(fd, GDRDRV_IOC_PIN_BUFFER_V2, &p))
		return errno;
	if (handle)
		*handle = p.handle;
	return 0;
}

static int pin(int fd, uint64_t addr, uint64_t size, uint64_t *handle)
{
	return pin_v2(fd, addr, size, 0, handle);
}

static int unpin(int fd, uint64_t handle)
{
	struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS p = { .handle = handle };

	return ioctl(fd, GDRDRV_IOC_UNPIN_BUFFER, &p) ? errno : 0;
}

static int get_info(int fd, uint64_t handle, struct GDRDRV_IOC_GET_INFO_PARAMS *p)
{
	memset(p, 0xa5, sizeof(*p));
	p->handle = handle;
	return ioctl(fd, GDRDRV_IOC_GET_INFO, p) ? errno : 0;
}

static int get_info_v2(int fd, uint64_t handle, struct GDRDRV_IOC_GET_INFO_V2_PARAMS *p)
{
	memset(p, 0xa5, sizeof(*p));
	p->handle = handle;
	return ioctl(fd, GDRDRV_IOC_GET_INFO_V2, p) ? errno : 0;
}

static int get_cb_flag(int fd, uint64_t handle, uint32_t *flag)
{
	struct GDRDRV_IOC_GET_CB_FLAG_PARAMS p = { .handle = handle, .flag = 0xdead };

	if (ioctl(fd, GDRDRV_IOC_GET_CB_FLAG, &p))
		return errno;
	*flag = p.flag;
	return 0;
}

static int get_attr(int fd, uint32_t attr, uint32_t *val)
{
	struct GDRDRV_IOC_GET_ATTR_PARAMS p = { .attr = attr, .val = 0xdeadbeef };
	int ret = ioctl(fd, GDRDRV_IOC_GET_ATTR, &p) ? errno : 0;

	*val = p.val;
	return ret;
}

static int req_type(int fd, uint64_t handle, uint32_t type)
{
	struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS p = { .handle = handle, .mapping_type = type };

	return ioctl(fd, GDRDRV_IOC_REQ_MAPPING_TYPE, &p) ? errno : 0;
}

/* mmap a handle the way the library does; NULL with errno set on failure. */
static void *gdr_map(int fd, uint64_t handle, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       (off_t)(handle * (uint64_t)page_size));

	return p == MAP_FAILED ? NULL : p;
}

/* ---- probing memory for signals ------------------------------------------------------ */

static sigjmp_buf probe_jmp;
static volatile sig_atomic_t probe_active;

static void probe_handler(int sig)
{
	if (probe_active)
		siglongjmp(probe_jmp, sig);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install_probe_handlers(void)
{
	struct sigaction sa = { .sa_handler = probe_handler };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
}

/*
 * 0 if the access to *p works, else the signal it raised: a read into *out, or, with out NULL,
 * a write of v.
 */
static int probe_access(volatile uint32_t *p, uint32_t *out, uint32_t v)
{
	int sig;

	install_probe_handlers();
	sig = sigsetjmp(probe_jmp, 1);
	if (sig) {
		probe_active = 0;
		return sig;
	}
	probe_active = 1;
	if (out) {
		*out = *p;
	} else {
		*p = v;
		__sync_synchronize();
	}
	probe_active = 0;
	return 0;
}

static int probe_read(volatile uint32_t *p, uint32_t *out)
{
	return probe_access(p, out, 0);
}

static int probe_write(volatile uint32_t *p, uint32_t v)
{
	return probe_access(p, NULL, v);
}

/* ---- data helpers ------------------------------------------------------------------------ */

static uint32_t pattern(uint32_t seed, size_t i)
{
	uint32_t x = seed ^ (uint32_t)(i * 2654435761u);

	x ^= x >> 13;
	x *= 0x5bd1e995;
	return x ^ (x >> 15);
}

static void fill(volatile uint32_t *p, size_t bytes, uint32_t seed)
{
	for (size_t i = 0; i < bytes / 4; i++)
		p[i] = pattern(seed, i);
	__sync_synchronize();
}

/* Index of the first word that differs, or -1. */
static long verify(volatile uint32_t *p, size_t bytes, uint32_t seed)
{
	__sync_synchronize();
	for (size_t i = 0; i < bytes / 4; i++)
		if (p[i] != pattern(seed, i))
			return (long)i;
	return -1;
}

/* A pinned allocation with both views mapped. */
struct buf {
	int gs, gdr;
	uint64_t va, size, handle;
	void *gpu;	/* simulator's view */
	void *cpu;	/* gdrdrv mapping */
};

static int buf_setup(struct buf *b, int gs, int gdr, uint64_t size, bool map)
{
	memset(b, 0, sizeof(*b));
	b->gs = gs;
	b->gdr = gdr;
	b->size = size;
	CHECK_RET(gs_alloc(gs, size, &b->va), 0);
	b->gpu = gs_map(gs, b->va, size);
	CHECK(b->gpu, "gpusim mmap: %s", strerror(errno));
	CHECK_RET(pin(gdr, b->va, size, &b->handle), 0);
	if (map) {
		b->cpu = gdr_map(gdr, b->handle, size);
		CHECK(b->cpu, "gdrdrv mmap of handle %" PRIu64 ": %s", b->handle, strerror(errno));
	}
	return 0;
}

static int buf_teardown(struct buf *b)
{
	if (b->cpu)
		CHECK_OK(munmap(b->cpu, b->size));
	CHECK_RET(unpin(b->gdr, b->handle), 0);
	if (b->gpu)
		CHECK_OK(munmap(b->gpu, b->size));
	CHECK_RET(gs_free(b->gs, b->va), 0);
	return 0;
}

/* buf_teardown, then close the gdrdrv file the buffer was pinned through. */
static int buf_teardown_close(struct buf *b)
{
	if (buf_teardown(b))
		return -1;
	close(b->gdr);
	return 0;
}

/* The usual end of a test holding one pin h of the allocation va: unpin, close gdrdrv, free. */
static int unpin_close_free(int gs, int fd, uint64_t va, uint64_t h)
{
	CHECK_RET(unpin(fd, h), 0);
	close(fd);
	CHECK_RET(gs_free(gs, va), 0);
	return 0;
}

static int wait_child(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

/* Wait up to ~5 s for gpusim's pin count to reach want (releases run at file close). */
static int wait_pins(int gs, uint64_t want, uint64_t *got)
{
	for (int i = 0; i < 500; i++) {
		*got = gs_active_pins(gs);
		if (*got == want)
			return 0;
		usleep(10000);
	}
	return -1;
}

/* ---- tests ------------------------------------------------------------------------------ */

static int t_version(void)
{
	int fd = gdr_open();
	struct GDRDRV_IOC_GET_VERSION_PARAMS v;

	CHECK(fd >= 0, "open %s: %s", GDRDRV_PATH, strerror(errno));
	memset(&v, 0xff, sizeof(v));
	CHECK_OK(ioctl(fd, GDRDRV_IOC_GET_VERSION, &v));
	CHECK(v.gdrdrv_version == 0x00020006, "gdrdrv_version 0x%x", v.gdrdrv_version);
	CHECK(v.minimum_gdr_api_version == 0x00020000, "minimum api 0x%x",
	      v.minimum_gdr_api_version);
	close(fd);
	return 0;
}

static int t_bad_ioctl(void)
{
	int fd = gdr_open();
	char buf[64] = { 0 };
	void *ro;

	CHECK(fd >= 0, "open: %s", strerror(errno));
	/* Wrong type byte, whatever the number. */
	CHECK_ERR(ioctl(fd, _IOWR('x', 1, struct GDRDRV_IOC_PIN_BUFFER_PARAMS), buf), EINVAL);
	CHECK_ERR(ioctl(fd, _IOWR(0xDB, 255, struct GDRDRV_IOC_GET_VERSION_PARAMS *), buf), EINVAL);
	CHECK_ERR(ioctl(fd, 0, buf), EINVAL);
	/* Right type, unknown number or wrong encoding of a known number. */
	CHECK_ERR(ioctl(fd, _IOWR(GDRDRV_IOCTL, 9, uint64_t), buf), ENOTTY);
	CHECK_ERR(ioctl(fd, _IOWR(GDRDRV_IOCTL, 0, uint64_t), buf), ENOTTY);
	CHECK_ERR(ioctl(fd, _IOWR(GDRDRV_IOCTL, 1, uint64_t), buf), ENOTTY);
	CHECK_ERR(ioctl(fd, _IOR(GDRDRV_IOCTL, 255, struct GDRDRV_IOC_GET_VERSION_PARAMS *), buf),
		  ENOTTY);
	CHECK_ERR(ioctl(fd, _IO(GDRDRV_IOCTL, 255), buf), ENOTTY);
	/* Bad argument pointers: every command copies its argument and fails cleanly. */
	static const unsigned long cmds[] = {
		GDRDRV_IOC_PIN_BUFFER, GDRDRV_IOC_UNPIN_BUFFER, GDRDRV_IOC_GET_CB_FLAG,
		GDRDRV_IOC_GET_INFO, GDRDRV_IOC_GET_INFO_V2, GDRDRV_IOC_GET_ATTR,
		GDRDRV_IOC_PIN_BUFFER_V2, GDRDRV_IOC_REQ_MAPPING_TYPE, GDRDRV_IOC_GET_VERSION,
	};
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		CHECK_ERR(ioctl(fd, cmds[i], NULL), EFAULT);
		CHECK_ERR(ioctl(fd, cmds[i], (void *)16), EFAULT);
		CHECK_ERR(ioctl(fd, cmds[i], (void *)-4096L), EFAULT);
	}
	/* Output to read-only memory: GET_VERSION cannot store its answer. */
	ro = mmap(NULL, page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED, "mmap");
	CHECK_ERR(ioctl(fd, GDRDRV_IOC_GET_VERSION, ro), EFAULT);
	/* An argument ending exactly at the end of readable memory: all 40 bytes are read. */
	char *two = mmap(NULL, 2 * page_size, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(two != MAP_FAILED, "mmap");
	CHECK_OK(munmap(two + page_size, page_size));
	CHECK_ERR(ioctl(fd, GDRDRV_IOC_PIN_BUFFER, two + page_size - 8), EFAULT);
	munmap(two, page_size);
	munmap(ro, page_size);
	close(fd);
	return 0;
}

static int gdrdrv_major(void)
{
	FILE *f = fopen("/proc/devices", "r");
	char line[128], name[64];
	int major, found = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%d %63s", &major, name) == 2 && !strcmp(name, "gdrdrv"))
			found = major;
	fclose(f);
	return found;
}

static int t_device_node(void)
{
	int major = gdrdrv_major();
	struct stat st;
	const char *path = "/dev/gdrdrv-test-minor1";
	int fd;

	CHECK(major > 0, "gdrdrv not in /proc/devices");
	CHECK_OK(stat(GDRDRV_PATH, &st));
	CHECK(S_ISCHR(st.st_mode), "not a character device");
	CHECK(major(st.st_rdev) == (unsigned)major && minor(st.st_rdev) == 0, "node %u:%u",
	      major(st.st_rdev), minor(st.st_rdev));
	CHECK((st.st_mode & 07777) == 0666, "mode %o", st.st_mode & 07777);
	/* Other minors of the major do not exist. */
	unlink(path);
	CHECK_OK(mknod(path, S_IFCHR | 0600, makedev(major, 1)));
	fd = open(path, O_RDWR);
	int err = errno;

	unlink(path);
	CHECK(fd < 0 && err == ENXIO, "open minor 1: fd %d errno %d", fd, err);
	return 0;
}

static int t_attr(void)
{
	int fd = gdr_open();
	uint32_t v = 0;

	CHECK(fd >= 0, "open");
	CHECK_RET(get_attr(fd, GDRDRV_ATTR_USE_PERSISTENT_MAPPING, &v), 0);
	CHECK(v == (persistent ? 1u : 0u), "USE_PERSISTENT_MAPPING = %u", v);
	CHECK_RET(get_attr(fd, GDRDRV_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v), 0);
	/* Our nv-p2p.h has NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING: supported iff persistent. */
	CHECK(v == (persistent ? 1u : 0u), "SUPPORT_PIN_FLAG_FORCE_PCIE = %u", v);
	for (uint32_t bad = 0; bad < 8; bad++) {
		if (bad == 1 || bad == 2)
			continue;
		CHECK_RET(get_attr(fd, bad, &v), EINVAL);
		CHECK(v == 0xdeadbeef, "val changed to %u for attr %u", v, bad);
	}
	CHECK_RET(get_attr(fd, 0xffffffffu, &v), EINVAL);
	close(fd);
	return 0;
}

static int t_pin_validation(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, h = 0;

	CHECK(gs >= 0 && fd >= 0, "open: %s", strerror(errno));
	CHECK_RET(gs_alloc(gs, 4 * GPAGE, &va), 0);
	CHECK_RET(pin_v1(fd, 0, GPAGE, 0, 0, &h), EINVAL);
	CHECK_RET(pin_v2(fd, 0, GPAGE, 0, &h), EINVAL);
	for (uint32_t f = 2; f; f <<= 1)
		CHECK_RET(pin_v2(fd, va, GPAGE, f, &h), EINVAL);
	CHECK_RET(pin_v2(fd, va, GPAGE, 0x3, &h), EINVAL);
	/* Overflowing range. */
	CHECK_RET(pin_v2(fd, va, UINT64_MAX - va + 2, 0, &h), EINVAL);
	CHECK_RET(pin_v2(fd, UINT64_MAX - 10, 100, 0, &h), EINVAL);
	/* Outside any allocation / larger than the allocation / size 0 (NVIDIA's answer). */
	CHECK(pin_v2(fd, va + 8 * GPAGE, GPAGE, 0, &h) != 0, "pinned unallocated memory");
	CHECK(pin_v2(fd, va, 5 * GPAGE, 0, &h) != 0, "pinned past the allocation");
	CHECK(pin_v2(fd, 0x1000, GPAGE, 0, &h) != 0, "pinned address 0x1000");
	if (persistent) {
		/* Tokens are deprecated in persistent mode. */
		CHECK_RET(pin_v1(fd, va, GPAGE, 1, 0, &h), EINVAL);
		CHECK_RET(pin_v1(fd, va, GPAGE, 0, 1, &h), EINVAL);
		CHECK_RET(pin_v2(fd, va, GPAGE, GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE, &h), 0);
		CHECK_RET(unpin(fd, h), 0);
	} else {
		CHECK_RET(pin_v2(fd, va, GPAGE, GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE, &h), EINVAL);
	}
	CHECK_RET(pin_v1(fd, va, GPAGE, 0, 0, &h), 0);
	CHECK_RET(unpin(fd, h), 0);
	/* Nothing leaked by the failed pins. */
	uint64_t pins = gs_active_pins(gs);

	CHECK(pins == 0, "%" PRIu64 " pins outstanding", pins);
	close(fd);
	CHECK_RET(gs_free(gs, va), 0);
	close(gs);
	return 0;
}

static int t_handles(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, h[4] = { 0 }, expect = 0;
	const uint64_t sizes[4] = { GPAGE, 2 * GPAGE, 100, 3 * GPAGE };

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 8 * GPAGE, &va), 0);
	for (int i = 0; i < 4; i++) {
		CHECK_RET(pin(fd, va, sizes[i], &h[i]), 0);
		CHECK(h[i] == expect, "pin %d: handle %" PRIu64 ", expected %" PRIu64, i, h[i],
		      expect);
		uint64_t mapped = (sizes[i] + GPAGE - 1) & ~(GPAGE - 1);

		expect += mapped / page_size ? mapped / page_size : 1;
	}
	/* Handles are not reused after unpin. */
	CHECK_RET(unpin(fd, h[1]), 0);
	uint64_t h5 = 0;

	CHECK_RET(pin(fd, va, GPAGE, &h5), 0);
	CHECK(h5 == expect, "handle after unpin %" PRIu64 ", expected %" PRIu64, h5, expect);
	/* Handles are per file: a new file starts at 0 again. */
	int fd2 = gdr_open();
	uint64_t g = 0;

	CHECK_RET(pin(fd2, va, GPAGE, &g), 0);
	CHECK(g == 0, "first handle of a new file %" PRIu64, g);
	/* ...and one file's handles mean nothing to another. */
	CHECK_RET(unpin(fd2, h[3]), EINVAL);
	close(fd2);
	/* Unknown handles. */
	CHECK_RET(unpin(fd, h[1]), EINVAL);
	CHECK_RET(unpin(fd, 1), EINVAL);
	CHECK_RET(unpin(fd, UINT64_MAX), EINVAL);
	uint32_t flag = 0;

	CHECK_RET(get_cb_flag(fd, 12345, &flag), EINVAL);
	struct GDRDRV_IOC_GET_INFO_PARAMS i1;
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;

	CHECK_RET(get_info(fd, h[1], &i1), EINVAL);
	CHECK_RET(get_info_v2(fd, h[1], &i2), EINVAL);
	CHECK_RET(unpin(fd, h[0]), 0);
	CHECK_RET(unpin(fd, h[0]), EINVAL);
	CHECK_RET(unpin(fd, h[2]), 0);
	CHECK_RET(unpin(fd, h[3]), 0);
	CHECK_RET(unpin(fd, h5), 0);
	close(fd);
	CHECK_RET(gs_free(gs, va), 0);
	return 0;
}

static int t_info(void)
{
	int gs = gs_open(), fd = gdr_open();
	struct GDRDRV_IOC_GET_INFO_PARAMS i1;
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;
	uint64_t va = 0, h = 0;
	uint32_t flag = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 4 * GPAGE, &va), 0);
	struct { uint64_t off, size, va_off, mapped; } cases[] = {
		{ 0, GPAGE, 0, GPAGE },
		{ 0, 1, 0, GPAGE },
		{ 0x1234, 0x100, 0, GPAGE },
		{ GPAGE - 0x10, 0x20, 0, 2 * GPAGE },
		{ GPAGE + 8, 2 * GPAGE, GPAGE, 3 * GPAGE },
		{ 0, 4 * GPAGE, 0, 4 * GPAGE },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		CHECK_RET(pin(fd, va + cases[c].off, cases[c].size, &h), 0);
		CHECK_RET(get_info(fd, h, &i1), 0);
		CHECK(i1.handle == h, "handle field changed");
		CHECK(i1.va == va + cases[c].va_off, "case %zu: va 0x%llx", c, (unsigned long long)i1.va);
		CHECK(i1.mapped_size == cases[c].mapped, "case %zu: mapped_size 0x%llx", c,
		      (unsigned long long)i1.mapped_size);
		CHECK(i1.page_size == GPAGE, "page_size %u", i1.page_size);
		CHECK(i1.mapped == 0 && i1.wc_mapping == 0, "mapped %u wc %u", i1.mapped,
		      i1.wc_mapping);
#if defined(__x86_64__)
		CHECK(i1.tsc_khz > 0, "tsc_khz 0 on x86");
#endif
		CHECK_RET(get_info_v2(fd, h, &i2), 0);
		CHECK(i2.va == i1.va && i2.mapped_size == i1.mapped_size &&
		      i2.page_size == i1.page_size && i2.tsc_khz == i1.tsc_khz &&
		      i2.tm_cycles == i1.tm_cycles, "v1/v2 disagree");
		CHECK(i2.mapping_type == GDR_MR_NONE, "type %u", i2.mapping_type);
		CHECK_RET(get_cb_flag(fd, h, &flag), 0);
		CHECK(flag == 0, "cb flag %u", flag);
		CHECK_RET(unpin(fd, h), 0);
	}
	/* Mapped: v1 says mapped + wc, v2 says WC. */
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	void *p = gdr_map(fd, h, 2 * GPAGE);

	CHECK(p, "mmap: %s", strerror(errno));
	CHECK_RET(get_info(fd, h, &i1), 0);
	CHECK(i1.mapped == 1 && i1.wc_mapping == 1, "mapped %u wc %u", i1.mapped, i1.wc_mapping);
	CHECK_RET(get_info_v2(fd, h, &i2), 0);
	CHECK(i2.mapping_type == GDR_MR_WC, "type %u", i2.mapping_type);
	CHECK_OK(munmap(p, 2 * GPAGE));
	CHECK_RET(get_info_v2(fd, h, &i2), 0);
	CHECK(i2.mapping_type == GDR_MR_NONE, "type after munmap %u", i2.mapping_type);
	return unpin_close_free(gs, fd, va, h);
}

static int t_mapping_type(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, h = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 2 * GPAGE, &va), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	CHECK_RET(req_type(fd, h, 4), EINVAL);
	CHECK_RET(req_type(fd, h, 0xffffffffu), EINVAL);
	CHECK_RET(req_type(fd, h + 1, GDR_MR_WC), EINVAL);
	CHECK_RET(req_type(fd, 999999, GDR_MR_NONE), EINVAL);
#if defined(__x86_64__)
	/* x86 can neither cache GPU BAR memory nor needs device mappings. */
	CHECK_RET(req_type(fd, h, GDR_MR_CACHING), EOPNOTSUPP);
	CHECK_RET(req_type(fd, h, GDR_MR_DEVICE), EOPNOTSUPP);
#endif
	CHECK_RET(req_type(fd, h, GDR_MR_WC), 0);
	CHECK_RET(req_type(fd, h, GDR_MR_NONE), 0);
	CHECK_RET(req_type(fd, h, GDR_MR_WC), 0);
	void *p = gdr_map(fd, h, 2 * GPAGE);

	CHECK(p, "mmap: %s", strerror(errno));
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;

	CHECK_RET(get_info_v2(fd, h, &i2), 0);
	CHECK(i2.mapping_type == GDR_MR_WC, "type %u", i2.mapping_type);
	CHECK_RET(req_type(fd, h, GDR_MR_WC), EBUSY);
	CHECK_RET(req_type(fd, h, GDR_MR_NONE), EBUSY);
	CHECK_RET(req_type(fd, h, 7), EINVAL);	/* range check comes first */
	CHECK_OK(munmap(p, 2 * GPAGE));
	CHECK_RET(req_type(fd, h, GDR_MR_NONE), 0);
	return unpin_close_free(gs, fd, va, h);
}

static int t_mmap_checks(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, h = 0, hu = 0;
	void *p, *q;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 4 * GPAGE, &va), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	/* Larger than pinned. */
	errno = 0;
	CHECK(!gdr_map(fd, h, 2 * GPAGE + page_size) && errno == EINVAL, "too large: %s",
	      strerror(errno));
	CHECK(!gdr_map(fd, h, 4 * GPAGE) && errno == EINVAL, "too large: %s", strerror(errno));
	/* Unknown handle, and an offset inside a handle's range. */
	CHECK(!gdr_map(fd, h + 1000, GPAGE) && errno == EINVAL, "bad handle: %s", strerror(errno));
	CHECK(!gdr_map(fd, h + 1, page_size) && errno == EINVAL, "handle+1: %s", strerror(errno));
	/* Private mappings are refused (see docs/gdrdrv.md). */
	p = mmap(NULL, GPAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)(h * page_size));
	CHECK(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE: %p %s", p, strerror(errno));
	/* Partial mapping is fine; only one mapping per handle at a time. */
	p = gdr_map(fd, h, GPAGE);
	CHECK(p, "partial mmap: %s", strerror(errno));
	CHECK(!gdr_map(fd, h, GPAGE) && errno == EINVAL, "second mmap: %s", strerror(errno));
	CHECK_OK(munmap(p, GPAGE));
	p = gdr_map(fd, h, 2 * GPAGE);
	CHECK(p, "mmap after munmap: %s", strerror(errno));
	/* Sub-page length: rounded to pages by the kernel, fine. */
	CHECK_OK(munmap(p, 2 * GPAGE));
	p = gdr_map(fd, h, 100);
	CHECK(p, "100-byte mmap: %s", strerror(errno));
	CHECK_OK(munmap(p, 100));
	/* A pin of an address that is not 64 KiB aligned succeeds, but cannot be mapped. */
	CHECK_RET(pin(fd, va + 0x1000, GPAGE, &hu), 0);
	CHECK(!gdr_map(fd, hu, GPAGE) && errno == EINVAL, "unaligned pin mmap: %s",
	      strerror(errno));
	CHECK_RET(unpin(fd, hu), 0);
	/* Partial munmap keeps the rest of the mapping (and the handle mapped). */
	p = gdr_map(fd, h, 2 * GPAGE);
	CHECK(p, "mmap: %s", strerror(errno));
	CHECK_OK(munmap(p, GPAGE));
	struct GDRDRV_IOC_GET_INFO_PARAMS i1;

	CHECK_RET(get_info(fd, h, &i1), 0);
	CHECK(i1.mapped == 1, "handle unmapped by a partial munmap");
	CHECK(!gdr_map(fd, h, GPAGE) && errno == EINVAL, "mmap while a piece is mapped: %s",
	      strerror(errno));
	uint32_t v = 0;

	CHECK(probe_read((volatile uint32_t *)((char *)p + GPAGE), &v) == 0, "tail unreadable");
	/* Unpin zaps the remaining piece too: no access to released GPU memory. */
	CHECK_RET(unpin(fd, h), 0);
	CHECK(probe_read((volatile uint32_t *)((char *)p + GPAGE), &v) == SIGBUS,
	      "tail still accessible after unpin");
	CHECK_OK(munmap((char *)p + GPAGE, GPAGE));
	/* mremap moves the mapping; unpin still reaches it. */
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	p = gdr_map(fd, h, 2 * GPAGE);
	CHECK(p, "mmap: %s", strerror(errno));
	q = mmap(NULL, 4 * GPAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(q != MAP_FAILED, "reserve");
	q = mremap(p, 2 * GPAGE, 2 * GPAGE, MREMAP_MAYMOVE | MREMAP_FIXED, (char *)q + GPAGE);
	CHECK(q != MAP_FAILED, "mremap: %s", strerror(errno));
	CHECK(probe_write((volatile uint32_t *)q, 7) == 0, "moved mapping not writable");
	CHECK(probe_read((volatile uint32_t *)p, &v) == SIGSEGV, "old address still mapped");
	CHECK_RET(get_info(fd, h, &i1), 0);
	CHECK(i1.mapped == 1, "moved mapping not counted");
	CHECK_RET(unpin(fd, h), 0);
	CHECK(probe_read((volatile uint32_t *)q, &v) == SIGBUS, "moved mapping survived unpin");
	CHECK_OK(munmap(q, 2 * GPAGE));
	/* Growing the mapping is refused by the kernel (VM_DONTEXPAND). */
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	p = gdr_map(fd, h, GPAGE);
	CHECK(p, "mmap: %s", strerror(errno));
	q = mremap(p, GPAGE, 2 * GPAGE, MREMAP_MAYMOVE);
	CHECK(q == MAP_FAILED, "mapping grew");
	CHECK_OK(munmap(p, GPAGE));
	return unpin_close_free(gs, fd, va, h);
}

static int t_data(void)
{
	int gs = gs_open(), fd = gdr_open();
	const uint64_t sizes[] = { GPAGE, 2 * GPAGE, 3 * GPAGE, 16 * GPAGE, 64 * GPAGE };
	struct buf b;

	CHECK(gs >= 0 && fd >= 0, "open");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint32_t seed = 0x1000 + (uint32_t)s;
		long bad;

		if (buf_setup(&b, gs, fd, sizes[s], true))
			return -1;
		/* CPU writes through gdrdrv, the GPU side reads. */
		fill(b.cpu, b.size, seed);
		bad = verify(b.gpu, b.size, seed);
		CHECK(bad < 0, "size 0x%" PRIx64 ": gpu view differs at word %ld", b.size, bad);
		/* GPU side writes, CPU reads through gdrdrv. */
		fill(b.gpu, b.size, ~seed);
		bad = verify(b.cpu, b.size, ~seed);
		CHECK(bad < 0, "size 0x%" PRIx64 ": gdrdrv view differs at word %ld", b.size, bad);
		/* Odd offsets and lengths inside the mapping. */
		for (int k = 0; k < 32; k++) {
			size_t off = ((size_t)rand() % (b.size - 64)) & ~(size_t)3;
			size_t len = 4 + ((size_t)rand() % (b.size - off - 4) & ~(size_t)3);
			uint32_t x = (uint32_t)rand();

			fill((volatile uint32_t *)((char *)b.cpu + off), len, x);
			bad = verify((volatile uint32_t *)((char *)b.gpu + off), len, x);
			CHECK(bad < 0, "off 0x%zx len 0x%zx: differs at word %ld", off, len, bad);
		}
		if (buf_teardown(&b))
			return -1;
	}
	/* A pin of the middle of an allocation maps the middle. */
	uint64_t va = 0, h = 0;

	CHECK_RET(gs_alloc(gs, 8 * GPAGE, &va), 0);
	void *g = gs_map(gs, va, 8 * GPAGE);

	CHECK(g, "gpusim map");
	fill(g, 8 * GPAGE, 77);
	CHECK_RET(pin(fd, va + 3 * GPAGE, 2 * GPAGE, &h), 0);
	void *c = gdr_map(fd, h, 2 * GPAGE);

	CHECK(c, "mmap: %s", strerror(errno));
	for (size_t i = 0; i < 2 * GPAGE / 4; i++)
		CHECK(((volatile uint32_t *)c)[i] == pattern(77, i + 3 * GPAGE / 4),
		      "word %zu of the middle pin", i);
	CHECK_OK(munmap(c, 2 * GPAGE));
	CHECK_RET(unpin(fd, h), 0);
	CHECK_OK(munmap(g, 8 * GPAGE));
	CHECK_RET(gs_free(gs, va), 0);
	close(fd);
	return 0;
}

/* A large pin: every host page of a 64 MiB mapping reaches the right GPU page, both ways. */
static int t_large(void)
{
	const uint64_t size = 64ULL << 20;
	int gs = gs_open(), fd = gdr_open();
	struct buf b;

	CHECK(gs >= 0 && fd >= 0, "open");
	if (buf_setup(&b, gs, fd, size, true))
		return -1;
	volatile uint32_t *c = b.cpu, *g = b.gpu;
	size_t step = (size_t)page_size / 4;

	for (size_t i = 0; i < size / 4; i += step) {
		c[i] = pattern(21, i);
		c[i + step - 1] = pattern(22, i);
	}
	__sync_synchronize();
	for (size_t i = 0; i < size / 4; i += step)
		CHECK(g[i] == pattern(21, i) && g[i + step - 1] == pattern(22, i),
		      "page at offset 0x%zx differs", i * 4);
	for (size_t i = 0; i < size / 4; i += step)
		g[i + 1] = pattern(23, i);
	__sync_synchronize();
	for (size_t i = 0; i < size / 4; i += step)
		CHECK(c[i + 1] == pattern(23, i), "page at offset 0x%zx differs (gpu->cpu)", i * 4);
	return buf_teardown_close(&b);
}

/* Free the GPU memory while it is pinned and mapped. */
static int t_invalidation(void)
{
	int gs = gs_open(), fd = gdr_open();
	struct GDRDRV_IOC_GET_INFO_PARAMS i1;
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;
	uint32_t flag = 0, v = 0;
	struct buf b;

	CHECK(gs >= 0 && fd >= 0, "open");
	if (buf_setup(&b, gs, fd, 4 * GPAGE, true))
		return -1;
	fill(b.cpu, b.size, 5);
	CHECK_OK(munmap(b.gpu, b.size));
	b.gpu = NULL;
	uint64_t pins_before = gs_active_pins(gs);

	CHECK_RET(gs_free(gs, b.va), 0);
	CHECK_RET(get_cb_flag(fd, b.handle, &flag), 0);
	if (!persistent) {
		CHECK(flag == 1, "callback flag %u after free", flag);
		CHECK(probe_read(b.cpu, &v) == SIGBUS, "mapping readable after free");
		CHECK(probe_write(b.cpu, 1) == SIGBUS, "mapping writable after free");
		CHECK(gs_active_pins(gs) == pins_before - 1, "gpusim still counts the pin");
		CHECK_RET(get_info(fd, b.handle, &i1), 0);
		CHECK(i1.va == b.va && i1.mapped_size == b.size && i1.page_size == GPAGE,
		      "info changed by invalidation");
		CHECK(i1.mapped == 0 && i1.wc_mapping == 0, "still mapped: %u %u", i1.mapped,
		      i1.wc_mapping);
		CHECK_RET(get_info_v2(fd, b.handle, &i2), 0);
		CHECK(i2.mapping_type == GDR_MR_NONE, "type %u", i2.mapping_type);
		/* The old VMA stays until munmap; a new mapping is refused. */
		CHECK(!gdr_map(fd, b.handle, b.size) && errno == EINVAL, "mmap after free: %s",
		      strerror(errno));
#if defined(__x86_64__)
		CHECK_RET(req_type(fd, b.handle, GDR_MR_CACHING), EOPNOTSUPP);
#endif
		CHECK_RET(req_type(fd, b.handle, GDR_MR_WC), 0);
		CHECK_RET(req_type(fd, b.handle, GDR_MR_NONE), 0);
		CHECK_OK(munmap(b.cpu, b.size));
		CHECK_RET(unpin(fd, b.handle), 0);
		CHECK_RET(unpin(fd, b.handle), EINVAL);
	} else {
		/* Persistent: no callback; the pages stay pinned and mapped until unpin. */
		CHECK(flag == 0, "callback flag %u in persistent mode", flag);
		CHECK(gs_active_pins(gs) == pins_before, "pin dropped by free");
		long bad = verify(b.cpu, b.size, 5);

		CHECK(bad < 0, "data changed after free at word %ld", bad);
		fill(b.cpu, b.size, 6);
		bad = verify(b.cpu, b.size, 6);
		CHECK(bad < 0, "mapping not writable after free: word %ld", bad);
		CHECK_RET(get_info(fd, b.handle, &i1), 0);
		CHECK(i1.mapped == 1, "not mapped");
		CHECK(gdr_map(fd, b.handle, b.size) == NULL, "second mapping");
		CHECK_RET(unpin(fd, b.handle), 0);
		CHECK(probe_read(b.cpu, &v) == SIGBUS, "mapping readable after unpin");
		CHECK(gs_active_pins(gs) == pins_before - 1, "pin not released by unpin");
		CHECK_OK(munmap(b.cpu, b.size));
	}
	/* Freed while pinned but not mapped. */
	if (buf_setup(&b, gs, fd, GPAGE, false))
		return -1;
	CHECK_OK(munmap(b.gpu, b.size));
	CHECK_RET(gs_free(gs, b.va), 0);
	CHECK_RET(get_cb_flag(fd, b.handle, &flag), 0);
	CHECK(flag == (persistent ? 0u : 1u), "callback flag %u", flag);
	if (!persistent)
		CHECK(!gdr_map(fd, b.handle, b.size) && errno == EINVAL, "mmap after free");
	CHECK_RET(unpin(fd, b.handle), 0);
	close(fd);
	uint64_t got;

	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left", got);
	close(gs);
	return 0;
}

/* The free callback fires while this process still has the pin open elsewhere. */
static int t_invalidation_gpusim_close(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint32_t flag = 0, v = 0;
	uint64_t va = 0, h = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 2 * GPAGE, &va), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	void *p = gdr_map(fd, h, 2 * GPAGE);

	CHECK(p, "mmap");
	CHECK(probe_write(p, 42) == 0, "write");
	close(gs);	/* last gpusim file of this process: all its allocations are freed */
	CHECK_RET(get_cb_flag(fd, h, &flag), 0);
	if (persistent) {
		CHECK(flag == 0, "flag %u", flag);
		CHECK(probe_read(p, &v) == 0 && v == 42, "persistent mapping lost");
	} else {
		CHECK(flag == 1, "flag %u", flag);
		CHECK(probe_read(p, &v) == SIGBUS, "mapping survived");
	}
	CHECK_RET(unpin(fd, h), 0);
	CHECK_OK(munmap(p, 2 * GPAGE));
	close(fd);
	return 0;
}

static int t_fork(void)
{
	int gs = gs_open(), fd = gdr_open();
	struct buf b;

	CHECK(gs >= 0 && fd >= 0, "open");
	if (buf_setup(&b, gs, fd, 2 * GPAGE, true))
		return -1;
	fill(b.cpu, b.size, 99);
	pid_t pid = fork();

	if (pid == 0) {
		struct GDRDRV_IOC_GET_VERSION_PARAMS ver;
		struct GDRDRV_IOC_GET_INFO_PARAMS i1;
		struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;
		uint32_t v = 0;
		uint64_t h = 0;
		int rc = 0;

		cur_test = "fork (child)";
#define CHILD(cond) do { if (!(cond)) { \
		fprintf(stderr, "not ok - fork child: line %d: %s (errno %s)\n", __LINE__, #cond, \
			strerror(errno)); rc = 1; } } while (0)
		CHILD(ioctl(fd, GDRDRV_IOC_GET_VERSION, &ver) == -1 && errno == EACCES);
		CHILD(pin(fd, b.va, GPAGE, &h) == EACCES);
		CHILD(pin_v1(fd, b.va, GPAGE, 0, 0, &h) == EACCES);
		CHILD(unpin(fd, b.handle) == EACCES);
		CHILD(get_info(fd, b.handle, &i1) == EACCES);
		CHILD(get_info_v2(fd, b.handle, &i2) == EACCES);
		CHILD(get_cb_flag(fd, b.handle, &v) == EACCES);
		CHILD(get_attr(fd, 1, &v) == EACCES);
		CHILD(req_type(fd, b.handle, GDR_MR_NONE) == EACCES);
		/* Even a bad command number: ownership is checked before the switch. */
		CHILD(ioctl(fd, _IOWR(GDRDRV_IOCTL, 77, uint64_t), &h) == -1 && errno == EACCES);
		CHILD(gdr_map(fd, b.handle, GPAGE) == NULL && errno == EACCES);
		/* The parent's mapping was not inherited (VM_DONTCOPY). */
		CHILD(probe_read(b.cpu, &v) == SIGSEGV);
		/* The child can use its own instance, but not pin the parent's GPU memory. */
		int fd2 = gdr_open();

		CHILD(fd2 >= 0);
		CHILD(ioctl(fd2, GDRDRV_IOC_GET_VERSION, &ver) == 0);
		CHILD(pin(fd2, b.va, GPAGE, &h) != 0);
		CHILD(pin_v1(fd2, b.va, GPAGE, 1, 1, &h) != 0);
		close(fd2);
		_exit(rc);
	}
	int st = wait_child(pid);

	CHECK(st == 0, "child status %d", st);
	/* The parent is unaffected. */
	long bad = verify(b.cpu, b.size, 99);

	CHECK(bad < 0, "parent data changed at word %ld", bad);
	return buf_teardown_close(&b);
}

/* The child closes nothing and exits while the parent keeps everything: regions stay. */
static int t_fork_child_exit_keeps_regions(void)
{
	int gs = gs_open(), fd = gdr_open();
	struct buf b;

	CHECK(gs >= 0 && fd >= 0, "open");
	if (buf_setup(&b, gs, fd, GPAGE, true))
		return -1;
	pid_t pid = fork();

	if (pid == 0) {
		close(fd);
		_exit(0);
	}
	CHECK(wait_child(pid) == 0, "child");
	fill(b.cpu, b.size, 3);
	CHECK(verify(b.gpu, b.size, 3) < 0, "data");
	return buf_teardown(&b);
}

static int send_fd(int sock, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	char c = 'x';
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			      .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	char c;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			      .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(sock, &msg, 0) != 1)
		return -1;
	cm = CMSG_FIRSTHDR(&msg);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

static int t_fd_passing(void)
{
	int sv[2];
	int gs = gs_open();
	uint64_t va = 0;

	CHECK(gs >= 0, "open");
	CHECK_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	CHECK_RET(gs_alloc(gs, GPAGE, &va), 0);
	pid_t pid = fork();

	if (pid == 0) {
		/* The child opens and pins, then hands its file to the parent and exits. */
		int fd = gdr_open();
		uint64_t h = 0;
		int cgs = gs_open();
		uint64_t cva = 0;

		close(sv[0]);
		if (fd < 0 || cgs < 0 || gs_alloc(cgs, GPAGE, &cva) || pin(fd, cva, GPAGE, &h))
			_exit(2);
		if (send_fd(sv[1], fd))
			_exit(3);
		char c;

		/* Wait until the parent is done so the regions are still owned. */
		if (read(sv[1], &c, 1) != 1)
			_exit(4);
		_exit(0);
	}
	close(sv[1]);
	int fd = recv_fd(sv[0]);
	uint32_t v = 0;
	uint64_t h = 0;
	struct GDRDRV_IOC_GET_VERSION_PARAMS ver;

	CHECK(fd >= 0, "no fd received");
	CHECK_ERR(ioctl(fd, GDRDRV_IOC_GET_VERSION, &ver), EACCES);
	CHECK_RET(get_attr(fd, 1, &v), EACCES);
	CHECK_RET(pin(fd, va, GPAGE, &h), EACCES);
	CHECK_RET(unpin(fd, 0), EACCES);
	CHECK_RET(get_cb_flag(fd, 0, &v), EACCES);
	errno = 0;
	CHECK(gdr_map(fd, 0, GPAGE) == NULL && errno == EACCES, "mmap: %s", strerror(errno));
	CHECK(write(sv[0], "x", 1) == 1, "write");
	CHECK(wait_child(pid) == 0, "child failed");
	/* We hold the last reference now: closing releases the child's pins. */
	close(fd);
	close(sv[0]);
	CHECK_RET(gs_free(gs, va), 0);
	close(gs);
	return 0;
}

/* Close the file while mapped: the mapping keeps the file (and the pin) alive until munmap. */
static int t_release_with_mappings(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t got;
	struct buf b[6];

	CHECK(gs >= 0 && fd >= 0, "open");
	for (int i = 0; i < 6; i++)
		if (buf_setup(&b[i], gs, fd, (uint64_t)(i + 1) * GPAGE, i % 2 == 0))
			return -1;
	uint64_t pins = gs_active_pins(gs);

	CHECK(pins == 6, "%" PRIu64 " pins", pins);
	close(fd);
	/* Mapped regions still work after close. */
	for (int i = 0; i < 6; i += 2) {
		fill(b[i].cpu, b[i].size, (uint32_t)i);
		CHECK(verify(b[i].gpu, b[i].size, (uint32_t)i) < 0, "buffer %d after close", i);
	}
	CHECK(gs_active_pins(gs) == 6, "pins released while mapped");
	for (int i = 0; i < 6; i += 2)
		CHECK_OK(munmap(b[i].cpu, b[i].size));
	/* Last mapping gone: the file is released and with it every pin. */
	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left after release", got);
	/* A process exiting with live pins and mappings. */
	pid_t pid = fork();

	if (pid == 0) {
		int d = gdr_open();
		uint64_t h = 0;

		for (int i = 0; i < 6; i++) {
			if (pin(d, b[i].va, b[i].size, &h))
				_exit(1);
		}
		_exit(gdr_map(d, 0, GPAGE) ? 0 : 2);
	}
	/* GPU VAs are per process: the child cannot pin ours (it has no GPU memory at all). */
	CHECK(wait_child(pid) == 1, "child pinned another process's GPU memory");
	for (int i = 0; i < 6; i++) {
		CHECK_OK(munmap(b[i].gpu, b[i].size));
		CHECK_RET(gs_free(gs, b[i].va), 0);
	}
	pid = fork();
	if (pid == 0) {
		int g = gs_open(), d = gdr_open();
		uint64_t va = 0, h = 0;

		if (g < 0 || d < 0)
			_exit(1);
		for (int i = 0; i < 8; i++) {
			if (gs_alloc(g, 2 * GPAGE, &va) || pin(d, va, 2 * GPAGE, &h))
				_exit(2);
			if (i % 2 && !gdr_map(d, h, 2 * GPAGE))
				_exit(3);
		}
		_exit(0);	/* no unmap, no unpin, no close */
	}
	CHECK(wait_child(pid) == 0, "child");
	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left after exit", got);
	close(gs);
	return 0;
}

/* copy_to_user of the new handle fails: the pin is undone. */
static int t_pin_efault(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, GPAGE, &va), 0);
	struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS *p =
		mmap(NULL, page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(p != MAP_FAILED, "mmap");
	p->addr = va;
	p->size = GPAGE;
	CHECK_OK(mprotect(p, page_size, PROT_READ));
	CHECK_ERR(ioctl(fd, GDRDRV_IOC_PIN_BUFFER_V2, p), EFAULT);
	CHECK(gs_active_pins(gs) == 0, "pin leaked after EFAULT");
	/* The handle was consumed (never reused) and does not exist. */
	CHECK_RET(unpin(fd, 0), EINVAL);
	uint64_t h = 0;

	CHECK_RET(pin(fd, va, GPAGE, &h), 0);
	return unpin_close_free(gs, fd, va, h);
}

/* Two tiny pins inside one GPU page (upstream sanity basic_small_buffers_mapping). */
static int t_small_buffers(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, h1 = 0, h2 = 0;
	struct GDRDRV_IOC_GET_INFO_PARAMS i1;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, GPAGE, &va), 0);
	CHECK_RET(pin(fd, va, 8, &h1), 0);
	CHECK_RET(pin(fd, va + 8, 8, &h2), 0);
	CHECK(h1 != h2, "same handle twice");
	CHECK_RET(get_info(fd, h2, &i1), 0);
	CHECK(i1.va == va && i1.mapped_size == GPAGE, "second pin: va 0x%llx size 0x%llx",
	      (unsigned long long)i1.va, (unsigned long long)i1.mapped_size);
	void *p = gdr_map(fd, h1, GPAGE);

	CHECK(p, "mapping the aligned pin: %s", strerror(errno));
	CHECK(!gdr_map(fd, h2, GPAGE) && errno == EINVAL, "mapping the unaligned pin: %s",
	      strerror(errno));
	CHECK_OK(munmap(p, GPAGE));
	CHECK_RET(unpin(fd, h1), 0);
	CHECK_RET(unpin(fd, h2), 0);
	close(fd);
	CHECK_RET(gs_free(gs, va), 0);
	return 0;
}

/* One buffer pinned and mapped twice; freeing a second buffer leaves both alone. */
static int t_two_mappings(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t va = 0, va2 = 0, h1 = 0, h2 = 0, h3 = 0;
	uint32_t v = 0, flag = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_RET(gs_alloc(gs, 2 * GPAGE, &va), 0);
	CHECK_RET(gs_alloc(gs, GPAGE, &va2), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h1), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h2), 0);
	CHECK_RET(pin(fd, va2, GPAGE, &h3), 0);
	void *a = gdr_map(fd, h1, 2 * GPAGE), *b = gdr_map(fd, h2, 2 * GPAGE);
	void *c = gdr_map(fd, h3, GPAGE);

	CHECK(a && b && c, "mmap: %s", strerror(errno));
	fill(a, 2 * GPAGE, 11);
	CHECK(verify(b, 2 * GPAGE, 11) < 0, "second mapping does not see the first's stores");
	fill(b, 2 * GPAGE, 12);
	CHECK(verify(a, 2 * GPAGE, 12) < 0, "first mapping does not see the second's stores");
	CHECK(probe_write(c, 5) == 0, "third mapping");
	CHECK_RET(gs_free(gs, va2), 0);
	CHECK(verify(a, 2 * GPAGE, 12) < 0, "freeing another buffer broke this one");
	CHECK_RET(get_cb_flag(fd, h1, &flag), 0);
	CHECK(flag == 0, "cb flag %u on a buffer that was not freed", flag);
	CHECK_RET(get_cb_flag(fd, h3, &flag), 0);
	CHECK(flag == (persistent ? 0u : 1u), "cb flag %u of the freed buffer", flag);
	CHECK(probe_read(c, &v) == (persistent ? 0 : SIGBUS), "freed buffer's mapping");
	CHECK_OK(munmap(a, 2 * GPAGE));
	CHECK_OK(munmap(b, 2 * GPAGE));
	CHECK_OK(munmap(c, GPAGE));
	CHECK_RET(unpin(fd, h1), 0);
	CHECK_RET(unpin(fd, h2), 0);
	CHECK_RET(unpin(fd, h3), 0);
	close(fd);
	CHECK_RET(gs_free(gs, va), 0);
	return 0;
}

/*
 * The file's last reference is dropped in another process (upstream sanity
 * leakage_pin_pages_fork): the release there gives back the opener's pins.
 */
static int t_release_in_child(void)
{
	int gs = gs_open(), fd = gdr_open();
	int go[2];
	uint64_t va = 0, h = 0, got = 0;

	CHECK(gs >= 0 && fd >= 0, "open");
	CHECK_OK(pipe(go));
	pid_t pid = fork();

	if (pid == 0) {
		char c;

		/* Hold the inherited copy until the parent has pinned and closed its own. */
		close(go[1]);
		if (read(go[0], &c, 1) != 1)
			_exit(1);
		close(fd);	/* last reference: release runs here, in the child */
		_exit(0);
	}
	close(go[0]);
	CHECK_RET(gs_alloc(gs, 2 * GPAGE, &va), 0);
	CHECK_RET(pin(fd, va, 2 * GPAGE, &h), 0);
	CHECK_RET(pin(fd, va, GPAGE, &h), 0);
	CHECK(gs_active_pins(gs) == 2, "pins");
	close(fd);
	CHECK(gs_active_pins(gs) == 2, "pins released while the child holds the file");
	CHECK(write(go[1], "x", 1) == 1, "write");
	CHECK(wait_child(pid) == 0, "child");
	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left after the child's release", got);
	CHECK_RET(gs_free(gs, va), 0);
	close(gs);
	return 0;
}

/* ---- concurrency ----------------------------------------------------------------------- */

struct worker {
	int gs, fd;
	int iters;
	uint32_t seed;
	int failed;
	char why[160];
};

#define WFAIL(w, ...) do { snprintf((w)->why, sizeof((w)->why), __VA_ARGS__); \
		(w)->failed = 1; return NULL; } while (0)

/* Pin/map/verify/unmap/unpin own buffers, plus invalid calls, on a shared or own file. */
static void *worker_main(void *arg)
{
	struct worker *w = arg;
	unsigned int r = w->seed;

	for (int it = 0; it < w->iters; it++) {
		uint64_t pages = 1 + rand_r(&r) % 4, size = pages * GPAGE, va = 0, h = 0;
		struct GDRDRV_IOC_GET_INFO_V2_PARAMS i2;
		int e;

		if ((e = gs_alloc(w->gs, size, &va)))
			WFAIL(w, "alloc: %s", strerror(e));
		void *g = gs_map(w->gs, va, size);

		if (!g)
			WFAIL(w, "gpusim map: %s", strerror(errno));
		if ((e = pin(w->fd, va, size, &h)))
			WFAIL(w, "pin: %s", strerror(e));
		if ((e = get_info_v2(w->fd, h, &i2)) || i2.va != va || i2.mapped_size != size)
			WFAIL(w, "info: %s", strerror(e));
		void *c = gdr_map(w->fd, h, size);

		if (!c)
			WFAIL(w, "gdr map: %s", strerror(errno));
		uint32_t s = rand_r(&r);

		fill(c, size, s);
		long bad = verify(g, size, s);

		if (bad >= 0)
			WFAIL(w, "data mismatch at word %ld (iter %d)", bad, it);
		/* Invalid calls interleaved with valid ones. */
		unpin(w->fd, h + 1);
		req_type(w->fd, h, 9);
		gdr_map(w->fd, h, size);
		munmap(c, size);
		if (rand_r(&r) % 3 == 0) {
			/* Free first: invalidation (non-persistent) or a kept persistent pin. */
			munmap(g, size);
			if ((e = gs_free(w->gs, va)))
				WFAIL(w, "free: %s", strerror(e));
			if ((e = unpin(w->fd, h)))
				WFAIL(w, "unpin after free: %s", strerror(e));
		} else {
			if ((e = unpin(w->fd, h)))
				WFAIL(w, "unpin: %s", strerror(e));
			munmap(g, size);
			if ((e = gs_free(w->gs, va)))
				WFAIL(w, "free: %s", strerror(e));
		}
	}
	return NULL;
}

static int t_threads(void)
{
	enum { N = 8 };
	int gs = gs_open(), fd = gdr_open();
	pthread_t th[N];
	struct worker w[N];

	CHECK(gs >= 0 && fd >= 0, "open");
	for (int i = 0; i < N; i++) {
		w[i] = (struct worker){ .gs = gs, .fd = fd, .iters = 40, .seed = 1234u + i };
		CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		CHECK(!w[i].failed, "thread %d: %s", i, w[i].why);
	}
	CHECK(gs_active_pins(gs) == 0, "pins left");
	close(fd);
	close(gs);
	return 0;
}

static int t_processes(void)
{
	enum { NP = 6 };
	pid_t pids[NP];

	for (int i = 0; i < NP; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			struct worker w[3];
			pthread_t th[3];
			int gs = gs_open(), fd = gdr_open(), fd2 = gdr_open();

			if (gs < 0 || fd < 0 || fd2 < 0)
				_exit(1);
			for (int t = 0; t < 3; t++) {
				w[t] = (struct worker){ .gs = gs, .fd = t == 2 ? fd2 : fd,
							.iters = 25, .seed = 77u * i + t };
				pthread_create(&th[t], NULL, worker_main, &w[t]);
			}
			int rc = 0;

			for (int t = 0; t < 3; t++) {
				pthread_join(th[t], NULL);
				if (w[t].failed) {
					fprintf(stderr, "process %d thread %d: %s\n", i, t, w[t].why);
					rc = 2;
				}
			}
			_exit(rc);
		}
	}
	int bad = 0;

	for (int i = 0; i < NP; i++)
		if (wait_child(pids[i]) != 0)
			bad++;
	CHECK(bad == 0, "%d processes failed", bad);
	return 0;
}

/* Free callback racing unpin, mmap, munmap and release. */
struct race {
	int gs, fd;
	uint64_t va, h;
	void *cpu;
	pthread_barrier_t bar;
	int mode;
};

static void *race_free(void *arg)
{
	struct race *r = arg;

	pthread_barrier_wait(&r->bar);
	gs_free(r->gs, r->va);
	return NULL;
}

static void *race_other(void *arg)
{
	struct race *r = arg;
	uint32_t v = 0;

	pthread_barrier_wait(&r->bar);
	switch (r->mode) {
	case 0:
		unpin(r->fd, r->h);
		break;
	case 1:
		r->cpu = gdr_map(r->fd, r->h, GPAGE);
		break;
	case 2:
		get_cb_flag(r->fd, r->h, &v);
		req_type(r->fd, r->h, GDR_MR_WC);
		break;
	}
	return NULL;
}

static int t_races(void)
{
	int gs = gs_open(), fd = gdr_open();
	uint64_t got;

	CHECK(gs >= 0 && fd >= 0, "open");
	for (int it = 0; it < 150; it++) {
		struct race r = { .gs = gs, .fd = fd, .mode = it % 3 };
		pthread_t a, b;

		CHECK_RET(gs_alloc(gs, 2 * GPAGE, &r.va), 0);
		CHECK_RET(pin(fd, r.va, 2 * GPAGE, &r.h), 0);
		pthread_barrier_init(&r.bar, NULL, 2);
		pthread_create(&a, NULL, race_free, &r);
		pthread_create(&b, NULL, race_other, &r);
		pthread_join(a, NULL);
		pthread_join(b, NULL);
		pthread_barrier_destroy(&r.bar);
		if (r.cpu) {
			uint32_t v = 0;
			int sig = probe_read(r.cpu, &v);

			/* Freed: no access unless persistent. */
			CHECK(sig == (persistent ? 0 : SIGBUS), "iteration %d: probe gave %d", it, sig);
			munmap(r.cpu, GPAGE);
		}
		int e = unpin(fd, r.h);

		CHECK(e == 0 || (r.mode == 0 && e == EINVAL), "unpin: %s", strerror(e));
	}
	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left", got);
	/* Release racing the free callback: a child holds pins, frees and exits at once. */
	for (int it = 0; it < 20; it++) {
		pid_t pid = fork();

		if (pid == 0) {
			int g = gs_open(), d = gdr_open();
			uint64_t va = 0, h = 0;

			for (int i = 0; i < 4; i++)
				if (gs_alloc(g, GPAGE, &va) || pin(d, va, GPAGE, &h))
					_exit(1);
			_exit(0);
		}
		CHECK(wait_child(pid) == 0, "child");
	}
	CHECK(wait_pins(gs, 0, &got) == 0, "%" PRIu64 " pins left", got);
	close(fd);
	close(gs);
	return 0;
}

/*
 * --hold: pin and map a few buffers, print "holding", then wait for EOF on stdin and exit
 * without cleaning up. Lets the suite check that the module cannot be unloaded meanwhile.
 */
static int hold(void)
{
	int gs = gs_open(), fd = gdr_open();
	struct buf b[3];
	char c;

	cur_test = "hold";
	if (gs < 0 || fd < 0)
		return 1;
	for (int i = 0; i < 3; i++) {
		if (buf_setup(&b[i], gs, fd, GPAGE, i != 1))
			return 1;
		if (b[i].cpu)
			fill(b[i].cpu, b[i].size, 1);
	}
	printf("holding\n");
	fflush(stdout);
	while (read(0, &c, 1) > 0)
		;
	return 0;
}

/* ---- driver ------------------------------------------------------------------------------ */

struct test {
	const char *name;
	int (*fn)(void);
};

static const struct test tests[] = {
	{ "version", t_version },
	{ "bad_ioctl", t_bad_ioctl },
	{ "device_node", t_device_node },
	{ "attr", t_attr },
	{ "pin_validation", t_pin_validation },
	{ "handles", t_handles },
	{ "info", t_info },
	{ "mapping_type", t_mapping_type },
	{ "mmap_checks", t_mmap_checks },
	{ "data", t_data },
	{ "large", t_large },
	{ "invalidation", t_invalidation },
	{ "invalidation_gpusim_close", t_invalidation_gpusim_close },
	{ "fork", t_fork },
	{ "fork_child_exit", t_fork_child_exit_keeps_regions },
	{ "fd_passing", t_fd_passing },
	{ "release_with_mappings", t_release_with_mappings },
	{ "pin_efault", t_pin_efault },
	{ "small_buffers", t_small_buffers },
	{ "two_mappings", t_two_mappings },
	{ "release_in_child", t_release_in_child },
	{ "threads", t_threads },
	{ "processes", t_processes },
	{ "races", t_races },
};

static int run_test(const struct test *t)
{
	pid_t pid;
	int st;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		cur_test = t->name;
		srand(0x5eed);
		alarm(300);	/* a hung test dies of SIGALRM and is reported */
		_exit(t->fn() ? 1 : 0);
	}
	st = wait_child(pid);
	if (st == 0) {
		printf("ok - %s\n", t->name);
		return 0;
	}
	if (st > 1)
		printf("not ok - %s: test process died with status %d\n", t->name, st);
	else
		printf("not ok - %s\n", t->name);
	return 1;
}

int main(int argc, char **argv)
{
	int failed = 0, ran = 0, mode = -1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	page_size = sysconf(_SC_PAGESIZE);
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--persistent=", 13))
			mode = atoi(argv[i] + 13);
	if (mode < 0) {
		fprintf(stderr, "usage: %s --persistent=0|1 [test...]\n", argv[0]);
		return 2;
	}
	persistent = mode != 0;
	if (access(GPUSIM_DEVICE_PATH, R_OK | W_OK) || access(GDRDRV_PATH, R_OK | W_OK)) {
		printf("not ok - setup: %s or %s missing\n", GPUSIM_DEVICE_PATH, GDRDRV_PATH);
		return 1;
	}
	for (int a = 1; a < argc; a++)
		if (!strcmp(argv[a], "--hold"))
			return hold();
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		bool want = true;

		for (int a = 1; a < argc; a++) {
			if (argv[a][0] == '-')
				continue;
			want = false;
			if (!strcmp(argv[a], tests[i].name)) {
				want = true;
				break;
			}
		}
		if (!want)
			continue;
		ran++;
		failed += run_test(&tests[i]);
	}
	printf("%d of %d gdrdrv tests failed (persistent=%d)\n", failed, ran, mode);
	return failed ? 1 : 0;
}
