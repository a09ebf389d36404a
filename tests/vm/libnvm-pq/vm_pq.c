/*
 * nvm_pq.h (built for the host) on CPU threads against QEMU's emulated NVMe controller,
 * module-free: BAR0 through sysfs resource0, memory located through /proc/self/pagemap (no IOMMU
 * in the VM: bus address = physical address). CPU threads stand in for GPU threads.
 *
 * Usage: vm_pq BDF WRITES_FILE [threads=64] [ops per thread=500]
 *
 * Checks: 4 queue pairs of odd depths (SQ 64/61/37/50, CQ 64/97/40/256) created with
 * nvm_pq_host_create; every thread does verified reads of the image pattern
 * (tests/vm/nvme/image.py) in [0, 16 MiB), with random sizes up to 4 KiB and offsets (PRP1, or
 * PRP1+PRP2 across a page), mixed with writes to its own blocks (read back; recorded in
 * WRITES_FILE for the host's image check) and commands that QEMU fails in a known way (read past
 * the end → 0x80, an unknown opcode → 0x01, more than MDTS → 0x02, all with DNR), each thread
 * one kind, which must come back to exactly that thread; completions = commands, no stray CID,
 * every credit back. Then a queue whose doorbell is lost (the handle rings a dummy word): every
 * waiter times out within its deadline, nvm_pq_host_reset deletes and re-creates the pairs,
 * and verified traffic runs again. Prints "ok - ..." / "not ok - ..." and exits 0 only if all
 * hold.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nvm_types.h>
#include <nvm_ctrl.h>
#include <nvm_dma.h>
#include <nvm_aq.h>
#include <nvm_admin.h>
#include <nvm_rpc.h>
#include <nvm_error.h>
#include <nvm_pq.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK_REPORT_LIMIT 20   /* failures printed; the rest are only counted */
#include "../lib/check.h"

#define PATTERN_TAG (0xA5ULL << 56)
#define WRITE_MUL   0x9E3779B97F4A7C15ULL
#define PS          4096u
#define BS          512u
#define RO_BLOCKS   32768u          /* reads come from the first 16 MiB */
#define W_BASE      40960u          /* thread t owns W_PER blocks from W_BASE + t*W_PER */
#define W_PER       32u
#define N_Q         4
#define MAX_THREADS 128
#define ERR_EVERY   50u

static int pagemap = -1;
static FILE* writes;

static uint64_t phys(const void* va)
{
    uint64_t e = 0;
    if (pread(pagemap, &e, 8, (off_t) ((uintptr_t) va / PS) * 8) != 8 || !(e >> 63)) {
        return 0;
    }
    return (e & ((1ULL << 55) - 1)) * PS + ((uintptr_t) va % PS);
}

/* Locked, zeroed pages; exits on failure (nothing can run without them). */
static void* pages_new(size_t n)
{
    void* p = NULL;
    if (posix_memalign(&p, PS, n * PS) != 0 || mlock(p, n * PS) != 0) {
        perror("pinned memory");
        exit(1);
    }
    memset(p, 0, n * PS);
    return p;
}

struct ctx {
    nvm_aq_ref ref;
    const nvm_ctrl_t* ctrl;
    nvm_pq_t q[N_Q];
    nvm_pq_mem_t mem[N_Q];
    unsigned threads, ops;
    uint64_t disk_blocks;
};

struct worker {
    struct ctx* c;
    unsigned tid;
    pthread_t th;
    unsigned char* buf;             /* 2 pages */
    uint64_t seed[W_PER];           /* last write's seed per own block (0: never written) */
    uint64_t rng, cmds;
};

