#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: gpusim's dma-bufs through the kernel's own RDMA importer (ib_umem_dmabuf in ib_uverbs):
# kmod/dmabuf_mr registers them with ib_umem_dmabuf_get_pinned (efa's way) and with
# ib_umem_dmabuf_get + ib_umem_dmabuf_map_pages (mlx5's dynamic way) for an ib_device whose DMA
# device is the VM's NVMe controller, and reads GPU memory back through the DMA addresses the
# importer produced: unaligned starts, ranges across GPU pages, sub-range exports, EINVAL past
# the end, and an allocation freed while registered keeps its pages until the MR goes.
# tests/vm/peermem/dmabuf_mr_test.c.
set -euo pipefail

BIN=$REPO/target/vmstage/bin/dmabuf_mr_test
KO=$REPO/target/vmstage/kmod/dmabuf_mr.ko
GSTATS=/sys/kernel/debug/gpusim/stats
fail() { echo "not ok - $*"; exit 1; }
for f in "$BIN" "$KO"; do
	[ -e "$f" ] || fail "missing $f (built by kmod/nv_peer_mem/vm-build.sh)"
done
gstat() { awk -v k="$1:" '$1 == k { print $2 }' "$GSTATS"; }

modprobe ib_uverbs || fail "modprobe ib_uverbs (the importer lives there)"
grep -qw ib_umem_dmabuf_get_pinned /proc/kallsyms || fail "kernel lacks ib_umem_dmabuf_get_pinned"
insmod "$KO" dma_dev=nvme || fail "insmod dmabuf_mr"
trap 'rmmod dmabuf_mr 2>/dev/null || true' EXIT
free0=$(gstat free_pages)

"$BIN" "${DMABUF_MR_COUNT:-200}"
echo 1 > /sys/module/gpusim/parameters/scatter_pages
"$BIN" 50
echo 0 > /sys/module/gpusim/parameters/scatter_pages

[ "$(gstat free_pages)" = "$free0" ] || fail "free pages $free0 -> $(gstat free_pages)"
[ "$(gstat active_dmabufs)" = 0 ] || fail "$(gstat active_dmabufs) dma-bufs left"
rmmod dmabuf_mr || fail "rmmod dmabuf_mr"
trap - EXIT
rmmod ib_uverbs 2>/dev/null || true
echo "ok - no page or dma-buf left; dmabuf_mr unloaded"
