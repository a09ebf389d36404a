#!/bin/sh
# nvm_pq.h (the shared GPU-side queue) built for the host and run on CPU threads against nvmesim.
# Usage: compat-tests/libnvm-pq/run.sh [threads=64] [ops per thread=500]
#   PQ_LONG=1 runs 10,000 operations per thread. 500 are 8,000 commands per queue in each phase:
#   every queue wraps 31-242 times (its CQ phase flips as often), which is what the count must
#   reach; 64 spinning threads on a 2-core CI machine take ~5 s per thousand more.
# Builds libnvm and nvmesim (cargo), compiles the header as C11, C++ and (where nvcc exists) CUDA
# with -Wall -Wextra -Werror, then runs the test; exit status 0 only if every check passed.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${PQ_OUT:-$root/target/libnvm-pq}
mkdir -p "$out"
threads=${1:-64}
ops=${2:-500}
[ "${PQ_LONG:-0}" = 1 ] && ops=10000

cargo build --release -q -p nvm -p nvmesim
lib=$root/target/release
cc=${CC:-cc}
cxx=${CXX:-c++}

# The header on its own, as C and C++.
printf '#include <nvm_pq.h>\nint main(void){return (int)sizeof(nvm_pq_t) != 136 || sizeof(nvm_pq_cid_t) != 16 || sizeof(nvm_pq_status_t) != 16;}\n' > "$out/hdr.c"
$cc -std=gnu99 -Wall -Wextra -Werror -Iinclude -c "$out/hdr.c" -o "$out/hdr_c.o"
$cxx -x c++ -std=c++11 -Wall -Wextra -Werror -Iinclude -c "$out/hdr.c" -o "$out/hdr_cxx.o"
if command -v nvcc >/dev/null 2>&1; then
    cp "$out/hdr.c" "$out/hdr.cu"
    nvcc -arch=sm_90 -Xcompiler -Wall,-Wextra,-Werror -Iinclude -c "$out/hdr.cu" -o "$out/hdr_cu.o"
    echo "nvm_pq.h: C, C++ and CUDA (sm_90) compile"
else
    echo "nvm_pq.h: C and C++ compile (SKIP CUDA: no nvcc on PATH)"
fi

$cc -std=gnu11 -O2 -g -Wall -Wextra -Werror -pthread -Iinclude compat-tests/libnvm-pq/pq_sim.c \
    -o "$out/pq_sim" -L"$lib" -lnvm -lnvmesim -Wl,-rpath,"$lib"
# The same test built as C++ (the header's C++ path with the same atomics).
$cxx -x c++ -std=c++17 -O2 -Wall -Wextra -Werror -Wno-missing-field-initializers -pthread -Iinclude \
    compat-tests/libnvm-pq/pq_sim.c -o "$out/pq_sim_cxx" -L"$lib" -lnvm -lnvmesim -Wl,-rpath,"$lib"

"$out/pq_sim" "$threads" "$ops"
"$out/pq_sim_cxx" 16 400
