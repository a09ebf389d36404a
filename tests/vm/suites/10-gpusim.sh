#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the simulated GPU itself: /dev/gpusim and the nvidia_p2p_* exports (through the
# p2ptest module), PAT memtype of the BAR, and no pin or page left behind.
# Runs inside the VM as root with gpusim loaded (tests/vm/guest.sh).
set -euo pipefail

BIN=$REPO/target/vmstage/bin/gpusim_test
P2PTEST=$REPO/kmod/gpusim/test/p2ptest.ko
STATS=/sys/kernel/debug/gpusim/stats

[ -x "$BIN" ] || { echo "missing $BIN (built by tests/vm/build-host.sh)"; exit 1; }
[ -e /dev/gpusim ] || { echo "/dev/gpusim missing: gpusim not loaded"; exit 1; }
[ -f "$P2PTEST" ] || { echo "missing $P2PTEST (built by scripts/vmtest)"; exit 1; }

stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

insmod "$P2PTEST"
unload() { rmmod p2ptest || { echo "rmmod p2ptest failed"; exit 1; }; }
trap unload EXIT

"$BIN" "$@"

# Again with non-contiguous BAR pages (what a fragmented GPU hands out).
if [ $# -eq 0 ]; then
	echo "# scatter_pages=1"
	echo 1 > /sys/module/gpusim/parameters/scatter_pages
	"$BIN" mmap_two_mappings exhaust p2p_get_put p2p_persistent p2p_dma_map
	echo 0 > /sys/module/gpusim/parameters/scatter_pages
fi

# Every CPU mapping of the BAR must be write-combining: gpusim reserves it so, and a different
# memtype showing up here would mean some path mapped it otherwise.
PAT=/sys/kernel/debug/x86/pat_memtype_list
if [ -r "$PAT" ]; then
	bar=$(stat_of bar_phys); size=$(stat_of bar_size)
	start=$((bar)); end=$((bar + size))
	wc=0; other=0
	# 6.1 prints "PAT: [mem 0x<start>-0x<end>] <type>"; older kernels "<type> @ 0x<s>-0x<e>".
	while read -r lo hi type; do
		lo=$((lo)); hi=$((hi))
		if [ "$hi" -le "$start" ] || [ "$lo" -ge "$end" ]; then continue; fi
		if [ "$type" = write-combining ]; then wc=$((wc + 1)); else
			echo "non-WC memtype on the BAR: $type [$lo-$hi]"; other=$((other + 1)); fi
	done < <(sed -nE \
		-e 's/.*0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+)\] *([a-z-]+).*/0x\1 0x\2 \3/p' \
		-e 's/^(PAT: )?([a-z-]+) @ 0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+).*/0x\3 0x\4 \2/p' "$PAT")
	[ "$wc" -ge 1 ] || { echo "BAR 0x$(printf %x "$start") not reserved write-combining"; exit 1; }
	[ "$other" -eq 0 ] || exit 1
	echo "ok - pat: BAR reserved write-combining ($wc entries)"
else
	echo "# skipped PAT check: $PAT not readable"
fi

pins=$(stat_of active_pins); free=$(stat_of free_pages); pages=$(stat_of pages)
[ "$pins" = 0 ] || { echo "not ok - $pins nvidia_p2p pins outstanding after the tests"; exit 1; }
[ "$free" = "$pages" ] || { echo "not ok - $free of $pages BAR pages free after the tests"; exit 1; }
echo "ok - no pins or pages left ($(stat_of total_pins) pins, $(stat_of callbacks_run) callbacks)"
