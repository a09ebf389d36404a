#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Runs inside the test VM as root (started by scripts/vmtest through virtme-ng).
#
#   guest.sh [--out DIR] [--run DIR] [--suite GLOB | --suites "NAME..."] [--keep-going]
#            [--timeout SECS] [--setup-only]
#
# Loads gpusim and gdrdrv (if built), creates /dev/gdrdrv the way upstream's installer does, runs
# tests/vm/suites/*.sh in order (each under a timeout), unloads the modules, scans the kernel log,
# and prints exactly "VMTEST RESULT: PASS" only if everything passed.
# --setup-only loads the modules and exports nothing else: for interactive debugging
# (`source tests/vm/guest.sh --setup-only` inside `scripts/vmtest --shell`).
set -u
# The whole script is one compound command, so bash has parsed all of it before it runs:
# editing this file during a run cannot break the run.
{

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=
RUN_DIR=
SUITE_GLOB='*'
SUITE_LIST=
KEEP_GOING=0
SUITE_TIMEOUT=${SUITE_TIMEOUT:-900}
SETUP_ONLY=0
while [ $# -gt 0 ]; do
	case $1 in
	--out) OUT=$2; shift ;;
	--suite) SUITE_GLOB=$2; shift ;;
	--suites) SUITE_LIST=$2; shift ;;
	--run) RUN_DIR=$2; shift ;;
	--keep-going) KEEP_GOING=1 ;;
	--timeout) SUITE_TIMEOUT=$2; shift ;;
	--setup-only) SETUP_ONLY=1 ;;
	*) echo "guest.sh: unknown argument $1"; exit 2 ;;
	esac
	shift
done

# What makes a kernel log fail the run.
BAD_KLOG='BUG:|WARNING:|Oops|Call Trace|refcount_t|KASAN|general protection|kernel panic|list_(add|del) corruption|soft lockup|hung_task|blocked for more than'

FAILED=()
fail() { FAILED+=("$*"); echo "VMTEST FAIL: $*"; }
log() { echo "[guest $(cut -d' ' -f1 /proc/uptime)s] $*"; }

log "kernel $(uname -r), $(nproc) CPUs, guest booted in $(cut -d' ' -f1 /proc/uptime)s"

# Under TCG a process start costs ~100 ms, most of it QEMU translating the code of ld.so, libc
# and the program again: it reuses translated code only for the same physical page at the same
# virtual address. virtme-ng's 9p root has no page cache (every exec reads the files into new
# pages) and ASLR moves the libraries each time. So: the host's /usr (scripts/vmtest shares it
# again as "hostusr") mounted with cache=loose under a fresh writable overlay, and ASLR off. A
# warm exec is then 4-5 times cheaper (docs/testing-vm.md). /usr does not change during a run.
. "$REPO/tests/vm/lib/cached-9p.sh"
if has_9p_tag hostusr; then
	mkdir -p /run/usr-rw/upper /run/usr-rw/work
	if mount_cached_9p hostusr /run/hostusr &&
		mount -t overlay -o xino=off,lowerdir=/run/hostusr,upperdir=/run/usr-rw/upper,workdir=/run/usr-rw/work \
			cached-usr /usr; then
		log "/usr: the host's, page-cached (9p cache=loose under an overlay)"
	else
		fail "cannot mount the page-cached /usr (9p tag hostusr)"
	fi
fi
echo 0 > /proc/sys/kernel/randomize_va_space || fail "cannot turn ASLR off"
# Every dynamic exec reads /etc/ld.so.cache, which virtme-ng's /etc overlay takes from its
# uncached 9p root: an open and a round trip through QEMU for each page ld.so touches. Copied up
# into the overlay's tmpfs layer, in one guest an exec of /usr/bin/true took 38 ms instead of 48
# and a shell pipeline 92 instead of 120. (A copy of all of /etc took 20 s of boot under TCG.)
if cp -p /etc/ld.so.cache /etc/ld.so.cache.mem && mv /etc/ld.so.cache.mem /etc/ld.so.cache; then
	log "/etc/ld.so.cache: copied into the guest's memory"
else
	fail "cannot copy /etc/ld.so.cache up into the /etc overlay"
fi

