/*
 * libgdsync device-side helpers (header only, C++/CUDA): semaphores a CUDA kernel can wait on or
 * release, matching the wait conditions of the stream API. Used with the addresses returned by the
 * gds_mlx5_get_*_info() helpers.
 */
#pragma once

#include <gdsync.h>

#ifdef __cplusplus

namespace gdsync {

    static const clock_t large_timeout = 1ULL << 32;

    enum {
        ERROR_TIMEOUT = 11, /* EAGAIN */
        ERROR_INVALID = 22  /* EINVAL */
    };

    typedef gds_wait_cond_flag_t wait_cond_t;

    struct sem32 {
        typedef uint32_t T;
        T sem;
        T value;
#ifdef __CUDACC__
        __host__ __device__
#endif
        inline volatile T *access_once() { return (volatile T *)&sem; }
    };
    typedef struct sem32 sem32_t;

    struct isem32 {
        typedef uint32_t T;
        typedef int32_t Tsigned;
        T *ptr;
        T value;
#ifdef __CUDACC__
        __host__ __device__
#endif
        isem32() : ptr(NULL), value(0) {}
#ifdef __CUDACC__
        __host__ __device__
#endif
        inline volatile T *access_once() { return (volatile T *)ptr; }
    };
    typedef struct isem32 isem32_t;

    struct isem64 {
        typedef uint64_t T;
        T *ptr;
        T value;
#ifdef __CUDACC__
        __host__ __device__
#endif
        inline volatile T *access_once() { return (volatile T *)ptr; }
    };
    typedef struct isem64 isem64_t;

#ifdef __CUDACC__
    namespace device {

        /* Stores sem.value into the semaphore word; the caller adds whatever fence it needs. */
        template <typename S> __device__ inline void release(S &sem) {
            assert(sem.access_once() != NULL);
            *sem.access_once() = sem.value;
        }

        /* Each waiter spins on a volatile read until its condition holds or ~2^32 clocks pass. */
        template <typename S> __device__ static inline int wait_eq(S &sem) {
            int ret = ERROR_TIMEOUT;
            clock_t start = clock();
            do {
                if (*sem.access_once() == sem.value) { ret = 0; break; }
                __threadfence_block();
            } while ((clock_t)(clock() - start) < large_timeout);
            return ret;
        }

        template <typename S> __device__ static inline int wait_geq(S &sem) {
            int ret = ERROR_TIMEOUT;
            clock_t start = clock();
            do {
                typename S::Tsigned d = (typename S::Tsigned)(*sem.access_once() - sem.value);
                if (d >= 0) { ret = 0; break; }
                __threadfence_block();
            } while ((clock_t)(clock() - start) < large_timeout);
            return ret;
        }

        template <typename S> __device__ inline int wait_and(S &sem) {
            int ret = ERROR_TIMEOUT;
            clock_t start = clock();
            do {
                if ((*sem.access_once() & sem.value) != 0) { ret = 0; break; }
                __threadfence_block();
            } while ((clock_t)(clock() - start) < large_timeout);
            return ret;
        }

        template <typename S> __device__ inline int wait_nor(S &sem) {
            int ret = ERROR_TIMEOUT;
            clock_t start = clock();
            do {
                if (~(*sem.access_once() | sem.value) != 0) { ret = 0; break; }
                __threadfence_block();
            } while ((clock_t)(clock() - start) < large_timeout);
            return ret;
        }

        /* Dispatches on the condition; only isem32 has the signed type GEQ needs. */
        template <typename S> __device__ inline int wait(S &sem, wait_cond_t cond) {
            switch (cond) {
            case GDS_WAIT_COND_EQ:  return wait_eq(sem);
            case GDS_WAIT_COND_GEQ: return wait_geq(sem);
            case GDS_WAIT_COND_AND: return wait_and(sem);
            case GDS_WAIT_COND_NOR: return wait_nor(sem);
            default:                return ERROR_INVALID;
            }
        }

    } /* namespace device */
#endif /* __CUDACC__ */

} /* namespace gdsync */

#endif /* __cplusplus */
