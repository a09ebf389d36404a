#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libgdrapi's dma-buf mmap backend on real kernel dma-bufs: cudasim on gpusim hands out
# gpusim's exports (kmod/gpusim, exporter "nv_dmabuf") for cuMemGetHandleForAddressRange.
#   pass 1, gpusim dmabuf_mmap=1 (what a CUDA 13.3+ driver allows): the library's dma-buf
#     integration tests (libgdrapi/tests/dmabuf_cudasim.rs, which include the dma-buf copy/unmap
#     race; the gdrdrv race binary runs in suite 35, this one only here) with
#     CUDASIM_BACKEND=gpusim and a 13.3 driver;
#     gpusim's counters must show that its dma-bufs were used and that none is left.
#   pass 2, dmabuf_mmap=0 and the H100 machine's CUDA 13.0 driver (docs/consumers.md): without
#     gdrdrv, gdr_open fails with upstream's four messages, in order, exactly as seen there; with
#     GDRCOPY_USE_DMABUF_MMAP=1 it fails with the version and "requires" lines; with gdrdrv
#     loaded it falls back to (uses) gdrdrv.
# gdrdrv is reloaded with defaults at the end, also on failure.
set -uo pipefail

STAGE=$REPO/target/vmstage
TESTS=$STAGE/bin/gdrapi-tests
COMPAT=$STAGE/gdrapi-compat
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
STATS=/sys/kernel/debug/gpusim/stats
MMAP_PARAM=/sys/module/gpusim/parameters/dmabuf_mmap

