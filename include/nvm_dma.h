/*
 * libnvm-compatible DMA windows (gpudirect-rs).
 */
#ifndef __NVM_DMA_H__
#define __NVM_DMA_H__

#include "nvm_types.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Window over memory whose bus addresses the caller knows (page_addrs[i] for each page). */
int nvm_dma_map(nvm_dma_t** map, const nvm_ctrl_t* ctrl, void* vaddr, size_t page_size,
                size_t n_pages, const uint64_t* page_addrs);

/* Window over host memory, pinned and mapped by the helper module. */
int nvm_dma_map_host(nvm_dma_t** map, const nvm_ctrl_t* ctrl, void* vaddr, size_t size);

#if defined(__CUDA__) || defined(__CUDACC__)
/* Window over GPU memory (64 KiB aligned device pointer), pinned by the helper module. */
int nvm_dma_map_device(nvm_dma_t** map, const nvm_ctrl_t* ctrl, void* devptr, size_t size);
#else
#if defined(__unix__)
/* Allocates page-aligned host memory owned by the window and maps it. */
int nvm_dma_create(nvm_dma_t** map, const nvm_ctrl_t* ctrl, size_t size);
#endif
#endif

/* Releases a window (NULL is ignored). */
void nvm_dma_unmap(nvm_dma_t* map);

#ifdef __cplusplus
}
#endif

#endif /* __NVM_DMA_H__ */
