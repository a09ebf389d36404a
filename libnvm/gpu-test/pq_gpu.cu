/*
 * nvm_pq.h on the GPU against CPU threads playing the controller (ctrl_emu.h) over rings in
 * pinned host memory: a correctness run (10 M commands by default, out of order, 1% injected
 * errors each checked at its issuer, every payload verified, every CID completed once), a stuck
 * command that times out, and the benchmark lines of docs/gpu-queue.md with libnvm's
 * one-thread-per-queue helpers (nvm_queue.h) as the baseline in the same run.
 *
 * Usage: pq_gpu [test|bench|benchpq|all] [total commands for the test = 10000000]
 * (benchpq: the nvm_pq lines only, with the libnvm baseline left out)
 * Exit status 0 only if every check passed.
 */
#include <nvm_types.h>
#include <nvm_queue.h>
#include <nvm_cmd.h>
#include <nvm_error.h>
#include <nvm_pq.h>
#include "ctrl_emu.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t err_ = (x);                                                                    \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

static int failures;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define MAXQ 8
#define BAR_BYTES (0x1000 + 8 * (MAXQ + 2))

/* Host-side picture of one queue pair. */
struct hq {
    uint32_t depth;
    void* sq;       /* pinned, mapped */
    void* cq;
    void* ctl;      /* device memory */
};

static emu_t* emu;
static uint32_t* bar;           /* pinned "BAR0" page: doorbells at 0x1000 */
static hq hqs[MAXQ];
static nvm_pq_t* d_pqs;         /* device copies of the handles */
static nvm_pq_t h_pqs[MAXQ];

static void* pinned(size_t n)
{
    void* p = NULL;
    CK(cudaHostAlloc(&p, n, cudaHostAllocMapped));
    memset(p, 0, n);
    return p;
}

static volatile uint32_t* db(uint16_t qid, int cq)
{
    return (volatile uint32_t*) ((unsigned char*) bar + 0x1000 + (2u * qid + (unsigned) cq) * 4u);
}

static void* devptr(void* host)
{
    void* d = NULL;
    CK(cudaHostGetDevicePointer(&d, host, 0));
    return d;
}

/* (Re)creates n queue pairs of the given depths, fresh rings and control blocks, and starts
 * `threads` controller threads. What nvm_pq_host_create does with an admin queue is done here
 * directly on the emulator. */
