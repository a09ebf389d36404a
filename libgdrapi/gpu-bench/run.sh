#!/bin/bash
# The copy call's bars (issue 10) on the GPU machine, in one command, from the repository root,
# with the bundle that libgdrapi/gpu-bench/bundle.sh built on the development machine:
#     libgdrapi/gpu-bench/run.sh [bundle-dir] [runs]     (defaults: target/gdrapi-gpu, 4)
# Needs python3 and taskset; no cargo, no CUDA toolkit (the bench loads the bundled cudasim).
#   1. `runs` bench runs to 4097 bytes, pinned to one CPU, 300 block pairs per paired difference,
#      this build and the base taking turns as `--ours` (the other one is `--gdrapi`), so that
#      where each library's code sits in the process is seen both ways;
#   2. one run at every size to 16 MiB with the thread-scaling table (1, 2, 4, 8 threads), unless
#      SKIP_FULL=1 (an A/B of two builds needs only the pinned runs);
#   3. one more run like those of step 1 but with the host buffer at page offset 1024, and the
#      misaligned/aligned load ratios from 512 bytes at both offsets side by side (on Zen 4 the
#      2 KiB cell at 2048 includes a store split across two pages, and at 1024 it does not:
#      docs/performance.md, fifteenth pass);
#   4. scripts/bench-bar-summary over the runs with this build as `--ours`.
# Every run compares the two libraries in one process: a comparison that cannot run (the other
# library's gdr_open or pin/map fails) fails the whole script at once, as does a bundle without
# both names of the driver library (upstream's libgdrapi dlopens libcuda.so, ours libcuda.so.1).
# Step 0, a few seconds: both libraries map the same device memory in a tiny run.
# About 7-9 minutes on the H100 machine. Outputs go to ${OUT:-/tmp}/gdrapi-gpu/: with 4 runs,
# 7 files (the device tool brings back at most 8).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=$(cd "${1:-target/gdrapi-gpu}" && pwd)
runs=${2:-4}
D=${OUT:-/tmp}/gdrapi-gpu
mkdir -p "$D"
export LD_LIBRARY_PATH=$B/lib CUDASIM_DMABUF=1 CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1
ours=$B/lib/libgdrapi.so.2
base=$B/base/libgdrapi.so.2
# One CPU that is not the first (interrupts) of those allowed.
cpu=$(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[min(3, len(c) - 1)])')
machine=$(
    date -u
    echo "this build: $(cat "$B/WHAT")"
    echo "base: $(cat "$B/base/WHAT")"
    grep -m1 'model name' /proc/cpuinfo
    echo "CPUs allowed: $(nproc); pinned runs on CPU $cpu"
)
echo "$machine"
die() { echo "FAIL: $*" >&2; exit 1; }
for n in libcuda.so.1 libcuda.so; do
    [ -e "$B/lib/$n" ] || die "the bundle has no $B/lib/$n (rebuild it with libgdrapi/gpu-bench/bundle.sh)"
done
# The bench says how each library fared; both must have mapped the device memory, or the run
# compares nothing (the bench itself goes on and times our library alone).
compared() { # output file
    grep -q '^- our libgdrapi: .*BAR mapping at' "$1" || die "our library did not map the BAR in $1: $(grep -m1 '^- our libgdrapi' "$1")"
    grep -q '^- other libgdrapi: .*same device memory mapped at' "$1" ||
        die "the requested comparison could not run in $1: $(grep -m1 '^- other libgdrapi' "$1")"
}
echo "== both libraries map the same device memory"
for pair in "$ours $base" "$base $ours"; do
    read -r a b <<<"$pair"
    "$B/copy_engines" --quick --bar-only --max-size 64 --pairs 2 --ours "$a" --gdrapi "$b" > "$D/probe.txt" 2>&1
    rc=$?
    compared "$D/probe.txt"
    [ "$rc" = 0 ] || { tail -5 "$D/probe.txt"; die "probe run failed (exit $rc)"; }
done
rm -f "$D/probe.txt"
# One bench run to 4097 bytes on the pinned CPU: host offset, --ours, --gdrapi, output file.
pinned_run() {
    taskset -c "$cpu" "$B/copy_engines" --bar-only --host-offset "$1" --max-size 4097 --pairs 300 \
        --ours "$2" --gdrapi "$3" > "$4" 2>&1
    local rc=$?
    compared "$4"
    [ "$rc" = 0 ] || { echo "run into $4 failed"; tail -5 "$4"; exit 1; }
}
mine=()
for r in $(seq 1 "$runs"); do
    if [ $((r % 2)) = 1 ]; then a=$ours; b=$base; mine+=("$D/run-$r.txt"); else a=$base; b=$ours; fi
    echo "== run $r: --ours $(basename "$(dirname "$a")")/$(basename "$a")"
    pinned_run 2048 "$a" "$b" "$D/run-$r.txt"
    grep '^bar' "$D/run-$r.txt"
done
if [ "${SKIP_FULL:-0}" = 1 ]; then
    echo "== every size and the thread-scaling table: skipped (SKIP_FULL=1, for A/B runs)"
else
    echo "== every size and the thread-scaling table"
    "$B/copy_engines" --bar-only --host-offset 2048 --ours "$ours" --gdrapi "$base" --threads 1,2,4,8 \
        > "$D/full.txt" 2>&1
    rc=$?
    compared "$D/full.txt"
    [ "$rc" = 0 ] || { echo "full run failed"; tail -5 "$D/full.txt"; exit 1; }
    grep -E '^\| (8 B|4 KiB) (load|store) \|' "$D/full.txt" || echo "no thread-scaling table in $D/full.txt"
fi
echo "== misaligned/aligned loads, host buffer at page offset 2048 (run 1) and 1024"
pinned_run 1024 "$ours" "$base" "$D/offset-1024.txt"
ratios() { sed -nE 's/^summary loads ([0-9]+ [KMG]?i?B): .*paired misaligned-aligned public [^,]*, time (x[0-9.]+).*/\1 \2/p' "$1"; }
paste <(ratios "$D/run-1.txt") <(ratios "$D/offset-1024.txt") | awk -F'\t' '{ split($1, a, " "); split($2, b, " ");
    if (a[2] == "KiB" || a[1] + 0 >= 512) printf "  %s %s: %s at 2048, %s at 1024\n", a[1], a[2], a[3], b[3] }'
echo "== bars, runs with this build as --ours"
{ echo "$machine"; python3 scripts/bench-bar-summary --compared "${mine[@]}"; } | tee "$D/verdict.txt"
