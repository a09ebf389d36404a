#!/usr/bin/env bash
# Host-side build of what tests/vm/suites/38-ucx.sh runs inside the VM (the guest builds
# nothing). A late hook of tests/vm/build-host.sh: it runs while the VM boots and runs the
# other suites, with STAGE in scripts/vmtest's frozen snapshot, and the suite waits for it.
#   STAGE=... bash compat-tests/ucx/vm-build.sh
# Produces STAGE/ucx: uct_gdr_check, the test-only libcudart.so.13, the drop-byte shim and env
# (which points at the cached UCX build in target/ucx, see build-ucx.sh).
# Our library and cudasim come from STAGE/lib, not from target/release: other test tiers
# rebuild target/release while this runs. A UCX build started earlier (scripts/run-tests builds
# it in the background) is found in build-ucx.sh's cache; this waits on its lock.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
printf '[build-host ucx] %s\n' "UCX (cached build) and the UCX data checker -> $STAGE/ucx"
pre=$STAGE/ucx-gdr-prefix
rm -rf "$STAGE/ucx" "$pre"
mkdir -p "$pre/include" "$pre/lib"
cp "$REPO/include/gdrapi.h" "$REPO/include/gdrconfig.h" "$pre/include/"
cp -L "$STAGE/lib/libgdrapi.so.2" "$pre/lib/libgdrapi.so.2"
ln -s libgdrapi.so.2 "$pre/lib/libgdrapi.so"
cp -L "$STAGE/lib/libcuda.so.1" "$pre/libcuda.so"
bash "$REPO/compat-tests/ucx/run.sh" --stage "$STAGE/ucx" --gdr-prefix "$pre" --cudasim "$pre/libcuda.so"
