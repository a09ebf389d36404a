/*
 * libnvm-compatible admin RPC surface (gpudirect-rs).
 */
#ifndef __NVM_RPC_H__
#define __NVM_RPC_H__

#include "nvm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Releases a reference, local or bound (NULL is ignored). */
void nvm_rpc_unbind(nvm_aq_ref ref);

/* Runs one admin command synchronously and returns its packed status; *cpl receives the
 * completion with the caller's command identifier. */
int nvm_raw_rpc(nvm_aq_ref ref, nvm_cmd_t* cmd, nvm_cpl_t* cpl);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_RPC_H__ */
