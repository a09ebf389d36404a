#!/bin/bash
# libnvm C-ABI checks, run as a consumer would see the library:
#   1. every installed nvm_*.h compiles on its own as C (gnu99, c11) and C++ (c++11) with
#      -Wall -Wextra -Werror, and a consumer's own __host__/__device__ survive the headers;
#   2. sizeof/alignof/offsetof of every public struct, constants and the header-only helpers
#      against the spec (layout.c), as C and as C++;
#   3. the exported dynamic symbol set equals symbols.expected, soname libnvm.so;
#   4. consumer.c, a libnvm-style program (identify, read-blocks), built against a staged
#      install with only `pkg-config --cflags --libs nvm`, runs against the software controller
#      of sim/nvmesim (libnvmesim.so), plus the same under ASan/UBSan.
# Exits non-zero on any failure. Set NO_BUILD=1 to reuse target/release as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"
out=$top/target/libnvm-ct
rm -rf "$out"
mkdir -p "$out"
fail=0
step() { printf '== %s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

if [ -z "${NO_BUILD:-}" ]; then
    step "cargo build --release (nvm, nvmesim)"
    cargo build -q --release -p nvm -p nvmesim
fi
rel=$top/target/release

# A staged install with the layout ./build.sh install gives (library, headers, nvm.pc).
prefix=$out/prefix
version=$(sed -n 's/^version = "\(.*\)"/\1/p' libnvm/Cargo.toml | head -n1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$rel/libnvm.so" "$prefix/lib/libnvm.so"
install -m 0644 "$rel/libnvm.a" "$prefix/lib/libnvm.a"
install -m 0644 include/nvm_*.h "$prefix/include/"
sed -e "s|@prefix@|$prefix|g" -e "s|@libdir@|$prefix/lib|g" -e "s|@includedir@|$prefix/include|g" \
    -e "s|@VERSION@|$version|g" pkgconfig/nvm.pc.in > "$prefix/lib/pkgconfig/nvm.pc"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
read -r -a PC <<< "$(pkg-config --cflags --libs nvm)"
[ "$(pkg-config --modversion nvm)" = "$version" ] || bad "nvm.pc version $(pkg-config --modversion nvm) != $version"
INC=(-I"$prefix/include")

step "headers compile alone (C and C++)"
n=0
for h in "$prefix"/include/nvm_*.h; do
    name=$(basename "$h")
    printf '#include <%s>\n' "$name" > "$out/hdr.c"
    for std in gnu99 c11; do
        # nvm_pq.h (ours, not upstream's) waits with POSIX clocks on the host: strict C11 needs
        # the POSIX feature macro, which the header asks for by name when it is missing.
        posix=()
        if [ "$name" = nvm_pq.h ] && [ "$std" = c11 ]; then
            posix=(-D_POSIX_C_SOURCE=200809L)
            msg=$(gcc -x c -std=c11 "${INC[@]}" -c "$out/hdr.c" -o /dev/null 2>&1) && msg=
            grep -q 'needs POSIX clocks' <<<"$msg" ||
                bad "nvm_pq.h under strict C11 without _POSIX_C_SOURCE does not ask for it"
        fi
        gcc -x c -std=$std "${posix[@]}" -Wall -Wextra -Werror "${INC[@]}" -c "$out/hdr.c" -o /dev/null 2> "$out/hdr.err" ||
            { bad "$name as C ($std)"; cat "$out/hdr.err"; }
        n=$((n + 1))
    done
    g++ -x c++ -std=c++11 -Wall -Wextra -Werror "${INC[@]}" -c "$out/hdr.c" -o /dev/null 2> "$out/hdr.err" ||
        { bad "$name as C++"; cat "$out/hdr.err"; }
    n=$((n + 1))
done
cat > "$out/hygiene.c" <<'C'
#define __host__ __attribute__((used))
#define __device__ __attribute__((unused))
#include <nvm_cmd.h>
#include <nvm_queue.h>
#define STR2(x) #x
#define STR(x) STR2(x)
_Static_assert(sizeof(STR(__host__)) == sizeof("__attribute__((used))"), "consumer's __host__ kept");
_Static_assert(sizeof(STR(__device__)) == sizeof("__attribute__((unused))"), "consumer's __device__ kept");
#ifdef __align__
#error "__align__ leaked from nvm_types.h"
#endif
int main(void) { return 0; }
C
gcc -std=gnu11 -Wall -Wextra -Werror "${INC[@]}" "$out/hygiene.c" -o /dev/null 2> "$out/hdr.err" ||
    { bad "macro hygiene"; cat "$out/hdr.err"; }
echo "   $n header compilations"

step "layouts, constants and header-only helpers (layout.c)"
gcc -std=gnu11 -Wall -Wextra -Werror "${INC[@]}" "$here/layout.c" -o "$out/layout_c" && "$out/layout_c" || bad "layout.c as C"
g++ -x c++ -std=c++11 -Wall -Wextra -Werror "${INC[@]}" "$here/layout.c" -o "$out/layout_cxx" && "$out/layout_cxx" ||
    bad "layout.c as C++"

step "exported symbols and soname"
nm -D --defined-only "$prefix/lib/libnvm.so" | awk '$2 == "T" { print $3 }' | sort > "$out/symbols.actual"
diff -u "$here/symbols.expected" "$out/symbols.actual" || bad "exported symbol set differs"
soname=$(readelf -d "$prefix/lib/libnvm.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libnvm.so ] || bad "soname is '$soname'"
echo "   $(wc -l < "$out/symbols.actual") symbols, soname $soname"

step "consumer.c against nvmesim (pkg-config, -Werror, C and C++)"
SIM=(-L"$rel" -lnvmesim -Wl,-rpath,"$rel")
export LD_LIBRARY_PATH=$prefix/lib:$rel
gcc -std=gnu11 -O2 -Wall -Wextra -Werror "$here/consumer.c" "${PC[@]}" "${SIM[@]}" -o "$out/consumer" &&
    "$out/consumer" > "$out/consumer.out" || { bad "consumer.c (C)"; cat "$out/consumer.out"; }
grep -q '^Serial Number           : nvmesim0001' "$out/consumer.out" || bad "consumer output lacks the serial"
g++ -x c++ -std=c++11 -O2 -Wall -Wextra -Werror "$here/consumer.c" "${PC[@]}" "${SIM[@]}" -o "$out/consumer_cxx" &&
    "$out/consumer_cxx" > /dev/null || bad "consumer.c (C++)"
step "consumer.c under ASan/UBSan"
if gcc -std=gnu11 -g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -Wall -Wextra -Werror \
        "$here/consumer.c" "${PC[@]}" "${SIM[@]}" -o "$out/consumer_asan" 2> "$out/asan.err"; then
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 "$out/consumer_asan" > /dev/null || bad "consumer under ASan/UBSan"
else
    echo "SKIP: the compiler cannot build with -fsanitize=address,undefined here"; cat "$out/asan.err"
fi

if [ "$fail" = 0 ]; then echo "libnvm compat tests: PASS"; else echo "libnvm compat tests: FAIL"; fi
exit "$fail"
