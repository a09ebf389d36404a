/*
 * libgdsync core API: parameters, QPs/CQs, send/wait requests and the descriptor API.
 * Included by <gdsync.h>; do not include it directly.
 */
#pragma once

#ifndef __GDSYNC_H__
#error "don't include gdsync/core.h directly, include gdsync.h instead"
#endif

#define GDS_API_MAJOR_VERSION 2
#define GDS_API_MINOR_VERSION 2
#define GDS_API_VERSION ((((unsigned)GDS_API_MAJOR_VERSION) << 16) | ((unsigned)GDS_API_MINOR_VERSION))
#define GDS_API_VERSION_COMPATIBLE(v) \
	((((unsigned)(v) & 0xffff0000U) >> 16) == (unsigned)GDS_API_MAJOR_VERSION && \
	 ((unsigned)(v) & 0x0000ffffU) >= (unsigned)GDS_API_MINOR_VERSION)

typedef enum gds_param {
	GDS_PARAM_VERSION = 0,
	GDS_NUM_PARAMS
} gds_param_t;

int gds_query_param(gds_param_t param, int *value);

enum gds_create_qp_flags {
	GDS_CREATE_QP_DEFAULT         = 0,
	GDS_CREATE_QP_WQ_ON_GPU       = 1 << 0,
	GDS_CREATE_QP_TX_CQ_ON_GPU    = 1 << 1,
	GDS_CREATE_QP_RX_CQ_ON_GPU    = 1 << 2,
	GDS_CREATE_QP_WQ_DBREC_ON_GPU = 1 << 5
};

typedef struct ibv_exp_qp_init_attr gds_qp_init_attr_t;
typedef struct ibv_exp_send_wr gds_send_wr;

struct gds_cq {
	struct ibv_cq *cq;
	uint32_t curr_offset;
};

struct gds_qp {
	struct ibv_qp *qp;
	struct gds_cq send_cq;
	struct gds_cq recv_cq;
	struct ibv_exp_res_domain *res_domain;
	struct ibv_context *dev_context;
};

struct gds_qp *gds_create_qp(struct ibv_pd *pd, struct ibv_context *context,
			     gds_qp_init_attr_t *qp_init_attr, int gpu_id, int flags);
