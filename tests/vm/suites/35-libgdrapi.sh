#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libgdrapi end to end, inside the VM, against our gdrdrv with GPU memory from gpusim.
#   - the library's Rust integration tests (libgdrapi/tests/*.rs): pin/map/copy/unmap/unpin at many
#     sizes and offsets checked against the simulated GPU's view, mapping types, get_info fields,
#     invalidation on free, fork, many processes and threads, stale and foreign handles;
#   - the C consumer of compat-tests/gdrapi (dlopen as NCCL does, -lgdrapi as UCX does, static,
#     ASan/UBSan), now with a live /dev/gdrdrv and real pins;
#   - NCCL from PyPI: with gdr_open succeeding, NCCL must log GDRCOPY enabled with library 2.6 and
#     driver 2.6.
# Pass 1 runs with gdrdrv's defaults (persistent mapping), pass 2 with use_persistent_mapping=0
# (free callbacks, SIGBUS after free); the module is reloaded with defaults at the end, also on
# failure. Everything is built on the host by libgdrapi/tests/vm-build.sh (from build-host.sh).
# The dma-buf backend's test binary (dmabuf_cudasim) is not run here: it never opens gdrdrv, so
# neither pass changes what it tests, and suite 36 runs it on gpusim's dma-bufs and counts them.
set -uo pipefail

STAGE=$REPO/target/vmstage
TESTS=$STAGE/bin/gdrapi-tests
COMPAT=$STAGE/gdrapi-compat
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
STATS=/sys/kernel/debug/gpusim/stats

failures=()
fail() { echo "not ok - $*"; failures+=("$*"); }
pass() { echo "ok - $*"; }
die() { echo "libgdrapi suite FAIL: $*"; exit 1; }

[ -d "$TESTS" ] || die "missing $TESTS (built by libgdrapi/tests/vm-build.sh from tests/vm/build-host.sh)"
[ -x "$COMPAT/consumer_linked" ] || die "missing $COMPAT/consumer_linked (libgdrapi/tests/vm-build.sh)"
[ -c /dev/gpusim ] || die "/dev/gpusim missing: gpusim not loaded"
[ -c /dev/gdrdrv ] || die "/dev/gdrdrv missing: gdrdrv not loaded"

restore() {
	local rc=$?
	if ! grep -q 'persistent mapping: yes' /proc/driver/gdrdrv/params 2>/dev/null || [ ! -c /dev/gdrdrv ]; then
		"$LOAD" "$KO" >/dev/null || { echo "libgdrapi suite FAIL: cannot reload gdrdrv with defaults"; rc=1; }
	fi
	exit "$rc"
}
trap restore EXIT

reload() { "$LOAD" "$KO" "$@" >/dev/null || die "gdrdrv-load $*"; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS" 2>/dev/null; }

# Integration tests, one binary at a time, single-threaded harness (the tests fork).
# A test that prints SKIP here means a device was not seen: that is a failure in the VM.
run_rust_tests() { # <label>
	local t out
	for t in "$TESTS"/*; do
		[ "$(basename "$t")" != dmabuf_cudasim ] || continue # suite 36's (see the top)
		out=$(mktemp)
		# Device tests are #[ignore]d for hosts without devices; here they must run, and a
		# missing device fails them (GPUDIRECT_REQUIRE_DEVICES, libgdrapi/tests/common).
		if GPUDIRECT_REQUIRE_DEVICES=1 timeout 600 "$t" --test-threads=1 --nocapture --include-ignored \
			>"$out" 2>&1; then
			if grep '^SKIP' "$out" | grep -v 'open_without_gdrdrv_returns_null'; then
				fail "$1: $(basename "$t"): tests skipped inside the VM"
			else
				grep -oE '[a-z_]+: gdrdrv in [a-z-]+ mode' "$out" | sort -u | sed 's/^/# /'
				pass "$1: $(basename "$t") ($(grep -E '^test result' "$out" | tail -n1))"
			fi
		else
			sed 's/^/    | /' "$out" | tail -n 80
			fail "$1: $(basename "$t")"
		fi
		rm -f "$out"
	done
}

run_consumers() { # <label>
	local b
	for b in consumer_dlopen consumer_linked consumer_static consumer_dlopen_asan consumer_linked_asan; do
		[ -x "$COMPAT/$b" ] || { echo "# $b not built, skipped"; continue; }
		if env LD_LIBRARY_PATH="$COMPAT/lib" EXPECT_OPEN=ok EXPECT_LIB="$COMPAT/lib/libgdrapi.so" \
			GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=2 ASAN_OPTIONS=detect_leaks=1 \
			"$COMPAT/$b" >"/tmp/$b.log" 2>&1 && grep -q '^# pinned GPU memory from /dev/gpusim' "/tmp/$b.log" &&
			! grep -q '^# SKIP' "/tmp/$b.log"; then
			pass "$1: $b ($(tail -n1 "/tmp/$b.log"))"
		else
			sed 's/^/    | /' "/tmp/$b.log" | grep -vE '^    \| (ok|#)' | tail -n 40
			fail "$1: $b"
		fi
	done
}

check_no_pins_left() { # <label>
	local pins
	pins=$(stat_of active_pins)
	if [ -z "$pins" ]; then echo "# $STATS not readable: pin leak check skipped"
	elif [ "$pins" = 0 ]; then pass "$1: no nvidia_p2p pins left"
	else fail "$1: $pins nvidia_p2p pins still held after the tests"; fi
}

echo "--- libgdrapi: pass 1, gdrdrv defaults (persistent mapping)"
reload
run_rust_tests "persistent"
run_consumers "persistent"
if [ -f "$REPO/.deps/nccl/nvidia/nccl/lib/libnccl.so.2" ]; then
	if out=$("$REPO/compat-tests/gdrapi/nccl-consumer.sh" --libdir "$STAGE_LIB" 2>&1); then
		pass "NCCL loads our libgdrapi and enables GDRCOPY ($(echo "$out" | tail -n1))"
	else
		echo "$out" | sed 's/^/    | /' | tail -n 60
		fail "NCCL consumer"
	fi
else
	fail "NCCL consumer: .deps/nccl missing (libgdrapi/tests/vm-build.sh fetches it on the host)"
fi
check_no_pins_left "persistent"

echo "--- libgdrapi: pass 2, use_persistent_mapping=0 (free callbacks)"
reload use_persistent_mapping=0
grep -q 'persistent mapping: no' /proc/driver/gdrdrv/params || fail "gdrdrv did not switch to non-persistent mode"
run_rust_tests "non-persistent"
run_consumers "non-persistent"
check_no_pins_left "non-persistent"

echo "--- libgdrapi: restoring gdrdrv defaults"
reload
grep -q 'persistent mapping: yes' /proc/driver/gdrdrv/params || fail "defaults not restored"

echo "libgdrapi suite: $(( ${#failures[@]} )) failure(s)"
[ ${#failures[@]} -eq 0 ]
