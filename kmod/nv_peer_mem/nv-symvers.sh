#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
#
# nv-symvers.sh [KVER]: writes ./nv.symvers, the Module.symvers lines of the nvidia_p2p_*
# exports of the NVIDIA driver installed for kernel KVER (default: the running one), which the
# Makefile passes to modpost (NV_SYMVERS) so that nv_peer_mem records the driver's symbol
# versions. DKMS runs it before each build (PRE_BUILD in dkms.conf). Without an installed NVIDIA
# module it writes nothing and says so, and the build then stops with the Makefile's message.
#
# The versions are read from the module itself: each __crc_<symbol> is a 4-byte value in the
# __kcrctab (or __kcrctab_gpl) section at the symbol's offset.
kver=${1:-$(uname -r)}
out=nv.symvers
tmp=$(mktemp -d) || exit 0
trap 'rm -rf "$tmp"' EXIT
mods=$( (modinfo -k "$kver" -F filename nvidia 2>/dev/null
	find "/lib/modules/$kver" -name 'nvidia.ko*' 2>/dev/null) | sort -u)
[ -n "$mods" ] || { echo "nv-symvers: no NVIDIA kernel module installed for $kver: nv.symvers not written"; exit 0; }
: > "$tmp/out"
for m in $mods; do
	[ -f "$m" ] || continue
	ko=$tmp/m.ko
	case $m in
	*.xz) xz -dc "$m" > "$ko" ;;
	*.zst) zstd -qdc "$m" > "$ko" ;;
	*.gz) gzip -dc "$m" > "$ko" ;;
	*) cp "$m" "$ko" ;;
	esac || continue
	name=$(basename "$m"); name=${name%%.ko*}
	for sec in __kcrctab __kcrctab_gpl; do
		objcopy -O binary --only-section="$sec" "$ko" "$tmp/sec" 2>/dev/null || continue
		[ -s "$tmp/sec" ] || continue
		kind=EXPORT_SYMBOL; [ "$sec" = __kcrctab_gpl ] && kind=EXPORT_SYMBOL_GPL
		objdump -t "$ko" | awk -v s="$sec" 'NF >= 5 && $(NF-2) == s && $NF ~ /^__crc_nvidia_p2p_/ { print $1, substr($NF, 7) }' |
		while read -r off sym; do
			crc=$(od -An -tx4 -j "$(printf '%d' "0x$off")" -N4 "$tmp/sec" | tr -d ' ')
			[ -n "$crc" ] && printf '0x%s\t%s\t%s\t%s\t\n' "$crc" "$sym" "$name" "$kind"
		done >> "$tmp/out"
	done
done
if [ -s "$tmp/out" ]; then
	sort -u -k2,2 "$tmp/out" > "$out"
	echo "nv-symvers: $(wc -l < "$out") nvidia_p2p_* symbol versions of $kver's NVIDIA driver in $out"
else
	echo "nv-symvers: the NVIDIA module for $kver exports no versioned nvidia_p2p_* symbols: nv.symvers not written"
fi
exit 0
