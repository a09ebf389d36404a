// SPDX-License-Identifier: MIT
/*
 * libnvm_test - drives the libnvm helper module (/dev/libnvmN) through its raw ioctl/mmap ABI
 * only (kmod/libnvm/libnvm_ioctl.h, no library), the way any libnvm build would:
 *
 *   bind the controller $NVME_BDF to "libnvm helper", map BAR0 through the module, bring the
 *   controller up by hand, Identify Controller into host memory and into gpusim GPU memory,
 *   read LBAs through an I/O queue pair into both and check the image pattern
 *   (tests/vm/nvme/image.py), then: unmap, a child exiting with live windows, a GPU free while
 *   mapped, every ioctl with bad arguments, an unbind with live windows, and rebinding to nvme.
 *
 * Runs as root inside the VM (suite 25-libnvm-module) with gpusim and libnvm.ko loaded.
 * Prints "ok - <name>" per step; exits non-zero on the first failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
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
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libnvm_ioctl.h"
#include "gpusim_uapi.h"

/* Checks run outside test functions: a failure names no test and ends the program. */
#define CHECK_TEST NULL
#define CHECK_BAIL exit(1)
#include "../lib/check.h"
#define OK(...) check_report(1, __VA_ARGS__)

#define HELPER "libnvm helper"
#define PG 4096UL
#define GPG 0x10000UL
#define PATTERN_TAG (0xA5ULL << 56)

static const char *bdf;
static char devpath[600];
static volatile uint8_t *bar;
static uint32_t dstrd;
static unsigned to_ms;

/* ------------------------------------------------------------------------ sysfs --- */

static int write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, s, strlen(s));
	close(fd);
	return n == (ssize_t)strlen(s) ? 0 : -1;
}

static void driver_of(char *out, size_t len)
{
	char p[256], l[256];
	ssize_t n;

	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/driver", bdf);
	n = readlink(p, l, sizeof(l) - 1);
	if (n < 0) {
		snprintf(out, len, "(none)");
		return;
	}
	l[n] = 0;
	snprintf(out, len, "%s", strrchr(l, '/') + 1);
}

static void unbind(void)
{
	char p[256];

	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/driver/unbind", bdf);
	if (access(p, F_OK) == 0)
		CHECK(write_file(p, bdf) == 0, "unbind %s: %s", bdf, strerror(errno));
}

static void bind_to(const char *drv)
{
	char p[256], now[64];

	unbind();
	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/driver_override", bdf);
	CHECK(write_file(p, strcmp(drv, "nvme") ? drv : "\n") == 0, "driver_override: %s",
	      strerror(errno));
	snprintf(p, sizeof(p), "/sys/bus/pci/drivers/%s/bind", drv);
	CHECK(write_file(p, bdf) == 0, "bind %s to %s: %s", bdf, drv, strerror(errno));
	driver_of(now, sizeof(now));
	CHECK(strcmp(now, drv) == 0, "%s is bound to %s, not %s", bdf, now, drv);
}

/* /dev/libnvmN of the controller (made here if devtmpfs did not) */
static void find_node(void)
{
	glob_t g;
	char p[512], buf[64];
	unsigned ma, mi;

	snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/" HELPER "/libnvm*/dev", bdf);
	CHECK(glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1, "no %s node under %s", HELPER, bdf);
	FILE *f = fopen(g.gl_pathv[0], "r");
	CHECK(f && fgets(buf, sizeof(buf), f) && sscanf(buf, "%u:%u", &ma, &mi) == 2, "dev file");
	fclose(f);
	const char *name = strrchr(g.gl_pathv[0], '/');
	while (name > g.gl_pathv[0] && name[-1] != '/')
		name--;
	snprintf(p, sizeof(p), "/dev/%.*s", (int)(strchr(name, '/') - name), name);
	globfree(&g);
	struct stat st;
	if (stat(p, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(ma, mi)) {
		snprintf(devpath, sizeof(devpath), "%s", p);
		CHECK((st.st_mode & 0777) == 0600, "%s mode %o, upstream's 0600 expected", p,
		      st.st_mode & 0777);
	} else {
		snprintf(devpath, sizeof(devpath), "/tmp/libnvm-test-node");
		unlink(devpath);
		CHECK(mknod(devpath, S_IFCHR | 0600, makedev(ma, mi)) == 0, "mknod");
	}
}

/* --------------------------------------------------------------------- stats --- */

static long long stat_of(const char *file, const char *key)
{
	char line[256];
	size_t kl = strlen(key);
	long long v = -1;
	FILE *f = fopen(file, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, kl) == 0 && line[kl] == ':')
			v = strtoll(line + kl + 1, NULL, 0);
	fclose(f);
	return v;
}
#define LSTAT(k) stat_of("/sys/kernel/debug/libnvm/stats", k)
#define GSTAT(k) stat_of("/sys/kernel/debug/gpusim/stats", k)

