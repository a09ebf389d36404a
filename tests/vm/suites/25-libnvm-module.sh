#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the libnvm helper module (kmod/libnvm) through its raw ioctl/mmap ABI
# (tests/vm/libnvm/libnvm_test.c, no library): QEMU's NVMe controller bound to the helper,
# brought up by hand, identify and reads into host and gpusim memory, unmap, a child dying with
# live windows, a GPU free under a mapped window, bad arguments, unbind with live windows,
# rebinding to nvme. Then: the module unloads and the kernel log carries exactly the lines the
# test provoked. Runs inside the VM as root (tests/vm/guest.sh) with gpusim loaded.
set -euo pipefail

KO=$REPO/kmod/libnvm/libnvm.ko
BIN=$STAGE_BIN/libnvm_test
fail() { echo "libnvm-module suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no NVMe controller in this VM (scripts/vmtest attaches QEMU's 1b36:0010)"
	exit 0
fi
[ -f "$KO" ] || fail "missing $KO (built by scripts/vmtest)"
[ -x "$BIN" ] || fail "missing $BIN (built by tests/vm/libnvm/vm-build.sh)"
[ -e /dev/gpusim ] || fail "/dev/gpusim missing: gpusim not loaded"

# Whatever happens, leave the controller on nvme and the module unloaded.
restore() {
	local rc=$?
	local dev=/sys/bus/pci/devices/$NVME_BDF
	if [ "$(basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null)" != nvme ]; then
		[ -e "$dev/driver" ] && echo "$NVME_BDF" > "$dev/driver/unbind"
		echo > "$dev/driver_override"
		echo "$NVME_BDF" > /sys/bus/pci/drivers/nvme/bind || rc=1
	fi
	if grep -q '^libnvm ' /proc/modules; then rmmod libnvm || rc=1; fi
	exit "$rc"
}
trap restore EXIT

. "$REPO/tests/vm/lib/kmsg.sh"
kmsg_mark libnvm-module
insmod "$KO" || fail "insmod $KO"
grep -q 'libnvm helper loaded' <<<"$(kmsg_since libnvm-module)" || fail "no load line"
# nvme holds the controller, so loading must not have taken it
[ "$(basename "$(readlink "/sys/bus/pci/devices/$NVME_BDF/driver")")" = nvme ] ||
	fail "insmod took the controller away from nvme"
[ -d "/sys/bus/pci/drivers/libnvm helper" ] || fail "PCI driver \"libnvm helper\" missing"

"$BIN"

drv=$(basename "$(readlink "/sys/bus/pci/devices/$NVME_BDF/driver")")
[ "$drv" = nvme ] || fail "controller bound to $drv after the test, not nvme"
rmmod libnvm || fail "rmmod libnvm"
echo "ok - rmmod libnvm"

log=$(kmsg_since libnvm-module)
grep -q . <<<"$log" || fail "the kernel log lost this suite's mark"
for want in "Adding controller device: $NVME_BDF" "Character device /dev/libnvm0 created" \
	"GPU driver reclaimed 16 GPU pages" "stopping the controller" \
	"Controller device removed: $NVME_BDF" "libnvm helper unloaded"; do
	grep -qF "$want" <<<"$log" || fail "kernel log lacks \"$want\""
done
if grep -E 'BUG:|WARNING:|Oops|Call Trace' <<<"$log"; then fail "kernel warnings (above)"; fi
echo "ok - kernel log: bind, revocation, stops, unbind and unload lines; no warning"
