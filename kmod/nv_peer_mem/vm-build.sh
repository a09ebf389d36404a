#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
# VM build hook (tests/vm/build-host.sh): the test-only peer-memory host, nv_peer_mem against it,
# the dma-buf MR importer test module, and the test programs of suites 56 and 57.
# Env: REPO, STAGE, KVER (guest kernel; default: newest -amd64 headers).
set -euo pipefail
REPO=${REPO:?}; STAGE=${STAGE:?}
KV=${KVER:+KVER=$KVER}
make -s -C "$REPO/kmod/peermem_host" $KV modules
make -s -C "$REPO/kmod/nv_peer_mem" $KV PEER_MEM_DIR="$REPO/kmod/peermem_host" \
	NV_SYMVERS="$REPO/kmod/gpusim/Module.symvers" modules
if [ -d "$REPO/kmod/dmabuf_mr" ]; then
	make -s -C "$REPO/kmod/dmabuf_mr" $KV modules
fi
mkdir -p "$STAGE/bin"
gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gpusim" -I"$REPO/kmod/peermem_host" \
	-o "$STAGE/bin/peermem_test" "$REPO/tests/vm/peermem/peermem_test.c"
if [ -f "$REPO/tests/vm/peermem/dmabuf_mr_test.c" ]; then
	gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gpusim" -I"$REPO/kmod/dmabuf_mr" \
		-o "$STAGE/bin/dmabuf_mr_test" "$REPO/tests/vm/peermem/dmabuf_mr_test.c"
fi
