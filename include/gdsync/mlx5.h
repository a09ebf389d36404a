/*
 * libgdsync helpers exposing the mlx5 details of prepared requests, for code that executes them
 * from CUDA kernels instead of stream memory operations. Include after <gdsync.h>.
 */
#pragma once

#ifndef __GDSYNC_H__
#error "don't include gdsync/mlx5.h directly, include gdsync.h instead"
#endif

GDS_BEGIN_DECLS

typedef struct gds_mlx5_dword_wait_info {
	uint32_t *ptr;
	uint32_t value;
} gds_mlx5_dword_wait_info_t;

int gds_mlx5_get_dword_wait_info(uint32_t *ptr, uint32_t value, int flags,
				 gds_mlx5_dword_wait_info_t *mlx5_info);

typedef struct gds_mlx5_send_info {
	unsigned membar:1;
	unsigned membar_full:1;
	uint32_t *dbrec_ptr;
	uint32_t dbrec_value;
	uint64_t *db_ptr;
	uint64_t db_value;
} gds_mlx5_send_info_t;

int gds_mlx5_get_send_info(int count, const gds_send_request_t *requests,
			   gds_mlx5_send_info_t *mlx5_infos);

typedef struct gds_mlx5_wait_info {
	gds_wait_cond_flag_t cond;
	uint32_t *cqe_ptr;
	uint32_t cqe_value;
	uint32_t *flag_ptr;
	uint32_t flag_value;
} gds_mlx5_wait_info_t;

int gds_mlx5_get_wait_info(int count, const gds_wait_request_t *requests,
			   gds_mlx5_wait_info_t *mlx5_infos);

GDS_END_DECLS
