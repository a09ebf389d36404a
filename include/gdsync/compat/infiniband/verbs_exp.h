/*
 * <infiniband/verbs_exp.h> for programs written for libgdsync on MLNX_OFED 4, on a machine with
 * plain rdma-core. Found through `pkg-config --cflags gdsync` (which adds .../gdsync/compat to the
 * include path); this project's own text.
 *
 * Where a real MOFED verbs_exp.h sits later on the include path, this file hands over to it, so
 * the compatibility directory never shadows the real thing. Otherwise the experimental-verbs
 * types libgdsync's API embeds come from <gdsync/verbs_exp.h>, which also supplies MOFED's
 * BEGIN_C_DECLS/END_C_DECLS.
 */
#ifndef GDSYNC_COMPAT_INFINIBAND_VERBS_EXP_H
#define GDSYNC_COMPAT_INFINIBAND_VERBS_EXP_H

#if defined(__has_include_next)
#if __has_include_next(<infiniband/verbs_exp.h>)
#define GDSYNC_COMPAT_REAL_VERBS_EXP 1
#endif
#endif

#ifdef GDSYNC_COMPAT_REAL_VERBS_EXP
#include_next <infiniband/verbs_exp.h>
#else
#include <gdsync/verbs_exp.h>
#endif

#endif /* GDSYNC_COMPAT_INFINIBAND_VERBS_EXP_H */
