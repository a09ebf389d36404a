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
# The modules go to the staged tree too: scripts/vmtest snapshots target/vmstage per run.
mkdir -p "$STAGE/bin" "$STAGE/kmod"
cp "$REPO/kmod/peermem_host/peermem_host.ko" "$REPO/kmod/peermem_host/nvidia_peermem.ko" \
	"$REPO/kmod/nv_peer_mem/nv_peer_mem.ko" "$STAGE/kmod/"
if [ -f "$REPO/kmod/dmabuf_mr/dmabuf_mr.ko" ]; then
	cp "$REPO/kmod/dmabuf_mr/dmabuf_mr.ko" "$STAGE/kmod/"
fi
gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gpusim" -I"$REPO/kmod/peermem_host" \
	-o "$STAGE/bin/peermem_test" "$REPO/tests/vm/peermem/peermem_test.c"
if [ -f "$REPO/tests/vm/peermem/dmabuf_mr_test.c" ]; then
	gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gpusim" -I"$REPO/kmod/dmabuf_mr" \
		-o "$STAGE/bin/dmabuf_mr_test" "$REPO/tests/vm/peermem/dmabuf_mr_test.c"
fi
