/*
 * pq_sum: read a range of blocks into GPU memory from many GPU threads through shared NVMe
 * queues (nvm_pq.h), sum them on the GPU, and check the sum against the CPU path (the same
 * header built for the host, CPU threads reading the same blocks into host memory).
 *
 * The controller here is the CPU-played one of libnvm/gpu-test/ctrl_emu.h (this machine has
 * no NVMe device): it "DMAs" into GPU memory with cudaMemcpy, where an SSD would write over
 * PCIe peer-to-peer. With a real controller the only changes are the setup steps marked REAL:
 * queue memory and data buffers mapped for the controller with nvm_dma_map_device, doorbells
 * in BAR0 registered with cudaHostRegister(..., cudaHostRegisterIoMemory | Mapped), and
 * nvm_pq_host_create issuing the Create I/O CQ/SQ commands through the admin queue.
 *
 * Usage: pq_sum [start_lba=0] [blocks=262144] [gpu_threads=8192] [queues=4]
 */
#include <nvm_types.h>
#include <nvm_pq.h>
#include "../gpu-test/ctrl_emu.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t err_ = (x);                                                                    \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

#define CHUNK_BLOCKS 8u /* 4 KiB per command: one PRP page */
#define MAXQ 16

static cudaStream_t copy_stream;

/* Pinned staging buffers, one per controller thread, allocated before any kernel runs
 * (allocating pinned memory while a kernel spins can wait for that kernel). */
#define STAGE_BYTES (128u * 512u)
static unsigned char* stage[16];
static int stage_next;

/* The emulated controller's DMA into GPU memory: stage into pinned memory, then an
 * asynchronous copy on a non-blocking stream (the reading kernel keeps running meanwhile). */
static int dev_copy(void* arg, uint64_t dst, const void* src, size_t n)
{
    static __thread int mine = -1;
    cudaStream_t st = (cudaStream_t) arg;
    if (mine < 0) {
        mine = __atomic_fetch_add(&stage_next, 1, __ATOMIC_RELAXED);
    }
    if (mine >= 16 || n > STAGE_BYTES) {
        return -1;
    }
    memcpy(stage[mine], src, n);
    if (cudaMemcpyAsync((void*) (uintptr_t) dst, stage[mine], n, cudaMemcpyHostToDevice, st) != cudaSuccess
        || cudaStreamSynchronize(st) != cudaSuccess) {
        return -1;
    }
    return 0;
}

