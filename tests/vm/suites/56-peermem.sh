#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: nv_peer_mem (kmod/nv_peer_mem) on the test-only peer-memory host (kmod/peermem_host,
# the OFED 5.5+ core model, sysfs on) over gpusim. The host's HCA DMA device is the VM's NVMe
# controller; every read goes through the DMA addresses nv_peer_mem produced.
#   - identity: module version, clients nv_mem (new-style, invalidating) and nv_mem_nc
#     (persistent), memory_peers/*/version, the probes NCCL/UCX/NVSHMEM use;
#   - PEERMEM_CYCLES (1000) register -> read -> deregister cycles per client, unaligned starts,
#     ranges across 64 KiB GPU pages, every sysfs counter checked;
#   - invalidation on GPU free, activation delay, persistent pins never invalidated;
#   - PEERMEM_RACES (default 10000) races of GPU free against
#     deregistration: gpusim's pin and page counts must come back exactly (one put per pin);
#   - unload refused while an MR lives; refusal next to nvidia_peermem; rmmod of everything.
# tests/vm/peermem/peermem_test.c. The harness checks dmesg for BUG/WARNING/Oops afterwards.
set -euo pipefail

BIN=$REPO/target/vmstage/bin/peermem_test
KO=$REPO/target/vmstage/kmod
HOST_KO=$KO/peermem_host.ko
NVPM_KO=$KO/nv_peer_mem.ko
FAKE_KO=$KO/nvidia_peermem.ko
GSTATS=/sys/kernel/debug/gpusim/stats
PEERS=/sys/kernel/mm/memory_peers
CYCLES=${PEERMEM_CYCLES:-1000}
PEERMEM_RACES=${PEERMEM_RACES:-10000}   # 10000 took 183 s under TCG on a busy 2-core host

for f in "$BIN" "$HOST_KO" "$NVPM_KO"; do
	[ -e "$f" ] || { echo "missing $f (built by kmod/nv_peer_mem/vm-build.sh)"; exit 1; }
done
[ -e /dev/gpusim ] || { echo "/dev/gpusim missing: gpusim not loaded"; exit 1; }
gstat() { awk -v k="$1:" '$1 == k { print $2 }' "$GSTATS"; }
fail() { echo "not ok - $*"; exit 1; }

cleanup() {
	rmmod nv_peer_mem 2>/dev/null || true
	rmmod nvidia_peermem 2>/dev/null || true
	rmmod peermem_host 2>/dev/null || true
}
trap cleanup EXIT

insmod "$HOST_KO" dma_dev=nvme || fail "insmod peermem_host"
grep -q ib_register_peer_memory_client /proc/kallsyms || fail "libfabric's kallsyms probe finds no peer memory"
insmod "$NVPM_KO" || fail "insmod nv_peer_mem"

# identity, and what the consumers' probes see
[ "$(cat /sys/module/nv_peer_mem/version)" = 1.3-0 ] || fail "/sys/module/nv_peer_mem/version"
[ ! -e /sys/module/nv_peer_mem/parameters/enable_dbg ] || fail "enable_dbg must not be visible (perm 0)"
for c in nv_mem nv_mem_nc; do
	[ "$(cat $PEERS/$c/version)" = 1.3-0 ] || fail "$PEERS/$c/version"
	for f in num_alloc_mrs num_dealloc_mrs num_reg_pages num_dereg_pages num_reg_bytes \
		num_dereg_bytes num_free_callbacks; do
		[ "$(cat $PEERS/$c/$f)" = 0 ] || fail "$PEERS/$c/$f starts at $(cat $PEERS/$c/$f)"
	done
done
echo "ok - identity: version 1.3-0, clients nv_mem + nv_mem_nc, NCCL/UCX/NVSHMEM probe files present"
# The log is read whole first: under pipefail, `dmesg | grep -q` fails whenever grep exits on its
# match before dmesg has written the rest (SIGPIPE).
klog=$(dmesg)
grep -q "registered peer memory client nv_mem version 1.3-0 (invalidating, new-style)" <<< "$klog" ||
	fail "nv_mem did not register as a new-style invalidating client"

