/*
 * nvm_pq.h: a shared NVMe queue pair for many threads (gpudirect-rs), header-only.
 *
 * Many GPU threads (or, built for the host, many CPU threads) share one I/O submission/completion
 * queue pair created with libnvm. Every caller gets the NVMe status of its own command
 * ({SCT, SC, DNR, DW0}) or a timeout; nothing waits forever. Compiles as C (C99 + GCC atomics),
 * C++ and CUDA (every function __host__ __device__ under nvcc, except the nvm_pq_host_* helpers,
 * which are host only). This is not BaM's nvm_parallel_queue.h: the names and the handle differ.
 *
 * ---------------------------------------------------------------------------------------------
 * RULES (docs/gpu-queue.md says the same with the reasoning)
 *
 * Who may call what
 *   - nvm_pq_read / nvm_pq_write / nvm_pq_flush / nvm_pq_submit: any number of threads, any
 *     mix, concurrently, on the same nvm_pq_t (each thread may use its own copy of the POD
 *     handle: all shared state lives behind its pointers).
 *   - nvm_pq_host_create / nvm_pq_host_reset / nvm_pq_host_delete: one host thread, only while no
 *     thread is inside any other nvm_pq_* call on that queue (the kernel that uses it finished).
 *   - Queue memory: the rings (sq, cq) need bus addresses; the control block (state, cids, ready)
 *     only needs to be reachable by every calling thread. Put the control block in GPU memory for
 *     GPU callers; the rings in GPU memory (a real SSD DMAs into it) or pinned host memory.
 *
 * How it works
 *   - Tickets and admission: a caller takes ticket t (fetch-add) and may write SQ slot
 *     t % sq_entries once t < released + max_inflight, where max_inflight =
 *     min(sq_entries, cq_entries) - 1 and `released` counts commands whose completion was
 *     consumed (after the CQ head doorbell passed it). Admission is in ticket order, one waiter
 *     per returned credit; waiters sleep in proportion to their distance. A completion of any
 *     ticket u implies the controller fetched every ticket <= u (SQs are fetched in order), so
 *     with at most sq_entries-1 admitted beyond `released` the slot is free: any depth works,
 *     not only powers of two.
 *   - CIDs: the caller claims a CID (first try t % n_cids) by CAS FREE(g) -> INFLIGHT(g) in the
 *     CID's 64-bit state word (generation g in bits 15:2). Every non-free CID belongs to an admitted,
 *     unreleased ticket, so a free CID always exists. The command is written in place into its
 *     slot, then ready[slot] = t+1.
 *   - Doorbell: whoever holds sq_lock advances `published` over every consecutive written slot
 *     and writes the SQ tail doorbell once for the run.
 *   - Completions: whoever holds cq_lock reads runs of new CQEs (phase tag), writes the CQ head
 *     doorbell once per run, then routes each CQE by CID: INFLIGHT(g) -> DONE(g) with the
 *     status and dword 0 packed into the same 64-bit CID word (one CAS). On the GPU the lanes
 *     of a warp that wait on the same queue drain together: one takes the lock, each reads one
 *     CQE (the reads across PCIe overlap) and routes it. The issuer sees DONE(g) with its result
 *     in the same load, sets FREE(g+1) and counts itself released.
 *   - Deadlines: every wait compares the clock (the GPU's %globaltimer, CLOCK_MONOTONIC on the
 *     host) with an absolute deadline in nanoseconds, and returns NVM_PQ_ETIME when it passes.
 *
 * What a timeout leaves behind
 *   - Before admission: the ticket becomes a hole (hole[slot] = t+1). Once the ticket is
 *     admitted a publisher writes a Flush into the slot under a CID that is abandoned from the
 *     start (counted in state->holes); its completion returns the credit. Nothing of the
 *     caller's is used: its buffer is free at once.
 *   - After admission: the command is in the SQ (announced or about to be) or inside the
 *     controller. The waiter CASes INFLIGHT(g) -> ABANDONED(g); the CID is not reused and its
 *     credit stays taken until the completion arrives, when the router frees the CID (counted in
 *     state->late) and touches no other caller's result. Until then the controller may still
 *     DMA into the caller's data buffer and read the CID's PRP-list page: the caller must not
 *     reuse that buffer before the queue has drained or been reset. A command that never
 *     completes keeps its credit until nvm_pq_host_reset.
 *   - If the CAS loses to DONE, the wait returns the result instead (it completed in time).
 *
 * Memory ordering
 *   - Command dwords are stored, then a system-scope fence (fence.acq_rel.sys on the GPU), then
 *     ready[slot]; the doorbell writer reads the marks (relaxed), fences at system scope and
 *     writes the doorbell.
 *   - The drainer reads each CQE (on the GPU with one 16-byte load, dword 3 with the phase
 *     written last by the controller; on the host dword 3, a fence, then dword 0), fences at
 *     system scope and writes the CQ head doorbell before it routes.
 *   - A CID word carries the whole result, so relaxed CASes and loads suffice for it; locks are
 *     acquire/release, `released` is incremented with release and read with acquire. Statistics
 *     are relaxed (exact once the queue is quiet). Host code uses GCC __atomic builtins with
 *     the same or stronger orders.
 *
 * Errors returned in nvm_pq_status_t.err: 0 (the controller completed it; see sct/sc/dnr/dw0),
 * NVM_PQ_ETIME (deadline passed), NVM_PQ_EINVAL (bad argument: e.g. a transfer needing more
 * than one PRP-list page, or a handle whose version/size does not match this header).
 * ---------------------------------------------------------------------------------------------
 */
#ifndef __NVM_PQ_H__
#define __NVM_PQ_H__

#include "nvm_types.h"
#include "nvm_util.h"
#include <stddef.h>
#include <stdint.h>

#include <string.h>
#include <time.h>
#include <sched.h>

/* On the host the waits use POSIX clocks and sleeps (clock_gettime(CLOCK_MONOTONIC), nanosleep,
 * sched_yield). glibc declares them in strict ISO C modes (-std=c11) only with a POSIX feature
 * macro: say so here rather than as implicit-declaration errors further down. */
#if !defined(__CUDA_ARCH__) && defined(__GLIBC__) && !defined(CLOCK_MONOTONIC)
#error "nvm_pq.h needs POSIX clocks on the host: build with -D_POSIX_C_SOURCE=200809L (or -std=gnu11)"
#endif

#if defined(__CUDACC__)
#define _NVM_PQ_HD __host__ __device__ static inline
#define _NVM_PQ_H  __host__ static inline
#else
#define _NVM_PQ_HD static inline
#define _NVM_PQ_H  static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the handle layout; nvm_pq_t.version must equal it. */
#define NVM_PQ_VERSION          1u

/* Errors (positive errno values, as libnvm returns errno values). */
#define NVM_PQ_ETIME            62      /* ETIME: the deadline passed */
#define NVM_PQ_EINVAL           22      /* EINVAL */

