/*
 * A program in the shape of those written for upstream libgdsync on MLNX_OFED 4: it includes the
 * MOFED header names, wraps its own declarations in BEGIN_C_DECLS/END_C_DECLS (which MOFED's verbs.h
 * provided), switches over MOFED's experimental opcodes and peer ops, and calls the mlx5 info
 * helpers. compat-tests/gdsync/run.sh builds it against an installed prefix with nothing but
 * `pkg-config --cflags --libs gdsync` (plus cuda.h's directory), -Wall -Wextra -Werror, as C and as
 * C++ (the C++ build also instantiates <gdsync/device.cuh>'s `S::T` member type), then runs it.
 */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs_exp.h>
#include <infiniband/peer_ops.h>
#include <gdsync.h>
#include <gdsync/mlx5.h>
#include <gdsync/tools.h>
#ifdef __cplusplus
#include <gdsync/device.cuh>
#endif

BEGIN_C_DECLS
int opcode_needs_remote(enum ibv_exp_wr_opcode op);
const char *peer_op_name(enum ibv_exp_peer_op op);
END_C_DECLS

/* A switch over MOFED's values: a wrong value that collides with another case does not compile. */
int opcode_needs_remote(enum ibv_exp_wr_opcode op)
{
	switch (op) {
	case IBV_EXP_WR_RDMA_WRITE:
	case IBV_EXP_WR_RDMA_WRITE_WITH_IMM:
	case IBV_EXP_WR_RDMA_READ:
	case IBV_EXP_WR_ATOMIC_CMP_AND_SWP:
	case IBV_EXP_WR_ATOMIC_FETCH_AND_ADD:
		return 1;
	case IBV_EXP_WR_SEND:
	case IBV_EXP_WR_SEND_WITH_IMM:
	case IBV_EXP_WR_SEND_WITH_INV:
	case IBV_EXP_WR_LOCAL_INV:
	case IBV_EXP_WR_BIND_MW:
	case IBV_EXP_WR_TSO:
	case IBV_EXP_WR_SEND_ENABLE:
	case IBV_EXP_WR_RECV_ENABLE:
	case IBV_EXP_WR_CQE_WAIT:
		return 0;
	default:
		return -1;
	}
}

const char *peer_op_name(enum ibv_exp_peer_op op)
{
	switch (op) {
	case IBV_EXP_PEER_OP_FENCE: return "fence";
	case IBV_EXP_PEER_OP_STORE_DWORD: return "store32";
	case IBV_EXP_PEER_OP_STORE_QWORD: return "store64";
	case IBV_EXP_PEER_OP_POLL_AND_DWORD: return "poll_and";
	case IBV_EXP_PEER_OP_POLL_GEQ_DWORD: return "poll_geq";
	case IBV_EXP_PEER_OP_POLL_NOR_DWORD: return "poll_nor";
	default: return "other";
	}
}

#ifdef __cplusplus
/* Device code written for upstream names the semaphore word type S::T. */
template <typename S> static typename S::T sem_value(const S &s) { return s.value; }
#endif

static int failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #c); failures++; } } while (0)

int main(void)
{
	CHECK(IBV_EXP_WR_SEND_WITH_INV == 0x48);
	CHECK(IBV_EXP_WR_LOCAL_INV == 0x4a);
	CHECK(IBV_EXP_WR_BIND_MW == 0x4e);
	CHECK(opcode_needs_remote(IBV_EXP_WR_RDMA_READ) == 1 && opcode_needs_remote(IBV_EXP_WR_SEND_WITH_INV) == 0);
	CHECK(strcmp(peer_op_name(IBV_EXP_PEER_OP_POLL_GEQ_DWORD), "poll_geq") == 0);

	struct ibv_exp_send_wr wr;
	memset(&wr, 0, sizeof(wr));
	wr.exp_opcode = IBV_EXP_WR_SEND;
	wr.exp_send_flags = IBV_EXP_SEND_SIGNALED;
	gds_send_wr *gwr = &wr; /* the gds typedef is the MOFED struct */
	CHECK(gwr->exp_opcode == IBV_EXP_WR_SEND);

	int version = 0;
	CHECK(gds_query_param(GDS_PARAM_VERSION, &version) == 0 && (unsigned)version == GDS_API_VERSION);

	/* The mlx5 helpers: argument errors are reported as upstream does, without a GPU. */
	gds_mlx5_dword_wait_info_t dwi;
	CHECK(gds_mlx5_get_dword_wait_info(NULL, 1, GDS_MEMORY_HOST, &dwi) == EINVAL);
	gds_send_request_t sreq;
	gds_mlx5_send_info_t sinfo;
	memset(&sreq, 0, sizeof(sreq));
	CHECK(gds_mlx5_get_send_info(1, &sreq, NULL) == EINVAL);
	gds_wait_request_t wreq;
	gds_mlx5_wait_info_t winfo;
	memset(&wreq, 0, sizeof(wreq));
	CHECK(gds_mlx5_get_wait_info(1, &wreq, NULL) == EINVAL);
	(void)sinfo;
	(void)winfo;
#ifdef __cplusplus
	gdsync::isem32_t s;
	s.value = 7;
	gdsync::isem32_t::T v = sem_value(s);
	CHECK(v == 7u);
	gdsync::sem32_t::T w = 3;
	CHECK(w == 3u);
#endif
	printf("mofed_consumer (%s): %s\n", sizeof(void *) == 8 ? "LP64" : "?", failures ? "FAILED" : "passed");
	return failures ? 1 : 0;
}
