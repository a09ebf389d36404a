/*
 * libgdsync (GPUDirect Async) public header, API 2.2.
 *
 * Include this header, then optionally <gdsync/mlx5.h> and <gdsync/tools.h>.
 * The peer-direct and experimental-verbs types the API embeds come from <gdsync/peer_ops.h> and
 * <gdsync/verbs_exp.h> (MLNX_OFED used to provide them; rdma-core does not).
 */
#pragma once
#ifndef __GDSYNC_H__
#define __GDSYNC_H__

#include <infiniband/verbs.h>
#include <gdsync/peer_ops.h>
#include <gdsync/verbs_exp.h>
#include <cuda.h>
#include <gdrapi.h>

#ifdef __cplusplus
#define GDS_BEGIN_DECLS extern "C" {
#define GDS_END_DECLS   }
#else
#define GDS_BEGIN_DECLS
#define GDS_END_DECLS
#endif

GDS_BEGIN_DECLS
#include <gdsync/core.h>
GDS_END_DECLS

#endif /* __GDSYNC_H__ */
