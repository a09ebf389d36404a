// SPDX-License-Identifier: MIT
/*
 * capi_fuzz - random sequences of gdr_* and gds_* calls with valid, stale, foreign, forged and
 * NULL arguments, against the simulated backends (cudasim in host-memory mode; libgdrapi's
 * dma-buf backend over cudasim's memfd exports). Built and run under ASan/UBSan by
 * compat-tests/fuzz/run.sh. Every call must succeed or return the error docs/return-values.md and
 * docs/gdsync.md give for its arguments; outputs of failed calls must stay untouched.
 *
 *   capi_fuzz [--seed=N] [--ops=N] [--backend=dma-buf|gdrdrv] [--allow-known-oversize-map]
 *   (CAPI_FUZZ_TRACE=1 logs pins and copies). --backend=gdrdrv: libgdrapi over gdrdrv and cudasim
 *   over gpusim, in the VM (tests/vm/suites/65-capi-fuzz.sh).
 *
 * The seed is printed first; the run is single-threaded, so a seed replays exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gdsync.h>
#include <gdsync/tools.h>
#include <gdrapi.h>

/* The legacy 40-byte query: gdrapi.h maps the name gdr_get_info to gdr_get_info_v2. */
extern int legacy_get_info(gdr_t g, gdr_mh_t mh, void *info) __asm__("gdr_get_info");

#define NG 4		/* gdr_t slots */
#define NH 24		/* handle slots */
#define NBUF 6		/* CUDA allocations */

static uint64_t seed, rng_state;
static uint64_t opt_ops = 20000;
static uint64_t op_no, failures, calls, successes, known_hits;
/*
 * --allow-known-oversize-map: gdr_map of more than the pinned range succeeds on the dma-buf
 * backend over cudasim (a memfd stands in for the dma-buf, and mmap of a real dma-buf past its
 * size fails with EINVAL); accesses past the end then die with SIGBUS. Counted and reported, not
 * failed, while the owners of libgdrapi's dma-buf path and cudasim fix it.
 */
static bool allow_oversize_map;
/* --backend=gdrdrv: libgdrapi over gdrdrv + gpusim (the VM), else over dma-buf (anywhere). */
static bool on_gdrdrv;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static bool chance(unsigned int pct)
{
	return below(100) < pct;
}

#define FAIL(...) do { \
	fprintf(stderr, "CAPI FUZZ FAIL seed=0x%" PRIx64 " op#%" PRIu64 " (%s:%d): ", seed, op_no, \
		__func__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); \
	fputc('\n', stderr); \
	failures++; \
} while (0)

/* The call returned r; it must be one of the listed values. */
#define EXPECT(what, r, ...) do { \
	static const int ok_[] = { __VA_ARGS__ }; \
	int r_ = (r); \
	size_t i_; \
	bool hit_ = false; \
	calls++; \
	if (!r_) successes++; \
	for (i_ = 0; i_ < sizeof(ok_) / sizeof(ok_[0]); i_++) \
		hit_ |= ok_[i_] == r_; \
	if (!hit_) \
		FAIL("%s returned %d (%s)", (what), r_, strerror(r_)); \
} while (0)

/* ---- CUDA (cudasim) --------------------------------------------------------------------- */

static CUstream stream;

static void cuda_setup(void)
{
	CUdevice dev;
	CUcontext ctx;

	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, 0)) {
		fprintf(stderr, "capi_fuzz: cannot set up cudasim\n");
		exit(2);
	}
}

struct buf {
	CUdeviceptr p;
	size_t size;
};
static struct buf bufs[NBUF];

static void forget_buf(int i);

static void buf_renew(int i)
{
	forget_buf(i);
	if (bufs[i].p)
		cuMemFree(bufs[i].p);	/* maybe still pinned: the library must cope */
	bufs[i].p = 0;
	bufs[i].size = chance(50) ? (below(16) + 1) * 65536 : below(300000) + 1;
	if (cuMemAlloc(&bufs[i].p, bufs[i].size) != CUDA_SUCCESS)
		bufs[i].p = 0;
}

/* ---- gdr_* -------------------------------------------------------------------------------- */

struct inst {
	gdr_t g;
	bool live;	/* open; else a stale value (closed) or empty */
};
static struct inst insts[NG];

