#!/usr/bin/env bash
# The project's front door: build, install and test the GPUDirect stack in Rust.
#
#   ./build.sh [build]                 cargo build --release + C tools
#   ./build.sh install --prefix DIR    build, then install libraries (with soname links), headers,
#                                      pkg-config files, tools and kernel-module sources
#                                      [--libdir D] [--includedir D] [--bindir D] [--destdir D]
#   ./build.sh check [TIER...]         install test dependencies, then run every test suite, or
#                                      only the named tiers: fast abi fuzz bench packages vm
#                                      (scripts/run-tests says what each holds) [--no-vm] [--no-deps]
#   ./build.sh deps                    install build/test dependencies only (apt + pip)
#
# configure.ac/Makefile.am drive the same script, so both front doors install the same layout.
set -euo pipefail

top=$(cd "$(dirname "$0")" && pwd)
cd "$top"

GDRAPI_VERSION=$(scripts/version gdrapi)
GDRAPI_MAJOR=${GDRAPI_VERSION%%.*}
GDSYNC_VERSION=$(scripts/version gdsync 2>/dev/null || echo "")
CARGO=${CARGO:-cargo}
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$top/target}
export CARGO_TARGET_DIR
rel="$CARGO_TARGET_DIR/release"

log() { printf '==> %s\n' "$*" >&2; }

build() {
    log "cargo build --release (workspace)"
    "$CARGO" build --release --workspace --locked
    # cargo locks its target directory; the C tools build in the tree, so one make at a time
    # (the test run calls build.sh from two lanes at once).
    mkdir -p "$CARGO_TARGET_DIR"
    exec {tools_lock}>"$CARGO_TARGET_DIR/.c-tools.lock"
    flock "$tools_lock"
    if [ -f tools/gdrcopy/Makefile ]; then
        local cuda_inc
        cuda_inc=$(scripts/fetch-cuda-headers)
        log "building gdrcopy tools"
        make -C tools/gdrcopy all \
            GDRAPI_CFLAGS="-I$top/include" GDRAPI_LIBS="-L$rel -lgdrapi" \
            CUDA_CFLAGS="-I$cuda_inc" CUDA_LIBS="-L$rel -lcuda"
    fi
    if [ -f tools/nvm/Makefile ] && [ -f "$rel/libnvm.so" ]; then
        log "building libnvm tools"
        make -C tools/nvm all NVM_CFLAGS="-I$top/include" NVM_LIBS="-L$rel -lnvm"
    fi
    exec {tools_lock}>&-
}

# install_lib NAME REALVERSION SONAME_MAJOR: target/release/libNAME.so → libNAME.so.REAL + links.
install_lib() {
    local name=$1 real=$2 major=$3 dir=$4
    install -D -m 0755 "$rel/lib$name.so" "$dir/lib$name.so.$real"
    ln -sf "lib$name.so.$real" "$dir/lib$name.so.$major"
    ln -sf "lib$name.so.$major" "$dir/lib$name.so"
    install -m 0644 "$rel/lib$name.a" "$dir/lib$name.a"
}

fill_pc() {
    local in=$1 out=$2 version=$3
    sed -e "s|@prefix@|$prefix|g" -e "s|@libdir@|$libdir|g" -e "s|@includedir@|$includedir|g" \
        -e "s|@VERSION@|$version|g" "$in" > "$out"
}

