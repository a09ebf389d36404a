#!/usr/bin/env bash
# Host-side build of what tests/vm/suites/38-ucx.sh runs inside the VM (the guest builds
# nothing). Called from tests/vm/build-host.sh:
#   bash compat-tests/ucx/vm-build.sh
# Produces STAGE/ucx (target/vmstage/ucx): uct_gdr_check, the test-only libcudart.so.13, the
# drop-byte shim and env (which points at the cached UCX build in target/ucx, see build-ucx.sh).
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
printf '[build-host ucx] %s\n' "UCX (cached build) and the UCX data checker -> $STAGE/ucx"
rm -rf "$STAGE/ucx"
bash "$REPO/compat-tests/ucx/run.sh" --stage "$STAGE/ucx"
