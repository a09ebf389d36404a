/*
 * ctrl_emu.h: CPU threads that play an NVMe controller over real queue rings in pinned host
 * memory, for testing GPU-side queue code on a machine without an SSD (gpudirect-rs test tool).
 *
 * What it does, per I/O queue pair: polls the SQ tail doorbell (a word in a "BAR" page the GPU
 * writes through a mapped pointer), fetches every new 64-byte entry in order, executes Read,
 * Write and Flush against a namespace, and posts 16-byte completions (dwords 0-2, a release
 * fence, then dword 3 with the phase tag), never into a full CQ (it reads the CQ head doorbell).
 * Options: out-of-order completion (each fetched batch is posted in a shuffled order), status
 * injection (1 in 100 commands by a hash of the tag in CDW15, so the issuer can predict it),
 * stuck commands (tag bit 31: held until emu_release_stuck), and data "DMA" into GPU memory
 * through a copy hook. It checks what a controller can check: CIDs unique among outstanding
 * commands (cid_conflicts), doorbell values in range (bad_doorbells).
 *
 * Bus addresses are virtual addresses of this process (pinned, mapped memory has the same
 * address on the GPU under UVA); addresses inside a registered device range go to dev_copy.
 *
 * Namespace: 2^32 blocks of 512 bytes. Blocks below EMU_W_BASE read as the pattern of
 * tests/vm/nvme/image.py (the 64-bit word at byte offset o is 0xA5 << 56 | o); the
 * emu->w_blocks blocks from EMU_W_BASE are stored (writes land there; initially the pattern).
 * Writes elsewhere fail with LBA Out of Range.
 */
#ifndef CTRL_EMU_H
#define CTRL_EMU_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__CUDACC__)
#define EMU_HD __host__ __device__ static inline
#else
#define EMU_HD static inline
#endif

#define EMU_LBA_SHIFT       9
#define EMU_W_BASE          (1ull << 30)
#define EMU_TAG_STUCK       0x80000000u
#define EMU_MAX_QUEUES      64
#define EMU_BATCH           64

/* The pattern word at byte offset o of an unwritten namespace. */
EMU_HD uint64_t emu_pattern(uint64_t byte_off)
{
    return (0xA5ull << 56) | (byte_off & ~7ull);
}

EMU_HD uint32_t emu_mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* The status field (CQE dword 3 bits 31:17, shifted down by 16, phase bit 0 clear) that
 * injection gives the command carrying `tag`, or 0 for none. 1 in 100 tags, from the spec's
 * table of statuses a drive returns. */
EMU_HD uint32_t emu_injected_status(uint32_t tag)
{
    /* {sct, sc, dnr} */
    const uint8_t table[12][3] = {
        {0, 0x04, 0}, {0, 0x06, 1}, {0, 0x07, 0}, {0, 0x80, 1}, {0, 0x81, 1}, {0, 0x82, 0},
        {1, 0x80, 1}, {2, 0x80, 0}, {2, 0x81, 1}, {2, 0x82, 1}, {2, 0x85, 1}, {2, 0x87, 0},
    };
    uint32_t h, i;
    if (tag == 0 || (tag & EMU_TAG_STUCK)) {
        return 0;
    }
    h = emu_mix(tag);
    if (h % 100u != 7u) {
        return 0;
    }
    i = (h >> 8) % 12u;
    return ((uint32_t) table[i][2] << 15) | ((uint32_t) table[i][0] << 9) | ((uint32_t) table[i][1] << 1);
}

typedef struct emu_cpl {
    uint32_t dw0, dw2, dw3;     /* dw3 without the phase bit */
} emu_cpl_t;

typedef struct emu_queue {
    uint16_t qid;
    uint32_t sq_entries, cq_entries;
    volatile uint32_t* sq;          /* host address of the SQ ring */
    volatile uint32_t* cq;          /* host address of the CQ ring */
    volatile uint32_t* sq_db;       /* host address of the doorbells */
    volatile uint32_t* cq_db;
    /* controller state */
    uint32_t sq_head, cq_tail, cq_phase;
    uint32_t cq_head_seen;          /* last CQ head doorbell value read */
    emu_cpl_t* backlog;             /* completions waiting for CQ room, in order */
    uint32_t n_backlog, backlog_cap;
    emu_cpl_t* held;                /* stuck commands */
    uint32_t n_held, held_cap;
    uint8_t outstanding[65536];
    uint64_t rng;
    /* statistics */
    uint64_t fetched, posted, injected, cid_conflicts, bad_doorbells, cq_full_waits;
    uint64_t busy_ns;               /* time in passes that fetched or posted something */
} emu_queue_t;

