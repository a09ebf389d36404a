#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# Writes nv.symvers next to this script: the nvidia_p2p_* lines of a Module.symvers
# ("0x<crc>\t<symbol>\t<module>\t<EXPORT_SYMBOL[_GPL]>\t"), which nv_peer_mem.ko must be linked
# against (KBUILD_EXTRA_SYMBOLS) so that modversions match the module that really exports them.
#
#   create_nv.symvers.sh [KVER]                 from the installed NVIDIA module for KVER
#                                               (default: the running kernel), as upstream's does
#   create_nv.symvers.sh --ko MODULE.ko[.xz|.zst|.gz] [KVER]
#                                               from that module file (e.g. kmod/gpusim/gpusim.ko
#                                               where no NVIDIA driver exists)
#   create_nv.symvers.sh --from Module.symvers  the nvidia_p2p_* lines of a build's Module.symvers
#                                               (the NVIDIA driver's, or kmod/gpusim's)
#
# The CRC of an exported symbol is the 32-bit word at __crc_<symbol> in the module's __kcrctab or
# __kcrctab_gpl section (kernels >= 5.19 keep it there, not in the symbol's value); absolute
# __crc_ symbols of older kernels carry it as their value. Exit 1 with a message when no module or
# no nvidia_p2p_* symbol is found: an empty nv.symvers would only move the failure to load time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/nv.symvers
from= ko=
while [ $# -gt 0 ]; do
	case $1 in
	--from) from=${2:?--from needs a Module.symvers}; shift ;;
	--ko) ko=${2:?--ko needs a module file}; shift ;;
	-h | --help) sed -n '3,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "create_nv.symvers.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
	shift
done
kver=${1:-$(uname -r)}

if [ -n "$from" ]; then
	[ -r "$from" ] || { echo "-E- $from is not readable" >&2; exit 1; }
	grep -P '^0x[0-9a-f]+\tnvidia_p2p_' "$from" >"$out.tmp" || true
	if [ ! -s "$out.tmp" ]; then
		rm -f "$out.tmp"
		echo "-E- $from exports no nvidia_p2p_* symbol" >&2
		exit 1
	fi
	mv "$out.tmp" "$out"
	echo "-I- wrote $(wc -l <"$out") symbols from $from to $out"
	exit 0
fi

mods=()
if [ -n "$ko" ]; then
	mods=("$ko")
else
	f=$(modinfo -k "$kver" -F filename nvidia 2>/dev/null || true)
	[ -n "$f" ] && [ -f "$f" ] && mods+=("$f")
	while IFS= read -r f; do
		[[ " ${mods[*]} " == *" $f "* ]] || mods+=("$f")
	done < <(find "/lib/modules/$kver" -regex '.*/nvidia\.ko\(\.[a-z]*\)?' 2>/dev/null | sort)
fi
if [ ${#mods[@]} -eq 0 ]; then
	echo "-E- Cannot locate nvidia modules for kernel $kver!" >&2
	echo "CUDA driver must be installed before building nv_peer_mem (or give --ko / --from)." >&2
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nv-symvers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/out"
for m in "${mods[@]}"; do
	[ -r "$m" ] || { echo "-E- $m is not readable" >&2; exit 1; }
	base=$(basename "$m")
	name=${base%%.ko*}
	obj=$tmp/$name.ko
	case $m in
	*.ko.xz) xz -dc "$m" >"$obj" ;;
	*.ko.zst) zstd -qdc "$m" >"$obj" ;;
	*.ko.gz) gzip -dc "$m" >"$obj" ;;
	*) cp "$m" "$obj" ;;
	esac
	name=$(modinfo -F name "$obj" 2>/dev/null || echo "$name")
	objdump -t "$obj" >"$tmp/syms"
	# Section contents as one hex string per CRC section, for the lookups below.
	for sec in __kcrctab __kcrctab_gpl; do
		objdump -s -j "$sec" "$obj" 2>/dev/null |
			awk '/^ [0-9a-f]+ / { for (i = 2; i <= 5 && i <= NF; i++) if ($i ~ /^[0-9a-f]+$/) printf "%s", $i }' \
				>"$tmp/$sec.hex" || true
	done
	# objdump -t: VALUE FLAGS... SECTION SIZE NAME
	awk '$NF ~ /^__crc_nvidia_p2p_/ { print $1, $(NF-2), substr($NF, 7) }' "$tmp/syms" |
		while read -r value sec sym; do
			case $sec in
			'*ABS*') crc=$(printf '0x%08x' "$((16#$value & 0xffffffff))") ;;
			__kcrctab | __kcrctab_gpl)
				hex=$(cat "$tmp/$sec.hex")
				off=$((16#$value * 2))
				w=${hex:off:8}
				[ ${#w} = 8 ] || { echo "-E- $m: $sec too short for __crc_$sym" >&2; exit 1; }
				# little-endian 32-bit word
				crc=0x${w:6:2}${w:4:2}${w:2:2}${w:0:2} ;;
			*) echo "-W- $m: __crc_$sym in section $sec, not understood; skipped" >&2; continue ;;
			esac
			if [ "$sec" = __kcrctab_gpl ] || grep -q "__ksymtab_gpl.*__ksymtab_$sym\$" "$tmp/syms"; then
				kind=EXPORT_SYMBOL_GPL
			else
				kind=EXPORT_SYMBOL
			fi
			printf '%s\t%s\t%s\t%s\t\n' "$crc" "$sym" "$name" "$kind"
		done >>"$tmp/out"
done
if [ ! -s "$tmp/out" ]; then
	echo "-W- Could not get list of nvidia symbols (no __crc_nvidia_p2p_* in ${mods[*]}: built without CONFIG_MODVERSIONS?)." >&2
	exit 1
fi
sort -k2,2 -u "$tmp/out" >"$out"
echo "-I- wrote $(wc -l <"$out") symbols from ${mods[*]} to $out"
