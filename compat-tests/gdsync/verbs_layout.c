/*
 * The rdma-core layouts libgdsync's verbs code hard-codes (libgdsync/src/verbs.rs, proxy.rs,
 * mlx5prov.rs), checked against the installed <infiniband/verbs.h> and <infiniband/mlx5dv.h>.
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
	EQ(MLX5DV_OBJ_QP, 1);
	EQ(MLX5DV_OBJ_CQ, 2);
	printf("verbs layouts: %s\n", bad ? "MISMATCH" : "as libgdsync assumes");
	return bad;
}
