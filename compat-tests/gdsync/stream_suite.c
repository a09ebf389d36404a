/*
 * The descriptor suite: gds_* descriptors executed on a real CUDA stream (cudasim here, an H100
 * on the GPU machine), with CPU threads racing the stream's waits. Written as a consumer would:
 * installed headers, linked with -lgdsync -lcuda.
 *
 * Usage: stream_suite [-g]   (-g: also run the GPU-memory cases that need cuMemAlloc memory)
 * Exit status 0 only if every case passed; skipped cases say what is missing.
 */
#define _GNU_SOURCE
#include <gdsync.h>
#include <gdsync/mlx5.h>
#include <gdsync/tools.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures, passes, skips;
static CUstream stream;

#define FAIL(...) do { fprintf(stderr, "FAIL %s:%d: ", __func__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures++; return; } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)
#define CU(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { const char *s_ = "?"; cuGetErrorString(r_, &s_); FAIL("%s = %d (%s)", #call, r_, s_); } } while (0)
#define PASS() do { passes++; printf("ok   %s\n", __func__); } while (0)
#define SKIP(why) do { skips++; printf("skip %s: %s\n", __func__, why); return; } while (0)

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void store32(volatile uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static uint32_t load32(volatile uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* Waits for the stream to drain, at most ms milliseconds; 0 when it drained. */
static int drain(double ms)
{
	double end = now_ms() + ms;
	CUresult r;
	while ((r = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
		if (now_ms() > end)
			return -1;
		usleep(50);
	}
	return r == CUDA_SUCCESS ? 0 : -2;
}

/* Spins until *p == v, at most ms milliseconds; 1 when seen. */
static int wait_for(volatile uint32_t *p, uint32_t v, double ms)
{
	double end = now_ms() + ms;
	while (load32(p) != v) {
		if (now_ms() > end)
			return 0;
		usleep(50);
	}
	return 1;
}

/* The stream must still be blocked after `ms` milliseconds. */
static int still_blocked(double ms)
{
	usleep((useconds_t)(ms * 1000));
	return cuStreamQuery(stream) == CUDA_ERROR_NOT_READY;
}

/* Posts one wait(word cond value) + write(out = marker) pair. */
static int post_wait_then_write(uint32_t *word, uint32_t value, gds_wait_cond_flag_t cond, int wflags,
				uint32_t *out, uint32_t marker, int mem)
{
	gds_descriptor_t d[2];
	int r;
	memset(d, 0, sizeof(d));
	d[0].tag = GDS_TAG_WAIT_VALUE32;
	if ((r = gds_prepare_wait_value32(&d[0].wait32, word, value, cond, mem | wflags)))
		return r;
	d[1].tag = GDS_TAG_WRITE_VALUE32;
	if ((r = gds_prepare_write_value32(&d[1].write32, out, marker, mem)))
		return r;
	return gds_stream_post_descriptors(stream, 2, d, 0);
}

static void test_query_param(void)
{
	int v = 0;
	CHECK(gds_query_param(GDS_PARAM_VERSION, &v) == 0 && v == 0x00020002, "version %#x", v);
	CHECK(GDS_API_VERSION_COMPATIBLE(v), "incompatible");
	CHECK(gds_query_param(GDS_NUM_PARAMS, &v) == EINVAL, "bad param accepted");
	CHECK(gds_query_param(GDS_PARAM_VERSION, NULL) == EINVAL, "NULL accepted");
	PASS();
}

/* Each condition blocks the stream until a CPU thread makes it true, with host memory. */
struct cond_case { gds_wait_cond_flag_t cond; uint32_t init, value, release; };

static void test_conditions_block_until_cpu_write(uint32_t *words)
{
	static const struct cond_case cases[] = {
		{ GDS_WAIT_COND_GEQ, 0, 5, 5 },
		{ GDS_WAIT_COND_GEQ, 0xfffffff0u, 3, 3 },        /* cyclic: 0xfffffff0 < 3 */
		{ GDS_WAIT_COND_EQ, 1, 7, 7 },
		{ GDS_WAIT_COND_AND, 0x10, 0x3, 0x2 },
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint32_t *w = &words[i * 2], *out = &words[i * 2 + 1];
		store32(w, cases[i].init);
		store32(out, 0);
		int r = post_wait_then_write(w, cases[i].value, cases[i].cond, 0, out, 0xa0 + i, GDS_MEMORY_HOST);
		CHECK(r == 0, "case %u: post = %d", i, r);
		CHECK(still_blocked(20), "case %u: stream did not block", i);
		CHECK(load32(out) == 0, "case %u: write ran before the wait was satisfied", i);
		store32(w, cases[i].release);
		CHECK(drain(20000) == 0, "case %u: stream did not resume", i);
		CHECK(load32(out) == 0xa0 + i, "case %u: out = %#x", i, load32(out));
	}
	PASS();
}

static void test_nor_follows_env(uint32_t *words)
{
	const char *e = getenv("GDS_DISABLE_WAIT_NOR");
	int enabled = e && atoi(e) == 0;
	store32(&words[0], 0xffffffffu);
	store32(&words[1], 0);
	int r = post_wait_then_write(&words[0], 0, GDS_WAIT_COND_NOR, 0, &words[1], 1, GDS_MEMORY_HOST);
	if (!enabled) {
		CHECK(r == EINVAL, "NOR must be refused by default, got %d", r);
		CHECK(drain(1000) == 0, "a refused batch left work behind");
		PASS();
		return;
	}
	if (r == EINVAL)
		SKIP("device has no NOR wait support");
	CHECK(r == 0, "post = %d", r);
	CHECK(still_blocked(20), "NOR wait did not block");
	store32(&words[0], 0xfffffffeu); /* ~(v | 0) != 0 */
	CHECK(drain(20000) == 0 && load32(&words[1]) == 1, "NOR wait did not release");
	PASS();
}

static void test_flags_are_accepted(uint32_t *words)
{
	/* POST_FLUSH on waits and PRE_BARRIER on writes: accepted whatever the device supports. */
	store32(&words[0], 1);
	store32(&words[1], 0);
	int r = post_wait_then_write(&words[0], 1, GDS_WAIT_COND_EQ, GDS_WAIT_POST_FLUSH, &words[1], 2, GDS_MEMORY_HOST);
	CHECK(r == 0, "post = %d", r);
	gds_write_value32_t w;
	CHECK(gds_prepare_write_value32(&w, &words[1], 3, GDS_MEMORY_HOST | GDS_WRITE_PRE_BARRIER) == 0, "prepare");
	gds_descriptor_t d;
	d.tag = GDS_TAG_WRITE_VALUE32;
	d.write32 = w;
	CHECK(gds_stream_post_descriptors(stream, 1, &d, 0) == 0, "post barrier write");
	CHECK(drain(20000) == 0 && load32(&words[1]) == 3, "out = %u", load32(&words[1]));
	PASS();
}

/* 600 writes in one call: more than one driver batch, still in order. */
static void test_large_batch_is_split_in_order(void)
{
	enum { N = 600 };
	gds_descriptor_t *d = calloc(N + 1, sizeof(*d));
	uint32_t *buf = aligned_alloc(4096, 4096);
	memset(buf, 0, 4096);
	for (int i = 0; i < N; i++) {
		d[i].tag = GDS_TAG_WRITE_VALUE32;
		/* words 0..N/2-1 written twice: the later value must win */
		if (gds_prepare_write_value32(&d[i].write32, &buf[i % (N / 2)], (uint32_t)i + 1, GDS_MEMORY_HOST)) {
			free(d); free(buf);
			FAIL("prepare %d", i);
		}
	}
	int r = gds_stream_post_descriptors(stream, N, d, 0);
	int ok = r == 0 && drain(20000) == 0;
	for (int i = 0; ok && i < N / 2; i++)
		if (load32(&buf[i]) != (uint32_t)(i + N / 2 + 1))
			ok = 0;
	free(d);
	free(buf);
	CHECK(ok, "post = %d or wrong values", r);
	PASS();
}

static void test_bad_descriptors_submit_nothing(uint32_t *words)
{
	gds_descriptor_t d[3];
	memset(d, 0, sizeof(d));
	store32(&words[0], 0);
	d[0].tag = GDS_TAG_WRITE_VALUE32;
	CHECK(gds_prepare_write_value32(&d[0].write32, &words[0], 9, GDS_MEMORY_HOST) == 0, "prepare");
	d[1].tag = (gds_tag_t)42;
	CHECK(gds_stream_post_descriptors(stream, 2, d, 0) == EINVAL, "bad tag accepted");
	d[1].tag = GDS_TAG_WAIT_VALUE32;
	d[1].wait32.ptr = &words[1];
	d[1].wait32.cond_flags = (gds_wait_cond_flag_t)7;
	d[1].wait32.flags = GDS_MEMORY_HOST;
	CHECK(gds_stream_post_descriptors(stream, 2, d, 0) == EINVAL, "bad condition accepted");
	d[1].wait32.cond_flags = GDS_WAIT_COND_EQ;
	d[1].wait32.ptr = (uint32_t *)((char *)&words[1] + 2);
	CHECK(gds_stream_post_descriptors(stream, 2, d, 0) == EINVAL, "misaligned wait accepted");
	d[1].tag = GDS_TAG_WRITE_MEMORY;
	CHECK(gds_prepare_write_memory(&d[1].writemem, (uint8_t *)&words[2], (const uint8_t *)&words[3], 4, GDS_MEMORY_HOST) == 0, "prepare wm");
	CHECK(gds_stream_post_descriptors(stream, 2, d, 0) == EINVAL, "WRITE_MEMORY has no public CUDA memop");
	CHECK(drain(1000) == 0 && load32(&words[0]) == 0, "a refused batch wrote something");
	CHECK(gds_prepare_wait_value32(&d[0].wait32, &words[0], 1, GDS_WAIT_COND_EQ, 0) == EINVAL, "no memory type accepted");
	CHECK(gds_prepare_wait_value32(&d[0].wait32, &words[0], 1, GDS_WAIT_COND_EQ, GDS_MEMORY_HOST | GDS_MEMORY_GPU) == EINVAL, "two memory types accepted");
	CHECK(gds_prepare_write_value32(&d[0].write32, &words[0], 1, GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH) == EINVAL, "wait flag on a write accepted");
	CHECK(gds_stream_post_descriptors(stream, 1, NULL, 0) == EINVAL, "NULL array accepted");
	CHECK(gds_stream_post_descriptors(stream, 0, NULL, 0) == 0, "empty post failed");
	PASS();
}

/* Real threads: a CPU writer releases N stream waits one by one, racing the stream's worker. */
struct race { uint32_t *word, *ack; int n; int timeouts; };

static void *race_writer(void *p)
{
	struct race *r = p;
	for (int i = 1; i <= r->n; i++) {
		if ((rand() & 7) == 0)
			usleep(rand() % 200);
		store32(r->word, (uint32_t)i);
		double end = now_ms() + 20000;
		while (load32(r->ack) < (uint32_t)i) {
			if (now_ms() > end) { r->timeouts++; return NULL; }
		}
	}
	return NULL;
}

static void test_cpu_writer_races_stream_waits(uint32_t *words, int mem)
{
	enum { N = 2000, CHUNK = 50 };
	struct race r = { &words[0], &words[1], N, 0 };
	store32(r.word, 0);
	store32(r.ack, 0);
	pthread_t t;
	pthread_create(&t, NULL, race_writer, &r);
	int err = 0;
	for (int base = 1; base <= N && !err; base += CHUNK) {
		gds_descriptor_t d[2 * CHUNK];
		for (int k = 0; k < CHUNK; k++) {
			uint32_t i = (uint32_t)(base + k);
			d[2 * k].tag = GDS_TAG_WAIT_VALUE32;
			err |= gds_prepare_wait_value32(&d[2 * k].wait32, r.word, i, GDS_WAIT_COND_GEQ, mem);
			d[2 * k + 1].tag = GDS_TAG_WRITE_VALUE32;
			err |= gds_prepare_write_value32(&d[2 * k + 1].write32, r.ack, i, mem);
		}
		if (!err)
			err = gds_stream_post_descriptors(stream, 2 * CHUNK, d, 0);
	}
	pthread_join(t, NULL);
	CHECK(!err, "post failed: %d", err);
	CHECK(r.timeouts == 0, "writer timed out waiting for ack %u", load32(r.ack));
	CHECK(drain(20000) == 0 && load32(r.ack) == N, "ack = %u", load32(r.ack));
	PASS();
}

/* gds_post_descriptors: the CPU executes the same descriptors, racing another thread. */
static void *cpu_releaser(void *p)
{
	usleep(20000);
	store32(p, 77);
	return NULL;
}

static void test_cpu_execution(uint32_t *words)
{
	gds_descriptor_t d[3];
	uint8_t src[24], dst[24];
	for (int i = 0; i < 24; i++) { src[i] = (uint8_t)(i * 7 + 1); dst[i] = 0; }
	store32(&words[0], 0);
	store32(&words[1], 0);
	d[0].tag = GDS_TAG_WAIT_VALUE32;
	CHECK(gds_prepare_wait_value32(&d[0].wait32, &words[0], 77, GDS_WAIT_COND_EQ, GDS_MEMORY_HOST) == 0, "p0");
	d[1].tag = GDS_TAG_WRITE_VALUE32;
	CHECK(gds_prepare_write_value32(&d[1].write32, &words[1], 5, GDS_MEMORY_HOST | GDS_WRITE_PRE_BARRIER) == 0, "p1");
	d[2].tag = GDS_TAG_WRITE_MEMORY;
	CHECK(gds_prepare_write_memory(&d[2].writemem, dst, src, sizeof(src), GDS_MEMORY_HOST | GDS_WRITE_MEMORY_POST_BARRIER_SYS) == 0, "p2");
	pthread_t t;
	pthread_create(&t, NULL, cpu_releaser, &words[0]);
	double t0 = now_ms();
	int r = gds_post_descriptors(3, d, 0);
	double dt = now_ms() - t0;
	pthread_join(t, NULL);
	CHECK(r == 0, "gds_post_descriptors = %d", r);
	CHECK(dt >= 15, "the CPU wait returned after %.1f ms, before the release", dt);
	CHECK(load32(&words[1]) == 5 && memcmp(src, dst, sizeof(src)) == 0, "writes missing");
	d[0].wait32.cond_flags = (gds_wait_cond_flag_t)9;
	CHECK(gds_post_descriptors(1, d, 0) == EINVAL, "invalid condition returned success");
	PASS();
}

static void test_dword_wait_info(uint32_t *words)
{
	gds_mlx5_dword_wait_info_t info;
	memset(&info, 0xff, sizeof(info));
	CHECK(gds_mlx5_get_dword_wait_info(&words[0], 42, GDS_MEMORY_HOST, &info) == 0, "host");
	CHECK(info.ptr != NULL && info.value == 42, "info %p %u", (void *)info.ptr, info.value);
	CUdeviceptr d = 0;
	CU(cuMemHostGetDevicePointer(&d, &words[0], 0));
	CHECK((CUdeviceptr)(uintptr_t)info.ptr == d, "device pointer %p, CUDA says %#llx", (void *)info.ptr, (unsigned long long)d);
	CHECK(gds_mlx5_get_dword_wait_info(&words[0], 1, 0, &info) == EINVAL, "no memory type accepted");
	CHECK(gds_mlx5_get_dword_wait_info(&words[0], 1, GDS_MEMORY_HOST, NULL) == EINVAL, "NULL info");
	PASS();
}

static void test_mapped_host_memory(void)
{
	gds_mem_desc_t m;
	memset(&m, 0, sizeof(m));
	CHECK(gds_alloc_mapped_memory(&m, 8192, GDS_MEMORY_HOST) == 0, "alloc");
	CHECK(m.h_ptr && m.d_ptr && m.alloc_size == 8192 && m.bar_ptr == NULL && ((uintptr_t)m.h_ptr & 4095) == 0, "desc");
	uint32_t *w = m.h_ptr;
	store32(&w[0], 0);
	store32(&w[1], 0);
	CHECK(post_wait_then_write(&w[0], 1, GDS_WAIT_COND_EQ, 0, &w[1], 3, GDS_MEMORY_HOST) == 0, "post");
	CHECK(still_blocked(10), "no block");
	store32(&w[0], 1);
	CHECK(drain(20000) == 0 && load32(&w[1]) == 3, "no write");
	CHECK(gds_free_mapped_memory(&m) == 0 && m.h_ptr == NULL, "free");
	CHECK(gds_free_mapped_memory(&m) == EINVAL, "double free accepted");
	CHECK(gds_alloc_mapped_memory(NULL, 64, GDS_MEMORY_HOST) == EINVAL, "NULL desc");
	CHECK(gds_alloc_mapped_memory(&m, 64, GDS_MEMORY_IO) == EINVAL, "IO alloc accepted");
	CHECK(gds_free_mapped_memory(NULL) == EINVAL, "NULL free");
	PASS();
}

static void test_mapped_gpu_memory(void)
{
	gds_mem_desc_t m;
	memset(&m, 0, sizeof(m));
	int r = gds_alloc_mapped_memory(&m, 65536, GDS_MEMORY_GPU);
	if (r == ENODEV)
		SKIP("no gdrcopy (libgdrapi.so.2 + /dev/gdrdrv) here");
	CHECK(r == 0, "alloc = %d", r);
	uint32_t *w = m.h_ptr; /* CPU view (BAR mapping) of the GPU buffer */
	store32(&w[0], 0);
	store32(&w[1], 0);
	CHECK(post_wait_then_write((uint32_t *)(uintptr_t)m.d_ptr, 4, GDS_WAIT_COND_GEQ, 0,
				   (uint32_t *)(uintptr_t)(m.d_ptr + 4), 6, GDS_MEMORY_GPU) == 0, "post");
	CHECK(still_blocked(10), "no block");
	store32(&w[0], 4);
	CHECK(drain(20000) == 0, "no resume");
	uint32_t v = 0;
	CU(cuMemcpyDtoH(&v, m.d_ptr + 4, 4));
	CHECK(v == 6, "GPU word = %u", v);
	CHECK(gds_free_mapped_memory(&m) == 0, "free");
	PASS();
}

/* GPU memory without a CPU mapping: stream-only write then wait, checked with a copy. */
static void test_gpu_memory_stream_only(void)
{
	CUdeviceptr d = 0;
	CU(cuMemAlloc(&d, 4096));
	CU(cuMemsetD32(d, 0, 1024));
	gds_descriptor_t x[3];
	x[0].tag = GDS_TAG_WRITE_VALUE32;
	CHECK(gds_prepare_write_value32(&x[0].write32, (uint32_t *)(uintptr_t)d, 11, GDS_MEMORY_GPU) == 0, "p0");
	x[1].tag = GDS_TAG_WAIT_VALUE32;
	CHECK(gds_prepare_wait_value32(&x[1].wait32, (uint32_t *)(uintptr_t)d, 11, GDS_WAIT_COND_EQ, GDS_MEMORY_GPU) == 0, "p1");
	x[2].tag = GDS_TAG_WRITE_VALUE32;
	CHECK(gds_prepare_write_value32(&x[2].write32, (uint32_t *)(uintptr_t)(d + 8), 12, GDS_MEMORY_GPU | GDS_WRITE_PRE_BARRIER) == 0, "p2");
	CHECK(gds_stream_post_descriptors(stream, 3, x, 0) == 0, "post");
	CHECK(drain(20000) == 0, "stream stuck");
	uint32_t v[3] = { 0, 0, 0 };
	CU(cuMemcpyDtoH(v, d, sizeof(v)));
	CHECK(v[0] == 11 && v[2] == 12, "GPU words %u %u", v[0], v[2]);
	CU(cuMemFree(d));
	PASS();
}

/* API 2.1 helpers still work for old binaries. */
int gds_stream_post_poll_dword(CUstream, uint32_t *, uint32_t, gds_wait_cond_flag_t, int);
int gds_stream_post_poke_dword(CUstream, uint32_t *, uint32_t, int);
int gds_stream_post_inline_copy(CUstream, void *, void *, size_t, int);
int gds_stream_post_polls_and_pokes(CUstream, size_t, uint32_t *[], uint32_t[], gds_wait_cond_flag_t[], int[],
				    size_t, uint32_t *[], uint32_t[], int[]);

static void test_legacy_21_helpers(uint32_t *words)
{
	store32(&words[0], 0);
	store32(&words[1], 0);
	store32(&words[2], 0);
	CHECK(gds_stream_post_poll_dword(stream, &words[0], 2, GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST) == 0, "poll");
	CHECK(gds_stream_post_poke_dword(stream, &words[1], 8, GDS_MEMORY_HOST) == 0, "poke");
	uint32_t *pp[1] = { &words[0] }, mg[1] = { 3 }, *kp[1] = { &words[2] }, kv[1] = { 9 };
	gds_wait_cond_flag_t cf[1] = { GDS_WAIT_COND_EQ };
	int pf[1] = { GDS_MEMORY_HOST }, kf[1] = { GDS_MEMORY_HOST };
	CHECK(gds_stream_post_polls_and_pokes(stream, 1, pp, mg, cf, pf, 1, kp, kv, kf) == 0, "polls and pokes");
	CHECK(still_blocked(10) && load32(&words[1]) == 0, "did not block");
	store32(&words[0], 2);
	int poked = wait_for(&words[1], 8, 20000);
	int blocked = still_blocked(10) && load32(&words[2]) == 0;
	store32(&words[0], 3); /* release before any check can return */
	CHECK(poked, "first poke missing");
	CHECK(blocked, "second wait not blocking");
	CHECK(drain(20000) == 0 && load32(&words[2]) == 9, "pokes missing");
	CHECK(gds_stream_post_inline_copy(stream, &words[3], &words[4], 4, GDS_MEMORY_HOST) == EINVAL, "inline copy has no public memop");
	CHECK(gds_stream_post_polls_and_pokes(stream, 1, NULL, mg, cf, pf, 0, NULL, NULL, NULL) == EINVAL, "NULL arrays");
	PASS();
}

/* Verbs entry points with objects that are not ours: EINVAL, nothing crashes (the real QP/CQ paths
 * are covered by verbs_loopback.c on soft-RoCE in the VM). */
static void test_verbs_foreign_objects(void)
{
	struct gds_cq cq = { NULL, 0 };
	gds_wait_request_t *wr = calloc(1, sizeof(*wr));
	CHECK(gds_prepare_wait_cq(&cq, wr, 0) == EINVAL, "prepare_wait_cq");
	CHECK(cq.curr_offset == 1 && wr->peek.entries == GDS_WAIT_INFO_MAX_OPS, "request not initialised");
	CHECK(gds_stream_wait_cq(stream ? stream : CU_STREAM_LEGACY, &cq, 0) == EINVAL, "stream_wait_cq");
	CHECK(gds_post_wait_cq(&cq, wr, 0) == EINVAL, "post_wait_cq");
	free(wr);
	CHECK(gds_create_qp(NULL, NULL, NULL, 0, 0) == NULL && errno == EINVAL, "create_qp NULL args");
	CHECK(gds_destroy_qp(NULL) == 0, "destroy_qp(NULL)");
	PASS();
}

/* A failed case may leave its stream blocked on a word nobody will write: give the next case a
 * fresh stream so one failure does not cascade. */
static void fresh_stream_if_blocked(void)
{
	if (cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
		fprintf(stderr, "note: previous case left its stream blocked; using a new stream\n");
		cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
	}
}
#define RUN(call) do { fresh_stream_if_blocked(); call; } while (0)

int main(int argc, char **argv)
{
	int gpu_cases = argc > 1 && strcmp(argv[1], "-g") == 0;
	CUdevice dev;
	CUcontext ctx;
	srand(1234);
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
	    cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		fprintf(stderr, "CUDA setup failed\n");
		return 2;
	}
	/* A malloc'ed page of host words, registered by libgdsync on first use. */
	uint32_t *words = aligned_alloc(4096, 4096);
	memset(words, 0, 4096);

	RUN(test_query_param());
	RUN(test_conditions_block_until_cpu_write(words));
	RUN(test_nor_follows_env(words + 64));
	RUN(test_flags_are_accepted(words + 80));
	RUN(test_large_batch_is_split_in_order());
	RUN(test_bad_descriptors_submit_nothing(words + 96));
	RUN(test_cpu_writer_races_stream_waits(words + 128, GDS_MEMORY_HOST));
	RUN(test_cpu_execution(words + 160));
	RUN(test_dword_wait_info(words + 192));
	RUN(test_mapped_host_memory());
	RUN(test_legacy_21_helpers(words + 224));
	RUN(test_verbs_foreign_objects());
	RUN(test_gpu_memory_stream_only());
	if (gpu_cases)
		RUN(test_mapped_gpu_memory());

	/* Never leave the stream blocked on a word we own. */
	for (int i = 0; i < 1024; i++)
		store32(&words[i], 0xffffffffu);
	drain(2000);
	cuStreamDestroy(stream);
	printf("stream_suite: %d passed, %d failed, %d skipped\n", passes, failures, skips);
	return failures ? 1 : 0;
}
