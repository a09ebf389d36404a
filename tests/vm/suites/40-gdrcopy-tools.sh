#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: gdrcopy's test programs (tools/gdrcopy) against our libgdrapi, gdrdrv + gpusim and
# cudasim as libcuda. Runs inside the VM as root (tests/vm/guest.sh) with REPO, STAGE_LIB
# (libcuda.so.1 -> cudasim, libgdrapi.so.2 -> our library) and STAGE_BIN.
#
# Passes:
#   1. gdrdrv with default parameters (persistent pins): gdrcopy_sanity (all cases, and -e),
#      copybw / copylat / apiperf with small sizes, both allocators, and their argument errors;
#   2. gdrdrv reloaded with use_persistent_mapping=0 dbg_enabled=1: gdrcopy_sanity -e again
#      (free-callback invalidation, and the extended leakage case, which needs the debug
#      refcount file);
#   3. the dma-buf mmap backend (cudasim in host-memory mode exporting memfd dma-bufs):
#      gdrcopy_sanity, copybw and apiperf with GDRCOPY_USE_DMABUF_MMAP=1;
#   4. cudasim as coherent platforms (CUDASIM_PLATFORM=coherent, Grace Hopper-like, and
#      coherent-cc10, where FORCE_PCIE applies): gdrcopy_sanity, all cases but one (see there).
#   5. the dma-buf mmap backend on kernel dma-bufs (cudasim on gpusim, which exports the BAR
#      pages as NVIDIA's driver does; dmabuf_mmap=1 as a CUDA 13.3+ driver): gdrcopy_sanity, and
#      copybw / copylat / apiperf with both allocators; gpusim must count the exports;
#   6. the same with mmap refused (gpusim dmabuf_mmap=0, as driver 580 on a discrete GPU):
#      gdr_map fails with the kernel's ENOTSUPP (524), reported by the library, and copybw
#      exits with an error instead of crashing; nothing is left exported.
# gdrdrv is left loaded with default parameters, even when a pass fails.
# Any failed sanity case, data mismatch or unexpected exit status fails the suite, and so does a
# sanity case waived in a pass whose pinned waiver list (WAIVERS_<label> below) does not name it:
# each waiver is a platform fact of that simulator mode, so a new one means a path stopped
# running. A pinned waiver that no longer happens is reported (remove it from the list).
set -uo pipefail

SRC=$REPO/tools/gdrcopy
KO=$REPO/kmod/gdrdrv/gdrdrv.ko
LOAD=$REPO/kmod/gdrdrv/gdrdrv-load
FAILS=()

step() { echo "--- gdrcopy-tools: $*"; }
die() { echo "gdrcopy-tools suite FAIL: $*"; exit 1; }
bad() { FAILS+=("$*"); echo "gdrcopy-tools: FAIL: $*"; }

[ -c /dev/gdrdrv ] || die "/dev/gdrdrv missing: gdrdrv not loaded"
[ -e "$STAGE_LIB/libcuda.so.1" ] && [ -e "$STAGE_LIB/libgdrapi.so.2" ] ||
	die "STAGE_LIB ($STAGE_LIB) lacks libcuda.so.1 or libgdrapi.so.2"

# gpusim's counters: the tools must leave no pins and no device memory behind.
STATS=/sys/kernel/debug/gpusim/stats
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS" 2>/dev/null; }
PINS0=$(stat_of active_pins)
FREE0=$(stat_of free_pages)

