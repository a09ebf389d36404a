#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libgdsync end to end inside the VM: the descriptor suite of compat-tests/gdsync on a
# stream of the simulated libcuda (cudasim), with GPU memory from gpusim, and the GPU-memory case
# (gds_alloc_mapped_memory(GDS_MEMORY_GPU): cuMemAlloc + gdr_pin_buffer/gdr_map through our
# libgdrapi and gdrdrv) that cannot run outside the VM. Then the same under GDS_DISABLE_WAIT_NOR=0
# and the latency benchmark as a smoke test (no timings are judged here: TCG emulation is slow).
# The programs are built on the host by tests/vm/build-host.sh against include/ and the CUDA
# headers (.deps/cuda/include).
set -uo pipefail

LIBGDSYNC=$REPO/target/release/libgdsync.so

die() { echo "gdsync suite FAIL: $*"; exit 1; }
failures=()
fail() { echo "not ok - $*"; failures+=("$*"); }
pass() { echo "ok - $*"; }

[ -f "$LIBGDSYNC" ] || die "missing $LIBGDSYNC (cargo build --release)"
[ -e "$STAGE_LIB/libcuda.so.1" ] || die "missing $STAGE_LIB/libcuda.so.1 (cudasim staged by build-host.sh)"
[ -c /dev/gpusim ] || die "/dev/gpusim missing: gpusim not loaded"
for p in gdsync_stream_suite gdsync_bench_poll_lat; do
	[ -x "$STAGE_BIN/$p" ] || die "missing $STAGE_BIN/$p (tests/vm/build-host.sh)"
done

WORK=$(mktemp -d /tmp/gdsync-suite.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lib"
ln -s "$LIBGDSYNC" "$WORK/lib/libgdsync.so.2"
ln -s "$LIBGDSYNC" "$WORK/lib/libgdsync.so"
ln -s "$STAGE_LIB/libcuda.so.1" "$WORK/lib/libcuda.so"
ln -s "$STAGE_BIN/gdsync_stream_suite" "$WORK/stream_suite"
ln -s "$STAGE_BIN/gdsync_bench_poll_lat" "$WORK/bench_poll_lat"
export LD_LIBRARY_PATH=$WORK/lib:$STAGE_LIB

run_suite() { # <label> [env...]
	local label=$1 out=$WORK/out.txt; shift
	if env "$@" timeout 300 "$WORK/stream_suite" -g >"$out" 2>&1; then
		# In the VM gdrcopy is there: the GPU-memory case must run, not skip.
		if [ "${HAVE_GDRDRV:-0}" = 1 ] && grep -q '^skip test_mapped_gpu_memory' "$out"; then
			sed 's/^/    | /' "$out" | tail -n 30
			fail "$label: test_mapped_gpu_memory skipped although gdrdrv is loaded"
		else
			pass "$label: $(grep '^stream_suite:' "$out")"
		fi
	else
		sed 's/^/    | /' "$out" | tail -n 60
		fail "$label"
	fi
}

run_suite "descriptor suite (default env)"
run_suite "descriptor suite (NOR enabled)" GDS_DISABLE_WAIT_NOR=0
# Plain, then warmed (-w: each timed call follows the same call on a second stream).
for opts in "-n 200 -b 20" "-n 60 -b 20 -w"; do
	# shellcheck disable=SC2086 # the options are words
	if timeout 120 "$WORK/bench_poll_lat" $opts -t 10000 >"$WORK/bench.txt" 2>&1; then
		pass "bench_poll_lat smoke run ($opts)"
		sed 's/^/    | /' "$WORK/bench.txt"
		# The paired ratio is printed, and its interval holds its median.
		if awk '/^paired gds\/batch enqueue/ { gsub(/[(),]/, " "); split($0, w, " ");
				for (i in w) if (w[i] == "CI") { split(w[i + 1], b, "\\.\\."); m = w[i - 2] }
				ok = (m + 0 > 0 && b[1] + 0 <= m + 0 && m + 0 <= b[2] + 0) }
			END { exit !ok }' "$WORK/bench.txt"; then
			pass "bench_poll_lat paired ratio and interval ($opts)"
		else
			fail "bench_poll_lat paired ratio line missing or its interval misses its median ($opts)"
		fi
	else
		sed 's/^/    | /' "$WORK/bench.txt" | tail -n 20
		fail "bench_poll_lat ($opts)"
	fi
done

if [ ${#failures[@]} -ne 0 ]; then
	echo "gdsync suite: ${#failures[@]} failure(s)"
	exit 1
fi
echo "gdsync suite: all passed"
