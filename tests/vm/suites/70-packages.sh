#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the Debian packages, installed and used the way a user would (issue 12).
#
# The .debs come from packaging/build-debs, staged by tests/vm/build-host.sh into
# target/vmstage/debs. Inside a private mount namespace whose /usr, /etc and /var are overlays
# over tmpfs (virtme-ng shares the host's root with the guest; nothing written here may reach
# it, and nothing outlives the suite even in the guest), this suite
#   1. unloads the tree's gdrdrv (loaded by guest.sh) and removes /dev/gdrdrv;
#   2. installs every package with dpkg -i: DKMS builds gdrdrv for the guest kernel, the
#      postinst loads it, and udev (or the packaged helper where udevd is not running) makes
#      /dev/gdrdrv: char, the registered major, minor 0, mode 0666;
#   3. runs the packaged gdrcopy_sanity (libgdrapi2 from the package, cudasim as libcuda) and
#      the packaged gdrcopy_diag (must exit 0 through gdrdrv; its output is kept in VMTEST_OUT);
#   4. purges every package and checks that the module is unloaded, /dev/gdrdrv, the DKMS tree,
#      the built module, the sources and every packaged file are gone;
#   5. reloads the tree's gdrdrv as guest.sh left it.
set -uo pipefail

FAILS=()
# Guest CPU time (all vCPUs, user+nice+system+irq+softirq) and wall time of the whole suite,
# printed at the end: under TCG the guest's CPU time is what the suite costs the host.
cpu_jiffies() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
SUITE_CPU0=${SUITE_CPU0:-$(cpu_jiffies)}
SUITE_T0=${SUITE_T0:-$(cut -d' ' -f1 /proc/uptime)}
export SUITE_CPU0 SUITE_T0
suite_cost() {
	awk -v c0="$SUITE_CPU0" -v c1="$(cpu_jiffies)" -v t0="$SUITE_T0" -v t1="$(cut -d' ' -f1 /proc/uptime)" \
		-v hz="$(getconf CLK_TCK)" 'BEGIN { printf "packages: suite cost: guest CPU %.0f s, wall %.0f s\n", (c1 - c0) / hz, t1 - t0 }'
}
step() { echo "--- packages: $*"; }
bad() { FAILS+=("$*"); echo "packages: FAIL: $*"; }
die() { echo "packages suite FAIL: $*"; exit 1; }

DEBS=$REPO/target/vmstage/debs
PKGS=(libgdrapi2 libgdrapi-dev libgdsync2 libgdsync-dev libnvm libnvm-dev gdrdrv-dkms gdrcopy-tests gdrcopy)
KVER=$(uname -r)

# --- 0. a private, throw-away view of /usr /etc /var -----------------------------------------
if [ "${PKGTEST_IN_NS:-0}" != 1 ]; then
	ls "$DEBS"/gdrdrv-dkms_*.deb >/dev/null 2>&1 || die "no packages in $DEBS (run packaging/build-debs on the host)"
	command -v dkms >/dev/null || die "dkms is not installed on the host (scripts/install-deps installs it)"
	[ -e "/lib/modules/$KVER/build/Makefile" ] || die "no kernel headers for $KVER (/lib/modules/$KVER/build)"
	modprobe overlay 2>/dev/null
	grep -qw overlay /proc/filesystems || die "overlayfs unavailable in the guest kernel"
	exec unshare -m --propagation private env PKGTEST_IN_NS=1 bash "$0" "$@"
fi

T=/run/pkgtest
mkdir -p "$T" && mount -t tmpfs -o size=1500M tmpfs "$T" || die "tmpfs for the overlays"
for d in usr etc var; do
	mkdir -p "$T/$d.up" "$T/$d.work"
	opts="lowerdir=/$d,upperdir=$T/$d.up,workdir=$T/$d.work"
	mount -t overlay -o "xino=off,$opts" overlay "/$d" 2>/dev/null || mount -t overlay -o "$opts" overlay "/$d" ||
		die "cannot overlay /$d"
	[ "$(stat -f -c %T "/$d")" = overlayfs ] || die "/$d is not the private overlay"
done
step "dpkg writes go to overlays of /usr /etc /var in a private mount namespace (root: $(findmnt -no FSTYPE,OPTIONS / | cut -c1-40))"
mkdir -p /var/lib/dkms /var/log
# man-db's dpkg trigger would rebuild the index of every manual page over 9p (minutes under
# TCG); its documented switch is this file (private to the namespace, like everything here).
rm -f /var/lib/man-db/auto-update

