#!/bin/bash
# SPDX-License-Identifier: MIT
#
# VM build hook of the libnvm tools (run by tests/vm/build-host.sh after `cargo build --release
# --workspace`): builds nvm-identify, nvm-read-blocks and nvm-bench (tools/nvm/Makefile) against
# include/ and target/release/libnvm.so, installs them into $STAGE/bin with the
# nvm-identify-userspace link, and stages libnvm.so in $STAGE/lib (the tools carry no rpath, as
# installed ones). For tests/vm/suites/29-libnvm-tools.sh.
set -euo pipefail
REPO=${REPO:?REPO must name the repository root}
STAGE=${STAGE:?STAGE must name the staging directory}
lib=$REPO/target/release/libnvm.so
[ -f "$lib" ] || { echo "tools/nvm/vm-build.sh: $lib not built" >&2; exit 1; }
mkdir -p "$STAGE/lib" "$STAGE/bin"
ln -sfn "$lib" "$STAGE/lib/libnvm.so"
make -s -C "$REPO/tools/nvm" TOP="$REPO" all
make -s -C "$REPO/tools/nvm" TOP="$REPO" install DESTDIR= bindir="$STAGE/bin"
