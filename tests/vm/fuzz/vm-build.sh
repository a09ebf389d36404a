#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Host-side build of the fuzzers that tests/vm/suites/60-gdrdrv-fuzz.sh runs inside the VM.
# Called from tests/vm/build-host.sh with REPO and STAGE set. Produces:
#   $STAGE/bin/gdrdrv_fuzz   raw /dev/gdrdrv + /dev/gpusim fuzzer (tests/vm/fuzz/gdrdrv_fuzz.c)
set -euo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
mkdir -p "$STAGE/bin"
gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gdrdrv" -I"$REPO/kmod/gpusim" \
	-o "$STAGE/bin/gdrdrv_fuzz" "$REPO/tests/vm/fuzz/gdrdrv_fuzz.c"
