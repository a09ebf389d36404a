#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Host-side build of the fuzzers that tests/vm/suites/60-gdrdrv-fuzz.sh and 65-capi-fuzz.sh run in the VM.
# Called from tests/vm/build-host.sh with REPO and STAGE set. Produces:
#   $STAGE/bin/gdrdrv_fuzz   raw /dev/gdrdrv + /dev/gpusim fuzzer (tests/vm/fuzz/gdrdrv_fuzz.c)
#   $STAGE/bin/capi_fuzz     C-API fuzzer under ASan/UBSan (compat-tests/fuzz), libs in $STAGE/capi-fuzz/lib
set -euo pipefail

REPO=${REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}
STAGE=${STAGE:-$REPO/target/vmstage}
mkdir -p "$STAGE/bin"
gcc -Wall -Wextra -Werror -O2 -g -pthread -I"$REPO/kmod/gdrdrv" -I"$REPO/kmod/gpusim" \
	-o "$STAGE/bin/gdrdrv_fuzz" "$REPO/tests/vm/fuzz/gdrdrv_fuzz.c"

# The C-API fuzzer (compat-tests/fuzz/capi_fuzz.c) under ASan/UBSan, for 65-capi-fuzz.sh, with
# its libraries (libgdrapi, libgdsync, cudasim as libcuda) in $STAGE/capi-fuzz/lib.
mkdir -p "$STAGE/capi-fuzz/lib"
rel=${CARGO_TARGET_DIR:-$REPO/target}/release
for l in libgdrapi.so:libgdrapi.so.2 libgdsync.so:libgdsync.so.2 libcuda.so:libcuda.so.1; do
	ln -sfn "$rel/${l%%:*}" "$STAGE/capi-fuzz/lib/${l%%:*}"
	ln -sfn "$rel/${l%%:*}" "$STAGE/capi-fuzz/lib/${l##*:}"
done
"$REPO/scripts/fetch-cuda-headers" >/dev/null
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -g -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-I"$REPO/include" -I"$REPO/include/gdsync/compat" -I"$REPO/.deps/cuda/include" \
	"$REPO/compat-tests/fuzz/capi_fuzz.c" -o "$STAGE/bin/capi_fuzz" \
	-L"$STAGE/capi-fuzz/lib" -lgdrapi -lgdsync -lcuda
