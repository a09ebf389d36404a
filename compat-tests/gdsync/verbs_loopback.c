/*
 * The verbs half of libgdsync end to end on a real rdma-core device (soft-RoCE rxe in the VM):
 * two RC QPs from gds_create_qp connected over loopback, sends triggered by a CUDA stream
 * (cudasim), stream waits on the send and receive CQs, CPU polling through ibv_poll_cq.
 * Written as a consumer would: installed headers, -lgdsync -libverbs -lcuda.
 *
 * Usage: verbs_loopback [-d dev] [-g gid_index] [-n iters] [-p pingpong_iters] [-m messages]
 *        verbs_loopback -e ERRNO   (only: gds_create_qp must fail with ERRNO; for GDS_PROVIDER checks)
 *        verbs_loopback -f         (only: the proxy-failure case; run with GDS_TEST_PROXY_PANIC_AFTER=1)
 * Exit status: 0 all passed, 1 a failure, 77 no RDMA device (skip).
 */
#define _GNU_SOURCE
#include <gdsync.h>
#include <gdsync/mlx5.h>
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures, passes;
static CUstream stream;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = -1, port = 1;
static enum ibv_mtu mtu;
static union ibv_gid gid;
static int atomics;
static CUcontext cuctx;
/* ctx->ops.poll_cq before any gds QP existed (libgdsync hooks it while QPs live). */
static void *orig_poll_cq;

#define FAIL(...) do { fprintf(stderr, "FAIL %s:%d: ", __func__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures++; return; } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)
#define CU(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) FAIL("%s = %d", #call, r_); } while (0)
#define PASS() do { passes++; printf("ok   %s\n", __func__); fflush(stdout); } while (0)

