/*
 * The rdma-core layouts libgdsync's verbs code hard-codes (libgdsync/src/verbs/ibv.rs, exp.rs,
 * mlx5/mod.rs), checked against the installed <infiniband/verbs.h> and <infiniband/mlx5dv.h>.
 * A mismatch means the Rust constants must be updated for this rdma-core.
 */
#include <gdsync.h>
#include <infiniband/mlx5dv.h>
#include <stddef.h>
#include <stdio.h>

static int bad;
#define EQ(expr, want) do { long v_ = (long)(expr); if (v_ != (long)(want)) { printf("FAIL %s = %ld, Rust assumes %ld\n", #expr, v_, (long)(want)); bad = 1; } } while (0)

int main(void)
{
	EQ(offsetof(struct ibv_context, device), 0);
	EQ(offsetof(struct ibv_context, ops), 8);
	EQ(offsetof(struct ibv_context_ops, poll_cq), 88);
	EQ(offsetof(struct ibv_context_ops, post_send), 200);
	EQ(offsetof(struct ibv_context_ops, post_recv), 208);
	EQ(offsetof(struct ibv_device, name), 24);
	EQ(offsetof(struct ibv_qp, context), 0);
	EQ(offsetof(struct ibv_qp, qp_num), 52);
	EQ(offsetof(struct ibv_cq, context), 0);
	EQ(offsetof(struct ibv_cq, cqe), 28);
	EQ(sizeof(struct ibv_sge), 16);
	EQ(sizeof(struct ibv_send_wr), 128);
	EQ(offsetof(struct ibv_send_wr, opcode), 28);
	EQ(offsetof(struct ibv_send_wr, send_flags), 32);
	EQ(offsetof(struct ibv_send_wr, imm_data), 36);
	EQ(offsetof(struct ibv_send_wr, wr), 40);
	EQ(offsetof(struct ibv_send_wr, qp_type), 72);
	EQ(offsetof(struct ibv_send_wr, tso), 80);
	EQ(sizeof(struct ibv_qp_init_attr), 64);
	EQ(offsetof(struct ibv_qp_init_attr, cap), 32);
	EQ(offsetof(struct ibv_qp_init_attr, qp_type), 52);
	EQ(offsetof(struct ibv_qp_init_attr, sq_sig_all), 56);
	EQ(offsetof(struct ibv_qp_attr, qp_state), 0);
	EQ(sizeof(struct ibv_qp_attr), 144);
	EQ(IBV_QPS_RESET, 0);
	EQ(IBV_QPS_ERR, 6);
	EQ(IBV_QP_STATE, 1);
	EQ(sizeof(struct ibv_wc), 48);
	EQ(offsetof(struct ibv_wc, status), 8);
	EQ(offsetof(struct ibv_wc, vendor_err), 16);
	EQ(offsetof(struct ibv_wc, qp_num), 28);
	EQ(offsetof(struct ibv_wc, wc_flags), 36);
	EQ(IBV_WR_TSO, 10);
	EQ(IBV_SEND_IP_CSUM, 16);
	EQ(IBV_WC_LOC_QP_OP_ERR, 2);
	EQ(sizeof(struct ibv_exp_send_wr), 288);
	EQ(offsetof(struct ibv_exp_send_wr, tso), 152);
	EQ(offsetof(struct ibv_exp_send_wr, exp_send_flags), 200);
	EQ(offsetof(struct ibv_exp_send_wr, comp_mask), 208);
	EQ(sizeof(struct mlx5dv_qp), 96);
	EQ(offsetof(struct mlx5dv_qp, bf.reg), 40);
	EQ(offsetof(struct mlx5dv_qp, bf.size), 48);
	EQ(offsetof(struct mlx5dv_qp, tir_icm_addr), 88);
	EQ(sizeof(struct mlx5dv_cq), 48);
	EQ(offsetof(struct mlx5dv_cq, cqe_cnt), 16);
	EQ(offsetof(struct mlx5dv_cq, cqn), 32);
	EQ(sizeof(struct mlx5dv_obj), 112);
	/* verbs_get_ctx_op through struct verbs_context (ibv_alloc_td, ibv_alloc_parent_domain). */
	EQ(offsetof(struct verbs_context, context), 320);
	EQ(sizeof(struct verbs_context), 648);
	EQ(offsetof(struct verbs_context, sz), 312);
	EQ(offsetof(struct verbs_context, alloc_parent_domain), 112);
	EQ(offsetof(struct verbs_context, dealloc_td), 120);
	EQ(offsetof(struct verbs_context, alloc_td), 128);
	EQ(offsetof(struct ibv_context, abi_compat), 320);
	EQ(sizeof(struct ibv_td_init_attr), 4);
	EQ(sizeof(struct ibv_parent_domain_init_attr), 48);
	EQ(offsetof(struct ibv_parent_domain_init_attr, comp_mask), 16);
	EQ(sizeof(struct ibv_qp_init_attr_ex), 136);
	EQ(offsetof(struct ibv_qp_init_attr_ex, comp_mask), 60);
	EQ(offsetof(struct ibv_qp_init_attr_ex, pd), 64);
	EQ(offsetof(struct ibv_qp_init_attr_ex, create_flags), 80);
	EQ(IBV_QP_INIT_ATTR_PD, 1);
	EQ(sizeof(struct mlx5dv_qp_init_attr), 40);
	EQ(offsetof(struct mlx5dv_qp_init_attr, create_flags), 8);
	EQ(MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS, 1);
	EQ(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, 8);
	EQ(MLX5DV_OBJ_QP, 1);
	EQ(MLX5DV_OBJ_CQ, 2);
	printf("verbs layouts: %s\n", bad ? "MISMATCH" : "as libgdsync assumes");
	return bad;
}
