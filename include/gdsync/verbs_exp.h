/*
 * MLNX_OFED 4.x "experimental verbs" types that the libgdsync API embeds.
 *
 * gds_send_wr is struct ibv_exp_send_wr and gds_qp_init_attr_t is struct ibv_exp_qp_init_attr.
 * rdma-core has neither, so this file declares them (and the small types they refer to) with the
 * same names, values and x86-64 layouts, written for this project. It needs the standard types of
 * <infiniband/verbs.h> (struct ibv_sge, ibv_qp_cap, ibv_qp_type, ...). No functions are declared.
 */
#ifndef GDSYNC_VERBS_EXP_H
#define GDSYNC_VERBS_EXP_H

#include <stddef.h>
#include <stdint.h>
/*
 * MOFED's verbs_exp.h includes <stdio.h> and <stdlib.h> (its inline helpers call fprintf), and
 * MOFED's verbs.h and peer_ops.h include it in turn: programs written for MOFED, upstream
 * libgdsync's test helpers among them, call fprintf/exit/malloc relying on that. rdma-core's
 * verbs.h brings stdint, pthread, stddef, errno and string as MOFED's did.
 */
#include <stdio.h>
#include <stdlib.h>
#include <infiniband/verbs.h>
#include <gdsync/peer_ops.h>

/* MOFED's verbs.h defined these and programs written for it use them around declarations. */
#ifndef BEGIN_C_DECLS
#ifdef __cplusplus
#define BEGIN_C_DECLS extern "C" {
#define END_C_DECLS }
#else
#define BEGIN_C_DECLS
#define END_C_DECLS
#endif
#endif

/*
 * Real MOFED headers (guard INFINIBAND_VERBS_EXP_H; MOFED's verbs.h includes verbs_exp.h) declare
 * all of the below: then this file adds nothing. Otherwise it claims that guard, so a MOFED
 * verbs_exp.h met later steps aside.
 */
#ifndef INFINIBAND_VERBS_EXP_H
#define INFINIBAND_VERBS_EXP_H

