#!/bin/bash
# Builds, on the development machine, everything libgdsync/gpu-test/run.sh needs on the GPU
# machine (which has no cargo): target/gdsync-gpu/{lib/libgdsync.so.2, stream_suite,
# bench_poll_lat, abi_layout, include-extra/infiniband}. The test programs link libcuda.so.1 by
# name; on the GPU machine that resolves to the real driver.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=$top/target/gdsync-gpu
rm -rf "$B"
mkdir -p "$B/lib" "$B/include-extra" "$B/linkstub"
scripts/fetch-cuda-headers >/dev/null
cargo build -q --release -p gdsync -p cudasim
cp target/release/libgdsync.so "$B/lib/libgdsync.so.2"
ln -sf libgdsync.so.2 "$B/lib/libgdsync.so"
# Link against the simulator only to satisfy the linker; it is not shipped.
ln -sf "$top/target/release/libcuda.so" "$B/linkstub/libcuda.so"
CF=(-std=gnu11 -O2 -Wall -Wextra -Werror -I"$top/include" -I"$top/.deps/cuda/include")
gcc "${CF[@]}" compat-tests/gdsync/stream_suite.c -o "$B/stream_suite" -L"$B/lib" -L"$B/linkstub" -lgdsync -lcuda -lpthread
gcc "${CF[@]}" compat-tests/gdsync/bench_poll_lat.c -o "$B/bench_poll_lat" -L"$B/lib" -L"$B/linkstub" -lgdsync -lcuda -lm
gcc "${CF[@]}" compat-tests/gdsync/abi_layout.c -o "$B/abi_layout"
cp -r /usr/include/infiniband "$B/include-extra/"
# The Rust integration test of prepared send/wait requests (run.sh sets GDSYNC_REQUESTS_REAL_CUDA=1
# so that it runs against the driver, not cudasim).
exe=$(cargo test --release -p gdsync --test requests_cudasim --no-run 2>&1 | grep -o 'target/release/deps/requests_cudasim-[0-9a-f]*' | head -n1)
[ -n "$exe" ] && cp "$exe" "$B/requests_test" || { echo "could not build requests_cudasim"; exit 1; }
rm -rf "$B/linkstub"
du -sh "$B"
