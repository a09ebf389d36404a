#!/bin/bash
# SPDX-License-Identifier: MIT
#
# VM build hook (tests/vm/build-host.sh, STAGE = target/vmstage): stages the Debian packages for
# tests/vm/suites/70-packages.sh in $STAGE/debs. They are the packages of target/packages/deb:
# packaging/build-debs reuses those when they were built and checked from the same inputs
# (packaging/inputs-hash; the packages tier has just built them in a full run), and builds them
# otherwise. Debug-symbol packages are not staged.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
cd "$REPO"
built=target/packages/deb
packaging/build-debs --no-lintian "$built"
rm -rf "$STAGE/debs"
mkdir -p "$STAGE/debs"
find "$built" -maxdepth 1 -name '*.deb' ! -name '*-dbgsym_*' -exec cp {} "$STAGE/debs/" \;
echo "[packaging vm-build] staged: $(cd "$STAGE/debs" && ls | tr '\n' ' ')"
