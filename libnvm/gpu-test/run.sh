#!/bin/bash
# The GPU-side queue (include/nvm_pq.h) on an NVIDIA GPU (built for sm_90: H100/H200) against
# CPU threads playing the NVMe controller over rings in pinned host memory (ctrl_emu.h):
#   1. emu_host: the emulator and the queue on CPU threads only (sanity, no GPU)
#   2. pq_gpu test: 10 M commands, out of order, 1% injected errors, every payload and status
#      checked at its issuer, exactly-once completion; a stuck command times out
#   3. pq_gpu bench: the benchmark lines of docs/gpu-queue.md, libnvm's helpers as the baseline
#   4. the example libnvm/examples/pq_sum.cu (GPU sum of blocks read into GPU memory == CPU path)
# Usage: libnvm/gpu-test/run.sh [test commands=10000000]
# Needs nvcc (CUDA 12 or 13) and a GPU of compute capability 9.0; SKIP (exit 0) without them.
# Logs go to $OUT (if set) as well as stdout. Exit status 0 only if every step passed.
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${PQ_BUILD:-/tmp/nvm-pq-gpu}
out=${OUT:-$build}
total=${1:-10000000}
mkdir -p "$build" "$out"
log=$out/gpu-test.log
: > "$log"
say() { echo "$@" | tee -a "$log"; }

if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && PATH=$d:$PATH; done
fi
if ! command -v nvcc >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "SKIP: nvm_pq GPU tests need nvcc and an NVIDIA GPU (nvcc: $(command -v nvcc || echo none))"
    exit 0
fi
export CUDA_MODULE_LOADING=EAGER
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "nvcc: $(nvcc --version | tail -2 | head -1)"
say "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
[ -f "$root/.gpuq-commit" ] && say "commit: $(cat "$root/.gpuq-commit")"

fail=0
step() {
    local name=$1; shift
    say "=== $name"
    if timeout "${PQ_STEP_TIMEOUT:-240}" "$@" 2>&1 | tee -a "$log"; then
        say "=== $name: ok"
    else
        say "=== $name: FAILED (status ${PIPESTATUS[0]})"
        fail=1
    fi
}

inc="-I$root/include"
nv="nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 $inc -Xcompiler -Wall,-Wextra"
step "build emu_host" gcc -std=gnu11 -O2 -Wall -Wextra -Werror -pthread $inc "$here/emu_host.c" -o "$build/emu_host"
step "build pq_gpu" $nv -Xptxas -v "$here/pq_gpu.cu" -o "$build/pq_gpu"
step "build pq_sum" $nv "$root/libnvm/examples/pq_sum.cu" -o "$build/pq_sum" -lpthread
[ "$fail" = 0 ] || { say "FAIL: build"; exit 1; }

step "emu_host (CPU threads only)" "$build/emu_host" 16 20000
step "pq_gpu test ($total commands)" "$build/pq_gpu" test "$total"
step "pq_gpu bench" "$build/pq_gpu" bench
step "example pq_sum" "$build/pq_sum" 0 262144 8192 4
if [ "$fail" = 0 ]; then say "PASS: nvm_pq GPU tests"; else say "FAIL: nvm_pq GPU tests"; fi
exit $fail
