#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Host-side build hook for the VM harness (called from tests/vm/build-host.sh with REPO and
# STAGE): builds the gdrcopy test programs against the workspace (include/, target/release/
# libgdrapi.so and cudasim's libcuda.so) and installs them into $STAGE/bin, where
# tests/vm/suites/40-gdrcopy-tools.sh finds them as $STAGE_BIN/gdrcopy_*.
set -euo pipefail
REPO=${REPO:?REPO must name the repository root}
STAGE=${STAGE:?STAGE must name the staging directory}
"$REPO/scripts/fetch-cuda-headers" >/dev/null
make -s -C "$REPO/tools/gdrcopy" TOP="$REPO" gdrcopy_sanity gdrcopy_copybw gdrcopy_copylat gdrcopy_apiperf
install -d "$STAGE/bin"
install -m 755 "$REPO"/tools/gdrcopy/gdrcopy_{sanity,copybw,copylat,apiperf} "$STAGE/bin/"
