#!/usr/bin/env bash
# C-side compatibility tests of libgdrapi: headers, ABI layout, exported symbol set, and a consumer
# program built the ways NCCL (dlopen) and UCX (-lgdrapi) use the library, plus a static link.
#
#   compat-tests/gdrapi/run.sh                  against the build tree (cargo build -p gdrapi,
#                                               include/, target/release)
#   compat-tests/gdrapi/run.sh --prefix DIR     against an installed prefix, through
#                                               PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config gdrapi
#   compat-tests/gdrapi/run.sh --libdir DIR     against libgdrapi.so/.a already in DIR (no cargo;
#                                               used inside the VM), headers from include/
# Options: --keep (keep the work directory), --work DIR, --no-sanitizers, --no-valgrind,
#          --build-only (build the consumer programs into the work directory, check and run
#          nothing: the VM's build hook, whose guest runs them).
# Env: CC (gcc), CXX (g++).  Exits non-zero if any check fails; prints "N passed, N failed".
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
CC=${CC:-gcc}
CXX=${CXX:-g++}
prefix="" libdir_opt="" keep=0 work="" sanitizers=1 valgrind=1 build_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#*=}; shift ;;
        --libdir) libdir_opt=$2; shift 2 ;;
        --libdir=*) libdir_opt=${1#*=}; shift ;;
        --work) work=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-sanitizers) sanitizers=0; shift ;;
        --no-valgrind) valgrind=0; shift ;;
        --build-only) build_only=1; valgrind=0; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

if [ -z "$work" ]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/gdrapi-compat.XXXXXX")
    [ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

passed=0 failed=0 failures=()
ok() { passed=$((passed + 1)); printf 'ok - %s\n' "$1"; }
not_ok() { failed=$((failed + 1)); failures+=("$1"); printf 'not ok - %s\n' "$1"; }
# step NAME CMD...: runs CMD with its output in $work/log/NAME.log; shows the log on failure.
mkdir -p "$work/log"
step() {
    local name=$1; shift
    [ "$build_only" = 0 ] || [[ $name == "build consumer"* ]] || return 0
    local log="$work/log/$(printf '%s' "$name" | tr -c 'A-Za-z0-9._-' '_').log"
    if "$@" >"$log" 2>&1; then ok "$name"; else
        not_ok "$name"; sed 's/^/    | /' "$log" | tail -n 60
    fi
}

# ---------------------------------------------------------------------------------------------
# Where the library and headers come from.
# ---------------------------------------------------------------------------------------------
static_private="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
pc_private=$(sed -n 's/^Libs.private:[[:space:]]*//p' "$top/pkgconfig/gdrapi.pc.in" 2>/dev/null)
[ -n "$pc_private" ] && static_private=$pc_private
if [ -n "$prefix" ]; then
    mode="prefix $prefix"
    prefix=$(realpath -m "$prefix")
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib64/pkgconfig:$prefix/share/pkgconfig"
    if ! pkg-config --exists gdrapi; then
        echo "pkg-config cannot find gdrapi under $prefix (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)" >&2
        exit 1
    fi
    CFLAGS_GDR=$(pkg-config --cflags gdrapi)
    LIBS_GDR=$(pkg-config --libs gdrapi)
    libdir=$(pkg-config --variable=libdir gdrapi)
    incdir=$(pkg-config --variable=includedir gdrapi)
    static_private=$(pkg-config --libs-only-other --libs-only-l --static gdrapi | sed 's/-lgdrapi//')
    runpath=$libdir
else
    if [ -n "$libdir_opt" ]; then
        mode="libdir $libdir_opt"
        libdir=$(realpath "$libdir_opt")
    else
        mode="build tree"
        export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$top/target}
        (cd "$top" && cargo build --release -p gdrapi) || { echo "cargo build failed" >&2; exit 1; }
        libdir=$CARGO_TARGET_DIR/release
    fi
    incdir=$top/include
    # The build tree has only libgdrapi.so (soname libgdrapi.so.2): stage the names consumers use.
    mkdir -p "$work/lib"
    real=$(realpath "$libdir/libgdrapi.so")
    ln -sf "$real" "$work/lib/libgdrapi.so.2"
    ln -sf "$real" "$work/lib/libgdrapi.so"
    [ -f "$libdir/libgdrapi.a" ] && ln -sf "$(realpath "$libdir/libgdrapi.a")" "$work/lib/libgdrapi.a"
    CFLAGS_GDR="-I$incdir"
    LIBS_GDR="-L$work/lib -lgdrapi"
    runpath=$work/lib