WORK=$(mktemp -d /tmp/gdrcopy-tools.XXXXXX)
restore() {
	local rc=$?
	if ! grep -q 'persistent mapping: yes' /proc/driver/gdrdrv/params 2>/dev/null || ! [ -c /dev/gdrdrv ]; then
		"$LOAD" "$KO" >/dev/null || { echo "gdrcopy-tools suite FAIL: cannot reload gdrdrv"; rc=1; }
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap restore EXIT

# --- binaries: built on the host (tools/gdrcopy/vm-build.sh, run by tests/vm/build-host.sh),
# else here from the sources ---------------------------------------------------------------------
if [ -x "${STAGE_BIN:-/nonexistent}/gdrcopy_sanity" ]; then
	BIN=$STAGE_BIN
	step "using the host-built tools in $BIN"
else
	step "tools not staged: building them in $WORK"
	command -v make >/dev/null && command -v gcc >/dev/null || die "no make/gcc in the guest"
	[ -f "$REPO/.deps/cuda/include/cuda.h" ] ||
		die "cuda.h missing: run scripts/fetch-cuda-headers on the host (the guest has no network)"
	cp "$SRC"/*.c "$SRC"/*.h "$SRC"/Makefile "$WORK"/
	make -s -C "$WORK" TOP="$REPO" CUDA_INCLUDE_DIR="$REPO/.deps/cuda/include" \
		gdrcopy_sanity gdrcopy_copybw gdrcopy_copylat gdrcopy_apiperf || die "cannot build the tools"
	BIN=$WORK
fi

export LD_LIBRARY_PATH=$STAGE_LIB
# The programs must load our libraries, not some other installation.
for lib in libgdrapi.so.2 libcuda.so.1; do
	got=$(ldd "$BIN/gdrcopy_sanity" | awk -v l="$lib" '$1 == l { print $3 }')
	[ "$(readlink -f "$got")" = "$(readlink -f "$STAGE_LIB/$lib")" ] ||
		die "gdrcopy_sanity loads $lib from '$got', not from $STAGE_LIB"
done

# run <expected exit> <label> <command...>: runs with output in the log, checks the status.
run() {
	local want=$1 label=$2; shift 2
	local out=$WORK/out.txt rc
	echo "+ $*"
	timeout -k 5 600 "$@" >"$out" 2>&1
	rc=$?
	cat "$out"
	if [ "$rc" != "$want" ]; then
		bad "$label: exit $rc, expected $want"
		return 1
	fi
	return 0
}

# The cases each pass may waive, and why (the simulator's platform facts):
#  forcepci/mix_mappings: cudasim's GPU is not cache-coherent (attribute 100 = 0) and gdrdrv
#    reports no FORCE_PCIE support in non-persistent mode; basic_with_tokens: persistent mode
#    refuses P2P tokens; leakage_pin_pages_fork: needs the debug refcount (dbg_enabled=1, pass 2);
#  dma-buf: one mapping type per pin, and no gdrdrv per-process ownership to check.
FORCEPCI="basic_v2_forcepci_cumemalloc basic_v2_forcepci_vmmalloc data_validation_mix_mappings_cumemalloc
	data_validation_v2_forcepci_cumemalloc"
WAIVERS_default_e="$FORCEPCI basic_with_tokens leakage_pin_pages_fork_cumemalloc"
WAIVERS_nonpersistent_e="$FORCEPCI"
# Coherent platforms (cudasim CUDASIM_PLATFORM): FORCE_PCIE needs compute capability 10.
WAIVERS_coherent="basic_v2_forcepci_cumemalloc basic_v2_forcepci_vmmalloc data_validation_v2_forcepci_cumemalloc
	basic_with_tokens leakage_pin_pages_fork_cumemalloc"
WAIVERS_coherent_cc10="basic_with_tokens leakage_pin_pages_fork_cumemalloc"
WAIVERS_dmabuf="$FORCEPCI basic_with_tokens
	invalidation_fork_after_gdr_map_cumemalloc invalidation_fork_after_gdr_map_vmmalloc
	invalidation_fork_child_gdr_map_parent_cumemalloc invalidation_fork_child_gdr_map_parent_vmmalloc
	invalidation_fork_child_gdr_pin_parent_with_tokens
	invalidation_unix_sock_shared_fd_gdr_map_cumemalloc invalidation_unix_sock_shared_fd_gdr_map_vmmalloc
	invalidation_unix_sock_shared_fd_gdr_pin_buffer_cumemalloc
	invalidation_unix_sock_shared_fd_gdr_pin_buffer_vmmalloc"
WAIVERS_gpusim_dmabuf=$WAIVERS_dmabuf

# check_waivers <label> <sanity output>: the waived cases must be exactly the pinned ones.
check_waivers() {
	local var="WAIVERS_${1//-/_}" got want extra gone
	got=$(grep -E '^&&&& WAIVED ' "$2" | awk '{ print $3 }' | sort -u)
	want=$(printf '%s\n' ${!var:-} | sort -u)
	extra=$(comm -23 <(printf '%s\n' "$got") <(printf '%s\n' "$want") | grep . || true)
	gone=$(comm -13 <(printf '%s\n' "$got") <(printf '%s\n' "$want") | grep . || true)
	[ -z "$extra" ] || bad "sanity $1: waived but not in $var: $(echo $extra)"
	[ -z "$gone" ] || echo "gdrcopy-tools: note: $var lists cases that now run: $(echo $gone) (remove them)"
	echo "[$1] waived: $(printf "%s\n" "$got" | grep -c .) (pinned list: $var)"
}

# sanity <label> [options]: all cases must pass or be waived; prints the per-case statuses.
# SANITY_ENV: extra VAR=value words for its environment.
SANITY_ENV=
sanity() {
	local label=$1; shift
	local out=$WORK/sanity-$label.txt rc
	echo "+ gdrcopy_sanity -v $*"
	# shellcheck disable=SC2086
	env GDRCOPY_SANITY_TIMEOUT=240 $SANITY_ENV timeout -k 5 850 "$BIN/gdrcopy_sanity" -v "$@" >"$out" 2>&1
	rc=$?
	grep -v -e '^DBG:' -e '^&&&& ' "$out"
	echo "[$label] per-case status:"
	grep -E '^&&&& (PASSED|FAILED|WAIVED) ' "$out" | sed "s/^&&&& /[$label]   /"
	[ "$rc" = 0 ] || bad "sanity $label: exit $rc"
	grep -qE '^[0-9]+ passed, 0 failed$' "$out" || bad "sanity $label: no '<n> passed, 0 failed' summary"
	grep -q '^&&&& FAILED' "$out" && bad "sanity $label: failed cases: $(grep '^&&&& FAILED' "$out" | cut -d' ' -f3 | tr '\n' ' ')"
	check_waivers "$label" "$out"
	return 0
}

# --- pass 1: defaults ---------------------------------------------------------------------------
step "pass 1: gdrdrv defaults ($(grep 'persistent' /proc/driver/gdrdrv/params))"
run 0 "sanity -h" "$BIN/gdrcopy_sanity" -h
run 0 "sanity -l" "$BIN/gdrcopy_sanity" -l
n=$("$BIN/gdrcopy_sanity" -l | grep -c '^    ')
[ "$n" = 37 ] || bad "sanity -l lists $n cases, expected 36 + 1 extended"
run 1 "sanity unknown test" "$BIN/gdrcopy_sanity" -t no_such_test
run 1 "sanity bad option" "$BIN/gdrcopy_sanity" -x
sanity default-e -e

run 0 "copybw" "$BIN/gdrcopy_copybw" -s 262144 -w 50 -r 20
grep -q '^write BW: ' "$WORK/out.txt" && grep -q '^read BW: ' "$WORK/out.txt" || bad "copybw output lacks BW lines"
grep -q '^GPU id:0; name: .*; Bus id: [0-9a-f]\{4\}:[0-9a-f]\{2\}:[0-9a-f]\{2\}$' "$WORK/out.txt" ||
	bad "copybw output lacks the GPU id line"
run 0 "copybw -l offset" "$BIN/gdrcopy_copybw" -l -s 131072 -c 65536 -o 12 -w 5 -r 5
run 0 "copybw cuMemCreate wc" "$BIN/gdrcopy_copybw" -a cuMemCreate -M wc -s 196608 -c 65540 -o 4 -w 10 -r 10
run 1 "copybw odd offset" "$BIN/gdrcopy_copybw" -o 3 -s 65536
run 1 "copybw offset past the end" "$BIN/gdrcopy_copybw" -o 65536 -s 65536
run 1 "copybw bad allocator" "$BIN/gdrcopy_copybw" -a malloc
run 0 "copylat" "$BIN/gdrcopy_copylat" -s 131072 -w 200 -r 100
grep -q '^gdr_copy_from_mapping' "$WORK/out.txt" || bad "copylat output lacks the read table"
run 0 "copylat -c cuMemCreate" "$BIN/gdrcopy_copylat" -c -a cuMemCreate -s 65536 -w 150 -r 10
run 1 "copylat cold cache on WC" "$BIN/gdrcopy_copylat" -C -s 65536 -w 10 -r 10
run 0 "apiperf" "$BIN/gdrcopy_apiperf" -s 262144 -n 10 -w 2
grep -q '^Histogram of gdr_pin_buffer latency for 262144 bytes' "$WORK/out.txt" || bad "apiperf output lacks the histogram"
run 0 "apiperf cuMemCreate" "$BIN/gdrcopy_apiperf" -a cuMemCreate -s 131072 -n 5 -w 1

# --- pass 2: non-persistent pins, debug refcount -------------------------------------------------
step "pass 2: gdrdrv use_persistent_mapping=0 dbg_enabled=1"
if "$LOAD" "$KO" use_persistent_mapping=0 dbg_enabled=1 >/dev/null; then
	sanity nonpersistent-e -e
	run 0 "copybw (non-persistent)" "$BIN/gdrcopy_copybw" -s 131072 -w 20 -r 10
	refc=$(cat /proc/driver/gdrdrv/nv_get_pages_refcount 2>/dev/null)
	[ "$refc" = 0 ] || bad "nv_get_pages_refcount is '$refc' after the tools, expected 0"
else
	bad "cannot reload gdrdrv with use_persistent_mapping=0 dbg_enabled=1"
fi
"$LOAD" "$KO" >/dev/null || bad "cannot reload gdrdrv with defaults"

# --- pass 3: dma-buf mmap backend -----------------------------------------------------------------
step "pass 3: dma-buf mmap backend (cudasim host memory, CUDASIM_DMABUF=1)"
DMABUF_ENV="CUDASIM_BACKEND=host CUDASIM_DMABUF=1 CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1"
SANITY_ENV=$DMABUF_ENV sanity dmabuf
# shellcheck disable=SC2086
run 0 "copybw (dma-buf)" env $DMABUF_ENV "$BIN/gdrcopy_copybw" -s 131072 -w 20 -r 10
grep -q '^info.page_size: 4096$' "$WORK/out.txt" || bad "copybw (dma-buf): not on the dma-buf backend (page size)"
# apiperf pins growing sizes from one start address, as CUDA allows for dma-bufs too.
# shellcheck disable=SC2086
run 0 "apiperf (dma-buf)" env $DMABUF_ENV "$BIN/gdrcopy_apiperf" -s 262144 -n 5 -w 1
grep -q '^Histogram of gdr_pin_buffer latency for 262144 bytes' "$WORK/out.txt" || bad "apiperf (dma-buf) lacks the histogram"

# --- pass 4: coherent platforms ------------------------------------------------------------------
# cudasim as a Grace Hopper-like (coherent, compute capability 9) and a Grace Blackwell-like
# (coherent, 10: FORCE_PCIE applies) machine, gdrdrv with defaults (persistent pins).
# data_validation_mix_mappings needs the CPU side of coherence too: gdrdrv gives caching
# mappings only of memory it sees as cacheable, and gpusim's BAR on x86 is write-combining I/O
# memory (gdrdrv answers EOPNOTSUPP), so that case is not run here; every other case is.
pass4_cases=()
while read -r c; do
	[ "$c" = data_validation_mix_mappings_cumemalloc ] || pass4_cases+=(-t "$c")
done < <("$BIN/gdrcopy_sanity" -l | sed -n 's/^    //p')
[ ${#pass4_cases[@]} -eq 72 ] || bad "pass 4: expected 36 sanity cases, got $((${#pass4_cases[@]} / 2))"
for mode in coherent coherent-cc10; do
	step "pass 4: CUDASIM_PLATFORM=$mode (all cases but data_validation_mix_mappings_cumemalloc)"
	SANITY_ENV="CUDASIM_PLATFORM=$mode" sanity "$mode" -e "${pass4_cases[@]}"
done
SANITY_ENV=
# --- pass 5: dma-buf mmap backend on gpusim's kernel dma-bufs -------------------------------------
MMAP_PARAM=/sys/module/gpusim/parameters/dmabuf_mmap
step "pass 5: dma-buf mmap backend on gpusim dma-bufs (dmabuf_mmap=1)"
GPU_DMABUF_ENV="CUDASIM_BACKEND=gpusim CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1"
if [ -w "$MMAP_PARAM" ]; then
	t45=$SECONDS
	echo 1 > "$MMAP_PARAM"
	exported0=$(stat_of total_dmabufs)
	SANITY_ENV=$GPU_DMABUF_ENV sanity gpusim-dmabuf
	# shellcheck disable=SC2086
	{
		run 0 "copybw (gpusim dma-buf)" env $GPU_DMABUF_ENV "$BIN/gdrcopy_copybw" -s 262144 -w 20 -r 10
		grep -q '^info.page_size: 4096$' "$WORK/out.txt" || bad "copybw (gpusim dma-buf): not on the dma-buf backend"
		run 0 "copybw cuMemCreate (gpusim dma-buf)" env $GPU_DMABUF_ENV "$BIN/gdrcopy_copybw" -a cuMemCreate -s 131072 -w 10 -r 10
		run 0 "copylat (gpusim dma-buf)" env $GPU_DMABUF_ENV "$BIN/gdrcopy_copylat" -s 65536 -w 50 -r 20
		grep -q '^gdr_copy_from_mapping' "$WORK/out.txt" || bad "copylat (gpusim dma-buf) lacks the read table"
		run 0 "apiperf (gpusim dma-buf)" env $GPU_DMABUF_ENV "$BIN/gdrcopy_apiperf" -s 131072 -n 5 -w 1
		grep -q '^Histogram of gdr_pin_buffer latency for 131072 bytes' "$WORK/out.txt" || bad "apiperf (gpusim dma-buf) lacks the histogram"
		run 0 "apiperf cuMemCreate (gpusim dma-buf)" env $GPU_DMABUF_ENV "$BIN/gdrcopy_apiperf" -a cuMemCreate -s 65536 -n 3 -w 1
	}
	n=$(( $(stat_of total_dmabufs) - exported0 ))
	[ "$n" -gt 0 ] && echo "gdrcopy-tools: pass 5 used $n gpusim dma-bufs" || bad "pass 5 exported no gpusim dma-buf"
	[ "$(stat_of active_dmabufs)" = 0 ] || bad "$(stat_of active_dmabufs) gpusim dma-bufs left after pass 5"

	# --- pass 6: the same exports with mmap refused -------------------------------------------
	step "pass 6: gpusim dma-bufs with mmap refused (dmabuf_mmap=0)"
	echo 0 > "$MMAP_PARAM"
	# shellcheck disable=SC2086
	env $GPU_DMABUF_ENV GDRCOPY_ENABLE_LOGGING=1 timeout -k 5 120 "$BIN/gdrcopy_copybw" -s 65536 -w 1 -r 1 >"$WORK/out.txt" 2>&1
	rc=$?
	echo 1 > "$MMAP_PARAM"
	cat "$WORK/out.txt"
	if [ "$rc" = 0 ] || [ "$rc" -ge 124 ]; then
		bad "copybw with mmap refused: exit $rc, expected a plain failure"
	fi
	grep -q 'ERR:  mmap of the dma-buf failed (errno=524)' "$WORK/out.txt" ||
		bad "copybw with mmap refused: the library did not report the kernel's ENOTSUPP (524)"
	[ "$(stat_of active_dmabufs)" = 0 ] || bad "$(stat_of active_dmabufs) gpusim dma-bufs left after pass 6"
	echo "gdrcopy-tools: passes 5 and 6 took $((SECONDS - t45)) s"
else
	bad "$MMAP_PARAM missing: gpusim without dma-buf export"
fi

if [ -n "$PINS0" ]; then
	[ "$(stat_of active_pins)" = "$PINS0" ] || bad "gpusim active_pins $(stat_of active_pins), was $PINS0 before the suite"
	[ "$(stat_of free_pages)" = "$FREE0" ] || bad "gpusim free_pages $(stat_of free_pages), was $FREE0 before the suite"
else
	echo "gdrcopy-tools: $STATS not readable: leak check skipped"
fi

if [ ${#FAILS[@]} -ne 0 ]; then
	printf 'gdrcopy-tools: %s\n' "${FAILS[@]}"
	die "${#FAILS[@]} check(s) failed"
fi
echo "gdrcopy-tools suite: all passes OK"
