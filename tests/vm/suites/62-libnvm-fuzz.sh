#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: hostile, seeded stress of the libnvm helper module (tests/vm/fuzz/libnvm_fuzz.c):
# structure-aware and random ioctls, BAR0 mmaps, controller enables, gpusim freeing mapped
# memory and whole GPU spaces, files closed and processes exiting with live windows, fork
# children, from 3 processes x 3 threads. Two passes with the same seed (the second with
# gpusim scattering BAR pages). After each pass: no libnvm window, no gpusim pin or DMA
# mapping, every BAR page free, no GPU space left. Then the controller goes back to nvme and
# the module unloads; tests/vm/guest.sh rejects any kernel warning.
#
# Replay: VMTEST_FUZZ_SEED=<seed printed below> scripts/vmtest --suite 62-libnvm-fuzz
# (VMTEST_FUZZ_OPS=N changes the operation count per pass).
set -euo pipefail

BIN=$STAGE_BIN/libnvm_fuzz
KO=$REPO/kmod/libnvm/libnvm.ko
GS=/sys/kernel/debug/gpusim/stats
LS=/sys/kernel/debug/libnvm/stats
OPS=${VMTEST_FUZZ_OPS:-100000}
SEED=${VMTEST_FUZZ_SEED:-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')}
case $SEED in 0x*) ;; *) SEED=0x$SEED ;; esac

fail() { echo "libnvm-fuzz suite FAIL (seed $SEED): $*"; exit 1; }
stat_of() { awk -v k="$2:" '$1 == k { print $2 }' "$1"; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no NVMe controller in this VM (scripts/vmtest attaches QEMU's 1b36:0010)"
	exit 0
fi
[ -x "$BIN" ] || fail "missing $BIN (built by tests/vm/libnvm/vm-build.sh)"
[ -f "$KO" ] || fail "missing $KO"
DEV=/sys/bus/pci/devices/$NVME_BDF
echo "libnvm-fuzz: seed $SEED, $OPS operations per pass (replay: VMTEST_FUZZ_SEED=$SEED)"

restore() {
	local rc=$?
	echo 0 > /sys/module/gpusim/parameters/scatter_pages 2>/dev/null || true
	if [ "$(basename "$(readlink "$DEV/driver" 2>/dev/null)" 2>/dev/null)" != nvme ]; then
		[ -e "$DEV/driver" ] && echo "$NVME_BDF" > "$DEV/driver/unbind"
		echo > "$DEV/driver_override"
		echo "$NVME_BDF" > /sys/bus/pci/drivers/nvme/bind || rc=1
	fi
	if grep -q '^libnvm ' /proc/modules; then rmmod libnvm || rc=1; fi
	exit "$rc"
}
trap restore EXIT

insmod "$KO" || fail "insmod"
echo "$NVME_BDF" > "$DEV/driver/unbind"
echo "libnvm helper" > "$DEV/driver_override"
echo "$NVME_BDF" > "/sys/bus/pci/drivers/libnvm helper/bind" || fail "bind to the helper"
node=$(ls "$DEV/libnvm helper/")
[ -c "/dev/$node" ] || fail "/dev/$node missing"

check_clean() { # <pass>
	local i k v
	for i in $(seq 50); do
		[ "$(stat_of "$GS" active_pins)" = 0 ] && [ "$(stat_of "$LS" host_pages)" = 0 ] && break
		sleep 0.2
	done
	for k in host_windows host_pages gpu_windows gpu_pages open_files; do
		v=$(stat_of "$LS" "$k"); [ "$v" = 0 ] || fail "$1: libnvm $k = $v"
	done
	for k in active_pins active_dma_mappings; do
		v=$(stat_of "$GS" "$k"); [ "$v" = 0 ] || fail "$1: gpusim $k = $v"
	done
	[ "$(stat_of "$GS" free_pages)" = "$(stat_of "$GS" pages)" ] || fail "$1: BAR pages not free"
	if grep -q '^space pid' "$GS"; then fail "$1: GPU spaces left: $(grep '^space' "$GS")"; fi
	echo "ok - $1: nothing held ($(stat_of "$LS" total_maps) windows made, $(stat_of "$LS" revoked_windows) revoked, $(stat_of "$LS" controller_stops) controller stops, $(stat_of "$LS" stop_timeouts) timeouts)"
}

t0=$(date +%s)
"$BIN" --dev="/dev/$node" --seed="$SEED" --ops="$OPS" --procs=3 --threads=3 ||
	fail "libnvm_fuzz failed (replay: VMTEST_FUZZ_SEED=$SEED)"
echo "# pass 1: $(($(date +%s) - t0)) s"
check_clean "pass 1"
echo 1 > /sys/module/gpusim/parameters/scatter_pages
t0=$(date +%s)
"$BIN" --dev="/dev/$node" --seed="$SEED" --ops="$OPS" --procs=3 --threads=3 ||
	fail "libnvm_fuzz (scattered BAR pages) failed (replay: VMTEST_FUZZ_SEED=$SEED)"
echo "# pass 2 (scatter_pages=1): $(($(date +%s) - t0)) s"
echo 0 > /sys/module/gpusim/parameters/scatter_pages
check_clean "pass 2"

echo "$NVME_BDF" > "$DEV/driver/unbind"
echo > "$DEV/driver_override"
echo "$NVME_BDF" > /sys/bus/pci/drivers/nvme/bind || fail "rebind to nvme"
rmmod libnvm || fail "rmmod libnvm"
echo "libnvm-fuzz suite: PASS (seed $SEED, 2 x $OPS operations)"