typedef struct emu {
    int n_queues;
    emu_queue_t q[EMU_MAX_QUEUES];
    int n_threads;
    pthread_t th[64];
    volatile int stop;
    volatile int release_stuck;
    int out_of_order;
    int inject;
    uint8_t* storage;               /* w_blocks blocks from EMU_W_BASE */
    uint64_t w_blocks;
    /* data into device memory: [dev_base, dev_base + dev_len) goes through dev_copy */
    uint64_t dev_base, dev_len;
    int (*dev_copy)(void* arg, uint64_t dst, const void* src, size_t n);
    void* dev_arg;
    uint64_t dev_errors;
} emu_t;

/* Sets up queue i (host addresses of the rings and doorbells). Rings must be zeroed. */
static inline void emu_queue_init(emu_t* e, int i, uint16_t qid, uint32_t sq_entries, uint32_t cq_entries,
                                  volatile void* sq, volatile void* cq, volatile uint32_t* sq_db,
                                  volatile uint32_t* cq_db)
{
    emu_queue_t* q = &e->q[i];
    free(q->backlog);
    free(q->held);
    memset(q, 0, sizeof(*q));
    q->qid = qid;
    q->sq_entries = sq_entries;
    q->cq_entries = cq_entries;
    q->sq = (volatile uint32_t*) sq;
    q->cq = (volatile uint32_t*) cq;
    q->sq_db = sq_db;
    q->cq_db = cq_db;
    q->cq_phase = 1;
    q->backlog_cap = EMU_BATCH * 2;
    q->backlog = (emu_cpl_t*) calloc(q->backlog_cap, sizeof(emu_cpl_t));
    q->held_cap = 1024;
    q->held = (emu_cpl_t*) calloc(q->held_cap, sizeof(emu_cpl_t));
    q->rng = 0x243F6A8885A308D3ull ^ ((uint64_t) qid << 32);
    if (i >= e->n_queues) {
        e->n_queues = i + 1;
    }
}

static inline void emu_fill(uint64_t slba, uint8_t* dst, size_t len, const emu_t* e)
{
    uint64_t off = slba << EMU_LBA_SHIFT, i;
    if (slba >= EMU_W_BASE && slba - EMU_W_BASE < e->w_blocks) {
        memcpy(dst, e->storage + ((slba - EMU_W_BASE) << EMU_LBA_SHIFT), len);
        return;
    }
    for (i = 0; i + 8 <= len; i += 8) {
        uint64_t w = emu_pattern(off + i);
        memcpy(dst + i, &w, 8);
    }
}

/* Copies n bytes to bus address a (host memory, or device memory through the hook). */
static inline int emu_dma_out(emu_t* e, uint64_t a, const void* src, size_t n)
{
    if (e->dev_copy != NULL && a >= e->dev_base && a - e->dev_base < e->dev_len) {
        return e->dev_copy(e->dev_arg, a, src, n);
    }
    if (a < 4096) {
        return -1;
    }
    memcpy((void*) (uintptr_t) a, src, n);
    return 0;
}

static inline int emu_dma_in(emu_t* e, uint64_t a, void* dst, size_t n)
{
    if (a < 4096 || (e->dev_copy != NULL && a >= e->dev_base && a - e->dev_base < e->dev_len)) {
        return -1; /* writes from device memory are not needed by the tests */
    }
    memcpy(dst, (const void*) (uintptr_t) a, n);
    return 0;
}

/* Walks PRP1/PRP2 (one list page, no chaining) for len bytes at 4 KiB pages; calls fn per
 * segment. Returns the status field for an error, 0 on success. */
static inline uint32_t emu_prp_walk(emu_t* e, uint64_t prp1, uint64_t prp2, size_t len, uint8_t* buf, int out)
{
    const uint64_t ps = 4096;
    size_t first = (size_t) (ps - (prp1 % ps)), done;
    if (prp1 & 3) {
        return (0x13u << 1);
    }
    if (first > len) {
        first = len;
    }
    if ((out ? emu_dma_out(e, prp1, buf, first) : emu_dma_in(e, prp1, buf, first)) != 0) {
        return (0x04u << 1);
    }
    done = first;
    if (done == len) {
        return 0;
    }
    if (len - done <= ps) {
        if ((out ? emu_dma_out(e, prp2, buf + done, len - done) : emu_dma_in(e, prp2, buf + done, len - done)) != 0) {
            return (0x04u << 1);
        }
        return 0;
    }
    {
        const uint64_t* list = (const uint64_t*) (uintptr_t) prp2;
        size_t k = 0;
        if (prp2 < 4096 || (prp2 & 7)) {
            return (0x13u << 1);
        }
        while (done < len) {
            size_t n = len - done < ps ? len - done : ps;
            uint64_t a = list[k++];
            if ((out ? emu_dma_out(e, a, buf + done, n) : emu_dma_in(e, a, buf + done, n)) != 0) {
                return (0x04u << 1);
            }
            done += n;
        }
    }
    return 0;
}

