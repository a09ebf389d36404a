#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side build hook (called from tests/vm/build-host.sh with REPO and STAGE set): the raw-ABI
# test of the libnvm helper module and its fuzzer, into $STAGE/bin. Headers: the module's uapi
# (kmod/libnvm/libnvm_ioctl.h) and gpusim's; no library. Also vm_vfio (24-vfio-libnvm.sh): the
# library (libnvm.so, built by cargo before the hooks) over vfio-pci.
set -euo pipefail
REPO=${REPO:?} STAGE=${STAGE:?}
CFLAGS=(-std=gnu11 -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/libnvm" -I"$REPO/kmod/gpusim")
mkdir -p "$STAGE/bin"
gcc "${CFLAGS[@]}" -o "$STAGE/bin/libnvm_test" "$REPO/tests/vm/libnvm/libnvm_test.c"
if [ -f "$REPO/tests/vm/fuzz/libnvm_fuzz.c" ]; then
	gcc "${CFLAGS[@]}" -o "$STAGE/bin/libnvm_fuzz" "$REPO/tests/vm/fuzz/libnvm_fuzz.c"
fi
lib=$REPO/target/release/libnvm.so
[ -f "$lib" ] || { echo "tests/vm/libnvm/vm-build.sh: $lib not built" >&2; exit 1; }
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -g -I"$REPO/include" -I"$REPO/kmod/gpusim" \
	-o "$STAGE/bin/vm_vfio" "$REPO/tests/vm/libnvm/vm_vfio.c" \
	-L"$REPO/target/release" -lnvm -Wl,-rpath,"$STAGE/lib"
echo "[libnvm vm-build] staged libnvm_test vm_vfio$([ -f "$STAGE/bin/libnvm_fuzz" ] && echo ' libnvm_fuzz')"
