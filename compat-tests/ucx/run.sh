#!/usr/bin/env bash
# UCX as a real consumer of our libgdrapi: UCX's own gdr_copy transport (built from Debian's
# source by build-ucx.sh) moves data through our library, and uct_gdr_check.c checks every byte
# through the CUDA driver. UCX runs in its default configuration: every UCX_* variable of the
# caller's environment is removed (its CUDA memory hooks patch cudasim's exports, as they patch
# libcuda's).
#
#   compat-tests/ucx/run.sh [--mode host|gpusim] [--negative-only] [--prebuilt DIR] [--stage DIR]
#                           [--gdr-prefix DIR] [--cudasim FILE]
#
# --mode host (default): cudasim in host memory with dma-buf exports (CUDA 13.3 reported), so
#     libgdrapi runs its dma-buf backend; the negative case turns the exports off.
# --mode gpusim: the VM, with whatever backend the caller set up (gdrdrv, or gpusim dma-bufs with
#     GDRCOPY_USE_DMABUF_MMAP=1); environment passed through apart from UCX_*.
# --negative-only: only the "gdr_open fails" checks (the caller made gdr_open fail).
# --stage DIR: build the test programs into DIR and stop (the VM hook, vm-build.sh).
# --prebuilt DIR: run the programs staged in DIR instead of building (the VM suite).
# --gdr-prefix DIR: our library already installed there (else build-ucx.sh installs it).
# --cudasim FILE: the libcuda.so (cudasim) a UCX build links against (build-ucx.sh's option).
# Prints "ok - ..." / "not ok - ..." and "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
mode=host negative_only=0 prebuilt="" stage="" gdr_prefix_opt=()
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) mode=$2; shift 2 ;;
        --negative-only) negative_only=1; shift ;;
        --prebuilt) prebuilt=$2; shift 2 ;;
        --stage) stage=$2; shift 2 ;;
        --gdr-prefix) gdr_prefix_opt+=(--gdr-prefix "$2"); shift 2 ;;
        --cudasim) gdr_prefix_opt+=(--cudasim "$2"); shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$mode" in host|gpusim) ;; *) echo "run.sh: --mode host|gpusim" >&2; exit 2 ;; esac

# --- build: UCX (cached), then our programs -------------------------------------------------
if [ -z "$prebuilt" ]; then
    envfile=$("$here/build-ucx.sh" "${gdr_prefix_opt[@]}") || { echo "not ok - build UCX (build-ucx.sh)"; exit 1; }
    dir=${stage:-$(mktemp -d "${TMPDIR:-/tmp}/ucx-compat.XXXXXX")}
    [ -n "$stage" ] || trap 'rm -rf "$dir"' EXIT
    mkdir -p "$dir"
    # shellcheck disable=SC1090
    . "$envfile"
    cp "$envfile" "$dir/env"
    CC=${CC:-gcc}
    set -e
    $CC -std=gnu11 -O2 -g -Wall -Wextra -Werror -I"$UCX_PREFIX/include" -I"$CUDA_INC" \
        -o "$dir/uct_gdr_check" "$here/uct_gdr_check.c" \
        -L"$UCX_PREFIX/lib" -luct -lucs -L"$UCX_TEST_LIBS" -l:libcuda.so.1
    # -rdynamic: the probe's own gdr_copy_{to,from}_mapping (counters) must be visible to UCX.
    $CC -std=gnu11 -O2 -g -Wall -Wextra -Werror -rdynamic -I"$UCX_PREFIX/include" -I"$CUDA_INC" \
        -I"$GDR_PREFIX/include" -o "$dir/ucp_gdr_probe" "$here/ucp_gdr_probe.c" \
        -L"$UCX_PREFIX/lib" -lucp -lucs -L"$UCX_TEST_LIBS" -l:libcuda.so.1 -ldl
    $CC -shared -fPIC -O2 -Wall -Wextra -Werror -I"$CUDA_INC" \
        -Wl,--version-script="$here/cudart-stub/cudart_stub.map" -Wl,-soname,libcudart.so.13 \
        -o "$dir/libcudart.so.13" "$here/cudart-stub/cudart_stub.c" -L"$UCX_TEST_LIBS" -l:libcuda.so.1
    $CC -shared -fPIC -O2 -Wall -Wextra -Werror -I"$GDR_PREFIX/include" \
        -o "$dir/drop_byte_shim.so" "$here/drop_byte_shim.c" -ldl
    set +e
    if [ -n "$stage" ]; then echo "staged in $dir"; exit 0; fi
else
    dir=$prebuilt
    # shellcheck disable=SC1091
    . "$dir/env" || { echo "not ok - no $dir/env (compat-tests/ucx/vm-build.sh)"; exit 1; }
fi

passed=0 failed=0
ok() { passed=$((passed + 1)); printf 'ok - %s\n' "$1"; }
not_ok() { failed=$((failed + 1)); printf 'not ok - %s\n' "$1"; }
log=$(mktemp)
trap 'rm -f "$log"; [ -z "$stage$prebuilt" ] && rm -rf "$dir"' EXIT