static void setup(int n, const uint32_t* depths, int threads, int ooo, int inject)
{
    emu_stop(emu);
    emu->out_of_order = ooo;
    emu->inject = inject;
    emu->release_stuck = 0;
    emu->n_queues = 0;
    memset(bar, 0, BAR_BYTES);
    for (int i = 0; i < n; i++) {
        hq* h = &hqs[i];
        uint16_t qid = (uint16_t) (i + 1);
        if (h->sq != NULL && h->depth != depths[i]) {
            CK(cudaFreeHost(h->sq));
            CK(cudaFreeHost(h->cq));
            CK(cudaFree(h->ctl));
            h->sq = NULL;
        }
        if (h->sq == NULL) {
            h->depth = depths[i];
            h->sq = pinned((size_t) h->depth * 64);
            h->cq = pinned((size_t) h->depth * 16);
            CK(cudaMalloc(&h->ctl, nvm_pq_ctl_size(h->depth, h->depth)));
        }
        memset(h->sq, 0, (size_t) h->depth * 64);
        memset(h->cq, 0, (size_t) h->depth * 16);
        CK(cudaMemset(h->ctl, 0, nvm_pq_ctl_size(h->depth, h->depth)));
        emu_queue_init(emu, i, qid, h->depth, h->depth, h->sq, h->cq, db(qid, 0), db(qid, 1));

        nvm_pq_t* q = &h_pqs[i];
        memset(q, 0, sizeof(*q));
        q->version = NVM_PQ_VERSION;
        q->size = sizeof(nvm_pq_t);
        q->qid = qid;
        q->nsid = 1;
        q->sq_entries = q->cq_entries = h->depth;
        q->max_inflight = h->depth - 1;
        q->n_cids = h->depth;
        q->page_size = 4096;
        q->sq = (volatile nvm_cmd_t*) devptr(h->sq);
        q->cq = (volatile nvm_cpl_t*) devptr(h->cq);
        q->sq_db = (volatile uint32_t*) devptr((void*) db(qid, 0));
        q->cq_db = (volatile uint32_t*) devptr((void*) db(qid, 1));
        nvm_pq_ctl_layout(q, h->ctl);
    }
    CK(cudaMemcpy(d_pqs, h_pqs, sizeof(nvm_pq_t) * n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    if (emu_start(emu, threads) != 0) {
        fprintf(stderr, "emu_start failed\n");
        exit(3);
    }
}

static nvm_pq_state_t get_state(int i)
{
    nvm_pq_state_t s;
    CK(cudaMemcpy(&s, hqs[i].ctl, sizeof(s), cudaMemcpyDeviceToHost));
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* Correctness.                                                                             */

struct counters {
    unsigned long long ok_read, ok_write, ok_flush, expected_err, wrong_status, wrong_payload, timeouts, einval;
};

__device__ static void fill_rw(nvm_cmd_t* c, uint8_t opc, uint64_t slba, uint32_t nb, uint64_t prp1, uint32_t tag)
{
    for (int i = 0; i < 16; i++) {
        c->dword[i] = 0;
    }
    c->dword[0] = opc;
    c->dword[1] = 1;
    c->dword[6] = (uint32_t) prp1;
    c->dword[7] = (uint32_t) (prp1 >> 32);
    c->dword[10] = (uint32_t) slba;
    c->dword[11] = (uint32_t) (slba >> 32);
    c->dword[12] = nb - 1;
    c->dword[15] = tag;
}

/* Each thread: `per` commands on the queue of its SM. Reads of 1-4 blocks anywhere in the
 * pattern region, every 8th command a write of its own block (stamp tid, k) followed by a read
 * of it back; the tag (CDW15) makes 1% of commands fail by injection, which the thread predicts
 * and checks. Buffers: 2 KiB of pinned memory per thread. */
__global__ void k_verify(const nvm_pq_t* qs, int nq, uint32_t per, uint64_t* bufs, counters* cnt)
{
    uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
    const nvm_pq_t* q = &qs[nvm_pq_pick((uint32_t) nq, 0)];
    /* 2 KiB; after a timeout the controller may still write the old one, so move on (4 sets). */
    uint32_t set = 0, nthreads = gridDim.x * blockDim.x;
    uint64_t* buf = bufs + (size_t) tid * 256;
    uint64_t own = EMU_W_BASE + tid;
    uint32_t stamp = 0;                         /* 0: own block never written */
    uint32_t rng = emu_mix(tid * 2654435761u + 1);
    nvm_cmd_t cmd;

    for (uint32_t k = 0; k < per; k++) {
        uint32_t tag = (tid * per + k) & 0x7FFFFFFFu;
        uint32_t inj = emu_injected_status(tag ? tag : 1u);
        uint32_t kind = (k % 8 == 6) ? 1u : ((k % 8 == 7) ? 2u : 0u); /* 1 write own, 2 read own */
        uint32_t nb = 1;
        uint64_t slba;
        if (tag == 0) {
            tag = 1;
        }
        rng = emu_mix(rng + k);
        if (kind == 0) {
            nb = 1 + rng % 4u;
            slba = (uint64_t) (rng >> 2) % (EMU_W_BASE - 4);
        } else {
            slba = own;
        }
        if (kind == 1) {
            for (int i = 0; i < 64; i++) {
                buf[i] = ((uint64_t) (tid ^ 0x5A000000u) << 32) | (k << 8) | (uint32_t) i;
            }
        } else {
            for (uint32_t i = 0; i < nb * 64; i++) {
                buf[i] = 0xDEADBEEFDEADBEEFull;
            }
        }
        __threadfence_system();
        fill_rw(&cmd, kind == 1 ? 0x01 : 0x02, slba, nb, (uint64_t) (uintptr_t) buf, tag);
        nvm_pq_status_t r = nvm_pq_submit(q, &cmd, nvm_pq_deadline(10000000000ull), NULL, 0);
        if (r.err == NVM_PQ_ETIME) {
            atomicAdd(&cnt->timeouts, 1ull);
            if (set < 3) {
                set++;
                buf = bufs + ((size_t) set * nthreads + tid) * 256;
            }
            continue;
        }
        if (r.err != 0) {
            atomicAdd(&cnt->einval, 1ull);
            continue;
        }
        uint32_t got = ((uint32_t) r.dnr << 15) | ((uint32_t) r.sct << 9) | ((uint32_t) r.sc << 1);
        if (got != inj) {
            atomicAdd(&cnt->wrong_status, 1ull);
            continue;
        }
        if (inj != 0) {
            atomicAdd(&cnt->expected_err, 1ull);
            /* A failed read must not have written the buffer. */
            if (kind != 1 && ((volatile uint64_t*) buf)[0] != 0xDEADBEEFDEADBEEFull) {
                atomicAdd(&cnt->wrong_payload, 1ull);
            }
            continue;
        }
        if (kind == 1) {
            stamp = k;
            atomicAdd(&cnt->ok_write, 1ull);
            continue;
        }
        bool good = true;
        for (uint32_t i = 0; i < nb * 64; i++) {
            uint64_t want;
            if (kind == 2 && stamp != 0) {
                want = ((uint64_t) (tid ^ 0x5A000000u) << 32) | (stamp << 8) | i;
            } else {
                want = emu_pattern((slba << EMU_LBA_SHIFT) + i * 8);
            }
            if (((volatile uint64_t*) buf)[i] != want) {
                good = false;
            }
        }
        if (good) {
            atomicAdd(&cnt->ok_read, 1ull);
        } else {
            atomicAdd(&cnt->wrong_payload, 1ull);
        }
    }
}

/* 32 threads on queue 0; thread 0's command is stuck in the controller: it must time out at
 * its 5 ms deadline; the others complete. */
__global__ void k_stuck(const nvm_pq_t* qs, uint64_t* bufs, int* errs, unsigned long long* took)
{
    uint32_t tid = threadIdx.x;
    nvm_cmd_t cmd;
    fill_rw(&cmd, 0x02, tid, 1, (uint64_t) (uintptr_t) (bufs + tid * 256), tid == 0 ? EMU_TAG_STUCK | 1u : 3u);
    uint64_t t0 = nvm_pq_now();
    nvm_pq_status_t r = nvm_pq_submit(&qs[0], &cmd, t0 + (tid == 0 ? 5000000ull : 1000000000ull), NULL, 0);
    took[tid] = nvm_pq_now() - t0;
    errs[tid] = r.err != 0 ? r.err : (r.sc | (r.sct << 8));
}

/* One flush on queue 0 (drains whatever completions are pending). */
__global__ void k_flush(const nvm_pq_t* qs, int* err)
{
    nvm_pq_status_t r = nvm_pq_flush(&qs[0], nvm_pq_deadline(1000000000ull));
    *err = r.err != 0 ? r.err : (r.sc | (r.sct << 8));
}

/* ---------------------------------------------------------------------------------------- */
/* Benchmarks.                                                                              */

/* Each thread: `per` 1-block reads (512 B into its own pinned slot), latency samples. */
__global__ void __launch_bounds__(256, 8) k_bench(const nvm_pq_t* qs, int nq, uint32_t per, uint8_t* bufs, uint32_t* lat,
                        unsigned long long* bad)
{
    uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
    const nvm_pq_t* q = &qs[nq == 1 ? 0 : nvm_pq_pick((uint32_t) nq, 0)];
    nvm_cmd_t cmd;
    for (uint32_t k = 0; k < per; k++) {
        fill_rw(&cmd, 0x02, (tid * 7919u + k) % 1000000u, 1, (uint64_t) (uintptr_t) (bufs + (size_t) tid * 512), 0);
        uint64_t t0 = nvm_pq_now();
        nvm_pq_status_t r = nvm_pq_submit(q, &cmd, t0 + 20000000000ull, NULL, 0);
        uint64_t t1 = nvm_pq_now();
        lat[(size_t) tid * per + k] = (uint32_t) (t1 - t0 > 0xFFFFFFFFull ? 0xFFFFFFFFull : t1 - t0);
        if (!nvm_pq_ok(r)) {
            atomicAdd(bad, 1ull);
        }
    }
}

/* libnvm's helpers, one thread per queue (block b drives queue b): keep up to qd commands in
 * flight, one doorbell per refill, consume completions with nvm_cq_dequeue. Latency is per
 * command from its enqueue to its completion being seen. */
__global__ void k_libnvm(nvm_queue_t* sqs, nvm_queue_t* cqs, uint32_t total, uint32_t qd, uint8_t* bufs,
                         uint32_t* lat, unsigned long long* bad)
{
    if (threadIdx.x != 0) {
        return;
    }
    nvm_queue_t sq = sqs[blockIdx.x], cq = cqs[blockIdx.x];
    uint32_t submitted = 0, completed = 0, inflight = 0;
    uint64_t* t_sub = NULL;
    uint8_t* buf = bufs + (size_t) blockIdx.x * 512;
    extern __shared__ uint64_t sh[];
    t_sub = sh; /* qd timestamps, indexed by CID % qd... CID = submitted % 65536 */
    while (completed < total) {
        uint32_t n = 0;
        while (submitted < total && inflight < qd) {
            nvm_cmd_t* c = nvm_sq_enqueue(&sq);
            if (c == NULL) {
                break;
            }
            uint16_t cid = (uint16_t) (submitted % qd);
            nvm_cmd_header(c, cid, NVM_IO_READ, 1);
            nvm_cmd_data_ptr(c, (uint64_t) (uintptr_t) buf, 0);
            nvm_cmd_rw_blks(c, (blockIdx.x * 7919u + submitted) % 1000000u, 1);
            c->dword[15] = 0;
            t_sub[cid] = nvm_pq_now();
            submitted++;
            inflight++;
            n++;
        }
        if (n != 0) {
            nvm_sq_submit(&sq);
        }
        nvm_cpl_t* cpl;
        bool any = false;
        while ((cpl = nvm_cq_dequeue(&cq)) != NULL) {
            uint16_t cid = *NVM_CPL_CID(cpl);
            if (!NVM_ERR_OK(cpl)) {
                atomicAdd(bad, 1ull);
            }
            if (lat != NULL && cid < qd) {
                lat[(size_t) blockIdx.x * total + completed] = (uint32_t) (nvm_pq_now() - t_sub[cid]);
            }
            nvm_sq_update(&sq);
            completed++;
            inflight--;
            any = true;
        }
        if (any) {
            nvm_cq_update(&cq);
        }
    }
}

struct line {
    double rate, p50, p99;
};

/* The controller threads' own cost in the run just finished: nanoseconds of busy passes per
 * command and the busiest queue's share of the run (near 100%: the controller is the ceiling). */
static void ctl_report(int nq, double secs)
{
    uint64_t busy = 0, cmds = 0, top = 0;
    for (int i = 0; i < nq; i++) {
        busy += emu->q[i].busy_ns;
        cmds += emu->q[i].fetched;
        top = emu->q[i].busy_ns > top ? emu->q[i].busy_ns : top;
    }
    printf("      controller: %.0f ns busy per command, busiest queue's thread busy %.0f%% of the run\n",
           cmds ? (double) busy / cmds : 0.0, 100.0 * top / 1e9 / secs);
}

static line stats(std::vector<uint32_t>& lat, double secs, uint64_t cmds)
{
    line l;
    std::sort(lat.begin(), lat.end());
    l.rate = cmds / secs;
    l.p50 = lat[lat.size() / 2] / 1000.0;
    l.p99 = lat[(size_t) (lat.size() * 0.99)] / 1000.0;
    return l;
}

static line bench_pq(const char* name, int nq, uint32_t depth, int ctl_threads, uint32_t threads, uint32_t per,
                     uint8_t* bufs)
{
    uint32_t depths[MAXQ];
    for (int i = 0; i < nq; i++) {
        depths[i] = depth;
    }
    setup(nq, depths, ctl_threads, 0, 0);
    size_t n = (size_t) threads * per;
    uint32_t* d_lat;
    unsigned long long* d_bad;
    CK(cudaMalloc(&d_lat, n * 4));
    CK(cudaMalloc(&d_bad, 8));
    CK(cudaMemset(d_bad, 0, 8));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    uint32_t block = threads < 256 ? threads : 256;
    CK(cudaEventRecord(a));
    k_bench<<<threads / block, block>>>(d_pqs, nq, per, bufs, d_lat, d_bad);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    std::vector<uint32_t> lat(n);
    unsigned long long bad;
    CK(cudaMemcpy(lat.data(), d_lat, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bad, d_bad, 8, cudaMemcpyDeviceToHost));
    line l = stats(lat, ms / 1000.0, n);
    printf("BENCH nvm_pq  %-40s %8.3f Mcmd/s  p50 %8.2f us  p99 %8.2f us  (%zu cmds, %.3f s)\n", name, l.rate / 1e6, l.p50,
           l.p99, n, ms / 1000.0);
    EXPECT(bad == 0, "%s: %llu commands failed", name, bad);
    uint64_t doorbells = 0, cqd = 0;
    for (int i = 0; i < nq; i++) {
        nvm_pq_state_t s = get_state(i);
        doorbells += s.sq_doorbells;
        cqd += s.cq_doorbells;
        EXPECT(s.stray == 0 && s.released == s.ticket, "%s: queue %d stray %llu, %lld credits out", name, i,
               (unsigned long long) s.stray, (long long) (s.ticket - s.released));
    }
    printf("      %.2f commands per SQ doorbell, %.2f per CQ doorbell\n", (double) n / doorbells, (double) n / cqd);
    ctl_report(nq, ms / 1000.0);
    CK(cudaFree(d_lat));
    CK(cudaFree(d_bad));
    return l;
}

static line bench_libnvm(const char* name, int nq, uint32_t depth, int ctl_threads, uint32_t total, uint32_t qd,
                         uint8_t* bufs)
{
    uint32_t depths[MAXQ];
    for (int i = 0; i < nq; i++) {
        depths[i] = depth;
    }
    setup(nq, depths, ctl_threads, 0, 0);
    nvm_queue_t sq[MAXQ], cq[MAXQ];
    for (int i = 0; i < nq; i++) {
        memset(&sq[i], 0, sizeof(sq[i]));
        memset(&cq[i], 0, sizeof(cq[i]));
        sq[i].no = cq[i].no = (uint16_t) (i + 1);
        sq[i].max_entries = cq[i].max_entries = (uint16_t) depth;
        sq[i].entry_size = 64;
        cq[i].entry_size = 16;
        sq[i].phase = cq[i].phase = 1;
        sq[i].vaddr = (volatile void*) h_pqs[i].sq;
        cq[i].vaddr = (volatile void*) h_pqs[i].cq;
        sq[i].db = h_pqs[i].sq_db;
        cq[i].db = h_pqs[i].cq_db;
    }
    nvm_queue_t *d_sq, *d_cq;
    CK(cudaMalloc(&d_sq, sizeof(sq)));
    CK(cudaMalloc(&d_cq, sizeof(cq)));
    CK(cudaMemcpy(d_sq, sq, sizeof(sq), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_cq, cq, sizeof(cq), cudaMemcpyHostToDevice));
    size_t n = (size_t) nq * total;
    uint32_t* d_lat;
    unsigned long long* d_bad;
    CK(cudaMalloc(&d_lat, n * 4));
    CK(cudaMalloc(&d_bad, 8));
    CK(cudaMemset(d_bad, 0, 8));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    k_libnvm<<<nq, 32, qd * sizeof(uint64_t)>>>(d_sq, d_cq, total, qd, bufs, d_lat, d_bad);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    std::vector<uint32_t> lat(n);
    unsigned long long bad;
    CK(cudaMemcpy(lat.data(), d_lat, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&bad, d_bad, 8, cudaMemcpyDeviceToHost));
    line l = stats(lat, ms / 1000.0, n);
    printf("BENCH libnvm  %-40s %8.3f Mcmd/s  p50 %8.2f us  p99 %8.2f us  (%zu cmds, %.3f s)\n", name, l.rate / 1e6, l.p50,
           l.p99, n, ms / 1000.0);
    EXPECT(bad == 0, "%s: %llu commands failed", name, bad);
    ctl_report(nq, ms / 1000.0);
    CK(cudaFree(d_sq));
    CK(cudaFree(d_cq));
    CK(cudaFree(d_lat));
    CK(cudaFree(d_bad));
    return l;
}

int main(int argc, char** argv)
{
    const char* mode = argc > 1 ? argv[1] : "all";
    uint64_t total = argc > 2 ? strtoull(argv[2], NULL, 0) : 10000000ull;
    int do_test = strcmp(mode, "bench") != 0 && strcmp(mode, "benchpq") != 0, do_bench = strcmp(mode, "test") != 0;
    int baseline = strcmp(mode, "benchpq") != 0;
    cudaDeviceProp prop;

    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, CUDA %d.%d runtime\n", prop.name, prop.multiProcessorCount, CUDART_VERSION / 1000,
           (CUDART_VERSION % 1000) / 10);
    emu = (emu_t*) calloc(1, sizeof(emu_t));
    if (emu_init(emu, 1u << 20) != 0) {
        return 3;
    }
    bar = (uint32_t*) pinned(BAR_BYTES);
    CK(cudaMalloc(&d_pqs, sizeof(nvm_pq_t) * MAXQ));

    /* Data buffers: 2 KiB of pinned memory per thread, 270,336 threads at most. */
    const uint32_t max_threads = 270336;
    uint8_t* bufs = (uint8_t*) pinned((size_t) max_threads * 2048);
    uint8_t* d_bufs = (uint8_t*) devptr(bufs);

    if (do_test) {
        /* Odd depths too: the queue is not limited to powers of two. */
        const uint32_t depths[MAXQ] = {1024, 1000, 777, 1024, 513, 1024, 999, 1024};
        const uint32_t threads = 65536;
        uint32_t per = (uint32_t) ((total + threads - 1) / threads);
        counters* d_cnt;
        counters c;
        CK(cudaMalloc(&d_cnt, sizeof(counters)));
        CK(cudaMemset(d_cnt, 0, sizeof(counters)));
        setup(MAXQ, depths, 8, 1, 1);
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a));
        k_verify<<<threads / 256, 256>>>(d_pqs, MAXQ, per, (uint64_t*) d_bufs, d_cnt);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        CK(cudaMemcpy(&c, d_cnt, sizeof(c), cudaMemcpyDeviceToHost));
        uint64_t n = (uint64_t) threads * per, fetched = 0, posted = 0, injected = 0, conflicts = 0, badd = 0;
        uint64_t completions = 0, stray = 0, late = 0, sqd = 0;
        for (int i = 0; i < MAXQ; i++) {
            nvm_pq_state_t s = get_state(i);
            completions += s.completions;
            stray += s.stray;
            late += s.late;
            sqd += s.sq_doorbells;
            EXPECT(s.released == s.ticket && s.ticket == s.published, "queue %d: ticket %llu released %llu published %llu",
                   i, (unsigned long long) s.ticket, (unsigned long long) s.released, (unsigned long long) s.published);
        }
        emu_stop(emu);
        for (int i = 0; i < MAXQ; i++) {
            fetched += emu->q[i].fetched;
            posted += emu->q[i].posted;
            injected += emu->q[i].injected;
            conflicts += emu->q[i].cid_conflicts;
            badd += emu->q[i].bad_doorbells;
        }
        printf("TEST verify: %llu commands by %u threads on 8 queues (depths 1024/1000/777/1024/513/1024/999/1024), "
               "out of order, 8 controller threads, %.2f s (%.2f Mcmd/s)\n",
               (unsigned long long) n, threads, ms / 1000.0, n / (ms / 1000.0) / 1e6);
        printf("  reads ok %llu, writes ok %llu, injected errors seen by their issuer %llu (controller injected %llu, "
               "%.3f%%)\n",
               c.ok_read, c.ok_write, c.expected_err, (unsigned long long) injected, 100.0 * injected / n);
        printf("  wrong payloads %llu, wrong statuses %llu, timeouts %llu, einval %llu\n", c.wrong_payload,
               c.wrong_status, c.timeouts, c.einval);
        printf("  controller: fetched %llu, completed %llu, CID conflicts %llu, bad doorbells %llu; queue: "
               "completions %llu, stray %llu, late %llu, %.2f commands per SQ doorbell\n",
               (unsigned long long) fetched, (unsigned long long) posted, (unsigned long long) conflicts,
               (unsigned long long) badd, (unsigned long long) completions, (unsigned long long) stray,
               (unsigned long long) late, (double) n / sqd);
        EXPECT(c.ok_read + c.ok_write + c.expected_err == n, "results %llu != commands %llu",
               c.ok_read + c.ok_write + c.expected_err, (unsigned long long) n);
        EXPECT(c.wrong_payload == 0 && c.wrong_status == 0 && c.timeouts == 0 && c.einval == 0, "verify errors");
        EXPECT(c.expected_err == injected && injected > n / 200, "injected %llu, seen %llu",
               (unsigned long long) injected, c.expected_err);
        EXPECT(fetched == n && posted == n && completions == n, "fetched/posted/consumed != commands");
        EXPECT(conflicts == 0 && stray == 0 && late == 0 && badd == 0, "conflicts/stray/late/bad doorbells");

        /* A stuck command times out at its deadline; its late completion frees the CID. */
        const uint32_t d1[1] = {64};
        setup(1, d1, 1, 0, 0);
        int* d_errs;
        unsigned long long* d_took;
        int errs[32];
        unsigned long long took[32];
        CK(cudaMalloc(&d_errs, sizeof(errs)));
        CK(cudaMalloc(&d_took, sizeof(took)));
        k_stuck<<<1, 32>>>(d_pqs, (uint64_t*) d_bufs, d_errs, d_took);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(errs, d_errs, sizeof(errs), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(took, d_took, sizeof(took), cudaMemcpyDeviceToHost));
        printf("TEST stuck: thread 0 err %d after %.3f ms (deadline 5 ms); others:", errs[0], took[0] / 1e6);
        int others_ok = 1;
        for (int i = 1; i < 32; i++) {
            others_ok &= errs[i] == 0;
        }
        printf(" %s\n", others_ok ? "all completed" : "FAILED");
        EXPECT(errs[0] == NVM_PQ_ETIME && took[0] >= 5000000ull && took[0] < 7000000ull, "stuck command: err %d, %.3f ms",
               errs[0], took[0] / 1e6);
        EXPECT(others_ok, "the other 31 commands");
        nvm_pq_state_t s = get_state(0);
        EXPECT(s.ticket - s.released == 1, "the stuck command holds its credit (%lld out)", (long long) (s.ticket - s.released));
        emu->release_stuck = 1;
        int ferr = -1;
        int* d_ferr;
        CK(cudaMalloc(&d_ferr, sizeof(int)));
        for (int tries = 0; tries < 100; tries++) {
            k_flush<<<1, 1>>>(d_pqs, d_ferr);
            CK(cudaDeviceSynchronize());
            s = get_state(0);
            if (s.late == 1) {
                break;
            }
        }
        CK(cudaMemcpy(&ferr, d_ferr, sizeof(int), cudaMemcpyDeviceToHost));
        printf("TEST stuck: after release: late %llu, stray %llu, credits out %lld, flush status %d\n",
               (unsigned long long) s.late, (unsigned long long) s.stray, (long long) (s.ticket - s.released), ferr);
        EXPECT(s.late == 1 && s.stray == 0 && s.ticket == s.released && ferr == 0, "late completion of the stuck command");
        CK(cudaFree(d_errs));
        CK(cudaFree(d_took));
        CK(cudaFree(d_ferr));
        CK(cudaFree(d_cnt));
    }

    if (do_bench) {
        int sms = prop.multiProcessorCount;
        uint32_t full = (uint32_t) sms * 2048u;   /* every thread slot of the GPU */
        full = full / 256 * 256;
        line e = bench_pq("QD1: 1 thread, 1 queue", 1, 1024, 1, 1, 20000, d_bufs);
        line h = {0, 0, 0}, f = {0, 0, 0}, g = {0, 0, 0};
        if (baseline) {
            h = bench_libnvm("QD1: 1 thread, 1 queue", 1, 1024, 1, 20000, 1, d_bufs);
            f = bench_libnvm("1 thread/queue, 1 queue x 1024, QD 1023", 1, 1024, 1, 1000000, 1023, d_bufs);
            g = bench_libnvm("1 thread/queue, 8 queues x 1024, QD 1023", 8, 1024, 8, 500000, 1023, d_bufs);
        }
        line b = bench_pq("65,536 threads, 8 queues x 1024, 8 ctl threads", 8, 1024, 8, 65536, 64, d_bufs);
        char nm[80];
        snprintf(nm, sizeof nm, "%u threads, 8 queues x 1024, 8 ctl threads", full);
        line d = bench_pq(nm, 8, 1024, 8, full, 16, d_bufs);
        line a = bench_pq("65,536 threads, 1 queue x 1024, 1 ctl thread", 1, 1024, 1, 65536, 8, d_bufs);
        snprintf(nm, sizeof nm, "%u threads, 1 queue x 1024, 1 ctl thread", full);
        line c = bench_pq(nm, 1, 1024, 1, full, 2, d_bufs);
        printf("SUMMARY one queue, 65,536 threads: %.2f Mcmd/s (goal >= 1.0)\n", a.rate / 1e6);
        printf("SUMMARY 8 queues, 8 controller threads: %.2f Mcmd/s (goal >= 4.0)\n", b.rate / 1e6);
        printf("SUMMARY %u threads on one queue: %.0f%% of the 65,536-thread rate (goal >= 80%%); on 8 queues %.0f%%\n",
               full, 100.0 * c.rate / a.rate, 100.0 * d.rate / b.rate);
        printf("SUMMARY QD1 round trip: p50 %.2f us, p99 %.2f us (goal <= 15 us); libnvm helpers p50 %.2f us\n", e.p50,
               e.p99, h.p50);
        printf("SUMMARY baseline libnvm one thread per queue: 1 queue %.2f Mcmd/s, 8 queues %.2f Mcmd/s\n", f.rate / 1e6,
               g.rate / 1e6);
    }
    emu_stop(emu);
    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