/* Executes one command; returns the status field (without phase). */
static inline uint32_t emu_execute(emu_t* e, emu_queue_t* q, const uint32_t* c, uint32_t* dw0)
{
    uint8_t opc = (uint8_t) c[0];
    uint32_t tag = c[15], inj;
    uint64_t slba = c[10] | ((uint64_t) c[11] << 32);
    uint32_t nlb = (c[12] & 0xFFFFu) + 1u;
    size_t len = (size_t) nlb << EMU_LBA_SHIFT;
    uint8_t stack[128 * 512];

    *dw0 = 0;
    if (e->inject && (inj = emu_injected_status(tag)) != 0) {
        q->injected++;
        return inj;
    }
    if (c[1] != 1) {
        return (1u << 15) | (0x0Bu << 1);
    }
    switch (opc) {
    case 0x00:
        return 0;
    case 0x02: {
        uint64_t prp1 = c[6] | ((uint64_t) c[7] << 32);
        if (len > sizeof(stack)) {
            return (1u << 15) | (0x02u << 1);
        }
        /* One segment in host memory (the common case): generate the data in place. */
        if (prp1 >= 4096 && (prp1 & 7) == 0 && 4096 - (prp1 % 4096) >= len
            && !(e->dev_copy != NULL && prp1 >= e->dev_base && prp1 - e->dev_base < e->dev_len)) {
            emu_fill(slba, (uint8_t*) (uintptr_t) prp1, len, e);
            return 0;
        }
        emu_fill(slba, stack, len, e);
        return emu_prp_walk(e, prp1, c[8] | ((uint64_t) c[9] << 32), len, stack, 1);
    }
    case 0x01: {
        uint32_t st;
        if (len > sizeof(stack)) {
            return (1u << 15) | (0x02u << 1);
        }
        if (slba < EMU_W_BASE || slba - EMU_W_BASE + nlb > e->w_blocks) {
            return (1u << 15) | (0x80u << 1);
        }
        st = emu_prp_walk(e, c[6] | ((uint64_t) c[7] << 32), c[8] | ((uint64_t) c[9] << 32), len, stack, 0);
        if (st == 0) {
            memcpy(e->storage + ((slba - EMU_W_BASE) << EMU_LBA_SHIFT), stack, len);
        }
        return st;
    }
    default:
        return (1u << 15) | (0x01u << 1);
    }
}

static inline int emu_post(emu_queue_t* q, const emu_cpl_t* p)
{
    volatile uint32_t* slot;
    uint32_t next = q->cq_tail + 1 == q->cq_entries ? 0 : q->cq_tail + 1;
    /* Read the head doorbell only when the last value seen says full (a line the host writes:
     * reading it for every entry costs a cache miss each time it changed). */
    if (next == q->cq_head_seen) {
        uint32_t head = *q->cq_db;
        if (head >= q->cq_entries || next == head) {
            q->cq_full_waits++;
            return 0;
        }
        q->cq_head_seen = head;
    }
    slot = q->cq + 4u * q->cq_tail;
    slot[0] = p->dw0;
    slot[1] = 0;
    slot[2] = p->dw2;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    slot[3] = p->dw3 | (q->cq_phase << 16);
    q->outstanding[p->dw3 & 0xFFFFu] = 0;
    q->posted++;
    if (++q->cq_tail == q->cq_entries) {
        q->cq_tail = 0;
        q->cq_phase ^= 1u;
    }
    return 1;
}

static inline int emu_flush_backlog(emu_queue_t* q)
{
    uint32_t i = 0;
    while (i < q->n_backlog && emu_post(q, &q->backlog[i])) {
        i++;
    }
    if (i != 0) {
        memmove(q->backlog, q->backlog + i, (q->n_backlog - i) * sizeof(emu_cpl_t));
        q->n_backlog -= i;
    }
    return i != 0;
}