# depmod (run by DKMS on install and on removal) reads every module of the kernel: ~3000 files
# over 9p, about four minutes each time under TCG. In this namespace the kernel's module tree is
# replaced by one holding only its build/source links and the builtin lists, so depmod indexes
# just what DKMS installs. The guest kernel's loaded modules (gpusim) are not affected.
MODS=/usr/lib/modules/$KVER
mkdir -p "$T/modules"
for f in build source modules.order modules.builtin modules.builtin.modinfo; do
	[ -e "$MODS/$f" ] || [ -L "$MODS/$f" ] && cp -a "$MODS/$f" "$T/modules/"
done
mount --bind "$T/modules" "$MODS" || die "cannot replace the module tree"
depmod -a "$KVER" || die "depmod on the reduced module tree"

# udevd must see the packaged rule and helper, which exist only in this namespace: the guest's
# udevd is stopped and one is started here; the guest's is restarted (in PID 1's namespace) at
# the end.
UDEVD=
for u in /usr/lib/systemd/systemd-udevd /lib/systemd/systemd-udevd; do [ -x "$u" ] && { UDEVD=$u; break; }; done
guest_udevd=no
if udevadm control --ping >/dev/null 2>&1; then
	guest_udevd=yes
	udevadm control --exit || die "cannot stop the guest's udevd"
fi
if [ -n "$UDEVD" ]; then
	"$UDEVD" --daemon || die "cannot start udevd in the package namespace"
	for _ in $(seq 50); do udevadm control --ping >/dev/null 2>&1 && break; sleep 0.2; done
fi
stop_ns_udevd() {
	udevadm control --exit 2>/dev/null
	if [ "$guest_udevd" = yes ] && [ -n "$UDEVD" ]; then
		nsenter -t 1 -m -- "$UDEVD" --daemon >/dev/null 2>&1 || echo "packages: could not restart the guest's udevd"
	fi
}

# gpusim's counters: nothing may be left pinned or allocated.
STATS=/sys/kernel/debug/gpusim/stats
stat_of() { awk -v k="$1:" '$1 == k { print $2 }' "$STATS" 2>/dev/null; }
PINS0=$(stat_of active_pins)
FREE0=$(stat_of free_pages)

restore_tree_gdrdrv() {
	grep -q '^gdrdrv ' /proc/modules && return 0
	"$REPO/kmod/gdrdrv/gdrdrv-load" "$REPO/kmod/gdrdrv/gdrdrv.ko" >/dev/null ||
		{ echo "packages: cannot reload the tree's gdrdrv"; return 1; }
}
finish() {
	local rc=$?
	stop_ns_udevd
	restore_tree_gdrdrv || rc=1
	suite_cost
	exit "$rc"
}
trap finish EXIT

# --- 1. the tree's gdrdrv out of the way -------------------------------------------------------
step "unloading the tree's gdrdrv"
if grep -q '^gdrdrv ' /proc/modules; then rmmod gdrdrv || die "rmmod gdrdrv (tree)"; fi
rm -f /dev/gdrdrv

# --- 2. install ------------------------------------------------------------------------------
udev_running=no
udevadm control --ping >/dev/null 2>&1 && udev_running=yes
step "dpkg -i ${PKGS[*]} (udevd running: $udev_running)"
debs=()
for p in "${PKGS[@]}"; do
	f=$(ls "$DEBS/${p}_"*.deb 2>/dev/null | head -n1)
	[ -n "$f" ] || die "no .deb for $p in $DEBS"
	debs+=("$f")
done
t0=$(date +%s)
# Streamed (and kept in VMTEST_OUT): DKMS's build inside the guest is the slow step.
DEBIAN_FRONTEND=noninteractive timeout -k 10 1200 dpkg -i "${debs[@]}" < /dev/null 2>&1 |
	while IFS= read -r l; do echo "[$(cut -d' ' -f1 /proc/uptime)s] $l"; done | tee "$VMTEST_OUT/70-dpkg-install.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || die "dpkg -i failed (exit $rc)"
step "installed in $(($(date +%s) - t0)) s"
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" | grep -q 'install ok installed' || bad "$p not installed"
done

