/*
 * libnvm-compatible controller handles (gpudirect-rs).
 */
#ifndef __NVM_CTRL_H__
#define __NVM_CTRL_H__

#include "nvm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of BAR0 a controller handle needs mapped: the registers and the first doorbells. */
#define NVM_CTRL_MEM_MINSIZE    0x2000

#if defined(__unix__)
/* Controller handle over a /dev/libnvmN file descriptor (the library keeps its own duplicate). */
int nvm_ctrl_init(nvm_ctrl_t** ctrl, int fd);
#endif

/* Controller handle over a BAR0 mapping the caller owns (at least NVM_CTRL_MEM_MINSIZE bytes). */
int nvm_raw_ctrl_init(nvm_ctrl_t** ctrl, volatile void* mm_ptr, size_t mm_size);

/* Releases a controller handle (NULL is ignored). */
void nvm_ctrl_free(nvm_ctrl_t* ctrl);

/* Resets the controller and enables it with one-page admin queues at the given bus addresses. */
int nvm_raw_ctrl_reset(const nvm_ctrl_t* ctrl, uint64_t acq_ioaddr, uint64_t asq_ioaddr);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_CTRL_H__ */
