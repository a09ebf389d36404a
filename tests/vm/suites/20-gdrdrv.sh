#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the gdrdrv kernel module through its raw ioctl/mmap ABI (tests/vm/gdrdrv/gdrdrv_test.c),
# with GPU memory from gpusim. Runs inside the VM as root (tests/vm/guest.sh), with gpusim and
# gdrdrv loaded with default parameters.
#
# Passes: (1) defaults (persistent mapping); (2) reloaded with use_persistent_mapping=0 and
# debug/info traces (free-callback invalidation, the debug procfs file); (3) the same with
# gpusim scattering BAR pages (no two GPU pages physically contiguous: one remap per page);
# (4) reloaded with defaults again, which is also how the suite leaves the system, even when a
# pass fails.
set -euo pipefail

GDIR=$REPO/kmod/gdrdrv
KO=$GDIR/gdrdrv.ko
LOAD=$GDIR/gdrdrv-load
SRC=$REPO/tests/vm/gdrdrv/gdrdrv_test.c
SCATTER=/sys/module/gpusim/parameters/scatter_pages

fail() { echo "gdrdrv suite FAIL: $*"; exit 1; }
step() { echo "--- gdrdrv: $*"; }

[ -f "$KO" ] || fail "missing $KO (built by scripts/vmtest)"
[ -e /dev/gpusim ] || fail "/dev/gpusim missing: gpusim not loaded"
grep -q '^gdrdrv ' /proc/modules || fail "gdrdrv is not loaded"
# Built on the host by tests/vm/build-host.sh from $SRC.
BIN=$STAGE_BIN/gdrdrv_test
[ -x "$BIN" ] || fail "missing $BIN (tests/vm/build-host.sh builds it from $SRC)"
WORK=$(mktemp -d /tmp/gdrdrv-suite.XXXXXX)