#define BUF (1u << 20)
#define DEPTH 64

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Waits for the stream to drain, at most ms milliseconds; 0 when it drained. */
static int drain(double ms)
{
	double end = now_s() + ms / 1e3;
	CUresult r;
	while ((r = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
		if (now_s() > end)
			return -1;
		usleep(50);
	}
	return r == CUDA_SUCCESS ? 0 : -2;
}

/* Polls `cq` until `n` completions arrived (at most ms milliseconds); returns how many came. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, double ms)
{
	double end = now_s() + ms / 1e3;
	int got = 0;
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return r;
		got += r;
		if (got < n) {
			if (now_s() > end)
				break;
			usleep(20);
		}
	}
	return got;
}

struct end {
	struct gds_qp *qp;
	uint8_t *buf;
	struct ibv_mr *mr;
};

static int make_end(struct end *e, int sig_all)
{
	gds_qp_init_attr_t attr;
	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = DEPTH;
	attr.cap.max_recv_wr = DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 64;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = sig_all;
	e->qp = gds_create_qp(pd, ctx, &attr, 0, 0);
	if (!e->qp) {
		fprintf(stderr, "gds_create_qp: %s\n", strerror(errno));
		return -1;
	}
	if (attr.send_cq != e->qp->send_cq.cq || attr.recv_cq != e->qp->recv_cq.cq || attr.pd != pd ||
	    !(attr.comp_mask & IBV_EXP_QP_INIT_ATTR_PD) || attr.cap.max_send_wr < DEPTH) {
		fprintf(stderr, "gds_create_qp did not write back the attributes\n");
		return -1;
	}
	if (e->qp->send_cq.curr_offset || e->qp->recv_cq.curr_offset || e->qp->dev_context != ctx)
		return -1;
	e->buf = aligned_alloc(4096, BUF);
	if (!e->buf)
		return -1;
	memset(e->buf, 0, BUF);
	e->mr = ibv_reg_mr(pd, e->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			   (atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0));
	return e->mr ? 0 : -1;
}

static int free_end(struct end *e)
{
	int r = gds_destroy_qp(e->qp);
	if (e->mr)
		ibv_dereg_mr(e->mr);
	free(e->buf);
	return r;
}

static int connect_qp(struct ibv_qp *qp, uint32_t remote_qpn)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE |
			    (atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = port;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	/* ACK timeout 4.096 us * 2^14 = 67 ms, 7 retries: under TCG on a busy host soft-RoCE's
	 * responder can fall further behind than 4 ms * 2 retries, and a multi-packet send then
	 * ended in retry-exceeded, leaving the receiving stream wait (and the shared stream) stuck. */
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int make_pair(struct end *a, struct end *b, int sig_all)
{
	if (make_end(a, sig_all) || make_end(b, sig_all))
		return -1;
	if (connect_qp(a->qp->qp, b->qp->qp->qp_num) || connect_qp(b->qp->qp, a->qp->qp->qp_num)) {
		fprintf(stderr, "ibv_modify_qp: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static int post_recv(struct end *e, uint32_t off, uint32_t len, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)e->buf + off, len, e->mr->lkey };
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.sg_list = &s;
	wr.num_sge = 1;
	return gds_post_recv(e->qp, &wr, &bad);
}

static void send_wr(gds_send_wr *wr, struct ibv_sge *s, struct end *e, uint32_t off, uint32_t len, uint64_t id)
{
	s->addr = (uintptr_t)e->buf + off;
	s->length = len;
	s->lkey = e->mr->lkey;
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = id;
	wr->sg_list = s;
	wr->num_sge = 1;
	wr->exp_opcode = IBV_EXP_WR_SEND;
	wr->exp_send_flags = IBV_EXP_SEND_SIGNALED;
}

static void fill(uint8_t *p, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

/* Stream-ordered send → remote receive → stream waits on both CQs, sizes 0..1 MiB, in two API
 * styles: gds_stream_queue_send + gds_stream_wait_cq, and prepared requests in one
 * gds_stream_post_descriptors call with a WRITE_VALUE32 after them. */
static void test_stream_send_sizes(int iters)
{
	static const uint32_t sizes[] = { 0, 1, 60, 4096, 65536, 1u << 20 };
	struct end a, b;
	uint32_t *marker = calloc(1, 4096);
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint32_t len = sizes[s];
		int n = len >= 65536 ? (iters > 4 ? 4 : iters) : iters;
		for (int i = 0; i < n; i++) {
			struct ibv_sge sge;
			gds_send_wr wr, *bad = NULL;
			struct ibv_wc wc[2];
			uint32_t seed = s * 1000 + i;
			fill(a.buf, len, seed);
			memset(b.buf, 0xee, len ? len : 1);
			CHECK(post_recv(&b, 0, BUF, 500 + i) == 0, "post_recv");
			send_wr(&wr, &sge, &a, 0, len, 100 + i);
			if (i & 1) {
				gds_send_request_t sreq;
				gds_wait_request_t w1, w2;
				gds_descriptor_t d[4];
				CHECK(gds_prepare_send(a.qp, &wr, &bad, &sreq) == 0, "prepare_send");
				CHECK(gds_prepare_wait_cq(&a.qp->send_cq, &w1, 0) == 0, "prepare_wait_cq send");
				CHECK(gds_prepare_wait_cq(&b.qp->recv_cq, &w2, 0) == 0, "prepare_wait_cq recv");
				memset(d, 0, sizeof(d));
				d[0].tag = GDS_TAG_SEND; d[0].send = &sreq;
				d[1].tag = GDS_TAG_WAIT; d[1].wait = &w1;
				d[2].tag = GDS_TAG_WAIT; d[2].wait = &w2;
				d[3].tag = GDS_TAG_WRITE_VALUE32;
				CHECK(gds_prepare_write_value32(&d[3].write32, marker, seed + 1, GDS_MEMORY_HOST) == 0, "write32");
				CHECK(gds_stream_post_descriptors(stream, 4, d, 0) == 0, "post_descriptors");
			} else {
				CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send");
				CHECK(gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "wait send cq");
				CHECK(gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == 0, "wait recv cq");
			}
			CHECK(drain(20000) == 0, "stream did not drain (size %u, iteration %d)", len, i);
			if (i & 1)
				CHECK(*(volatile uint32_t *)marker == seed + 1, "stream write after the waits missing");
			CHECK(poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "no send completion");
			CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 100u + i && wc[0].opcode == IBV_WC_SEND,
			      "send wc status %d wr_id %llu", wc[0].status, (unsigned long long)wc[0].wr_id);
			CHECK(poll_n(b.qp->recv_cq.cq, wc, 1, 5000) == 1, "no receive completion");
			CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == len && wc[0].wr_id == 500u + i,
			      "recv wc status %d len %u", wc[0].status, wc[0].byte_len);
			CHECK(len == 0 || memcmp(a.buf, b.buf, len) == 0, "payload of %u bytes differs", len);
		}
		printf("     size %7u: %d messages\n", len, n);
	}
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	free(marker);
	PASS();
}

/* Upstream's CPU interplay: ibv_poll_cq does not return a CQE whose stream wait has not run;
 * gds_post_wait_cq releases it. Also gds_post_send (CPU-rung) and inline data copied at prepare. */
static void test_poll_blocked_until_wait(void)
{
	struct end a, b;
	struct ibv_sge sge;
	gds_send_wr wr, *bad = NULL;
	gds_wait_request_t w;
	struct ibv_wc wc[2];
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	CHECK(post_recv(&b, 0, 4096, 1) == 0, "post_recv");
	CHECK(gds_prepare_wait_cq(&a.qp->send_cq, &w, 0) == 0, "prepare_wait_cq");
	CHECK(w.peek.entries == 2 && w.peek.offset == 0 && a.qp->send_cq.curr_offset == 1, "peek fields");
	memcpy(a.buf, "inline!!", 8);
	send_wr(&wr, &sge, &a, 0, 8, 7);
	wr.exp_send_flags |= IBV_EXP_SEND_INLINE;
	CHECK(gds_post_send(a.qp, &wr, &bad) == 0, "gds_post_send");
	memcpy(a.buf, "changed!", 8); /* inline: the payload was copied by the call */
	CHECK(poll_n(b.qp->recv_cq.cq, wc, 1, 5000) == 1 && wc[0].status == IBV_WC_SUCCESS, "receive");
	CHECK(memcmp(b.buf, "inline!!", 8) == 0, "inline payload");
	usleep(100 * 1000);
	CHECK(ibv_poll_cq(a.qp->send_cq.cq, 1, wc) == 0, "send CQE returned before its wait ran");
	CHECK(gds_post_wait_cq(&a.qp->send_cq, &w, 0) == 0, "post_wait_cq");
	CHECK(poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1 && wc[0].wr_id == 7, "send CQE after release");
	CHECK(gds_post_wait_cq(&a.qp->send_cq, &w, 1) == EINVAL, "flags");
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	PASS();
}

/* Many messages in flight: DEPTH/2 sends and their waits per batch with the _all calls, the CPU
 * recycling receives and completions between batches. CPU-executed WAITs too
 * (gds_post_descriptors spinning on the completion word). */
static void test_many_batched(int total)
{
	enum { B = DEPTH / 2 };
	struct end a, b;
	gds_send_request_t *sreq = calloc(B, sizeof(*sreq));
	gds_wait_request_t *wreq = calloc(2 * B, sizeof(*wreq));
	struct ibv_wc wc[DEPTH];
	int done = 0;
	CHECK(sreq && wreq, "calloc");
	CHECK(make_pair(&a, &b, 1) == 0, "QP pair");
	while (done < total) {
		int n = total - done < B ? total - done : B;
		for (int i = 0; i < n; i++)
			CHECK(post_recv(&b, (uint32_t)i * 64, 64, done + i) == 0, "post_recv");
		for (int i = 0; i < n; i++) {
			struct ibv_sge sge;
			gds_send_wr wr, *bad = NULL;
			uint32_t v = done + i;
			memcpy(a.buf + i * 64, &v, 4);
			send_wr(&wr, &sge, &a, i * 64, 64, done + i);
			wr.exp_send_flags = 0; /* sq_sig_all */
			CHECK(gds_prepare_send(a.qp, &wr, &bad, &sreq[i]) == 0, "prepare_send %d", done + i);
			CHECK(gds_prepare_wait_cq(&a.qp->send_cq, &wreq[i], 0) == 0, "wait send");
			CHECK(gds_prepare_wait_cq(&b.qp->recv_cq, &wreq[B + i], 0) == 0, "wait recv");
		}
		if ((done / B) % 3 == 2) {
			/* CPU path: SEND and WAIT descriptors executed by gds_post_descriptors. */
			for (int i = 0; i < n; i++) {
				gds_descriptor_t d[3];
				d[0].tag = GDS_TAG_SEND; d[0].send = &sreq[i];
				d[1].tag = GDS_TAG_WAIT; d[1].wait = &wreq[i];
				d[2].tag = GDS_TAG_WAIT; d[2].wait = &wreq[B + i];
				CHECK(gds_post_descriptors(3, d, 0) == 0, "gds_post_descriptors");
			}
		} else {
			CHECK(gds_stream_post_send_all(stream, n, sreq) == 0, "post_send_all");
			CHECK(gds_stream_post_wait_cq_all(stream, n, wreq) == 0, "wait_cq_all send");
			CHECK(gds_stream_post_wait_cq_all(stream, n, wreq + B) == 0, "wait_cq_all recv");
			CHECK(drain(60000) == 0, "stream did not drain at message %d", done);
		}
		CHECK(poll_n(a.qp->send_cq.cq, wc, n, 10000) == n, "send completions");
		for (int i = 0; i < n; i++)
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(done + i), "send wc %d", i);
		CHECK(poll_n(b.qp->recv_cq.cq, wc, n, 10000) == n, "recv completions");
		for (int i = 0; i < n; i++) {
			uint32_t v;
			memcpy(&v, b.buf + i * 64, 4);
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(done + i) && v == (uint32_t)(done + i),
			      "recv %d", done + i);
		}
		done += n;
	}
	printf("     %d messages\n", total);
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	free(sreq);
	free(wreq);
	PASS();
}

