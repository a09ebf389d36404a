#!/bin/bash
# libgdsync on a real GPU (H100, CUDA 13, real libcuda): run from the repository root with the
# bundle that libgdsync/gpu-test/bundle.sh built on the development machine:
#     libgdsync/gpu-test/run.sh [bundle-dir]        (default: target/gdsync-gpu)
# Needs nvidia driver + /usr/local/cuda (nvcc, cuda.h); no cargo. Runs well under 3 minutes.
#   1. ABI layout check compiled here against the toolkit's cuda.h (gcc);
#   2. the descriptor suite on a real stream, host memory and GPU memory (default env, then NOR on);
#   3. a kernel using <gdsync/device.cuh> (built here with nvcc) waiting/releasing host words;
#   4. the gds_poll_lat-style latency benchmark: gds descriptors vs raw cuStreamWaitValue32/
#      cuStreamWriteValue32 vs raw cuStreamBatchMemOp, in the same run.
# Exit status: non-zero if any step failed. A log is written to ${OUT:-/tmp}/gdsync-gpu.log.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=$(cd "${1:-target/gdsync-gpu}" && pwd)
CUDA=${CUDA_HOME:-/usr/local/cuda}
LOG=${OUT:-/tmp}/gdsync-gpu.log
fail=0
exec > >(tee "$LOG") 2>&1
step() { printf '\n== %s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

step "machine"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$CUDA/bin/nvcc" --version | tail -2
ldd "$B/stream_suite" | grep -E 'libcuda|libgdsync'
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
arch=${arch:-90}

step "ABI layout (gcc, toolkit cuda.h)"
gcc -std=gnu11 -Wall -Wextra -Werror -Iinclude -I"$B/include-extra" -I"$CUDA/include" \
    compat-tests/gdsync/abi_layout.c -o /tmp/gdsync_abi_layout && /tmp/gdsync_abi_layout || bad "abi_layout"

step "descriptor suite, real stream (default env)"
timeout 120 "$B/stream_suite" -g 2> /tmp/gdsync_suite.err || { bad "stream_suite"; tail -40 /tmp/gdsync_suite.err; }
grep -E 'WARN|not available' /tmp/gdsync_suite.err | sort | uniq -c | head -10

step "descriptor suite, GDS_DISABLE_WAIT_NOR=0"
GDS_DISABLE_WAIT_NOR=0 timeout 120 "$B/stream_suite" -g 2> /tmp/gdsync_suite_nor.err || { bad "stream_suite (NOR)"; tail -40 /tmp/gdsync_suite_nor.err; }

step "prepared send/wait requests (mlx5-shaped op lists) on a real stream"
# The test re-executes itself under cudasim unless told to use the driver the loader finds.
export GDSYNC_REQUESTS_REAL_CUDA=1
# a_refused_value_post_is_einval posts to a destroyed stream, which only cudasim is sure to refuse.
echo "SKIP a_refused_value_post_is_einval (needs cudasim: a destroyed stream handle is undefined for the driver)"
timeout 60 "$B/requests_test" --test-threads=1 --skip a_refused_value_post_is_einval > /tmp/gdsync_requests.out 2>&1
rc=$?
grep -E '^test |test result' /tmp/gdsync_requests.out
if [ $rc -ne 0 ]; then bad "requests_test"; tail -30 /tmp/gdsync_requests.out; fi
unset GDSYNC_REQUESTS_REAL_CUDA

step "device.cuh kernel test (nvcc -arch=sm_$arch)"
if "$CUDA/bin/nvcc" -std=c++14 -arch=sm_"$arch" -Iinclude -I"$B/include-extra" libgdsync/gpu-test/device_test.cu \
    -o /tmp/gdsync_device_test -L"$B/lib" -lgdsync -lcuda; then
    timeout 60 /tmp/gdsync_device_test 2> /tmp/gdsync_device.err || { bad "device_test"; tail -20 /tmp/gdsync_device.err; }
else
    bad "nvcc could not build device_test.cu"
fi

step "latency: gds descriptors vs raw stream memops (host memory)"
for rep in 1 2 3; do
    timeout 60 "$B/bench_poll_lat" -n 3000 -b 100 -s 10 2>/dev/null || bad "bench_poll_lat run $rep"
done

step "result"
if [ $fail -ne 0 ]; then echo "gdsync GPU run: FAILED"; exit 1; fi
echo "gdsync GPU run: all passed"
