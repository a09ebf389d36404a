#!/usr/bin/env bash
# A real consumer of libgdrapi: NCCL from PyPI (nvidia-nccl-cu13). With NCCL_GDRCOPY_ENABLE=1,
# ncclGetUniqueId initialises NCCL's GDRCOPY wrapper even on a machine without a GPU:
# dlopen("libgdrapi.so", RTLD_NOW), dlsym of its gdr_* entry points, gdr_open, version checks.
# We assert from NCCL's log and LD_DEBUG=libs that OUR library was the one loaded and initialised,
# that NCCL found every symbol it wanted, and what NCCL concluded:
#   - without /dev/gdrdrv: "libgdrapi.so gdr_open() failed" (and our library says why);
#   - with /dev/gdrdrv (the VM): "GDRCOPY enabled library 2.6 driver 2.6".
# A control run without NCCL_GDRCOPY_ENABLE must not load libgdrapi at all.
#
#   compat-tests/gdrapi/nccl-consumer.sh [--prefix DIR | --libdir DIR] [--keep]
# The wheel is cached in .deps/ (git-ignored); NCCL_WHEEL_DIR overrides where it is looked for.
# NCCL_CONSUMER_LIBCUDA=DIR puts DIR (with a libcuda.so.1, e.g. cudasim) on LD_LIBRARY_PATH too.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
deps=$top/.deps
prefix="" libdir_opt="" keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --libdir) libdir_opt=$2; shift 2 ;;
        --libdir=*) libdir_opt=${1#*=}; shift ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "nccl-consumer.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gdrapi-nccl.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT

# --- NCCL from PyPI, cached --------------------------------------------------------------------
nccl_root=$deps/nccl
libnccl=$nccl_root/nvidia/nccl/lib/libnccl.so.2
if [ ! -f "$libnccl" ]; then
    wheels=${NCCL_WHEEL_DIR:-$deps/wheels}
    mkdir -p "$wheels"
    if ! ls "$wheels"/nvidia_nccl_cu13-*.whl >/dev/null 2>&1; then
        echo "# downloading nvidia-nccl-cu13 into $wheels"
        python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" nvidia-nccl-cu13 ||
            { echo "cannot download nvidia-nccl-cu13" >&2; exit 1; }
    fi
    whl=$(ls "$wheels"/nvidia_nccl_cu13-*.whl | sort -V | tail -n 1)
    echo "# unpacking $whl"
    mkdir -p "$nccl_root"
    python3 - "$whl" "$nccl_root" <<'PY' || exit 1
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("nvidia/nccl/lib/"):
        z.extract(n, sys.argv[2])
PY
fi
[ -f "$libnccl" ] || { echo "no $libnccl" >&2; exit 1; }
echo "# NCCL: $libnccl"
echo "# NCCL needs: $(readelf -d "$libnccl" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"

# --- our library, under the names NCCL looks for ----------------------------------------------
if [ -n "$prefix" ]; then
    libdir=$(realpath -m "$prefix")/lib
elif [ -n "$libdir_opt" ]; then
    libdir=$(realpath "$libdir_opt")
else
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$top/target}
    (cd "$top" && cargo build --release -p gdrapi) || exit 1
    mkdir -p "$work/lib"
    ln -sf "$(realpath "$CARGO_TARGET_DIR/release/libgdrapi.so")" "$work/lib/libgdrapi.so.2"
    ln -sf "$(realpath "$CARGO_TARGET_DIR/release/libgdrapi.so")" "$work/lib/libgdrapi.so"
    libdir=$work/lib
fi
ours=$libdir/libgdrapi.so
[ -e "$ours" ] || { echo "no $ours (NCCL dlopens the unversioned name)" >&2; exit 1; }
echo "# our library: $ours -> $(realpath "$ours")"
ldpath=$libdir
[ -n "${NCCL_CONSUMER_LIBCUDA:-}" ] && ldpath=$ldpath:$NCCL_CONSUMER_LIBCUDA

${CC:-gcc} -std=c11 -Wall -Wextra -Werror -o "$work/nccl_uid" "$here/nccl_uid.c" -ldl || exit 1

passed=0 failed=0
check() { # description, then a command that must succeed
    local what=$1; shift
    if "$@"; then passed=$((passed + 1)); echo "ok - $what"
    else failed=$((failed + 1)); echo "not ok - $what"; fi
}
has() { grep -qF -- "$1" "$2"; }
lacks() { ! grep -qE -- "$1" "$2"; }

run_nccl() { # log, extra env...
    local log=$1; shift
    env -u GDRCOPY_USE_DMABUF_MMAP -u NCCL_GDRCOPY_ENABLE LD_LIBRARY_PATH="$ldpath" \
        NCCL_DEBUG=INFO LD_DEBUG=libs GDRCOPY_ENABLE_LOGGING=1 NCCL_HOSTID=gdrapi-compat \
        "$@" timeout 120 "$work/nccl_uid" "$libnccl" >"$log" 2>&1
    local rc=$?
    echo "# exit status $rc; NCCL and library lines:"
    grep -vE '^ +[0-9]+:' "$log" | sed 's/^/    | /' | head -n 40
    return $rc
}

echo "# run 1: NCCL_GDRCOPY_ENABLE=1"
log1=$work/nccl-gdrcopy.log
run_nccl "$log1" NCCL_GDRCOPY_ENABLE=1
rc=$?
check "ncclGetUniqueId succeeded" [ "$rc" -eq 0 ]
check "NCCL saw NCCL_GDRCOPY_ENABLE" has "NCCL_GDRCOPY_ENABLE set by environment to 1" "$log1"
# LD_DEBUG=libs prints "calling init: <path>" for every library the loader initialises.
inits=$(grep -E 'calling init: .*libgdrapi' "$log1" | sed 's/.*calling init: //' | sort -u)
echo "# libgdrapi initialised from: ${inits:-nothing}"
check "the loader initialised our libgdrapi.so ($ours)" [ "$inits" = "$ours" ]
check "NCCL found every gdr_* symbol it asked for" \
    lacks 'ncclOsDlsym failed|Failed to initialize .* symbols|gdr_[a-z0-9_]+(\(\))? not available|not available for .* backend|Failed to open libgdrapi' "$log1"
check "NCCL reported no GDRCOPY version mismatch or wrapper error" \
    lacks 'Version mismatch|GDRCOPY lib wrapper not initialized' "$log1"
if [ -e /dev/gdrdrv ]; then
    check "NCCL enabled GDRCOPY with library 2.6 and driver 2.6" \
        has "GDRCOPY enabled library 2.6 driver 2.6" "$log1"
else
    check "NCCL called our gdr_open, which failed without /dev/gdrdrv" \
        has "libgdrapi.so gdr_open() failed" "$log1"
    check "our library said why (GDRCOPY_ENABLE_LOGGING=1)" has "ERR:  error opening driver (errno=2/" "$log1"
fi

echo "# run 2 (control): NCCL_GDRCOPY_ENABLE unset"
log2=$work/nccl-control.log
run_nccl "$log2"
rc=$?
check "ncclGetUniqueId succeeded without GDRCOPY" [ "$rc" -eq 0 ]
check "without NCCL_GDRCOPY_ENABLE NCCL does not load libgdrapi" lacks 'calling init: .*libgdrapi' "$log2"

[ "$keep" = 1 ] && echo "# logs kept in $work"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