/* One-sided operations through the stream: RDMA write (+ immediate), RDMA read, fetch-and-add. */
static void test_rdma_ops(void)
{
	struct end a, b;
	struct ibv_sge sge;
	gds_send_wr wr, *bad = NULL;
	struct ibv_wc wc[2];
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	fill(a.buf, 4096, 5);
	send_wr(&wr, &sge, &a, 0, 4096, 1);
	wr.exp_opcode = IBV_EXP_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 8192;
	wr.wr.rdma.rkey = b.mr->rkey;
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0 && gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "write");
	CHECK(drain(30000) == 0 && poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "write completion");
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RDMA_WRITE, "write status %d", wc[0].status);
	CHECK(memcmp(a.buf, b.buf + 8192, 4096) == 0, "RDMA write payload");
	CHECK(post_recv(&b, 0, 64, 77) == 0, "post_recv");
	send_wr(&wr, &sge, &a, 0, 16, 2);
	wr.exp_opcode = IBV_EXP_WR_RDMA_WRITE_WITH_IMM;
	wr.ex.imm_data = htonl(0xabcd1234);
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 16384;
	wr.wr.rdma.rkey = b.mr->rkey;
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0 && gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == 0, "write imm");
	CHECK(drain(30000) == 0 && poll_n(b.qp->recv_cq.cq, wc, 1, 5000) == 1, "imm completion");
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(wc[0].imm_data) == 0xabcd1234 &&
	      (wc[0].wc_flags & IBV_WC_WITH_IMM), "imm wc: status %d opcode %d", wc[0].status, wc[0].opcode);
	CHECK(poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "write-imm send completion");
	fill(b.buf + 32768, 1000, 9);
	send_wr(&wr, &sge, &a, 65536, 1000, 3);
	wr.exp_opcode = IBV_EXP_WR_RDMA_READ;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 32768;
	wr.wr.rdma.rkey = b.mr->rkey;
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0 && gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "read");
	CHECK(drain(30000) == 0 && poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "read completion");
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RDMA_READ, "read status %d", wc[0].status);
	CHECK(memcmp(a.buf + 65536, b.buf + 32768, 1000) == 0, "RDMA read payload");
	if (atomics) {
		uint64_t *remote = (uint64_t *)(b.buf + 49152), old;
		*remote = 1000;
		send_wr(&wr, &sge, &a, 70000 & ~7u, 8, 4);
		wr.exp_opcode = IBV_EXP_WR_ATOMIC_FETCH_AND_ADD;
		wr.wr.atomic.remote_addr = (uintptr_t)remote;
		wr.wr.atomic.compare_add = 5;
		wr.wr.atomic.rkey = b.mr->rkey;
		CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0 && gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "faa");
		CHECK(drain(30000) == 0 && poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "faa completion");
		memcpy(&old, a.buf + (70000 & ~7u), 8);
		CHECK(wc[0].status == IBV_WC_SUCCESS && old == 1000 && *(volatile uint64_t *)remote == 1005,
		      "fetch-and-add: status %d old %llu new %llu", wc[0].status, (unsigned long long)old,
		      (unsigned long long)*remote);
	} else {
		printf("     (device has no atomics: fetch-and-add not run)\n");
	}
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	PASS();
}

