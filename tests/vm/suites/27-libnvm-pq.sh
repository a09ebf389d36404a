#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the shared GPU-side queue (include/nvm_pq.h), built for the host, on CPU threads that
# stand in for GPU threads, against QEMU's emulated NVMe controller, module-free as suite 26:
# the controller is unbound from nvme (driver_override keeps others off), BAR0 through sysfs
# resource0, memory through /proc/self/pagemap. vm_pq (built by tests/vm/libnvm-pq/vm-build.sh)
# runs 64 threads over 4 queue pairs of odd depths, 2,000 verified operations each (reads of the
# image pattern, writes to disjoint blocks recorded in $NVME_WRITES, flushes, and error statuses
# that must reach exactly their issuer; PQ_OPS=10000 for the longer run), checks that every
# command completes exactly once, then loses a doorbell: every waiter times out within its
# deadline and nvm_pq_host_reset recovers the queues. nvme is rebound at the end.
set -uo pipefail

BIN=$STAGE_BIN/vm_pq
die() { echo "libnvm-pq suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by tests/vm/libnvm-pq/vm-build.sh from tests/vm/build-host.sh)"
dev=/sys/bus/pci/devices/$NVME_BDF
drv_of() { basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null; }

restore() {
	local rc=$?
	echo > "$dev/driver_override" 2>/dev/null
	if [ "$(drv_of)" != nvme ]; then
		[ -n "$(drv_of)" ] && echo "$NVME_BDF" > "$dev/driver/unbind"
		echo "$NVME_BDF" > /sys/bus/pci/drivers/nvme/bind 2>/dev/null || true
	fi
	local n=0
	while [ "$(drv_of)" != nvme ] || ! ls /sys/bus/pci/devices/"$NVME_BDF"/nvme/nvme*/nvme*n1 >/dev/null 2>&1; do
		n=$((n + 1))
		if [ $n -gt 100 ]; then
			echo "not ok - nvme rebound to $NVME_BDF with its namespace (driver: $(drv_of))"
			exit 1
		fi
		sleep 0.2
	done
	echo "ok - nvme rebound to $NVME_BDF, namespace back"
	exit "$rc"
}
trap restore EXIT

echo "# controller $NVME_BDF, driver $(drv_of)"
# Nobody may take the device while we drive it from user space.
echo libnvm-none > "$dev/driver_override" || die "cannot set driver_override"
if [ -n "$(drv_of)" ]; then
	echo "$NVME_BDF" > "$dev/driver/unbind" || die "cannot unbind $(drv_of)"
fi
[ -z "$(drv_of)" ] || die "still bound to $(drv_of)"
echo 1 > "$dev/enable" 2>/dev/null || true
# Bus mastering (PCI command register bit 2) for the controller's DMA.
cmd=$(od -An -tx2 -j4 -N2 "$dev/config" | tr -d ' ')
printf "$(printf '\\x%02x\\x%02x' $((0x$cmd & 0xff | 0x06)) $((0x$cmd >> 8)))" |
	dd of="$dev/config" bs=1 seek=4 count=2 conv=notrunc status=none || die "cannot enable bus mastering"

LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$NVME_BDF" "$NVME_WRITES" "${PQ_THREADS:-64}" "${PQ_OPS:-2000}"