/* CID state (bits 1:0 of nvm_pq_cid_t.state; generation in bits 15:2). */
#define NVM_PQ_CID_FREE         0u
#define NVM_PQ_CID_INFLIGHT     1u
#define NVM_PQ_CID_DONE         2u
#define NVM_PQ_CID_ABANDONED    3u

/* Most CQEs one completion run consumes before it writes the head doorbell. */
#ifndef NVM_PQ_DRAIN_MAX
#define NVM_PQ_DRAIN_MAX        16
#endif

/* What every caller gets back. */
typedef struct nvm_pq_status
{
    int32_t                 err;    /* 0: completed (see below); NVM_PQ_ETIME; NVM_PQ_EINVAL */
    uint8_t                 sct;    /* status code type */
    uint8_t                 sc;     /* status code */
    uint8_t                 dnr;    /* do not retry */
    uint8_t                 more;   /* more information in the error log */
    uint32_t                dw0;    /* command-specific dword 0 */
    uint16_t                cid;    /* the CID the command used (diagnostics) */
    uint16_t                pad;
} nvm_pq_status_t;

/* Per-CID record (16 bytes). The state word carries the whole result, so routing a completion
 * is one atomic and the issuer reads its result with the load that sees DONE. */
typedef struct nvm_pq_cid
{
    uint64_t                state;  /* dw0 << 32 | status << 16 | generation << 2 | NVM_PQ_CID_*;
                                       status (CQE dword 3 bits 31:17) and dw0 only when DONE */
    uint32_t                ticket; /* low 32 bits of the submission ticket (diagnostics) */
    uint32_t                _r0;
} nvm_pq_cid_t;

/*
 * Shared mutable state. All zeros is the initial state (so cudaMemset/memset initialises it).
 * Hot words sit on their own 128-byte lines.
 */
typedef struct nvm_pq_state
{
    uint64_t                ticket;         /* next submission ticket */
    uint8_t                 _p0[120];
    uint64_t                published;      /* tickets below it were announced by a doorbell */
    uint32_t                sq_lock;
    uint8_t                 _p1[116];
    uint64_t                released;       /* tickets whose credit came back (completed) */
    uint8_t                 _p2[120];
    uint32_t                cq_lock;
    uint32_t                cq_head;        /* under cq_lock */
    uint32_t                cq_phase_flip;  /* under cq_lock: expected phase is 1 ^ this */
    uint8_t                 _p3[116];
    /* Statistics (device-scope atomics; exact once the queue is quiet). */
    uint64_t                sq_doorbells;   /* SQ tail doorbell writes */
    uint64_t                cq_doorbells;   /* CQ head doorbell writes */
    uint64_t                completions;    /* CQEs consumed */
    uint64_t                late;           /* completions of abandoned (timed-out) commands */
    uint64_t                stray;          /* CQEs whose CID was not outstanding (controller bug) */
    uint64_t                timeouts;       /* waits that returned NVM_PQ_ETIME */
    uint64_t                holes;          /* tickets given up before admission, filled with a Flush */
} nvm_pq_state_t;

/*
 * The POD handle the host fills in and copies to the GPU (cudaMemcpy or a kernel argument).
 * Pointers are addresses as the calling threads see them (device pointers for GPU callers).
 */
typedef struct nvm_pq
{
    uint32_t                version;        /* NVM_PQ_VERSION */
    uint32_t                size;           /* sizeof(nvm_pq_t) */
    uint16_t                qid;            /* I/O queue pair id (SQ and CQ share it) */
    uint16_t                flags;          /* reserved, 0 */
    uint32_t                nsid;           /* namespace the read/write/flush helpers use */
    uint32_t                sq_entries;     /* SQ ring entries (2 .. MQES+1, any value) */
    uint32_t                cq_entries;     /* CQ ring entries (2 .. MQES+1) */
    uint32_t                max_inflight;   /* min(sq_entries, cq_entries) - 1 */
    uint32_t                n_cids;         /* CIDs 0 .. n_cids-1, n_cids > max_inflight */
    uint32_t                page_size;      /* controller page size (PRP math) */
    uint32_t                _r0;
    volatile nvm_cmd_t*     sq;             /* SQ ring */
    volatile nvm_cpl_t*     cq;             /* CQ ring */
    volatile uint32_t*      sq_db;          /* SQ tail doorbell (BAR0, registered for the GPU) */
    volatile uint32_t*      cq_db;          /* CQ head doorbell */
    nvm_pq_state_t*         state;          /* control block */
    nvm_pq_cid_t*           cids;           /* n_cids records */
    uint32_t*               ready;          /* sq_entries words: t+1 once ticket t's entry is written */
    uint32_t*               hole;           /* sq_entries words: t+1 if ticket t was given up */
    void*                   prp_vaddr;      /* PRP-list pool: one page per CID (may be NULL) */
    uint64_t                prp_ioaddr;     /* bus address of the pool's first page */
    uint64_t                sq_ioaddr;      /* bus addresses of the rings (host re-creation) */
    uint64_t                cq_ioaddr;
} nvm_pq_t;

/* Bytes of the control block for a queue (state + cids + ready + hole), 128-byte aligned. */
_NVM_PQ_HD size_t nvm_pq_ctl_size(uint32_t sq_entries, uint32_t n_cids)
{
    size_t n = sizeof(nvm_pq_state_t) + (size_t) n_cids * sizeof(nvm_pq_cid_t)
             + (size_t) sq_entries * 2u * sizeof(uint32_t);
    return (n + 127) & ~(size_t) 127;
}

/* Points q->state, cids, ready and hole into a control block of nvm_pq_ctl_size() bytes
 * (q->sq_entries and q->n_cids set first). */
_NVM_PQ_HD void nvm_pq_ctl_layout(nvm_pq_t* q, void* ctl)
{
    q->state = (nvm_pq_state_t*) ctl;
    q->cids = (nvm_pq_cid_t*) ((unsigned char*) ctl + sizeof(nvm_pq_state_t));
    q->ready = (uint32_t*) ((unsigned char*) q->cids + (size_t) q->n_cids * sizeof(nvm_pq_cid_t));
    q->hole = q->ready + q->sq_entries;
}

