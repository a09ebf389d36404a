#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Sourced by the storage suites that drive QEMU's NVMe controller from user space without a
# module (26-libnvm, 27-libnvm-pq, 24-vfio-libnvm): nvme_userspace_take unbinds the controller
# ($NVME_BDF) from nvme, keeps every driver off it with driver_override, enables memory decoding
# and bus mastering, and arms an EXIT trap that rebinds nvme (also on failure) and fails the
# suite unless nvme comes back with its namespace. nvme_userspace_take DRIVER binds DRIVER
# (vfio-pci) instead and leaves the command register to it. The caller defines die() and checks
# NVME_BDF.

nvme_dev=/sys/bus/pci/devices/$NVME_BDF
nvme_driver() { basename "$(readlink "$nvme_dev/driver" 2>/dev/null)" 2>/dev/null; }

# Gives the controller back to nvme (whatever holds it) and waits for its namespace; prints
# ok/not ok and fails when nvme does not come back. Also used by the suites that bind the
# controller to the helper module (28, 29) from their own EXIT traps.
nvme_rebind() {
	local n=0
	echo > "$nvme_dev/driver_override" 2>/dev/null
	if [ "$(nvme_driver)" != nvme ]; then
		[ -n "$(nvme_driver)" ] && echo "$NVME_BDF" > "$nvme_dev/driver/unbind"
		echo "$NVME_BDF" > /sys/bus/pci/drivers/nvme/bind 2>/dev/null || true
	fi
	while [ "$(nvme_driver)" != nvme ] || ! ls "$nvme_dev"/nvme/nvme*/nvme*n1 >/dev/null 2>&1; do
		n=$((n + 1))
		if [ $n -gt 100 ]; then
			echo "not ok - nvme rebound to $NVME_BDF with its namespace (driver: $(nvme_driver))"
			return 1
		fi
		sleep 0.2
	done
	echo "ok - nvme rebound to $NVME_BDF, namespace back"
}

nvme_userspace_restore() {
	local rc=$?
	nvme_rebind || exit 1
	exit "$rc"
}

nvme_userspace_take() {
	local drv=${1:-}
	trap nvme_userspace_restore EXIT
	echo "# controller $NVME_BDF, driver $(nvme_driver)"
	# Nobody (but DRIVER) may take the device while we drive it from user space.
	echo "${drv:-libnvm-none}" > "$nvme_dev/driver_override" || die "cannot set driver_override"
	if [ -n "$(nvme_driver)" ]; then
		echo "$NVME_BDF" > "$nvme_dev/driver/unbind" || die "cannot unbind $(nvme_driver)"
	fi
	[ -z "$(nvme_driver)" ] || die "still bound to $(nvme_driver)"
	if [ -n "$drv" ]; then
		echo "$NVME_BDF" > "/sys/bus/pci/drivers/$drv/bind" || die "cannot bind $drv"
		[ "$(nvme_driver)" = "$drv" ] || die "bound to '$(nvme_driver)', not $drv"
		return 0
	fi
	echo 1 > "$nvme_dev/enable" 2>/dev/null || true
	# Memory space and bus mastering (PCI command register bits 1 and 2) for BAR0 and DMA.
	local cmd
	cmd=$(od -An -tx2 -j4 -N2 "$nvme_dev/config" | tr -d ' ')
	printf "$(printf '\\x%02x\\x%02x' $((0x$cmd & 0xff | 0x06)) $((0x$cmd >> 8)))" |
		dd of="$nvme_dev/config" bs=1 seek=4 count=2 conv=notrunc status=none ||
		die "cannot enable bus mastering"
}