st=$(dkms status gdrdrv 2>&1)
echo "dkms status: $st"
echo "$st" | grep -q "^gdrdrv/2.6, $KVER, [^:]*: installed" || bad "DKMS did not build and install gdrdrv for $KVER"
ko=$(modinfo -n gdrdrv 2>/dev/null)
case $ko in
/lib/modules/$KVER/updates/dkms/gdrdrv.ko*) ;;
*) bad "modinfo -n gdrdrv gives '$ko', not the DKMS-built module" ;;
esac
grep -q '^gdrdrv ' /proc/modules || bad "the postinst did not load gdrdrv"
[ "$(cat /sys/module/gdrdrv/version 2>/dev/null)" = 2.6 ] || bad "loaded gdrdrv reports version '$(cat /sys/module/gdrdrv/version 2>/dev/null)'"
major=$(awk '/^Block/ { exit } $2 == "gdrdrv" { print $1 }' /proc/devices)
node=$(stat -c '%F %t:%T %a %U' /dev/gdrdrv 2>/dev/null)
echo "/dev/gdrdrv: ${node:-missing}; registered major: ${major:-none}"
want=$(printf 'character special file %x:0 666 root' "${major:-0}")
[ -n "$major" ] && [ "$node" = "$want" ] || bad "/dev/gdrdrv is '${node:-missing}', expected '$want'"

# The udev rule alone (no maintainer script involved): unloading removes the node, loading
# makes it again with the new major's number and mode 0666.
if [ "$udev_running" = yes ]; then
	step "udev rule: rmmod / modprobe gdrdrv"
	rmmod gdrdrv || bad "rmmod gdrdrv (packaged)"
	udevadm settle -t 60
	[ -e /dev/gdrdrv ] && bad "udev did not remove /dev/gdrdrv when gdrdrv was unloaded"
	modprobe gdrdrv || bad "modprobe gdrdrv (the DKMS-built module)"
	udevadm settle -t 60
	major=$(awk '/^Block/ { exit } $2 == "gdrdrv" { print $1 }' /proc/devices)
	node=$(stat -c '%F %t:%T %a' /dev/gdrdrv 2>/dev/null)
	want=$(printf 'character special file %x:0 666' "${major:-0}")
	[ "$node" = "$want" ] || bad "after modprobe, udev made /dev/gdrdrv '${node:-missing}', expected '$want'"
	echo "udev: /dev/gdrdrv removed on unload, made again on load: $node"
else
	echo "SKIP udev rule check: no udevd in this guest (the postinst used gdrdrv-node itself)"
fi

