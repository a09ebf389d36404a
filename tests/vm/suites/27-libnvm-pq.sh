#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the shared GPU-side queue (include/nvm_pq.h), built for the host, on CPU threads that
# stand in for GPU threads, against QEMU's emulated NVMe controller, module-free as suite 26:
# the controller is unbound from nvme (driver_override keeps others off), BAR0 through sysfs
# resource0, memory through /proc/self/pagemap. vm_pq (built by tests/vm/libnvm-pq/vm-build.sh)
# runs 64 threads over 4 queue pairs of odd depths, 500 verified operations each (reads of the
# image pattern, writes to disjoint blocks recorded in $NVME_WRITES, flushes, and error statuses
# that must reach exactly their issuer; PQ_OPS=10000 for the longer run), checks that every
# command completes exactly once, then loses a doorbell: every waiter times out within its
# deadline and nvm_pq_host_reset recovers the queues. nvme is rebound at the end.
# 500 operations per thread are 8,000 commands per queue pair: every SQ wraps 125-216 times and
# every CQ at least 31 (phase flips), which is what the count has to reach; each further thousand
# costs about a minute of TCG time in every CI run and exercises nothing new.
set -uo pipefail

BIN=$STAGE_BIN/vm_pq
die() { echo "libnvm-pq suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by tests/vm/libnvm-pq/vm-build.sh from tests/vm/build-host.sh)"
. "$REPO/tests/vm/lib/nvme-userspace.sh"
nvme_userspace_take

LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$NVME_BDF" "$NVME_WRITES" "${PQ_THREADS:-64}" "${PQ_OPS:-500}"
