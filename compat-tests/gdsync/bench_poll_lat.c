/*
 * CPU <-> GPU ping-pong latency through stream waits/writes, in the style of upstream's
 * gds_poll_lat: each iteration enqueues "wait until flag >= i, then write ack = i" on a stream,
 * the CPU checks the stream is blocked, writes flag = i and spins until it sees ack == i.
 *
 * The same ping-pong is measured in the same run three ways, interleaved in blocks so drift hits
 * all alike:
 *   gds   one gds_stream_post_descriptors() call with a WAIT_VALUE32 and a WRITE_VALUE32 descriptor
 *   raw   cuStreamWaitValue32() + cuStreamWriteValue32() (flags as libgdsync emits them on CUDA >= 11.7:
 *         the v2 entry points take no NO_MEMORY_BARRIER)
 *   batch one cuStreamBatchMemOp() with the same two operations
 * Reported per mode: median, p10 and p90 of the enqueue cost and of the round trip (CPU write to
 * CPU seeing the GPU's write), and gds/raw ratios of the medians. Then the gds/batch enqueue
 * ratio paired by block: each gds block's median over the batch block of the same round, the
 * median of those ratios with its 95% confidence interval. A machine whose speed changes in the
 * middle of a run moves both blocks of a round alike, so this ratio stays put where the ratio of
 * the two whole-run medians does not.
 *
 * With -w, each timed enqueue is preceded by the same mode's call on a second stream (waiting
 * for a value that is already there, writing a scratch word): the timed call then finds the
 * library's and the driver's code and data in the caches, which separates the cost of the
 * instructions from that of the cache misses after the previous iteration's driver work.
 *
 * Usage: bench_poll_lat [-n iterations per mode] [-b block] [-s spin_us before the CPU write]
 *                       [-t round-trip timeout in ms, default 100] [-w]
 */
#define _GNU_SOURCE
#include <gdsync.h>
#include <gdsync/tools.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { GDS, RAW, BATCH, NMODES };
static const char *mode_name[NMODES] = { "gds", "raw", "batch" };

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
	qsort(v, n, sizeof(*v), cmp);
	return v[(int)(p * (n - 1) + 0.5)];
}

/* The gds/batch enqueue ratio paired by round (block k of each mode was measured in round k):
 * median over rounds and its 95% interval from order statistics (ranks n/2 -+ 0.98 sqrt(n)).
 * Must run before the whole-run percentiles: it sorts each block in place, which they, sorting
 * the whole array, do not mind, but it needs the blocks in measurement order. 0 rounds: too few
 * samples. */
struct paired { int rounds; double median, lo, hi; };

static struct paired paired_ratio(double **post, const int *cnt, int block)
{
	struct paired p = { 0, 0, 0, 0 };
	int rounds = cnt[GDS] / block < cnt[BATCH] / block ? cnt[GDS] / block : cnt[BATCH] / block;
	if (rounds < 1) return p;
	double *r = calloc(rounds, sizeof(*r));
	for (int k = 0; k < rounds; k++)
		r[k] = pct(post[GDS] + k * block, block, 0.5) / pct(post[BATCH] + k * block, block, 0.5);
	qsort(r, rounds, sizeof(*r), cmp);
	double half = 0.98 * sqrt((double)rounds);
	int lo = (int)floor(rounds / 2.0 - half), hi = (int)ceil(rounds / 2.0 + half);
	if (lo < 0) lo = 0;
	if (hi > rounds - 1) hi = rounds - 1;
	p.rounds = rounds;
	p.median = rounds % 2 ? r[rounds / 2] : (r[rounds / 2 - 1] + r[rounds / 2]) / 2;
	p.lo = r[lo];
	p.hi = r[hi];
	free(r);
	return p;
}

#define CK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "%s failed: %d\n", #call, r_); exit(2); } } while (0)

/* One enqueue of mode m on stream s: wait until *flag >= want, then write ack = val (dflag and
 * dack are the device addresses of flag and ack). 0 on success. */