# --- 3. use ----------------------------------------------------------------------------------
# Only libcuda comes from the test tree (cudasim): libgdrapi.so.2 must be the packaged one.
CUDADIR=$T/cuda
mkdir -p "$CUDADIR"
ln -s "$(readlink -f "$STAGE_LIB/libcuda.so.1")" "$CUDADIR/libcuda.so.1"
export LD_LIBRARY_PATH=$CUDADIR
lib=$(ldd /usr/bin/gdrcopy_sanity | awk '$1 == "libgdrapi.so.2" { print $3 }')
pkglib=/usr/lib/x86_64-linux-gnu/libgdrapi.so.2
[ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$(readlink -f "$pkglib")" ] && dpkg -S "$pkglib" | grep -q '^libgdrapi2:' ||
	bad "gdrcopy_sanity loads libgdrapi.so.2 from '$lib', not from the libgdrapi2 package"

step "packaged gdrcopy_sanity"
out=$T/sanity.txt
GDRCOPY_SANITY_TIMEOUT=240 timeout -k 5 600 /usr/bin/gdrcopy_sanity -v >"$out" 2>&1
rc=$?
grep -v -e '^DBG:' "$out" | tail -n 45
[ "$rc" = 0 ] || bad "gdrcopy_sanity exit $rc"
grep -qE '^[0-9]+ passed, 0 failed$' "$out" || bad "gdrcopy_sanity: no '<n> passed, 0 failed' summary"

step "packaged gdrcopy_diag"
timeout 120 /usr/bin/gdrcopy_diag > "$VMTEST_OUT/gdrcopy_diag-vm.txt" 2>&1
rc=$?
cat "$VMTEST_OUT/gdrcopy_diag-vm.txt"
[ "$rc" = 0 ] || bad "gdrcopy_diag exit $rc in the VM (expected 0: the gdrdrv path works)"
grep -q '^\[ OK \] backend          gdr_open picks the gdrdrv backend' "$VMTEST_OUT/gdrcopy_diag-vm.txt" ||
	bad "gdrcopy_diag does not report the gdrdrv backend"
grep -q '^\[ OK \] gdrdrv-node ' "$VMTEST_OUT/gdrcopy_diag-vm.txt" || bad "gdrcopy_diag does not accept the packaged /dev/gdrdrv"
timeout 120 /usr/bin/gdrcopy_diag --json > "$VMTEST_OUT/gdrcopy_diag-vm.json" 2>/dev/null
rc=$?
[ "$rc" = 0 ] || bad "gdrcopy_diag --json exit $rc"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["gpudirect_works"] and d["working_path"]=="gdrdrv", d' \
	"$VMTEST_OUT/gdrcopy_diag-vm.json" || bad "gdrcopy_diag --json is not valid or not a working gdrdrv path"
unset LD_LIBRARY_PATH

step "a libnvm consumer built with pkg-config against the packages"
cat > "$T/nvm_consumer.c" <<'C'
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <nvm_ctrl.h>
#include <nvm_error.h>
int main(void)
{
	nvm_ctrl_t *ctrl = NULL;
	/* no module node behind this fd: the library must refuse it with an errno, not crash */
	int err = nvm_ctrl_init(&ctrl, -1);
	printf("nvm_ctrl_init(-1): %d (%s)\n", err, nvm_strerror(err));
	return err > 0 && ctrl == NULL && strlen(nvm_strerror(err)) > 0 ? 0 : 1;
}
C
if gcc -Wall -Wextra -Werror -o "$T/nvm_consumer" "$T/nvm_consumer.c" $(pkg-config --cflags --libs nvm); then
	"$T/nvm_consumer" || bad "the libnvm consumer did not get an error for a bad fd"
	lib=$(ldd "$T/nvm_consumer" | awk '$1 == "libnvm.so" { print $3 }')
	[ "$(readlink -f "$lib")" = /usr/lib/x86_64-linux-gnu/libnvm.so ] && dpkg -S /usr/lib/x86_64-linux-gnu/libnvm.so | grep -q '^libnvm:' ||
		bad "the consumer loads libnvm.so from '$lib', not from the libnvm package"
else
	bad "a libnvm consumer does not build with pkg-config --cflags --libs nvm against the packages"
fi

[ "$(stat_of active_pins)" = "$PINS0" ] || bad "gpusim active_pins $(stat_of active_pins), was $PINS0"
[ "$(stat_of free_pages)" = "$FREE0" ] || bad "gpusim free_pages $(stat_of free_pages), was $FREE0"

# --- 4. purge --------------------------------------------------------------------------------
files=$(dpkg -L "${PKGS[@]}" 2>/dev/null | sort -u)
step "dpkg --purge"
DEBIAN_FRONTEND=noninteractive timeout -k 10 600 dpkg --purge gdrcopy gdrcopy-tests libgdsync-dev libgdsync2 libnvm-dev libnvm libgdrapi-dev \
	gdrdrv-dkms libgdrapi2 < /dev/null 2>&1 | tee "$VMTEST_OUT/70-dpkg-purge.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || bad "dpkg --purge failed (exit $rc)"
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'installed' && bad "$p still installed"
done
grep -q '^gdrdrv ' /proc/modules && bad "gdrdrv is still loaded after purge"
grep -qw gdrdrv /proc/devices && bad "gdrdrv still registered in /proc/devices"
[ -e /dev/gdrdrv ] && bad "/dev/gdrdrv still exists after purge"
[ -e /var/lib/dkms/gdrdrv ] && bad "/var/lib/dkms/gdrdrv still exists after purge"
left=$(find "/lib/modules/$KVER" -name 'gdrdrv.ko*' 2>/dev/null)
[ -z "$left" ] || bad "built module left behind: $left"
modinfo gdrdrv >/dev/null 2>&1 && bad "modinfo still finds a gdrdrv module"
[ -e /usr/src/gdrdrv-2.6 ] && bad "/usr/src/gdrdrv-2.6 still exists"
n=0
while read -r f; do
	[ -n "$f" ] && [ -f "$f" ] && { echo "left behind: $f"; n=$((n + 1)); }
done <<< "$files"
[ "$n" = 0 ] || bad "$n packaged files left after purge"
step "purge removed $(echo "$files" | wc -l) paths; module, node, DKMS tree and sources gone"

if [ ${#FAILS[@]} -ne 0 ]; then
	printf 'packages suite FAIL: %s\n' "${FAILS[@]}"
	exit 1
fi
echo "packages suite PASS"
