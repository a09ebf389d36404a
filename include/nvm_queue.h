/*
 * libnvm-compatible queue helpers (gpudirect-rs). The inline helpers are header-only and, under
 * nvcc, __host__ __device__. One thread (or one cooperating block) owns a queue: the helpers take
 * no locks.
 *
 * Unlike libnvm, the helpers order memory: nvm_sq_submit makes the ring entries visible before
 * the doorbell write, and a successful nvm_cq_poll orders the entry's other dwords after its
 * phase tag (a release/acquire fence on the host, __threadfence_system on the GPU).
 */
#ifndef __NVM_QUEUE_H__
#define __NVM_QUEUE_H__

#include "nvm_util.h"
#include "nvm_types.h"
#include <stdbool.h>

#if !defined(__CUDACC__) && !defined(__device__)
#define __device__
#define _NVM_QUEUE_UNDEF_DEVICE
#endif
#if !defined(__CUDACC__) && !defined(__host__)
#define __host__
#define _NVM_QUEUE_UNDEF_HOST
#endif

#if defined(__CUDA_ARCH__)
#define _NVM_QUEUE_RELEASE() __threadfence_system()
#define _NVM_QUEUE_ACQUIRE() __threadfence_system()
#else
#define _NVM_QUEUE_RELEASE() __atomic_thread_fence(__ATOMIC_RELEASE)
#define _NVM_QUEUE_ACQUIRE() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Initialises a queue descriptor (touches no queue memory). */
__host__
void nvm_queue_clear(nvm_queue_t* q, const nvm_ctrl_t* ctrl, bool cq, uint16_t no, void* vaddr,
                     uint64_t ioaddr);

/* Waits up to timeout milliseconds for a completion; NULL on timeout. */
__host__
nvm_cpl_t* nvm_cq_dequeue_block(nvm_queue_t* cq, uint64_t timeout);

#ifdef __cplusplus
}
#endif

/* The next free submission slot (tail), or NULL when the ring is full. */
__host__ __device__ static inline
nvm_cmd_t* nvm_sq_enqueue(nvm_queue_t* sq)
{
    nvm_cmd_t* cmd;

    if ((sq->tail + 1) % sq->max_entries == sq->head % sq->max_entries) {
        return NULL;
    }
    cmd = (nvm_cmd_t*) (((unsigned char*) sq->vaddr) + (size_t) sq->entry_size * sq->tail);
    if (++sq->tail == sq->max_entries) {
        sq->tail = 0;
        sq->phase = !sq->phase;
    }
    return cmd;
}

#if defined(__CUDACC__)
/* Slots for n cooperating threads of a block: thread i gets the i-th slot after the tail on its
 * first call (last == NULL) and last + n slots later on the following ones. Thread 0 advances the
 * tail by n. No fullness check. */
__device__ static inline
nvm_cmd_t* nvm_sq_enqueue_n(nvm_queue_t* sq, nvm_cmd_t* last, uint16_t n, uint16_t i)
{
    unsigned char* start = (unsigned char*) sq->vaddr;
    size_t es = sq->entry_size;
    size_t slot;

    if (last == NULL) {
        slot = (sq->tail + i) % sq->max_entries;
    } else {
        slot = ((((unsigned char*) last) - start) / es + n) % sq->max_entries;
    }
    __syncthreads();
    if (i == 0) {
        uint32_t tail = sq->tail + n;
        if (tail >= sq->max_entries) {
            tail -= sq->max_entries;
            sq->phase = !sq->phase;
        }
        sq->tail = tail;
    }
    __syncthreads();
    return (nvm_cmd_t*) (start + slot * es);
}
#endif

/* The completion at the head if the controller has posted it, else NULL. */
__host__ __device__ static inline
nvm_cpl_t* nvm_cq_poll(const nvm_queue_t* cq)
{
    nvm_cpl_t* cpl = (nvm_cpl_t*) (((unsigned char*) cq->vaddr) + (size_t) cq->entry_size * cq->head);

    nvm_cache_invalidate(cpl, sizeof(nvm_cpl_t));
    if ((*NVM_CPL_STATUS(cpl) & 0x1) == (uint16_t) (cq->phase & 0x1)) {
        _NVM_QUEUE_ACQUIRE();
        return cpl;
    }
    return NULL;
}

/* Takes the completion at the head, if any, and advances the head (flipping the phase at wrap). */
__host__ __device__ static inline
nvm_cpl_t* nvm_cq_dequeue(nvm_queue_t* cq)
{
    nvm_cpl_t* cpl = nvm_cq_poll(cq);

    if (cpl != NULL) {
        if (++cq->head == cq->max_entries) {
            cq->head = 0;
            cq->phase = !cq->phase;
        }
    }
    return cpl;
}

/* Rings the submission doorbell if commands were enqueued since the last ring. */
__host__ __device__ static inline
void nvm_sq_submit(nvm_queue_t* sq)
{
    if (sq->last != sq->tail && sq->db != NULL) {
        nvm_cache_flush((void*) sq->vaddr, sizeof(nvm_cmd_t) * sq->max_entries);
        nvm_wcb_flush();
        _NVM_QUEUE_RELEASE();
        *sq->db = sq->tail;
        sq->last = sq->tail;
    }
}

/* Frees one submission slot; call once per consumed completion of this SQ. */
__host__ __device__ static inline
void nvm_sq_update(nvm_queue_t* sq)
{
    if (sq->db != NULL) {
        if (++sq->head == sq->max_entries) {
            sq->head = 0;
        }
    }
}

/* Tells the controller how far the completion queue has been consumed. */
__host__ __device__ static inline
void nvm_cq_update(nvm_queue_t* cq)
{
    if (cq->last != cq->head && cq->db != NULL) {
        _NVM_QUEUE_RELEASE();
        *cq->db = cq->head;
        cq->last = cq->head;
    }
}

#undef _NVM_QUEUE_RELEASE
#undef _NVM_QUEUE_ACQUIRE
#ifdef _NVM_QUEUE_UNDEF_DEVICE
#undef __device__
#undef _NVM_QUEUE_UNDEF_DEVICE
#endif
#ifdef _NVM_QUEUE_UNDEF_HOST
#undef __host__
#undef _NVM_QUEUE_UNDEF_HOST
#endif

#endif /* __NVM_QUEUE_H__ */
