#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: UCX's gdr_copy transport (Debian's UCX, built on the host by compat-tests/ucx) moving
# data through our libgdrapi inside the VM, every byte checked through the CUDA driver
# (compat-tests/ucx/uct_gdr_check.c), in UCX's default configuration:
#   pass 1, gdrdrv + gpusim: cudasim on gpusim memory, gdr_open through /dev/gdrdrv;
#   negative, gdrdrv unloaded and gpusim's dma-buf mmap refused: gdr_open fails, and UCX lists
#     cuda_copy but no gdr_copy;
#   pass 2, gpusim dma-bufs: gdrdrv unloaded, CUDA 13.3 reported, GDRCOPY_USE_DMABUF_MMAP=1;
#     gpusim's counters must show that dma-bufs were used and that none is left.
# gdrdrv is reloaded with defaults and dma-buf mmap re-allowed at the end, also on failure.
set -uo pipefail

STAGE=$REPO/target/vmstage
UCXT=$STAGE/ucx
RUN=$REPO/compat-tests/ucx/run.sh
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
STATS=/sys/kernel/debug/gpusim/stats
MMAP_PARAM=/sys/module/gpusim/parameters/dmabuf_mmap

failures=()
fail() { echo "not ok - $*"; failures+=("$*"); }
pass() { echo "ok - $*"; }
die() { echo "ucx suite FAIL: $*"; exit 1; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

. "$REPO/tests/vm/lib/late-build.sh"
late_build_wait 38-ucx || die "no UCX build (compat-tests/ucx/vm-build.sh, a late hook)"
[ -x "$UCXT/uct_gdr_check" ] || die "missing $UCXT/uct_gdr_check (compat-tests/ucx/vm-build.sh)"
[ -c /dev/gpusim ] || die "/dev/gpusim missing: gpusim not loaded"
[ -w "$MMAP_PARAM" ] || die "$MMAP_PARAM missing: gpusim without dma-buf export"
[ -r "$STATS" ] || die "$STATS not readable"

restore() {
	local rc=$?
	echo 1 > "$MMAP_PARAM"
	if [ ! -c /dev/gdrdrv ] || ! grep -q 'persistent mapping: yes' /proc/driver/gdrdrv/params 2>/dev/null; then
		"$LOAD" "$KO" >/dev/null || { echo "ucx suite FAIL: cannot reload gdrdrv"; rc=1; }
	fi
	exit "$rc"
}
trap restore EXIT

# run_checks <label> [run.sh options] [-- VAR=value...]
run_checks() {
	local label=$1; shift
	local opts=() vars=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	vars=("$@")
	local out
	out=$(mktemp)
	env "${vars[@]}" bash "$RUN" --prebuilt "$UCXT" --mode gpusim "${opts[@]}" >"$out" 2>&1
	local rc=$?
	sed 's/^/    /' "$out"
	if [ "$rc" = 0 ]; then pass "$label: $(tail -n1 "$out")"; else fail "$label: $(tail -n1 "$out")"; fi
	rm -f "$out"
}

# --- pass 1: gdrdrv + gpusim ---------------------------------------------------------------
echo "--- ucx: pass 1, gdrdrv + gpusim"
[ -c /dev/gdrdrv ] || "$LOAD" "$KO" >/dev/null || fail "cannot load gdrdrv"
exported0=$(stat_of total_dmabufs)
run_checks "gdrdrv" -- CUDASIM_BACKEND=gpusim GDRCOPY_USE_DMABUF_MMAP=0
[ "$(stat_of total_dmabufs)" = "$exported0" ] && pass "gdrdrv pass used no dma-buf" ||
	fail "gdrdrv pass exported dma-bufs: not the gdrdrv backend"

# --- negative: neither gdrdrv nor dma-buf mmap ------------------------------------------------
echo "--- ucx: gdr_open failing (no gdrdrv, dma-buf mmap refused)"
"$LOAD" --unload || fail "cannot unload gdrdrv"
echo 0 > "$MMAP_PARAM"
run_checks "no gdrdrv, no dma-buf mmap" --negative-only -- CUDASIM_BACKEND=gpusim CUDASIM_DRIVER_VERSION=13000

# --- pass 2: gpusim dma-bufs ------------------------------------------------------------------
echo "--- ucx: pass 2, gpusim dma-bufs (no gdrdrv)"
echo 1 > "$MMAP_PARAM"
exported0=$(stat_of total_dmabufs)
free0=$(stat_of free_pages)
run_checks "gpusim dma-bufs" -- CUDASIM_BACKEND=gpusim CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1
exported=$(( $(stat_of total_dmabufs) - exported0 ))
if [ "$exported" -gt 0 ]; then pass "the UCX run used $exported gpusim dma-bufs"
else fail "no gpusim dma-buf was exported: UCX did not run on kernel dma-bufs"; fi
[ "$(stat_of active_dmabufs)" = 0 ] || fail "$(stat_of active_dmabufs) dma-bufs left after UCX exited"
[ "$(stat_of free_pages)" = "$free0" ] || fail "free pages $(stat_of free_pages), were $free0"

echo "ucx suite: ${#failures[@]} failure(s)"
[ ${#failures[@]} -eq 0 ]