static void expect_nothing_held(const char *when)
{
	CHECK(LSTAT("host_windows") == 0 && LSTAT("host_pages") == 0 &&
	      LSTAT("gpu_windows") == 0 && LSTAT("gpu_pages") == 0,
	      "%s: libnvm holds host %lld/%lld gpu %lld/%lld (windows/pages)", when,
	      LSTAT("host_windows"), LSTAT("host_pages"), LSTAT("gpu_windows"), LSTAT("gpu_pages"));
	CHECK(GSTAT("active_pins") == 0 && GSTAT("active_dma_mappings") == 0,
	      "%s: gpusim has %lld pins and %lld DMA mappings", when, GSTAT("active_pins"),
	      GSTAT("active_dma_mappings"));
}

/* ---------------------------------------------------------------- raw ABI --- */

static int map_mem(int fd, unsigned long cmd, uint64_t va, uint64_t n, uint64_t *addrs)
{
	struct nvm_ioctl_map m = { .vaddr_start = va, .n_pages = n,
				   .ioaddrs = (uint64_t)(uintptr_t)addrs };

	return ioctl(fd, cmd, &m);
}

static int unmap_mem(int fd, uint64_t va)
{
	return ioctl(fd, NVM_UNMAP_MEMORY, &va);
}

/* physical address of a locked page of ours (no IOMMU in the VM: bus address == physical) */
static uint64_t phys_of(const void *p)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	CHECK(fd >= 0, "pagemap");
	CHECK(pread(fd, &e, 8, ((uintptr_t)p / PG) * 8) == 8, "pagemap read");
	close(fd);
	CHECK(e >> 63, "page not present");
	return (e & ((1ULL << 55) - 1)) * PG;
}

/* ------------------------------------------------------------------- NVMe --- */

static uint32_t rd32(unsigned off) { return *(volatile uint32_t *)(bar + off); }
static uint64_t rd64(unsigned off) { return rd32(off) | (uint64_t)rd32(off + 4) << 32; }
static void wr32(unsigned off, uint32_t v) { *(volatile uint32_t *)(bar + off) = v; }
static void wr64(unsigned off, uint64_t v) { wr32(off, (uint32_t)v); wr32(off + 4, v >> 32); }

static uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000ULL + t.tv_nsec / 1000000;
}

static bool wait_rdy(unsigned want)
{
	uint64_t end = now_ms() + to_ms;

	while ((rd32(0x1c) & 1) != want) {
		if (now_ms() > end)
			return false;
		usleep(1000);
	}
	return true;
}

struct queue {
	volatile uint8_t *mem;
	uint64_t ioaddr;
	uint16_t qid, size, tail, head;
	uint8_t phase;
};

static struct queue asq, acq, iosq, iocq;
static uint16_t next_cid = 1;

static void q_init(struct queue *q, void *mem, uint64_t ioaddr, uint16_t qid, uint16_t size)
{
	memset(mem, 0, PG);
	*q = (struct queue){ .mem = mem, .ioaddr = ioaddr, .qid = qid, .size = size, .phase = 1 };
}

