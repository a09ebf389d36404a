#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side build hook of the VM harness, run by scripts/vmtest from the repository root before
# the VM boots (the guest sees the repository read-only and builds nothing itself).
# Everything the suites need must be produced here: the common steps below, then each
# component's hook (listed in HOOKS below, run at the end). Keep each step idempotent and fail
# loudly.
#
#   build-host.sh            everything below, in turn, before the VM boots
#   build-host.sh --phase P  one part of it: cargo (the workspace build), early (EARLY_HOOKS) or
#                            main (the common steps and the other HOOKS); scripts/vmtest runs
#                            cargo, then early in the background beside the kernel-module
#                            builds and main, so that the host build uses both cores
#   build-host.sh --late S   only the LATE_HOOKS of suite S (below), while the VM runs
#   build-host.sh --late-suites   the suites that have a late hook, one per line
#
# Environment: REPO (repository root), KVER (guest kernel version), STAGE (where hooks stage;
# default target/vmstage: scripts/vmtest points late hooks at its frozen snapshot of it),
# VMTEST_NO_CARGO=1 skips the cargo build (for debugging kernel-only suites while the workspace
# does not build).
set -euo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$REPO"
STAGE=${STAGE:-$REPO/target/vmstage}
LATE_SUITE= LATE_LIST=0 PHASES="cargo early main"
case ${1:-} in
--late) LATE_SUITE=${2:?build-host.sh --late SUITE} ;;
--late-suites) LATE_LIST=1 ;;
--phase)
	PHASES=${2:?build-host.sh --phase cargo|early|main}
	case $PHASES in cargo | early | main) ;; *) echo "build-host.sh: unknown phase $PHASES" >&2; exit 2 ;; esac ;;
"") ;;
*) echo "build-host.sh: unknown argument $1" >&2; exit 2 ;;
esac
phase() { [[ " $PHASES " == *" $1 "* ]]; }
mkdir -p "$STAGE/lib" "$STAGE/bin"

step() { printf '[build-host] %s\n' "$*"; }
# cpu_now: sets CPU_NOW to the CPU seconds (user + system) of this script's finished children
# (bash's `times`, in this shell: a $(...) subshell would count its own children only).
CPU_TIMES=$(mktemp)
trap 'rm -f "$CPU_TIMES"' EXIT
cpu_now() {
	times >"$CPU_TIMES"
	CPU_NOW=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/)
		s += a[1] * 60 + a[2] }; printf "%.1f", s }' "$CPU_TIMES")
}
# cpu_since: sets CPU_USED to the CPU seconds used since the last cpu_now.
cpu_since() {
	local c0=$CPU_NOW
	cpu_now
	CPU_USED=$(awk -v a="$CPU_NOW" -v b="$c0" 'BEGIN { printf "%.1f", a - b }')
}