struct hnd {
	gdr_mh_t mh;
	int inst;	/* owner slot; -1 empty */
	bool live;	/* pinned, not unpinned or closed since */
	void *map;	/* mapping start, NULL if unmapped */
	size_t map_size;
	size_t pin_size;
	int buf;	/* the CUDA allocation it pins, -1 once freed (copies would fault: SIGBUS) or
			 * when the pin reaches past it */
};
static struct hnd hnds[NH];

static uint64_t forged_storage[16];

/* A gdr_t that must be refused: NULL, forged, or closed and not reused by a live instance. */
static gdr_t bad_g(void)
{
	int i;

	switch (below(4)) {
	case 0: return NULL;
	case 1: return (gdr_t)forged_storage;
	case 2: return (gdr_t)(uintptr_t)1;
	default:
		for (i = 0; i < NG; i++) {
			int j;
			bool aliased = false;

			if (insts[i].live || !insts[i].g)
				continue;
			/* A stale value equal to a live instance's address is that instance now. */
			for (j = 0; j < NG; j++)
				aliased |= insts[j].live && insts[j].g == insts[i].g;
			if (!aliased)
				return insts[i].g;
		}
		return NULL;
	}
}

static int live_inst(void)
{
	int i, start = (int)below(NG);

	for (i = 0; i < NG; i++)
		if (insts[(start + i) % NG].live)
			return (start + i) % NG;
	return -1;
}

/* A handle that no live instance knows as its own: never pinned, unpinned, or of a closed g. */
static gdr_mh_t bad_h(int for_inst)
{
	gdr_mh_t mh = { 0 };
	int i, start = (int)below(NH);

	if (chance(30)) {
		mh.h = chance(50) ? 0 : (unsigned long)rnd();
		for (i = 0; i < NH; i++)	/* made-up values must not collide with live ones */
			if (hnds[i].live && hnds[i].mh.h == mh.h)
				mh.h = 0;
		return mh;
	}
	for (i = 0; i < NH; i++) {
		struct hnd *h = &hnds[(start + i) % NH];

		if (h->inst < 0)
			continue;
		if (!h->live || h->inst != for_inst) {
			int j;
			bool clash = false;

			/* A stale value reused by a live handle of for_inst would be valid. */
			for (j = 0; j < NH; j++)
				clash |= hnds[j].live && hnds[j].inst == for_inst && hnds[j].mh.h == h->mh.h;
			if (!clash)
				return h->mh;
		}
	}
	return mh;
}

static int live_h(int inst)
{
	int i, start = (int)below(NH);

	for (i = 0; i < NH; i++) {
		struct hnd *h = &hnds[(start + i) % NH];

		if (h->live && h->inst == inst)
			return (start + i) % NH;
	}
	return -1;
}

static void forget_inst(int inst)
{
	int i;

	for (i = 0; i < NH; i++)
		if (hnds[i].inst == inst && hnds[i].live) {
			hnds[i].live = false;
			hnds[i].map = NULL;
		}
}

/* Every gdr_* entry point with a bad g: EINVAL, and outputs untouched. */
static void op_bad_instance(void)
{
	gdr_t g = bad_g();
	gdr_mh_t mh = { 0x5a5a };
	gdr_info_t info;
	void *va = (void *)0x1234;
	int flag = 77;
	int v = 55, ma = 9, mi = 9;

	memset(&info, 0xa5, sizeof(info));
	switch (below(9)) {
	case 0: EXPECT("gdr_close(bad)", gdr_close(g), EINVAL); break;
	case 1:
		EXPECT("gdr_pin_buffer(bad)", gdr_pin_buffer(g, bufs[0].p, 65536, 0, 0, &mh), EINVAL);
		if (mh.h != 0x5a5a)
			FAIL("pin with a bad g wrote the handle");
		break;
	case 2: EXPECT("gdr_unpin_buffer(bad)", gdr_unpin_buffer(g, bad_h(-1)), EINVAL); break;
	case 3:
		EXPECT("gdr_get_callback_flag(bad)", gdr_get_callback_flag(g, bad_h(-1), &flag), EINVAL);
		if (flag != 77)
			FAIL("callback flag written on failure");
		break;
	case 4:
		EXPECT("gdr_get_info_v2(bad)", gdr_get_info_v2(g, bad_h(-1), &info), EINVAL);
		if (((unsigned char *)&info)[0] != 0xa5)
			FAIL("info written on failure");
		break;
	case 5:
		EXPECT("gdr_map(bad)", gdr_map(g, bad_h(-1), &va, 65536), EINVAL);
		if (va != (void *)0x1234)
			FAIL("map wrote *va on failure");
		break;
	case 6: EXPECT("gdr_unmap(bad)", gdr_unmap(g, bad_h(-1), va, 65536), EINVAL); break;
	case 7:
		EXPECT("gdr_driver_get_version(bad)", gdr_driver_get_version(g, &ma, &mi), EINVAL);
		if (ma != 9 || mi != 9)
			FAIL("driver version written on failure");
		break;
	default:
		EXPECT("gdr_get_attribute(bad)", gdr_get_attribute(g, (gdr_attr_t)(below(5)), &v), EINVAL);
		if (v != 0)
			FAIL("get_attribute must write 0 first, wrote %d", v);
		break;
	}
}