static uint64_t rnd(struct worker* w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static const nvm_pq_t* pick(struct worker* w)
{
    return &w->c->q[nvm_pq_pick(N_Q, w->tid)];
}

static uint64_t expect_word(struct worker* w, uint64_t off)
{
    uint64_t blk = off / BS;
    if (blk >= W_BASE + (uint64_t) w->tid * W_PER && blk < W_BASE + (uint64_t) (w->tid + 1) * W_PER) {
        uint64_t s = w->seed[blk - W_BASE - (uint64_t) w->tid * W_PER];
        if (s != 0) {
            return WRITE_MUL * s + off;
        }
    }
    return PATTERN_TAG | off;
}

/* Bus addresses of a transfer of len bytes at buf + off (at most 2 pages). */
static uint32_t prps(struct worker* w, uint32_t off, uint32_t len, uint64_t* pages)
{
    pages[0] = phys(w->buf + off);
    if (off % PS + len <= PS) {
        return 1;
    }
    pages[1] = phys(w->buf + (off / PS + 1) * PS);
    return 2;
}

static void do_read(struct worker* w, int own)
{
    uint64_t pages[2], lba;
    uint32_t nb = 1 + (uint32_t) (rnd(w) % 8u), off = (uint32_t) (rnd(w) % 1024u) * 4u, i, np;
    nvm_pq_status_t r;
    if (own) {
        lba = W_BASE + (uint64_t) w->tid * W_PER + rnd(w) % (W_PER - nb + 1);
    } else {
        lba = rnd(w) % (RO_BLOCKS - nb + 1);
    }
    memset(w->buf, 0xEE, 2 * PS);
    np = prps(w, off, nb * BS, pages);
    r = nvm_pq_read(pick(w), lba, (uint16_t) nb, pages, np, nvm_pq_deadline(30ull * 1000000000ull));
    w->cmds++;
    if (!nvm_pq_ok(r)) {
        NOT_OK("thread %u: read lba %llu x%u: err %d sct %u sc 0x%x", w->tid, (unsigned long long) lba, nb, r.err, r.sct,
             r.sc);
        return;
    }
    for (i = 0; i < nb * BS; i += 8) {
        uint64_t got, want = expect_word(w, lba * BS + i);
        memcpy(&got, w->buf + off + i, 8);
        if (got != want) {
            NOT_OK("thread %u: read lba %llu word %u: 0x%016llx, want 0x%016llx", w->tid, (unsigned long long) lba, i / 8,
                 (unsigned long long) got, (unsigned long long) want);
            return;
        }
    }
    for (i = 0; i < 2 * PS; i++) {
        if ((i < off || i >= off + nb * BS) && w->buf[i] != 0xEE) {
            NOT_OK("thread %u: byte %u outside the transfer overwritten", w->tid, i);
            return;
        }
    }
}

static void do_write(struct worker* w, unsigned iter)
{
    uint64_t pages[2];
    uint32_t nb = 1 + (uint32_t) (rnd(w) % 4u), off = (uint32_t) (rnd(w) % 1024u) * 4u, i, np;
    uint64_t first = rnd(w) % (W_PER - nb + 1), lba = W_BASE + (uint64_t) w->tid * W_PER + first;
    uint64_t seed = ((uint64_t) w->tid << 32) | (iter + 1u);
    nvm_pq_status_t r;
    for (i = 0; i < nb * BS; i += 8) {
        uint64_t v = WRITE_MUL * seed + lba * BS + i;
        memcpy(w->buf + off + i, &v, 8);
    }
    np = prps(w, off, nb * BS, pages);
    r = nvm_pq_write(pick(w), lba, (uint16_t) nb, pages, np, nvm_pq_deadline(30ull * 1000000000ull));
    w->cmds++;
    if (!nvm_pq_ok(r)) {
        NOT_OK("thread %u: write: err %d sct %u sc 0x%x", w->tid, r.err, r.sct, r.sc);
        return;
    }
    for (i = 0; i < nb; i++) {
        w->seed[first + i] = seed;
    }
}

/* A command QEMU fails in a known way, one kind per thread: it must come back to this thread. */
static void do_err(struct worker* w)
{
    nvm_cmd_t cmd;
    nvm_pq_status_t r;
    uint64_t page = phys(w->buf);
    unsigned kind = w->tid % 3;
    const uint8_t want_sc[3] = {0x80, 0x01, 0x02};
    memset(&cmd, 0, sizeof(cmd));
    cmd.dword[1] = 1;
    cmd.dword[6] = (uint32_t) page;
    cmd.dword[7] = (uint32_t) (page >> 32);
    if (kind == 0) { /* read past the end */
        cmd.dword[0] = 0x02;
        cmd.dword[10] = (uint32_t) w->c->disk_blocks;
        cmd.dword[11] = (uint32_t) (w->c->disk_blocks >> 32);
    } else if (kind == 1) { /* unknown opcode */
        cmd.dword[0] = 0x7E;
    } else { /* 2048 blocks = 1 MiB > MDTS (512 KiB) */
        cmd.dword[0] = 0x02;
        cmd.dword[12] = 2047;
    }
    r = nvm_pq_submit(pick(w), &cmd, nvm_pq_deadline(30ull * 1000000000ull), NULL, 0);
    w->cmds++;
    if (!(r.err == 0 && r.sct == 0 && r.sc == want_sc[kind] && r.dnr == 1)) {
        NOT_OK("thread %u: error kind %u: err %d sct %u sc 0x%x dnr %u, want sc 0x%x dnr 1", w->tid, kind, r.err, r.sct,
             r.sc, r.dnr, want_sc[kind]);
    }
}

static void* worker_main(void* arg)
{
    struct worker* w = (struct worker*) arg;
    for (unsigned i = 0; i < w->c->ops; i++) {
        unsigned k = (unsigned) (rnd(w) % 100u);
        if (i % ERR_EVERY == ERR_EVERY - 1) {
            do_err(w);
        } else if (k < 10) {
            do_write(w, i);
        } else if (k < 20) {
            do_read(w, 1);
        } else if (k == 20) {
            nvm_pq_status_t r = nvm_pq_flush(pick(w), nvm_pq_deadline(30ull * 1000000000ull));
            w->cmds++;
            if (!nvm_pq_ok(r)) {
                NOT_OK("thread %u: flush: err %d sc 0x%x", w->tid, r.err, r.sc);
            }
        } else {
            do_read(w, 0);
        }
    }
    return NULL;
}

static uint64_t run_workers(struct ctx* c, struct worker* ws, const char* phase)
{
    uint64_t t0 = nvm_pq_now(), before = 0, after = 0, completions = 0, stray = 0, out = 0;
    unsigned i;
    for (i = 0; i < c->threads; i++) {
        before += ws[i].cmds;
    }
    uint64_t comp0 = 0;
    for (i = 0; i < N_Q; i++) {
        comp0 += c->q[i].state->completions;
    }
    for (i = 0; i < c->threads; i++) {
        pthread_create(&ws[i].th, NULL, worker_main, &ws[i]);
    }
    for (i = 0; i < c->threads; i++) {
        pthread_join(ws[i].th, NULL);
    }
    for (i = 0; i < c->threads; i++) {
        after += ws[i].cmds;
    }
    for (i = 0; i < N_Q; i++) {
        completions += c->q[i].state->completions;
        stray += c->q[i].state->stray;
        out += c->q[i].state->ticket - c->q[i].state->released;
    }
    double secs = (nvm_pq_now() - t0) / 1e9;
    check_report(check_failures == 0, "%s: %u threads x %u ops, %llu commands in %.2f s (%.0f/s), verified", phase, c->threads,
           c->ops, (unsigned long long) (after - before), secs, (after - before) / secs);
    check_report(completions - comp0 == after - before && stray == 0 && out == 0,
           "%s: every command completed exactly once (%llu completions, %llu stray, %llu credits out)", phase,
           (unsigned long long) (completions - comp0), (unsigned long long) stray, (unsigned long long) out);
    return after - before;
}

struct stall_arg {
    const nvm_pq_t* q;
    unsigned char* buf;
    uint64_t started, took;
    nvm_pq_status_t r;
};

static void* stall_main(void* p)
{
    struct stall_arg* a = (struct stall_arg*) p;
    uint64_t page = phys(a->buf);
    a->started = nvm_pq_now();
    a->r = nvm_pq_read(a->q, 0, 1, &page, 1, a->started + 200000000ull);
    a->took = nvm_pq_now() - a->started;
    return NULL;
}

int main(int argc, char** argv)
{
    static struct ctx c;
    static struct worker ws[MAX_THREADS];
    const uint32_t sq_sizes[N_Q] = {64, 61, 37, 50};
    const uint32_t cq_sizes[N_Q] = {64, 97, 40, 256};
    char path[256];
    struct stat stt;
    nvm_ctrl_t* ctrl = NULL;
    nvm_dma_t* win = NULL;
    int fd, rc;
    unsigned i;

    if (argc < 3) {
        fprintf(stderr, "usage: vm_pq BDF WRITES_FILE [threads] [ops]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    c.threads = argc > 3 ? (unsigned) atoi(argv[3]) : 64;
    c.ops = argc > 4 ? (unsigned) atoi(argv[4]) : 500;
    if (c.threads < 4 || c.threads > MAX_THREADS || c.ops < ERR_EVERY) {
        fprintf(stderr, "vm_pq: threads 4..%d, ops >= %u\n", MAX_THREADS, ERR_EVERY);
        return 2;
    }
    pagemap = open("/proc/self/pagemap", O_RDONLY);
    writes = fopen(argv[2], "a");
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource0", argv[1]);
    fd = open(path, O_RDWR | O_SYNC);
    if (fd < 0 || pagemap < 0 || writes == NULL || fstat(fd, &stt) != 0) {
        perror("vm_pq: open");
        return 1;
    }
    volatile unsigned char* bar =
        (volatile unsigned char*) mmap(NULL, (size_t) stt.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if ((void*) bar == MAP_FAILED || nvm_raw_ctrl_init(&ctrl, bar, (size_t) stt.st_size) != 0) {
        perror("vm_pq: resource0");
        return 1;
    }
    c.ctrl = ctrl;
    {
        unsigned char* am = (unsigned char*) pages_new(3);
        uint64_t a[3] = {phys(am), phys(am + PS), phys(am + 2 * PS)};
        rc = nvm_dma_map(&win, ctrl, am, PS, 3, a);
        if (rc == 0) {
            rc = nvm_aq_create(&c.ref, ctrl, win);
        }
        check_report(rc == 0, "admin queue on resource0 + pagemap: %s", nvm_strerror(rc));
        if (rc != 0) {
            return 1;
        }
        struct nvm_ns_info ns;
        rc = nvm_admin_ns_info(c.ref, &ns, 1, am + 2 * PS, a[2]);
        c.disk_blocks = ns.size;
        check_report(rc == 0 && ns.lba_data_size == BS && ns.size > W_BASE + MAX_THREADS * W_PER, "namespace 1: %llu blocks",
               (unsigned long long) ns.size);
    }
    for (i = 0; i < N_Q; i++) {
        nvm_pq_mem_t* m = &c.mem[i];
        void* ctl = NULL;
        memset(m, 0, sizeof(*m));
        m->sq_vaddr = pages_new(1);
        m->sq_ioaddr = phys(m->sq_vaddr);
        m->cq_vaddr = pages_new(1);
        m->cq_ioaddr = phys(m->cq_vaddr);
        if (posix_memalign(&ctl, 128, nvm_pq_ctl_size(sq_sizes[i], sq_sizes[i])) != 0) {
            return 1;
        }
        m->ctl_vaddr = ctl;
        m->sq_db = (volatile uint32_t*) (bar + 0x1000 + (2 * (i + 1)) * (4u << ctrl->dstrd));
        m->cq_db = (volatile uint32_t*) (bar + 0x1000 + (2 * (i + 1) + 1) * (4u << ctrl->dstrd));
        rc = nvm_pq_host_create(c.ref, ctrl, (uint16_t) (i + 1), 1, sq_sizes[i], cq_sizes[i], m, &c.q[i]);
        check_report(rc == 0, "nvm_pq_host_create qid %u (SQ %u, CQ %u entries): %s", i + 1, sq_sizes[i], cq_sizes[i],
               nvm_strerror(rc));
        if (rc != 0) {
            return 1;
        }
    }
    for (i = 0; i < c.threads; i++) {
        ws[i].c = &c;
        ws[i].tid = i;
        ws[i].buf = (unsigned char*) pages_new(2);
        ws[i].rng = 0x9E3779B97F4A7C15ull * (i + 1);
    }

    run_workers(&c, ws, "shared queues");

    /* Lost doorbell: every waiter times out within 200 ms + 1 s (TCG), then the host reset. */
    {
        static uint32_t dummy;
        nvm_pq_t lost[N_Q];
        struct stall_arg sa[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        unsigned to = 0, late = 0;
        for (i = 0; i < N_Q; i++) {
            lost[i] = c.q[i];
            lost[i].sq_db = &dummy;
        }
        for (i = 0; i < c.threads; i++) {
            sa[i].q = &lost[i % N_Q];
            sa[i].buf = (unsigned char*) pages_new(1);
            pthread_create(&th[i], NULL, stall_main, &sa[i]);
        }
        for (i = 0; i < c.threads; i++) {
            pthread_join(th[i], NULL);
            to += sa[i].r.err == NVM_PQ_ETIME;
            late += sa[i].took < 200000000ull || sa[i].took > 1200000000ull;
        }
        check_report(to == c.threads && late == 0, "lost doorbell: %u of %u waiters timed out, %u outside [200 ms, 1.2 s]",
               to, c.threads, late);
        for (i = 0; i < N_Q; i++) {
            rc = nvm_pq_host_reset(c.ref, &c.q[i], &c.mem[i]);
            check_report(rc == 0 && c.q[i].state->ticket == 0, "nvm_pq_host_reset qid %u: %s", i + 1, nvm_strerror(rc));
        }
    }
    c.ops = c.ops / 4 < ERR_EVERY ? ERR_EVERY : c.ops / 4;
    run_workers(&c, ws, "after the reset");

    /* What the threads wrote stays on the disk: the host's image check reads this. */
    for (i = 0; i < c.threads; i++) {
        for (unsigned b = 0; b < W_PER; b++) {
            if (ws[i].seed[b] != 0) {
                fprintf(writes, "%llu %u %llu\n", (unsigned long long) ((W_BASE + (uint64_t) i * W_PER + b) * BS), BS,
                        (unsigned long long) ws[i].seed[b]);
            }
        }
    }
    fclose(writes);
    for (i = 0; i < N_Q; i++) {
        rc = nvm_pq_host_delete(c.ref, &c.q[i]);
        check_report(rc == 0, "delete queue pair %u: %s", i + 1, nvm_strerror(rc));
    }
    nvm_aq_destroy(c.ref);
    nvm_dma_unmap(win);
    nvm_ctrl_free(ctrl);
    if (check_failures) {
        printf("not ok - vm_pq: %d failure(s)\n", check_failures);
        return 1;
    }
    printf("ok - vm_pq: nvm_pq on %u CPU threads against QEMU NVMe\n", c.threads);
    return 0;
}
