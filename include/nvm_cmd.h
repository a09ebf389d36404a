/*
 * libnvm-compatible NVMe command builders (gpudirect-rs). Header-only; under nvcc every helper
 * is __host__ __device__.
 */
#ifndef __NVM_COMMAND_H__
#define __NVM_COMMAND_H__

#include "nvm_util.h"
#include "nvm_types.h"

/* Non-CUDA compilers get empty qualifiers, defined only where the consumer has none and removed
 * again at the end of this header (a consumer's own definitions are left alone). */
#if !defined(__CUDACC__) && !defined(__device__)
#define __device__
#define _NVM_CMD_UNDEF_DEVICE
#endif
#if !defined(__CUDACC__) && !defined(__host__)
#define __host__
#define _NVM_CMD_UNDEF_HOST
#endif

/* Namespace identifier meaning "all namespaces". */
#define NVM_CMD_NS_ALL      0xffffffff

/* NVM command set opcodes. */
enum nvm_io_command_set
{
    NVM_IO_FLUSH                    = (0x00 << 7) | (0x00 << 2) | 0x00,   /* 0x00 */
    NVM_IO_WRITE                    = (0x00 << 7) | (0x00 << 2) | 0x01,   /* 0x01 */
    NVM_IO_READ                     = (0x00 << 7) | (0x00 << 2) | 0x02,   /* 0x02 */
    NVM_IO_WRITE_ZEROES             = (0x00 << 7) | (0x02 << 2) | 0x00    /* 0x08 */
};

/* Admin command set opcodes. */
enum nvm_admin_command_set
{
    NVM_ADMIN_DELETE_SUBMISSION_QUEUE   = (0x00 << 7) | (0x00 << 2) | 0x00,   /* 0x00 */
    NVM_ADMIN_CREATE_SUBMISSION_QUEUE   = (0x00 << 7) | (0x00 << 2) | 0x01,   /* 0x01 */
    NVM_ADMIN_GET_LOG_PAGE              = (0x00 << 7) | (0x00 << 2) | 0x02,   /* 0x02 */
    NVM_ADMIN_DELETE_COMPLETION_QUEUE   = (0x00 << 7) | (0x01 << 2) | 0x00,   /* 0x04 */
    NVM_ADMIN_CREATE_COMPLETION_QUEUE   = (0x00 << 7) | (0x01 << 2) | 0x01,   /* 0x05 */
    NVM_ADMIN_IDENTIFY                  = (0x00 << 7) | (0x01 << 2) | 0x02,   /* 0x06 */
    NVM_ADMIN_ABORT                     = (0x00 << 7) | (0x02 << 2) | 0x00,   /* 0x08 */
    NVM_ADMIN_SET_FEATURES              = (0x00 << 7) | (0x02 << 2) | 0x01,   /* 0x09 */
    NVM_ADMIN_GET_FEATURES              = (0x00 << 7) | (0x02 << 2) | 0x02    /* 0x0A */
};

/* DW0 (opcode, command identifier) and DW1 (namespace). Other dwords are left as they are. */
__host__ __device__ static inline
void nvm_cmd_header(nvm_cmd_t* cmd, uint16_t cid, uint8_t opcode, uint32_t ns_id)
{
    cmd->dword[0] = ((uint32_t) cid << 16) | (uint32_t) (opcode & 0x7f);
    cmd->dword[1] = ns_id;
}

/* PRP entries 1 and 2; FUSE and PSDT are cleared (normal command, PRPs). */
__host__ __device__ static inline
void nvm_cmd_data_ptr(nvm_cmd_t* cmd, uint64_t prp1, uint64_t prp2)
{
    cmd->dword[0] &= ~((0x3U << 14) | (0x3U << 8));
    cmd->dword[6] = (uint32_t) prp1;
    cmd->dword[7] = (uint32_t) (prp1 >> 32);
    cmd->dword[8] = (uint32_t) prp2;
    cmd->dword[9] = (uint32_t) (prp2 >> 32);
}

/* Starting LBA and block count of a read or write (n_blks 0 means 65536 blocks). */
__host__ __device__ static inline
void nvm_cmd_rw_blks(nvm_cmd_t* cmd, uint64_t start_lba, uint16_t n_blks)
{
    cmd->dword[10] = (uint32_t) start_lba;
    cmd->dword[11] = (uint32_t) (start_lba >> 32);
    cmd->dword[12] = (cmd->dword[12] & 0xffff0000U) | ((uint32_t) (uint16_t) (n_blks - 1));
}

/* Fills one PRP list page with up to page_size/8 addresses; returns how many it wrote.
 * The list is never chained. */
__host__ __device__ static inline
size_t nvm_prp_list(size_t page_size, size_t n_pages, void* list_ptr, const uint64_t* data_ioaddrs)
{
    size_t cap = page_size / sizeof(uint64_t);
    size_t n = n_pages < cap ? n_pages : cap;
    uint64_t* list = (uint64_t*) list_ptr;
    size_t i;
    for (i = 0; i < n; ++i) {
        list[i] = data_ioaddrs[i];
    }
    return n;
}

/* Sets up the data pointer of a command for n_pages pages: PRP1 alone, PRP1 + PRP2, or PRP1 and
 * a PRP list (when list_ptr is given and more than two pages are needed). Returns the number of
 * pages the command now covers. */
__host__ __device__ static inline
size_t nvm_cmd_data(nvm_cmd_t* cmd, size_t page_size, size_t n_pages, void* list_ptr,
                    uint64_t list_ioaddr, const uint64_t* data_ioaddrs)
{
    size_t consumed = 1;
    uint64_t prp2 = 0;

    if (n_pages == 0) {
        return 0;
    }
    if (n_pages > 2 && list_ptr != NULL) {
        prp2 = list_ioaddr;
        consumed += nvm_prp_list(page_size, n_pages - 1, list_ptr, &data_ioaddrs[1]);
    } else if (n_pages >= 2) {
        prp2 = data_ioaddrs[1];
        consumed = 2;
    }
    nvm_cmd_data_ptr(cmd, data_ioaddrs[0], prp2);
    return consumed;
}

#ifdef _NVM_CMD_UNDEF_DEVICE
#undef __device__
#undef _NVM_CMD_UNDEF_DEVICE
#endif
#ifdef _NVM_CMD_UNDEF_HOST
#undef __host__
#undef _NVM_CMD_UNDEF_HOST
#endif

#endif /* __NVM_COMMAND_H__ */