# Each component that stages its own test binaries has one hook named vm-build.sh in its own
# directory (it documents what it produces), run with REPO and STAGE set, in this order. Adding
# a component is one line here; a listed hook that is missing fails the build.
HOOKS=(
	sim/cudasim/vm-build.sh
	libgdrapi/tests/vm-build.sh
	tools/gdrcopy/vm-build.sh
	tests/vm/fuzz/vm-build.sh
	libnvm/vm-build.sh
	tools/nvm/vm-build.sh
	tests/vm/libnvm/vm-build.sh
	tests/vm/libnvm-pq/vm-build.sh
	kmod/nv_peer_mem/vm-build.sh
)
# Early hooks: the ones that need neither the kernel modules nor anything the main phase makes,
# and that take half of the host build's CPU time on one core (cargo test builds of a crate or
# two). Their own phase, which scripts/vmtest runs beside the rest.
EARLY_HOOKS=(
	sim/cudasim/vm-build.sh
	libgdrapi/tests/vm-build.sh
)
# Late hooks: "SUITE HOOK", the one suite that needs what HOOK makes. scripts/vmtest boots the
# VM without them and runs each in the background with STAGE in its snapshot (inputs frozen,
# outputs seen by the guest at once); the suite waits for its mark (tests/vm/lib/late-build.sh).
# They are the slow ones that wait on other builds: UCX (built in the background since the
# first cargo build) and the .debs and their DKMS archives (built by the packages tier).
LATE_HOOKS=(
	"38-ucx compat-tests/ucx/vm-build.sh"
	"70-packages packaging/vm-build.sh"
)
for entry in "${HOOKS[@]}" "${LATE_HOOKS[@]}"; do
	hook=${entry##* }
	[ -f "$REPO/$hook" ] || { step "ERROR: hook $hook is listed in HOOKS but missing"; exit 1; }
done
is_early() { [[ " ${EARLY_HOOKS[*]} " == *" $1 "* ]]; }
for hook in "${EARLY_HOOKS[@]}"; do
	[[ " ${HOOKS[*]} " == *" $hook "* ]] || { step "ERROR: early hook $hook is not in HOOKS"; exit 1; }
done

run_hook() {
	step "$1"
	t0=$SECONDS; cpu_now
	REPO=$REPO STAGE=$STAGE bash "$REPO/$1" || { step "ERROR: hook $1 failed"; exit 1; }
	cpu_since
	step "$1 done in $((SECONDS - t0)) s, $CPU_USED s CPU"
}
if [ "$LATE_LIST" = 1 ]; then
	for entry in "${LATE_HOOKS[@]}"; do echo "${entry%% *}"; done
	exit 0
fi
if [ -n "$LATE_SUITE" ]; then
	for entry in "${LATE_HOOKS[@]}"; do
		[ "${entry%% *}" = "$LATE_SUITE" ] && { run_hook "${entry##* }"; exit 0; }
	done
	step "ERROR: no late hook for suite $LATE_SUITE"
	exit 1
fi

# --- Rust workspace ------------------------------------------------------------------------
if phase cargo; then
	if [ "${VMTEST_NO_CARGO:-0}" != 1 ]; then
		step "cargo build --release --workspace"
		t0=$SECONDS; cpu_now
		cargo build --release --workspace
		cpu_since
		step "cargo build done in $((SECONDS - t0)) s, $CPU_USED s CPU"
	else
		step "cargo build skipped (VMTEST_NO_CARGO=1)"
	fi
fi

if phase early; then
	for hook in "${HOOKS[@]}"; do if is_early "$hook"; then run_hook "$hook"; fi; done
fi
phase main || exit 0

# --- staged libraries: what a real installation would put on the loader path ----------------
# STAGE_LIB (exported to the suites) holds the sonames consumers load; they point at the
# freshly built artifacts so a rebuild needs no restaging.
stage_link() { # <target> <link names...>
	local target=$1; shift
	if [ ! -e "$target" ]; then
		step "warning: $target not built; $* left dangling"
	fi
	for l in "$@"; do ln -sfn "$target" "$STAGE/lib/$l"; done
}
stage_link "$REPO/target/release/libcuda.so" libcuda.so.1 libcuda.so
stage_link "$REPO/target/release/libgdrapi.so" libgdrapi.so.2 libgdrapi.so

# --- gpusim tests ----------------------------------------------------------------------------
step "gpusim_test"
gcc -Wall -Wextra -Werror -O2 -g -pthread \
	-I"$REPO/kmod/gpusim" -I"$REPO/kmod/gpusim/test" \
	-o "$STAGE/bin/gpusim_test" "$REPO/tests/vm/gpusim/gpusim_test.c"
step "dmabuf_test"
gcc -Wall -Wextra -Werror -O2 -g -pthread \
	-I"$REPO/kmod/gpusim" -I"$REPO/kmod/gpusim/test" \
	-o "$STAGE/bin/dmabuf_test" "$REPO/tests/vm/gpusim/dmabuf_test.c"
if [ -f /usr/include/infiniband/verbs.h ]; then
	step "reg_dmabuf_mr"
	gcc -std=gnu11 -Wall -Wextra -Werror -O2 -g -I"$REPO/kmod/gpusim" \
		-o "$STAGE/bin/reg_dmabuf_mr" "$REPO/tests/vm/rdma/reg_dmabuf_mr.c" -libverbs
else
	step "reg_dmabuf_mr not built: no libibverbs-dev (55-rdma-dmabuf will fail and say so)"
	rm -f "$STAGE/bin/reg_dmabuf_mr"
fi

# ---- component hooks (HOOKS, at the top) ----------------------------------------------------
# CUDA headers first: the tools and the gdsync suite compile against cuda.h.
step "scripts/fetch-cuda-headers"
"$REPO/scripts/fetch-cuda-headers" >/dev/null

# --- the suites' own C test programs ---------------------------------------------------------
# Compiled here, not in the guest: gcc under TCG emulation takes 10-20 times as long, on the
# VM's critical path. Same compiler and libraries (the guest boots on the host's root file
# system), same flags as the suites used.
CUDA_INC=$REPO/.deps/cuda/include
step "gdrdrv_test (20-gdrdrv)"
gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gdrdrv" -I"$REPO/kmod/gpusim" \
	-o "$STAGE/bin/gdrdrv_test" "$REPO/tests/vm/gdrdrv/gdrdrv_test.c"
# libgdsync's consumers link against the workspace build; in the guest they run with
# LD_LIBRARY_PATH pointing at the suite's private copy and the staged cudasim.
GDSYNC_LINK=$STAGE/gdsync-link
rm -rf "$GDSYNC_LINK"
mkdir -p "$GDSYNC_LINK"
ln -s "$REPO/target/release/libgdsync.so" "$GDSYNC_LINK/libgdsync.so"
ln -s "$REPO/target/release/libcuda.so" "$GDSYNC_LINK/libcuda.so"
GDSYNC_CF=(-std=gnu11 -Wall -Wextra -Werror -I"$REPO/include" -I"$CUDA_INC")
step "gdsync stream_suite, bench_poll_lat (30-gdsync)"
gcc "${GDSYNC_CF[@]}" -O2 -g "$REPO/compat-tests/gdsync/stream_suite.c" -o "$STAGE/bin/gdsync_stream_suite" \
	-L"$GDSYNC_LINK" -lgdsync -lcuda -lpthread
gcc "${GDSYNC_CF[@]}" -O2 -g "$REPO/compat-tests/gdsync/bench_poll_lat.c" -o "$STAGE/bin/gdsync_bench_poll_lat" \
	-L"$GDSYNC_LINK" -lgdsync -lcuda -lm
if [ -f /usr/include/infiniband/verbs.h ]; then
	step "verbs_loopback, verbs_loopback_asan (50-gdsync-verbs)"
	gcc "${GDSYNC_CF[@]}" -O2 -g "$REPO/compat-tests/gdsync/verbs_loopback.c" \
		-o "$STAGE/bin/verbs_loopback" -L"$GDSYNC_LINK" -lgdsync -libverbs -lcuda -lpthread
	gcc -std=gnu11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
		-I"$REPO/include" -I"$CUDA_INC" "$REPO/compat-tests/gdsync/verbs_loopback.c" -o "$STAGE/bin/verbs_loopback_asan" \
		-L"$GDSYNC_LINK" -lgdsync -libverbs -lcuda -lpthread
else
	step "verbs_loopback not built: no libibverbs-dev (50-gdsync-verbs will fail and say so)"
	rm -f "$STAGE/bin/verbs_loopback" "$STAGE/bin/verbs_loopback_asan"
fi

for hook in "${HOOKS[@]}"; do if ! is_early "$hook"; then run_hook "$hook"; fi; done