/* Submits one command on sq and waits for its completion on cq; returns the status field. */
static uint16_t run_cmd(struct queue *sq, struct queue *cq, uint32_t *cmd, uint32_t *dw0)
{
	uint16_t cid = next_cid++;
	volatile uint32_t *sqe = (volatile uint32_t *)(sq->mem + 64 * sq->tail);

	if (next_cid == 0xffff)
		next_cid = 1;
	cmd[0] = (cmd[0] & 0xffff) | (uint32_t)cid << 16;
	for (int i = 0; i < 16; i++)
		sqe[i] = cmd[i];
	sq->tail = (sq->tail + 1) % sq->size;
	__sync_synchronize();
	wr32(0x1000 + (2 * sq->qid) * (4 << dstrd), sq->tail);

	volatile uint32_t *cqe = (volatile uint32_t *)(cq->mem + 16 * cq->head);
	uint64_t end = now_ms() + 20000;
	while (((cqe[3] >> 16) & 1) != cq->phase) {
		if (now_ms() > end)
			FAIL("command 0x%02x (cid %u) on queue %u timed out (CSTS 0x%x)", cmd[0] & 0xff,
			     cid, sq->qid, rd32(0x1c));
		sched_yield();
	}
	__sync_synchronize();
	uint32_t d3 = cqe[3];
	CHECK((d3 & 0xffff) == cid, "completion for cid %u, expected %u", d3 & 0xffff, cid);
	CHECK((cqe[2] >> 16) == sq->qid, "completion names SQ %u", cqe[2] >> 16);
	if (dw0)
		*dw0 = cqe[0];
	if (++cq->head == cq->size) {
		cq->head = 0;
		cq->phase ^= 1;
	}
	wr32(0x1000 + (2 * cq->qid + 1) * (4 << dstrd), cq->head);
	return (d3 >> 17) & 0x7fff;
}

static uint16_t admin(uint32_t *cmd, uint32_t *dw0)
{
	return run_cmd(&asq, &acq, cmd, dw0);
}

static void set_prp(uint32_t *c, uint64_t p1, uint64_t p2)
{
	c[6] = (uint32_t)p1;
	c[7] = p1 >> 32;
	c[8] = (uint32_t)p2;
	c[9] = p2 >> 32;
}

/* The reset/enable sequence of the NVMe spec, by hand; admin queues of 64 entries. */
static void ctrl_enable(void *acq_mem, uint64_t acq_io, void *asq_mem, uint64_t asq_io)
{
	wr32(0x14, rd32(0x14) & ~1u);
	CHECK(wait_rdy(0), "CSTS.RDY still 1 %u ms after clearing CC.EN", to_ms);
	q_init(&acq, acq_mem, acq_io, 0, 64);
	q_init(&asq, asq_mem, asq_io, 0, 64);
	wr32(0x24, (63u << 16) | 63u);   /* ACQS 27:16, ASQS 11:0 (upstream swapped them) */
	wr64(0x28, asq_io);
	wr64(0x30, acq_io);
	wr32(0x14, (4u << 20) | (6u << 16) | 1u);   /* IOCQES 16 B, IOSQES 64 B, 4 KiB, EN */
	CHECK(wait_rdy(1), "CSTS.RDY not 1 within CAP.TO (%u ms), CSTS 0x%x", to_ms, rd32(0x1c));
	CHECK(!(rd32(0x1c) & 2), "CSTS.CFS set after enable");
	CHECK(rd32(0x24) == ((63u << 16) | 63u), "AQA reads back 0x%x", rd32(0x24));
}

static void identify(uint32_t cns, uint32_t nsid, uint64_t prp1)
{
	uint32_t c[16] = { 0x06 };

	c[1] = nsid;
	set_prp(c, prp1, 0);
	c[10] = cns;
	uint16_t st = admin(c, NULL);
	CHECK(st == 0, "identify CNS %u: status 0x%x", cns, st);
}

static void check_identify(const uint8_t *id, const char *where)
{
	char sn[21], mn[41];

	memcpy(sn, id + 4, 20);
	sn[20] = 0;
	memcpy(mn, id + 24, 40);
	mn[40] = 0;
	CHECK(strncmp(mn, "QEMU NVMe Ctrl", 14) == 0 && mn[14] == ' ', "%s: model \"%s\"", where, mn);
	CHECK(strncmp(sn, "gpudirect-rs", 12) == 0 && sn[12] == ' ', "%s: serial \"%s\"", where, sn);
	CHECK((id[0] | id[1] << 8) == 0x1b36, "%s: vendor 0x%x", where, id[0] | id[1] << 8);
}

/* Read nlb 512-byte blocks at slba; PRP1 = p1, PRP2 = p2. */
static uint16_t nvm_read(uint64_t slba, uint32_t nlb, uint64_t p1, uint64_t p2)
{
	uint32_t c[16] = { 0x02 };

	c[1] = 1;
	set_prp(c, p1, p2);
	c[10] = (uint32_t)slba;
	c[11] = slba >> 32;
	c[12] = nlb - 1;
	return run_cmd(&iosq, &iocq, c, NULL);
}

static long check_pattern(const volatile uint64_t *p, uint64_t byte_off, size_t len)
{
	for (size_t i = 0; i < len / 8; i++)
		if (p[i] != (PATTERN_TAG | (byte_off + 8 * i)))
			return (long)i;
	return -1;
}

