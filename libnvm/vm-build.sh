#!/bin/bash
# SPDX-License-Identifier: MIT
#
# VM build hook of libnvm (run by tests/vm/build-host.sh after `cargo build --release
# --workspace`): stages libnvm.so in $STAGE/lib and builds the module-free VM test program
# $STAGE/bin/vm_libnvm (tests/vm/libnvm-lib/vm_libnvm.c) against include/ and that library,
# for tests/vm/suites/26-libnvm.sh, and vm_libnvm_module (28-libnvm-module-lib.sh).
set -euo pipefail
REPO=${REPO:?}
STAGE=${STAGE:?}
lib=$REPO/target/release/libnvm.so
[ -f "$lib" ] || { echo "libnvm/vm-build.sh: $lib not built" >&2; exit 1; }
mkdir -p "$STAGE/lib" "$STAGE/bin"
ln -sfn "$lib" "$STAGE/lib/libnvm.so"
gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -I"$REPO/include" \
	-o "$STAGE/bin/vm_libnvm" "$REPO/tests/vm/libnvm-lib/vm_libnvm.c" \
	-L"$REPO/target/release" -lnvm -Wl,-rpath,"$STAGE/lib"
# The library through the helper module (tests/vm/suites/28-libnvm-module-lib.sh); also needs
# gpusim's uapi header for GPU memory.
gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -I"$REPO/include" -I"$REPO/kmod/gpusim" \
	-o "$STAGE/bin/vm_libnvm_module" "$REPO/tests/vm/libnvm-lib/vm_libnvm_module.c" \
	-L"$REPO/target/release" -lnvm -Wl,-rpath,"$STAGE/lib"
