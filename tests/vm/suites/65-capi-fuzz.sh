#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the C-API fuzzer (compat-tests/fuzz/capi_fuzz.c, ASan/UBSan) against the real kernel
# path: libgdrapi over gdrdrv, cudasim over gpusim. Random gdr_*/gds_* sequences with valid,
# stale, foreign, forged and NULL arguments; every result checked against docs/return-values.md
# and docs/gdsync.md. Two passes: gdrdrv defaults (persistent) and use_persistent_mapping=0
# (freed buffers invalidate their pins). Afterwards no pin and no BAR page may be left in gpusim.
# Replay: VMTEST_FUZZ_SEED=<seed printed below> scripts/vmtest --suite 65-capi-fuzz
set -euo pipefail

BIN=$STAGE_BIN/capi_fuzz
LIBS=$REPO/target/vmstage/capi-fuzz/lib
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
STATS=/sys/kernel/debug/gpusim/stats
OPS=${VMTEST_FUZZ_OPS:-30000}
SEED=${VMTEST_FUZZ_SEED:-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')}
case $SEED in 0x*) ;; *) SEED=0x$SEED ;; esac

fail() { echo "capi-fuzz suite FAIL (seed $SEED): $*"; exit 1; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

[ -x "$BIN" ] || fail "missing $BIN (built by tests/vm/fuzz/vm-build.sh)"
[ -r "$STATS" ] || fail "$STATS not readable"
restore() {
	local rc=$?
	"$LOAD" "$KO" >/dev/null || { echo "capi-fuzz: cannot reload gdrdrv"; rc=1; }
	exit "$rc"
}
trap restore EXIT

pass() { # <name> <module parameters...>
	local name=$1 i
	shift
	echo "--- capi-fuzz: $name"
	"$LOAD" "$KO" "$@" >/dev/null || fail "gdrdrv-load $*"
	local out rc=0
	out=$(mktemp)
	env -u GDRCOPY_USE_DMABUF_MMAP -u GDRCOPY_ENABLE_LOGGING LD_LIBRARY_PATH="$LIBS" \
		CUDASIM_BACKEND=gpusim CUDASIM_WAIT_TIMEOUT_MS=5000 \
		ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		timeout 600 "$BIN" --backend=gdrdrv --seed="$SEED" --ops="$OPS" >"$out" 2>&1 || rc=$?
	# The libraries' own error lines for the refused calls are expected; show the rest.
	grep -v -e '^\[[0-9]*\] GDS ' -e '^ERR: ' -e '^WARN: ' -e '^INFO: ' "$out" | tail -n 60
	rm -f "$out"
	[ "$rc" = 0 ] || fail "$name: capi_fuzz exit $rc (replay: VMTEST_FUZZ_SEED=$SEED)"
	for i in $(seq 25); do [ "$(stat_of active_pins)" = 0 ] && break; sleep 0.2; done
	[ "$(stat_of active_pins)" = 0 ] || fail "$name: $(stat_of active_pins) pins left in gpusim"
	[ "$(stat_of free_pages)" = "$(stat_of pages)" ] || fail "$name: BAR pages left allocated"
	echo "ok - $name: no pins or BAR pages left"
}

echo "capi-fuzz: seed $SEED, $OPS operations per pass (replay: VMTEST_FUZZ_SEED=$SEED)"
pass "gdrdrv persistent"
pass "gdrdrv non-persistent" use_persistent_mapping=0
echo "capi-fuzz suite: PASS (seed $SEED)"
