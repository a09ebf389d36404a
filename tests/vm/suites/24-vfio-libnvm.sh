#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libnvm on QEMU's NVMe controller through vfio-pci under a virtual IOMMU (QEMU's
# intel-iommu; scripts/vmtest boots with intel_iommu=on iommu=pt, so every other device keeps
# an identity domain and only the vfio container translates). vm_vfio (tests/vm/libnvm/vm_vfio.c)
# maps BAR0 through the vfio region, host and gpusim memory with VFIO_IOMMU_MAP_DMA at IOVAs far
# from any physical address, hands those IOVAs to nvm_dma_map, and checks reads of every PRP shape
# against the image pattern. Here: the controller is in its own IOMMU group, a DMA to an IOVA
# nobody mapped is blocked by the vIOMMU and logged as a DMAR fault naming the controller, and
# nvme rebinds afterwards (tests/vm/lib/nvme-userspace.sh).
set -uo pipefail

BIN=$STAGE_BIN/vm_vfio
die() { echo "vfio-libnvm suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
if [ ! -e "/sys/bus/pci/devices/$NVME_BDF/iommu_group" ]; then
	echo "SKIP: no IOMMU in this VM (scripts/vmtest attaches QEMU's intel-iommu; kernel needs intel_iommu=on)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by tests/vm/libnvm/vm-build.sh from tests/vm/build-host.sh)"
grep -qw 'iommu=pt' /proc/cmdline || die "booted without iommu=pt: other devices would be translated"
group=$(readlink -f "/sys/bus/pci/devices/$NVME_BDF/iommu_group")
members=$(ls "$group/devices")
[ "$members" = "$NVME_BDF" ] || die "IOMMU group ${group##*/} holds more than the controller: $(echo $members)"
echo "ok - $NVME_BDF alone in IOMMU group ${group##*/} (default domain $(cat "$group/type" 2>/dev/null))"
modprobe vfio-pci || die "modprobe vfio-pci"

. "$REPO/tests/vm/lib/kmsg.sh"
kmsg_mark vfio-libnvm
. "$REPO/tests/vm/lib/nvme-userspace.sh"
nvme_userspace_take vfio-pci
echo "ok - $NVME_BDF bound to vfio-pci"

out=$(mktemp)
LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$NVME_BDF" | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || die "vm_vfio exited $rc"
iova=$(sed -n 's/^# blocked-iova \(0x[0-9a-f]*\).*/\1/p' "$out")
rm -f "$out"
[ -n "$iova" ] || die "vm_vfio did not report its blocked IOVA"
# The kernel logs the vIOMMU's fault with the device and the address (6.1: "DMAR: [DMA Write
# NO_PASID] Request device [00:04.0] fault addr 0x3000000000 [fault reason 0x..] ..."); the
# log may take a moment (the fault interrupt).
short=${NVME_BDF#0000:}
for _ in $(seq 50); do
	log=$(kmsg_since vfio-libnvm)
	grep -qiE "DMAR:.*(device|dev) \[?$short\]? fault addr (0x)?0*${iova#0x}" <<<"$log" && break
	sleep 0.1
done
grep -iE 'DMAR:.*fault' <<<"$log" | head -3 | sed 's/^/# /'
grep -qiE "DMAR:.*(device|dev) \[?$short\]? fault addr (0x)?0*${iova#0x}" <<<"$log" ||
	die "no DMAR fault logged for $NVME_BDF at $iova"
echo "ok - the DMA to unmapped IOVA $iova was blocked: DMAR fault logged for $NVME_BDF"
