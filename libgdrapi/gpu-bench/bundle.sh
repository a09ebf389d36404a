#!/bin/bash
# Builds, on the development machine, what libgdrapi/gpu-bench/run.sh needs on the GPU machine
# (which has no cargo): target/gdrapi-gpu/{copy_engines, lib/libgdrapi.so.2, lib/libcuda.so.1,
# lib/libcuda.so -> libcuda.so.1, base/libgdrapi.so.2}. libcuda.so.1 is the project's simulated driver (cudasim): the bench's
# "BAR" is cudasim memory exported as a dma-buf, because the GPU machine cannot load gdrdrv and
# its driver's dma-buf mmap does not work, so the numbers are instruction costs on cached memory
# (docs/performance.md says what they mean and what they do not).
#
#     libgdrapi/gpu-bench/bundle.sh [BASE]
#
# BASE: the library to compare with in the same process (`--gdrapi`): a path to a built
# libgdrapi.so, or a git revision, built here in a scratch worktree. Without it, this build is
# compared with itself (an A/A run, which shows the bench's resolution).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=$top/target/gdrapi-gpu
rm -rf "$B"
mkdir -p "$B/lib" "$B/base"
cargo build -q --release -p gdrapi -p cudasim
bench=$(scripts/copy-bench-path)
strip -o "$B/copy_engines" "$bench"
strip -o "$B/lib/libgdrapi.so.2" target/release/libgdrapi.so
strip -o "$B/lib/libcuda.so.1" target/release/libcuda.so
# Both names of the driver library: ours loads libcuda.so.1, upstream 2.6's libgdrapi dlopens the
# unversioned libcuda.so (without it, its gdr_open returns NULL and there is nothing to compare).
ln -s libcuda.so.1 "$B/lib/libcuda.so"
base=${1:-}
if [ -z "$base" ]; then
    cp "$B/lib/libgdrapi.so.2" "$B/base/libgdrapi.so.2"
    echo "A/A: this build as both libraries" > "$B/base/WHAT"
elif [ -f "$base" ]; then
    strip -o "$B/base/libgdrapi.so.2" "$base"
    echo "file $base" > "$B/base/WHAT"
else
    rev=$(git rev-parse --verify "$base^{commit}")
    wt=$(mktemp -d)
    trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
    git worktree add -q --detach "$wt" "$rev"
    # Its own target directory, so the two builds do not share artefacts.
    (cd "$wt" && CARGO_TARGET_DIR=$wt/target cargo build -q --release -p gdrapi)
    strip -o "$B/base/libgdrapi.so.2" "$wt/target/release/libgdrapi.so"
    echo "git $rev" > "$B/base/WHAT"
fi
git rev-parse HEAD > "$B/WHAT"
git status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)" >> "$B/WHAT"
du -sh "$B"