static void op_open_close(void)
{
	int i = (int)below(NG);

	if (insts[i].live) {
		EXPECT("gdr_close(live)", gdr_close(insts[i].g), 0);
		insts[i].live = false;
		forget_inst(i);
		return;
	}
	{
		gdr_t g = gdr_open();

		calls++;
		if (!g) {
			FAIL("gdr_open failed (%s backend)", on_gdrdrv ? "gdrdrv" : "dma-buf");
			return;
		}
		successes++;
		insts[i].g = g;
		insts[i].live = true;
	}
}

/* Freed under its pins: mapped accesses may fault, as with gdrdrv (documented SIGBUS). */
static void forget_buf(int i)
{
	int k;

	for (k = 0; k < NH; k++)
		if (hnds[k].buf == i)
			hnds[k].buf = -1;
}

static void op_pin(void)
{
	int ii = live_inst(), k = (int)below(NH), bi = (int)below(NBUF);
	struct buf *b = &bufs[bi];
	gdr_mh_t mh = { 0x77 };
	unsigned long addr;
	size_t size;
	int r;

	if (ii < 0)
		return;
	addr = b->p;
	size = b->size;
	switch (below(8)) {
	case 0: addr += below(b->size); size = 1 + below(b->size - (addr - b->p)); break;
	case 1: size = b->size + 65536; break;			/* past the end */
	case 2: addr = 0; break;
	case 3: size = 0; break;
	case 4: addr = (unsigned long)rnd(); break;
	case 5: size = (size_t)-1 - addr + 2; break;		/* overflows */
	default: break;
	}
	if (!b->p && addr == 0)
		addr = 0;
	if (chance(10)) {
		EXPECT("gdr_pin_buffer(handle NULL)", gdr_pin_buffer(insts[ii].g, addr, size, 0, 0, NULL),
		       EINVAL);
		return;
	}
	if (chance(50))
		r = gdr_pin_buffer(insts[ii].g, addr, size, 0, 0, &mh);
	else
		r = gdr_pin_buffer_v2(insts[ii].g, addr, size, (uint32_t)(chance(20) ? rnd() : 0), &mh);
	EXPECT("gdr_pin_buffer", r, 0, EINVAL, ENOMEM, ENOTSUP, ENOENT, EIO);
	if (r) {
		if (mh.h != 0x77)
			FAIL("failed pin wrote the handle");
		return;
	}
	if (getenv("CAPI_FUZZ_TRACE"))
		fprintf(stderr, "pin: buf %d base 0x%llx size 0x%zx -> addr 0x%lx size 0x%zx\n", bi,
			(unsigned long long)b->p, b->size, addr, size);
	if (!addr || !mh.h)
		FAIL("pin of 0x%lx + 0x%zx succeeded with handle 0x%lx", addr, size, mh.h);
	if (hnds[k].live) {	/* keep the old one reachable: unpin it now */
		if (hnds[k].map)
			EXPECT("gdr_unmap", gdr_unmap(insts[hnds[k].inst].g, hnds[k].mh, hnds[k].map,
						      hnds[k].map_size), 0);
		EXPECT("gdr_unpin_buffer", gdr_unpin_buffer(insts[hnds[k].inst].g, hnds[k].mh), 0);
	}
	/* A pin that reaches past its buffer covers other allocations' memory (cudasim sub-allocates as
	 * CUDA does): freeing those may invalidate it, so it counts as not backed by a live buffer. */
	hnds[k] = (struct hnd){ .mh = mh, .inst = ii, .live = true, .pin_size = size,
				.buf = addr >= b->p && size <= b->size && addr - b->p <= b->size - size ? bi : -1 };
}