# The loader path: our library first (GDR_PREFIX, or STAGE_LIB in the VM), the cudart stub in
# place of the wheel's libcudart, UCX, then the NVML stub and cudasim.
gdr_lib=${STAGE_LIB:-$GDR_PREFIX/lib}
[ "$mode" = gpusim ] || gdr_lib=$GDR_PREFIX/lib
ldpath="$gdr_lib:$dir:$UCX_PREFIX/lib:$UCX_TEST_LIBS"
ucx_vars=$(env | sed -n 's/^\(UCX_[A-Za-z0-9_]*\)=.*/-u \1/p')
# ucx [VAR=value...] -- CMD...: CMD with UCX's defaults and the backend's variables.
ucx() {
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    # shellcheck disable=SC2086
    env $ucx_vars -u GDRCOPY_ENABLE_LOGGING LD_LIBRARY_PATH="$ldpath" "${backend[@]}" "${vars[@]}" \
        timeout 300 "$@"
}
if [ "$mode" = host ]; then
    backend=(CUDASIM_BACKEND=host CUDASIM_DMABUF=1 CUDASIM_DRIVER_VERSION=13030 GDRCOPY_USE_DMABUF_MMAP=1)
    no_gdr=(CUDASIM_DMABUF=0)
    [ -e /dev/gdrdrv ] && no_gdr+=(GDRCOPY_USE_DMABUF_MMAP=1)
else
    backend=()
    no_gdr=()
fi

info_lists_gdr() { grep -qE '^#[[:space:]]+Transport: gdr_copy$' "$log"; }

if [ "$negative_only" = 0 ]; then
    if ucx -- "$UCX_PREFIX/bin/ucx_info" -v >"$log" 2>&1; then
        ok "ucx_info -v: $(grep -m1 -oE 'Version [0-9.]+' "$log")"
    else not_ok "ucx_info -v"; sed 's/^/    | /' "$log" | tail -n 20; fi
    if ucx -- "$UCX_PREFIX/bin/ucx_info" -d >"$log" 2>&1 && info_lists_gdr; then
        ok "ucx_info -d lists the gdr_copy transport"
    else not_ok "ucx_info -d lists the gdr_copy transport"; sed 's/^/    | /' "$log" | tail -n 40; fi
    if grep -qE 'UCX +(ERROR|WARN)' "$log"; then
        not_ok "ucx_info -d: no UCX error or warning"; grep -E 'UCX +(ERROR|WARN)' "$log" | head -n 10
    else ok "ucx_info -d: no UCX error or warning"; fi

    if ucx -- "$dir/uct_gdr_check" >"$log" 2>&1 && grep -q '^uct_gdr_check: OK' "$log" &&
        ! grep -qE 'UCX +(ERROR|WARN)' "$log"; then
        ok "$(grep '^uct_gdr_check: OK' "$log")"
    else not_ok "uct_gdr_check (every byte of put/get through gdr_copy)"; sed 's/^/    | /' "$log" | tail -n 40; fi

    # UCP (what MPI uses) over the same stack: tag messages GPU->host and host->GPU must arrive
    # intact. Which transport copies them is UCX's choice (docs/consumers.md): reported, not judged.
    if ucx -- "$dir/ucp_gdr_probe" >"$log" 2>&1 && ! grep -qE 'UCX +(ERROR|WARN)' "$log"; then
        ok "UCP tag messages 1..4096 B between GPU and host memory arrive intact"
        sed -n 's/^ucp_gdr_probe: \([0-9] of 8 sizes.*\)/# UCP: \1/p' "$log"
    else not_ok "UCP tag messages between GPU and host memory"; sed 's/^/    | /' "$log" | tail -n 30; fi

    # The check must be able to fail: a gdr_copy_to_mapping that drops the last byte.
    ucx LD_PRELOAD="$dir/drop_byte_shim.so" -- "$dir/uct_gdr_check" --iters 20 >"$log" 2>&1
    rc=$?
    if [ "$rc" = 1 ] && grep -qE '^uct_gdr_check: put: byte [0-9]+ is ' "$log"; then
        ok "a copy that drops a byte fails the check ($(grep -m1 'put: byte' "$log" | cut -c16-))"
    else not_ok "a copy that drops a byte fails the check (exit $rc)"; sed 's/^/    | /' "$log" | tail -n 20; fi
fi

# Where gdr_open fails, UCX offers no gdr_copy (and says nothing louder than debug about it).
if [ "$mode" = host ] || [ "$negative_only" = 1 ]; then
    if ucx "${no_gdr[@]}" -- "$UCX_PREFIX/bin/ucx_info" -d >"$log" 2>&1 && ! info_lists_gdr &&
        grep -qE '^#[[:space:]]+Transport: cuda_copy$' "$log"; then
        ok "gdr_open failing: ucx_info -d lists cuda_copy but not gdr_copy"
    else not_ok "gdr_open failing: ucx_info -d lists cuda_copy but not gdr_copy"; sed 's/^/    | /' "$log" | tail -n 40; fi
    if ucx "${no_gdr[@]}" -- "$dir/uct_gdr_check" --expect-no-gdr >"$log" 2>&1; then
        ok "gdr_open failing: $(tail -n1 "$log")"
    else not_ok "gdr_open failing: uct_gdr_check --expect-no-gdr"; sed 's/^/    | /' "$log" | tail -n 20; fi
fi

echo "ucx compat ($mode): $passed passed, $failed failed"
[ "$failed" = 0 ]