/* Completion errors: an RDMA write with a wrong rkey completes with IBV_WC_REM_ACCESS_ERR as
 * reported by the device; the stream wait on it does not hang; later sends are flushed. */
static void test_completion_errors(void)
{
	struct end a, b;
	struct ibv_sge sge;
	gds_send_wr wr, *bad = NULL;
	struct ibv_wc wc[4];
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	send_wr(&wr, &sge, &a, 0, 64, 41);
	wr.exp_opcode = IBV_EXP_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey ^ 0x5a5a00;
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send");
	CHECK(gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "wait send cq");
	CHECK(drain(60000) == 0, "stream wait hung on an error completion");
	CHECK(poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "no completion");
	CHECK(wc[0].status == IBV_WC_REM_ACCESS_ERR && wc[0].wr_id == 41, "status %d (%s), expected remote access error",
	      wc[0].status, ibv_wc_status_str(wc[0].status));
	send_wr(&wr, &sge, &a, 0, 64, 42);
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send after error");
	CHECK(gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0, "wait send cq");
	CHECK(drain(60000) == 0, "stream hung after the QP went to error");
	CHECK(poll_n(a.qp->send_cq.cq, wc, 1, 5000) == 1, "no completion for the send after the error");
	CHECK(wc[0].wr_id == 42 && wc[0].status != IBV_WC_SUCCESS, "send on an errored QP: status %d", wc[0].status);
	printf("     rkey error: %s; next send: %s\n", ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), ibv_wc_status_str(wc[0].status));
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	PASS();
}

/* Argument errors as upstream reports them, SQ full, far-ahead peeks. */
static void test_bad_requests(void)
{
	struct end a, b;
	struct ibv_sge sge[2];
	gds_send_wr wr, *bad = NULL;
	gds_send_request_t req;
	gds_wait_request_t w;
	int i, r = 0;
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	send_wr(&wr, sge, &a, 0, 8, 1);
	sge[1] = sge[0];
	wr.num_sge = 100000; /* above any device's max_send_sge: refused before the list is read */
	CHECK(gds_prepare_send(a.qp, &wr, &bad, &req) == EINVAL && bad == &wr, "too many SGEs");
	wr.num_sge = 1;
	wr.exp_opcode = IBV_EXP_WR_CQE_WAIT;
	CHECK(gds_prepare_send(a.qp, &wr, &bad, &req) == EINVAL, "CQE_WAIT unsupported");
	wr.exp_opcode = IBV_EXP_WR_SEND;
	CHECK(gds_prepare_send(a.qp, NULL, &bad, &req) == 0 && req.commit.entries == 0, "empty list");
	for (i = 0; i < 4 * DEPTH && (r = gds_prepare_send(a.qp, &wr, &bad, &req)) == 0; i++)
		;
	CHECK(r == ENOMEM && i >= DEPTH, "SQ full after %d sends: %d", i, r);
	for (i = 0; i < 4 * DEPTH && (r = gds_prepare_wait_cq(&b.qp->recv_cq, &w, 0)) == 0; i++)
		;
	CHECK(r == E2BIG && i >= DEPTH, "peek %d far ahead: %d", i, r);
	/* Teardown with prepared, never-triggered sends and unreleased waits. */
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	CHECK(gds_destroy_qp(a.qp) == EINVAL, "double destroy");
	PASS();
}