__global__ void k_read(const nvm_pq_t* qs, int nq, uint64_t start, uint64_t blocks, unsigned char* dbuf,
                       unsigned long long* failed)
{
    uint64_t tid = blockIdx.x * (uint64_t) blockDim.x + threadIdx.x, nthreads = (uint64_t) gridDim.x * blockDim.x;
    const nvm_pq_t* q = &qs[nvm_pq_pick((uint32_t) nq, 0)];
    uint64_t chunks = (blocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
    for (uint64_t c = tid; c < chunks; c += nthreads) {
        uint64_t lba = start + c * CHUNK_BLOCKS;
        uint32_t nb = (uint32_t) (blocks - c * CHUNK_BLOCKS < CHUNK_BLOCKS ? blocks - c * CHUNK_BLOCKS : CHUNK_BLOCKS);
        uint64_t page = (uint64_t) (uintptr_t) (dbuf + c * CHUNK_BLOCKS * 512);
        nvm_pq_status_t r = nvm_pq_read(q, lba, (uint16_t) nb, &page, 1, nvm_pq_deadline(5000000000ull));
        if (!nvm_pq_ok(r)) {
            if (atomicAdd(failed, 1ull) < 4) {
                printf("read of lba %llu failed: err %d sct %u sc 0x%x\n", (unsigned long long) lba, r.err, r.sct, r.sc);
            }
        }
    }
}

__global__ void k_sum(const uint64_t* w, uint64_t n, unsigned long long* sum)
{
    uint64_t s = 0;
    for (uint64_t i = blockIdx.x * (uint64_t) blockDim.x + threadIdx.x; i < n; i += (uint64_t) gridDim.x * blockDim.x) {
        s += w[i];
    }
    atomicAdd(sum, (unsigned long long) s);
}

/* CPU path: host threads on a host-side queue. */
struct cpu_arg {
    const nvm_pq_t* q;
    uint64_t start, blocks;
    unsigned idx, n;
    uint64_t sum, failed;
};

static void* cpu_read(void* p)
{
    cpu_arg* a = (cpu_arg*) p;
    unsigned char* buf = (unsigned char*) aligned_alloc(4096, 4096);
    uint64_t chunks = (a->blocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
    for (uint64_t c = a->idx; c < chunks; c += a->n) {
        uint32_t nb = (uint32_t) (a->blocks - c * CHUNK_BLOCKS < CHUNK_BLOCKS ? a->blocks - c * CHUNK_BLOCKS : CHUNK_BLOCKS);
        uint64_t page = (uint64_t) (uintptr_t) buf;
        nvm_pq_status_t r = nvm_pq_read(a->q, a->start + c * CHUNK_BLOCKS, (uint16_t) nb, &page, 1,
                                        nvm_pq_deadline(5000000000ull));
        if (!nvm_pq_ok(r)) {
            a->failed++;
            continue;
        }
        for (uint32_t i = 0; i < nb * 512; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8);
            a->sum += w;
        }
    }
    free(buf);
    return NULL;
}

/* Queue memory: rings pinned (REAL: GPU memory or pinned host memory mapped with nvm_dma_*),
 * control block on the GPU (gpu = 1) or in host memory. */
static void make_queue(emu_t* e, int idx, uint16_t qid, uint32_t depth, uint32_t* bar, int gpu, nvm_pq_t* q)
{
    void *sq, *cq, *ctl, *dsq, *dcq, *dbar;
    size_t ctl_len = nvm_pq_ctl_size(depth, depth);
    CK(cudaHostAlloc(&sq, depth * 64u, cudaHostAllocMapped));
    CK(cudaHostAlloc(&cq, depth * 16u, cudaHostAllocMapped));
    memset(sq, 0, depth * 64u);
    memset(cq, 0, depth * 16u);
    volatile uint32_t* sdb = bar + 0x1000 / 4 + 2 * qid;
    volatile uint32_t* cdb = sdb + 1;
    emu_queue_init(e, idx, qid, depth, depth, sq, cq, sdb, cdb);
    if (gpu) {
        CK(cudaMalloc(&ctl, ctl_len));
        CK(cudaMemset(ctl, 0, ctl_len));
        CK(cudaHostGetDevicePointer(&dsq, sq, 0));
        CK(cudaHostGetDevicePointer(&dcq, cq, 0));
        CK(cudaHostGetDevicePointer(&dbar, bar, 0)); /* REAL: cudaHostRegister(BAR0, IoMemory) */
    } else {
        ctl = aligned_alloc(128, ctl_len);
        memset(ctl, 0, ctl_len);
        dsq = sq;
        dcq = cq;
        dbar = bar;
    }
    memset(q, 0, sizeof(*q));
    q->version = NVM_PQ_VERSION;
    q->size = sizeof(nvm_pq_t);
    q->qid = qid;
    q->nsid = 1;
    q->sq_entries = q->cq_entries = q->n_cids = depth;
    q->max_inflight = depth - 1;
    q->page_size = 4096;
    q->sq = (volatile nvm_cmd_t*) dsq;
    q->cq = (volatile nvm_cpl_t*) dcq;
    q->sq_db = (volatile uint32_t*) dbar + 0x1000 / 4 + 2 * qid;
    q->cq_db = q->sq_db + 1;
    nvm_pq_ctl_layout(q, ctl);
}

int main(int argc, char** argv)
{
    uint64_t start = argc > 1 ? strtoull(argv[1], NULL, 0) : 0;
    uint64_t blocks = argc > 2 ? strtoull(argv[2], NULL, 0) : 262144;
    unsigned threads = argc > 3 ? (unsigned) atoi(argv[3]) : 8192;
    int nq = argc > 4 ? atoi(argv[4]) : 4;
    if (blocks == 0 || threads == 0 || nq < 1 || nq > MAXQ || start + blocks > EMU_W_BASE) {
        fprintf(stderr, "usage: pq_sum [start_lba] [blocks] [gpu_threads] [queues 1..%d]\n", MAXQ);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Lazy module loading can make a launch wait for a running kernel while holding the
     * context, which would block the controller threads' copies: load everything up front. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);

    emu_t* e = (emu_t*) calloc(1, sizeof(emu_t));
    if (e == NULL || emu_init(e, 64) != 0) {
        return 3;
    }
    uint32_t* bar;
    CK(cudaHostAlloc((void**) &bar, 0x2000, cudaHostAllocMapped));
    memset(bar, 0, 0x2000);
    CK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
    for (int i = 0; i < 16; i++) {
        CK(cudaHostAlloc((void**) &stage[i], STAGE_BYTES, cudaHostAllocDefault));
    }

    /* GPU destination buffer (REAL: nvm_dma_map_device gives its bus addresses). */
    unsigned char* dbuf;
    size_t bytes = (size_t) blocks * 512;
    CK(cudaMalloc(&dbuf, bytes));
    CK(cudaMemset(dbuf, 0xEE, bytes));
    e->dev_base = (uint64_t) (uintptr_t) dbuf;
    e->dev_len = bytes;
    e->dev_copy = dev_copy;
    e->dev_arg = (void*) copy_stream;

    nvm_pq_t hq[MAXQ + 1];
    for (int i = 0; i < nq; i++) {
        make_queue(e, i, (uint16_t) (i + 1), 1024, bar, 1, &hq[i]);
    }
    make_queue(e, nq, (uint16_t) (nq + 1), 256, bar, 0, &hq[nq]); /* the CPU path's queue */
    nvm_pq_t* dq;
    CK(cudaMalloc(&dq, sizeof(nvm_pq_t) * nq));
    CK(cudaMemcpy(dq, hq, sizeof(nvm_pq_t) * nq, cudaMemcpyHostToDevice));
    emu_start(e, nq + 1 < 8 ? nq + 1 : 8);

    /* GPU path. */
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long *d_failed, *d_sum, failed = 0, gsum = 0;
    CK(cudaMalloc(&d_failed, 8));
    CK(cudaMalloc(&d_sum, 8));
    CK(cudaMemsetAsync(d_failed, 0, 8, s));
    CK(cudaMemsetAsync(d_sum, 0, 8, s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    k_read<<<(threads + 255) / 256, 256, 0, s>>>(dq, nq, start, blocks, dbuf, d_failed);
    CK(cudaEventRecord(b, s));
    CK(cudaStreamSynchronize(s));
    k_sum<<<264, 256, 0, s>>>((const uint64_t*) dbuf, bytes / 8, d_sum);
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaMemcpy(&failed, d_failed, 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&gsum, d_sum, 8, cudaMemcpyDeviceToHost));
    printf("GPU: %llu blocks from lba %llu read by %u threads over %d queues in %.2f ms (%.2f MB/s), %llu failed, "
           "sum 0x%016llx\n",
           (unsigned long long) blocks, (unsigned long long) start, threads, nq, ms, bytes / (ms / 1000.0) / 1e6,
           failed, gsum);

    /* CPU path: 4 host threads, the same header built for the host. */
    cpu_arg args[4];
    pthread_t th[4];
    uint64_t csum = 0, cfailed = 0;
    for (unsigned i = 0; i < 4; i++) {
        args[i] = cpu_arg{&hq[nq], start, blocks, i, 4, 0, 0};
        pthread_create(&th[i], NULL, cpu_read, &args[i]);
    }
    for (unsigned i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        csum += args[i].sum;
        cfailed += args[i].failed;
    }
    /* And what the pattern says, without any I/O. */
    uint64_t psum = 0;
    for (uint64_t o = start * 512; o < (start + blocks) * 512; o += 8) {
        psum += emu_pattern(o);
    }
    printf("CPU: sum 0x%016llx (%llu failed); pattern: 0x%016llx\n", (unsigned long long) csum,
           (unsigned long long) cfailed, (unsigned long long) psum);
    emu_stop(e);
    if (failed || cfailed || gsum != csum || csum != psum) {
        printf("FAIL: GPU and CPU sums differ or reads failed\n");
        return 1;
    }
    printf("PASS: GPU sum equals the CPU path's\n");
    return 0;
}
