/*
 * libgdsync memory helpers: GPU memory with a CPU mapping (through gdrcopy) or host memory
 * registered for GPU access. Include after <gdsync.h>.
 */
#pragma once

#ifndef __GDSYNC_H__
#error "don't include gdsync/tools.h directly, include gdsync.h instead"
#endif

GDS_BEGIN_DECLS

typedef struct gds_mem_desc {
	CUdeviceptr d_ptr;
	void *h_ptr;
	void *bar_ptr;
	int flags;
	size_t alloc_size;
	gdr_mh_t mh;
} gds_mem_desc_t;

int gds_alloc_mapped_memory(gds_mem_desc_t *desc, size_t size, int flags);
int gds_free_mapped_memory(gds_mem_desc_t *desc);

#ifdef GDS_ENABLE_LEGACY_API_2_1
/*
 * API 2.1 stream helpers. Upstream 2.2 removed these declarations; libgdsync still exports the
 * symbols so that binaries built against 2.1 keep running. New code should use descriptors.
 */
int gds_stream_post_poll_dword(CUstream stream, uint32_t *ptr, uint32_t magic,
			       gds_wait_cond_flag_t cond_flag, int flags);
int gds_stream_post_poke_dword(CUstream stream, uint32_t *ptr, uint32_t value, int flags);
int gds_stream_post_inline_copy(CUstream stream, void *ptr, void *src, size_t nbytes, int flags);
int gds_stream_post_polls_and_pokes(CUstream stream, size_t n_polls, uint32_t *ptrs[],
				    uint32_t magics[], gds_wait_cond_flag_t cond_flags[],
				    int poll_flags[], size_t n_pokes, uint32_t *poke_ptrs[],
				    uint32_t poke_values[], int poke_flags[]);
int gds_stream_post_polls_and_immediate_copies(CUstream stream, size_t n_polls, uint32_t *ptrs[],
					       uint32_t magics[], gds_wait_cond_flag_t cond_flags[],
					       int poll_flags[], size_t n_imms, void *imm_ptrs[],
					       void *imm_datas[], size_t imm_bytes[],
					       int imm_flags[]);
#endif

GDS_END_DECLS
