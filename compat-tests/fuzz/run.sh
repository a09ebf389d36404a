#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The C-API fuzzer (compat-tests/fuzz/capi_fuzz.c) under ASan and UBSan, against the simulated
# backends: cudasim in host-memory mode with dma-buf exports (CUDA 13.3 reported), so libgdrapi
# runs its dma-buf backend and libgdsync posts to cudasim streams. No device needed.
#   compat-tests/fuzz/run.sh [--seed=N] [--ops=N]     (defaults: random seed, 100000 operations)
# Env: NO_BUILD=1 skips cargo build; CAPI_FUZZ_SEED / CAPI_FUZZ_OPS as the options;
# The two bugs it first reported (oversize gdr_map on dma-buf, fork children deadlocking) are
# fixed, so every finding fails the run.
# Prints the seed first; exits non-zero on any failed check, sanitizer report or leak.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"
seed=${CAPI_FUZZ_SEED:-0}
ops=${CAPI_FUZZ_OPS:-100000}
for a in "$@"; do
    case $a in
        --seed=*) seed=${a#*=} ;;
        --ops=*) ops=${a#*=} ;;
        *) echo "usage: $0 [--seed=N] [--ops=N]" >&2; exit 2 ;;
    esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$top/target}
out=$CARGO_TARGET_DIR/capi-fuzz
mkdir -p "$out/lib"
"$top/scripts/fetch-cuda-headers" >/dev/null
[ -f /usr/include/infiniband/verbs.h ] || { echo "libibverbs-dev is needed (infiniband/verbs.h)"; exit 2; }
if [ -z "${NO_BUILD:-}" ]; then
    cargo build -q --release -p gdrapi -p gdsync -p cudasim
fi
rel=$CARGO_TARGET_DIR/release
for l in libgdrapi.so:libgdrapi.so.2 libgdsync.so:libgdsync.so.2 libcuda.so:libcuda.so.1; do
    ln -sfn "$rel/${l%%:*}" "$out/lib/${l%%:*}"
    ln -sfn "$rel/${l%%:*}" "$out/lib/${l##*:}"
done
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -g -fno-omit-frame-pointer \
    -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -I"$top/include" -I"$top/include/gdsync/compat" -I"$top/.deps/cuda/include" \
    "$here/capi_fuzz.c" -o "$out/capi_fuzz" -L"$out/lib" -lgdrapi -lgdsync -lcuda
gcc -std=gnu11 -Wall -Wextra -Werror -O1 -g -pthread -I"$top/include" \
    "$here/fork_locks.c" -o "$out/fork_locks" -L"$out/lib" -lgdrapi
# A bad count or seed is refused with the usage line (exit 2), never run as some other number.
for bad in --ops=bogus --ops= --ops=12k --ops=0 --seed=-1 --seed=0x --backend=cuda; do
    brc=0
    LD_LIBRARY_PATH="$out/lib" "$out/capi_fuzz" "$bad" >"$out/bad-arg.log" 2>&1 || brc=$?
    [ "$brc" = 2 ] && grep -q "^capi_fuzz: bad argument '$bad'" "$out/bad-arg.log" ||
        { cat "$out/bad-arg.log"; echo "capi_fuzz $bad: exit $brc, expected 2 with its usage"; exit 1; }
done
for bad in --children=x --children= --children=0 --children=5x; do
    brc=0
    LD_LIBRARY_PATH="$out/lib" "$out/fork_locks" "$bad" >"$out/bad-arg.log" 2>&1 || brc=$?
    [ "$brc" = 2 ] || { cat "$out/bad-arg.log"; echo "fork_locks $bad: exit $brc, expected 2"; exit 1; }
done
echo "bad arguments: refused by capi_fuzz and fork_locks"
# The dma-buf backend over cudasim's memfd exports; gdrdrv is never used even where it exists.
# ASan's leak check covers the C side; the libraries' allocations are Rust's (same allocator).
# Its whole output (~32,000 lines, mostly the libraries' own error lines for the refused calls)
# goes to $out/capi_fuzz.log; shown here are the seed, the other lines' tail and, on failure,
# the log's last lines.
t0=$SECONDS
rc=0
env -u GDRCOPY_ENABLE_LOGGING LD_LIBRARY_PATH="$out/lib" CUDASIM_BACKEND=host CUDASIM_DMABUF=1 \
    CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1 CUDASIM_WAIT_TIMEOUT_MS=5000 \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout 600 "$out/capi_fuzz" --seed="$seed" --ops="$ops" >"$out/capi_fuzz.log" 2>&1 || rc=$?
quiet='^\[[0-9]*\] GDS |^ERR: |^WARN: |^INFO: '
# The first line (the seed) and the last 40 of the rest.
grep -avE "$quiet" "$out/capi_fuzz.log" | awk 'NR == 1 { print; next } { t[NR % 40] = $0 } END { for (i = NR - 39; i <= NR; i++) if (i > 1) print t[i % 40] }'
echo "capi_fuzz: $((SECONDS - t0)) s, exit $rc; $(grep -acE "$quiet" "$out/capi_fuzz.log") library log lines not shown (whole output: $out/capi_fuzz.log)"
if [ "$rc" != 0 ]; then
    echo "capi_fuzz: FAIL; the log's last lines:"
    tail -n 40 "$out/capi_fuzz.log"
    exit 1
fi

# fork while another thread is inside libgdrapi: the child must not deadlock.
t0=$SECONDS
rc=0
env -u GDRCOPY_ENABLE_LOGGING LD_LIBRARY_PATH="$out/lib" CUDASIM_BACKEND=host CUDASIM_DMABUF=1 \
    CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1 \
    timeout 600 "$out/fork_locks" --children=50 || rc=$?
echo "fork_locks: $((SECONDS - t0)) s"
if [ "$rc" != 0 ]; then
    echo "fork_locks: FAIL (exit $rc)"
    exit 1
fi
