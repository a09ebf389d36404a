#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: libnvm against QEMU's emulated NVMe controller, module-free path (as libnvm's
# nvm-identify-userspace runs): the controller is unbound from nvme (and kept from any other
# driver with driver_override), BAR0 is mapped through sysfs resource0, host memory is located
# through /proc/self/pagemap (no IOMMU translation for it in this VM: bus = physical).
# vm_libnvm (built by libnvm/vm-build.sh) checks bring-up, identify, > 63 admin commands, queue
# create/delete and their errors, reads with every PRP shape against the image pattern, 2000
# reads wrapping the queues, writes (recorded in $NVME_WRITES for the host's image check), the
# error table (every status QEMU produces, each on exactly its command, with its nvm_strerror
# text), stalls (a lost doorbell, a full CQ) that give ETIME and recover, and the controller
# memory buffer (resource2; an SQ, PRP lists and data in it). nvme is rebound at the end, also
# on failure, and must come back with its namespace.
set -uo pipefail

BIN=$STAGE_BIN/vm_libnvm
die() { echo "libnvm suite FAIL: $*"; exit 1; }

if [ -z "${NVME_BDF:-}" ]; then
	echo "SKIP: no emulated NVMe controller in this VM (scripts/vmtest attaches one)"
	exit 0
fi
[ -x "$BIN" ] || die "missing $BIN (built by libnvm/vm-build.sh from tests/vm/build-host.sh)"
. "$REPO/tests/vm/lib/nvme-userspace.sh"
nvme_userspace_take

LD_LIBRARY_PATH=$STAGE_LIB "$BIN" "$NVME_BDF" "$NVME_WRITES"