# virtme-ng's root is the host's, over 9p without a cache, where the kernel drops a dentry as
# soon as nothing uses it: every path through the top-level links /bin, /lib, /lib64 and /sbin
# (every exec's interpreter, library paths, ldconfig's 2,000 stats) cost a 9p walk and a
# readlink, round trips through QEMU. A tmpfs becomes the root instead (pivot_root, so PID 1
# and every process move with us, and systemd's tools do not see a chroot): the same links,
# and each top-level directory of the old root bound in with its mounts (the page-cached /usr
# above among them). Not for --setup-only (an interactive shell keeps the root it has).
if [ "$SETUP_ONLY" = 0 ] && [ "$(findmnt -no FSTYPE /)" = 9p ]; then
	new_root=/media
	here=$PWD
	if mount --make-rprivate / && mount -t tmpfs -o mode=755 guest-root "$new_root"; then
		dirs=()
		for e in /* /.[!.]*; do
			if [ -L "$e" ]; then
				ln -s "$(readlink "$e")" "$new_root$e" || fail "cannot copy the link $e into the tmpfs root"
			elif [ -d "$e" ] && [ "$e" != "$new_root" ]; then
				dirs+=("$e")
			fi
		done
		mkdir "${dirs[@]/#/$new_root}" "$new_root/media" "$new_root/.old-root" || fail "cannot make the tmpfs root's directories"
		for e in "${dirs[@]}"; do
			mount --rbind "$e" "$new_root$e" || fail "cannot bind $e into the tmpfs root"
		done
		if (cd "$new_root" && pivot_root . .old-root); then
			cd "$here" || fail "cannot return to $here in the tmpfs root"
			log "root: a tmpfs with the 9p root's links and directories bound in"
		else
			fail "pivot_root to the tmpfs root"
		fi
	else
		fail "cannot mount the tmpfs root on $new_root"
	fi
fi

# --out DIR: where this guest's results go. --run DIR (default: the --out directory): the run's
# directory on the host, which holds the build snapshot and the late builds' marks; a run with
# two VMs gives each its own --out inside the one --run.
RUN_DIR=${RUN_DIR:-$OUT}
# scripts/vmtest froze this run's build products in RUN_DIR/snapshot: put them over the live
# paths (the host tree may be rebuilt by someone else while we run). It shares snapshot/root
# again as 9p tag "snapshot", mounted page-cached like /usr above (the suites start the staged
# programs thousands of times). The late builds add files to it while we run: 9p asks the host
# for any name the guest has not cached, so their results appear once they are done.
SNAPSHOT=${RUN_DIR:+$RUN_DIR/snapshot}
if [ -n "$SNAPSHOT" ] && [ -f "$SNAPSHOT/paths" ]; then
	snap_root=$SNAPSHOT/root
	if has_9p_tag snapshot; then
		if mount_cached_9p snapshot /run/snapshot; then
			snap_root=/run/snapshot
		else
			fail "cannot mount the page-cached snapshot (9p tag snapshot)"
		fi
	fi
	while read -r p; do
		[ -e "$REPO/$p" ] || { echo "snapshot: $REPO/$p vanished"; continue; }
		mount --bind "$snap_root/$p" "$REPO/$p" || fail "bind-mount snapshot of $p"
	done < "$SNAPSHOT/paths"
	log "running this run's build snapshot ($snap_root) of: $(tr '\n' ' ' < "$SNAPSHOT/paths")"
fi
dmesg -n 1 2>/dev/null   # keep kernel messages off the console; we print them at the end

# --- modules -------------------------------------------------------------------------------
GPUSIM_KO=$REPO/kmod/gpusim/gpusim.ko
GDRDRV_KO=$REPO/kmod/gdrdrv/gdrdrv.ko
GDRDRV_LOADED=0

if ! insmod "$GPUSIM_KO" ${GPUSIM_PARAMS:-}; then
	fail "insmod gpusim"
elif [ ! -c /dev/gpusim ]; then
	fail "/dev/gpusim did not appear"
fi

if [ -f "$GDRDRV_KO" ] && [ ${#FAILED[@]} -eq 0 ]; then
	# upstream's defaults: no module parameters
	if insmod "$GDRDRV_KO"; then
		GDRDRV_LOADED=1
		# as upstream's insmod.sh: dynamic major from /proc/devices, minor 0, world rw
		major=$(awk '$2 == "gdrdrv" { print $1 }' /proc/devices)
		if [ -z "$major" ]; then
			fail "gdrdrv not in /proc/devices"
		else
			rm -f /dev/gdrdrv
			mknod /dev/gdrdrv c "$major" 0
			chmod a+rw /dev/gdrdrv
			log "gdrdrv loaded, /dev/gdrdrv major $major"
		fi
	else
		fail "insmod gdrdrv"
	fi
else
	[ -f "$GDRDRV_KO" ] || log "gdrdrv.ko not built: gdrdrv not loaded"
fi

export REPO
export STAGE_LIB=$REPO/target/vmstage/lib
export STAGE_BIN=$REPO/target/vmstage/bin
export VMTEST_OUT=${OUT:-/tmp/vmtest-out}
export VMTEST_LATE=${RUN_DIR:-$VMTEST_OUT}/late
export HAVE_GDRDRV=$GDRDRV_LOADED
mkdir -p "$VMTEST_OUT"
# QEMU's NVMe controller (1b36:0010), if scripts/vmtest attached one: its PCI address, and the
# file where storage suites record each write they leave on the disk ("offset length seed", see
# tests/vm/nvme/image.py); the host checks the image against it after the run.
NVME_BDF=
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat "$d/vendor")" = 0x1b36 ] && [ "$(cat "$d/device")" = 0x0010 ]; then
		NVME_BDF=${d##*/}; break
	fi
done
export NVME_BDF
export NVME_WRITES=$VMTEST_OUT/nvme-writes.txt
[ -n "$NVME_BDF" ] && log "NVMe controller at $NVME_BDF (driver: $(basename "$(readlink "/sys/bus/pci/devices/$NVME_BDF/driver" 2>/dev/null)" 2>/dev/null))"

