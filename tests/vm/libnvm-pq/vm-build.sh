#!/bin/bash
# SPDX-License-Identifier: MIT
#
# VM build hook of the shared GPU-side queue (run by tests/vm/build-host.sh after `cargo build
# --release --workspace`): builds $STAGE/bin/vm_pq (tests/vm/libnvm-pq/vm_pq.c: include/nvm_pq.h
# on CPU threads, linked to libnvm.so for bring-up) for tests/vm/suites/27-libnvm-pq.sh.
set -euo pipefail
REPO=${REPO:?}
STAGE=${STAGE:?}
lib=$REPO/target/release/libnvm.so
[ -f "$lib" ] || { echo "tests/vm/libnvm-pq/vm-build.sh: $lib not built" >&2; exit 1; }
mkdir -p "$STAGE/lib" "$STAGE/bin"
ln -sfn "$lib" "$STAGE/lib/libnvm.so"
gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -I"$REPO/include" \
	-o "$STAGE/bin/vm_pq" "$REPO/tests/vm/libnvm-pq/vm_pq.c" \
	-L"$REPO/target/release" -lnvm -Wl,-rpath,"$STAGE/lib"