restore() {
	local rc=$?
	[ -w "$SCATTER" ] && echo 0 > "$SCATTER"
	if ! grep -q '^gdrdrv ' /proc/modules || ! grep -q 'persistent mapping: yes' \
		/proc/driver/gdrdrv/params 2>/dev/null || ! [ -c /dev/gdrdrv ]; then
		"$LOAD" "$KO" >/dev/null || { echo "gdrdrv suite FAIL: cannot reload gdrdrv"; rc=1; }
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap restore EXIT

reload() { "$LOAD" "$KO" "$@" >/dev/null || fail "gdrdrv-load $*"; }

expect_file() { # <file> <expected content>
	local got
	got=$(cat "$1") || fail "cannot read $1"
	[ "$got" = "$2" ] || fail "$1 is:
$got
expected:
$2"
}

check_node() {
	local major
	major=$(awk '$2 == "gdrdrv" { print $1 }' /proc/devices)
	[ -n "$major" ] || fail "gdrdrv not in /proc/devices"
	[ -c /dev/gdrdrv ] || fail "/dev/gdrdrv is not a character device"
	[ "$(stat -c '%t:%T %a' /dev/gdrdrv)" = "$(printf '%x:0 666' "$major")" ] ||
		fail "/dev/gdrdrv is $(stat -c '%t:%T %a' /dev/gdrdrv), want major $major minor 0 mode 666"
}

# PAT (x86): memtype entries on the BAR, one line each "<start> <end> <type>". Our WC mappings
# register their BAR runs while mapped; after the tests only gpusim's own entries may remain,
# and every entry on the BAR must be write-combining.
PAT=/sys/kernel/debug/x86/pat_memtype_list
GSTATS=/sys/kernel/debug/gpusim/stats
bar_memtypes() {
	local bar size lo hi type
	bar=$(awk '$1 == "bar_phys:" { print $2 }' "$GSTATS")
	size=$(awk '$1 == "bar_size:" { print $2 }' "$GSTATS")
	sed -nE -e 's/.*0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+)\] *([a-z-]+).*/0x\1 0x\2 \3/p' \
		-e 's/^(PAT: )?([a-z-]+) @ 0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+).*/0x\3 0x\4 \2/p' "$PAT" |
	while read -r lo hi type; do
		if [ $((hi)) -gt $((bar)) ] && [ $((lo)) -lt $((bar + size)) ]; then
			echo "$lo $hi $type"
		fi
	done
}
HAVE_PAT=0
if [ -r "$PAT" ] && [ -r "$GSTATS" ]; then HAVE_PAT=1; fi

check_pat_clean() { # <memtype lines taken before the tests>
	[ "$HAVE_PAT" = 1 ] || return 0
	local now
	now=$(bar_memtypes)
	[ "$now" = "$1" ] || fail "BAR memtype entries changed (leaked WC registrations?):
before:
$1
after:
$now"
}

run_tests() { # <persistent 0|1> [test names]
	"$BIN" --persistent="$@" || fail "gdrdrv_test --persistent=$* failed"
}

# Routine events are logged only with dbg_enabled=1 (refusals a working program meets: an mmap
# of an unaligned, invalidated or unknown pin, a file used by a process that did not open it, an
# attribute or mapping type this machine lacks) or info_enabled=1 (each pin and map), as
# upstream's module does: they must not fill a production kernel log.
ROUTINE='gdrdrv:(gdrdrv_ioctl:file opened by another process|gdrdrv_mmap:|ioctl_get_attr:unknown attribute|ioctl_req_mapping_type:mapping type [0-9]+ refused|[a-z_]+:(pinned|mapped) handle )'
kmsg_mark() { echo "gdrdrv-suite: mark $1" > /dev/kmsg; }
log_since() { # <mark>: the kernel log after that mark (a here-string: see pass 1)
	local klog
	klog=$(dmesg)
	awk -v m="gdrdrv-suite: mark $1" 'found { print } index($0, m) { found = 1 }' <<<"$klog"
}

# --- module metadata and parameters --------------------------------------------------------
step "metadata"
[ "$(modinfo -F license "$KO")" = "Dual MIT/GPL" ] || fail "license"
[ "$(modinfo -F version "$KO")" = "2.6" ] || fail "version"
modinfo -F description "$KO" | grep -Eq '^GDRCopy kernel-mode driver built for (opensource|proprietary) NVIDIA driver$' ||
	fail "description: $(modinfo -F description "$KO")"
for p in dbg_enabled info_enabled use_persistent_mapping; do
	modinfo -F parm "$KO" | grep -q "^$p:" || fail "no module parameter $p"
	# sysfs permission 0: settable at load time only, invisible at run time
	[ ! -e "/sys/module/gdrdrv/parameters/$p" ] || fail "$p is visible in sysfs"
done

# --- pass 1: defaults ------------------------------------------------------------------------
step "pass 1: default parameters (persistent mapping)"
reload
check_node
# Here-strings, not pipes: grep -q quits at its first match, and under pipefail a long kernel log
# would fail the check through dmesg's SIGPIPE.
klog=$(dmesg)
grep -q 'gdrdrv:gdrdrv_init:loading gdrdrv version 2.6 built for' <<<"$klog" ||
	fail "load message missing from the kernel log"
grep -q 'gdrdrv:gdrdrv_init:Persistent mapping will be used' <<<"$klog" ||
	fail "persistent mapping message missing"
[ "$(stat -c %a /proc/driver/gdrdrv)" = 555 ] || fail "/proc/driver/gdrdrv mode"
[ "$(stat -c %a /proc/driver/gdrdrv/params)" = 444 ] || fail "params mode"
expect_file /proc/driver/gdrdrv/params "Version: 2.6
Built for NVIDIA driver flavor: opensource
Use persistent mapping: yes
dbg_enabled: 0
info_enabled: 0"
[ ! -e /proc/driver/gdrdrv/nv_get_pages_refcount ] || fail "refcount file without dbg_enabled"
if [ "$HAVE_PAT" = 1 ]; then PAT_BEFORE=$(bar_memtypes); else
	echo "# PAT checks skipped: $PAT or $GSTATS not readable"; PAT_BEFORE=; fi
kmsg_mark pass1
run_tests 1
check_pat_clean "$PAT_BEFORE"
since=$(log_since pass1)
grep -q . <<<"$since" || fail "the kernel log lost the pass 1 mark"
routine=$(grep -E "$ROUTINE" <<<"$since" || true)
[ -z "$routine" ] || fail "routine events logged without dbg_enabled/info_enabled:
$(head -20 <<<"$routine")"

# --- pass 2: non-persistent, with traces -----------------------------------------------------
step "pass 2: use_persistent_mapping=0 dbg_enabled=1 info_enabled=1"
reload use_persistent_mapping=0 dbg_enabled=1 info_enabled=1
check_node
expect_file /proc/driver/gdrdrv/params "Version: 2.6
Built for NVIDIA driver flavor: opensource
Use persistent mapping: no
dbg_enabled: 1
info_enabled: 1"
REFC=/proc/driver/gdrdrv/nv_get_pages_refcount
[ "$(stat -c %a $REFC)" = 440 ] || fail "refcount file mode"
expect_file $REFC 0
run_tests 0
expect_file $REFC 0
check_pat_clean "$PAT_BEFORE"
# The same routine events are logged once asked for (a short run, so the ring buffer keeps it).
kmsg_mark pass2
run_tests 0 mmap_checks fork
since=$(log_since pass2)
for want in 'gdrdrv_ioctl:file opened by another process' 'gdrdrv_mmap:file opened by another process' \
	'gdrdrv_mmap:pinned address is not 64 KiB aligned' 'gdrdrv_mmap:handle 0x[0-9a-f]+ is already mapped' \
	'pin_region:pinned handle ' 'gdrdrv_mmap:mapped handle '; do
	grep -qE "gdrdrv:$want" <<<"$since" || fail "with dbg_enabled=1 info_enabled=1 the log lacks 'gdrdrv:$want'"
done

step "unload refused while a process holds pins and mappings"
mkfifo "$WORK/hold.fifo"
"$BIN" --persistent=0 --hold < "$WORK/hold.fifo" > "$WORK/hold.out" &
holder=$!
exec 8> "$WORK/hold.fifo"
for _ in $(seq 300); do grep -q holding "$WORK/hold.out" && break; sleep 0.1; done
grep -q holding "$WORK/hold.out" || fail "the holding process did not start"
expect_file $REFC 3
if [ "$HAVE_PAT" = 1 ]; then
	held=$(bar_memtypes)
	[ "$held" != "$PAT_BEFORE" ] || fail "mapped buffers registered no WC memtype"
	if grep -qv ' write-combining$' <<<"$held"; then fail "non-WC memtype on the BAR:
$held"; fi
fi
if rmmod gdrdrv 2>/dev/null; then fail "gdrdrv was unloaded while in use"; fi
exec 8>&-
wait "$holder" || fail "the holding process failed"
expect_file $REFC 0
check_pat_clean "$PAT_BEFORE"

# --- pass 3: scattered BAR pages ------------------------------------------------------------
if [ -w "$SCATTER" ]; then
	step "pass 3: gpusim scatter_pages=1 (non-contiguous BAR pages)"
	echo 1 > "$SCATTER"
	run_tests 0 data large mmap_checks invalidation races
	expect_file $REFC 0
	reload
	check_node
	run_tests 1 data mmap_checks invalidation
	echo 0 > "$SCATTER"
	check_pat_clean "$PAT_BEFORE"
else
	fail "$SCATTER missing: cannot test non-contiguous BAR pages"
fi

# --- pass 4: back to defaults --------------------------------------------------------------
step "pass 4: defaults again"
reload
check_node
grep -q 'Use persistent mapping: yes' /proc/driver/gdrdrv/params || fail "defaults not restored"
run_tests 1 version attr
echo "gdrdrv suite: all passes OK"