/* Destroy QPs while sends are in flight and receives posted, then check a new pair works. */
static void test_teardown_outstanding(void)
{
	struct end a, b;
	struct ibv_wc wc[2];
	for (int round = 0; round < 3; round++) {
		CHECK(make_pair(&a, &b, 1) == 0, "QP pair");
		for (int i = 0; i < DEPTH / 2; i++) {
			struct ibv_sge sge;
			gds_send_wr wr, *bad = NULL;
			CHECK(post_recv(&b, 0, 4096, i) == 0, "post_recv");
			send_wr(&wr, &sge, &a, 0, 4096, i);
			CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send");
		}
		CHECK(drain(60000) == 0, "drain");
		CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy with work outstanding");
	}
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair after teardown");
	{
		struct ibv_sge sge;
		gds_send_wr wr, *bad = NULL;
		CHECK(post_recv(&b, 0, 64, 9) == 0, "post_recv");
		send_wr(&wr, &sge, &a, 0, 64, 9);
		CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send");
		CHECK(gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == 0, "wait");
		CHECK(drain(60000) == 0, "drain");
		CHECK(poll_n(b.qp->recv_cq.cq, wc, 1, 5000) == 1 && wc[0].status == IBV_WC_SUCCESS, "recv on new pair");
	}
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	PASS();
}

/* The poll_cq hook: present while gds QPs live on the context, the original back after the last
 * one is destroyed; an application CQ on the same context polls normally meanwhile. */
static void test_hook_restored(void)
{
	struct end a, b;
	struct ibv_wc wc[2];
	struct ibv_cq *mine = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(mine, "ibv_create_cq");
	CHECK((void *)ctx->ops.poll_cq == orig_poll_cq, "hook left behind by the earlier tests");
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	CHECK((void *)ctx->ops.poll_cq != orig_poll_cq, "hook not installed");
	CHECK(ibv_poll_cq(mine, 2, wc) == 0, "application CQ through the hook");
	CHECK(gds_destroy_qp(a.qp) == 0, "destroy a");
	CHECK((void *)ctx->ops.poll_cq != orig_poll_cq, "restored while b still lives");
	a.qp = NULL;
	CHECK(gds_destroy_qp(b.qp) == 0, "destroy b");
	CHECK((void *)ctx->ops.poll_cq == orig_poll_cq, "original poll_cq not restored after the last QP");
	CHECK(ibv_poll_cq(mine, 2, wc) == 0, "application CQ after the restore");
	ibv_dereg_mr(a.mr);
	ibv_dereg_mr(b.mr);
	free(a.buf);
	free(b.buf);
	ibv_destroy_cq(mine);
	PASS();
}

/* fork(): the child cannot use the library (the proxy thread is gone; locks other threads held
 * are held for ever there): every call fails at once with EIO, nothing deadlocks, even while
 * another parent thread is inside the library at the moment of the fork. The parent carries on. */
static volatile int hammer_stop;
static void *hammer(void *p)
{
	uint32_t *w = p;
	gds_descriptor_t d;
	while (!hammer_stop) {
		d.tag = GDS_TAG_WRITE_VALUE32;
		gds_prepare_write_value32(&d.write32, w, 1, GDS_MEMORY_HOST);
		gds_post_descriptors(1, &d, 0);
	}
	return NULL;
}

static void test_fork(void)
{
	struct end a, b;
	struct ibv_sge sge;
	gds_send_wr wr, *bad = NULL;
	struct ibv_wc wc[2];
	pthread_t t;
	uint32_t *word = calloc(1, 4096);
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	CHECK(pthread_create(&t, NULL, hammer, word) == 0, "thread");
	for (int round = 0; round < 20; round++) {
		pid_t pid = fork();
		CHECK(pid >= 0, "fork");
		if (pid == 0) {
			gds_descriptor_t d;
			gds_send_request_t sreq;
			gds_qp_init_attr_t attr;
			int bad_calls = 0;
			alarm(20);
			d.tag = GDS_TAG_WRITE_VALUE32;
			bad_calls += gds_prepare_write_value32(&d.write32, word, 2, GDS_MEMORY_HOST) != EIO;
			bad_calls += gds_post_descriptors(1, &d, 0) != EIO;
			bad_calls += gds_stream_post_descriptors(stream, 1, &d, 0) != EIO;
			send_wr(&wr, &sge, &a, 0, 8, 1);
			bad_calls += gds_prepare_send(a.qp, &wr, &bad, &sreq) != EIO;
			bad_calls += gds_stream_queue_send(stream, a.qp, &wr, &bad) != EIO;
			memset(&attr, 0, sizeof(attr));
			errno = 0;
			bad_calls += gds_create_qp(pd, ctx, &attr, 0, 0) != NULL || errno != EIO;
			_exit(bad_calls ? 3 : 0);
		}
		int st = 0;
		double end = now_s() + 30;
		pid_t r;
		while ((r = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < end)
			usleep(1000);
		if (r == 0) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			hammer_stop = 1;
			pthread_join(t, NULL);
			FAIL("forked child hung (round %d)", round);
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			hammer_stop = 1;
			pthread_join(t, NULL);
			FAIL("forked child: status %#x (round %d; 3: a call did not fail with EIO, signal 14: hang)", st, round);
		}
	}
	hammer_stop = 1;
	pthread_join(t, NULL);
	/* The parent is unaffected. */
	CHECK(post_recv(&b, 0, 64, 4) == 0, "post_recv");
	send_wr(&wr, &sge, &a, 0, 64, 4);
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "queue_send in the parent");
	CHECK(gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == 0, "wait in the parent");
	CHECK(drain(60000) == 0, "drain in the parent");
	CHECK(poll_n(b.qp->recv_cq.cq, wc, 1, 5000) == 1 && wc[0].status == IBV_WC_SUCCESS, "recv in the parent");
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	free(word);
	PASS();
}

