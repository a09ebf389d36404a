#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: hostile, seeded stress of gdrdrv through /dev/gdrdrv (tests/vm/fuzz/gdrdrv_fuzz.c):
# random and structure-aware ioctls, mmap/munmap/mremap/fork, several processes and threads,
# gpusim freeing pinned memory at random moments. Three passes with the same seed: persistent
# mapping (the default), use_persistent_mapping=0 (free callbacks invalidate pins), and
# persistent again with gpusim scattering BAR pages (no two GPU pages contiguous). After
# each pass: no pin left in gpusim or gdrdrv, every BAR page free, gdrdrv unloads. Kernel
# warnings and oopses are caught by tests/vm/guest.sh right after the suite.
#
# Replay: VMTEST_FUZZ_SEED=<seed printed below> scripts/vmtest --suite 60-gdrdrv-fuzz
# (VMTEST_FUZZ_OPS=N changes the operation count per pass).
set -euo pipefail

BIN=$STAGE_BIN/gdrdrv_fuzz
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
STATS=/sys/kernel/debug/gpusim/stats
OPS=${VMTEST_FUZZ_OPS:-100000}
SEED=${VMTEST_FUZZ_SEED:-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')}
case $SEED in 0x*) ;; *) SEED=0x$SEED ;; esac

fail() { echo "gdrdrv-fuzz suite FAIL (seed $SEED): $*"; exit 1; }
step() { echo "--- gdrdrv-fuzz: $*"; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

[ -x "$BIN" ] || fail "missing $BIN (built by tests/vm/fuzz/vm-build.sh)"
[ -f "$KO" ] || fail "missing $KO"
[ -r "$STATS" ] || fail "$STATS not readable"
echo "gdrdrv-fuzz: seed $SEED, $OPS operations per pass (replay: VMTEST_FUZZ_SEED=$SEED)"

restore() {
	local rc=$?
	echo 0 > /sys/module/gpusim/parameters/scatter_pages 2>/dev/null || true
	"$LOAD" "$KO" >/dev/null || { echo "gdrdrv-fuzz: cannot reload gdrdrv"; rc=1; }
	exit "$rc"
}
trap restore EXIT

check_clean() { # <pass name>
	local pins free pages i
	# Pins of processes that just exited are released by their last close: give a lagging
	# release a moment (fork children may still be exiting).
	for i in $(seq 50); do
		[ "$(stat_of active_pins)" = 0 ] && [ "$(stat_of free_pages)" = "$(stat_of pages)" ] && break
		sleep 0.2
	done
	pins=$(stat_of active_pins); free=$(stat_of free_pages); pages=$(stat_of pages)
	[ "$pins" = 0 ] || fail "$1: $pins nvidia_p2p pins outstanding"
	[ "$free" = "$pages" ] || fail "$1: $free of $pages BAR pages free"
	if grep -q '^space pid' "$STATS"; then fail "$1: GPU spaces left: $(grep '^space' "$STATS")"; fi
	if [ -r /proc/driver/gdrdrv/nv_get_pages_refcount ]; then
		[ "$(cat /proc/driver/gdrdrv/nv_get_pages_refcount)" = 0 ] ||
			fail "$1: gdrdrv still counts $(cat /proc/driver/gdrdrv/nv_get_pages_refcount) pins"
	fi
	rmmod gdrdrv || fail "$1: gdrdrv does not unload"
	echo "ok - $1: no pins, all $pages BAR pages free, gdrdrv unloaded ($(stat_of total_pins) pins, $(stat_of callbacks_run) callbacks so far)"
}

run_pass() { # <name> <persistent> <module parameters...>
	local name=$1 persistent=$2 t0 t1
	shift 2
	step "$name"
	"$LOAD" "$KO" "$@" >/dev/null || fail "gdrdrv-load $*"
	t0=$(date +%s)
	"$BIN" --seed="$SEED" --ops="$OPS" --procs=3 --threads=3 --persistent="$persistent" ||
		fail "$name: gdrdrv_fuzz failed (replay: VMTEST_FUZZ_SEED=$SEED)"
	t1=$(date +%s)
	echo "# $name: $((t1 - t0)) s"
	check_clean "$name"
}

SCATTER=/sys/module/gpusim/parameters/scatter_pages
run_pass "persistent mapping" 1
run_pass "non-persistent mapping (free callbacks)" 0 use_persistent_mapping=0 dbg_enabled=1
# Non-contiguous BAR pages: every GPU page its own PAT reservation and PFN run.
[ -w "$SCATTER" ] || fail "$SCATTER missing"
echo 1 > "$SCATTER"
run_pass "persistent mapping, scattered BAR pages" 1
echo 0 > "$SCATTER"
echo "gdrdrv-fuzz suite: PASS (seed $SEED, 3 x $OPS operations)"
