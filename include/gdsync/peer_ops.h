/*
 * Peer-direct operation types embedded in the libgdsync API.
 *
 * The public gdsync structures (gds_send_request_t, gds_wait_request_t, ...) embed types that only
 * the MLNX_OFED 4.x "peer_ops.h" used to define. Plain rdma-core has no such header, so this file
 * declares the same names with the same values and the same x86-64 layouts, written for this
 * project. Only data types are declared here: the MOFED entry points (ibv_exp_peer_commit_qp, ...)
 * do not exist on rdma-core and libgdsync does not need them.
 */
#ifndef GDSYNC_PEER_OPS_H
#define GDSYNC_PEER_OPS_H

/*
 * MOFED's own <infiniband/peer_ops.h> (guard PEER_OPS_H, pulled in by MOFED's verbs.h) declares the
 * same types: where it was included first, this file declares nothing; where this file comes
 * first it claims that guard, so a later MOFED header steps aside instead of redefining them.
 */
#ifndef PEER_OPS_H
#define PEER_OPS_H

/* MOFED's peer_ops.h includes these three; programs use errno values (ENOSYS, ...) through it. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ibv_exp_peer_op {
	IBV_EXP_PEER_OP_FENCE          = 0,
	IBV_EXP_PEER_OP_RESERVED1      = 1,
	IBV_EXP_PEER_OP_STORE_QWORD    = 2,
	IBV_EXP_PEER_OP_COPY_BLOCK     = 3,
	IBV_EXP_PEER_OP_STORE_DWORD    = 4,
	IBV_EXP_PEER_OP_POLL_AND_DWORD = 12,
	IBV_EXP_PEER_OP_POLL_NOR_DWORD = 13,
	IBV_EXP_PEER_OP_POLL_GEQ_DWORD = 14
};

enum ibv_exp_peer_op_caps {
	IBV_EXP_PEER_OP_FENCE_CAP          = (1 << IBV_EXP_PEER_OP_FENCE),
	IBV_EXP_PEER_OP_STORE_QWORD_CAP    = (1 << IBV_EXP_PEER_OP_STORE_QWORD),
	IBV_EXP_PEER_OP_COPY_BLOCK_CAP     = (1 << IBV_EXP_PEER_OP_COPY_BLOCK),
	IBV_EXP_PEER_OP_STORE_DWORD_CAP    = (1 << IBV_EXP_PEER_OP_STORE_DWORD),
	IBV_EXP_PEER_OP_POLL_AND_DWORD_CAP = (1 << IBV_EXP_PEER_OP_POLL_AND_DWORD),
	IBV_EXP_PEER_OP_POLL_NOR_DWORD_CAP = (1 << IBV_EXP_PEER_OP_POLL_NOR_DWORD),
	IBV_EXP_PEER_OP_POLL_GEQ_DWORD_CAP = (1 << IBV_EXP_PEER_OP_POLL_GEQ_DWORD)
};

enum ibv_exp_peer_fence {
	IBV_EXP_PEER_FENCE_OP_READ  = (1 << 0),
	IBV_EXP_PEER_FENCE_OP_WRITE = (1 << 1),
	IBV_EXP_PEER_FENCE_FROM_CPU = (1 << 2),
	IBV_EXP_PEER_FENCE_FROM_HCA = (1 << 3),
	IBV_EXP_PEER_FENCE_MEM_SYS  = (1 << 4),
	IBV_EXP_PEER_FENCE_MEM_PEER = (1 << 5)
};

/* Who writes and who reads a buffer handed out by buf_alloc. */
enum ibv_exp_peer_direction {
	IBV_EXP_PEER_DIRECTION_FROM_CPU  = (1 << 0),
	IBV_EXP_PEER_DIRECTION_FROM_HCA  = (1 << 1),
	IBV_EXP_PEER_DIRECTION_FROM_PEER = (1 << 2),
	IBV_EXP_PEER_DIRECTION_TO_CPU    = (1 << 3),
	IBV_EXP_PEER_DIRECTION_TO_HCA    = (1 << 4),
	IBV_EXP_PEER_DIRECTION_TO_PEER   = (1 << 5)
};

