#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: gpusim's dma-buf export (GPUSIM_IOC_EXPORT_DMABUF), the kernel half of the dma-buf path:
# the exported file (exporter "nv_dmabuf", O_RDWR|O_CLOEXEC, size), mmap data at offsets and for
# sub-ranges, bad requests, mmap refused with ENOTSUPP (dmabuf_mmap=0), and the lifetime rule:
# an allocation freed while exported, mapped or attached by an importer keeps its pages (data
# intact, never handed to another allocation) until the dma-buf's last reference goes.
# tests/vm/gpusim/dmabuf_test.c; the importer is kmod/gpusim/test/dmabuf_import.ko.
set -euo pipefail

BIN=$REPO/target/vmstage/bin/dmabuf_test
IMPORTER=$REPO/kmod/gpusim/test/dmabuf_import.ko
STATS=/sys/kernel/debug/gpusim/stats

[ -x "$BIN" ] || { echo "missing $BIN (built by tests/vm/build-host.sh)"; exit 1; }
[ -f "$IMPORTER" ] || { echo "missing $IMPORTER (built by scripts/vmtest)"; exit 1; }
[ -e /dev/gpusim ] || { echo "/dev/gpusim missing: gpusim not loaded"; exit 1; }
[ -r "$STATS" ] || { echo "$STATS not readable: the tests count pages through it"; exit 1; }
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS"; }

insmod "$IMPORTER"
restore() {
	echo 1 > /sys/module/gpusim/parameters/dmabuf_mmap
	echo 0 > /sys/module/gpusim/parameters/scatter_pages
	rmmod dmabuf_import || { echo "rmmod dmabuf_import failed"; exit 1; }
}
trap restore EXIT

"$BIN" "$@"

if [ $# -eq 0 ]; then
	echo "# scatter_pages=1 (no two GPU pages of an export physically adjacent)"
	echo 1 > /sys/module/gpusim/parameters/scatter_pages
	"$BIN" mmap_data free_while_mapped importer
	echo 0 > /sys/module/gpusim/parameters/scatter_pages
fi

[ "$(stat_of active_dmabufs)" = 0 ] || { echo "not ok - $(stat_of active_dmabufs) dma-bufs left"; exit 1; }
[ "$(stat_of dmabuf_pages)" = 0 ] || { echo "not ok - $(stat_of dmabuf_pages) pages held by dma-bufs"; exit 1; }
[ "$(stat_of free_pages)" = "$(stat_of pages)" ] ||
	{ echo "not ok - $(stat_of free_pages) of $(stat_of pages) BAR pages free after the tests"; exit 1; }
echo "ok - no dma-buf or page left ($(stat_of total_dmabufs) dma-bufs exported)"
