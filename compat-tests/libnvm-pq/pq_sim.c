/*
 * nvm_pq.h on CPU threads against nvmesim (an in-process software NVMe controller whose bus
 * addresses are virtual addresses): many threads share 4 queue pairs of odd depths, verified
 * reads mixed with writes to disjoint blocks, out-of-order completion, injected error statuses
 * that must reach exactly their issuer, a stalled controller that makes every waiter time out
 * within its deadline, a lost doorbell recovered by nvm_pq_host_reset, and every CID completing
 * exactly once (queue statistics against the controller's command count).
 *
 * Usage: pq_sim [threads=64] [ops per thread=500]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_rpc.h>
#include <nvm_pq.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>

/* nvmesim's C API (sim/nvmesim/src/capi.rs, capi_pq.rs). */
#ifdef __cplusplus
extern "C" {
#endif
void* nvmesim_start(uint64_t n_blocks);
volatile void* nvmesim_bar(void* sim);
size_t nvmesim_bar_size(void);
uint8_t nvmesim_pattern_byte(uint64_t offset);
int nvmesim_read_storage(void* sim, uint64_t offset, void* out, size_t len);
void nvmesim_inject(void* sim, int admin, int opcode, int sct, int sc, int dnr, unsigned count);
void nvmesim_stop(void* sim);
void nvmesim_set_stalled(void* sim, int stalled);
void nvmesim_set_out_of_order(void* sim, int ooo);
uint64_t nvmesim_io_commands(void* sim);
#ifdef __cplusplus
}
#endif

#define PS          4096u
#define BS          512u
#define N_BLOCKS    65536u          /* 32 MiB namespace */
#define RO_BLOCKS   32768u          /* reads of the pattern come from here */
#define W_BASE      32768u          /* each thread owns W_PER blocks from W_BASE + tid*W_PER */
#define W_PER       64u
#define N_Q         4
#define BUF_PAGES   6u              /* up to 16 KiB + an offset: 5 pages, a PRP list */
#define MAX_THREADS 256

static int failures;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char* fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&fail_lock);
    if (failures++ < 20) {
        fputs("FAIL: ", stdout);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        fputc('\n', stdout);
        fflush(stdout);
    }
    pthread_mutex_unlock(&fail_lock);
}

#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static void* page_alloc(size_t bytes)
{
    void* p = NULL;
    if (posix_memalign(&p, PS, (bytes + PS - 1) / PS * PS) != 0) {
        perror("posix_memalign");
        exit(2);
    }
    memset(p, 0, (bytes + PS - 1) / PS * PS);
    return p;
}

static uint64_t io(const void* p)
{
    return (uint64_t) (uintptr_t) p;
}

/* The error table a thread gets injected (spec Part B §B8), one entry per thread. */
static const struct { uint8_t sct, sc, dnr; } err_table[] = {
    {0, 0x04, 0}, {0, 0x06, 1}, {0, 0x07, 0}, {0, 0x08, 1}, {0, 0x0b, 1}, {0, 0x80, 1},
    {0, 0x81, 1}, {0, 0x82, 0}, {0, 0x83, 1}, {1, 0x80, 1}, {1, 0x82, 1}, {2, 0x80, 0},
    {2, 0x81, 1}, {2, 0x82, 1}, {2, 0x85, 1}, {2, 0x86, 1}, {2, 0x87, 0}, {0, 0x15, 1},
};
#define N_ERR (sizeof(err_table) / sizeof(err_table[0]))
#define ERR_EVERY 50u               /* one error command per 50 operations */

struct ctx {
    void* sim;
    nvm_aq_ref ref;
    const nvm_ctrl_t* ctrl;
    nvm_pq_t q[N_Q];
    nvm_pq_mem_t mem[N_Q];
    unsigned threads, ops;
};