fi
so=$(realpath "$libdir/libgdrapi.so")
archive=$libdir/libgdrapi.a
echo "# libgdrapi compat tests against the $mode"
echo "# library: $so"
echo "# headers: $incdir"
echo "# work:    $work"

WARN="-Wall -Wextra -Werror -pedantic"
CWARN="$WARN -Wstrict-prototypes -Wmissing-prototypes -Wundef -Wshadow"
CXXWARN="$WARN -Wundef -Wshadow"
GPUSIM_FLAGS=""
if [ -f "$top/kmod/gpusim/gpusim_uapi.h" ]; then
    GPUSIM_FLAGS="-DHAVE_GPUSIM -I$top/kmod/gpusim"
fi
run_env=(env -u GDRCOPY_ENABLE_LOGGING -u GDRCOPY_LOG_LEVEL -u GDRCOPY_USE_DMABUF_MMAP
         LD_LIBRARY_PATH="$runpath")
# What gdr_open must do here: fail without /dev/gdrdrv (unless a libcuda could give dma-buf).
if [ -e /dev/gdrdrv ]; then expect_open=ok
elif ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then expect_open=any
else expect_open=fail; fi
echo "# gdr_open is expected to: $expect_open"

# ---------------------------------------------------------------------------------------------
# 1. Every installed header compiles alone (and twice: include guards) as C and C++.
# ---------------------------------------------------------------------------------------------
headers=(gdrapi.h gdrconfig.h)
for h in "${headers[@]}"; do
    [ -f "$incdir/$h" ] || { not_ok "header $h installed"; continue; }
    # Twice (include guard / pragma once), plus a declaration: ISO C forbids an empty unit.
    printf '#include <%s>\n#include <%s>\ntypedef int header_alone_check;\n' "$h" "$h" > "$work/hdr_$h.c"
    cp "$work/hdr_$h.c" "$work/hdr_$h.cpp"
    for std in c99 c11; do
        step "$h alone as C ($std)" $CC -std=$std $CWARN $CFLAGS_GDR -c "$work/hdr_$h.c" -o "$work/hdr.o"
    done
    for std in c++11 c++17; do
        step "$h alone as C++ ($std)" $CXX -std=$std $CXXWARN $CFLAGS_GDR -c "$work/hdr_$h.cpp" -o "$work/hdr.o"
    done
done
if command -v clang >/dev/null; then
    step "gdrapi.h alone with clang (c11)" clang -std=c11 $CWARN $CFLAGS_GDR -c "$work/hdr_gdrapi.h.c" -o "$work/hdr.o"
fi

# The header declares exactly the exported functions (gdr_get_info is only the v2 alias there).
header_functions() {
    $CC -E -P $CFLAGS_GDR -x c "$incdir/gdrapi.h" | grep -oE '\bgdr_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u
}
step "gdrapi.h declares the 16 functions of symbols.txt (gdr_get_info is the v2 macro)" \
    diff <(grep -vx gdr_get_info "$here/symbols.txt" | sort) <(header_functions)

# ---------------------------------------------------------------------------------------------
# 2. ABI: sizes, offsets, bit-fields, enum and macro values, prototypes (C and C++).
# ---------------------------------------------------------------------------------------------
abi_build_run() { # lang std
    local lang=$1 std=$2 exe="$work/abi_$2"
    if [ "$lang" = c ]; then
        $CC -std="$std" $CWARN $CFLAGS_GDR "$here/abi_check.c" -o "$exe" $LIBS_GDR || return 1
    else
        $CXX -std="$std" $CXXWARN $CFLAGS_GDR -x c++ "$here/abi_check.c" -o "$exe" $LIBS_GDR || return 1
    fi
    "${run_env[@]}" "$exe"
}
step "ABI check as C99" abi_build_run c c99
step "ABI check as C11" abi_build_run c c11
step "ABI check as C++11 (links: extern \"C\" names)" abi_build_run cxx c++11
step "ABI check as C++17" abi_build_run cxx c++17