static void op_handle_calls(void)
{
	int ii = live_inst(), k;
	struct hnd *h;
	gdr_info_t info;
	int flag = 9;

	if (ii < 0)
		return;
	k = live_h(ii);
	if (k < 0 || chance(30)) {	/* a bad handle on a live instance */
		gdr_mh_t mh = bad_h(ii);
		void *va = (void *)0x4321;

		switch (below(6)) {
		case 0: EXPECT("unpin(bad h)", gdr_unpin_buffer(insts[ii].g, mh), EINVAL); break;
		case 1: EXPECT("get_info_v2(bad h)", gdr_get_info_v2(insts[ii].g, mh, &info), EINVAL); break;
		case 2: EXPECT("get_info(bad h)", legacy_get_info(insts[ii].g, mh, &info), EINVAL); break;
		case 3: EXPECT("cb_flag(bad h)", gdr_get_callback_flag(insts[ii].g, mh, &flag), EINVAL); break;
		case 4: EXPECT("map(bad h)", gdr_map(insts[ii].g, mh, &va, 65536), EINVAL); break;
		default: {
			char tmp[16];

			EXPECT("copy_to(bad h)", gdr_copy_to_mapping(mh, tmp, tmp, sizeof(tmp)), EINVAL);
			break;
		}
		}
		return;
	}
	h = &hnds[k];
	switch (below(6)) {
	case 0:
		EXPECT("get_info_v2", gdr_get_info_v2(insts[ii].g, h->mh, chance(10) ? NULL : &info),
		       0, EINVAL);
		break;
	case 1:	/* the legacy query is refused by the dma-buf backend */
		if (on_gdrdrv)
			EXPECT("legacy gdr_get_info", legacy_get_info(insts[ii].g, h->mh, &info), 0);
		else
			EXPECT("legacy gdr_get_info", legacy_get_info(insts[ii].g, h->mh, &info), EBADF);
		break;
	case 2:
		EXPECT("get_callback_flag", gdr_get_callback_flag(insts[ii].g, h->mh, &flag), 0);
		/* 1 only after a free under a non-persistent gdrdrv pin; never with dma-buf. */
		if (flag != 0 && (!on_gdrdrv || flag != 1 || h->buf >= 0))
			FAIL("callback flag %d (buffer %s)", flag, h->buf >= 0 ? "live" : "freed");
		break;
	case 3: {	/* map or remap */
		void *va = NULL;
		size_t size = chance(80) ? h->pin_size : 1 + below(h->pin_size + 65536);
		int r;

		if (h->map) {
			EXPECT("map(mapped)", gdr_map(insts[ii].g, h->mh, &va, size), EAGAIN);
			break;
		}
		r = gdr_map_v2(insts[ii].g, h->mh, &va, size, (uint32_t)below(chance(90) ? 1 : 6));
		EXPECT("gdr_map_v2", r, 0, EINVAL, EOPNOTSUPP, EAGAIN);
		if (!r && size > ((h->pin_size + 0xffff) & ~(size_t)0xffff)) {
			if (!allow_oversize_map)
				FAIL("map of 0x%zx bytes of a 0x%zx-byte pin accepted", size, h->pin_size);
			known_hits++;
			EXPECT("gdr_unmap", gdr_unmap(insts[ii].g, h->mh, va, size), 0);
			break;
		}
		if (!r) {
			h->map = va;
			h->map_size = size;
		}
		break;
	}
	case 4: {	/* copies inside and around the mapping */
		unsigned char out[256], in[256];
		size_t n = 1 + below(sizeof(out)), off;
		int r;

		if (!h->map || h->buf < 0)
			break;
		off = below(h->map_size + 64);
		for (size_t i = 0; i < n; i++)
			out[i] = (unsigned char)rnd();
		if (getenv("CAPI_FUZZ_TRACE"))
			fprintf(stderr, "copy: pin 0x%zx map %p+0x%zx off 0x%zx n %zu buf %d size 0x%zx\n",
				h->pin_size, h->map, h->map_size, off, n, h->buf, bufs[h->buf].size);
		r = gdr_copy_to_mapping(h->mh, (char *)h->map + off, out, n);
		EXPECT("copy_to_mapping", r, 0, EINVAL);
		if (!r) {
			if (off + n > ((h->map_size + 4095) & ~(size_t)4095))
				FAIL("copy past the mapping end accepted");
			EXPECT("copy_from_mapping", gdr_copy_from_mapping(h->mh, in, (char *)h->map + off, n), 0);
			if (memcmp(in, out, n))
				FAIL("data read back differs");
		} else if (off + n <= h->map_size) {
			FAIL("in-range copy refused");
		}
		EXPECT("copy_to(NULL host)", gdr_copy_to_mapping(h->mh, h->map, NULL, 1), EINVAL);
		break;
	}
	default:	/* unmap (sometimes wrong), then unpin */
		if (h->map) {
			if (chance(30)) {
				EXPECT("unmap(wrong va)", gdr_unmap(insts[ii].g, h->mh, (char *)h->map + 4096,
								   h->map_size), EINVAL);
				break;
			}
			EXPECT("gdr_unmap", gdr_unmap(insts[ii].g, h->mh, h->map, h->map_size), 0);
			EXPECT("unmap twice", gdr_unmap(insts[ii].g, h->mh, h->map, h->map_size), EINVAL);
			h->map = NULL;
			break;
		}
		/* a foreign instance cannot unpin it */
		for (int j = 0; j < NG; j++)
			if (j != ii && insts[j].live && insts[j].g != insts[ii].g)
				EXPECT("unpin(foreign)", gdr_unpin_buffer(insts[j].g, h->mh), EINVAL);
		EXPECT("gdr_unpin_buffer", gdr_unpin_buffer(insts[ii].g, h->mh), 0);
		EXPECT("unpin twice", gdr_unpin_buffer(insts[ii].g, h->mh), EINVAL);
		h->live = false;
		break;
	}
}

