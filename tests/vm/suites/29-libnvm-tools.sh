#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the libnvm tools (tools/nvm, built by tools/nvm/vm-build.sh) on QEMU's NVMe controller.
# nvm-identify through the helper module and module-free (sysfs resource0 + pagemap), checked
# field by field against QEMU's controller; nvm-read-blocks into host memory (module and
# module-free) and into GPU memory (cudasim's cuMemAlloc over gpusim, nvm_dma_map_device),
# each output file compared with the image pattern (tests/vm/nvme/image.py, including the writes
# other suites recorded in $NVME_WRITES); nvm-bench with the kernel baseline, which must print
# both goal ratios and exit 0 (the goals are reported, not asserted: TCG timings are relative).
# VMTEST_NVM_BENCH_MS sets the bench's time per point (default 500; a long run: 5000).
# At the end nvme has the controller back with its namespace, gpusim holds no pin, the helper
# holds no window, the module unloads if we loaded it, and the kernel log has no warning.
set -uo pipefail

KO=$REPO/kmod/libnvm/libnvm.ko
HELPER="libnvm helper"
BENCH_MS=${VMTEST_NVM_BENCH_MS:-500}
die() { echo "libnvm-tools suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
for b in nvm-identify nvm-identify-userspace nvm-read-blocks nvm-bench; do
	[ -x "$STAGE_BIN/$b" ] || die "missing $STAGE_BIN/$b (built by tools/nvm/vm-build.sh from tests/vm/build-host.sh)"
done
[ -f "$KO" ] || die "missing $KO (built by scripts/vmtest)"
[ -e /dev/gpusim ] || die "/dev/gpusim missing: gpusim not loaded"
export LD_LIBRARY_PATH=$STAGE_LIB
dev=/sys/bus/pci/devices/$NVME_BDF
drv_of() { basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null; }
. "$REPO/tests/vm/lib/nvme-userspace.sh"
loaded_here=0
tmp=$(mktemp -d)

restore() {
	local rc=$?
	nvme_rebind || exit 1
	if [ $loaded_here = 1 ] && grep -q '^libnvm ' /proc/modules; then
		if rmmod libnvm; then echo "ok - rmmod libnvm"; else echo "not ok - rmmod libnvm"; rc=1; fi
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap restore EXIT

. "$REPO/tests/vm/lib/kmsg.sh"
kmsg_mark libnvm-tools
if ! grep -q '^libnvm ' /proc/modules; then
	insmod "$KO" || die "insmod $KO"
	loaded_here=1
fi
gstat() { awk -F: -v k="$1" '$1 == k { print $2 + 0 }' /sys/kernel/debug/gpusim/stats; }
lstat() { awk -v k="$1:" '$1 == k { print $2 + 0 }' /sys/kernel/debug/libnvm/stats; }
pins0=$(gstat active_pins)

# The namespace's size as the kernel sees it (512-byte sectors = QEMU's blocks), before we take it.
nsdir=$(ls -d "$dev"/nvme/nvme*/nvme*n1 2>/dev/null | head -1)
[ -n "$nsdir" ] || die "nvme has no namespace on $NVME_BDF at the start"
nblocks=$(cat "$nsdir/size")
echo "# controller $NVME_BDF, driver $(drv_of), namespace $(basename "$nsdir") of $nblocks blocks; gpusim pins $pins0"

# expect OFFSET_BYTES LENGTH_BYTES FILE: FILE holds what the image has there (the pattern, or
# a recorded write where a suite wrote).
expect() {
	python3 - "$REPO/tests/vm/nvme" "$1" "$2" "$3" "${NVME_WRITES:-}" <<'EOF'
import os, sys
sys.path.insert(0, sys.argv[1])
import image
off, length, path, writes = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
exp = image.pattern_words(off, length // 8)
if writes and os.path.exists(writes):
    for line in open(writes):
        if line.strip():
            w_off, w_len, seed = (int(x, 0) for x in line.split())
            lo, hi = max(off, w_off), min(off + length, w_off + w_len)
            if lo < hi:
                exp[(lo - off) // 8:(hi - off) // 8] = image.written_words(seed, lo, (hi - lo) // 8)
got = open(path, "rb").read()
if got != exp.tobytes():
    n = min(len(got), len(exp.tobytes()))
    first = next((i for i in range(n) if got[i] != exp.tobytes()[i]), n)
    sys.exit(f"{path}: {len(got)} bytes, expected {length}; first difference at byte {first}")
EOF
}

# identify_checks OUTPUT_FILE WHAT: the report's fields against QEMU's controller.
identify_checks() {
	local f=$1 what=$2 bad=0
	while IFS= read -r re; do
		grep -Eq "^$re\$" "$f" || { echo "# missing line /^$re\$/"; bad=1; }
	done <<EOF
------------- Controller information -------------
PCI Vendor ID           : 36 1b
PCI Subsystem Vendor ID : f4 1a
NVM Express version     : 1\.4\.0
Controller page size    : 4096
Max queue entries       : 2048
Serial Number           : gpudirect-rs {8}
Model Number            : QEMU NVMe Ctrl {26}
Firmware revision       : [0-9][0-9.]+ *
Max data transfer size  : 524288
Max outstanding commands: 0
Max number of namespaces: 256
Current number of CQs   : [1-9][0-9]*
Current number of SQs   : [1-9][0-9]*
------------- Namespace  information -------------
Namespace identifier    : 1
Logical block size      : 512 bytes
Namespace size          : $nblocks blocks
Namespace capacity      : $nblocks blocks
EOF
	[ $bad = 0 ] || { sed 's/^/# /' "$f"; die "$what: report does not match QEMU's controller"; }
	echo "ok - $what: QEMU NVMe Ctrl, serial gpudirect-rs, 1.4.0, MDTS 512 KiB, namespace 1 of $nblocks blocks"
}

# --- through the helper module -----------------------------------------------------------------
echo "$HELPER" > "$dev/driver_override" || die "cannot set driver_override"
[ -n "$(drv_of)" ] && { echo "$NVME_BDF" > "$dev/driver/unbind" || die "cannot unbind $(drv_of)"; }
echo "$NVME_BDF" > "/sys/bus/pci/drivers/$HELPER/bind" || die "cannot bind to $HELPER"
devfile=$(ls -d "$dev/$HELPER"/libnvm*/dev 2>/dev/null | head -1)
[ -n "$devfile" ] || die "no libnvm node under $dev"
node=/dev/$(basename "$(dirname "$devfile")")
if [ ! -c "$node" ]; then
	IFS=: read -r ma mi < "$devfile"
	mknod "$node" c "$ma" "$mi" || die "mknod $node"
fi
echo "ok - $NVME_BDF bound to \"$HELPER\", node $node"

"$STAGE_BIN/nvm-identify" --ctrl="$node" --ns=1 > "$tmp/id-module" 2> "$tmp/id-module.err" ||
	{ cat "$tmp/id-module.err"; die "nvm-identify --ctrl=$node failed"; }
grep -q '^Resetting controller and setting up admin queues\.\.\.$' "$tmp/id-module.err" &&
	grep -q '^Goodbye!$' "$tmp/id-module.err" || die "nvm-identify: upstream's stderr lines missing"
identify_checks "$tmp/id-module" "nvm-identify --ctrl=$node (module)"

"$STAGE_BIN/nvm-identify" > /dev/null 2>&1
rc=$?
[ $rc = 99 ] || die "nvm-identify without --ctrl exited $rc, not 99"
"$STAGE_BIN/nvm-identify" --ctrl=/dev/null > /dev/null 2>&1 && die "nvm-identify --ctrl=/dev/null succeeded"
echo "ok - nvm-identify: no --ctrl exits 99, a non-controller node fails"

# 2000 blocks at 4096 in chunks of 777 (partial last page, several commands per chunk).
"$STAGE_BIN/nvm-read-blocks" --ctrl "$node" --blocks 2000 --offset 4096 --chunk 777 --output "$tmp/host.bin" \
	2> "$tmp/rb.err" || { cat "$tmp/rb.err"; die "nvm-read-blocks (host memory) failed"; }
grep -q '^Done in [0-9]*us, ' "$tmp/rb.err" || { cat "$tmp/rb.err"; die "nvm-read-blocks: no 'Done in' line"; }
expect $((4096 * 512)) $((2000 * 512)) "$tmp/host.bin" || die "nvm-read-blocks (host memory): file differs from the image"
echo "ok - nvm-read-blocks into module-pinned host memory: 2000 blocks at LBA 4096 (chunks of 777) equal the image"

pins_before=$(gstat active_pins)
"$STAGE_BIN/nvm-read-blocks" --ctrl "$node" --gpu --blocks 3000 --offset 12345 --output "$tmp/gpu.bin" \
	2> "$tmp/rb.err" || { cat "$tmp/rb.err"; die "nvm-read-blocks --gpu failed"; }
expect $((12345 * 512)) $((3000 * 512)) "$tmp/gpu.bin" || die "nvm-read-blocks --gpu: file differs from the image"
[ "$(gstat active_pins)" = "$pins_before" ] || die "gpusim pins $(gstat active_pins) after --gpu, $pins_before before"
echo "ok - nvm-read-blocks --gpu (cuMemAlloc, nvm_dma_map_device): 3000 blocks at LBA 12345 equal the image; pins given back"

"$STAGE_BIN/nvm-read-blocks" --ctrl "$node" --blocks 1 > "$tmp/dump" 2> "$tmp/rb.err" || die "nvm-read-blocks dump failed"
first=$(head -n1 "$tmp/dump")
want="       0:  00 00 00 00 00 00 00 a5 08 00 00 00 00 00 00 a5 10 00 00 00 00 00 00 a5 18 00 00 00 00 00 00 a5"
[ "$first" = "$want" ] || die "hex dump line 1 is '$first'"
[ "$(wc -l < "$tmp/dump")" = 16 ] || die "hex dump of 512 bytes is not 16 lines"
"$STAGE_BIN/nvm-read-blocks" --ctrl "$node" --blocks 8 --offset "$nblocks" > /dev/null 2>&1
[ $? = 2 ] || die "nvm-read-blocks past the namespace end did not exit 2"
echo "ok - nvm-read-blocks: hex dump as upstream, a range past the end refused"
[ "$(lstat host_windows)" = 0 ] && [ "$(lstat gpu_windows)" = 0 ] ||
	die "the helper holds windows after the tools: $(cat /sys/kernel/debug/libnvm/stats | tr '\n' ' ')"

# --- module-free: sysfs resource0 + pagemap ------------------------------------------------------
echo "$NVME_BDF" > "$dev/driver/unbind" || die "unbind from $HELPER"
echo libnvm-none > "$dev/driver_override" || die "cannot set driver_override"
"$STAGE_BIN/nvm-identify-userspace" --ctrl="$NVME_BDF" --ns=1 > "$tmp/id-user" 2> "$tmp/id-user.err" ||
	{ cat "$tmp/id-user.err"; die "nvm-identify-userspace --ctrl=$NVME_BDF failed"; }
identify_checks "$tmp/id-user" "nvm-identify-userspace --ctrl=$NVME_BDF (module-free)"
"$STAGE_BIN/nvm-read-blocks" --ctrl "$NVME_BDF" --blocks 1500 --offset 70000 --output "$tmp/user.bin" \
	2> "$tmp/rb.err" || { cat "$tmp/rb.err"; die "nvm-read-blocks (module-free) failed"; }
expect $((70000 * 512)) $((1500 * 512)) "$tmp/user.bin" || die "nvm-read-blocks (module-free): file differs from the image"
echo "ok - nvm-read-blocks module-free: 1500 blocks at LBA 70000 equal the image"
# Our path only (--ctrl), on the controller as it is now: no kernel ratio, one queue.
"$STAGE_BIN/nvm-bench" --ctrl "$NVME_BDF" --qd 1,32 --queues 1 --time-ms 300 > "$tmp/bench" 2> "$tmp/bench.err"
rc=$?
sed 's/^/# /' "$tmp/bench"
[ $rc = 0 ] || { sed 's/^/# stderr: /' "$tmp/bench.err"; die "nvm-bench --ctrl $NVME_BDF exited $rc"; }
[ "$(grep -c '^libnvm  userspace' "$tmp/bench")" = 2 ] || die "nvm-bench --ctrl $NVME_BDF: not 2 points"
grep -q '^ratio our QD32 / kernel 1-thread QD1 IOPS: not measured' "$tmp/bench" ||
	die "nvm-bench --ctrl: the kernel ratio is not reported as not measured"
echo "ok - nvm-bench module-free (--ctrl BDF, QD 1 and 32, 300 ms each)"

# --- bench: kernel baseline, then our path through the module ---------------------------------------
echo > "$dev/driver_override"
t0=$SECONDS
"$STAGE_BIN/nvm-bench" --bdf "$NVME_BDF" --path module --time-ms "$BENCH_MS" > "$tmp/bench" 2> "$tmp/bench.err"
rc=$?
sed 's/^/# /' "$tmp/bench"
[ -s "$tmp/bench.err" ] && sed 's/^/# stderr: /' "$tmp/bench.err"
[ $rc = 0 ] || die "nvm-bench exited $rc"
[ "$(grep -c '^libnvm .* queues [1-4]  qd  *\(1\|8\|32\): ' "$tmp/bench")" = 12 ] || die "nvm-bench: not 12 points of our path"
grep -q '^kernel  /dev/nvme.*qd  1: ' "$tmp/bench" || die "nvm-bench: no kernel baseline"
grep -Eq '^ratio our QD32 / kernel 1-thread QD1 IOPS: [0-9.]+ \(goal >= 5: (met|NOT met)\)$' "$tmp/bench" &&
	grep -Eq '^ratio our QD32 / our QD1 IOPS: [0-9.]+ \(goal >= 10: (met|NOT met)\)$' "$tmp/bench" ||
	die "nvm-bench: a ratio line is missing"
echo "ok - nvm-bench (module path, ${BENCH_MS} ms per point, $((SECONDS - t0)) s): both ratios printed; goals $(grep -c ': met)$' "$tmp/bench")/2 met"
[ "$(drv_of)" = nvme ] || die "nvm-bench left $NVME_BDF bound to '$(drv_of)'"

[ "$(gstat active_pins)" = "$pins0" ] || die "gpusim pins $(gstat active_pins) at the end, $pins0 at the start"
[ "$(lstat host_windows)" = 0 ] && [ "$(lstat gpu_windows)" = 0 ] || die "the helper still holds windows"
echo "ok - gpusim pins back to $pins0, the helper holds no window"
log=$(kmsg_since libnvm-tools)
grep -q . <<<"$log" || die "the kernel log lost this suite's mark"
if grep -E 'BUG:|WARNING:|Oops|Call Trace' <<<"$log"; then die "kernel warnings (above)"; fi
echo "ok - no kernel warning"