static int enqueue(int m, CUstream s, uint32_t *flag, uint32_t *ack, CUdeviceptr dflag, CUdeviceptr dack,
		   uint32_t want, uint32_t val)
{
	if (m == GDS) {
		gds_descriptor_t d[2];
		d[0].tag = GDS_TAG_WAIT_VALUE32;
		gds_prepare_wait_value32(&d[0].wait32, flag, want, GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST);
		d[1].tag = GDS_TAG_WRITE_VALUE32;
		gds_prepare_write_value32(&d[1].write32, ack, val, GDS_MEMORY_HOST);
		return gds_stream_post_descriptors(s, 2, d, 0);
	}
	if (m == RAW) {
		CK(cuStreamWaitValue32(s, dflag, want, CU_STREAM_WAIT_VALUE_GEQ));
		CK(cuStreamWriteValue32(s, dack, val, CU_STREAM_WRITE_VALUE_DEFAULT));
		return 0;
	}
	CUstreamBatchMemOpParams p[2];
	memset(p, 0, sizeof(p));
	p[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
	p[0].waitValue.address = dflag;
	p[0].waitValue.value = want;
	p[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
	p[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
	p[1].writeValue.address = dack;
	p[1].writeValue.value = val;
	p[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
	CK(cuStreamBatchMemOp(s, 2, p, 0));
	return 0;
}

int main(int argc, char **argv)
{
	int n = 2000, block = 100, spin_us = 10, timeout_ms = 100, warm = 0, opt;
	while ((opt = getopt(argc, argv, "n:b:s:t:w")) != -1) {
		if (opt == 'n') n = atoi(optarg);
		else if (opt == 'b') block = atoi(optarg);
		else if (opt == 's') spin_us = atoi(optarg);
		else if (opt == 't') timeout_ms = atoi(optarg);
		else if (opt == 'w') warm = 1;
		else { fprintf(stderr, "usage: %s [-n iters] [-b block] [-s spin_us] [-t timeout_ms] [-w]\n", argv[0]); return 2; }
	}
	if (n < 10 || block < 1) return 2;
	CUdevice dev;
	CUcontext ctx;
	CUstream s, s2;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	char name[128] = "?";
	cuDeviceGetName(name, sizeof(name), dev);
	int drv = 0;
	cuDriverGetVersion(&drv);

	gds_mem_desc_t mem;
	memset(&mem, 0, sizeof(mem));
	if (gds_alloc_mapped_memory(&mem, 4096, GDS_MEMORY_HOST)) { fprintf(stderr, "gds_alloc_mapped_memory failed\n"); return 2; }
	volatile uint32_t *flag = (uint32_t *)mem.h_ptr, *ack = flag + 16;
	CUdeviceptr dflag = mem.d_ptr, dack = mem.d_ptr + 64, dscratch = mem.d_ptr + 128;
	uint32_t *scratch = (uint32_t *)mem.h_ptr + 32;
	*flag = 0;
	*ack = 0;

	double *post[NMODES], *rtt[NMODES];
	int cnt[NMODES] = { 0 }, not_blocked = 0, timeouts = 0;
	for (int m = 0; m < NMODES; m++) {
		post[m] = calloc(n, sizeof(double));
		rtt[m] = calloc(n, sizeof(double));
	}
	uint32_t seq = 0;
	for (int done = 0; done < n; done += block) {
		for (int m = 0; m < NMODES; m++) {
			for (int k = 0; k < block && done + k < n; k++) {
				uint32_t i = ++seq;
				/* Warm-up: the same call on the other stream, its wait already satisfied. */
				if (warm && enqueue(m, s2, (uint32_t *)flag, scratch, dflag, dscratch, 0, i)) {
					fprintf(stderr, "warm-up post failed\n");
					return 1;
				}
				double t0 = now_us();
				if (enqueue(m, s, (uint32_t *)flag, (uint32_t *)ack, dflag, dack, i, i)) {
					fprintf(stderr, "gds post failed\n");
					return 1;
				}
				double t1 = now_us();
				while (now_us() - t1 < spin_us) {}
				if (cuStreamQuery(s) == CUDA_SUCCESS) not_blocked++;
				double t2 = now_us();
				__atomic_store_n(flag, i, __ATOMIC_RELEASE);
				while (__atomic_load_n(ack, __ATOMIC_ACQUIRE) != i) {
					if (now_us() - t2 > timeout_ms * 1000.0) { timeouts++; break; }
				}
				double t3 = now_us();
				post[m][cnt[m]] = t1 - t0;
				rtt[m][cnt[m]] = t3 - t2;
				cnt[m]++;
			}
		}
	}
	CK(cuStreamSynchronize(s));
	CK(cuStreamSynchronize(s2));
	printf("device: %s, driver %d, %d iterations per mode, blocks of %d, %d us before each CPU write%s\n",
	       name, drv, n, block, spin_us, warm ? ", warmed (-w)" : "");
	printf("%-6s %28s %28s\n", "mode", "enqueue us (median p10 p90)", "round trip us (median p10 p90)");
	double med_post[NMODES], med_rtt[NMODES];
	struct paired pr = paired_ratio(post, cnt, block);
	for (int m = 0; m < NMODES; m++) {
		double p10 = pct(post[m], cnt[m], 0.1), p90 = pct(post[m], cnt[m], 0.9);
		med_post[m] = pct(post[m], cnt[m], 0.5);
		double r10 = pct(rtt[m], cnt[m], 0.1), r90 = pct(rtt[m], cnt[m], 0.9);
		med_rtt[m] = pct(rtt[m], cnt[m], 0.5);
		printf("%-6s %10.2f %8.2f %8.2f %12.2f %8.2f %8.2f\n", mode_name[m], med_post[m], p10, p90, med_rtt[m], r10, r90);
	}
	printf("ratio gds/raw: enqueue %.2f, round trip %.2f; gds/batch: enqueue %.2f, round trip %.2f\n",
	       med_post[GDS] / med_post[RAW], med_rtt[GDS] / med_rtt[RAW], med_post[GDS] / med_post[BATCH],
	       med_rtt[GDS] / med_rtt[BATCH]);
	if (pr.rounds)
		printf("paired gds/batch enqueue (block medians, %d rounds): %.3f (95%% CI %.3f..%.3f)\n", pr.rounds,
		       pr.median, pr.lo, pr.hi);
	printf("stream already drained before the CPU write: %d times; round-trip timeouts (%d ms): %d\n", not_blocked, timeout_ms, timeouts);
	gds_free_mapped_memory(&mem);
	return timeouts ? 1 : 0;
}