failures=()
fail() { echo "not ok - $*"; failures+=("$*"); }
pass() { echo "ok - $*"; }
die() { echo "libgdrapi-dmabuf suite FAIL: $*"; exit 1; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

[ -d "$TESTS" ] || die "missing $TESTS (libgdrapi/tests/vm-build.sh)"
[ -x "$COMPAT/consumer_linked" ] || die "missing $COMPAT/consumer_linked (libgdrapi/tests/vm-build.sh)"
[ -w "$MMAP_PARAM" ] || die "$MMAP_PARAM missing: gpusim without dma-buf export"
[ -r "$STATS" ] || die "$STATS not readable"

restore() {
	local rc=$?
	echo 1 > "$MMAP_PARAM"
	if [ ! -c /dev/gdrdrv ] || ! grep -q 'persistent mapping: yes' /proc/driver/gdrdrv/params 2>/dev/null; then
		"$LOAD" "$KO" >/dev/null || { echo "libgdrapi-dmabuf suite FAIL: cannot reload gdrdrv"; rc=1; }
	fi
	exit "$rc"
}
trap restore EXIT

# --- pass 1 ----------------------------------------------------------------------------------
echo "--- libgdrapi-dmabuf: pass 1, gpusim dma-bufs, mmap allowed"
echo 1 > "$MMAP_PARAM"
export CUDASIM_BACKEND=gpusim   # fail rather than fall back to host memory
exported0=$(stat_of total_dmabufs)
free0=$(stat_of free_pages)
ran=0
# The tests find cudasim as <their directory>/../libcuda.so (cargo's layout); give them that
# layout, with the staged cudasim, in a scratch directory.
W=$(mktemp -d /tmp/libgdrapi-dmabuf.XXXXXX)
mkdir -p "$W/deps"
ln -s "$STAGE_LIB/libcuda.so.1" "$W/libcuda.so"
for t in "$TESTS"/dmabuf_cudasim; do
	[ -x "$t" ] || continue
	ran=$((ran + 1))
	cp "$t" "$W/deps/" || fail "cannot copy $t"
	t=$W/deps/$(basename "$t")
	out=$(mktemp)
	# --nocapture puts a test's SKIP line after its name; an ignored or skipped test would pass
	# without running, so any is a failure here.
	if GPUDIRECT_REQUIRE_DEVICES=1 timeout 600 "$t" --test-threads=1 --nocapture --include-ignored >"$out" 2>&1 &&
		! grep -q 'SKIP' "$out" &&
		grep -qE '^test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' "$out"; then
		pass "$(basename "$t") on gpusim dma-bufs ($(grep -E '^test result' "$out" | tail -n1))"
	else
		sed 's/^/    | /' "$out" | tail -n 60
		fail "$(basename "$t") on gpusim dma-bufs"
	fi
	rm -f "$out"
done
rm -rf "$W"
[ "$ran" -gt 0 ] || fail "no dma-buf test binary in $TESTS"
exported=$(( $(stat_of total_dmabufs) - exported0 ))
if [ "$exported" -gt 0 ]; then pass "the tests used $exported gpusim dma-bufs"
else fail "no gpusim dma-buf was exported: the tests did not run on kernel dma-bufs"; fi
[ "$(stat_of active_dmabufs)" = 0 ] || fail "$(stat_of active_dmabufs) dma-bufs left by the library tests"
[ "$(stat_of free_pages)" = "$free0" ] || fail "free pages $(stat_of free_pages), were $free0"

# --- pass 2 ----------------------------------------------------------------------------------
echo "--- libgdrapi-dmabuf: pass 2, mmap refused (dmabuf_mmap=0), CUDA 13.0 driver as on the H100"
echo 0 > "$MMAP_PARAM"
unset CUDASIM_DRIVER_VERSION   # cudasim's default: 13000, the H100 machine's driver

OUT=$(mktemp)
run_consumer() { # [VAR=value...]: status of the consumer, output in $OUT
	env "$@" LD_LIBRARY_PATH="$COMPAT/lib:$STAGE_LIB" GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=2 \
		timeout 120 "$COMPAT/consumer_linked" >"$OUT" 2>&1
}
# consumer <label> <expected gdr_open: ok|fail> [VAR=value...]: the consumer must pass
consumer() {
	local label=$1 expect=$2; shift 2
	run_consumer "$@" EXPECT_OPEN="$expect"
	local rc=$?
	if [ "$rc" = 0 ]; then pass "$label: consumer ($(tail -n1 "$OUT"))"
	else sed 's/^/    | /' "$OUT" | grep -vE '^    \| ok' | tail -n 30; fail "$label: consumer exit $rc"; fi
}
# expect_lines <label> <line>...: the library's stderr holds exactly these lines, in this order.
expect_lines() {
	local label=$1; shift
	local got want
	# gdr_open's own output: the block the consumer prints after "# library stderr:".
	got=$(awk '/^# library stderr:$/ { on = 1; next } on && !/^(ERR:  |INFO: |WARN: |DBG:  )/ { exit } on' "$OUT")
	want=$(printf '%s\n' "$@")
	if [ "$got" = "$want" ]; then pass "$label: upstream's messages, in order"
	else
		echo "    expected:"; printf '      %s\n' "$@"
		echo "    got:"; echo "$got" | sed 's/^/      /'
		fail "$label: messages differ"
	fi
}

"$LOAD" --unload || fail "cannot unload gdrdrv"
consumer "no gdrdrv" fail
expect_lines "no gdrdrv" \
	"ERR:  error opening driver (errno=2/No such file or directory)" \
	"INFO: gdrdrv is not installed or loaded; detecting if CUDA driver supports dmabuf mmap." \
	"ERR:  dma-buf mmap needs a CUDA 13.3 or newer driver; this driver supports CUDA 13.0" \
	"ERR:  Error: gdrcopy requires gdrdrv or CUDA driver with dmabuf mmap support (at least one is required)"
# The consumer's own log checks assume gdrdrv was tried (not so when forced): only gdr_open's
# result and messages are judged here.
run_consumer GDRCOPY_USE_DMABUF_MMAP=1 EXPECT_OPEN=fail
grep -q '^# gdr_open() = (nil)' "$OUT" && pass "forced dma-buf: gdr_open returns NULL" ||
	fail "forced dma-buf: gdr_open did not return NULL"
expect_lines "forced dma-buf" \
	"ERR:  dma-buf mmap needs a CUDA 13.3 or newer driver; this driver supports CUDA 13.0" \
	"ERR:  Error: gdrcopy requires gdrdrv or CUDA driver with dmabuf mmap support (at least one is required)"
"$LOAD" "$KO" >/dev/null || fail "cannot reload gdrdrv"
consumer "gdrdrv loaded" ok
grep -qFx 'INFO: Using gdrdrv backend' "$OUT" && pass "gdrdrv loaded: gdr_open uses gdrdrv" ||
	fail "gdrdrv loaded: no 'INFO: Using gdrdrv backend'"
rm -f "$OUT"
[ "$(stat_of active_dmabufs)" = 0 ] || fail "$(stat_of active_dmabufs) dma-bufs left"

echo "libgdrapi-dmabuf suite: ${#failures[@]} failure(s)"
[ ${#failures[@]} -eq 0 ]
