#!/bin/sh
# Fetches cuda.h (CUDA 13) without the toolkit: the PyPI wheel nvidia-cuda-runtime carries the
# driver API header. Result: $DEST/cuda.h (default .deps/cuda/include, git-ignored via /.deps).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${DEST:-$ROOT/.deps/cuda/include}
if [ -f "$DEST/cuda.h" ]; then
    echo "cuda.h already present in $DEST"
    exit 0
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$WORK" "nvidia-cuda-runtime>=13,<14"
WHL=$(ls "$WORK"/*.whl | head -n 1)
python3 - "$WHL" "$WORK/x" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith("/include/cuda.h") or n.endswith("/include/cudaTypedefs.h"):
        z.extract(n, sys.argv[2])
PY
H=$(find "$WORK/x" -name cuda.h | head -n 1)
[ -n "$H" ] || { echo "cuda.h not found in $WHL" >&2; exit 1; }
mkdir -p "$DEST"
cp "$H" "$DEST/cuda.h"
echo "installed $(grep -m1 '#define CUDA_VERSION' "$DEST/cuda.h") into $DEST"
