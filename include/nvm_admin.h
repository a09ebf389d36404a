/*
 * libnvm-compatible admin commands (gpudirect-rs). Each returns a packed status (nvm_error.h).
 */
#ifndef __NVM_ADMIN_H__
#define __NVM_ADMIN_H__

#include "nvm_types.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Identify Controller into buffer (>= 4 KiB, CPU accessible, bus address ioaddr). */
int nvm_admin_ctrl_info(nvm_aq_ref ref, struct nvm_ctrl_info* info, void* buffer, uint64_t ioaddr);

/* Identify Namespace ns_id into buffer (>= 4 KiB, CPU accessible, bus address ioaddr). */
int nvm_admin_ns_info(nvm_aq_ref ref, struct nvm_ns_info* info, uint32_t ns_id, void* buffer,
                      uint64_t ioaddr);

/* Set Features Number of Queues. */
int nvm_admin_set_num_queues(nvm_aq_ref ref, uint16_t n_cqs, uint16_t n_sqs);

/* Get Features Number of Queues (current values). */
int nvm_admin_get_num_queues(nvm_aq_ref ref, uint16_t* n_cqs, uint16_t* n_sqs);

/* Set Features Number of Queues; the granted counts are written back. */
int nvm_admin_request_num_queues(nvm_aq_ref ref, uint16_t* n_cqs, uint16_t* n_sqs);

/* Creates I/O completion queue id in qmem (one page, zeroed by the caller). */
int nvm_admin_cq_create(nvm_aq_ref ref, nvm_queue_t* cq, uint16_t id, void* qmem, uint64_t ioaddr);

/* Deletes an I/O completion queue. */
int nvm_admin_cq_delete(nvm_aq_ref ref, nvm_queue_t* cq);

/* Creates I/O submission queue id bound to cq, in qmem (one page). */
int nvm_admin_sq_create(nvm_aq_ref ref, nvm_queue_t* sq, const nvm_queue_t* cq, uint16_t id,
                        void* qmem, uint64_t ioaddr);

/* Deletes an I/O submission queue. */
int nvm_admin_sq_delete(nvm_aq_ref ref, nvm_queue_t* sq, const nvm_queue_t* cq);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_ADMIN_H__ */