static void op_misc_gdr(void)
{
	int ii = live_inst(), v = 5, ma, mi;
	const char *s = NULL;
	int attr = (int)below(6);

	switch (below(4)) {
	case 0:
		if (ii < 0)
			return;
		EXPECT("get_attribute", gdr_get_attribute(insts[ii].g, (gdr_attr_t)attr,
							  chance(10) ? NULL : &v), 0, EINVAL);
		break;
	case 1:
		if (ii < 0)
			return;
		if (!on_gdrdrv) {
			EXPECT("driver_get_version(dma-buf)", gdr_driver_get_version(insts[ii].g, &ma, &mi),
			       EBADF);
			break;
		}
		EXPECT("driver_get_version", gdr_driver_get_version(insts[ii].g, &ma, &mi), 0);
		if (ma != 2 || mi != 6)
			FAIL("driver version %d.%d", ma, mi);
		break;
	case 2:
		EXPECT("mapping_type_string", gdr_get_mapping_type_string((gdr_mapping_type_t)attr,
									  chance(10) ? NULL : &s), 0, EINVAL);
		break;
	default:
		gdr_runtime_get_version(chance(50) ? &ma : NULL, chance(50) ? &mi : NULL);
		break;
	}
}

/* ---- gds_* (no QP: parameters, descriptors, stream posts, mapped memory) ------------------- */

static uint32_t *host_words;	/* cuMemHostAlloc'd: GPU-accessible host memory */
static gds_mem_desc_t mdescs[3];

static uint32_t *pick_ptr(void)
{
	/* Wild pointers are not among them: the library cannot tell them from memory the caller
	 * owns, and executing a descriptor writes where it is told to (as upstream). */
	switch (below(5)) {
	case 0: return NULL;
	case 1: return (uint32_t *)((char *)host_words + 1);	/* misaligned */
	default: return host_words + below(64);
	}
}

