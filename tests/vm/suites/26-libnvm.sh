#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libnvm against QEMU's emulated NVMe controller, module-free path (as libnvm's
# nvm-identify-userspace runs): the controller is unbound from nvme (and kept from any other
# driver with driver_override), BAR0 is mapped through sysfs resource0, host memory is located
# through /proc/self/pagemap (no IOMMU in this VM: bus = physical). vm_libnvm (built by
# libnvm/vm-build.sh) checks bring-up, identify, > 63 admin commands, queue create/delete and
# their errors, reads with every PRP shape against the image pattern, 2000 reads wrapping the
# queues, writes (recorded in $NVME_WRITES for the host's image check) and error statuses.
# nvme is rebound at the end, also on failure, and must come back with its namespace.
set -uo pipefail

BIN=$STAGE_BIN/vm_libnvm
die() { echo "libnvm suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by libnvm/vm-build.sh from tests/vm/build-host.sh)"
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

LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$NVME_BDF" "$NVME_WRITES"