#ifdef __cplusplus
extern "C" {
#endif

#define IBV_EXP_START_ENUM 0x40
#define IBV_EXP_START_FLAG (1ULL << 32)

enum ibv_exp_wr_opcode {
	IBV_EXP_WR_RDMA_WRITE          = IBV_WR_RDMA_WRITE,
	IBV_EXP_WR_RDMA_WRITE_WITH_IMM = IBV_WR_RDMA_WRITE_WITH_IMM,
	IBV_EXP_WR_SEND                = IBV_WR_SEND,
	IBV_EXP_WR_SEND_WITH_IMM       = IBV_WR_SEND_WITH_IMM,
	IBV_EXP_WR_RDMA_READ           = IBV_WR_RDMA_READ,
	IBV_EXP_WR_ATOMIC_CMP_AND_SWP  = IBV_WR_ATOMIC_CMP_AND_SWP,
	IBV_EXP_WR_ATOMIC_FETCH_AND_ADD = IBV_WR_ATOMIC_FETCH_AND_ADD,
	/* MOFED numbers these from IBV_EXP_START_ENUM, unlike rdma-core's IBV_WR_* (9, 7, 8). */
	IBV_EXP_WR_SEND_WITH_INV       = 8 + IBV_EXP_START_ENUM,
	IBV_EXP_WR_LOCAL_INV           = 10 + IBV_EXP_START_ENUM,
	IBV_EXP_WR_BIND_MW             = 14 + IBV_EXP_START_ENUM,
	IBV_EXP_WR_TSO                 = 0x4f,
	IBV_EXP_WR_SEND_ENABLE         = 0x60,
	IBV_EXP_WR_RECV_ENABLE         = 0x61,
	IBV_EXP_WR_CQE_WAIT            = 0x62,
	IBV_EXP_WR_EXT_MASKED_ATOMIC_CMP_AND_SWP  = 0x63,
	IBV_EXP_WR_EXT_MASKED_ATOMIC_FETCH_AND_ADD = 0x64,
	IBV_EXP_WR_NOP                 = 0x65,
	IBV_EXP_WR_UMR_FILL            = 0x66,
	IBV_EXP_WR_UMR_INVALIDATE      = 0x67
};

/* 64-bit flag values (the exp_send_flags field is a uint64_t). */
enum ibv_exp_send_flags {
	IBV_EXP_SEND_FENCE      = (1 << 0),
	IBV_EXP_SEND_SIGNALED   = (1 << 1),
	IBV_EXP_SEND_SOLICITED  = (1 << 2),
	IBV_EXP_SEND_INLINE     = (1 << 3),
	IBV_EXP_SEND_IP_CSUM    = (IBV_EXP_START_FLAG << 0),
	IBV_EXP_SEND_WITH_CALC  = (IBV_EXP_START_FLAG << 1),
	IBV_EXP_SEND_WAIT_EN_LAST = (IBV_EXP_START_FLAG << 2),
	IBV_EXP_SEND_EXT_ATOMIC_INLINE = (IBV_EXP_START_FLAG << 3)
};

enum ibv_exp_calc_op {
	IBV_EXP_CALC_OP_ADD = 0,
	IBV_EXP_CALC_OP_MAXLOC,
	IBV_EXP_CALC_OP_BAND,
	IBV_EXP_CALC_OP_BXOR,
	IBV_EXP_CALC_OP_BOR,
	IBV_EXP_CALC_OP_NUMBER
};

enum ibv_exp_calc_data_type {
	IBV_EXP_CALC_DATA_TYPE_INT = 0,
	IBV_EXP_CALC_DATA_TYPE_UINT,
	IBV_EXP_CALC_DATA_TYPE_FLOAT,
	IBV_EXP_CALC_DATA_TYPE_NUMBER
};

enum ibv_exp_calc_data_size {
	IBV_EXP_CALC_DATA_SIZE_64_BIT = 0,
	IBV_EXP_CALC_DATA_SIZE_NUMBER
};

struct ibv_exp_mkey_list_container;
struct ibv_exp_mem_region;
struct ibv_exp_mem_repeat_block;
struct ibv_exp_rx_hash_conf;

struct ibv_exp_mw_bind_info {
	struct ibv_mr *mr;
	uint64_t addr;
	uint64_t length;
	uint64_t exp_mw_access_flags;
};

struct ibv_exp_cmp_swap {
	uint64_t compare_mask;
	uint64_t compare_val;
	uint64_t swap_val;
	uint64_t swap_mask;
};

struct ibv_exp_fetch_add {
	uint64_t add_val;
	uint64_t field_boundary;
};

struct ibv_exp_send_wr {
	uint64_t wr_id;
	struct ibv_exp_send_wr *next;
	struct ibv_sge *sg_list;
	int num_sge;
	enum ibv_exp_wr_opcode exp_opcode;
	int reserved; /* same place as ibv_send_wr.send_flags */
	union {
		uint32_t imm_data; /* network byte order */
		uint32_t invalidate_rkey;
	} ex;
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
		struct {
			struct ibv_ah *ah;
			uint32_t remote_qpn;
			uint32_t remote_qkey;
		} ud;
	} wr;
	union {
		union {
			struct {
				uint32_t remote_srqn;
			} xrc;
		} qp_type;
		uint32_t xrc_remote_srq_num;
	};
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
		struct {
			struct ibv_cq *cq;
			int32_t cq_count;
		} cqe_wait;
		struct {
			struct ibv_qp *qp;
			int32_t wqe_count;
		} wqe_enable;
	} task;
	union {
		struct {
			enum ibv_exp_calc_op calc_op;
			enum ibv_exp_calc_data_type data_type;
			enum ibv_exp_calc_data_size data_size;
		} calc;
	} op;
	struct {
		struct ibv_ah *ah;
		uint64_t dct_access_key;
		uint32_t dct_number;
	} dc;
	union {
		struct {
			struct ibv_mw *mw;
			uint32_t rkey;
			struct ibv_exp_mw_bind_info bind_info;
		} bind_mw;
		struct {
			void *hdr;
			uint16_t hdr_sz;
			uint16_t mss;
		} tso;
	};
	uint64_t exp_send_flags; /* enum ibv_exp_send_flags */
	uint32_t comp_mask;      /* must be 0 */
	union {
		struct {
			uint32_t umr_type;
			struct ibv_exp_mkey_list_container *memory_objects;
			uint64_t exp_access;
			struct ibv_mr *modified_mr;
			uint64_t base_addr;
			uint32_t num_mrs;
			union {
				struct ibv_exp_mem_region *mem_reg_list;
				struct {
					struct ibv_exp_mem_repeat_block *mem_repeat_block_list;
					size_t *repeat_count;
					uint32_t stride_dim;
				} rb;
			} mem_list;
		} umr;
		struct {
			uint32_t log_arg_sz;
			uint64_t remote_addr;
			uint32_t rkey;
			union {
				struct {
					union {
						struct ibv_exp_cmp_swap cmp_swap;
						struct ibv_exp_fetch_add fetch_add;
					} op;
				} inline_data;
			} wr_data;
		} masked_atomics;
	} ext_op;
};

