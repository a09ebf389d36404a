#!/usr/bin/env bash
# Builds the part of UCX that drives gdrcopy (UCS, UCM, UCT with its cuda and gdr_copy modules,
# UCP, ucx_info) from Debian's source package, against our installed libgdrapi, with CUDA headers
# and libcudart from NVIDIA's PyPI wheel, cudasim as libcuda and a test-only NVML stub
# (compat-tests/ucx/nvml-stub: UCX's configure insists on nvml.h and -lnvidia-ml, which no wheel
# ships). Nothing here is installed outside target/.
#
#   compat-tests/ucx/build-ucx.sh [--gdr-prefix DIR] [--cudasim FILE] [--quiet]
#
# --gdr-prefix DIR: our library already installed there (./build.sh install --prefix DIR);
#                   without it the script runs that install into target/ucx/gdr-prefix.
# --cudasim FILE:   the libcuda.so (cudasim) UCX links against (default: target/release's);
#                   scripts/run-tests passes a copy, so that its early background build does
#                   not read a file a concurrent cargo run may rewrite. The installed tree's
#                   libcuda.so.1 always points at target/release/libcuda.so.
# One build at a time: a second run waits for the first (flock on target/ucx/.lock) and then
# finds its result in the cache.
# The build is cached in target/ucx/build-KEY, KEY a hash of every input (the UCX source package,
# this script, the stub, our gdrapi.h/gdrconfig.h, the CUDA wheel version, the compiler), so a
# second run only checks the key. The library binary is not an input: UCX links it by soname, and
# the tests put the current one first on LD_LIBRARY_PATH.
# Last line of stdout: the path of target/ucx/env, a shell fragment that sets UCX_PREFIX,
# GDR_PREFIX, UCX_TEST_LIBS (cudart, the NVML stub, libcuda.so.1 -> cudasim) and CUDA_INC.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
gdr_prefix="" quiet=0 cudasim_link=""
while [ $# -gt 0 ]; do
    case "$1" in
        --gdr-prefix) gdr_prefix=$2; shift 2 ;;
        --gdr-prefix=*) gdr_prefix=${1#*=}; shift ;;
        --cudasim) cudasim_link=$2; shift 2 ;;
        --cudasim=*) cudasim_link=${1#*=}; shift ;;
        --quiet) quiet=1; shift ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-ucx.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
say() { [ "$quiet" = 1 ] || printf '==> %s\n' "$*" >&2; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$top/target}
base="$CARGO_TARGET_DIR/ucx"
mkdir -p "$base"
t0=$(date +%s)

# --- our library and cudasim ------------------------------------------------------------------
if [ -z "$gdr_prefix" ]; then
    gdr_prefix="$base/gdr-prefix"
    say "installing our libraries into $gdr_prefix"
    (cd "$top" && ./build.sh install --prefix "$gdr_prefix") >&2
else
    gdr_prefix=$(realpath "$gdr_prefix")
fi
[ -f "$gdr_prefix/include/gdrapi.h" ] && [ -e "$gdr_prefix/lib/libgdrapi.so" ] || {
    echo "build-ucx.sh: no gdrapi.h / libgdrapi.so under $gdr_prefix" >&2; exit 1; }
cudasim="$CARGO_TARGET_DIR/release/libcuda.so"
if [ -n "$cudasim_link" ]; then
    cudasim_link=$(realpath "$cudasim_link")
    [ -f "$cudasim_link" ] || { echo "build-ucx.sh: --cudasim $cudasim_link: no such file" >&2; exit 1; }
elif [ ! -f "$cudasim" ]; then
    say "building cudasim"
    (cd "$top" && cargo build --release --locked -p cudasim) >&2
fi
cudasim_link=${cudasim_link:-$cudasim}
cuda_inc=$("$top/scripts/fetch-cuda-headers")
cuda_wheel_version="${CUDA_WHEEL_VERSION:-13.5.37}"