enum ibv_exp_peer_direct_attr_mask {
	IBV_EXP_PEER_DIRECT_VERSION = (1 << 0)
};

enum {
	IBV_EXP_PEER_PEEK_ABSOLUTE = 0,
	IBV_EXP_PEER_PEEK_RELATIVE = 1
};

enum ibv_exp_rollback_flags {
	IBV_EXP_ROLLBACK_ABORT_UNCOMMITED = (1 << 0),
	IBV_EXP_ROLLBACK_ABORT_LATE       = (1 << 1)
};

/* One operation the peer (the GPU) must execute; target_id names a registered range. */
struct peer_op_wr {
	struct peer_op_wr *next;
	enum ibv_exp_peer_op type;
	union {
		struct {
			uint64_t fence_flags; /* bits of enum ibv_exp_peer_fence */
		} fence;
		struct {
			uint32_t data;
			uint64_t target_id;
			size_t offset;
		} dword_va; /* STORE_DWORD and the POLL_*_DWORD ops */
		struct {
			uint64_t data;
			uint64_t target_id;
			size_t offset;
		} qword_va; /* STORE_QWORD */
		struct {
			void *src;
			uint64_t target_id;
			size_t offset;
			size_t len;
		} copy_op; /* COPY_BLOCK */
	} wr;
	uint32_t comp_mask; /* must be 0 */
};

struct ibv_exp_peer_commit {
	struct peer_op_wr *storage; /* in: free descriptors; out: the ops to execute */
	uint32_t entries;           /* in: capacity; out: number of ops filled */
	uint64_t rollback_id;       /* out */
	uint32_t comp_mask;
};

struct ibv_exp_peer_peek {
	struct peer_op_wr *storage;
	uint32_t entries;
	uint32_t whence; /* IBV_EXP_PEER_PEEK_ABSOLUTE or _RELATIVE */
	uint32_t offset;
	uint64_t peek_id; /* out */
	uint32_t comp_mask;
};

struct ibv_exp_peer_abort_peek {
	uint64_t peek_id;
	uint32_t comp_mask;
};

struct ibv_exp_rollback_ctx {
	uint64_t rollback_id;
	uint32_t flags; /* enum ibv_exp_rollback_flags */
	uint32_t comp_mask;
};

struct ibv_exp_peer_buf_alloc_attr {
	size_t length;
	uint32_t dir; /* enum ibv_exp_peer_direction */
	uint64_t peer_id;
	uint32_t alignment;
	uint32_t comp_mask;
};

struct ibv_exp_peer_buf {
	void *addr;
	size_t length;
	uint32_t comp_mask;
};

/* Marker handed to register_va for I/O memory (the UAR / BlueFlame page). */
#define IBV_EXP_PEER_IOMEMORY ((struct ibv_exp_peer_buf *)-1UL)

struct ibv_exp_peer_direct_attr {
	uint64_t peer_id;
	struct ibv_exp_peer_buf *(*buf_alloc)(struct ibv_exp_peer_buf_alloc_attr *attr);
	int (*buf_release)(struct ibv_exp_peer_buf *pb);
	uint64_t (*register_va)(void *start, size_t length, uint64_t peer_id,
				struct ibv_exp_peer_buf *pb);
	int (*unregister_va)(uint64_t target_id, uint64_t peer_id);
	uint64_t caps; /* bits of enum ibv_exp_peer_op_caps */
	size_t peer_dma_op_map_len;
	uint32_t comp_mask; /* enum ibv_exp_peer_direct_attr_mask */
	uint32_t version;   /* 1 */
};

#ifdef __cplusplus
}
#endif

#endif /* PEER_OPS_H */
#endif /* GDSYNC_PEER_OPS_H */
