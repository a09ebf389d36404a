/*
 * libnvm-compatible status handling (gpudirect-rs).
 *
 * An int status is 0 for success, a positive errno for a host-side failure, or a negative
 * -(SCT << 8 | SC) for an NVMe completion with an error status.
 */
#ifndef __NVM_ERROR_H__
#define __NVM_ERROR_H__

#include "nvm_types.h"
#include "nvm_util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NVM_ERR_SCT(cpl)    ((uint8_t) _RB(*NVM_CPL_STATUS(cpl), 11, 9))
#define NVM_ERR_SC(cpl)     ((uint8_t) _RB(*NVM_CPL_STATUS(cpl), 8, 1))
#define NVM_ERR_DNR(cpl)    ((uint8_t) _RB(*NVM_CPL_STATUS(cpl), 15, 15))

#define NVM_ERR_STATUS(cpl) \
    ((int) ((cpl) != NULL ? -((NVM_ERR_SCT(cpl) << 8) | NVM_ERR_SC(cpl)) : 0))

#define NVM_ERR_OK(cpl)     (!NVM_ERR_SCT(cpl) && !NVM_ERR_SC(cpl))

#define NVM_ERR_PACK(cpl, err) ((err) != 0 ? (int) (err) : NVM_ERR_STATUS(cpl))

#define NVM_ERR_UNPACK_ERRNO(status)    ((status) > 0 ? (status) : 0)
#define NVM_ERR_UNPACK_SCT(status)      ((status) < 0 ? (((-(status)) >> 8) & 0xff) : 0)
#define NVM_ERR_UNPACK_SC(status)       ((status) < 0 ? ((-(status)) & 0xff) : 0)

#define nvm_ok(status)      (!(status))

/* A static description of a packed status: the NVMe status text, or strerror of the errno. */
const char* nvm_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_ERROR_H__ */