# --- UCX's source package ---------------------------------------------------------------------
# apt-get source needs a deb-src line; Debian images ship only deb lines. One file of ours, written
# once, for the release the machine runs.
if ! apt-cache showsrc ucx 2>/dev/null | grep -q '^Version:'; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    src_list=/etc/apt/sources.list.d/gpudirect-deb-src.sources
    if [ ! -f "$src_list" ]; then
        say "adding deb-src for $codename ($src_list)"
        printf '%s\n' "Types: deb-src" "URIs: http://deb.debian.org/debian" "Suites: $codename" \
            "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$src_list"
    fi
    apt-get update -qq </dev/null >&2
fi
ucx_version=$(apt-cache showsrc ucx | sed -n 's/^Version: //p' | sort -V | tail -n 1)
[ -n "$ucx_version" ] || { echo "build-ucx.sh: apt-cache knows no ucx source package" >&2; exit 1; }

# --- the cache key ----------------------------------------------------------------------------
key=$( {
    echo "ucx $ucx_version cuda-wheel $cuda_wheel_version"
    cat "$0" "$here/nvml-stub/nvml.h" "$here/nvml-stub/nvml_stub.c"
    cat "$gdr_prefix/include/gdrapi.h" "$gdr_prefix/include/gdrconfig.h"
    ${CC:-gcc} --version | head -n 1
} | sha256sum | cut -c1-16)
build="$base/build-$key"
exec {lock_fd}>"$base/.lock"
if ! flock -n "$lock_fd"; then
    say "another build-ucx.sh is running: waiting for it"
    flock -w 3600 "$lock_fd" || { echo "build-ucx.sh: $base/.lock not released in an hour" >&2; exit 1; }
fi
if [ -f "$build/.complete" ]; then
    say "UCX $ucx_version cached in $build"