# ---------------------------------------------------------------------------------------------
# 3. The shared object: symbol set, soname, dependencies, no symbol versions.
# ---------------------------------------------------------------------------------------------
check_symbols() {
    local got
    got=$(nm -D --defined-only "$so" | awk '{print $NF}' | sort)
    echo "exported: $(echo "$got" | tr '\n' ' ')"
    diff <(sort "$here/symbols.txt") <(echo "$got")
}
check_no_versions() {
    if nm -D --defined-only --with-symbol-versions "$so" | grep '@'; then
        echo "defined symbols carry versions"; return 1; fi
    if readelf -V "$so" | grep -q "Version definition"; then
        echo "library defines symbol versions (.gnu.version_d)"; return 1; fi
}
check_soname() {
    local soname
    soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    echo "SONAME: $soname"
    [ "$soname" = libgdrapi.so.2 ]
}
check_needed() {
    local needed
    needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    echo "NEEDED: $(echo "$needed" | tr '\n' ' ')"
    if echo "$needed" | grep -qi cuda; then echo "links libcuda"; return 1; fi
    if readelf -d "$so" | grep -qE '\((RPATH|RUNPATH)\)'; then echo "has an RPATH/RUNPATH"; return 1; fi
    if nm -D --undefined-only "$so" | awk '{print $NF}' | grep -E '^cu[A-Z]'; then
        echo "imports CUDA symbols"; return 1; fi
}
check_defs() {
    # Upstream links with -z defs; every undefined symbol must resolve in the NEEDED libraries.
    local out
    out=$(LD_LIBRARY_PATH="$runpath" ldd -r "$so" 2>&1)
    echo "$out"
    ! echo "$out" | grep -q 'undefined symbol'
}
check_archive() {
    [ -f "$archive" ] || { echo "no $archive"; return 1; }
    diff <(sort "$here/symbols.txt") \
        <(nm -g --defined-only "$archive" 2>/dev/null | awk '$2 == "T" && $3 ~ /^gdr_/ {print $3}' | sort -u) ||
        return 1
    # Besides the API, only Rust-mangled names and the toolchain's runtime (compiler builtins,
    # all "__"-prefixed) may be global: nothing a C program's own names could collide with.
    local extra
    extra=$(nm -g --defined-only "$archive" 2>/dev/null | awk 'NF == 3 {print $3}' |
        grep -vE '^(gdr_|_ZN|_R|anon\.|__|DW\.ref\.rust_eh_personality$)' | sort -u)
    if [ -n "$extra" ]; then echo "unexpected global symbols in libgdrapi.a:"; echo "$extra"; return 1; fi
}
check_links() {
    # An installed prefix carries the soname chain libgdrapi.so -> .so.2 -> .so.2.<minor>.
    [ -n "$prefix" ] || { echo "build tree: no install links to check"; return 0; }
    local l1 l2
    l1=$(readlink "$libdir/libgdrapi.so") && l2=$(readlink "$libdir/libgdrapi.so.2") || return 1
    echo "libgdrapi.so -> $l1; libgdrapi.so.2 -> $l2"
    [ "$(basename "$l1")" = libgdrapi.so.2 ] && [[ "$(basename "$l2")" =~ ^libgdrapi\.so\.2\.[0-9]+$ ]] &&
        [ -f "$libdir/$(basename "$l2")" ] && [ ! -L "$libdir/$(basename "$l2")" ]
}
step "exported dynamic symbols are exactly the 17 of spec §1.4" check_symbols
step "no ELF symbol versions on our symbols" check_no_versions
step "SONAME is libgdrapi.so.2" check_soname
step "DT_NEEDED has no libcuda, no RPATH, no CUDA imports" check_needed
step "no undefined symbols (ldd -r)" check_defs
step "libgdrapi.a defines the 17 functions and no other C-visible names" check_archive
step "installed soname links" check_links

