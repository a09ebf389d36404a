/*
 * <infiniband/peer_ops.h> for programs written for libgdsync on MLNX_OFED 4, on a machine with
 * plain rdma-core (see verbs_exp.h next to this file). Hands over to a real MOFED peer_ops.h found
 * later on the include path; otherwise declares the peer-direct types through
 * <gdsync/peer_ops.h>. MOFED's peer_ops.h includes verbs.h, whose last line includes verbs_exp.h,
 * so this one brings both, and with them the standard headers MOFED's brought (stdio, stdlib,
 * errno, ...).
 */
#ifndef GDSYNC_COMPAT_INFINIBAND_PEER_OPS_H
#define GDSYNC_COMPAT_INFINIBAND_PEER_OPS_H

#if defined(__has_include_next)
#if __has_include_next(<infiniband/peer_ops.h>)
#define GDSYNC_COMPAT_REAL_PEER_OPS 1
#endif
#endif

#ifdef GDSYNC_COMPAT_REAL_PEER_OPS
#include_next <infiniband/peer_ops.h>
#else
#include <infiniband/verbs.h>
#include <gdsync/verbs_exp.h>
#endif

#endif /* GDSYNC_COMPAT_INFINIBAND_PEER_OPS_H */