static int pick_flags(void)
{
	switch (below(5)) {
	case 0: return (int)rnd();
	case 1: return GDS_MEMORY_HOST | GDS_MEMORY_GPU;
	case 2: return 0;
	default: return GDS_MEMORY_HOST;
	}
}

static void op_gds(void)
{
	gds_descriptor_t d[4];
	int v = 3, r;
	size_t n = 0, i;

	memset(d, 0, sizeof(d));
	switch (below(7)) {
	case 0:
		r = gds_query_param((gds_param_t)below(3), chance(10) ? NULL : &v);
		EXPECT("gds_query_param", r, 0, EINVAL);
		break;
	case 1: case 2: case 3:	/* prepare a few descriptors and post them */
		for (i = 0; i < 1 + below(4); i++) {
			uint32_t *p = pick_ptr();
			int f = pick_flags();

			switch (below(3)) {
			case 0:	/* only conditions that hold: a wait that never ends is no error */
				d[n].tag = GDS_TAG_WAIT_VALUE32;
				r = gds_prepare_wait_value32(&d[n].wait32, p, 0, GDS_WAIT_COND_GEQ, f);
				break;
			case 1:
				d[n].tag = GDS_TAG_WRITE_VALUE32;
				/* No byte >= 0x80: every word stays positive, so GEQ 0 holds. */
				r = gds_prepare_write_value32(&d[n].write32, p,
							      (uint32_t)rnd() & 0x7f7f7f7fU, f);
				break;
			default:
				d[n].tag = GDS_TAG_WRITE_MEMORY;
				r = gds_prepare_write_memory(&d[n].writemem, (uint8_t *)p,
							     (const uint8_t *)host_words, below(8), f);
				break;
			}
			EXPECT("gds_prepare_*", r, 0, EINVAL);
			if (!r)
				n++;
		}
		if (chance(10) && n)
			d[0].tag = (gds_tag_t)(5 + below(100));
		r = chance(80) ? gds_stream_post_descriptors(stream, n, d, 0) :
				 gds_post_descriptors(n, d, 0);
		/* WRITE_MEMORY has no public memop: EINVAL, as documented. */
		EXPECT("gds_(stream_)post_descriptors", r, 0, EINVAL);
		break;
	case 4:
		EXPECT("post_descriptors(NULL, n)", gds_stream_post_descriptors(stream, 1 + below(4), NULL, 0),
		       EINVAL);
		EXPECT("stream_post_send(NULL)", gds_stream_post_send(stream, NULL), EINVAL);
		EXPECT("stream_post_wait_cq(NULL)", gds_stream_post_wait_cq(stream, NULL), EINVAL);
		break;
	case 5: {	/* mapped memory: alloc, free, double free, bad descriptors */
		gds_mem_desc_t *m = &mdescs[below(3)];

		if (chance(10)) {
			EXPECT("alloc_mapped(NULL)", gds_alloc_mapped_memory(NULL, 4096, GDS_MEMORY_HOST), EINVAL);
			EXPECT("free_mapped(NULL)", gds_free_mapped_memory(NULL), EINVAL);
			break;
		}
		if (m->h_ptr || m->d_ptr) {
			EXPECT("gds_free_mapped_memory", gds_free_mapped_memory(m), 0);
			EXPECT("free_mapped twice", gds_free_mapped_memory(m), EINVAL);
			memset(m, 0, sizeof(*m));
		} else {
			r = gds_alloc_mapped_memory(m, 1 + below(100000),
						    chance(80) ? GDS_MEMORY_HOST : (int)below(8));
			EXPECT("gds_alloc_mapped_memory", r, 0, EINVAL, ENOMEM, ENODEV);
			if (r)
				memset(m, 0, sizeof(*m));
		}
		break;
	}
	default:
		EXPECT("gds_destroy_qp(NULL)", gds_destroy_qp(NULL), 0);
		errno = 0;
		if (gds_create_qp(NULL, NULL, NULL, 0, 0) != NULL || errno != EINVAL)
			FAIL("gds_create_qp(NULL...) must fail with EINVAL (errno %d)", errno);
		break;
	}
}

static void op_cuda_free(void)
{
	buf_renew((int)below(NBUF));
}

/* A whole unsigned number (decimal, 0x hex or 0 octal) or false: "--ops=bogus", "--ops=" and
 * "--ops=12k" must not run as 0 or 12 operations. */