/* One pass over a queue: backlog, new commands. Returns whether anything happened. */
static inline int emu_step(emu_t* e, emu_queue_t* q)
{
    emu_cpl_t batch[EMU_BATCH];
    uint32_t n = 0, tail, i;
    int busy = 0;

    if (e->release_stuck && q->n_held != 0) {
        for (i = 0; i < q->n_held && q->n_backlog < q->backlog_cap; i++) {
            q->backlog[q->n_backlog++] = q->held[i];
        }
        q->n_held = 0;
    }
    if (q->n_backlog != 0) {
        busy = emu_flush_backlog(q);
        if (q->n_backlog != 0) {
            return busy;
        }
    }
    tail = *q->sq_db;
    if (tail >= q->sq_entries) {
        q->bad_doorbells++;
        return busy;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    while (q->sq_head != tail && n < EMU_BATCH) {
        uint32_t c[16], dw0, st;
        uint16_t cid;
        /* The acquire fence after the doorbell read orders this copy after it. */
        memcpy(c, (const void*) (q->sq + 16u * q->sq_head), sizeof(c));
        if (++q->sq_head == q->sq_entries) {
            q->sq_head = 0;
        }
        q->fetched++;
        cid = (uint16_t) (c[0] >> 16);
        if (q->outstanding[cid]) {
            q->cid_conflicts++;
        }
        q->outstanding[cid] = 1;
        st = emu_execute(e, q, c, &dw0);
        batch[n].dw0 = dw0;
        batch[n].dw2 = q->sq_head | ((uint32_t) q->qid << 16);
        batch[n].dw3 = cid | (st << 16);
        if ((c[15] & EMU_TAG_STUCK) && q->n_held < q->held_cap) {
            q->held[q->n_held++] = batch[n];
            continue;
        }
        n++;
    }
    if (n == 0) {
        return busy;
    }
    if (e->out_of_order && n > 1) {
        for (i = n - 1; i > 0; i--) {
            uint32_t j;
            emu_cpl_t t;
            q->rng ^= q->rng << 13;
            q->rng ^= q->rng >> 7;
            q->rng ^= q->rng << 17;
            j = (uint32_t) (q->rng % (i + 1));
            t = batch[i];
            batch[i] = batch[j];
            batch[j] = t;
        }
    }
    memcpy(q->backlog, batch, n * sizeof(emu_cpl_t));
    q->n_backlog = n;
    emu_flush_backlog(q);
    return 1;
}

struct emu_thread_arg {
    emu_t* e;
    int idx;
};

static void* emu_thread(void* arg)
{
    struct emu_thread_arg* a = (struct emu_thread_arg*) arg;
    emu_t* e = a->e;
    int idx = a->idx, i, busy;
    unsigned idle = 0;
    free(a);
    while (!e->stop) {
        busy = 0;
        for (i = idx; i < e->n_queues; i += e->n_threads) {
            struct timespec t0, t1;
            int b;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            b = emu_step(e, &e->q[i]);
            if (b) {
                clock_gettime(CLOCK_MONOTONIC, &t1);
                e->q[i].busy_ns += (uint64_t) (t1.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t) t1.tv_nsec
                                   - (uint64_t) t0.tv_nsec;
            }
            busy |= b;
        }
        /* Idle for a while: let other threads run (costs nothing when a core is free). */
        if (busy) {
            idle = 0;
        } else if (++idle >= 256) {
            sched_yield();
        }
    }
    return NULL;
}

/* Starts n_threads controller threads; queue i is served by thread i % n_threads. */
static inline int emu_start(emu_t* e, int n_threads)
{
    int i;
    e->stop = 0;
    e->n_threads = n_threads;
    for (i = 0; i < n_threads; i++) {
        struct emu_thread_arg* a = (struct emu_thread_arg*) malloc(sizeof(*a));
        a->e = e;
        a->idx = i;
        if (pthread_create(&e->th[i], NULL, emu_thread, a) != 0) {
            return -1;
        }
    }
    return 0;
}

static inline void emu_stop(emu_t* e)
{
    int i;
    e->stop = 1;
    for (i = 0; i < e->n_threads; i++) {
        pthread_join(e->th[i], NULL);
    }
    e->n_threads = 0;
}

/* Creates the namespace's writable region (initially the pattern). */
static inline int emu_init(emu_t* e, uint64_t w_blocks)
{
    uint64_t i;
    memset(e, 0, sizeof(*e));
    e->w_blocks = w_blocks;
    e->storage = (uint8_t*) malloc(w_blocks << EMU_LBA_SHIFT);
    if (e->storage == NULL) {
        return -1;
    }
    for (i = 0; i < (w_blocks << EMU_LBA_SHIFT); i += 8) {
        uint64_t w = emu_pattern((EMU_W_BASE << EMU_LBA_SHIFT) + i);
        memcpy(e->storage + i, &w, 8);
    }
    return 0;
}

#endif /* CTRL_EMU_H */
