#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: cudasim (our libcuda.so.1 stand-in) on the simulated GPU: its unit tests and its dlopen
# tests run with device memory from /dev/gpusim (allocations mapped at their GPU VA), then the
# staged libcuda.so.1 is checked to leave no gpusim memory behind.
# Runs inside the VM as root with gpusim loaded (tests/vm/guest.sh). The test binaries are
# staged by sim/cudasim/vm-build.sh on the host.
set -euo pipefail

BIN=${STAGE_BIN:-$REPO/target/vmstage/bin}/cudasim
STATS=/sys/kernel/debug/gpusim/stats

[ -e /dev/gpusim ] || { echo "not ok - /dev/gpusim missing: gpusim not loaded"; exit 1; }
if [ ! -x "$BIN/unit" ] || [ ! -x "$BIN/dlopen" ]; then
	# Not staged by the host (tests/vm/build-host.sh should run sim/cudasim/vm-build.sh): build
	# them here from a standalone copy (no dependencies: builds offline, everything in /tmp).
	echo "# $BIN not staged: building cudasim's tests in the guest"
	for d in "${CARGO_HOME:-}/bin" /root/.cargo/bin "$HOME/.cargo/bin" /usr/local/cargo/bin; do
		[ -x "$d/cargo" ] && PATH=$PATH:$d
	done
	command -v cargo >/dev/null || { echo "not ok - test binaries not staged and no cargo in the guest"; exit 1; }
	# rustup's state stays where the host keeps it (read-only is fine for running a toolchain).
	[ -n "${RUSTUP_HOME:-}" ] || [ ! -d /root/.rustup ] || export RUSTUP_HOME=/root/.rustup
	BIN=/tmp/cudasim-stage
	CUDASIM_STAGE_DIR=$BIN CARGO_TARGET_DIR=/tmp/cudasim-target CARGO_HOME=/tmp/cudasim-cargo-home \
		CUDASIM_CARGO_FLAGS=--offline CUDASIM_STANDALONE=1 bash "$REPO/sim/cudasim/vm-build.sh" ||
		{ echo "not ok - building cudasim's tests in the guest failed"; exit 1; }
fi
[ -e "$STAGE_LIB/libcuda.so.1" ] || { echo "not ok - missing $STAGE_LIB/libcuda.so.1"; exit 1; }

stat_of() { [ -r "$STATS" ] && awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }
free_before=$(stat_of free_pages || true)

export CUDASIM_BACKEND=gpusim   # fail instead of silently falling back to host memory
export CUDASIM_WAIT_TIMEOUT_MS=60000   # a lost wakeup fails the run instead of hanging it

echo "# cudasim unit tests on /dev/gpusim"
"$BIN/unit" --test-threads=2
echo "ok - cudasim unit tests (gpusim backend)"

echo "# cudasim dlopen tests against the staged $STAGE_LIB/libcuda.so.1"
CUDASIM_LIB=$STAGE_LIB/libcuda.so.1 "$BIN/dlopen" --test-threads=2
echo "ok - cudasim dlopen tests (gpusim backend)"

# Device pointers must really be gpusim GPU VAs (GPUSIM_VA_BASE = 32 TiB), which is what
# gdrdrv pins through nvidia_p2p_get_pages.
out=$(CUDASIM_LIB=$STAGE_LIB/libcuda.so.1 CUDASIM_CHILD=child_gpusim_va "$BIN/dlopen" --exact child_gpusim_va --nocapture 2>&1) ||
	{ echo "$out"; echo "not ok - gpusim VA check failed"; exit 1; }
case $out in *"gpusim va ok"*) ;; *) echo "$out"; echo "not ok - gpusim VA check did not run"; exit 1 ;; esac
echo "ok - cuMemAlloc returns gpusim GPU VAs"

free_after=$(stat_of free_pages || true)
if [ -n "$free_before" ] && [ -n "$free_after" ]; then
	[ "$free_after" = "$free_before" ] ||
		{ echo "not ok - gpusim free pages $free_before before, $free_after after"; exit 1; }
	echo "ok - no gpusim memory left behind ($free_after pages free)"
else
	echo "# skipped leak check: $STATS not readable"
fi