int gds_destroy_qp(struct gds_qp *qp);
int gds_post_send(struct gds_qp *qp, gds_send_wr *wr, gds_send_wr **bad_wr);
int gds_post_recv(struct gds_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int gds_stream_wait_cq(CUstream stream, struct gds_cq *cq, int flags);
int gds_stream_queue_send(CUstream stream, struct gds_qp *qp, gds_send_wr *wr, gds_send_wr **bad_wr);

typedef enum gds_memory_type {
	GDS_MEMORY_GPU  = 1, /* any UVA device-accessible pointer (cuMemAlloc or cuMemHostAlloc memory) */
	GDS_MEMORY_HOST = 2,
	GDS_MEMORY_IO   = 4,
	GDS_MEMORY_MASK = 0x7
} gds_memory_type_t;

typedef enum gds_wait_flags {
	GDS_WAIT_POST_FLUSH_REMOTE = 1 << 3,
	GDS_WAIT_POST_FLUSH        = GDS_WAIT_POST_FLUSH_REMOTE
} gds_wait_flags_t;

typedef enum gds_write_flags {
	GDS_WRITE_PRE_BARRIER_SYS = 1 << 4,
	GDS_WRITE_PRE_BARRIER     = GDS_WRITE_PRE_BARRIER_SYS
} gds_write_flags_t;

typedef enum gds_write_memory_flags {
	GDS_WRITE_MEMORY_POST_BARRIER_SYS = 1 << 4,
	GDS_WRITE_MEMORY_PRE_BARRIER_SYS  = 1 << 5
} gds_write_memory_flags_t;

typedef enum gds_membar_flags {
	GDS_MEMBAR_FLUSH_REMOTE = 1 << 4,
	GDS_MEMBAR_DEFAULT      = 1 << 5,
	GDS_MEMBAR_SYS          = 1 << 6,
	GDS_MEMBAR_MLX5         = 1 << 7
} gds_membar_flags_t;

enum {
	GDS_SEND_INFO_MAX_OPS = 32,
	GDS_WAIT_INFO_MAX_OPS = 32
};

typedef struct gds_send_request {
	struct ibv_exp_peer_commit commit;
	struct peer_op_wr wr[GDS_SEND_INFO_MAX_OPS];
} gds_send_request_t;

int gds_prepare_send(struct gds_qp *qp, gds_send_wr *p_ewr, gds_send_wr **bad_ewr,
		     gds_send_request_t *request);
int gds_stream_post_send(CUstream stream, gds_send_request_t *request);
int gds_stream_post_send_all(CUstream stream, int count, gds_send_request_t *request);

typedef struct gds_wait_request {
	struct ibv_exp_peer_peek peek;
	struct peer_op_wr wr[GDS_WAIT_INFO_MAX_OPS];
} gds_wait_request_t;

int gds_prepare_wait_cq(struct gds_cq *cq, gds_wait_request_t *request, int flags);
int gds_stream_post_wait_cq(CUstream stream, gds_wait_request_t *request);
int gds_stream_post_wait_cq_all(CUstream stream, int count, gds_wait_request_t *request);
int gds_post_wait_cq(struct gds_cq *cq, gds_wait_request_t *request, int flags);

/* Same numbering as CUDA's CU_STREAM_WAIT_VALUE_* conditions. */
typedef enum gds_wait_cond_flag {
	GDS_WAIT_COND_GEQ = 0, /* (int32_t)(*ptr - value) >= 0 */
	GDS_WAIT_COND_EQ  = 1, /* *ptr == value */
	GDS_WAIT_COND_AND = 2, /* (*ptr & value) != 0 */
	GDS_WAIT_COND_NOR = 3  /* ~(*ptr | value) != 0 */
} gds_wait_cond_flag_t;

typedef struct gds_wait_value32 {
	uint32_t *ptr;
	uint32_t value;
	gds_wait_cond_flag_t cond_flags;
	int flags; /* gds_memory_type_t | gds_wait_flags_t */
} gds_wait_value32_t;

typedef struct gds_write_value32 {
	uint32_t *ptr;
	uint32_t value;
	int flags; /* gds_memory_type_t | gds_write_flags_t */
} gds_write_value32_t;

typedef struct gds_write_memory {
	uint8_t *dest;
	const uint8_t *src;
	size_t count;
	int flags; /* gds_memory_type_t | gds_write_memory_flags_t */
} gds_write_memory_t;

typedef enum gds_tag {
	GDS_TAG_SEND          = 0,
	GDS_TAG_WAIT          = 1,
	GDS_TAG_WAIT_VALUE32  = 2,
	GDS_TAG_WRITE_VALUE32 = 3,
	GDS_TAG_WRITE_MEMORY  = 4
} gds_tag_t;

typedef struct gds_descriptor {
	gds_tag_t tag;
	union {
		gds_send_request_t *send;
		gds_wait_request_t *wait;
		gds_wait_value32_t wait32;
		gds_write_value32_t write32;
		gds_write_memory_t writemem;
	};
} gds_descriptor_t;

int gds_prepare_wait_value32(gds_wait_value32_t *desc, uint32_t *ptr, uint32_t value,
			     gds_wait_cond_flag_t cond_flags, int flags);
int gds_prepare_write_value32(gds_write_value32_t *desc, uint32_t *ptr, uint32_t value, int flags);
int gds_prepare_write_memory(gds_write_memory_t *desc, uint8_t *dest, const uint8_t *src,
			     size_t count, int flags);
int gds_stream_post_descriptors(CUstream stream, size_t n_descs, gds_descriptor_t *descs, int flags);
int gds_post_descriptors(size_t n_descs, gds_descriptor_t *descs, int flags);