struct ibv_exp_qpg_init_attrib {
	uint32_t tss_child_count;
	uint32_t rss_child_count;
};

struct ibv_exp_qpg {
	uint32_t qpg_type;
	union {
		struct ibv_qp *qpg_parent;
		struct ibv_exp_qpg_init_attrib parent_attrib;
	};
};

enum ibv_exp_qp_init_attr_comp_mask {
	IBV_EXP_QP_INIT_ATTR_PD             = (1 << 0),
	IBV_EXP_QP_INIT_ATTR_XRCD           = (1 << 1),
	IBV_EXP_QP_INIT_ATTR_CREATE_FLAGS   = (1 << 2),
	IBV_EXP_QP_INIT_ATTR_INL_RECV       = (1 << 3),
	IBV_EXP_QP_INIT_ATTR_QPG            = (1 << 4),
	IBV_EXP_QP_INIT_ATTR_ATOMICS_ARG    = (1 << 5),
	IBV_EXP_QP_INIT_ATTR_MAX_INL_KLMS   = (1 << 6),
	IBV_EXP_QP_INIT_ATTR_RES_DOMAIN     = (1 << 7),
	IBV_EXP_QP_INIT_ATTR_RX_HASH        = (1 << 8),
	IBV_EXP_QP_INIT_ATTR_PORT           = (1 << 9),
	IBV_EXP_QP_INIT_ATTR_PEER_DIRECT    = (1 << 10),
	IBV_EXP_QP_INIT_ATTR_MAX_TSO_HEADER = (1 << 11),
	IBV_EXP_QP_INIT_ATTR_ASSOCIATED_QPN = (1 << 12)
};

struct ibv_exp_res_domain {
	struct ibv_context *context;
};

struct ibv_exp_qp_init_attr {
	void *qp_context;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_qp_cap cap;
	enum ibv_qp_type qp_type;
	int sq_sig_all;
	uint32_t comp_mask; /* enum ibv_exp_qp_init_attr_comp_mask */
	struct ibv_pd *pd;
	struct ibv_xrcd *xrcd;
	uint32_t exp_create_flags;
	uint32_t max_inl_recv;
	struct ibv_exp_qpg qpg;
	uint32_t max_atomic_arg;
	uint32_t max_inl_send_klms;
	struct ibv_exp_res_domain *res_domain;
	struct ibv_exp_rx_hash_conf *rx_hash_conf;
	uint8_t port_num;
	struct ibv_exp_peer_direct_attr *peer_direct_attrs;
	uint16_t max_tso_header;
	uint32_t associated_qpn;
};

enum ibv_exp_res_domain_init_attr_comp_mask {
	IBV_EXP_RES_DOMAIN_THREAD_MODEL = (1 << 0),
	IBV_EXP_RES_DOMAIN_MSG_MODEL    = (1 << 1)
};

enum ibv_exp_thread_model {
	IBV_EXP_THREAD_SAFE   = 0,
	IBV_EXP_THREAD_UNSAFE = 1,
	IBV_EXP_THREAD_SINGLE = 2
};

enum ibv_exp_msg_model {
	IBV_EXP_MSG_DEFAULT           = 0,
	IBV_EXP_MSG_LOW_LATENCY       = 1,
	IBV_EXP_MSG_HIGH_BW           = 2,
	IBV_EXP_MSG_FORCE_LOW_LATENCY = 3
};

struct ibv_exp_res_domain_init_attr {
	uint32_t comp_mask;
	enum ibv_exp_thread_model thread_model;
	enum ibv_exp_msg_model msg_model;
};

struct ibv_exp_destroy_res_domain_attr {
	uint32_t comp_mask;
};

enum ibv_exp_cq_init_attr_mask {
	IBV_EXP_CQ_INIT_ATTR_FLAGS       = (1 << 0),
	IBV_EXP_CQ_INIT_ATTR_RES_DOMAIN  = (1 << 1),
	IBV_EXP_CQ_INIT_ATTR_PEER_DIRECT = (1 << 2)
};

struct ibv_exp_cq_init_attr {
	uint32_t comp_mask;
	uint32_t flags;
	struct ibv_exp_res_domain *res_domain;
	struct ibv_exp_peer_direct_attr *peer_direct_attrs;
};

#ifdef __cplusplus
}
#endif

#endif /* INFINIBAND_VERBS_EXP_H */
#endif /* GDSYNC_VERBS_EXP_H */