/* Run alone with GDS_TEST_PROXY_PANIC_AFTER=1: the proxy thread panics right after posting the
 * first send. The stream waits prepared on both CQs must be released (no hang), ibv_poll_cq on
 * those CQs reports an error, later calls on the QPs fail with EIO, and destroy still works. */
static void test_proxy_failure(void)
{
	struct end a, b;
	struct ibv_sge sge;
	gds_send_wr wr, *bad = NULL;
	struct ibv_wc wc[2];
	gds_send_request_t sreq;
	gds_wait_request_t w[3];
	gds_descriptor_t d[4];
	CHECK(make_pair(&a, &b, 0) == 0, "QP pair");
	CHECK(post_recv(&b, 0, 64, 1) == 0, "post_recv");
	send_wr(&wr, &sge, &a, 0, 64, 1);
	/* Everything is prepared before the stream can trigger the send (and the panic). */
	CHECK(gds_prepare_send(a.qp, &wr, &bad, &sreq) == 0, "prepare_send");
	CHECK(gds_prepare_wait_cq(&a.qp->send_cq, &w[0], 0) == 0, "wait send cq");
	CHECK(gds_prepare_wait_cq(&b.qp->recv_cq, &w[1], 0) == 0, "wait recv cq");
	/* A second wait on a CQE that can never come (nothing more is sent). */
	CHECK(gds_prepare_wait_cq(&b.qp->recv_cq, &w[2], 0) == 0, "wait recv cq (never completed)");
	memset(d, 0, sizeof(d));
	d[0].tag = GDS_TAG_SEND; d[0].send = &sreq;
	for (int i = 0; i < 3; i++) { d[1 + i].tag = GDS_TAG_WAIT; d[1 + i].wait = &w[i]; }
	CHECK(gds_stream_post_descriptors(stream, 4, d, 0) == 0, "post send + waits");
	CHECK(drain(30000) == 0, "stream waits not released after the proxy failed: hang");
	CHECK(ibv_poll_cq(a.qp->send_cq.cq, 2, wc) < 0, "ibv_poll_cq on a proxy CQ after the failure must report an error");
	CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == EIO, "queue_send after the failure");
	CHECK(gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == EIO, "wait_cq after the failure");
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy after the failure");
	CHECK((void *)ctx->ops.poll_cq == orig_poll_cq, "original poll_cq restored");
	PASS();
}

/* Several application threads, each with its own QP pair and stream, at the same time (one proxy
 * thread serves them all; the poll hook and the registries are shared). */
struct thr { int msgs; int ok; };

static void *thread_body(void *p)
{
	struct thr *t = p;
	struct end a, b;
	CUstream s;
	struct ibv_wc wc[4];
	if (cuCtxSetCurrent(cuctx) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || make_pair(&a, &b, 1))
		return NULL;
	for (int i = 0; i < t->msgs; i++) {
		struct ibv_sge sge;
		gds_send_wr wr, *bad = NULL;
		uint32_t v = i * 3 + 1, got;
		memcpy(a.buf, &v, 4);
		if (post_recv(&b, 0, 64, i) || (send_wr(&wr, &sge, &a, 0, 64, i), gds_stream_queue_send(s, a.qp, &wr, &bad)) ||
		    gds_stream_wait_cq(s, &a.qp->send_cq, 0) || gds_stream_wait_cq(s, &b.qp->recv_cq, 0) || cuStreamSynchronize(s))
			return NULL;
		if (poll_n(a.qp->send_cq.cq, wc, 1, 5000) != 1 || poll_n(b.qp->recv_cq.cq, wc + 1, 1, 5000) != 1 ||
		    wc[1].status != IBV_WC_SUCCESS)
			return NULL;
		memcpy(&got, b.buf, 4);
		if (got != v)
			return NULL;
	}
	t->ok = free_end(&a) == 0 && free_end(&b) == 0 && cuStreamDestroy(s) == 0;
	return NULL;
}