# ---------------------------------------------------------------------------------------------
# 4. The consumer program: NCCL-style dlopen, UCX-style -lgdrapi, static; sanitizers; valgrind.
# ---------------------------------------------------------------------------------------------
build_consumer() { # name extra-flags... (compile + link)
    local name=$1; shift
    $CC -std=c11 $CWARN -g $CFLAGS_GDR $GPUSIM_FLAGS "$here/consumer.c" -o "$work/$name" "$@"
}
run_consumer() { # exe [env...]: once silent, once with logging (stderr must explain the failure)
    local exe=$1; shift
    echo "--- without GDRCOPY_ENABLE_LOGGING"
    "${run_env[@]}" EXPECT_OPEN=$expect_open "$@" "$exe" || return 1
    echo "--- with GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=2"
    "${run_env[@]}" EXPECT_OPEN=$expect_open GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=2 "$@" "$exe" || return 1
    # Upstream enables logging when the variable merely exists; the default level is errors only.
    echo "--- with GDRCOPY_ENABLE_LOGGING=0 (still on), default level"
    "${run_env[@]}" EXPECT_OPEN=$expect_open GDRCOPY_ENABLE_LOGGING=0 "$@" "$exe" >/dev/null || return 1
    echo "--- with GDRCOPY_ENABLE_LOGGING= GDRCOPY_LOG_LEVEL=debug (non-numeric: everything)"
    "${run_env[@]}" EXPECT_OPEN=$expect_open GDRCOPY_ENABLE_LOGGING= GDRCOPY_LOG_LEVEL=debug "$@" "$exe" >/dev/null || return 1
}
step "build consumer (dlopen, NCCL style)" build_consumer consumer_dlopen -DCONSUMER_DLOPEN -ldl
step "run consumer (dlopen, NCCL style)" run_consumer "$work/consumer_dlopen" EXPECT_LIB="$so"
step "build consumer (-lgdrapi, UCX style)" build_consumer consumer_linked $LIBS_GDR
step "run consumer (-lgdrapi, UCX style)" run_consumer "$work/consumer_linked"
check_linked_needed() {
    readelf -d "$work/consumer_linked" | grep -q 'NEEDED.*\[libgdrapi\.so\.2\]'
}
step "linked consumer records NEEDED libgdrapi.so.2" check_linked_needed
if [ -f "$archive" ]; then
    # shellcheck disable=SC2086
    step "build consumer (static libgdrapi.a + $static_private)" \
        build_consumer consumer_static "$archive" $static_private
    step "run consumer (static)" run_consumer "$work/consumer_static"
    check_static_no_so() { ! readelf -d "$work/consumer_static" | grep -q 'libgdrapi'; }
    step "static consumer does not need libgdrapi.so" check_static_no_so
else
    not_ok "libgdrapi.a present for the static link"
fi

if [ "$sanitizers" = 1 ]; then
    san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:exitcode=24}
    # shellcheck disable=SC2086
    step "build consumer under ASan/UBSan (dlopen)" build_consumer consumer_dlopen_asan -DCONSUMER_DLOPEN $san -ldl
    step "run consumer under ASan/UBSan (dlopen)" run_consumer "$work/consumer_dlopen_asan" EXPECT_LIB="$so"
    # shellcheck disable=SC2086
    step "build consumer under ASan/UBSan (-lgdrapi)" build_consumer consumer_linked_asan $san $LIBS_GDR
    step "run consumer under ASan/UBSan (-lgdrapi)" run_consumer "$work/consumer_linked_asan"
fi

if [ "$valgrind" = 1 ]; then
    if command -v valgrind >/dev/null; then
        step "consumer under valgrind (-lgdrapi)" run_consumer \
            "$work/consumer_linked" valgrind -q --error-exitcode=1 --track-fds=no
    else
        echo "# SKIP valgrind: not installed"
    fi
fi

echo
printf '%d passed, %d failed\n' "$passed" "$failed"
for f in "${failures[@]}"; do printf '  FAILED: %s\n' "$f"; done
[ "$failed" -eq 0 ]