if [ "$SETUP_ONLY" = 1 ]; then
	log "setup done: REPO=$REPO STAGE_LIB=$STAGE_LIB VMTEST_OUT=$VMTEST_OUT"
	set +u
	return 0 2>/dev/null || exit 0
fi

# --- suites --------------------------------------------------------------------------------
klog_mark() { dmesg | wc -l; }
# Busy CPU time of the whole guest (user, nice, system, irq, softirq; /proc/stat, in USER_HZ =
# 1/100 s): under TCG this is what a suite costs the host, whatever else shares the host's cores.
cpu_busy() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
klog_since() { dmesg | tail -n +"$(($1 + 1))"; }

RAN=0
if [ ${#FAILED[@]} -eq 0 ]; then
	shopt -s nullglob
	for suite in "$REPO"/tests/vm/suites/*.sh; do
		name=$(basename "$suite" .sh)
		# shellcheck disable=SC2254
		case $name in $SUITE_GLOB) ;; *) continue ;; esac
		if [ -n "$SUITE_LIST" ]; then
			case " $SUITE_LIST " in *" $name "*) ;; *) continue ;; esac
		fi
		RAN=$((RAN + 1))
		log "SUITE START $name"
		mark=$(klog_mark)
		c0=$(cpu_busy)
		t0=$(date +%s)
		timeout -k 10 "$SUITE_TIMEOUT" bash "$suite" 2>&1 | tee "$VMTEST_OUT/$name.log"
		rc=${PIPESTATUS[0]}
		dt=$(($(date +%s) - t0))
		dc=$(($(cpu_busy) - c0))
		printf 'SUITE TIME %s %ss wall, %d.%02ds guest CPU\n' "$name" "$dt" $((dc / 100)) $((dc % 100))
		bad=$(klog_since "$mark" | grep -E "$BAD_KLOG")
		if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
			echo "SUITE FAIL $name (timed out after ${SUITE_TIMEOUT}s)"
			FAILED+=("$name: timeout")
		elif [ "$rc" != 0 ]; then
			echo "SUITE FAIL $name (exit $rc, ${dt}s)"
			FAILED+=("$name: exit $rc")
		elif [ -n "$bad" ]; then
			echo "SUITE FAIL $name (kernel log: $(echo "$bad" | head -n1))"
			FAILED+=("$name: kernel log")
		else
			echo "SUITE PASS $name (${dt}s)"
		fi
		if [ ${#FAILED[@]} -ne 0 ] && [ "$KEEP_GOING" = 0 ]; then
			log "stopping after the first failure (use --keep-going to run the rest)"
			break
		fi
	done
	[ "$RAN" -gt 0 ] || fail "no suite matched '$SUITE_GLOB'${SUITE_LIST:+ and '$SUITE_LIST'}"
fi

# --- unload: must succeed, i.e. nothing may still hold the modules ------------------------
# The libnvm helper (loaded by the storage suites) must hold no window when the run ends.
LNVM_STATS=/sys/kernel/debug/libnvm/stats
if grep -q '^libnvm ' /proc/modules && [ -r "$LNVM_STATS" ]; then
	held=$(awk '$1 ~ /^(host|gpu)_(windows|pages):$/ && $2 != 0' "$LNVM_STATS")
	[ -z "$held" ] || fail "libnvm still holds windows at the end: $(echo $held)"
fi
for m in p2ptest dmabuf_import libnvm gdrdrv; do
	if grep -q "^$m " /proc/modules; then
		rmmod "$m" || fail "rmmod $m"
	fi
done
GS_STATS=/sys/kernel/debug/gpusim/stats
if [ -r "$GS_STATS" ]; then
	for k in active_pins active_dma_mappings; do
		v=$(awk -v k="$k:" '$1 == k { print $2 }' "$GS_STATS")
		[ -z "$v" ] || [ "$v" = 0 ] || fail "gpusim: $k is $v at the end of the run"
	done
fi
if grep -q '^gpusim ' /proc/modules; then
	rmmod gpusim || fail "rmmod gpusim"
fi

# --- kernel log ----------------------------------------------------------------------------
dmesg > "$VMTEST_OUT/dmesg.log" 2>&1
if grep -qE "$BAD_KLOG" "$VMTEST_OUT/dmesg.log"; then
	fail "kernel log contains warnings/oopses:"
	grep -nE -A3 "$BAD_KLOG" "$VMTEST_OUT/dmesg.log" | head -n 80
fi
echo "----- guest dmesg (tail) -----"
tail -n 40 "$VMTEST_OUT/dmesg.log"
echo "------------------------------"

if [ ${#FAILED[@]} -eq 0 ]; then
	echo PASS > "$VMTEST_OUT/result"
	echo "VMTEST RESULT: PASS"
else
	printf '%s\n' "${FAILED[@]}" > "$VMTEST_OUT/result"
	echo "VMTEST RESULT: FAIL (${FAILED[*]})"
fi
sync
[ ${#FAILED[@]} -eq 0 ]
exit
}
