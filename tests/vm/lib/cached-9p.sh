# SPDX-License-Identifier: MIT
# Sourced by tests/vm/guest.sh and the packages suite: the host directories scripts/vmtest shares
# a second time, read-only, as their own 9p tags (hostusr, hostvar, snapshot), mounted
# with the guest's page cache on. virtme-ng's 9p root has none: every open and read of a file
# under it is a round trip through QEMU's main loop, a few milliseconds under TCG.

# has_9p_tag TAG: whether this VM has a 9p device with mount tag TAG.
has_9p_tag() {
	grep -qsa "^$1" /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag
}

# mount_cached_9p TAG DIR: mounts tag TAG on DIR, read-only, cache=loose (nothing under it
# changes on the host during a run).
mount_cached_9p() {
	mkdir -p "$2" && mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,msize=512000,ro "$1" "$2"
}