static void test_threads(int msgs)
{
	enum { N = 3 };
	pthread_t th[N];
	struct thr t[N];
	for (int i = 0; i < N; i++) {
		t[i].msgs = msgs;
		t[i].ok = 0;
		CHECK(pthread_create(&th[i], NULL, thread_body, &t[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < N; i++)
		CHECK(t[i].ok, "thread %d failed", i);
	printf("     %d threads x %d messages\n", N, msgs);
	PASS();
}

/* Ping-pong in the style of gds_kernel_loopback_latency: per iteration the stream sends A→B,
 * waits for A's send CQ and B's receive CQ, then B→A likewise. Work is queued in batches; the CPU
 * reposts receives and drains the CQs after each batch. Timing under emulation is not judged. */
static void test_pingpong(int iters)
{
	enum { BATCH = 16 };
	struct end a, b;
	struct ibv_wc wc[DEPTH];
	double t0;
	CHECK(make_pair(&a, &b, 1) == 0, "QP pair");
	t0 = now_s();
	for (int done = 0; done < iters;) {
		int n = iters - done < BATCH ? iters - done : BATCH;
		for (int i = 0; i < n; i++) {
			CHECK(post_recv(&b, 0, 64, i) == 0 && post_recv(&a, 0, 64, i) == 0, "post_recv");
		}
		for (int i = 0; i < n; i++) {
			struct ibv_sge sge;
			gds_send_wr wr, *bad = NULL;
			send_wr(&wr, &sge, &a, 64, 8, i);
			CHECK(gds_stream_queue_send(stream, a.qp, &wr, &bad) == 0, "ping");
			CHECK(gds_stream_wait_cq(stream, &a.qp->send_cq, 0) == 0 && gds_stream_wait_cq(stream, &b.qp->recv_cq, 0) == 0, "w");
			send_wr(&wr, &sge, &b, 64, 8, i);
			CHECK(gds_stream_queue_send(stream, b.qp, &wr, &bad) == 0, "pong");
			CHECK(gds_stream_wait_cq(stream, &b.qp->send_cq, 0) == 0 && gds_stream_wait_cq(stream, &a.qp->recv_cq, 0) == 0, "w");
		}
		CHECK(drain(120000) == 0, "stream stuck at iteration %d", done);
		CHECK(poll_n(a.qp->send_cq.cq, wc, n, 5000) == n && poll_n(b.qp->recv_cq.cq, wc, n, 5000) == n, "ping CQEs");
		CHECK(poll_n(b.qp->send_cq.cq, wc, n, 5000) == n && poll_n(a.qp->recv_cq.cq, wc, n, 5000) == n, "pong CQEs");
		done += n;
	}
	{
		double dt = now_s() - t0;
		printf("     pingpong: %d iterations in %.3f s = %.1f iterations/s (%.1f usec/iter)\n", iters, dt, iters / dt,
		       dt * 1e6 / iters);
	}
	CHECK(free_end(&a) == 0 && free_end(&b) == 0, "destroy");
	PASS();
}

/* gds_kernel_loopback_latency's shape: one UD QP sending to itself (receive buffers have room for
 * the 40-byte GRH), each unit = stream send + wait on the send CQ + wait on the receive CQ, the
 * CPU reposting receives and draining CQs per batch. Reports iterations per second. */
static void test_ud_loopback(int iters)
{
	enum { BATCH = 16, SIZE = 64 };
	struct end e;
	struct ibv_qp_attr qa;
	struct ibv_ah_attr aa;
	struct ibv_ah *ah;
	struct ibv_wc wc[BATCH];
	gds_qp_init_attr_t attr;
	double t0;
	memset(&e, 0, sizeof(e));
	memset(&attr, 0, sizeof(attr));
	attr.cap.max_send_wr = attr.cap.max_recv_wr = DEPTH;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_UD;
	attr.sq_sig_all = 1;
	CHECK((e.qp = gds_create_qp(pd, ctx, &attr, 0, 0)) != NULL, "gds_create_qp UD: %s", strerror(errno));
	e.buf = aligned_alloc(4096, BUF);
	CHECK(e.buf && (e.mr = ibv_reg_mr(pd, e.buf, BUF, IBV_ACCESS_LOCAL_WRITE)), "buffer");
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = port;
	qa.qkey = 0x11111111;
	CHECK(ibv_modify_qp(e.qp->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	qa.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(e.qp->qp, &qa, IBV_QP_STATE) == 0, "RTR");
	qa.qp_state = IBV_QPS_RTS;
	qa.sq_psn = 0;
	CHECK(ibv_modify_qp(e.qp->qp, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.sgid_index = gid_index;
	aa.grh.hop_limit = 1;
	aa.port_num = port;
	CHECK((ah = ibv_create_ah(pd, &aa)) != NULL, "ibv_create_ah");
	t0 = now_s();
	for (int done = 0; done < iters;) {
		int n = iters - done < BATCH ? iters - done : BATCH;
		for (int i = 0; i < n; i++)
			CHECK(post_recv(&e, 4096 + i * 128, SIZE + 40, done + i) == 0, "post_recv");
		for (int i = 0; i < n; i++) {
			struct ibv_sge sge;
			gds_send_wr wr, *bad = NULL;
			uint32_t v = done + i;
			memcpy(e.buf + i * 64, &v, 4);
			send_wr(&wr, &sge, &e, i * 64, SIZE, done + i);
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = e.qp->qp->qp_num;
			wr.wr.ud.remote_qkey = 0x11111111;
			CHECK(gds_stream_queue_send(stream, e.qp, &wr, &bad) == 0, "queue_send");
			CHECK(gds_stream_wait_cq(stream, &e.qp->send_cq, 0) == 0, "wait send");
			CHECK(gds_stream_wait_cq(stream, &e.qp->recv_cq, 0) == 0, "wait recv");
		}
		CHECK(drain(120000) == 0, "stream stuck at %d", done);
		CHECK(poll_n(e.qp->send_cq.cq, wc, n, 5000) == n, "send CQEs");
		CHECK(poll_n(e.qp->recv_cq.cq, wc, n, 5000) == n, "recv CQEs");
		for (int i = 0; i < n; i++) {
			uint32_t v;
			memcpy(&v, e.buf + 4096 + i * 128 + 40, 4);
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].byte_len == SIZE + 40 && v == (uint32_t)(done + i),
			      "UD receive %d: status %d len %u value %u", done + i, wc[i].status, wc[i].byte_len, v);
		}
		done += n;
	}
	{
		double dt = now_s() - t0;
		printf("     UD loopback: %d iterations in %.3f s = %.1f iterations/s (%.1f usec/iter)\n", iters, dt, iters / dt,
		       dt * 1e6 / iters);
	}
	ibv_destroy_ah(ah);
	CHECK(free_end(&e) == 0, "destroy");
	PASS();
}

static int find_gid(void)
{
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, port, &pa))
		return -1;
	mtu = pa.active_mtu;
	if (gid_index < 0) {
		/* The IPv4-mapped GID of 127.0.0.1 (RoCE v2 over lo), else the first non-zero one. */
		for (int i = 0; i < pa.gid_tbl_len && i < 16; i++) {
			union ibv_gid g;
			if (ibv_query_gid(ctx, port, i, &g))
				continue;
			if (g.raw[10] == 0xff && g.raw[11] == 0xff && g.raw[12] == 127) {
				gid_index = i;
				break;
			}
			if (gid_index < 0 && (g.global.subnet_prefix || g.global.interface_id))
				gid_index = i;
		}
	}
	if (gid_index < 0 || ibv_query_gid(ctx, port, gid_index, &gid))
		return -1;
	char s[64];
	inet_ntop(AF_INET6, gid.raw, s, sizeof(s));
	printf("device %s port %d gid[%d] %s mtu %d\n", ibv_get_device_name(ctx->device), port, gid_index, s, 128 << mtu);
	return 0;
}

int main(int argc, char **argv)
{
	const char *devname = getenv("USE_HCA");
	int iters = 20, pp = 200, many = 1000, opt, ndev = 0, expect_errno = 0, proxy_failure = 0;
	CUdevice dev;
	struct ibv_device **list;
	while ((opt = getopt(argc, argv, "d:g:n:p:m:e:f")) != -1) {
		switch (opt) {
		case 'd': devname = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'n': iters = atoi(optarg); break;
		case 'p': pp = atoi(optarg); break;
		case 'm': many = atoi(optarg); break;
		case 'e': expect_errno = atoi(optarg); break;
		case 'f': proxy_failure = 1; break;
		default: fprintf(stderr, "usage: %s [-d dev] [-g gid] [-n iters] [-p pingpong] [-m many]\n", argv[0]); return 2;
		}
	}
	list = ibv_get_device_list(&ndev);
	if (!list || ndev == 0) {
		printf("skip: no RDMA device\n");
		return 77;
	}
	for (int i = 0; i < ndev && !ctx; i++)
		if (!devname || !strcmp(devname, ibv_get_device_name(list[i])))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (ctx) {
		struct ibv_device_attr da;
		atomics = !ibv_query_device(ctx, &da) && da.atomic_cap != IBV_ATOMIC_NONE;
	}
	if (!ctx || !(pd = ibv_alloc_pd(ctx)) || find_gid()) {
		fprintf(stderr, "cannot open the RDMA device / port / GID\n");
		return 1;
	}
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&cuctx, dev) || cuCtxSetCurrent(cuctx) ||
	    cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) {
		fprintf(stderr, "CUDA setup failed\n");
		return 1;
	}
	orig_poll_cq = (void *)ctx->ops.poll_cq;
	if (proxy_failure) {
		test_proxy_failure();
		printf("verbs_loopback -f: %d passed, %d failed\n", passes, failures);
		return failures ? 1 : 0;
	}
	if (expect_errno) {
		/* Provider selection (GDS_PROVIDER): gds_create_qp must fail with this errno. */
		gds_qp_init_attr_t attr;
		struct gds_qp *qp;
		memset(&attr, 0, sizeof(attr));
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		attr.qp_type = IBV_QPT_RC;
		errno = 0;
		qp = gds_create_qp(pd, ctx, &attr, 0, 0);
		printf("gds_create_qp with GDS_PROVIDER=%s: %s (%s)\n", getenv("GDS_PROVIDER") ? getenv("GDS_PROVIDER") : "",
		       qp ? "created" : "NULL", strerror(errno));
		return !qp && errno == expect_errno ? 0 : 1;
	}
	test_poll_blocked_until_wait();
	test_stream_send_sizes(iters);
	test_many_batched(many);
	test_rdma_ops();
	test_bad_requests();
	test_completion_errors();
	test_teardown_outstanding();
	test_threads(many / 5);
	test_pingpong(pp);
	test_ud_loopback(pp);
	test_hook_restored();
	test_fork();
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("verbs_loopback: %d passed, %d failed\n", passes, failures);
	return failures ? 1 : 0;
}
