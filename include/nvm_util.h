/*
 * libnvm-compatible bit, page and field-access helpers (gpudirect-rs).
 */
#ifndef __NVM_UTIL_H__
#define __NVM_UTIL_H__

#include "nvm_types.h"

#ifdef __CUDACC__
#define _NVM_UTIL_HD __host__ __device__
#else
#define _NVM_UTIL_HD
#endif

/* Mask with bits hi..lo set (0 <= lo <= hi <= 63). */
_NVM_UTIL_HD static inline uint64_t _nvm_bitmask(int hi, int lo)
{
    return (~0ULL >> (63 - hi)) & (~0ULL << lo);
}

#undef _NVM_UTIL_HD

/* Read bits hi..lo of v, shifted down. */
#define _RB(v, hi, lo)      ( ( ((uint64_t) (v)) & _nvm_bitmask((hi), (lo)) ) >> (lo) )

/* Place v at bits hi..lo. */
#define _WB(v, hi, lo)      ( ( ((uint64_t) (v)) << (lo) ) & _nvm_bitmask((hi), (lo)) )

/* Volatile pointer to a bits-wide register at byte offs of p. */
#define _REG(p, offs, bits) \
    ((volatile uint##bits##_t*) (((volatile unsigned char*) ((volatile void*) (p))) + (offs)))

#define NVM_PAGE_TO_BLOCK(page_size, block_size, n_pages)   (((page_size) * (n_pages)) / (block_size))
#define NVM_BLOCK_TO_PAGE(page_size, block_size, n_blocks)  (((block_size) * (n_blocks)) / (page_size))
#define NVM_PAGE_MASK(page_size)            (~((page_size) - 1))
#define NVM_ADDR_MASK(addr, page_size)      (((uint64_t) (addr)) & NVM_PAGE_MASK((uint64_t) (page_size)))
#define NVM_PAGE_ALIGN(size, page_size)     (((size) + (page_size) - 1) & NVM_PAGE_MASK(page_size))
#define NVM_ADDR_OFFSET(addr, page_size, n) (((uint64_t) (addr)) + ((page_size) * (n)))
#define NVM_PTR_OFFSET(ptr, page_size, n)   ((void*) (((unsigned char*) (ptr)) + ((page_size) * (n))))
#define NVM_CTRL_ALIGN(ctrl_ptr, size)      NVM_PAGE_ALIGN((size), (ctrl_ptr)->page_size)
#define NVM_CTRL_PAGES(ctrl_ptr, size)      (NVM_CTRL_ALIGN((ctrl_ptr), (size)) / (ctrl_ptr)->page_size)
#define NVM_DMA_ALIGN(dma_ptr, size)        NVM_PAGE_ALIGN((size), (dma_ptr)->page_size)
#define NVM_DMA_OFFSET(dma_ptr, n) \
    ((void*) (((unsigned char*) (dma_ptr)->vaddr) + ((dma_ptr)->page_size * (n))))

/* Field pointers into a command (nvm_cmd_t*) or a completion (nvm_cpl_t*). */
#define NVM_CMD_CID(p)      _REG(p, 2, 16)
#define NVM_CMD_NSID(p)     _REG(p, 4, 32)
#define NVM_CPL_SQHD(p)     _REG(p, 8, 16)
#define NVM_CPL_SQID(p)     _REG(p, 10, 16)
#define NVM_CPL_CID(p)      _REG(p, 12, 16)
#define NVM_CPL_STATUS(p)   _REG(p, 14, 16)

/* The command identifier libnvm's callers use: slot index, offset by the ring size on odd laps. */
#define NVM_DEFAULT_CID(sq) ((uint16_t) ((sq)->tail + (!(sq)->phase) * (sq)->max_entries))

/* Cache maintenance hooks; only cluster (SmartIO) builds need them, so here they do nothing. */
#define nvm_cache_flush(ptr, size)      do { (void) (ptr); (void) (size); } while (0)
#define nvm_cache_invalidate(ptr, size) do { (void) (ptr); (void) (size); } while (0)
#define nvm_wcb_flush()                 do { } while (0)

#ifdef __cplusplus
extern "C" {
#endif

/* The controller an admin reference was created for; NULL for NULL. */
const nvm_ctrl_t* nvm_ctrl_from_aq_ref(nvm_aq_ref ref);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_UTIL_H__ */