install_all() {
    prefix=/usr/local libdir="" includedir="" bindir="" destdir=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --prefix) prefix=$2; shift 2 ;;
            --prefix=*) prefix=${1#*=}; shift ;;
            --libdir) libdir=$2; shift 2 ;;
            --libdir=*) libdir=${1#*=}; shift ;;
            --includedir) includedir=$2; shift 2 ;;
            --includedir=*) includedir=${1#*=}; shift ;;
            --bindir) bindir=$2; shift 2 ;;
            --bindir=*) bindir=${1#*=}; shift ;;
            --destdir) destdir=$2; shift 2 ;;
            --destdir=*) destdir=${1#*=}; shift ;;
            *) echo "install: unknown option $1" >&2; exit 2 ;;
        esac
    done
    prefix=$(realpath -m "$prefix")
    libdir=${libdir:-$prefix/lib}
    includedir=${includedir:-$prefix/include}
    bindir=${bindir:-$prefix/bin}
    local D=$destdir
    build
    log "installing into ${D}${prefix}"
    install_lib gdrapi "$GDRAPI_VERSION" "$GDRAPI_MAJOR" "$D$libdir"
    install -D -m 0644 include/gdrapi.h "$D$includedir/gdrapi.h"
    install -D -m 0644 include/gdrconfig.h "$D$includedir/gdrconfig.h"
    mkdir -p "$D$libdir/pkgconfig"
    fill_pc pkgconfig/gdrapi.pc.in "$D$libdir/pkgconfig/gdrapi.pc" "$GDRAPI_VERSION"

    if [ -n "$GDSYNC_VERSION" ] && [ -f "$rel/libgdsync.so" ]; then
        # libtool's -version-info (major+minor):0:minor gives libgdsync.so.MAJOR.MINOR.0.
        install_lib gdsync "$GDSYNC_VERSION.0" "${GDSYNC_VERSION%%.*}" "$D$libdir"
        install -D -m 0644 include/gdsync.h "$D$includedir/gdsync.h"
        # gdsync/*.h, plus gdsync/compat/infiniband/*.h (MOFED-named headers; see gdsync.pc's Cflags).
        (cd include && find gdsync -type f -name '*.h' -o -type f -name '*.cuh') |
            while read -r f; do install -D -m 0644 "include/$f" "$D$includedir/$f"; done
        if [ -f pkgconfig/gdsync.pc.in ]; then
            fill_pc pkgconfig/gdsync.pc.in "$D$libdir/pkgconfig/gdsync.pc" "$GDSYNC_VERSION"
        fi
    fi

    if [ -f "$rel/libnvm.so" ]; then
        # libnvm keeps upstream's unversioned soname libnvm.so (docs/storage.md); its version
        # lives in libnvm/Cargo.toml.
        install -D -m 0755 "$rel/libnvm.so" "$D$libdir/libnvm.so"
        install -m 0644 "$rel/libnvm.a" "$D$libdir/libnvm.a"
        install -d "$D$includedir"
        install -m 0644 include/nvm_*.h "$D$includedir/"
        fill_pc pkgconfig/nvm.pc.in "$D$libdir/pkgconfig/nvm.pc" \
            "$(sed -n 's/^version = "\(.*\)"/\1/p' libnvm/Cargo.toml | head -n1)"
    fi

    if [ -f tools/gdrcopy/Makefile ]; then
        make -C tools/gdrcopy install DESTDIR="$D" bindir="$bindir"
    fi
    if [ -f tools/nvm/Makefile ] && [ -f "$rel/libnvm.so" ]; then
        make -C tools/nvm install DESTDIR="$D" bindir="$bindir" NVM_CFLAGS="-I$top/include" NVM_LIBS="-L$rel -lnvm"
    fi
    # The diagnostic tool (a workspace binary, tools/gdrcopy_diag).
    if [ -f "$rel/gdrcopy_diag" ]; then
        install -D -m 0755 "$rel/gdrcopy_diag" "$D$bindir/gdrcopy_diag"
    fi

    # Kernel module sources in DKMS layout (/usr/src/gdrdrv-VERSION for prefix /usr).
    if [ -d kmod/gdrdrv ]; then
        local src="$D$prefix/src/gdrdrv-$GDRAPI_VERSION"
        rm -rf "$src"
        mkdir -p "$src"
        # Sources only (no build outputs): C, headers, Kbuild/Makefiles, dkms.conf, scripts.
        (cd kmod/gdrdrv && find . -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild -o -name Makefile \
            -o -name dkms.conf -o -name '*.sh' -o -name gdrdrv-load \) ! -name '*.mod.c' -print0) |
            while IFS= read -r -d '' f; do install -D -m 0644 "kmod/gdrdrv/$f" "$src/$f"; done
        # Our nv-p2p.h, used when no NVIDIA source tree is given (NVIDIA_SRC_DIR).
        install -D -m 0644 kmod/nv-p2p/nv-p2p.h "$src/nv-p2p/nv-p2p.h"
        find "$src" -name '*.sh' -exec chmod 0755 {} +
        if [ -f "$src/gdrdrv-load" ]; then chmod 0755 "$src/gdrdrv-load"; fi
    fi
    log "installed: libraries in $libdir, headers in $includedir, tools in $bindir"
}

deps() {
    scripts/install-deps "$@"
}

check() {
    local want_deps=1 args=()
    for a in "$@"; do
        case "$a" in
            --no-deps) want_deps=0 ;;
            --no-vm | fast | abi | fuzz | bench | packages | vm) args+=("$a") ;;
            *) echo "check: unknown option or tier $a (fast abi fuzz bench packages vm; --no-vm --no-deps)" >&2; exit 2 ;;
        esac
    done
    [ "$want_deps" = 1 ] && deps
    scripts/run-tests "${args[@]}"
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case "$cmd" in
    build) build ;;
    install) install_all "$@" ;;
    check) check "$@" ;;
    deps) deps "$@" ;;
    -h|--help|help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) echo "unknown command $cmd (build|install|check|deps)" >&2; exit 2 ;;
esac