pins0=$(gstat active_pins); free0=$(gstat free_pages)
"$BIN" errors
"$BIN" cycles-nv_mem "$CYCLES"
"$BIN" cycles-nv_mem_nc "$CYCLES"
"$BIN" invalidate
"$BIN" defer
"$BIN" persistent 50
echo 1 > /sys/module/gpusim/parameters/scatter_pages
"$BIN" cycles-nv_mem 200
echo 0 > /sys/module/gpusim/parameters/scatter_pages
t0=$(date +%s)
"$BIN" races "$PEERMEM_RACES"
echo "# $PEERMEM_RACES races in $(( $(date +%s) - t0 )) s"
"$BIN" busy
[ "$(gstat active_pins)" = "$pins0" ] || fail "gpusim pins $pins0 -> $(gstat active_pins)"
[ "$(gstat free_pages)" = "$free0" ] || fail "gpusim free pages $free0 -> $(gstat free_pages)"
[ "$(awk '$1 == "live_umems:" {print $2}' /sys/kernel/debug/peermem_host/stats)" = 0 ] || fail "umems left"
echo "ok - no pin, page or MR left"

# sysfs totals: every MR allocated was deallocated, bytes balance, dereg_pages stays 0 (5.5+)
for c in nv_mem nv_mem_nc; do
	a=$(cat $PEERS/$c/num_alloc_mrs); d=$(cat $PEERS/$c/num_dealloc_mrs)
	rb=$(cat $PEERS/$c/num_reg_bytes); db=$(cat $PEERS/$c/num_dereg_bytes)
	[ "$a" = "$d" ] && [ "$rb" = "$db" ] && [ "$(cat $PEERS/$c/num_dereg_pages)" = 0 ] ||
		fail "$c counters: alloc $a dealloc $d reg_bytes $rb dereg_bytes $db"
	echo "ok - $c counters: $a MRs, $(cat $PEERS/$c/num_reg_pages) GPU pages, $rb bytes, $(cat $PEERS/$c/num_free_callbacks) free callbacks"
done

rmmod nv_peer_mem || fail "rmmod nv_peer_mem with no MR left"
[ ! -e $PEERS ] || fail "$PEERS left after the last client went"

# Refusal next to nvidia-peermem (a stand-in module of that name registering nv_mem).
if [ -e "$FAKE_KO" ]; then
	insmod "$FAKE_KO" || fail "insmod the nvidia_peermem stand-in"
	if insmod "$NVPM_KO" 2>/dev/null; then fail "nv_peer_mem loaded next to nvidia_peermem"; fi
	dmesg | tail -n 5 | grep -q "nvidia_peermem is loaded" || fail "no message for the refusal"
	rmmod nvidia_peermem || fail "rmmod stand-in"
	echo "ok - nv_peer_mem refuses to load next to nvidia_peermem, with a message"
	# The host is no kinder than the core: a client without dma_unmap is refused ...
	if insmod "$FAKE_KO" mode=1 2>/dev/null; then fail "a client without dma_unmap was registered"; fi
	dmesg | tail -n 5 | grep -q "missing mandatory function dma_unmap" || fail "no message for the missing op"
	# ... and an MR whose DMA addresses break the contract fails.
	insmod "$FAKE_KO" mode=2 || fail "insmod bad client"
	"$BIN" reject
	rmmod nvidia_peermem || fail "rmmod bad client"
	echo "ok - the host refuses a client without dma_unmap and an MR with a misaligned SG"
else
	echo "SKIP - nvidia_peermem stand-in not built"
fi

# gdrcopy_diag's registration report sees the client as the consumers' probes do.
insmod "$NVPM_KO" || fail "insmod nv_peer_mem for gdrcopy_diag"
diag=$("$REPO/target/release/gdrcopy_diag" --only registration --json) || fail "gdrcopy_diag exit $?: $diag"
for want in '"check":"peer-memory","status":"ok"' '"core":"peermem_host"' '"libfabric_peer_mem":true' \
	'"memory_peers_versions":"nv_mem=1.3-0,nv_mem_nc=1.3-0"' '"nv_peer_mem_version":"1.3-0"' \
	'"nccl_peer_mem":"/sys/kernel/mm/memory_peers/nv_mem/version"' \
	'nv_mem (nv_peer_mem), invalidating; nv_mem_nc (nv_peer_mem), persistent'; do
	grep -qF "$want" <<<"$diag" || fail "gdrcopy_diag --only registration lacks $want: $diag"
done
rmmod nv_peer_mem || fail "rmmod nv_peer_mem after gdrcopy_diag"
echo "ok - gdrcopy_diag reports nv_mem + nv_mem_nc on peermem_host, NCCL/UCX/NVSHMEM/libfabric detect it"

rmmod peermem_host || fail "rmmod peermem_host"
trap - EXIT
echo "ok - all modules unloaded"
