/*
 * Layout check of every public gdsync structure and of the embedded peer-direct / experimental
 * verbs types, against the numbers measured on upstream + MLNX_OFED headers (spec §2.3–§3.3).
 * Compiled as C and as C++; exits non-zero listing every mismatch.
 */
#include <gdsync.h>
#include <gdsync/mlx5.h>
#include <gdsync/tools.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static int failures;
static int checks;

#define EQ(what, got, want)                                                                    \
	do {                                                                                   \
		checks++;                                                                      \
		if ((unsigned long)(got) != (unsigned long)(want)) {                           \
			fprintf(stderr, "MISMATCH %s: %lu, expected %lu\n", what,              \
				(unsigned long)(got), (unsigned long)(want));                  \
			failures++;                                                            \
		}                                                                              \
	} while (0)
#define SZ(T, n) EQ("sizeof(" #T ")", sizeof(T), n)
#define OFF(T, f, n) EQ("offsetof(" #T ", " #f ")", offsetof(T, f), n)
#define VAL(c, n) EQ(#c, (c), n)

int main(void)
{
	/* peer_ops.h */
	SZ(struct peer_op_wr, 56);
	OFF(struct peer_op_wr, next, 0);
	OFF(struct peer_op_wr, type, 8);
	OFF(struct peer_op_wr, wr, 16);
	OFF(struct peer_op_wr, wr.fence.fence_flags, 16);
	OFF(struct peer_op_wr, wr.dword_va.data, 16);
	OFF(struct peer_op_wr, wr.dword_va.target_id, 24);
	OFF(struct peer_op_wr, wr.dword_va.offset, 32);
	OFF(struct peer_op_wr, wr.qword_va.data, 16);
	OFF(struct peer_op_wr, wr.qword_va.target_id, 24);
	OFF(struct peer_op_wr, wr.qword_va.offset, 32);
	OFF(struct peer_op_wr, wr.copy_op.src, 16);
	OFF(struct peer_op_wr, wr.copy_op.target_id, 24);
	OFF(struct peer_op_wr, wr.copy_op.offset, 32);
	OFF(struct peer_op_wr, wr.copy_op.len, 40);
	OFF(struct peer_op_wr, comp_mask, 48);
	SZ(struct ibv_exp_peer_commit, 32);
	OFF(struct ibv_exp_peer_commit, storage, 0);
	OFF(struct ibv_exp_peer_commit, entries, 8);
	OFF(struct ibv_exp_peer_commit, rollback_id, 16);
	OFF(struct ibv_exp_peer_commit, comp_mask, 24);
	SZ(struct ibv_exp_peer_peek, 40);
	OFF(struct ibv_exp_peer_peek, entries, 8);
	OFF(struct ibv_exp_peer_peek, whence, 12);
	OFF(struct ibv_exp_peer_peek, offset, 16);
	OFF(struct ibv_exp_peer_peek, peek_id, 24);
	OFF(struct ibv_exp_peer_peek, comp_mask, 32);
	SZ(struct ibv_exp_peer_abort_peek, 16);
	OFF(struct ibv_exp_peer_abort_peek, comp_mask, 8);
	SZ(struct ibv_exp_rollback_ctx, 16);
	OFF(struct ibv_exp_rollback_ctx, flags, 8);
	OFF(struct ibv_exp_rollback_ctx, comp_mask, 12);
	SZ(struct ibv_exp_peer_buf_alloc_attr, 32);
	OFF(struct ibv_exp_peer_buf_alloc_attr, dir, 8);
	OFF(struct ibv_exp_peer_buf_alloc_attr, peer_id, 16);
	OFF(struct ibv_exp_peer_buf_alloc_attr, alignment, 24);
	OFF(struct ibv_exp_peer_buf_alloc_attr, comp_mask, 28);
	SZ(struct ibv_exp_peer_buf, 24);
	OFF(struct ibv_exp_peer_buf, length, 8);
	OFF(struct ibv_exp_peer_buf, comp_mask, 16);
	SZ(struct ibv_exp_peer_direct_attr, 64);
	OFF(struct ibv_exp_peer_direct_attr, buf_alloc, 8);
	OFF(struct ibv_exp_peer_direct_attr, buf_release, 16);
	OFF(struct ibv_exp_peer_direct_attr, register_va, 24);
	OFF(struct ibv_exp_peer_direct_attr, unregister_va, 32);
	OFF(struct ibv_exp_peer_direct_attr, caps, 40);
	OFF(struct ibv_exp_peer_direct_attr, peer_dma_op_map_len, 48);
	OFF(struct ibv_exp_peer_direct_attr, comp_mask, 56);
	OFF(struct ibv_exp_peer_direct_attr, version, 60);
	VAL(IBV_EXP_PEER_OP_FENCE, 0);
	VAL(IBV_EXP_PEER_OP_RESERVED1, 1);
	VAL(IBV_EXP_PEER_OP_STORE_QWORD, 2);
	VAL(IBV_EXP_PEER_OP_COPY_BLOCK, 3);
	VAL(IBV_EXP_PEER_OP_STORE_DWORD, 4);
	VAL(IBV_EXP_PEER_OP_POLL_AND_DWORD, 12);
	VAL(IBV_EXP_PEER_OP_POLL_NOR_DWORD, 13);
	VAL(IBV_EXP_PEER_OP_POLL_GEQ_DWORD, 14);
	VAL(IBV_EXP_PEER_OP_FENCE_CAP | IBV_EXP_PEER_OP_STORE_DWORD_CAP | IBV_EXP_PEER_OP_STORE_QWORD_CAP |
	    IBV_EXP_PEER_OP_POLL_AND_DWORD_CAP | IBV_EXP_PEER_OP_POLL_GEQ_DWORD_CAP, 0x5015);
	VAL(IBV_EXP_PEER_OP_COPY_BLOCK_CAP, 0x8);
	VAL(IBV_EXP_PEER_OP_POLL_NOR_DWORD_CAP, 0x2000);
	VAL(IBV_EXP_PEER_FENCE_OP_READ, 0x1);
	VAL(IBV_EXP_PEER_FENCE_OP_WRITE, 0x2);
	VAL(IBV_EXP_PEER_FENCE_FROM_CPU, 0x4);
	VAL(IBV_EXP_PEER_FENCE_FROM_HCA, 0x8);
	VAL(IBV_EXP_PEER_FENCE_MEM_SYS, 0x10);
	VAL(IBV_EXP_PEER_FENCE_MEM_PEER, 0x20);
	VAL(IBV_EXP_PEER_DIRECTION_FROM_CPU, 0x1);
	VAL(IBV_EXP_PEER_DIRECTION_FROM_HCA, 0x2);
	VAL(IBV_EXP_PEER_DIRECTION_FROM_PEER, 0x4);
	VAL(IBV_EXP_PEER_DIRECTION_TO_CPU, 0x8);
	VAL(IBV_EXP_PEER_DIRECTION_TO_HCA, 0x10);
	VAL(IBV_EXP_PEER_DIRECTION_TO_PEER, 0x20);
	VAL(IBV_EXP_PEER_DIRECT_VERSION, 1);
	VAL(IBV_EXP_PEER_PEEK_ABSOLUTE, 0);
	VAL(IBV_EXP_PEER_PEEK_RELATIVE, 1);
	VAL(IBV_EXP_ROLLBACK_ABORT_UNCOMMITED, 1);
	VAL(IBV_EXP_ROLLBACK_ABORT_LATE, 2);
	VAL((unsigned long)IBV_EXP_PEER_IOMEMORY, ~0UL);

	/* verbs_exp.h */
	SZ(struct ibv_exp_send_wr, 288);
	OFF(struct ibv_exp_send_wr, wr_id, 0);
	OFF(struct ibv_exp_send_wr, next, 8);
	OFF(struct ibv_exp_send_wr, sg_list, 16);
	OFF(struct ibv_exp_send_wr, num_sge, 24);
	OFF(struct ibv_exp_send_wr, exp_opcode, 28);
	OFF(struct ibv_exp_send_wr, reserved, 32);
	OFF(struct ibv_exp_send_wr, ex.imm_data, 36);
	OFF(struct ibv_exp_send_wr, ex.invalidate_rkey, 36);
	OFF(struct ibv_exp_send_wr, wr.rdma.remote_addr, 40);
	OFF(struct ibv_exp_send_wr, wr.rdma.rkey, 48);
	OFF(struct ibv_exp_send_wr, wr.atomic.remote_addr, 40);
	OFF(struct ibv_exp_send_wr, wr.atomic.compare_add, 48);
	OFF(struct ibv_exp_send_wr, wr.atomic.swap, 56);
	OFF(struct ibv_exp_send_wr, wr.atomic.rkey, 64);
	OFF(struct ibv_exp_send_wr, wr.ud.ah, 40);
	OFF(struct ibv_exp_send_wr, wr.ud.remote_qpn, 48);
	OFF(struct ibv_exp_send_wr, wr.ud.remote_qkey, 52);
	OFF(struct ibv_exp_send_wr, qp_type.xrc.remote_srqn, 72);
	OFF(struct ibv_exp_send_wr, xrc_remote_srq_num, 72);
	OFF(struct ibv_exp_send_wr, task.rdma.remote_addr, 80);
	OFF(struct ibv_exp_send_wr, task.rdma.rkey, 88);
	OFF(struct ibv_exp_send_wr, task.atomic.compare_add, 88);
	OFF(struct ibv_exp_send_wr, task.atomic.swap, 96);
	OFF(struct ibv_exp_send_wr, task.atomic.rkey, 104);
	OFF(struct ibv_exp_send_wr, task.cqe_wait.cq, 80);
	OFF(struct ibv_exp_send_wr, task.cqe_wait.cq_count, 88);
	OFF(struct ibv_exp_send_wr, task.wqe_enable.qp, 80);
	OFF(struct ibv_exp_send_wr, task.wqe_enable.wqe_count, 88);
	OFF(struct ibv_exp_send_wr, op.calc.calc_op, 112);
	OFF(struct ibv_exp_send_wr, op.calc.data_type, 116);
	OFF(struct ibv_exp_send_wr, op.calc.data_size, 120);
	OFF(struct ibv_exp_send_wr, dc.ah, 128);
	OFF(struct ibv_exp_send_wr, dc.dct_access_key, 136);
	OFF(struct ibv_exp_send_wr, dc.dct_number, 144);
	OFF(struct ibv_exp_send_wr, bind_mw.mw, 152);
	OFF(struct ibv_exp_send_wr, bind_mw.rkey, 160);
	OFF(struct ibv_exp_send_wr, bind_mw.bind_info, 168);
	OFF(struct ibv_exp_send_wr, bind_mw.bind_info.exp_mw_access_flags, 192);
	OFF(struct ibv_exp_send_wr, tso.hdr, 152);
	OFF(struct ibv_exp_send_wr, tso.hdr_sz, 160);
	OFF(struct ibv_exp_send_wr, tso.mss, 162);
	OFF(struct ibv_exp_send_wr, exp_send_flags, 200);
	OFF(struct ibv_exp_send_wr, comp_mask, 208);
	OFF(struct ibv_exp_send_wr, ext_op.umr.umr_type, 216);
	OFF(struct ibv_exp_send_wr, ext_op.umr.memory_objects, 224);
	OFF(struct ibv_exp_send_wr, ext_op.umr.exp_access, 232);
	OFF(struct ibv_exp_send_wr, ext_op.umr.modified_mr, 240);
	OFF(struct ibv_exp_send_wr, ext_op.umr.base_addr, 248);
	OFF(struct ibv_exp_send_wr, ext_op.umr.num_mrs, 256);
	OFF(struct ibv_exp_send_wr, ext_op.umr.mem_list, 264);
	OFF(struct ibv_exp_send_wr, ext_op.masked_atomics.log_arg_sz, 216);
	OFF(struct ibv_exp_send_wr, ext_op.masked_atomics.remote_addr, 224);
	OFF(struct ibv_exp_send_wr, ext_op.masked_atomics.rkey, 232);
	OFF(struct ibv_exp_send_wr, ext_op.masked_atomics.wr_data, 240);
	SZ(gds_send_wr, 288);
	VAL(IBV_EXP_WR_SEND, 2);
	VAL(IBV_EXP_WR_SEND_WITH_INV, 0x48);
	VAL(IBV_EXP_WR_LOCAL_INV, 0x4a);
	VAL(IBV_EXP_WR_BIND_MW, 0x4e);
	VAL(IBV_EXP_WR_TSO, 0x4f);
	VAL(IBV_EXP_WR_CQE_WAIT, 0x62);
	VAL(IBV_EXP_WR_UMR_INVALIDATE, 0x67);
	VAL(IBV_EXP_SEND_SIGNALED, 2);
	VAL(IBV_EXP_SEND_INLINE, 8);
	EQ("IBV_EXP_SEND_IP_CSUM", (unsigned long long)IBV_EXP_SEND_IP_CSUM, 1ULL << 32);
	EQ("IBV_EXP_SEND_EXT_ATOMIC_INLINE", (unsigned long long)IBV_EXP_SEND_EXT_ATOMIC_INLINE, 1ULL << 35);

	SZ(struct ibv_exp_qp_init_attr, 152);
	SZ(gds_qp_init_attr_t, 152);
	OFF(struct ibv_exp_qp_init_attr, send_cq, 8);
	OFF(struct ibv_exp_qp_init_attr, recv_cq, 16);
	OFF(struct ibv_exp_qp_init_attr, srq, 24);
	OFF(struct ibv_exp_qp_init_attr, cap.max_send_wr, 32);
	OFF(struct ibv_exp_qp_init_attr, cap.max_inline_data, 48);
	OFF(struct ibv_exp_qp_init_attr, qp_type, 52);
	OFF(struct ibv_exp_qp_init_attr, sq_sig_all, 56);
	OFF(struct ibv_exp_qp_init_attr, comp_mask, 60);
	OFF(struct ibv_exp_qp_init_attr, pd, 64);
	OFF(struct ibv_exp_qp_init_attr, xrcd, 72);
	OFF(struct ibv_exp_qp_init_attr, exp_create_flags, 80);
	OFF(struct ibv_exp_qp_init_attr, max_inl_recv, 84);
	OFF(struct ibv_exp_qp_init_attr, qpg, 88);
	OFF(struct ibv_exp_qp_init_attr, qpg.qpg_parent, 96);
	OFF(struct ibv_exp_qp_init_attr, qpg.parent_attrib.rss_child_count, 100);
	OFF(struct ibv_exp_qp_init_attr, max_atomic_arg, 104);
	OFF(struct ibv_exp_qp_init_attr, max_inl_send_klms, 108);
	OFF(struct ibv_exp_qp_init_attr, res_domain, 112);
	OFF(struct ibv_exp_qp_init_attr, rx_hash_conf, 120);
	OFF(struct ibv_exp_qp_init_attr, port_num, 128);
	OFF(struct ibv_exp_qp_init_attr, peer_direct_attrs, 136);
	OFF(struct ibv_exp_qp_init_attr, max_tso_header, 144);
	OFF(struct ibv_exp_qp_init_attr, associated_qpn, 148);
	VAL(IBV_EXP_QP_INIT_ATTR_PD, 0x1);
	VAL(IBV_EXP_QP_INIT_ATTR_PEER_DIRECT, 0x400);
	VAL(IBV_EXP_QP_INIT_ATTR_ASSOCIATED_QPN, 0x1000);
	SZ(struct ibv_exp_res_domain, 8);
	SZ(struct ibv_exp_res_domain_init_attr, 12);
	OFF(struct ibv_exp_res_domain_init_attr, thread_model, 4);
	OFF(struct ibv_exp_res_domain_init_attr, msg_model, 8);
	VAL(IBV_EXP_THREAD_SINGLE, 2);
	VAL(IBV_EXP_MSG_FORCE_LOW_LATENCY, 3);
	SZ(struct ibv_exp_destroy_res_domain_attr, 4);
	SZ(struct ibv_exp_cq_init_attr, 24);
	OFF(struct ibv_exp_cq_init_attr, flags, 4);
	OFF(struct ibv_exp_cq_init_attr, res_domain, 8);
	OFF(struct ibv_exp_cq_init_attr, peer_direct_attrs, 16);
	VAL(IBV_EXP_CQ_INIT_ATTR_PEER_DIRECT, 4);

	/* gdsync/core.h */
	VAL(GDS_API_MAJOR_VERSION, 2);
	VAL(GDS_API_MINOR_VERSION, 2);
	VAL(GDS_API_VERSION, 0x00020002);
	VAL(GDS_API_VERSION_COMPATIBLE(0x00020002), 1);
	VAL(GDS_API_VERSION_COMPATIBLE(0x00020005), 1);
	VAL(GDS_API_VERSION_COMPATIBLE(0x00020001), 0);
	VAL(GDS_API_VERSION_COMPATIBLE(0x00030002), 0);
	VAL(GDS_PARAM_VERSION, 0);
	VAL(GDS_NUM_PARAMS, 1);
	VAL(GDS_CREATE_QP_DEFAULT, 0);
	VAL(GDS_CREATE_QP_WQ_ON_GPU, 0x1);
	VAL(GDS_CREATE_QP_TX_CQ_ON_GPU, 0x2);
	VAL(GDS_CREATE_QP_RX_CQ_ON_GPU, 0x4);
	VAL(GDS_CREATE_QP_WQ_DBREC_ON_GPU, 0x20);
	VAL(GDS_MEMORY_GPU, 1);
	VAL(GDS_MEMORY_HOST, 2);
	VAL(GDS_MEMORY_IO, 4);
	VAL(GDS_MEMORY_MASK, 7);
	VAL(GDS_WAIT_POST_FLUSH_REMOTE, 8);
	VAL(GDS_WAIT_POST_FLUSH, 8);
	VAL(GDS_WRITE_PRE_BARRIER_SYS, 0x10);
	VAL(GDS_WRITE_PRE_BARRIER, 0x10);
	VAL(GDS_WRITE_MEMORY_POST_BARRIER_SYS, 0x10);
	VAL(GDS_WRITE_MEMORY_PRE_BARRIER_SYS, 0x20);
	VAL(GDS_MEMBAR_FLUSH_REMOTE, 0x10);
	VAL(GDS_MEMBAR_DEFAULT, 0x20);
	VAL(GDS_MEMBAR_SYS, 0x40);
	VAL(GDS_MEMBAR_MLX5, 0x80);
	VAL(GDS_SEND_INFO_MAX_OPS, 32);
	VAL(GDS_WAIT_INFO_MAX_OPS, 32);
	VAL(GDS_WAIT_COND_GEQ, 0);
	VAL(GDS_WAIT_COND_EQ, 1);
	VAL(GDS_WAIT_COND_AND, 2);
	VAL(GDS_WAIT_COND_NOR, 3);
	VAL(GDS_TAG_SEND, 0);
	VAL(GDS_TAG_WAIT, 1);
	VAL(GDS_TAG_WAIT_VALUE32, 2);
	VAL(GDS_TAG_WRITE_VALUE32, 3);
	VAL(GDS_TAG_WRITE_MEMORY, 4);
	/* wait conditions share CUDA's numbering */
	VAL(GDS_WAIT_COND_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
	VAL(GDS_WAIT_COND_EQ, CU_STREAM_WAIT_VALUE_EQ);
	VAL(GDS_WAIT_COND_AND, CU_STREAM_WAIT_VALUE_AND);
	VAL(GDS_WAIT_COND_NOR, CU_STREAM_WAIT_VALUE_NOR);
	SZ(enum gds_tag, 4);
	SZ(gds_wait_cond_flag_t, 4);

	SZ(struct gds_cq, 16);
	OFF(struct gds_cq, cq, 0);
	OFF(struct gds_cq, curr_offset, 8);
	SZ(struct gds_qp, 56);
	OFF(struct gds_qp, qp, 0);
	OFF(struct gds_qp, send_cq, 8);
	OFF(struct gds_qp, recv_cq, 24);
	OFF(struct gds_qp, res_domain, 40);
	OFF(struct gds_qp, dev_context, 48);
	SZ(gds_send_request_t, 1824);
	OFF(gds_send_request_t, commit, 0);
	OFF(gds_send_request_t, wr, 32);
	OFF(gds_send_request_t, wr[31], 32 + 56 * 31);
	SZ(gds_wait_request_t, 1832);
	OFF(gds_wait_request_t, peek, 0);
	OFF(gds_wait_request_t, wr, 40);
	OFF(gds_wait_request_t, wr[31], 40 + 56 * 31);
	SZ(gds_wait_value32_t, 24);
	OFF(gds_wait_value32_t, ptr, 0);
	OFF(gds_wait_value32_t, value, 8);
	OFF(gds_wait_value32_t, cond_flags, 12);
	OFF(gds_wait_value32_t, flags, 16);
	SZ(gds_write_value32_t, 16);
	OFF(gds_write_value32_t, value, 8);
	OFF(gds_write_value32_t, flags, 12);
	SZ(gds_write_memory_t, 32);
	OFF(gds_write_memory_t, src, 8);
	OFF(gds_write_memory_t, count, 16);
	OFF(gds_write_memory_t, flags, 24);
	SZ(gds_descriptor_t, 40);
	OFF(gds_descriptor_t, tag, 0);
	OFF(gds_descriptor_t, send, 8);
	OFF(gds_descriptor_t, wait, 8);
	OFF(gds_descriptor_t, wait32, 8);
	OFF(gds_descriptor_t, write32, 8);
	OFF(gds_descriptor_t, writemem, 8);

	/* gdsync/mlx5.h */
	SZ(gds_mlx5_dword_wait_info_t, 16);
	OFF(gds_mlx5_dword_wait_info_t, value, 8);
	SZ(gds_mlx5_send_info_t, 40);
	OFF(gds_mlx5_send_info_t, dbrec_ptr, 8);
	OFF(gds_mlx5_send_info_t, dbrec_value, 16);
	OFF(gds_mlx5_send_info_t, db_ptr, 24);
	OFF(gds_mlx5_send_info_t, db_value, 32);
	{
		gds_mlx5_send_info_t si;
		unsigned char b[sizeof(si)];
		memset(&si, 0, sizeof(si));
		si.membar = 1;
		memcpy(b, &si, sizeof(b));
		EQ("membar is bit 0 of byte 0", b[0], 1);
		memset(&si, 0, sizeof(si));
		si.membar_full = 1;
		memcpy(b, &si, sizeof(b));
		EQ("membar_full is bit 1 of byte 0", b[0], 2);
	}
	SZ(gds_mlx5_wait_info_t, 40);
	OFF(gds_mlx5_wait_info_t, cond, 0);
	OFF(gds_mlx5_wait_info_t, cqe_ptr, 8);
	OFF(gds_mlx5_wait_info_t, cqe_value, 16);
	OFF(gds_mlx5_wait_info_t, flag_ptr, 24);
	OFF(gds_mlx5_wait_info_t, flag_value, 32);

	/* gdsync/tools.h */
	SZ(gds_mem_desc_t, 48);
	OFF(gds_mem_desc_t, d_ptr, 0);
	OFF(gds_mem_desc_t, h_ptr, 8);
	OFF(gds_mem_desc_t, bar_ptr, 16);
	OFF(gds_mem_desc_t, flags, 24);
	OFF(gds_mem_desc_t, alloc_size, 32);
	OFF(gds_mem_desc_t, mh, 40);

	if (failures) {
		fprintf(stderr, "abi_layout: %d of %d checks FAILED\n", failures, checks);
		return 1;
	}
	printf("abi_layout: %d checks passed\n", checks);
	return 0;
}
