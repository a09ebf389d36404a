#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side build hook (called from tests/vm/build-host.sh with REPO and STAGE set): the raw-ABI
# test of the libnvm helper module and its fuzzer, into $STAGE/bin. Headers: the module's uapi
# (kmod/libnvm/libnvm_ioctl.h) and gpusim's; no library.
set -euo pipefail
REPO=${REPO:?} STAGE=${STAGE:?}
CFLAGS=(-std=gnu11 -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/libnvm" -I"$REPO/kmod/gpusim")
mkdir -p "$STAGE/bin"
gcc "${CFLAGS[@]}" -o "$STAGE/bin/libnvm_test" "$REPO/tests/vm/libnvm/libnvm_test.c"
if [ -f "$REPO/tests/vm/fuzz/libnvm_fuzz.c" ]; then
	gcc "${CFLAGS[@]}" -o "$STAGE/bin/libnvm_fuzz" "$REPO/tests/vm/fuzz/libnvm_fuzz.c"
fi
echo "[libnvm vm-build] staged libnvm_test$([ -f "$STAGE/bin/libnvm_fuzz" ] && echo ' libnvm_fuzz')"
