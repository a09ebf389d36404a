#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: GPU memory for RDMA through dma-buf, on the VM's soft-RoCE device (rdma_rxe on lo).
# tests/vm/rdma/reg_dmabuf_mr.c registers a gpusim dma-buf three ways and records the answers:
# ibv_reg_dmabuf_mr (rdma-core's rxe provider has no reg_dmabuf_mr: EOPNOTSUPP before the kernel
# is asked), the kernel's UVERBS_METHOD_REG_DMABUF_MR called directly (6.1's rxe driver has no
# reg_user_mr_dmabuf: EOPNOTSUPP), and ibv_reg_mr on
# the dma-buf's CPU mapping (PFN memory without struct pages: pin_user_pages fails, EFAULT).
# The expected answers are asserted, so a silent success or an errno-less failure fails the suite.
set -uo pipefail

BIN=$REPO/target/vmstage/bin/reg_dmabuf_mr
die() { echo "rdma-dmabuf suite FAIL: $*"; cleanup; exit 1; }
RXE_ADDED=0
RXE_LOADED=0
cleanup() {
	[ "$RXE_ADDED" = 1 ] && rdma link delete rxe0 2>/dev/null
	RXE_ADDED=0
	if [ "$RXE_LOADED" = 1 ]; then
		modprobe -r rdma_rxe || echo "warning: cannot unload rdma_rxe"
		RXE_LOADED=0
	fi
}

[ -x "$BIN" ] || die "missing $BIN (tests/vm/build-host.sh builds it where libibverbs-dev is installed)"
command -v rdma >/dev/null || die "the rdma tool (iproute2) is missing"
[ "$(cat /sys/module/gpusim/parameters/dmabuf_mmap)" = Y ] || die "gpusim dmabuf_mmap is not 1"

ip link set lo up
if ! lsmod | grep -q '^rdma_rxe'; then
	modprobe rdma_rxe || die "modprobe rdma_rxe"
	RXE_LOADED=1
fi
rdma link add rxe0 type rxe netdev lo || die "rdma link add rxe0 type rxe netdev lo"
RXE_ADDED=1
echo "# kernel $(uname -r), $(dpkg-query -W -f='rdma-core ${Version}' rdma-core 2>/dev/null)"

# Recorded on Debian's 6.1.0-56 with rdma-core 44: ibv_reg_dmabuf_mr EOPNOTSUPP (95), the
# kernel method EOPNOTSUPP (95: the method exists, rxe lacks the driver op), the CPU mapping
# EFAULT (14). Any change of these answers fails the suite, to be looked at.
out=$(timeout 60 "$BIN" -d rxe0 -e 95,95,14 2>&1)
rc=$?
echo "$out"
cleanup
[ $rc -eq 0 ] || { echo "rdma-dmabuf suite FAIL: reg_dmabuf_mr exit $rc"; exit 1; }
echo "rdma-dmabuf suite: every refusal reported as expected"