struct worker {
    struct ctx* c;
    unsigned tid;
    pthread_t th;
    unsigned char* buf;             /* BUF_PAGES pages */
    unsigned char* shadow;          /* what this thread last wrote to its blocks */
    uint64_t rng;
    /* counts */
    uint64_t reads, writes, flushes, errs, timeouts;
};

static uint64_t rnd(struct worker* w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static uint32_t make_pages(unsigned char* buf, uint32_t off, uint32_t len, uint64_t* pages)
{
    uint32_t n = (off % PS + len + PS - 1) / PS, i;
    pages[0] = io(buf + off);
    for (i = 1; i < n; i++) {
        pages[i] = io(buf) / PS * PS + (uint64_t) (off / PS + i) * PS;
    }
    return n;
}

static const nvm_pq_t* pick(struct worker* w)
{
    return &w->c->q[nvm_pq_pick(N_Q, w->tid)];
}

/* One verified read of the pattern region or of this thread's own blocks. */
static void do_read(struct worker* w, int own)
{
    const nvm_pq_t* q = pick(w);
    uint64_t pages[BUF_PAGES];
    uint32_t nb = 1 + (uint32_t) (rnd(w) % 32u), off = (uint32_t) (rnd(w) % 1024u) * 4u, i, np;
    uint64_t lba;
    nvm_pq_status_t r;

    if (own) {
        nb = 1 + (uint32_t) (rnd(w) % 8u);
        lba = W_BASE + (uint64_t) w->tid * W_PER + rnd(w) % (W_PER - nb + 1);
    } else {
        lba = rnd(w) % (RO_BLOCKS - nb + 1);
    }
    memset(w->buf, 0xEE, BUF_PAGES * PS);
    np = make_pages(w->buf, off, nb * BS, pages);
    r = nvm_pq_read(q, lba, (uint16_t) nb, pages, np, nvm_pq_deadline(10ull * 1000000000ull));
    w->reads++;
    if (r.err != 0 || !nvm_pq_ok(r)) {
        fail("thread %u: read lba %llu x%u: err %d sct %u sc 0x%x", w->tid, (unsigned long long) lba, nb,
             r.err, r.sct, r.sc);
        return;
    }
    for (i = 0; i < nb * BS; i++) {
        uint8_t want = own ? w->shadow[(lba - W_BASE - (uint64_t) w->tid * W_PER) * BS + i]
                           : nvmesim_pattern_byte(lba * BS + i);
        if (w->buf[off + i] != want) {
            fail("thread %u: read lba %llu byte %u: 0x%02x, want 0x%02x", w->tid, (unsigned long long) lba, i,
                 w->buf[off + i], want);
            return;
        }
    }
    for (i = 0; i < off; i++) {
        CHECK(w->buf[i] == 0xEE, "thread %u: byte %u before the buffer overwritten", w->tid, i);
    }
    for (i = off + nb * BS; i < BUF_PAGES * PS; i++) {
        if (w->buf[i] != 0xEE) {
            fail("thread %u: byte %u after the transfer overwritten", w->tid, i);
            break;
        }
    }
}

static void do_write(struct worker* w, unsigned iter)
{
    const nvm_pq_t* q = pick(w);
    uint64_t pages[BUF_PAGES];
    uint32_t nb = 1 + (uint32_t) (rnd(w) % 8u), off = (uint32_t) (rnd(w) % 1024u) * 4u, i, np;
    uint64_t first = rnd(w) % (W_PER - nb + 1);
    nvm_pq_status_t r;

    for (i = 0; i < nb * BS; i++) {
        w->buf[off + i] = (uint8_t) (w->tid * 131u + iter * 7u + i * 3u);
    }
    np = make_pages(w->buf, off, nb * BS, pages);
    r = nvm_pq_write(q, W_BASE + (uint64_t) w->tid * W_PER + first, (uint16_t) nb, pages, np,
                     nvm_pq_deadline(10ull * 1000000000ull));
    w->writes++;
    if (!nvm_pq_ok(r)) {
        fail("thread %u: write: err %d sct %u sc 0x%x", w->tid, r.err, r.sct, r.sc);
        return;
    }
    memcpy(w->shadow + first * BS, w->buf + off, nb * BS);
}

/* A command only this thread sends (opcode 0x80 + tid), for which nvmesim has this thread's
 * error status injected: it must come back to this thread, exactly. */
static void do_err(struct worker* w)
{
    const nvm_pq_t* q = pick(w);
    nvm_cmd_t cmd;
    nvm_pq_status_t r;
    unsigned e = w->tid % N_ERR;

    memset(&cmd, 0, sizeof(cmd));
    cmd.dword[0] = 0x80u + w->tid;
    cmd.dword[1] = 1;
    r = nvm_pq_submit(q, &cmd, nvm_pq_deadline(10ull * 1000000000ull), NULL, 0);
    w->errs++;
    CHECK(r.err == 0 && r.sct == err_table[e].sct && r.sc == err_table[e].sc && r.dnr == err_table[e].dnr,
          "thread %u: injected status: err %d sct %u sc 0x%x dnr %u, want sct %u sc 0x%x dnr %u", w->tid, r.err,
          r.sct, r.sc, r.dnr, err_table[e].sct, err_table[e].sc, err_table[e].dnr);
}

static void* worker_main(void* arg)
{
    struct worker* w = (struct worker*) arg;
    unsigned i;
    for (i = 0; i < w->c->ops; i++) {
        unsigned k = (unsigned) (rnd(w) % 100u);
        if (i % ERR_EVERY == ERR_EVERY - 1) {
            do_err(w);
        } else if (k < 10) {
            do_write(w, i);
        } else if (k < 20) {
            do_read(w, 1);
        } else if (k == 20) {
            nvm_pq_status_t r = nvm_pq_flush(pick(w), nvm_pq_deadline(10ull * 1000000000ull));
            w->flushes++;
            CHECK(nvm_pq_ok(r), "thread %u: flush err %d sc 0x%x", w->tid, r.err, r.sc);
        } else {
            do_read(w, 0);
        }
    }
    return NULL;
}

/* ---- stalled controller: every waiter times out within its deadline ---- */

struct stall_arg {
    struct ctx* c;
    unsigned tid;
    unsigned char* buf;
    uint64_t timeout_ns, started, returned;
    nvm_pq_status_t r;
    const nvm_pq_t* q;
};

static void* stall_main(void* arg)
{
    struct stall_arg* a = (struct stall_arg*) arg;
    uint64_t page = io(a->buf);
    a->started = nvm_pq_now();
    a->r = nvm_pq_read(a->q, a->tid, 1, &page, 1, a->started + a->timeout_ns);
    a->returned = nvm_pq_now();
    return NULL;
}

static unsigned run_stalled(struct ctx* c, const nvm_pq_t* qs, unsigned n, uint64_t timeout_ns,
                            struct stall_arg* args, uint64_t slack_ns)
{
    unsigned i, timeouts = 0;
    for (i = 0; i < n; i++) {
        args[i].c = c;
        args[i].tid = i;
        args[i].timeout_ns = timeout_ns;
        args[i].q = &qs[i % N_Q];
        if (args[i].buf == NULL) {
            args[i].buf = (unsigned char*) page_alloc(PS);
        }
    }
    pthread_t th[MAX_THREADS];
    for (i = 0; i < n; i++) {
        pthread_create(&th[i], NULL, stall_main, &args[i]);
    }
    for (i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
    }
    for (i = 0; i < n; i++) {
        uint64_t took = args[i].returned - args[i].started;
        if (args[i].r.err == NVM_PQ_ETIME) {
            timeouts++;
        }
        CHECK(args[i].r.err == NVM_PQ_ETIME, "stalled waiter %u: err %d (want ETIME)", i, args[i].r.err);
        CHECK(took >= timeout_ns && took <= timeout_ns + slack_ns,
              "stalled waiter %u returned after %llu us (deadline %llu us, slack %llu us)", i,
              (unsigned long long) (took / 1000), (unsigned long long) (timeout_ns / 1000),
              (unsigned long long) (slack_ns / 1000));
    }
    return timeouts;
}

static int zero_host(void* p, size_t n, void* arg)
{
    (void) arg;
    memset(p, 0, n);
    return 0;
}

static void run_workers(struct ctx* c, struct worker* ws, const char* phase)
{
    unsigned i;
    uint64_t t0 = nvm_pq_now();
    for (i = 0; i < c->threads; i++) {
        pthread_create(&ws[i].th, NULL, worker_main, &ws[i]);
    }
    for (i = 0; i < c->threads; i++) {
        pthread_join(ws[i].th, NULL);
    }
    printf("  %s: %u threads x %u ops in %.2f s\n", phase, c->threads, c->ops, (nvm_pq_now() - t0) / 1e9);
}

static uint64_t sum_stat(struct ctx* c, size_t off)
{
    uint64_t s = 0;
    for (int i = 0; i < N_Q; i++) {
        s += *(uint64_t*) ((unsigned char*) c->q[i].state + off);
    }
    return s;
}

#define STAT(c, f) sum_stat((c), offsetof(nvm_pq_state_t, f))

static void check_quiet(struct ctx* c, const char* when)
{
    for (int i = 0; i < N_Q; i++) {
        nvm_pq_state_t* st = c->q[i].state;
        CHECK(st->released == st->ticket, "%s: queue %d still holds %lld credits", when, i + 1,
              (long long) (st->ticket - st->released));
        CHECK(st->ticket == st->published, "%s: queue %d: ticket %llu published %llu", when, i + 1,
              (unsigned long long) st->ticket, (unsigned long long) st->published);
        CHECK(st->stray == 0, "%s: queue %d: %llu stray completions", when, i + 1, (unsigned long long) st->stray);
        for (uint32_t k = 0; k < c->q[i].n_cids; k++) {
            /* FREE, and nothing but the generation left in the word. */
            CHECK((c->q[i].cids[k].state & ~0xFFFCull) == 0, "%s: queue %d CID %u not free (0x%llx)", when, i + 1, k,
                  (unsigned long long) c->q[i].cids[k].state);
        }
    }
}

int main(int argc, char** argv)
{
    static struct ctx c;
    static struct worker ws[MAX_THREADS];
    static struct stall_arg sargs[MAX_THREADS];
    const uint32_t sq_sizes[N_Q] = {100, 61, 33, 256};
    const uint32_t cq_sizes[N_Q] = {100, 97, 40, 256};
    nvm_ctrl_t* ctrl = NULL;
    nvm_dma_t* win = NULL;
    unsigned i, ops_full;
    uint64_t expected_cmds = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    c.threads = argc > 1 ? (unsigned) atoi(argv[1]) : 64;
    c.ops = argc > 2 ? (unsigned) atoi(argv[2]) : 500;
    ops_full = c.ops;
    if (c.threads < 4 || c.threads > MAX_THREADS || c.threads > 120 || c.ops < 4 * ERR_EVERY) {
        fprintf(stderr, "usage: pq_sim [threads 4..120] [ops >= %u]\n", 4 * ERR_EVERY);
        return 2;
    }
    printf("nvm_pq host test: %u threads over %d queues (depths 100/61/33/256), %u ops each\n", c.threads, N_Q,
           c.ops);

    /* Controller, admin queue. */
    c.sim = nvmesim_start(N_BLOCKS);
    if (c.sim == NULL || nvm_raw_ctrl_init(&ctrl, nvmesim_bar(c.sim), nvmesim_bar_size()) != 0) {
        printf("FAIL: nvmesim bring-up\n");
        return 1;
    }
    c.ctrl = ctrl;
    {
        unsigned char* am = (unsigned char*) page_alloc(3 * PS);
        uint64_t addrs[3] = {io(am), io(am + PS), io(am + 2 * PS)};
        if (nvm_dma_map(&win, ctrl, am, PS, 3, addrs) != 0 || nvm_aq_create(&c.ref, ctrl, win) != 0) {
            printf("FAIL: admin queue\n");
            return 1;
        }
    }

    /* Queue pairs 1..4 of odd depths, rings and PRP pools in host memory. */
    for (i = 0; i < N_Q; i++) {
        nvm_pq_mem_t* m = &c.mem[i];
        volatile unsigned char* bar = (volatile unsigned char*) nvmesim_bar(c.sim);
        void* ctl = NULL;
        int rc;
        memset(m, 0, sizeof(*m));
        m->sq_vaddr = page_alloc(sq_sizes[i] * 64u);
        m->sq_ioaddr = io(m->sq_vaddr);
        m->cq_vaddr = page_alloc(cq_sizes[i] * 16u);
        m->cq_ioaddr = io(m->cq_vaddr);
        if (posix_memalign(&ctl, 128, nvm_pq_ctl_size(sq_sizes[i], sq_sizes[i])) != 0) {
            return 2;
        }
        m->ctl_vaddr = ctl;
        m->prp_vaddr = page_alloc((size_t) sq_sizes[i] * PS);
        m->prp_ioaddr = io(m->prp_vaddr);
        m->sq_db = (volatile uint32_t*) (bar + 0x1000 + (2 * (i + 1)) * 4);
        m->cq_db = (volatile uint32_t*) (bar + 0x1000 + (2 * (i + 1) + 1) * 4);
        m->zero = zero_host;
        rc = nvm_pq_host_create(c.ref, ctrl, (uint16_t) (i + 1), 1, sq_sizes[i], cq_sizes[i], m, &c.q[i]);
        if (rc != 0) {
            printf("FAIL: nvm_pq_host_create(qid %u): %d\n", i + 1, rc);
            return 1;
        }
    }

    /* Bad input. */
    {
        nvm_pq_t bad = c.q[0];
        nvm_cmd_t cmd;
        uint64_t pages[PS / 8 + 2];
        memset(&cmd, 0, sizeof(cmd));
        memset(pages, 0, sizeof(pages));
        bad.version = 99;
        CHECK(nvm_pq_submit(&bad, &cmd, nvm_pq_deadline(1000000), NULL, 0).err == NVM_PQ_EINVAL, "bad version accepted");
        bad = c.q[0];
        bad.size = 8;
        CHECK(nvm_pq_flush(&bad, nvm_pq_deadline(1000000)).err == NVM_PQ_EINVAL, "bad size accepted");
        CHECK(nvm_pq_submit(NULL, &cmd, 0, NULL, 0).err == NVM_PQ_EINVAL, "NULL queue accepted");
        CHECK(nvm_pq_read(&c.q[0], 0, 1, NULL, 1, 0).err == NVM_PQ_EINVAL, "NULL pages accepted");
        CHECK(nvm_pq_read(&c.q[0], 0, 1, pages, PS / 8 + 2, nvm_pq_deadline(1000000)).err == NVM_PQ_EINVAL,
              "a PRP list longer than one page accepted");
        CHECK(nvm_pq_host_create(c.ref, ctrl, 9, 1, 1, 2, &c.mem[0], &bad) == NVM_PQ_EINVAL, "depth 1 accepted");
        CHECK(nvm_pq_host_create(c.ref, ctrl, 0, 1, 8, 8, &c.mem[0], &bad) == NVM_PQ_EINVAL, "qid 0 accepted");
        /* The controller's answer for a duplicate queue id comes back as libnvm's packed status. */
        nvm_pq_mem_t m2 = c.mem[0];
        m2.sq_vaddr = page_alloc(PS);
        m2.sq_ioaddr = io(m2.sq_vaddr);
        m2.cq_vaddr = page_alloc(PS);
        m2.cq_ioaddr = io(m2.cq_vaddr);
        void* ctl2 = NULL;
        if (posix_memalign(&ctl2, 128, nvm_pq_ctl_size(8, 8)) != 0) {
            return 2;
        }
        m2.ctl_vaddr = ctl2;
        CHECK(nvm_pq_host_create(c.ref, ctrl, 1, 1, 8, 8, &m2, &bad) == -0x101, "duplicate qid: want -0x101");
    }

    /* Workers. */
    for (i = 0; i < c.threads; i++) {
        ws[i].c = &c;
        ws[i].tid = i;
        ws[i].buf = (unsigned char*) page_alloc(BUF_PAGES * PS);
        ws[i].shadow = (unsigned char*) malloc(W_PER * BS);
        ws[i].rng = 0x9E3779B97F4A7C15ull * (i + 1);
        if (nvmesim_read_storage(c.sim, (uint64_t) (W_BASE + i * W_PER) * BS, ws[i].shadow, W_PER * BS) != 0) {
            printf("FAIL: reading the namespace\n");
            return 1;
        }
        /* One injection per error command this thread will send, keyed to its own opcode. */
        nvmesim_inject(c.sim, 0, (int) (0x80u + i), err_table[i % N_ERR].sct, err_table[i % N_ERR].sc,
                       err_table[i % N_ERR].dnr, 2u * (c.ops / ERR_EVERY) + 3u * (c.ops / 4u / ERR_EVERY));
    }

    /* 1. In-order completion, then out of order. */
    run_workers(&c, ws, "in order");
    check_quiet(&c, "after in-order phase");
    nvmesim_set_out_of_order(c.sim, 1);
    run_workers(&c, ws, "out of order");
    check_quiet(&c, "after out-of-order phase");
    expected_cmds = 0;
    for (i = 0; i < c.threads; i++) {
        expected_cmds += ws[i].reads + ws[i].writes + ws[i].flushes + ws[i].errs;
    }
    CHECK(STAT(&c, completions) == expected_cmds, "completions %llu != commands %llu",
          (unsigned long long) STAT(&c, completions), (unsigned long long) expected_cmds);
    CHECK(nvmesim_io_commands(c.sim) == expected_cmds, "controller fetched %llu commands, callers sent %llu",
          (unsigned long long) nvmesim_io_commands(c.sim), (unsigned long long) expected_cmds);
    CHECK(STAT(&c, late) == 0 && STAT(&c, timeouts) == 0, "timeouts without a stall");
    printf("  %llu commands, %llu completions, %llu SQ doorbells, %llu CQ doorbells, stray %llu\n",
           (unsigned long long) expected_cmds, (unsigned long long) STAT(&c, completions),
           (unsigned long long) STAT(&c, sq_doorbells), (unsigned long long) STAT(&c, cq_doorbells),
           (unsigned long long) STAT(&c, stray));
    /* The written blocks on the controller are what the threads think they wrote. */
    for (i = 0; i < c.threads; i++) {
        unsigned char* now = (unsigned char*) malloc(W_PER * BS);
        nvmesim_read_storage(c.sim, (uint64_t) (W_BASE + i * W_PER) * BS, now, W_PER * BS);
        CHECK(memcmp(now, ws[i].shadow, W_PER * BS) == 0, "thread %u: namespace blocks differ from its writes", i);
        free(now);
    }

    /* 2. Stalled controller: every waiter times out within its deadline (100 ms, slack 400 ms
     * for a loaded 2-core machine); the late completions then free their CIDs and nobody's
     * result is touched. */
    {
        uint64_t late0 = STAT(&c, late), to;
        nvmesim_set_stalled(c.sim, 1);
        to = run_stalled(&c, c.q, c.threads, 100000000ull, sargs, 400000000ull);
        printf("  stalled controller: %llu of %u waiters timed out within deadline + slack\n",
               (unsigned long long) to, c.threads);
        nvmesim_set_stalled(c.sim, 0);
        c.ops = ops_full / 4;
        run_workers(&c, ws, "after the stall");
        /* Drain whatever is still to come with a few flushes. */
        for (i = 0; i < N_Q; i++) {
            nvm_pq_flush(&c.q[i], nvm_pq_deadline(1000000000ull));
        }
        check_quiet(&c, "after the stall");
        CHECK(STAT(&c, late) - late0 == c.threads, "late completions %llu, want %u",
              (unsigned long long) (STAT(&c, late) - late0), c.threads);
        /* The abandoned reads' buffers got their data late; the check above showed no other
         * caller's result was corrupted. */
        for (i = 0; i < c.threads; i++) {
            for (unsigned b = 0; b < BS; b++) {
                if (sargs[i].buf[b] != nvmesim_pattern_byte((uint64_t) i * BS + b)) {
                    fail("late read %u: byte %u wrong", i, b);
                    break;
                }
            }
        }
    }

    /* 2b. More waiters than credits on one stalled queue (depth 33: 32 credits): half time out
     * waiting for their completion, half before admission; those leave holes that publishers
     * fill with a Flush once admitted, so later commands still go out. */
    {
        nvm_pq_t only3[N_Q] = {c.q[2], c.q[2], c.q[2], c.q[2]};
        uint64_t late0 = STAT(&c, late), holes0 = STAT(&c, holes), to;
        nvmesim_set_stalled(c.sim, 1);
        to = run_stalled(&c, only3, 64, 100000000ull, sargs, 400000000ull);
        printf("  stalled queue, 64 waiters for 32 credits: %llu timed out\n", (unsigned long long) to);
        nvmesim_set_stalled(c.sim, 0);
        run_workers(&c, ws, "after the overfull stall");
        for (i = 0; i < N_Q; i++) {
            nvm_pq_flush(&c.q[i], nvm_pq_deadline(1000000000ull));
        }
        check_quiet(&c, "after the overfull stall");
        CHECK(STAT(&c, holes) - holes0 == 32, "holes filled %llu, want 32", (unsigned long long) (STAT(&c, holes) - holes0));
        CHECK(STAT(&c, late) - late0 == 64, "late completions %llu, want 64 (32 abandoned + 32 hole Flushes)",
              (unsigned long long) (STAT(&c, late) - late0));
    }

    /* 3. A lost doorbell (the handle rings a dummy word): commands sit in the SQ, every waiter
     * times out, nvm_pq_host_reset deletes and re-creates the queue pair, and it works again. */
    {
        static uint32_t dummy_db;
        nvm_pq_t lost[N_Q];
        uint64_t to;
        for (i = 0; i < N_Q; i++) {
            lost[i] = c.q[i];
            lost[i].sq_db = &dummy_db;
        }
        to = run_stalled(&c, lost, c.threads, 50000000ull, sargs + 0, 400000000ull);
        printf("  lost doorbell: %llu of %u waiters timed out\n", (unsigned long long) to, c.threads);
        for (i = 0; i < N_Q; i++) {
            CHECK(c.q[i].state->ticket > c.q[i].state->released, "queue %u: timed-out commands should still hold credits",
                  i + 1);
            int rc = nvm_pq_host_reset(c.ref, &c.q[i], &c.mem[i]);
            CHECK(rc == 0, "nvm_pq_host_reset(queue %u): %d", i + 1, rc);
        }
        check_quiet(&c, "after nvm_pq_host_reset");
        run_workers(&c, ws, "after the reset");
        check_quiet(&c, "after the post-reset phase");
        CHECK(STAT(&c, stray) == 0, "stray completions after reset");
    }

    for (i = 0; i < N_Q; i++) {
        CHECK(nvm_pq_host_delete(c.ref, &c.q[i]) == 0, "deleting queue %u", i + 1);
    }
    nvm_aq_destroy(c.ref);
    nvm_dma_unmap(win);
    nvm_ctrl_free(ctrl);
    nvmesim_stop(c.sim);

    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS: nvm_pq host test\n");
    return 0;
}
