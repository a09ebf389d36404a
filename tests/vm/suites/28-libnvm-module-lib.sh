#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the libnvm library (libnvm.so) through the helper module kmod/libnvm, as upstream's
# module-path programs run: the controller $NVME_BDF is bound to "libnvm helper" with
# driver_override, vm_libnvm_module (tests/vm/libnvm-lib/vm_libnvm_module.c, built by
# libnvm/vm-build.sh) opens /dev/libnvmN and drives nvm_ctrl_init, nvm_aq_create on
# nvm_dma_map_host memory, identify, an I/O queue pair and reads into host memory and into gpusim
# memory mapped with nvm_dma_map_device, then a second queue pair whose CQ, SQ, PRP lists and
# data live in GPU memory from cudasim's cuMemAlloc (libcuda.so.1 in $STAGE_LIB), and checks
# that all pins are given back. Reads only.
# Here: the library's version check logged ABI 1.0 at debug level, gpusim holds no pin at the
# end, the controller goes back to nvme with its namespace, the module unloads if we loaded it,
# and the kernel log has no warning.
set -uo pipefail

KO=$REPO/kmod/libnvm/libnvm.ko
BIN=$STAGE_BIN/vm_libnvm_module
HELPER="libnvm helper"
die() { echo "libnvm-module-lib suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by libnvm/vm-build.sh from tests/vm/build-host.sh)"
[ -f "$KO" ] || die "missing $KO (built by scripts/vmtest)"
[ -e /dev/gpusim ] || die "/dev/gpusim missing: gpusim not loaded"
dev=/sys/bus/pci/devices/$NVME_BDF
drv_of() { basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null; }
. "$REPO/tests/vm/lib/nvme-userspace.sh"
loaded_here=0

restore() {
	local rc=$?
	nvme_rebind || exit 1
	if [ $loaded_here = 1 ] && grep -q '^libnvm ' /proc/modules; then
		if rmmod libnvm; then echo "ok - rmmod libnvm"; else echo "not ok - rmmod libnvm"; rc=1; fi
	fi
	exit "$rc"
}
trap restore EXIT

. "$REPO/tests/vm/lib/kmsg.sh"
kmsg_mark libnvm-module-lib
if ! grep -q '^libnvm ' /proc/modules; then
	insmod "$KO" || die "insmod $KO"
	loaded_here=1
fi
pins0=$(awk -F: '$1 == "active_pins" { print $2 + 0 }' /sys/kernel/debug/gpusim/stats)
echo "# controller $NVME_BDF, driver $(drv_of); gpusim active_pins $pins0"

echo "$HELPER" > "$dev/driver_override" || die "cannot set driver_override"
[ -n "$(drv_of)" ] && { echo "$NVME_BDF" > "$dev/driver/unbind" || die "cannot unbind $(drv_of)"; }
echo "$NVME_BDF" > "/sys/bus/pci/drivers/$HELPER/bind" || die "cannot bind to $HELPER"
[ "$(drv_of)" = "$HELPER" ] || die "bound to '$(drv_of)', not $HELPER"
devfile=$(ls -d "$dev/$HELPER"/libnvm*/dev 2>/dev/null | head -1)
[ -n "$devfile" ] || die "no libnvm node under $dev"
name=$(basename "$(dirname "$devfile")")
node=/dev/$name
if [ ! -c "$node" ]; then
	IFS=: read -r ma mi < "$devfile"
	mknod "$node" c "$ma" "$mi" || die "mknod $node"
fi
echo "ok - $NVME_BDF bound to \"$HELPER\", node $node"

err=$(mktemp)
NVM_LOG_LEVEL=1 LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$node" 2> "$err"
rc=$?
sed 's/^/# stderr: /' "$err"
[ $rc = 0 ] || die "vm_libnvm_module exited $rc"
grep -q '\[nvm_ctrl_init\] helper module ABI 1\.0, features 0x7' "$err" ||
	die "no debug line of the library's version check (ABI 1.0, features 0x7)"
echo "ok - library's version check: module ABI 1.0, features 0x7 (debug log)"
rm -f "$err"

pins=$(awk -F: '$1 == "active_pins" { print $2 + 0 }' /sys/kernel/debug/gpusim/stats)
[ "$pins" = "$pins0" ] || die "gpusim active_pins $pins after the run, $pins0 before"
[ "$pins" = 0 ] || die "gpusim still holds $pins pins"
echo "ok - gpusim stats: active_pins 0"

# gdrcopy_diag's storage report: this controller, our module's ABI and GPU memory, gpusim's p2p.
diag=$("$REPO/target/release/gdrcopy_diag" --only storage --json) || die "gdrcopy_diag exit $?: $diag"
for want in '"check":"storage","status":"ok"' "\"bdf\":\"$NVME_BDF\",\"driver\":\"$HELPER\",\"node\":\"$node\"" \
	'"abi_major":1,"abi_minor":0,"features":7,"gpu_memory":true' '"p2p_exporter":"gpusim"' '"bar0_bytes":'; do
	grep -qF "$want" <<<"$diag" || die "gdrcopy_diag --only storage lacks $want: $diag"
done
echo "ok - gdrcopy_diag: storage can work ($NVME_BDF on $node, ABI 1.0, features 0x7)"

# Unbind from the helper; the restore trap rebinds nvme and checks the namespace.
echo "$NVME_BDF" > "$dev/driver/unbind" || die "unbind from $HELPER"
log=$(kmsg_since libnvm-module-lib)
grep -q . <<<"$log" || die "the kernel log lost this suite's mark"
if grep -E 'BUG:|WARNING:|Oops|Call Trace' <<<"$log"; then die "kernel warnings (above)"; fi
echo "ok - no kernel warning"