static bool parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (*s == '\0' || *s == '-' || *s == '+')
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end != '\0')
		return false;
	*out = v;
	return true;
}

int main(int argc, char **argv)
{
	int i;

	for (i = 1; i < argc; i++) {
		bool ok = true;

		if (!strncmp(argv[i], "--seed=", 7)) {
			ok = parse_u64(argv[i] + 7, &seed);
		} else if (!strncmp(argv[i], "--ops=", 6)) {
			ok = parse_u64(argv[i] + 6, &opt_ops) && opt_ops > 0;
		} else if (!strcmp(argv[i], "--backend=gdrdrv")) {
			on_gdrdrv = true;
		} else if (!strcmp(argv[i], "--backend=dma-buf")) {
			on_gdrdrv = false;
		} else if (!strcmp(argv[i], "--allow-known-oversize-map")) {
			allow_oversize_map = true;
		} else {
			ok = false;
		}
		if (!ok) {
			fprintf(stderr, "capi_fuzz: bad argument '%s'\n"
				"usage: capi_fuzz [--seed=N] [--ops=N (N > 0)] [--backend=dma-buf|gdrdrv] "
				"[--allow-known-oversize-map]\n", argv[i]);
			return 2;
		}
	}
	if (!seed) {
		int fd = open("/dev/urandom", O_RDONLY);

		if (fd < 0 || read(fd, &seed, sizeof(seed)) != sizeof(seed) || !seed)
			seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
		if (fd >= 0)
			close(fd);
	}
	rng_state = seed;
	printf("capi_fuzz: seed=0x%" PRIx64 " ops=%" PRIu64 " backend=%s\n", seed, opt_ops,
	       on_gdrdrv ? "gdrdrv" : "dma-buf");
	fflush(stdout);

	cuda_setup();
	if (cuMemHostAlloc((void **)&host_words, 4096, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
		fprintf(stderr, "capi_fuzz: cuMemHostAlloc failed\n");
		return 2;
	}
	memset(host_words, 0, 4096);
	for (i = 0; i < NBUF; i++)
		buf_renew(i);
	for (i = 0; i < NH; i++) {
		hnds[i].inst = -1;
		hnds[i].buf = -1;
	}

	for (op_no = 0; op_no < opt_ops && failures < 20; op_no++) {
		switch (below(20)) {
		case 0: op_open_close(); break;
		case 1: case 2: case 3: op_bad_instance(); break;
		case 4: case 5: case 6: case 7: op_pin(); break;
		case 8: case 9: case 10: case 11: case 12: case 13: op_handle_calls(); break;
		case 14: op_misc_gdr(); break;
		case 15: op_cuda_free(); break;
		default: op_gds(); break;
		}
	}
	/* Tear down everything: closing with pins and mappings in place must release them. */
	for (i = 0; i < NG; i++)
		if (insts[i].live)
			EXPECT("final gdr_close", gdr_close(insts[i].g), 0);
	for (i = 0; i < 3; i++)
		if (mdescs[i].h_ptr || mdescs[i].d_ptr)
			EXPECT("final gds_free_mapped_memory", gds_free_mapped_memory(&mdescs[i]), 0);
	EXPECT("cuStreamSynchronize", (int)cuStreamSynchronize(stream), 0);
	for (i = 0; i < NBUF; i++)
		if (bufs[i].p)
			cuMemFree(bufs[i].p);
	cuMemFreeHost(host_words);
	printf("capi_fuzz: seed=0x%" PRIx64 " %" PRIu64 " operations, %" PRIu64 " calls (%" PRIu64
	       " succeeded), %" PRIu64 " failures\n", seed, op_no, calls, successes, failures);
	if (known_hits)
		printf("capi_fuzz: KNOWN BUG seen %" PRIu64 " times: gdr_map past the pinned range "
		       "succeeds on the dma-buf backend over cudasim\n", known_hits);
	if (failures) {
		printf("capi_fuzz: FAIL (replay: capi_fuzz --seed=0x%" PRIx64 " --ops=%" PRIu64 ")\n",
		       seed, opt_ops);
		return 1;
	}
	printf("capi_fuzz: PASS\n");
	return 0;
}