/* ------------------------------------------------------------------- gpusim --- */

static int gs_fd;

static uint64_t gs_alloc(uint64_t size)
{
	struct gpusim_alloc a = { .size = size };

	CHECK_OK(ioctl(gs_fd, GPUSIM_IOC_ALLOC, &a));
	return a.gpu_va;
}

static void gs_free(uint64_t va)
{
	struct gpusim_free f = { .gpu_va = va };

	CHECK_OK(ioctl(gs_fd, GPUSIM_IOC_FREE, &f));
}

/* ------------------------------------------------------------------- main --- */

static sigjmp_buf jb;
static void on_sigbus(int sig) { (void)sig; siglongjmp(jb, 1); }

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	bdf = getenv("NVME_BDF");
	if (!bdf || !*bdf) {
		printf("SKIP: no NVMe controller (NVME_BDF unset: scripts/vmtest attaches QEMU's)\n");
		return 77;
	}
	char drv[64];
	driver_of(drv, sizeof(drv));
	printf("# controller %s, bound to %s\n", bdf, drv);
	expect_nothing_held("start");

	/* --- bind to the helper through driver_override ------------------------------------ */
	bind_to(HELPER);
	find_node();
	OK("bind: %s bound to \"%s\", node %s", bdf, HELPER, devpath);

	int fd = open(devpath, O_RDWR | O_NONBLOCK);
	CHECK(fd >= 0, "open %s: %s", devpath, strerror(errno));
	struct nvm_ioctl_version v;
	memset(&v, 0xff, sizeof(v));
	CHECK_OK(ioctl(fd, NVM_GET_VERSION, &v));
	CHECK(v.abi_major == NVM_ABI_MAJOR && v.abi_minor == NVM_ABI_MINOR && v.reserved == 0,
	      "version %u.%u", v.abi_major, v.abi_minor);
	CHECK((v.features & (NVM_FEATURE_DEVICE_MEMORY | NVM_FEATURE_RELEASE_ON_CLOSE)) ==
	      (NVM_FEATURE_DEVICE_MEMORY | NVM_FEATURE_RELEASE_ON_CLOSE), "features 0x%x",
	      v.features);
	CHECK(NVM_GET_VERSION == 0x80108040u && NVM_MAP_HOST_MEMORY == 0x40188001u &&
	      NVM_MAP_DEVICE_MEMORY == 0x40188002u && NVM_UNMAP_MEMORY == 0x40088003u,
	      "ioctl numbers");
	OK("version: ABI %u.%u, features 0x%x", v.abi_major, v.abi_minor, v.features);

	/* --- BAR0 through the module ---------------------------------------------------------- */
	CHECK(mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED &&
	      errno == EINVAL, "1 MiB mapping of a 16 KiB BAR");
	CHECK(mmap(NULL, 0x1000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0x1000) == MAP_FAILED &&
	      errno == EINVAL, "offset mapping");
	CHECK(mmap(NULL, 0x2000, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) == MAP_FAILED &&
	      errno == EINVAL, "private mapping");
	bar = mmap(NULL, 0x2000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(bar != MAP_FAILED, "mmap BAR0: %s", strerror(errno));
	uint64_t cap = rd64(0);
	uint32_t vs = rd32(8);
	dstrd = (cap >> 32) & 0xf;
	to_ms = ((cap >> 24) & 0xff) * 500;
	CHECK(vs == 0x10400, "VS 0x%x", vs);
	CHECK((cap & 0xffff) >= 1 && to_ms > 0 && ((cap >> 48) & 0xf) == 0, "CAP 0x%llx",
	      (unsigned long long)cap);
	OK("bar0: CAP 0x%016llx (MQES %llu, TO %u ms, DSTRD %u), VS 1.4.0",
	   (unsigned long long)cap, (unsigned long long)(cap & 0xffff) + 1, to_ms, dstrd);

	/* --- host memory through the module -------------------------------------------------- */
	enum { ACQ, ASQ, IDH, IOCQ, IOSQ, PRPL, IDNS, RD = 8, NPG = 32 };
	uint8_t *host;
	CHECK(posix_memalign((void **)&host, PG, NPG * PG) == 0, "memalign");
	memset(host, 0, NPG * PG);
	uint64_t hio[NPG];
	memset(hio, 0, sizeof(hio));
	CHECK_OK(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)host, NPG, hio));
	CHECK(LSTAT("host_windows") == 1 && LSTAT("host_pages") == NPG, "stats after map");
	for (int i = 0; i < NPG; i++) {
		CHECK(hio[i] && !(hio[i] & (PG - 1)), "ioaddr %d 0x%llx", i,
		      (unsigned long long)hio[i]);
		CHECK(hio[i] == phys_of(host + i * PG), "page %d: bus 0x%llx, physical 0x%llx", i,
		      (unsigned long long)hio[i], (unsigned long long)phys_of(host + i * PG));
	}
	OK("map host: %d pages, bus addresses = physical addresses", NPG);

	ctrl_enable(host + ACQ * PG, hio[ACQ], host + ASQ * PG, hio[ASQ]);
	OK("enable: RDY 0 then 1 within CAP.TO, AQA 0x%x", rd32(0x24));

	identify(1, 0, hio[IDH]);
	check_identify(host + IDH * PG, "host memory");
	uint8_t mdts = host[IDH * PG + 77];
	OK("identify controller into host memory: \"QEMU NVMe Ctrl\", serial gpudirect-rs, MDTS %u",
	   mdts);

	/* --- GPU memory through the module --------------------------------------------------- */
	gs_fd = open(GPUSIM_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	CHECK(gs_fd >= 0, "open /dev/gpusim");
	struct gpusim_info gi;
	CHECK_OK(ioctl(gs_fd, GPUSIM_IOC_INFO, &gi));
	const uint64_t gsz = 16 * GPG;
	uint64_t gva = gs_alloc(gsz), gio[16];
	volatile uint8_t *gmem = mmap(NULL, gsz, PROT_READ | PROT_WRITE, MAP_SHARED, gs_fd, gva);
	CHECK(gmem != MAP_FAILED, "mmap gpusim: %s", strerror(errno));
	for (uint64_t i = 0; i < gsz; i += 8)
		*(volatile uint64_t *)(gmem + i) = 0x5a5a5a5a5a5a5a5aULL;
	long long pins0 = GSTAT("active_pins");
	/* an unaligned start inside the first page is rounded down, as upstream does */
	CHECK_OK(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva + 0x1234, 16, gio));
	CHECK(GSTAT("active_pins") == pins0 + 1 && GSTAT("active_dma_mappings") == 1 &&
	      LSTAT("gpu_windows") == 1 && LSTAT("gpu_pages") == 16, "pin/mapping counters");
	for (int i = 0; i < 16; i++)
		CHECK(!(gio[i] & (GPG - 1)) && gio[i] >= gi.bar_phys &&
		      gio[i] + GPG <= gi.bar_phys + gi.bar_size, "GPU ioaddr %d 0x%llx outside the BAR",
		      i, (unsigned long long)gio[i]);
	OK("map device: 16 GPU pages, bus addresses inside the gpusim BAR");

	identify(1, 0, gio[3] + 2 * PG);
	CHECK(memcmp((const void *)(gmem + 3 * GPG + 2 * PG), host + IDH * PG, PG) == 0,
	      "identify data in GPU memory differs from host memory");
	check_identify((const uint8_t *)(gmem + 3 * GPG + 2 * PG), "GPU memory");
	CHECK(*(volatile uint64_t *)(gmem + 3 * GPG + PG) == 0x5a5a5a5a5a5a5a5aULL &&
	      *(volatile uint64_t *)(gmem + 3 * GPG + 3 * PG) == 0x5a5a5a5a5a5a5a5aULL,
	      "controller wrote outside the identify page");
	OK("identify controller into GPU memory: same 4096 bytes as in host memory");

	/* --- I/O queue pair, reads into host and GPU memory ------------------------------------- */
	identify(0, 1, hio[IDNS]);
	uint8_t flbas = host[IDNS * PG + 26] & 0xf;
	uint32_t lbads = host[IDNS * PG + 128 + 4 * flbas + 2];
	uint64_t nsze = *(uint64_t *)(host + IDNS * PG);
	CHECK(lbads == 9 && nsze >= 2048, "namespace: LBADS %u, %llu blocks", lbads,
	      (unsigned long long)nsze);
	uint32_t c[16] = { 0x09 }, dw0 = 0;
	c[10] = 0x07;
	c[11] = 0;   /* one SQ, one CQ */
	CHECK(admin(c, &dw0) == 0, "set features number of queues");
	memset(c, 0, sizeof(c));
	q_init(&iocq, host + IOCQ * PG, hio[IOCQ], 1, 64);
	q_init(&iosq, host + IOSQ * PG, hio[IOSQ], 1, 64);
	c[0] = 0x05;
	set_prp(c, hio[IOCQ], 0);
	c[10] = (63u << 16) | 1;
	c[11] = 1;   /* PC, no interrupts */
	CHECK(admin(c, NULL) == 0, "create I/O CQ");
	memset(c, 0, sizeof(c));
	c[0] = 0x01;
	set_prp(c, hio[IOSQ], 0);
	c[10] = (63u << 16) | 1;
	c[11] = (1u << 16) | 1;
	CHECK(admin(c, NULL) == 0, "create I/O SQ");
	OK("queues: %u/%u granted, I/O CQ 1 and SQ 1 (64 entries) in host memory",
	   (dw0 & 0xffff) + 1, (dw0 >> 16) + 1);

	/* PRP1 only, PRP1 + PRP2, PRP list; 150 commands wrap the 64-entry queues twice */
	uint8_t *rd = host + RD * PG;
	unsigned seed = 12345;
	for (int i = 0; i < 150; i++) {
		uint64_t lba = (seed = seed * 1103515245 + 12345) % (nsze - 64);
		memset(rd, 0, 8 * PG);
		uint16_t st;
		size_t len;
		if (i % 3 == 0) {
			len = PG;
			st = nvm_read(lba, 8, hio[RD], 0);
		} else if (i % 3 == 1) {
			len = 2 * PG;
			st = nvm_read(lba, 16, hio[RD], hio[RD + 1]);
		} else {
			len = 8 * PG;
			uint64_t *l = (uint64_t *)(host + PRPL * PG);
			for (int k = 1; k < 8; k++)
				l[k - 1] = hio[RD + k];
			st = nvm_read(lba, 64, hio[RD], hio[PRPL]);
		}
		CHECK(st == 0, "read %d (lba %llu): status 0x%x", i, (unsigned long long)lba, st);
		long bad = check_pattern((uint64_t *)rd, lba * 512, len);
		CHECK(bad < 0, "read %d: word %ld at lba %llu is 0x%llx", i, bad,
		      (unsigned long long)lba, (unsigned long long)((uint64_t *)rd)[bad]);
	}
	OK("read into host memory: 150 verified reads (PRP1, PRP1+PRP2, PRP list), queues wrapped");

	/* 64 KiB into one GPU page, through a PRP list in host memory */
	uint64_t *l = (uint64_t *)(host + PRPL * PG);
	for (int k = 1; k < 16; k++)
		l[k - 1] = gio[5] + k * PG;
	CHECK(nvm_read(1000, 128, gio[5], hio[PRPL]) == 0, "read into GPU memory");
	long bad = check_pattern((volatile uint64_t *)(gmem + 5 * GPG), 1000 * 512, GPG);
	CHECK(bad < 0, "GPU read: word %ld differs", bad);
	CHECK(*(volatile uint64_t *)(gmem + 6 * GPG) == 0x5a5a5a5a5a5a5a5aULL,
	      "read spilled into the next GPU page");
	OK("read into GPU memory: 64 KiB verified through the simulated GPU's mapping");

	/* --- unmap -------------------------------------------------------------------------- */
	CHECK_OK(unmap_mem(fd, gva + 0x10));   /* any address in the first page finds it */
	CHECK(GSTAT("active_pins") == pins0 && GSTAT("active_dma_mappings") == 0 &&
	      LSTAT("gpu_windows") == 0, "GPU unmap left pins");
	CHECK_ERR(unmap_mem(fd, gva), EINVAL);
	OK("unmap: GPU window gone (pin and DMA mapping released), second unmap EINVAL");

	/* --- a child that exits with live windows ------------------------------------------- */
	long long stops0 = LSTAT("controller_stops");
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int cfd = open(devpath, O_RDWR), gfd = open(GPUSIM_DEVICE_PATH, O_RDWR);
		void *m = NULL;
		uint64_t a[64];
		struct gpusim_alloc ga = { .size = 4 * GPG };
		if (cfd < 0 || gfd < 0 || posix_memalign(&m, PG, 64 * PG) ||
		    map_mem(cfd, NVM_MAP_HOST_MEMORY, (uintptr_t)m, 64, a) ||
		    ioctl(gfd, GPUSIM_IOC_ALLOC, &ga) ||
		    map_mem(cfd, NVM_MAP_DEVICE_MEMORY, ga.gpu_va, 4, a) ||
		    LSTAT("host_pages") != NPG + 64 || LSTAT("gpu_pages") != 4)
			_exit(3);
		_exit(0);   /* no unmap, no close: exit releases */
	}
	int ws;
	CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
	      "child failed (status 0x%x)", ws);
	CHECK(LSTAT("host_windows") == 1 && LSTAT("host_pages") == NPG && LSTAT("gpu_windows") == 0,
	      "child's windows survived it: host %lld pages, gpu %lld", LSTAT("host_pages"),
	      LSTAT("gpu_pages"));
	CHECK(GSTAT("active_pins") == pins0 && GSTAT("active_dma_mappings") == 0,
	      "child's GPU pin survived it");
	/* documented: the controller may have been using them, so the module stopped it */
	CHECK(LSTAT("controller_stops") == stops0 + 1 && !(rd32(0x1c) & 1),
	      "controller not stopped after the child died with windows (stops %lld, CSTS 0x%x)",
	      LSTAT("controller_stops"), rd32(0x1c));
	OK("child exit with live windows: its pins released, controller stopped (CSTS.RDY 0)");

	/* --- GPU memory freed while mapped -------------------------------------------------- */
	ctrl_enable(host + ACQ * PG, hio[ACQ], host + ASQ * PG, hio[ASQ]);
	CHECK_OK(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 16, gio));
	identify(1, 0, gio[0]);
	check_identify((const uint8_t *)gmem, "GPU memory again");
	long long revoked0 = LSTAT("revoked_windows");
	munmap((void *)gmem, gsz);
	gs_free(gva);   /* the GPU driver reclaims the memory under the mapped window */
	CHECK(LSTAT("revoked_windows") == revoked0 + 1 && LSTAT("gpu_windows") == 0 &&
	      GSTAT("active_pins") == pins0 && GSTAT("active_dma_mappings") == 0,
	      "window not revoked: revoked %lld, gpu windows %lld, pins %lld",
	      LSTAT("revoked_windows"), LSTAT("gpu_windows"), GSTAT("active_pins"));
	CHECK(!(rd32(0x1c) & 1) && !(rd32(0x14) & 1) && LSTAT("controller_stops") == stops0 + 2,
	      "controller still enabled after its GPU window was freed (CC 0x%x CSTS 0x%x)",
	      rd32(0x14), rd32(0x1c));
	CHECK_OK(unmap_mem(fd, gva));   /* the revoked record goes */
	CHECK_ERR(unmap_mem(fd, gva), EINVAL);
	/* the reclaimed memory can be handed out again, and the controller is still usable */
	gva = gs_alloc(gsz);
	ctrl_enable(host + ACQ * PG, hio[ACQ], host + ASQ * PG, hio[ASQ]);
	identify(1, 0, hio[IDH]);
	check_identify(host + IDH * PG, "after revocation");
	OK("GPU free while mapped: controller stopped before the pages went, window revoked, "
	   "unmap of it 0 then EINVAL, controller re-enabled");

	/* --- bad arguments ----------------------------------------------------------------- */
	long long maps0 = LSTAT("total_maps");
	uint64_t a[4];
	void *ro = mmap(NULL, 2 * PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *hole = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(ro != MAP_FAILED && hole != MAP_FAILED, "mmap");
	munmap(hole + PG, PG);
	hole[0] = 1;
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)host, 0, a), EINVAL);
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)host, 1ULL << 21, a), EINVAL);
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)host, 1ULL << 62, a), EINVAL);
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, 0xffffffffffff0000ULL, 16, a), EINVAL); /* wraps */
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, 0xffff888000000000ULL, 1, a), EFAULT); /* kernel */
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)hole, 2, a), EFAULT); /* half unmapped */
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)ro, 1, a), EFAULT);   /* read-only */
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)hole, 1, NULL), EFAULT);
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)hole, 1, (uint64_t *)ro), EFAULT);
	CHECK_ERR(ioctl(fd, NVM_MAP_HOST_MEMORY, NULL), EFAULT);
	CHECK_ERR(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 0, a), EINVAL);
	CHECK_ERR(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 17, a), EINVAL);       /* past the alloc */
	CHECK_ERR(map_mem(fd, NVM_MAP_DEVICE_MEMORY, (uintptr_t)host, 1, a), EINVAL); /* not GPU */
	CHECK_ERR(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 1, NULL), EFAULT);
	CHECK_ERR(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 1, (uint64_t *)ro), EFAULT);
	CHECK_ERR(unmap_mem(fd, 0x1000), EINVAL);
	CHECK_ERR(ioctl(fd, NVM_UNMAP_MEMORY, NULL), EFAULT);
	CHECK_ERR(ioctl(fd, NVM_GET_VERSION, NULL), EFAULT);
	CHECK_ERR(ioctl(fd, _IOW(NVM_IOCTL_TYPE, 1, uint64_t), a), EINVAL);   /* wrong size */
	CHECK_ERR(ioctl(fd, _IOWR(NVM_IOCTL_TYPE, 1, struct nvm_ioctl_map), a), EINVAL);
	CHECK_ERR(ioctl(fd, _IO(NVM_IOCTL_TYPE, 9), 0), EINVAL);
	CHECK_ERR(ioctl(fd, 0, 0), EINVAL);
	CHECK(LSTAT("host_windows") == 1 && LSTAT("host_pages") == NPG && LSTAT("gpu_windows") == 0 &&
	      GSTAT("active_pins") == pins0 && GSTAT("active_dma_mappings") == 0,
	      "a refused call left a window or pin");
	/* the four copy-out failures (NULL, read-only) happened after pinning: made, then undone */
	CHECK(LSTAT("total_maps") == maps0 + 4, "total_maps %lld, expected %lld",
	      LSTAT("total_maps"), maps0 + 4);
	OK("bad arguments: every ioctl refused with its errno, nothing left pinned");

	/* any thread/fd of the file may unmap; a second open's windows are its own */
	int fd2 = open(devpath, O_RDWR);
	CHECK(fd2 >= 0, "second open");
	CHECK_OK(map_mem(fd2, NVM_MAP_HOST_MEMORY, (uintptr_t)(host + RD * PG), 4, a));
	CHECK_ERR(unmap_mem(fd, (uintptr_t)(host + RD * PG)), EINVAL);
	CHECK(LSTAT("host_windows") == 2, "two windows");
	close(fd2);   /* released on close, controller stopped (it had a live window) */
	CHECK(LSTAT("host_windows") == 1 && LSTAT("host_pages") == NPG, "close did not release");
	OK("windows belong to their open file: released on its close");

	/* --- unbind with live windows and a live BAR mapping --------------------------------- */
	CHECK_OK(map_mem(fd, NVM_MAP_DEVICE_MEMORY, gva, 16, gio));
	long long stops1 = LSTAT("controller_stops");
	ctrl_enable(host + ACQ * PG, hio[ACQ], host + ASQ * PG, hio[ASQ]);
	unbind();
	CHECK(LSTAT("host_windows") == 0 && LSTAT("gpu_windows") == 0 &&
	      GSTAT("active_pins") == pins0 && LSTAT("controller_stops") == stops1 + 1,
	      "unbind kept windows (host %lld gpu %lld, stops %lld)", LSTAT("host_windows"),
	      LSTAT("gpu_windows"), LSTAT("controller_stops"));
	CHECK_ERR(map_mem(fd, NVM_MAP_HOST_MEMORY, (uintptr_t)host, 1, a), ENODEV);
	CHECK_ERR(unmap_mem(fd, (uintptr_t)host), ENODEV);
	signal(SIGBUS, on_sigbus);
	volatile int faulted = 0;
	if (sigsetjmp(jb, 1) == 0)
		(void)rd32(0);
	else
		faulted = 1;
	signal(SIGBUS, SIG_DFL);
	CHECK(faulted, "BAR0 mapping still works after unbind");
	CHECK(mmap(NULL, 0x1000, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED && errno == ENODEV,
	      "mmap after unbind");
	munmap((void *)bar, 0x2000);
	close(fd);
	CHECK(open(devpath, O_RDWR) < 0, "node still opens after unbind");
	OK("unbind with live windows: all released, controller stopped, BAR mapping zapped, "
	   "file answers ENODEV");

	gs_free(gva);
	close(gs_fd);
	free(host);
	expect_nothing_held("end");

	/* --- back to nvme ------------------------------------------------------------------- */
	bind_to("nvme");
	OK("rebind: %s bound to nvme again", bdf);
	if (strncmp(devpath, "/tmp/", 5) == 0)
		unlink(devpath);
	printf("# all passed\n");
	return 0;
}
