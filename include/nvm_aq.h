/*
 * libnvm-compatible admin queue pair (gpudirect-rs).
 */
#ifndef __NVM_AQ_H__
#define __NVM_AQ_H__

#include "nvm_types.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Resets the controller and creates the admin queues in the first two pages of aq_mem
 * (page 0: completion queue, page 1: submission queue). */
int nvm_aq_create(nvm_aq_ref* ref, const nvm_ctrl_t* ctrl, const nvm_dma_t* aq_mem);

/* Releases the admin queue reference (NULL is ignored). */
void nvm_aq_destroy(nvm_aq_ref ref);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_AQ_H__ */
