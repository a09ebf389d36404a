#!/bin/bash
# libgdsync C-ABI checks, run as a consumer would see the library:
#   1. every installed header compiles on its own as C and C++ with -Wall -Wextra -Werror;
#   2. sizeof/offsetof of every public struct and embedded peer-direct type (abi_layout.c);
#   3. the exported dynamic symbol set equals symbols.expected, soname libgdsync.so.2, no libcuda/
#      libibverbs/libgdrapi link dependency;
#   1b. a program that includes one MOFED-era header and nothing else gets the standard headers
#       MOFED's brought (fprintf, exit, malloc, errno, ...): mofed_std_headers.c;
#   2b. a program in the shape of upstream's tests (MOFED header names, BEGIN_C_DECLS, exp opcodes,
#       mlx5 info helpers, device.cuh's S::T) builds against an installed prefix with only
#       `pkg-config --cflags --libs gdsync`, -Werror, as C and C++, and runs (mofed_consumer.c);
#   3b. rdma-core layouts the verbs code hard-codes (verbs_layout.c); verbs_loopback.c compiles
#       (it runs on soft-RoCE in the VM: tests/vm/suites/50-gdsync-verbs.sh);
#   4. the descriptor suite on a stream of the simulated libcuda (sim/cudasim), default env and
#      with NOR waits enabled, plus an ASan/UBSan build of it (and valgrind with VALGRIND=1).
# Exits non-zero on any failure. Needs cuda.h (fetched by scripts/fetch-cuda-headers) and
# libibverbs-dev. Set NO_BUILD=1 to reuse target/release as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"
out=$top/target/gdsync-ct
mkdir -p "$out/lib"
fail=0
step() { printf '== %s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

"$here/../../scripts/fetch-cuda-headers" >/dev/null
CUDA_INC=$top/.deps/cuda/include
[ -f /usr/include/infiniband/verbs.h ] || { echo "libibverbs-dev is needed (infiniband/verbs.h)"; exit 2; }
if [ -z "${NO_BUILD:-}" ]; then
    step "cargo build --release (gdsync, cudasim)"
    cargo build -q --release -p gdsync
    cargo build -q --release -p cudasim
fi
LIB=$top/target/release/libgdsync.so
ln -sf "$LIB" "$out/lib/libgdsync.so.2"
ln -sf "$LIB" "$out/lib/libgdsync.so"
ln -sf "$top/target/release/libcuda.so" "$out/lib/libcuda.so.1"
ln -sf "$top/target/release/libcuda.so" "$out/lib/libcuda.so"
CFLAGS_C=(-x c -std=gnu11 -Wall -Wextra -Werror -I"$top/include" -I"$top/include/gdsync/compat" -I"$CUDA_INC")
CFLAGS_CXX=(-x c++ -std=c++11 -Wall -Wextra -Werror -I"$top/include" -I"$top/include/gdsync/compat" -I"$CUDA_INC")

step "headers compile alone (C and C++)"
hdr_case() { # name, source text
    local name=$1 src=$2
    printf '%s\n' "$src" > "$out/hdr.c"
    gcc "${CFLAGS_C[@]}" -c "$out/hdr.c" -o /dev/null 2> "$out/hdr.err" || { bad "$name as C"; cat "$out/hdr.err"; }
    g++ "${CFLAGS_CXX[@]}" -c "$out/hdr.c" -o /dev/null 2> "$out/hdr.err" || { bad "$name as C++"; cat "$out/hdr.err"; }
}
hdr_case gdsync.h '#include <gdsync.h>'
hdr_case gdsync/peer_ops.h '#include <gdsync/peer_ops.h>'
hdr_case gdsync/verbs_exp.h '#include <gdsync/verbs_exp.h>'
hdr_case gdsync/core.h '#include <gdsync.h>
#include <gdsync/core.h>'
hdr_case gdsync/mlx5.h '#include <gdsync.h>
#include <gdsync/mlx5.h>'
hdr_case gdsync/tools.h '#include <gdsync.h>
#include <gdsync/tools.h>'
hdr_case "tools.h legacy 2.1 declarations" '#define GDS_ENABLE_LEGACY_API_2_1
#include <gdsync.h>
#include <gdsync/tools.h>'
printf '#include <gdsync/device.cuh>\nint main(void) { gdsync::isem32_t s; return (int)s.value; }\n' > "$out/dev.cpp"
g++ "${CFLAGS_CXX[@]}" -c "$out/dev.cpp" -o /dev/null || bad "gdsync/device.cuh as host C++"
for h in core mlx5 tools; do
    printf '#include <gdsync/%s.h>\n' "$h" > "$out/hdr.c"
    if gcc "${CFLAGS_C[@]}" -c "$out/hdr.c" -o /dev/null 2>/dev/null; then bad "gdsync/$h.h must refuse to be included without gdsync.h"; fi
done

hdr_case "compat infiniband/verbs_exp.h" '#include <infiniband/verbs_exp.h>
BEGIN_C_DECLS
int f(enum ibv_exp_wr_opcode);
END_C_DECLS'
hdr_case "compat infiniband/peer_ops.h" '#include <infiniband/peer_ops.h>
#include <gdsync.h>'
# MOFED's headers brought stdio/stdlib/errno/string/pthread with them and MOFED programs rely on it:
# one header each way (verbs_exp.h, peer_ops.h, gdsync.h), nothing else included, built and run.
for via in 1 2 3; do
    gcc "${CFLAGS_C[@]}" -DGDS_STD_VIA=$via "$here/mofed_std_headers.c" -x none -o "$out/std_headers_c" -lpthread \
        && "$out/std_headers_c" > /dev/null || bad "mofed_std_headers.c (GDS_STD_VIA=$via) as C"
    g++ "${CFLAGS_CXX[@]}" -DGDS_STD_VIA=$via -c "$here/mofed_std_headers.c" -o /dev/null || bad "mofed_std_headers.c (GDS_STD_VIA=$via) as C++"
done
# Where real MOFED headers sit later on the include path, the compatibility ones hand over to them.
mkdir -p "$out/fake-mofed/infiniband"
printf '#define INFINIBAND_VERBS_EXP_H\n#define FAKE_MOFED_VERBS_EXP 1\n' > "$out/fake-mofed/infiniband/verbs_exp.h"
printf '#define PEER_OPS_H\n#define FAKE_MOFED_PEER_OPS 1\n' > "$out/fake-mofed/infiniband/peer_ops.h"
printf '#include <infiniband/verbs_exp.h>\n#include <infiniband/peer_ops.h>\n#if !defined(FAKE_MOFED_VERBS_EXP) || !defined(FAKE_MOFED_PEER_OPS)\n#error compat header shadowed MOFED\n#endif\n' > "$out/hdr.c"
gcc "${CFLAGS_C[@]}" -I"$out/fake-mofed" -c "$out/hdr.c" -o /dev/null || bad "compat headers must step aside for real MOFED headers"

step "MOFED-shaped consumer against an installed prefix (pkg-config only)"
./build.sh install --prefix "$out/prefix" >"$out/install.log" 2>&1 || { bad "build.sh install"; tail -20 "$out/install.log"; }
export PKG_CONFIG_PATH="$out/prefix/lib/pkgconfig"
if pc=$(pkg-config --cflags --libs gdsync); then
    # cuda.h comes from the CUDA toolkit, not from gdsync's .pc (as for upstream).
    read -r -a pcv <<< "$pc"
    for lang in c c++; do
        std=gnu11; [ $lang = c++ ] && std=c++11
        if "$([ $lang = c ] && echo gcc || echo g++)" -x $lang -std=$std -Wall -Wextra -Werror -I"$CUDA_INC" \
            "$here/mofed_consumer.c" -x none -o "$out/mofed_consumer_$lang" "${pcv[@]}" -L"$out/lib" -lcuda; then
            LD_LIBRARY_PATH=$out/prefix/lib:$out/lib "$out/mofed_consumer_$lang" || bad "mofed_consumer ($lang) failed"
        else
            bad "mofed_consumer.c does not build as $lang against the installed prefix"
        fi
    done
else
    bad "pkg-config cannot resolve gdsync under $out/prefix"
fi
unset PKG_CONFIG_PATH

step "struct layouts and constants"
gcc "${CFLAGS_C[@]}" "$here/abi_layout.c" -o "$out/abi_layout_c" && "$out/abi_layout_c" || bad "abi_layout (C)"
g++ "${CFLAGS_CXX[@]}" "$here/abi_layout.c" -o "$out/abi_layout_cxx" && "$out/abi_layout_cxx" || bad "abi_layout (C++)"

step "rdma-core layouts the verbs code hard-codes (verbs_layout.c)"
gcc "${CFLAGS_C[@]}" "$here/verbs_layout.c" -o "$out/verbs_layout" && "$out/verbs_layout" || bad "verbs_layout"
gcc "${CFLAGS_C[@]}" "$here/verbs_loopback.c" -o "$out/verbs_loopback" -L"$out/lib" -lgdsync -libverbs -lcuda -lpthread || bad "verbs_loopback.c does not compile"

step "exported symbols, soname, dependencies"
grep -v '^#' "$here/symbols.expected" | sort > "$out/sym.want"
nm -D --defined-only "$LIB" | awk '{print $3}' | sort > "$out/sym.got"
if ! diff -u "$out/sym.want" "$out/sym.got"; then bad "exported symbol set differs from symbols.expected"; else echo "$(wc -l < "$out/sym.got") symbols, as expected"; fi
soname=$(readelf -d "$LIB" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libgdsync.so.2 ] || bad "soname is '$soname', expected libgdsync.so.2"
if readelf -d "$LIB" | grep NEEDED | grep -E 'libcuda|libibverbs|libgdrapi'; then bad "must not link libcuda/libibverbs/libgdrapi"; fi
nm "$top/target/release/libgdsync.a" 2>/dev/null > "$out/static.nm" || true
grep -q ' T gds_stream_post_descriptors$' "$out/static.nm" || bad "static library lacks gds_stream_post_descriptors"

step "descriptor suite on cudasim"
gcc "${CFLAGS_C[@]}" "$here/stream_suite.c" -o "$out/stream_suite" -L"$out/lib" -lgdsync -lcuda -lpthread
export LD_LIBRARY_PATH=$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 300 "$out/stream_suite" 2> "$out/suite.err" || { bad "stream_suite (default env)"; tail -30 "$out/suite.err"; }
GDS_DISABLE_WAIT_NOR=0 timeout 300 "$out/stream_suite" 2> "$out/suite-nor.err" || { bad "stream_suite (GDS_DISABLE_WAIT_NOR=0)"; tail -30 "$out/suite-nor.err"; }
# The prepared send/wait requests on cudasim are a Rust integration test
# (libgdsync/tests/requests_cudasim.rs): the fast tier's cargo test runs it. Not here: its build
# links libgdsync with the integration-tests feature under target/release's file name, which
# the C programs of this and the other abi steps (run beside this one) load.
if [ -z "${NO_SANITIZERS:-}" ]; then
    gcc "${CFLAGS_C[@]}" -g -fsanitize=address,undefined -fno-sanitize-recover=undefined "$here/stream_suite.c" \
        -o "$out/stream_suite_asan" -L"$out/lib" -lgdsync -lcuda -lpthread
    ASAN_OPTIONS=detect_leaks=1 timeout 300 "$out/stream_suite_asan" 2> "$out/suite-asan.err" >/dev/null \
        || { bad "stream_suite under ASan/UBSan"; grep -E 'ERROR|runtime error|FAIL' "$out/suite-asan.err" | head -20; }
fi

if [ -n "${VALGRIND:-}" ] && command -v valgrind >/dev/null; then
    step "descriptor suite under valgrind (VALGRIND=1)"
    timeout 900 valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
        "$out/stream_suite" > /dev/null 2> "$out/suite-valgrind.err" || { bad "stream_suite under valgrind"; grep -E '^==' "$out/suite-valgrind.err" | head -20; }
fi

if [ $fail -ne 0 ]; then echo "gdsync compat tests: FAILED"; exit 1; fi
echo "gdsync compat tests: all passed"