/* True when a completed command reported success. */
_NVM_PQ_HD int nvm_pq_ok(nvm_pq_status_t s)
{
    return s.err == 0 && s.sct == 0 && s.sc == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Portability layer: atomics, fences, clock, pause.                                            */
/*
 * The primitives by purpose (device: PTX at GPU scope; host: GCC __atomic builtins):
 *   _nvm_pq_ld32/64      polling load          ld.acquire.gpu        __ATOMIC_ACQUIRE
 *   _nvm_pq_ldr32/64     batch load, a fence   ld.relaxed.gpu        __ATOMIC_ACQUIRE
 *                        (or a CAS) follows
 *   _nvm_pq_st32/64      plain shared store    st.relaxed.gpu        __ATOMIC_RELEASE
 *   _nvm_pq_lock/unlock  sq_lock, cq_lock      atom.acquire.gpu.cas, __ATOMIC_ACQUIRE CAS,
 *                                              st.release.gpu        __ATOMIC_RELEASE store
 *   _nvm_pq_cas64        CID word; old value   atom.relaxed.gpu.cas  __ATOMIC_ACQ_REL
 *   _nvm_pq_faa64        ticket; old value     atom.relaxed.gpu.add  __ATOMIC_ACQ_REL
 *   _nvm_pq_credit       released += n         red.release.gpu.add   __ATOMIC_RELEASE add
 *   _nvm_pq_count        statistics += n       red.relaxed.gpu.add   __ATOMIC_RELAXED add
 *   _nvm_pq_fence_sys    rings and doorbells   fence.acq_rel.sys     __ATOMIC_SEQ_CST fence
 * Relaxed device operations are enough where the value itself is the message (a CID word
 * carries the whole result) or where a fence or an acquire CAS orders them; a release-acquire
 * pair is used where other memory must become visible with a word (locks, credits).
 */

#if defined(__CUDA_ARCH__)

__device__ static inline uint32_t _nvm_pq_ld32(const uint32_t* p)
{
    uint32_t v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ static inline uint64_t _nvm_pq_ld64(const uint64_t* p)
{
    uint64_t v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ static inline uint32_t _nvm_pq_ldr32(const uint32_t* p)
{
    uint32_t v;
    asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ static inline uint64_t _nvm_pq_ldr64(const uint64_t* p)
{
    uint64_t v;
    asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ static inline void _nvm_pq_st32(uint32_t* p, uint32_t v)
{
    asm volatile("st.relaxed.gpu.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ static inline void _nvm_pq_st64(uint64_t* p, uint64_t v)
{
    asm volatile("st.relaxed.gpu.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ static inline int _nvm_pq_lock(uint32_t* p)
{
    uint32_t old;
    if (_nvm_pq_ldr32(p) != 0) {
        return 0;
    }
    asm volatile("atom.acquire.gpu.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(0u), "r"(1u) : "memory");
    return old == 0;
}
__device__ static inline void _nvm_pq_unlock(uint32_t* p)
{
    asm volatile("st.release.gpu.u32 [%0], %1;" : : "l"(p), "r"(0u) : "memory");
}
__device__ static inline uint64_t _nvm_pq_cas64(uint64_t* p, uint64_t expect, uint64_t desired)
{
    uint64_t old;
    asm volatile("atom.relaxed.gpu.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(p), "l"(expect), "l"(desired) : "memory");
    return old;
}
__device__ static inline uint64_t _nvm_pq_faa64(uint64_t* p, uint64_t v)
{
    uint64_t old;
    asm volatile("atom.relaxed.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}
__device__ static inline void _nvm_pq_credit(uint64_t* p, uint64_t v)
{
    asm volatile("red.release.gpu.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ static inline void _nvm_pq_count(uint64_t* p, uint64_t v)
{
    asm volatile("red.relaxed.gpu.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ static inline void _nvm_pq_fence_sys(void)
{
    asm volatile("fence.acq_rel.sys;" : : : "memory");
}
__device__ static inline uint64_t _nvm_pq_now(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Between two passes of a completion waiter. One that held the lock goes round again at once
 * (its pass read the CQ across PCIe); one that found it taken sleeps. */
__device__ static inline void _nvm_pq_pause(uint32_t round, int held)
{
    if (!held) {
        __nanosleep(round < 8 ? 32u : (round < 64 ? 128u : 512u));
    }
}
/* Waiting for admission `distance` tickets away: sleep about 250 ns per ticket ahead (a queue
 * completes a command every microsecond or so), at most 500 us, so that tens of thousands of
 * waiters poll the released counter rarely and the next ones in line often. */
__device__ static inline void _nvm_pq_pause_admit(uint64_t distance, uint32_t round)
{
    (void) round;
    __nanosleep(distance > 2000u ? 500000u : (uint32_t) distance * 250u);
}

#else /* host: GCC/clang __atomic builtins */

static inline uint32_t _nvm_pq_ld32(const uint32_t* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t _nvm_pq_ld64(const uint64_t* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint32_t _nvm_pq_ldr32(const uint32_t* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t _nvm_pq_ldr64(const uint64_t* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void _nvm_pq_st32(uint32_t* p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void _nvm_pq_st64(uint64_t* p, uint64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline int _nvm_pq_lock(uint32_t* p)
{
    uint32_t expect = 0;
    if (__atomic_load_n(p, __ATOMIC_RELAXED) != 0) {
        return 0;
    }
    return __atomic_compare_exchange_n(p, &expect, 1u, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}
static inline void _nvm_pq_unlock(uint32_t* p)
{
    __atomic_store_n(p, 0u, __ATOMIC_RELEASE);
}
static inline uint64_t _nvm_pq_cas64(uint64_t* p, uint64_t expect, uint64_t desired)
{
    __atomic_compare_exchange_n(p, &expect, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return expect;
}
static inline uint64_t _nvm_pq_faa64(uint64_t* p, uint64_t v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
static inline void _nvm_pq_credit(uint64_t* p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}
static inline void _nvm_pq_count(uint64_t* p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline void _nvm_pq_fence_sys(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline uint64_t _nvm_pq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}
static inline void _nvm_pq_pause(uint32_t round, int held)
{
    /* Spinning CPU threads must leave the cores to the controller (or the thread that holds
     * a lock) when there are more threads than cores, lock holder or not. */
    (void) held;
    if (round < 8) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else if (round < 32) {
        sched_yield();
    } else {
        struct timespec ts = {0, round < 256 ? 20000 : 100000};
        nanosleep(&ts, NULL);
    }
}
static inline void _nvm_pq_pause_admit(uint64_t distance, uint32_t round)
{
    (void) distance;
    _nvm_pq_pause(round, 0);
}

#endif

/* Fields that only a lock holder reads and writes (published, cq_head, cq_phase_flip): volatile
 * accesses (on the GPU a plain load may hit a stale line in the SM's non-coherent L1 after
 * another SM changed the word), ordered by the lock's acquire and release. */
_NVM_PQ_HD uint32_t _nvm_pq_vld32(const uint32_t* p)
{
    return *(const volatile uint32_t*) p;
}
_NVM_PQ_HD void _nvm_pq_vst32(uint32_t* p, uint32_t v)
{
    *(volatile uint32_t*) p = v;
}

/* Nanoseconds on the clock the deadlines use (globaltimer on the GPU, CLOCK_MONOTONIC here). */
_NVM_PQ_HD uint64_t nvm_pq_now(void)
{
    return _nvm_pq_now();
}

/* An absolute deadline timeout_ns from now. */
_NVM_PQ_HD uint64_t nvm_pq_deadline(uint64_t timeout_ns)
{
    return _nvm_pq_now() + timeout_ns;
}

/* Picks one of n queues for the calling thread: by SM on the GPU (threads of an SM share a
 * queue), by the caller-supplied hint on the host. */
_NVM_PQ_HD uint32_t nvm_pq_pick(uint32_t n_queues, uint32_t host_hint)
{
#if defined(__CUDA_ARCH__)
    uint32_t smid;
    (void) host_hint;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    return n_queues ? smid % n_queues : 0;
#else
    return n_queues ? host_hint % n_queues : 0;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Internals.                                                                                   */

/* CID word fields (nvm_pq_cid_t.state). */
#define _NVM_PQ_GEN_MASK        0xFFFCull                   /* generation << 2 */
#define _NVM_PQ_ST(w)           ((uint32_t) (w) & 3u)
#define _NVM_PQ_NEXT_FREE(w)    (((w) + 4u) & _NVM_PQ_GEN_MASK)   /* FREE, generation + 1 */

/* Writes a 64-byte entry into SQ slot `slot` (four 16-byte write-through stores on the GPU:
 * few transactions when the ring is across PCIe). */
_NVM_PQ_HD void _nvm_pq_put_entry(const nvm_pq_t* q, uint32_t slot, const uint32_t* w)
{
#if defined(__CUDA_ARCH__)
    uint4* dst = (uint4*) (q->sq + slot);
    __stwt(dst + 0, make_uint4(w[0], w[1], w[2], w[3]));
    __stwt(dst + 1, make_uint4(w[4], w[5], w[6], w[7]));
    __stwt(dst + 2, make_uint4(w[8], w[9], w[10], w[11]));
    __stwt(dst + 3, make_uint4(w[12], w[13], w[14], w[15]));
#else
    volatile uint32_t* dst = (volatile uint32_t*) q->sq[slot].dword;
    uint32_t i;
    for (i = 0; i < 16; i++) {
        dst[i] = w[i];
    }
#endif
}

/* Claims a free CID (one exists: every non-free CID belongs to an admitted, unreleased ticket,
 * at most max_inflight < n_cids of them), starting at `hint`; returns it, state set to `to`. */
_NVM_PQ_HD uint32_t _nvm_pq_claim_cid(const nvm_pq_t* q, uint32_t hint, uint32_t to)
{
    uint32_t cid = hint;
    uint64_t s;
    for (;;) {
        s = _nvm_pq_ldr64(&q->cids[cid].state);
        if (_NVM_PQ_ST(s) == NVM_PQ_CID_FREE && _nvm_pq_cas64(&q->cids[cid].state, s, s | to) == s) {
            return cid;
        }
        if (++cid == q->n_cids) {
            cid = 0;
        }
    }
}

/* How many ready marks the publisher reads with independent loads at a time. */
#define _NVM_PQ_PUB_BATCH       16

/* Announces every consecutive written slot from `published` with one doorbell write. A ticket
 * given up before admission (a hole) gets a Flush, once admitted, so later entries can go.
 * Returns whether it held the lock. */
_NVM_PQ_HD int _nvm_pq_publish(const nvm_pq_t* q)
{
    nvm_pq_state_t* st = q->state;
    uint64_t p, start;
    uint32_t slot, holes = 0;

    if (!_nvm_pq_lock(&st->sq_lock)) {
        return 0;
    }
    start = p = *(const volatile uint64_t*) &st->published;
    slot = (uint32_t) (p % q->sq_entries);
    for (;;) {
        /* A batch of ready marks with independent (relaxed) loads: one L2 round trip rather
         * than one per slot. The system fence below orders them before the doorbell write (each
         * issuer fenced its entry before its mark). */
        uint32_t r[_NVM_PQ_PUB_BATCH], i, s = slot;
        for (i = 0; i < _NVM_PQ_PUB_BATCH; i++) {
            r[i] = _nvm_pq_ldr32(&q->ready[s]);
            if (++s == q->sq_entries) {
                s = 0;
            }
        }
        for (i = 0; i < _NVM_PQ_PUB_BATCH; i++) {
            if (r[i] != (uint32_t) (p + 1)) {
                break;
            }
            p++;
            if (++slot == q->sq_entries) {
                slot = 0;
            }
        }
        if (i == _NVM_PQ_PUB_BATCH) {
            continue;
        }
        if (_nvm_pq_ldr32(&q->hole[slot]) == (uint32_t) (p + 1)
            && p < _nvm_pq_ld64(&st->released) + q->max_inflight) {
            /* Admitted now: its CID is abandoned from the start, so the router frees it and
             * returns the credit when the Flush completes. */
            uint32_t w[16], cid = _nvm_pq_claim_cid(q, (uint32_t) (p % q->n_cids), NVM_PQ_CID_ABANDONED);
            for (i = 0; i < 16; i++) {
                w[i] = 0;
            }
            w[0] = cid << 16; /* Flush */
            w[1] = q->nsid;
            q->cids[cid].ticket = (uint32_t) p;
            _nvm_pq_put_entry(q, slot, w);
            holes++;
            p++;
            if (++slot == q->sq_entries) {
                slot = 0;
            }
            continue;
        }
        break;
    }
    if (p != start) {
        _nvm_pq_fence_sys();
        *q->sq_db = slot;
        *(volatile uint64_t*) &st->published = p;
        _nvm_pq_count(&st->sq_doorbells, 1);
        if (holes != 0) {
            _nvm_pq_count(&st->holes, holes);
        }
    }
    _nvm_pq_unlock(&st->sq_lock);
    return 1;
}

/* What _nvm_pq_routed returns for a CID that was not outstanding (no CID word has state
 * ABANDONED with every other bit set after routing). */
#define _NVM_PQ_STRAY           (~0ull)

/* The CID word a consumed CQE turns `s` into: INFLIGHT -> DONE with the result; ABANDONED ->
 * FREE, next generation; FREE or DONE (not outstanding: a stray) -> _NVM_PQ_STRAY. */
_NVM_PQ_HD uint64_t _nvm_pq_routed(uint64_t s, uint32_t dw3, uint32_t dw0)
{
    if (_NVM_PQ_ST(s) == NVM_PQ_CID_INFLIGHT) {
        return ((uint64_t) dw0 << 32) | ((uint64_t) (dw3 & 0xFFFE0000u)) | (s & _NVM_PQ_GEN_MASK) | NVM_PQ_CID_DONE;
    }
    if (_NVM_PQ_ST(s) == NVM_PQ_CID_ABANDONED) {
        return _NVM_PQ_NEXT_FREE(s);
    }
    return _NVM_PQ_STRAY;
}

/* Routes one consumed CQE with fresh loads (the slow path of a batch); returns 1 for a late
 * completion (credit back), 2 for a stray, 0 for a delivered result. */
_NVM_PQ_HD uint32_t _nvm_pq_route1(const nvm_pq_t* q, uint32_t dw3, uint32_t dw0)
{
    uint32_t cid = dw3 & 0xFFFFu;
    uint64_t s, w;
    if (cid >= q->n_cids) {
        return 2;
    }
    for (;;) {
        s = _nvm_pq_ldr64(&q->cids[cid].state);
        w = _nvm_pq_routed(s, dw3, dw0);
        if (w == _NVM_PQ_STRAY) {
            return 2;
        }
        if (_nvm_pq_cas64(&q->cids[cid].state, s, w) == s) {
            return _NVM_PQ_ST(s) == NVM_PQ_CID_ABANDONED ? 1u : 0u;
        }
    }
}

/* Reads CQ slot h. On the GPU: one 16-byte load for the whole entry, so dword 0 comes with the
 * phase in dword 3 (the controller writes dword 3 last, and an aligned 16-byte read is served
 * by one transaction: a new phase means a new dword 0). On the host: dword 3 only; the drain
 * reads dword 0 after a fence. */
/* (_NVM_PQ_CQE_LD and _NVM_PQ_NO_WARP_DRAIN exist to measure the alternatives that
 * docs/gpu-queue.md compares; leave them unset.) */
#ifndef _NVM_PQ_CQE_LD
#define _NVM_PQ_CQE_LD "ld.volatile.v4.u32"
#endif
_NVM_PQ_HD void _nvm_pq_cqe(const nvm_pq_t* q, uint32_t h, uint32_t* dw0, uint32_t* dw3)
{
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm volatile(_NVM_PQ_CQE_LD " {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(q->cq + h)
                 : "memory");
    *dw0 = v.x;
    *dw3 = v.w;
#else
    *dw0 = 0;
    *dw3 = q->cq[h].dword[3];
#endif
}

#if defined(__CUDA_ARCH__)
/*
 * The drain done by the lanes of a warp that call it together (mask: those lanes, at least
 * two): one of them takes the lock, each lane reads one CQ entry (one warp-wide load: the reads
 * across PCIe overlap, where one thread's reads follow each other) and routes it. Every lane in
 * mask returns whether the warp held the lock.
 */
__device__ static inline int _nvm_pq_drain_warp(const nvm_pq_t* q, uint32_t mask)
{
    nvm_pq_state_t* st = q->state;
    uint32_t lane, rank, cnt, win, leader, head = 0, flip = 0, runs, total = 0, dbs = 0, late = 0, stray = 0;

    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    rank = __popc(mask & ((1u << lane) - 1u));
    cnt = __popc(mask);
    /* No more entries than can be outstanding (each slot read at most once). */
    if (cnt > q->cq_entries - 1u) {
        cnt = q->cq_entries - 1u;
    }
    win = __ballot_sync(mask, rank == 0 && _nvm_pq_lock(&st->cq_lock));
    if (win == 0) {
        return 0;
    }
    leader = __ffs(win) - 1u;
    if (lane == leader) {
        head = _nvm_pq_vld32(&st->cq_head);
        flip = _nvm_pq_vld32(&st->cq_phase_flip);
    }
    head = __shfl_sync(mask, head, leader);
    flip = __shfl_sync(mask, flip, leader);
    for (runs = 0; runs < 8; runs++) {
        uint32_t dw0 = 0, dw3 = 0, valid = 0, vb, inval, n, k = 0;
        if (rank < cnt) {
            uint32_t h = head + rank, f = flip;
            if (h >= q->cq_entries) {
                h -= q->cq_entries;
                f ^= 1u;
            }
            _nvm_pq_cqe(q, h, &dw0, &dw3);
            valid = ((dw3 >> 16) & 1u) == (1u ^ f);
        }
        /* The consecutive valid entries from the head: ranks below the first invalid lane. */
        vb = __ballot_sync(mask, valid);
        inval = mask & ~vb;
        n = inval != 0 ? __popc(mask & ((1u << (__ffs(inval) - 1u)) - 1u)) : cnt;
        if (n > cnt) {
            n = cnt;
        }
        if (n == 0) {
            break;
        }
        /* Every lane's load has returned (the ballot used its value): the leader fences and
         * lets the controller reuse the slots, then the lanes route their entries. */
        head += n;
        if (head >= q->cq_entries) {
            head -= q->cq_entries;
            flip ^= 1u;
        }
        if (lane == leader) {
            _nvm_pq_fence_sys();
            *q->cq_db = head;
        }
        __syncwarp(mask);
        if (rank < n) {
            k = _nvm_pq_route1(q, dw3, dw0);
        }
        late += __popc(__ballot_sync(mask, k == 1u));
        stray += __popc(__ballot_sync(mask, k == 2u));
        total += n;
        dbs++;
        if (n < cnt) {
            break;
        }
    }
    if (lane == leader) {
        if (total != 0) {
            _nvm_pq_vst32(&st->cq_head, head);
            _nvm_pq_vst32(&st->cq_phase_flip, flip);
        }
        _nvm_pq_unlock(&st->cq_lock);
        if (total != 0) {
            _nvm_pq_count(&st->cq_doorbells, dbs);
            _nvm_pq_count(&st->completions, total);
            if (late != 0) {
                _nvm_pq_credit(&st->released, late);
                _nvm_pq_count(&st->late, late);
            }
            if (stray != 0) {
                _nvm_pq_count(&st->stray, stray);
            }
        }
    }
    __syncwarp(mask);
    return 1;
}
#endif

/* Consumes runs of new completions (if nobody else is): one CQ head doorbell per run, then
 * routes them (after the doorbell, so a credit comes back only once its CQ slot is free).
 * Returns whether it held the lock. */
_NVM_PQ_HD int _nvm_pq_drain(const nvm_pq_t* q)
{
    nvm_pq_state_t* st = q->state;
    uint32_t head, flip, n, i, runs, dbs = 0, late = 0, stray = 0, total = 0;
    uint32_t dw3[NVM_PQ_DRAIN_MAX];
    uint32_t dw0[NVM_PQ_DRAIN_MAX];
    uint64_t seen[NVM_PQ_DRAIN_MAX];
    uint64_t got[NVM_PQ_DRAIN_MAX];

#if defined(__CUDA_ARCH__) && !defined(_NVM_PQ_NO_WARP_DRAIN)
    {
        /* The lanes here together on the same queue. */
        uint32_t mask = __match_any_sync(__activemask(), (unsigned long long) (uintptr_t) q);
        if (__popc(mask) > 1) {
            return _nvm_pq_drain_warp(q, mask);
        }
    }
#endif
    if (!_nvm_pq_lock(&st->cq_lock)) {
        return 0;
    }
    head = _nvm_pq_vld32(&st->cq_head);
    flip = _nvm_pq_vld32(&st->cq_phase_flip);
    for (runs = 0; runs < 8; runs++) {
        uint32_t h = head, f = flip;
        /* Entry by entry, stopping at the first not yet written one: one thread's reads across
         * PCIe complete one after the other (about 1.5 us each on the H200), so reading ahead
         * only costs. */
        for (i = 0; i < NVM_PQ_DRAIN_MAX; i++) {
            uint32_t cid;
            _nvm_pq_cqe(q, h, &dw0[i], &dw3[i]);
            if (((dw3[i] >> 16) & 1u) != (1u ^ f)) {
                break;
            }
            cid = dw3[i] & 0xFFFFu;
            /* Early CID-word load; a stale one only makes its CAS fail, and then route1
             * decides with a fresh load. */
            seen[i] = cid < q->n_cids ? _nvm_pq_ldr64(&q->cids[cid].state) : 0;
            if (++h == q->cq_entries) {
                h = 0;
                f ^= 1u;
            }
        }
        n = i;
        if (n == 0) {
            break;
        }
        _nvm_pq_fence_sys();
#if !defined(__CUDA_ARCH__)
        /* Host: dword 0 after the phase, then a fence before the doorbell. */
        h = head;
        for (i = 0; i < n; i++) {
            dw0[i] = q->cq[h].dword[0];
            if (++h == q->cq_entries) {
                h = 0;
            }
        }
        _nvm_pq_fence_sys();
#endif
        head = h;
        flip = f;
        /* The entries are copied (the fence above ordered the loads): let the controller reuse
         * the slots. */
        *q->cq_db = head;
        total += n;
        dbs++;
        /* Route the batch: independent CASes issued back to back (one L2 round trip for the
         * batch, results compared afterwards); those that lost a race (a waiter abandoning its
         * CID) or saw a CID that did not look outstanding go through route1. */
        for (i = 0; i < n; i++) {
            uint32_t cid = dw3[i] & 0xFFFFu;
            uint64_t w = cid < q->n_cids ? _nvm_pq_routed(seen[i], dw3[i], dw0[i]) : _NVM_PQ_STRAY;
            got[i] = w != _NVM_PQ_STRAY ? _nvm_pq_cas64(&q->cids[cid].state, seen[i], w) : ~seen[i];
        }
        for (i = 0; i < n; i++) {
            uint32_t k;
            if (got[i] == seen[i]) {
                late += _NVM_PQ_ST(seen[i]) == NVM_PQ_CID_ABANDONED;
                continue;
            }
            k = _nvm_pq_route1(q, dw3[i], dw0[i]);
            late += k == 1u;
            stray += k == 2u;
        }
        if (n < NVM_PQ_DRAIN_MAX) {
            break;
        }
    }
    if (total != 0) {
        _nvm_pq_vst32(&st->cq_head, head);
        _nvm_pq_vst32(&st->cq_phase_flip, flip);
    }
    _nvm_pq_unlock(&st->cq_lock);
    if (total != 0) {
        _nvm_pq_count(&st->cq_doorbells, dbs);
        _nvm_pq_count(&st->completions, total);
        if (late != 0) {
            _nvm_pq_credit(&st->released, late);
            _nvm_pq_count(&st->late, late);
        }
        if (stray != 0) {
            _nvm_pq_count(&st->stray, stray);
        }
    }
    return 1;
}

/* The result in a DONE word. */
_NVM_PQ_HD nvm_pq_status_t _nvm_pq_result(uint64_t w, uint16_t cid)
{
    nvm_pq_status_t r;
    uint32_t s = (uint32_t) (w >> 16) & 0xFFFFu;

    r.err = 0;
    r.sc = (uint8_t) ((s >> 1) & 0xFFu);
    r.sct = (uint8_t) ((s >> 9) & 0x7u);
    r.more = (uint8_t) ((s >> 14) & 1u);
    r.dnr = (uint8_t) ((s >> 15) & 1u);
    r.dw0 = (uint32_t) (w >> 32);
    r.cid = cid;
    r.pad = 0;
    return r;
}

_NVM_PQ_HD nvm_pq_status_t _nvm_pq_fail(int32_t err)
{
    nvm_pq_status_t r;
    r.err = err;
    r.sct = r.sc = r.dnr = r.more = 0;
    r.dw0 = 0;
    r.cid = 0xFFFFu;
    r.pad = 0;
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* The calls.                                                                                   */

/*
 * Submits *cmd (its CID field is replaced) and waits for its completion until `deadline`
 * (nvm_pq_now() clock, ns). `list_src`, if list_n != 0, is copied into the CID's PRP-list page
 * and PRP2 is pointed at it; the read/write helpers use it.
 */
_NVM_PQ_HD nvm_pq_status_t nvm_pq_submit(const nvm_pq_t* q, const nvm_cmd_t* cmd, uint64_t deadline,
                                         const uint64_t* list_src, uint32_t list_n)
{
    nvm_pq_state_t* st;
    nvm_pq_cid_t* c;
    uint64_t t, s;
    uint32_t cid, slot, i, round = 0;

    if (q == NULL || cmd == NULL || q->version != NVM_PQ_VERSION || q->size != sizeof(nvm_pq_t)
        || q->max_inflight == 0 || q->n_cids <= q->max_inflight || q->n_cids > 65536u) {
        return _nvm_pq_fail(NVM_PQ_EINVAL);
    }
    st = q->state;

    /* 1. A ticket, then admission in ticket order: ticket t may write its slot once
     * t < released + max_inflight. Waiters sleep in proportion to their distance, so tens of
     * thousands of them poll one word rarely. A waiter whose deadline passes first leaves a
     * hole mark; a publisher fills the slot with a Flush once the ticket is admitted. */
    t = _nvm_pq_faa64(&st->ticket, 1);
    slot = (uint32_t) (t % q->sq_entries);
    {
        uint64_t since = 0, now, rel;
        for (;;) {
            rel = _nvm_pq_ld64(&st->released);
            if (t < rel + q->max_inflight) {
                break;
            }
            now = _nvm_pq_now();
            if (now > deadline) {
                _nvm_pq_st32(&q->hole[slot], (uint32_t) (t + 1));
                _nvm_pq_count(&st->timeouts, 1);
                /* The hole may be admitted already: let a publisher fill it. */
                _nvm_pq_publish(q);
                return _nvm_pq_fail(NVM_PQ_ETIME);
            }
            if (since == 0) {
                since = now;
            } else if (now - since > 1000000ull) {
                /* Credits held only by abandoned commands come back only through a drain. */
                _nvm_pq_drain(q);
                _nvm_pq_publish(q);
            }
            _nvm_pq_pause_admit(t - (rel + q->max_inflight) + 1u, round++);
        }
    }

    /* 2. A CID (first try t % n_cids). */
    cid = _nvm_pq_claim_cid(q, (uint32_t) (t % q->n_cids), NVM_PQ_CID_INFLIGHT);
    c = &q->cids[cid];
    c->ticket = (uint32_t) t;

    /* 3. The PRP list (in the CID's own page: it stays untouched while the CID is taken). */
    if (list_n != 0) {
        volatile uint64_t* list = (volatile uint64_t*) ((unsigned char*) q->prp_vaddr + (size_t) cid * q->page_size);
        for (i = 0; i < list_n; i++) {
            list[i] = list_src[i];
        }
    }

    /* 4. The command, in place, then the slot's ready mark. */
    {
        uint32_t w[16];
        for (i = 0; i < 16; i++) {
            w[i] = cmd->dword[i];
        }
        w[0] = (w[0] & 0xFFFFu) | (cid << 16);
        if (list_n != 0) {
            uint64_t lio = q->prp_ioaddr + (uint64_t) cid * q->page_size;
            w[8] = (uint32_t) lio;
            w[9] = (uint32_t) (lio >> 32);
        }
        _nvm_pq_put_entry(q, slot, w);
    }
    _nvm_pq_fence_sys();
    _nvm_pq_st32(&q->ready[slot], (uint32_t) (t + 1));

    /* 5. Announced (by us or another thread), then our completion routed to our CID word.
     * Until our ticket is announced we try to publish; after that we try to drain. */
    {
        uint64_t since = 0, now;
        for (;;) {
            int held;
            s = _nvm_pq_ld64(&c->state);
            if (_NVM_PQ_ST(s) == NVM_PQ_CID_DONE) {
                nvm_pq_status_t r = _nvm_pq_result(s, (uint16_t) cid);
                _nvm_pq_st64(&c->state, _NVM_PQ_NEXT_FREE(s));
                _nvm_pq_credit(&st->released, 1);
                return r;
            }
            now = _nvm_pq_now();
            if (now > deadline) {
                if (_nvm_pq_cas64(&c->state, s, (s & _NVM_PQ_GEN_MASK) | NVM_PQ_CID_ABANDONED) == s) {
                    nvm_pq_status_t r = _nvm_pq_fail(NVM_PQ_ETIME);
                    r.cid = (uint16_t) cid;
                    _nvm_pq_count(&st->timeouts, 1);
                    return r;
                }
                continue;
            }
            if (*(const volatile uint64_t*) &st->published <= t) {
                held = _nvm_pq_publish(q);
                /* Waiting behind a hole: its admission needs credits back, i.e. a drain. */
                if (since == 0) {
                    since = now;
                } else if (now - since > 1000000ull) {
                    held |= _nvm_pq_drain(q);
                }
            } else {
                held = _nvm_pq_drain(q);
            }
            _nvm_pq_pause(round++, held);
        }
    }
}

/*
 * Read or write n_blks blocks at slba. pages[] holds the bus address of each controller page of
 * the buffer (pages[0] may carry an offset); n_pages of them. With more than 2 pages the list
 * goes into the CID's PRP-list page (at most page_size/8 entries: no chaining).
 */
_NVM_PQ_HD nvm_pq_status_t nvm_pq_rw(const nvm_pq_t* q, uint8_t opcode, uint64_t slba, uint16_t n_blks,
                                     const uint64_t* pages, uint32_t n_pages, uint64_t deadline)
{
    nvm_cmd_t cmd;
    uint32_t i, list_n = 0;

    if (q == NULL || pages == NULL || n_pages == 0 || n_blks == 0) {
        return _nvm_pq_fail(NVM_PQ_EINVAL);
    }
    if (n_pages > 2) {
        list_n = n_pages - 1;
        if (q->prp_vaddr == NULL || list_n > q->page_size / 8u) {
            return _nvm_pq_fail(NVM_PQ_EINVAL);
        }
    }
    for (i = 0; i < 16; i++) {
        cmd.dword[i] = 0;
    }
    cmd.dword[0] = opcode;
    cmd.dword[1] = q->nsid;
    cmd.dword[6] = (uint32_t) pages[0];
    cmd.dword[7] = (uint32_t) (pages[0] >> 32);
    if (n_pages == 2) {
        cmd.dword[8] = (uint32_t) pages[1];
        cmd.dword[9] = (uint32_t) (pages[1] >> 32);
    }
    cmd.dword[10] = (uint32_t) slba;
    cmd.dword[11] = (uint32_t) (slba >> 32);
    cmd.dword[12] = (uint32_t) (n_blks - 1u);
    return nvm_pq_submit(q, &cmd, deadline, list_n ? pages + 1 : NULL, list_n);
}

_NVM_PQ_HD nvm_pq_status_t nvm_pq_read(const nvm_pq_t* q, uint64_t slba, uint16_t n_blks, const uint64_t* pages,
                                       uint32_t n_pages, uint64_t deadline)
{
    return nvm_pq_rw(q, 0x02, slba, n_blks, pages, n_pages, deadline);
}

_NVM_PQ_HD nvm_pq_status_t nvm_pq_write(const nvm_pq_t* q, uint64_t slba, uint16_t n_blks, const uint64_t* pages,
                                        uint32_t n_pages, uint64_t deadline)
{
    return nvm_pq_rw(q, 0x01, slba, n_blks, pages, n_pages, deadline);
}

_NVM_PQ_HD nvm_pq_status_t nvm_pq_flush(const nvm_pq_t* q, uint64_t deadline)
{
    nvm_cmd_t cmd;
    uint32_t i;

    if (q == NULL) {
        return _nvm_pq_fail(NVM_PQ_EINVAL);
    }
    for (i = 0; i < 16; i++) {
        cmd.dword[i] = 0;
    }
    cmd.dword[1] = q->nsid;
    return nvm_pq_submit(q, &cmd, deadline, NULL, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Host setup and recovery (host only; they call libnvm's nvm_raw_rpc, so link libnvm).         */

/* (Host functions: under nvcc they are __host__ and exist in both compilation passes, so host
 * code in a .cu file can call them.) */

/* libnvm's admin entry point (declared in nvm_rpc.h as well). */
int nvm_raw_rpc(nvm_aq_ref ref, nvm_cmd_t* cmd, nvm_cpl_t* cpl);

/* Where a queue's memory is. Rings: page aligned, zeroed by nvm_pq_host_create through
 * `zero`. Pointers are as the calling threads will see them; host_* pointers, if not NULL, are
 * host-writable aliases (pinned memory), else `zero` is used. */
typedef struct nvm_pq_mem
{
    void*                   sq_vaddr;       /* sq_entries * 64 bytes */
    uint64_t                sq_ioaddr;
    void*                   cq_vaddr;       /* cq_entries * 16 bytes */
    uint64_t                cq_ioaddr;
    void*                   ctl_vaddr;      /* nvm_pq_ctl_size(sq_entries, n_cids) bytes, 128 B aligned */
    void*                   prp_vaddr;      /* n_cids pages or NULL */
    uint64_t                prp_ioaddr;
    volatile uint32_t*      sq_db;          /* doorbells as the calling threads address them */
    volatile uint32_t*      cq_db;
    /* Zeroes len bytes at ptr (a calling-thread address); NULL means memset (host memory). */
    int                   (*zero)(void* ptr, size_t len, void* arg);
    void*                   zero_arg;
} nvm_pq_mem_t;

_NVM_PQ_H int _nvm_pq_zero(const nvm_pq_mem_t* m, void* p, size_t n)
{
    if (m->zero != NULL) {
        return m->zero(p, n, m->zero_arg);
    }
    memset(p, 0, n);
    return 0;
}

_NVM_PQ_H int _nvm_pq_admin(nvm_aq_ref ref, uint8_t opc, uint64_t prp1, uint32_t cdw10, uint32_t cdw11)
{
    nvm_cmd_t cmd;
    nvm_cpl_t cpl;
    memset(&cmd, 0, sizeof(cmd));
    memset(&cpl, 0, sizeof(cpl));
    cmd.dword[0] = opc;
    cmd.dword[6] = (uint32_t) prp1;
    cmd.dword[7] = (uint32_t) (prp1 >> 32);
    cmd.dword[10] = cdw10;
    cmd.dword[11] = cdw11;
    return nvm_raw_rpc(ref, &cmd, &cpl);
}

/* Zeroes the rings and the control block and creates CQ qid then SQ qid on the controller. */
_NVM_PQ_H int _nvm_pq_host_bringup(nvm_aq_ref ref, const nvm_pq_t* q, const nvm_pq_mem_t* m)
{
    int rc;
    if ((rc = _nvm_pq_zero(m, m->sq_vaddr, (size_t) q->sq_entries * 64)) != 0
        || (rc = _nvm_pq_zero(m, m->cq_vaddr, (size_t) q->cq_entries * 16)) != 0
        || (rc = _nvm_pq_zero(m, m->ctl_vaddr, nvm_pq_ctl_size(q->sq_entries, q->n_cids))) != 0) {
        return rc;
    }
    /* Create I/O CQ: PC = 1, no interrupts. */
    rc = _nvm_pq_admin(ref, 0x05, q->cq_ioaddr, ((q->cq_entries - 1u) << 16) | q->qid, 1u);
    if (rc != 0) {
        return rc;
    }
    /* Create I/O SQ bound to it: PC = 1. */
    rc = _nvm_pq_admin(ref, 0x01, q->sq_ioaddr, ((q->sq_entries - 1u) << 16) | q->qid,
                       ((uint32_t) q->qid << 16) | 1u);
    if (rc != 0) {
        _nvm_pq_admin(ref, 0x04, 0, q->qid, 0);
    }
    return rc;
}

/*
 * Creates I/O queue pair `qid` with the given ring sizes (any value from 2 to the controller's
 * MQES+1; the CQ at least as large as the SQ is the usual choice) and fills in the handle *q.
 * Returns 0, an errno (EINVAL for bad sizes) or libnvm's packed NVMe status (< 0).
 */
_NVM_PQ_H int nvm_pq_host_create(nvm_aq_ref ref, const nvm_ctrl_t* ctrl, uint16_t qid, uint32_t nsid,
                                 uint32_t sq_entries, uint32_t cq_entries, const nvm_pq_mem_t* m, nvm_pq_t* q)
{
    uint32_t maxq;
    if (ref == NULL || ctrl == NULL || m == NULL || q == NULL || qid == 0 || m->sq_vaddr == NULL
        || m->cq_vaddr == NULL || m->ctl_vaddr == NULL || m->sq_db == NULL || m->cq_db == NULL) {
        return NVM_PQ_EINVAL;
    }
    maxq = ctrl->max_entries ? ctrl->max_entries : 65536u;
    if (sq_entries < 2 || cq_entries < 2 || sq_entries > maxq || cq_entries > maxq
        || ((uintptr_t) m->ctl_vaddr & 127u) != 0) {
        return NVM_PQ_EINVAL;
    }
    memset(q, 0, sizeof(*q));
    q->version = NVM_PQ_VERSION;
    q->size = sizeof(nvm_pq_t);
    q->qid = qid;
    q->nsid = nsid;
    q->sq_entries = sq_entries;
    q->cq_entries = cq_entries;
    q->max_inflight = (sq_entries < cq_entries ? sq_entries : cq_entries) - 1u;
    q->n_cids = sq_entries;
    q->page_size = (uint32_t) ctrl->page_size;
    q->sq = (volatile nvm_cmd_t*) m->sq_vaddr;
    q->cq = (volatile nvm_cpl_t*) m->cq_vaddr;
    q->sq_db = m->sq_db;
    q->cq_db = m->cq_db;
    nvm_pq_ctl_layout(q, m->ctl_vaddr);
    q->prp_vaddr = m->prp_vaddr;
    q->prp_ioaddr = m->prp_ioaddr;
    q->sq_ioaddr = m->sq_ioaddr;
    q->cq_ioaddr = m->cq_ioaddr;
    return _nvm_pq_host_bringup(ref, q, m);
}

/* Deletes the queue pair on the controller (SQ first, then CQ). */
_NVM_PQ_H int nvm_pq_host_delete(nvm_aq_ref ref, const nvm_pq_t* q)
{
    int rs, rc;
    if (ref == NULL || q == NULL) {
        return NVM_PQ_EINVAL;
    }
    rs = _nvm_pq_admin(ref, 0x00, 0, q->qid, 0);
    rc = _nvm_pq_admin(ref, 0x04, 0, q->qid, 0);
    return rs != 0 ? rs : rc;
}

/*
 * Recovers a queue whose commands are stuck: deletes the SQ and CQ on the controller (which
 * ends every command still in them), zeroes the rings and the control block (every CID FREE,
 * every credit back) and creates the pair again with the same memory. Call it only when no
 * thread is inside an nvm_pq_* call on this queue. Buffers of timed-out commands are free
 * again afterwards. Returns 0 or the first failing step's error.
 */
_NVM_PQ_H int nvm_pq_host_reset(nvm_aq_ref ref, const nvm_pq_t* q, const nvm_pq_mem_t* m)
{
    if (ref == NULL || q == NULL || m == NULL || q->version != NVM_PQ_VERSION || q->size != sizeof(nvm_pq_t)) {
        return NVM_PQ_EINVAL;
    }
    /* Deleting may fail if the controller already lost the queue; re-creation decides. */
    (void) nvm_pq_host_delete(ref, q);
    return _nvm_pq_host_bringup(ref, q, m);
}

#ifdef __cplusplus
}
#endif

#undef _NVM_PQ_HD
#undef _NVM_PQ_H

#endif /* __NVM_PQ_H__ */