else
    say "building UCX $ucx_version into $build (key $key)"
    rm -rf "$build" "$build.tmp"
    mkdir -p "$build.tmp"
    b="$build.tmp"
    (cd "$b" && apt-get source -qq ucx="$ucx_version" </dev/null) >"$b/apt-source.log" 2>&1 || {
        cat "$b/apt-source.log" >&2; exit 1; }
    src=$(find "$b" -mindepth 1 -maxdepth 1 -type d -name 'ucx-*' | head -n 1)
    [ -n "$src" ] || { echo "build-ucx.sh: apt-get source gave no ucx-* directory" >&2; exit 1; }

    # A CUDA "installation" as UCX's configure expects one: include/ and lib64/ with libcuda
    # (cudasim), libcudart (wheel) and libnvidia-ml (stub).
    cuda="$b/cuda"
    testlibs="$b/prefix/lib/ucx-test-libs"
    mkdir -p "$cuda/lib64" "$testlibs"
    # cuda_runtime.h (UCX's cuda modules include it) needs crt/*.h, which CUDA 13 ships in a
    # wheel of its own (nvidia-cuda-crt); libcudart.so.13 comes from nvidia-cuda-runtime.
    rm -f "$cuda/include"
    mkdir -p "$cuda/include"
    cp -rs "$cuda_inc"/. "$cuda/include/"
    whl=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$whl" \
        --platform manylinux2014_x86_64 --python-version 3.11 \
        "nvidia-cuda-runtime==$cuda_wheel_version" "nvidia-cuda-crt==$cuda_wheel_version" >&2
    python3 - "$cuda/include" "$testlibs" "$whl"/*.whl <<'PY'
import sys, zipfile, os
inc, libs = sys.argv[1], sys.argv[2]
for whl in sys.argv[3:]:
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.endswith("/lib/libcudart.so.13"):
                out = os.path.join(libs, "libcudart.so.13")
            elif "/include/crt/" in n and not n.endswith("/"):
                out = os.path.join(inc, "crt", n.split("/include/crt/", 1)[1])
            else:
                continue
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as s, open(out, "wb") as d:
                d.write(s.read())
PY
    rm -rf "$whl"
    test -f "$cuda/include/crt/host_config.h"
    test -f "$testlibs/libcudart.so.13"
    ln -s "$testlibs/libcudart.so.13" "$cuda/lib64/libcudart.so"
    ${CC:-gcc} -shared -fPIC -O2 -Wall -Wextra -Werror -I"$here/nvml-stub" \
        -Wl,-soname,libnvidia-ml.so.1 -o "$testlibs/libnvidia-ml.so.1" "$here/nvml-stub/nvml_stub.c"
    ln -s "$testlibs/libnvidia-ml.so.1" "$cuda/lib64/libnvidia-ml.so"
    ln -s "$cudasim_link" "$cuda/lib64/libcuda.so"
    ln -s "$cudasim_link" "$testlibs/libcuda.so.1"

    (
        cd "$src"
        # timed LABEL LOG CMD...: CMD with its output appended to LOG; says its wall and CPU time.
        timed() {
            local label=$1 log=$2 rc=0 TIMEFORMAT='%R %U %S'
            shift 2
            { time "$@" >>"$log" 2>&1 || rc=$?; } 2>"$b/.time"
            [ "$rc" = 0 ] || { tail -n 60 "$log" >&2; return "$rc"; }
            say "$label: $(awk '{ printf "%.0f s wall, %.0f s CPU", $1, $2 + $3 }' "$b/.time")"
        }
        timed autogen "$b/autogen.log" ./autogen.sh || exit 1
        # CFLAGS come after UCX's own -O3 -g on every compile line, so they are what counts:
        # -O0 without debug info. UCX is a fixture here: the tests check which transport it
        # picks and what it copies through our libgdrapi, which its optimisation level does not
        # change, and -O0 is the cheapest compile of a build that is a sizeable part of a full
        # run's CPU. Nothing here debugs UCX.
        timed configure "$b/configure.log" env CPPFLAGS="-I$here/nvml-stub" CFLAGS="-O0 -g0" \
            ./configure --prefix="$build" \
            --with-cuda="$cuda" --with-gdrcopy="$gdr_prefix" \
            --without-verbs --without-rdmacm --without-knem --without-xpmem --without-ugni \
            --without-rocm --without-java --without-go --without-fuse3 --without-valgrind \
            --disable-doxygen-doc --disable-numa --disable-examples --without-mpi \
            --enable-mt --disable-static || exit 1
        grep -q '^#define HAVE_CUDA 1' config.h ||
            { echo "build-ucx.sh: configure found no CUDA" >&2; grep -iE 'cuda|nvml' "$b/configure.log" >&2; exit 1; }
        # UCX's configure can end "happy" after a failed cuda_runtime.h check (its nvml.h check
        # resets the flag), leaving modules without libcuda/libcudart: refuse that here.
        grep -Eq '^CUDA_LIBS = .*-lcuda .*-lcudart' src/uct/cuda/Makefile ||
            { echo "build-ucx.sh: CUDA libraries missing:" >&2; grep '^CUDA_LIBS' src/uct/cuda/Makefile >&2; exit 1; }
        grep -q 'uct_cuda_MODULES ":gdrcopy"' config.h ||
            { echo "build-ucx.sh: configure dropped gdr_copy" >&2; grep -i gdr "$b/configure.log" >&2; exit 1; }
        jobs=$(nproc)
        for d in src/ucm src/ucs src/uct src/ucp src/tools/info; do
            timed "make -j$jobs $d" "$b/make.log" nice -n 10 make -j"$jobs" -C "$d" || exit 1
        done
        for d in src/ucm src/ucs src/uct src/ucp src/tools/info; do
            timed "make install $d" "$b/install.log" make -C "$d" install || exit 1
        done
    ) || exit 1
    # The installed tree keeps the test libraries; the scratch (source, objects) goes.
    cp -a "$b/prefix/lib/ucx-test-libs" "$build/lib/"
    mv "$b"/*.log "$build/"
    rm -rf "$b"
    touch "$build/.complete"
    say "UCX built in $(( $(date +%s) - t0 )) s"
fi
# libcuda.so.1 follows the current cudasim build, never a copy from the cache's day.
ln -sfn "$cudasim" "$build/lib/ucx-test-libs/libcuda.so.1"
ln -sfn "$build" "$base/current"
ls "$build/lib/ucx/libuct_cuda_gdrcopy.so" >/dev/null

cat > "$base/env" <<EOF
UCX_PREFIX='$build'
GDR_PREFIX='$gdr_prefix'
UCX_TEST_LIBS='$build/lib/ucx-test-libs'
CUDA_INC='$cuda_inc'
UCX_VERSION='$ucx_version'
EOF
say "ready in $(( $(date +%s) - t0 )) s"
echo "$base/env"
