#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Late VM build hook (tests/vm/build-host.sh, LATE_HOOKS: it runs while the VM runs the other
# suites, STAGE in scripts/vmtest's snapshot of target/vmstage), for
# tests/vm/suites/70-packages.sh:
#   - $STAGE/debs: the Debian packages of target/packages/deb. packaging/build-debs reuses those
#     when they were built and checked from the same inputs (packaging/inputs-hash; the packages
#     tier has just built them in a full run), and builds them otherwise. Debug-symbol packages
#     are not staged.
#   - $STAGE/dkms: NAME-VERSION.dkms.tar.gz for every module of the -dkms packages, made by DKMS
#     here for the guest kernel $KVER (packaging/dkms-prebuild): the guest's postinst loads them
#     instead of compiling under TCG. Cached in target/packages/dkms-$KVER while the packages,
#     the kernel headers, dkms and the test-only modules nv_peer_mem is built against are the
#     same.
# nv_peer_mem needs a peer-memory core and the nvidia_p2p_* symbol versions: here those of the
# test-only core (kmod/peermem_host, built by kmod/nv_peer_mem/vm-build.sh, an earlier hook)
# and of gpusim. Without them its DKMS build must stop with a message (checked too).
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
KVER=${KVER:-$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1 | sed 's,.*/linux-headers-,,')}
cd "$REPO"
built=target/packages/deb
packaging/build-debs --no-lintian "$built"
rm -rf "$STAGE/debs"
mkdir -p "$STAGE/debs"
find "$built" -maxdepth 1 -name '*.deb' ! -name '*-dbgsym_*' -exec cp {} "$STAGE/debs/" \;
echo "[packaging vm-build] staged: $(cd "$STAGE/debs" && ls | tr '\n' ' ')"

peer=$REPO/kmod/peermem_host
nvsyms=$REPO/kmod/gpusim/Module.symvers
for f in "$peer/Module.symvers" "$peer/include/rdma/peer_mem.h" "$nvsyms"; do
    [ -f "$f" ] || { echo "[packaging vm-build] missing $f (built by the earlier hooks)" >&2; exit 1; }
done
dkms_debs=("$STAGE"/debs/*-dkms_*.deb)
cache=target/packages/dkms-$KVER
key=$({
    echo "$KVER"
    sha256sum "${dkms_debs[@]}" | cut -d' ' -f1
    dpkg-query -W -f='${Package} ${Version}\n' dkms "linux-headers-$KVER" 2>&1
    sha256sum "$peer/Module.symvers" "$peer/include/rdma/peer_mem.h" "$nvsyms" packaging/dkms-prebuild | cut -d' ' -f1
} | sha256sum | cut -c1-64)
if [ "$(cat "$cache/.key" 2>/dev/null)" = "$key" ]; then
    echo "[packaging vm-build] DKMS archives for $KVER reused (same packages, headers and dkms): $(cd "$cache" && ls *.tar.gz | tr '\n' ' ')"
else
    t0=$SECONDS
    rm -rf "$cache"
    DKMS_ENV_nv_peer_mem="PEER_MEM_DIR=$peer NV_SYMVERS=$nvsyms" \
    DKMS_EXPECT_FAIL_nv_peer_mem='nv_peer_mem: cannot build: no peer-memory core' \
        packaging/dkms-prebuild "$KVER" "$cache" "${dkms_debs[@]}"
    echo "$key" > "$cache/.key"
    echo "[packaging vm-build] DKMS built the modules for $KVER in $((SECONDS - t0)) s"
fi
rm -rf "$STAGE/dkms"
mkdir -p "$STAGE/dkms"
cp "$cache"/*.dkms.tar.gz "$STAGE/dkms/"
