/*
 * The GPU test's controller emulator (ctrl_emu.h) driven by nvm_pq.h on CPU threads: checks the
 * emulator itself (and the queue once more) where there is no GPU. Same rules as pq_gpu.cu's
 * verify run: out of order, 1% injected statuses predicted by the issuer, every payload checked,
 * own-block writes read back, a stuck command timing out and completing late.
 *
 * Then the controller alone: one CPU thread plays a fast host on one 1024-entry queue (raw ring
 * accesses, 1-block reads into a 32 MiB buffer area, one doorbell per batch) so the emulator's
 * own cost per command shows, the ceiling of one controller thread in the GPU benchmark.
 *
 * Usage: emu_host [threads=16] [commands per thread=2000] [controller-alone commands=2000000]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <nvm_pq.h>
#include "ctrl_emu.h"

#include <stdio.h>
#include <stdlib.h>

#define NQ 3
static emu_t* emu;
static nvm_pq_t qs[NQ];
static uint32_t bar[0x1000 / 4 + 16];
static int failures;
static unsigned per;

#define EXPECT(c, ...) do { if (!(c)) { __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED); printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static void fill_rw(nvm_cmd_t* c, uint8_t opc, uint64_t slba, uint32_t nb, uint64_t prp1, uint32_t tag)
{
    memset(c, 0, sizeof(*c));
    c->dword[0] = opc;
    c->dword[1] = 1;
    c->dword[6] = (uint32_t) prp1;
    c->dword[7] = (uint32_t) (prp1 >> 32);
    c->dword[10] = (uint32_t) slba;
    c->dword[11] = (uint32_t) (slba >> 32);
    c->dword[12] = nb - 1;
    c->dword[15] = tag;
}

static uint64_t cnt_ok, cnt_err, cnt_bad;

static void* worker(void* arg)
{
    uint32_t tid = (uint32_t) (uintptr_t) arg, stamp = 0, rng = emu_mix(tid + 1);
    uint64_t* buf = (uint64_t*) aligned_alloc(4096, 4096);
    const nvm_pq_t* q = &qs[nvm_pq_pick(NQ, tid)];
    nvm_cmd_t cmd;
    for (uint32_t k = 0; k < per; k++) {
        uint32_t tag = (tid * per + k) & 0x7FFFFFFFu;
        if (tag == 0) {
            tag = 1;
        }
        uint32_t inj = emu_injected_status(tag), kind = k % 8 == 6 ? 1u : (k % 8 == 7 ? 2u : 0u), nb = 1;
        uint64_t slba = EMU_W_BASE + tid;
        rng = emu_mix(rng + k);
        if (kind == 0) {
            nb = 1 + rng % 4u;
            slba = (uint64_t) (rng >> 2) % (EMU_W_BASE - 4);
        }
        for (int i = 0; i < 256; i++) {
            buf[i] = kind == 1 ? (((uint64_t) tid << 32) | (k << 8) | (uint32_t) i) : 0xDEADBEEFDEADBEEFull;
        }
        fill_rw(&cmd, kind == 1 ? 1 : 2, slba, nb, (uint64_t) (uintptr_t) buf, tag);
        nvm_pq_status_t r = nvm_pq_submit(q, &cmd, nvm_pq_deadline(10000000000ull), NULL, 0);
        uint32_t got = ((uint32_t) r.dnr << 15) | ((uint32_t) r.sct << 9) | ((uint32_t) r.sc << 1);
        if (r.err != 0 || got != inj) {
            EXPECT(0, "thread %u cmd %u: err %d status 0x%x, want 0x%x", tid, k, r.err, got, inj);
            __atomic_fetch_add(&cnt_bad, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (inj) {
            __atomic_fetch_add(&cnt_err, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (kind == 1) {
            stamp = k;
        } else {
            for (uint32_t i = 0; i < nb * 64; i++) {
                uint64_t want = (kind == 2 && stamp) ? (((uint64_t) tid << 32) | (stamp << 8) | i)
                                                     : emu_pattern((slba << 9) + i * 8);
                if (buf[i] != want) {
                    EXPECT(0, "thread %u cmd %u: word %u 0x%llx want 0x%llx", tid, k, i, (unsigned long long) buf[i],
                           (unsigned long long) want);
                    __atomic_fetch_add(&cnt_bad, 1, __ATOMIC_RELAXED);
                    break;
                }
            }
        }
        __atomic_fetch_add(&cnt_ok, 1, __ATOMIC_RELAXED);
    }
    free(buf);
    return NULL;
}

int main(int argc, char** argv)
{
    unsigned threads = argc > 1 ? (unsigned) atoi(argv[1]) : 16;
    const uint32_t depths[NQ] = {64, 37, 100};
    per = argc > 2 ? (unsigned) atoi(argv[2]) : 2000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    emu = (emu_t*) calloc(1, sizeof(emu_t));
    if (emu == NULL || emu_init(emu, 1u << 16) != 0) {
        return 2;
    }
    emu->out_of_order = 1;
    emu->inject = 1;
    for (int i = 0; i < NQ; i++) {
        void* sq = aligned_alloc(4096, 64u * 1024);
        void* cq = aligned_alloc(4096, 16u * 1024);
        void* ctl = aligned_alloc(128, nvm_pq_ctl_size(depths[i], depths[i]));
        memset(sq, 0, 64u * 1024);
        memset(cq, 0, 16u * 1024);
        memset(ctl, 0, nvm_pq_ctl_size(depths[i], depths[i]));
        volatile uint32_t* sdb = &bar[0x1000 / 4 + 2 * (i + 1)];
        volatile uint32_t* cdb = &bar[0x1000 / 4 + 2 * (i + 1) + 1];
        emu_queue_init(emu, i, (uint16_t) (i + 1), depths[i], depths[i], sq, cq, sdb, cdb);
        nvm_pq_t* q = &qs[i];
        memset(q, 0, sizeof(*q));
        q->version = NVM_PQ_VERSION;
        q->size = sizeof(nvm_pq_t);
        q->qid = (uint16_t) (i + 1);
        q->nsid = 1;
        q->sq_entries = q->cq_entries = q->n_cids = depths[i];
        q->max_inflight = depths[i] - 1;
        q->page_size = 4096;
        q->sq = (volatile nvm_cmd_t*) sq;
        q->cq = (volatile nvm_cpl_t*) cq;
        q->sq_db = sdb;
        q->cq_db = cdb;
        nvm_pq_ctl_layout(q, ctl);
    }
    emu_start(emu, 2);

    pthread_t th[256];
    uint64_t t0 = nvm_pq_now();
    for (unsigned i = 0; i < threads; i++) {
        pthread_create(&th[i], NULL, worker, (void*) (uintptr_t) i);
    }
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
    }
    double secs = (nvm_pq_now() - t0) / 1e9;
    uint64_t n = (uint64_t) threads * per, injected = 0, fetched = 0, posted = 0, conflicts = 0, completions = 0,
             stray = 0;
    for (int i = 0; i < NQ; i++) {
        injected += emu->q[i].injected;
        fetched += emu->q[i].fetched;
        posted += emu->q[i].posted;
        conflicts += emu->q[i].cid_conflicts;
        completions += qs[i].state->completions;
        stray += qs[i].state->stray;
        EXPECT(qs[i].state->released == qs[i].state->ticket, "queue %d: credits not back", i);
    }
    printf("emu_host: %llu commands, %u threads, 3 queues (64/37/100), %.2f s: ok %llu, injected errors seen %llu "
           "(controller injected %llu), bad %llu; fetched %llu posted %llu consumed %llu, CID conflicts %llu, stray "
           "%llu\n",
           (unsigned long long) n, threads, secs, (unsigned long long) cnt_ok, (unsigned long long) cnt_err,
           (unsigned long long) injected, (unsigned long long) cnt_bad, (unsigned long long) fetched,
           (unsigned long long) posted, (unsigned long long) completions, (unsigned long long) conflicts,
           (unsigned long long) stray);
    EXPECT(cnt_ok + cnt_err == n && cnt_bad == 0, "results");
    EXPECT(cnt_err == injected && injected > 0, "injected errors");
    EXPECT(fetched == n && posted == n && completions == n && conflicts == 0 && stray == 0, "exactly once");

    /* Stuck command: times out at 20 ms, completes late after release. */
    {
        uint64_t* b = (uint64_t*) aligned_alloc(4096, 4096);
        nvm_cmd_t cmd;
        fill_rw(&cmd, 2, 5, 1, (uint64_t) (uintptr_t) b, EMU_TAG_STUCK | 9u);
        uint64_t s0 = nvm_pq_now();
        nvm_pq_status_t r = nvm_pq_submit(&qs[0], &cmd, s0 + 20000000ull, NULL, 0);
        uint64_t took = nvm_pq_now() - s0;
        printf("emu_host: stuck command: err %d after %.2f ms (deadline 20 ms)\n", r.err, took / 1e6);
        EXPECT(r.err == NVM_PQ_ETIME && took >= 20000000ull && took < 60000000ull, "stuck command timeout");
        emu->release_stuck = 1;
        for (int i = 0; i < 1000 && qs[0].state->late == 0; i++) {
            nvm_pq_status_t f = nvm_pq_flush(&qs[0], nvm_pq_deadline(1000000000ull));
            EXPECT(nvm_pq_ok(f), "flush after release");
        }
        EXPECT(qs[0].state->late == 1 && qs[0].state->released == qs[0].state->ticket && qs[0].state->stray == 0,
               "late completion");
        free(b);
    }
    emu_stop(emu);

    /* The controller alone. */
    {
        const uint32_t depth = 1024;
        uint64_t total = argc > 3 ? strtoull(argv[3], NULL, 0) : 2000000ull, sub = 0, done = 0;
        uint32_t* sq = (uint32_t*) aligned_alloc(4096, depth * 64u);
        uint32_t* cq = (uint32_t*) aligned_alloc(4096, depth * 16u);
        uint8_t* area = (uint8_t*) aligned_alloc(4096, 32u << 20);
        uint32_t tail = 0, head = 0, phase = 1, bad = 0;
        memset(sq, 0, depth * 64u);
        memset(cq, 0, depth * 16u);
        memset(area, 0, 32u << 20);
        memset(bar, 0, sizeof(bar));
        emu->out_of_order = 0;
        emu->inject = 0;
        emu->release_stuck = 0;
        emu->n_queues = 0;
        emu_queue_init(emu, 0, 1, depth, depth, sq, cq, &bar[0x1000 / 4 + 2], &bar[0x1000 / 4 + 3]);
        emu_start(emu, 1);
        uint64_t c0 = nvm_pq_now();
        while (done < total) {
            uint32_t n = 0;
            while (sub < total && sub - done < depth - 1 && n < 64) {
                nvm_cmd_t* c = (nvm_cmd_t*) (sq + 16u * tail);
                fill_rw(c, 2, sub % 1000000u, 1, (uint64_t) (uintptr_t) (area + (sub % 65536u) * 512u), 0);
                c->dword[0] |= (uint32_t) (sub % depth) << 16;
                if (++tail == depth) {
                    tail = 0;
                }
                sub++;
                n++;
            }
            if (n != 0) {
                __atomic_store_n(&bar[0x1000 / 4 + 2], tail, __ATOMIC_RELEASE);
            }
            n = 0;
            for (;;) {
                uint32_t dw3 = __atomic_load_n(&cq[4u * head + 3], __ATOMIC_ACQUIRE);
                if (((dw3 >> 16) & 1u) != phase) {
                    break;
                }
                bad += (dw3 >> 17) != 0;
                if (++head == depth) {
                    head = 0;
                    phase ^= 1u;
                }
                done++;
                n++;
            }
            if (n != 0) {
                __atomic_store_n(&bar[0x1000 / 4 + 3], head, __ATOMIC_RELEASE);
            }
        }
        double secs = (nvm_pq_now() - c0) / 1e9;
        emu_stop(emu);
        printf("emu_host: controller alone: %llu reads on one 1024-entry queue, %.3f s, %.2f Mcmd/s; controller busy "
               "%.0f ns per command (%.0f%% of the run), ceiling %.2f Mcmd/s per controller thread\n",
               (unsigned long long) total, secs, total / secs / 1e6, (double) emu->q[0].busy_ns / emu->q[0].fetched,
               100.0 * emu->q[0].busy_ns / 1e9 / secs, emu->q[0].fetched * 1e3 / (double) emu->q[0].busy_ns);
        EXPECT(bad == 0 && emu->q[0].fetched == total && emu->q[0].cid_conflicts == 0, "controller alone: %u errors", bad);
        free(sq);
        free(cq);
        free(area);
    }
    if (failures) {
        printf("FAIL: %d\n", failures);
        return 1;
    }
    printf("PASS: emu_host\n");
    return 0;
}
