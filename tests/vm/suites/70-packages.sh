#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the Debian packages, installed and used the way a user would (issues 12, 32, 34).
#
# The .debs come from packaging/build-debs, staged by packaging/vm-build.sh (a late hook of
# tests/vm/build-host.sh: the suite waits for it) into target/vmstage/debs, with one DKMS
# archive per kernel module in target/vmstage/dkms: DKMS
# itself, run on the host by packaging/dkms-prebuild on the packaged source trees for this
# kernel (the compile under TCG took minutes). Inside a private mount namespace whose /usr,
# /etc and /var are overlays over tmpfs (virtme-ng shares the host's root with the guest;
# nothing written here may reach it, and nothing outlives the suite even in the guest), this
# suite
#   1. unloads the tree's gdrdrv (loaded by guest.sh) and removes /dev/gdrdrv; loads the
#      test-only peer-memory core (peermem_host) that nv_peer_mem needs;
#   2. checks that each DKMS archive holds exactly the packaged source tree and a module for
#      this kernel, and puts it where the DKMS postinst looks for binary modules
#      (/usr/share/NAME-dkms/NAME-VERSION.dkms.tar.gz);
#   3. installs every package with dpkg -i: each postinst loads its archive with dkms ldtarball
#      and runs dkms install (no compile here), the gdrdrv postinst loads gdrdrv and udev (or the
#      packaged helper where udevd is not running) makes /dev/gdrdrv: char, the registered
#      major, minor 0, mode 0666; the nv_peer_mem postinst loads it and it registers its
#      clients nv_mem and nv_mem_nc; libnvm is not loaded by its package (it would take every
#      free NVMe controller) and its PCI alias is blacklisted; modprobe libnvm loads the DKMS one;
#   4. runs the packaged gdrcopy_sanity (libgdrapi2 from the package, cudasim as libcuda) and
#      the packaged gdrcopy_diag (must exit 0 through gdrdrv; its output is kept in VMTEST_OUT);
#   5. purges every package and checks that every module is unloaded, /dev/gdrdrv, the DKMS
#      trees, the built modules, the sources, nv_peer_mem's conffiles, init links and systemd
#      link, and every packaged file are gone;
#   6. unloads peermem_host and reloads the tree's gdrdrv as guest.sh left it.
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
# Each step says the guest's uptime, so a slow step shows in the log.
step() { echo "--- packages [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }
bad() { FAILS+=("$*"); echo "packages: FAIL: $*"; }
die() { echo "packages suite FAIL: $*"; exit 1; }

DEBS=$REPO/target/vmstage/debs
PKGS=(libgdrapi2 libgdrapi-dev libgdsync2 libgdsync-dev libnvm libnvm-dev gdrdrv-dkms gdrcopy-tests gdrcopy
	libnvm-dkms nvidia-peer-memory nvidia-peer-memory-dkms)
# DKMS modules of the packages: NAME VERSION PACKAGE
DKMS_MODS=("gdrdrv 2.6 gdrdrv-dkms" "libnvm 0.3 libnvm-dkms" "nv_peer_mem 1.3 nvidia-peer-memory-dkms")
PREBUILT=$REPO/target/vmstage/dkms
PEERMEM_HOST_KO=$REPO/target/vmstage/kmod/peermem_host.ko
KVER=$(uname -r)

# --- 0. a private, throw-away view of /usr /etc /var -----------------------------------------
if [ "${PKGTEST_IN_NS:-0}" != 1 ]; then
	. "$REPO/tests/vm/lib/late-build.sh"
	late_build_wait 70-packages || die "no packages (packaging/vm-build.sh, a late hook)"
	ls "$DEBS"/gdrdrv-dkms_*.deb >/dev/null 2>&1 || die "no packages in $DEBS (run packaging/build-debs on the host)"
	[ -f "$PEERMEM_HOST_KO" ] || die "no $PEERMEM_HOST_KO (kmod/nv_peer_mem/vm-build.sh builds it)"
	command -v dkms >/dev/null || die "dkms is not installed on the host (scripts/install-deps installs it)"
	[ -e "/lib/modules/$KVER/build/Makefile" ] || die "no kernel headers for $KVER (/lib/modules/$KVER/build)"
	modprobe overlay 2>/dev/null
	grep -qw overlay /proc/filesystems || die "overlayfs unavailable in the guest kernel"
	exec unshare -m --propagation private env PKGTEST_IN_NS=1 bash "$0" "$@"
fi

T=/run/pkgtest
mkdir -p "$T" && mount -t tmpfs -o size=1500M tmpfs "$T" || die "tmpfs for the overlays"
# dpkg reads its whole database (/var/lib/dpkg: a list file per installed package) on every
# call, and DKMS calls it many times: the host's /var shared again as 9p tag "hostvar", with the
# guest's page cache on (scripts/vmtest; virtme-ng's root has none), makes those reads cheap.
# Nothing in /var that this suite reads changes on the host during a test run.
var_lower=/var
. "$REPO/tests/vm/lib/cached-9p.sh"
if has_9p_tag hostvar; then
	mount_cached_9p hostvar "$T/hostvar" || die "cannot mount the page-cached /var (9p tag hostvar)"
	var_lower=$T/hostvar
fi
for d in usr etc var; do
	mkdir -p "$T/$d.up" "$T/$d.work"
	lower=/$d
	[ "$d" != var ] || lower=$var_lower
	opts="lowerdir=$lower,upperdir=$T/$d.up,workdir=$T/$d.work"
	mount -t overlay -o "xino=off,$opts" overlay "/$d" 2>/dev/null || mount -t overlay -o "$opts" overlay "/$d" ||
		die "cannot overlay /$d"
	[ "$(stat -f -c %T "/$d")" = overlayfs ] || die "/$d is not the private overlay"
done
step "dpkg writes go to overlays of /usr /etc /var in a private mount namespace (root: $(findmnt -no FSTYPE,OPTIONS / | cut -c1-40); /var over $var_lower)"
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
	if [ -d /sys/module/nv_peer_mem ]; then rmmod nv_peer_mem || { echo "packages: cannot unload nv_peer_mem"; rc=1; }; fi
	if [ -d /sys/module/libnvm ]; then rmmod libnvm || { echo "packages: cannot unload libnvm"; rc=1; }; fi
	if [ -d /sys/module/peermem_host ]; then rmmod peermem_host || { echo "packages: cannot unload peermem_host"; rc=1; }; fi
	restore_tree_gdrdrv || rc=1
	suite_cost
	exit "$rc"
}
trap finish EXIT

# --- 1. the tree's gdrdrv out of the way -------------------------------------------------------
step "unloading the tree's gdrdrv"
if grep -q '^gdrdrv ' /proc/modules; then rmmod gdrdrv || die "rmmod gdrdrv (tree)"; fi
rm -f /dev/gdrdrv
for m in libnvm nv_peer_mem peermem_host; do
	[ ! -d /sys/module/$m ] || die "$m is loaded before the suite (an earlier suite left it)"
done
# nv_peer_mem needs a peer-memory core: the test-only one (OFED 5.5+ model) over the VM's NVMe
# controller as its DMA device, as suite 56 loads it.
insmod "$PEERMEM_HOST_KO" dma_dev=nvme || die "insmod peermem_host"

# --- 2. the host's DKMS builds, where DKMS's postinst looks for them ---------------------------
step "DKMS archives built on the host: checked against the packages, staged in /usr/share/NAME-dkms"
for m in "${DKMS_MODS[@]}"; do
	read -r name ver pkg <<< "$m"
	tb=$PREBUILT/$name-$ver.dkms.tar.gz
	[ -f "$tb" ] || die "no DKMS archive $tb (packaging/vm-build.sh makes it)"
	x=$T/tb-$name
	mkdir -p "$x" "$T/deb-$name"
	tar -xzf "$tb" -C "$x" || die "cannot unpack $tb"
	deb=$(ls "$DEBS/${pkg}_"*.deb | head -n1)
	dpkg-deb -x "$deb" "$T/deb-$name" || die "dpkg-deb -x $deb"
	# The archive must hold the packaged tree, unchanged: DKMS compiled what the package ships.
	diff -r "$x/dkms_source_tree" "$T/deb-$name/usr/src/$name-$ver" >/dev/null ||
		bad "$name: the DKMS archive's source differs from /usr/src/$name-$ver of $pkg"
	ko=$(ls "$x/dkms_main_tree/$KVER/$(uname -m)/module/$name.ko"* 2>/dev/null | head -n1)
	[ -n "$ko" ] || die "$name: no module for $KVER in $tb"
	vm=$(modinfo -F vermagic "$ko" | cut -d' ' -f1)
	[ "$vm" = "$KVER" ] || bad "$name: the archived module is for '$vm', not $KVER"
	[ -s "$x/dkms_main_tree/$KVER/$(uname -m)/log/make.log" ] || bad "$name: no DKMS make.log in the archive"
	echo "$name-$ver: $(tar -tzf "$tb" | grep -c .) entries, module for $vm, DKMS log: $(head -n1 "$x/dkms_main_tree/$KVER/$(uname -m)/log/make.log")"
	mkdir -p "/usr/share/$name-dkms"
	cp "$tb" "/usr/share/$name-dkms/$name-$ver.dkms.tar.gz"
	rm -rf "$x" "$T/deb-$name"
done

# --- 3. install ------------------------------------------------------------------------------
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
# Streamed (and kept in VMTEST_OUT).
DEBIAN_FRONTEND=noninteractive timeout -k 10 1200 dpkg -i "${debs[@]}" < /dev/null 2>&1 |
	while IFS= read -r l; do echo "[$(cut -d' ' -f1 /proc/uptime)s] $l"; done | tee "$VMTEST_OUT/70-dpkg-install.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || die "dpkg -i failed (exit $rc)"
step "installed in $(($(date +%s) - t0)) s"
# One dpkg-query for all of them: each call parses the whole status file, seconds under TCG.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${PKGS[@]}" 2>/dev/null)
for p in "${PKGS[@]}"; do
	grep -qx "$p install ok installed" <<< "$installed" || bad "$p not installed"
done

# One dkms status for every module: each call walks DKMS's whole tree in shell (with three
# modules installed, 20 s of a CI run's VM; three calls took 27 s).
dkms_st=$(dkms status 2>&1)
echo "$dkms_st" | sed 's/^/dkms status: /'
for m in "${DKMS_MODS[@]}"; do
	read -r name ver pkg <<< "$m"
	grep -q "^$name/$ver, $KVER, [^:]*: installed" <<< "$dkms_st" || bad "DKMS did not install $name for $KVER"
	# The postinst took DKMS's binary-module path: no compile in the guest.
	grep -q "Loading tarball for $name-$ver" "$VMTEST_OUT/70-dpkg-install.log" ||
		bad "$pkg's postinst did not load the DKMS archive of $name"
	ko=$(modinfo -n "$name" 2>/dev/null)
	case $ko in
	/lib/modules/$KVER/updates/dkms/$name.ko*) ;;
	*) bad "modinfo -n $name gives '$ko', not the DKMS-installed module" ;;
	esac
done
grep -q 'Building initial module' "$VMTEST_OUT/70-dpkg-install.log" && bad "a DKMS postinst compiled a module in the guest"
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

# nv_peer_mem: loaded by its postinst over the peer-memory core, both clients registered.
step "nv_peer_mem (nvidia-peer-memory, nvidia-peer-memory-dkms)"
grep -q '^nv_peer_mem ' /proc/modules || bad "the postinst did not load nv_peer_mem"
[ "$(cat /sys/module/nv_peer_mem/version 2>/dev/null)" = 1.3-0 ] || bad "loaded nv_peer_mem reports version '$(cat /sys/module/nv_peer_mem/version 2>/dev/null)'"
for c in nv_mem nv_mem_nc; do
	[ "$(cat /sys/kernel/mm/memory_peers/$c/version 2>/dev/null)" = 1.3-0 ] || bad "peer-memory client $c is not registered"
done
grep -qx 'ONBOOT=yes' /etc/infiniband/nv_peer_mem.conf || bad "/etc/infiniband/nv_peer_mem.conf does not say ONBOOT=yes"
out=$(/etc/init.d/nv_peer_mem status 2>&1)
[ "$out" = "nv_peer_mem module is loaded." ] || bad "init script status says '$out'"
ls /etc/rc2.d/S*nv_peer_mem >/dev/null 2>&1 || bad "update-rc.d did not register the init script"
[ -L /etc/systemd/system/multi-user.target.wants/nv_peer_mem.service ] || bad "nv_peer_mem.service is not enabled"
dpkg-query -W -f='${Conffiles}\n' nvidia-peer-memory | grep -q /etc/infiniband/nv_peer_mem.conf ||
	bad "/etc/infiniband/nv_peer_mem.conf is not a conffile"
echo "nv_peer_mem $(cat /sys/module/nv_peer_mem/version 2>/dev/null): clients $(ls /sys/kernel/mm/memory_peers 2>/dev/null | tr '\n' ' ')"

# libnvm: not loaded by the package, not loaded through its PCI alias, loaded on request.
step "libnvm helper module (libnvm-dkms)"
[ -d /sys/module/libnvm ] && bad "libnvm-dkms loaded libnvm (it would take every free NVMe controller)"
alias=$(cat "/sys/bus/pci/devices/$NVME_BDF/modalias" 2>/dev/null)
if [ -n "$alias" ]; then
	modprobe -R "$alias" 2>/dev/null | grep -qx libnvm || bad "depmod did not index libnvm's PCI alias ($alias)"
	# modprobe -R ignores -b; kmod's configuration dump shows what udev's lookup filters out.
	# Read whole first: under pipefail, `modprobe -c | grep -q` fails when grep exits on its
	# match before modprobe has written the rest of the dump (SIGPIPE).
	kmod_conf=$(modprobe -c 2>/dev/null)
	grep -qx 'blacklist libnvm' <<< "$kmod_conf" || bad "libnvm is not blacklisted in kmod's configuration: udev would load it for $NVME_BDF"
else
	bad "no modalias for the NVMe controller '$NVME_BDF'"
fi
modprobe libnvm || bad "modprobe libnvm (the DKMS-installed module)"
[ "$(cat /sys/module/libnvm/version 2>/dev/null)" = 0.3 ] || bad "loaded libnvm reports version '$(cat /sys/module/libnvm/version 2>/dev/null)'"
grep -q '^[0-9]* libnvm helper$' /proc/devices || bad "libnvm registered no 'libnvm helper' char region"
echo "libnvm $(cat /sys/module/libnvm/version 2>/dev/null) loaded; left loaded for the prerm to unload"

# --- 4. use ----------------------------------------------------------------------------------
# Only libcuda comes from the test tree (cudasim): libgdrapi.so.2 must be the packaged one.
CUDADIR=$T/cuda
mkdir -p "$CUDADIR"
ln -s "$(readlink -f "$STAGE_LIB/libcuda.so.1")" "$CUDADIR/libcuda.so.1"
export LD_LIBRARY_PATH=$CUDADIR
lib=$(ldd /usr/bin/gdrcopy_sanity | awk '$1 == "libgdrapi.so.2" { print $3 }')
pkglib=/usr/lib/x86_64-linux-gnu/libgdrapi.so.2
[ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$(readlink -f "$pkglib")" ] && dpkg -L libgdrapi2 | grep -qx "$pkglib" ||
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
	[ "$(readlink -f "$lib")" = /usr/lib/x86_64-linux-gnu/libnvm.so ] && dpkg -L libnvm | grep -qx /usr/lib/x86_64-linux-gnu/libnvm.so ||
		bad "the consumer loads libnvm.so from '$lib', not from the libnvm package"
else
	bad "a libnvm consumer does not build with pkg-config --cflags --libs nvm against the packages"
fi

[ "$(stat_of active_pins)" = "$PINS0" ] || bad "gpusim active_pins $(stat_of active_pins), was $PINS0"
[ "$(stat_of free_pages)" = "$FREE0" ] || bad "gpusim free_pages $(stat_of free_pages), was $FREE0"

# --- 5. purge --------------------------------------------------------------------------------
files=$(dpkg -L "${PKGS[@]}" 2>/dev/null | sort -u)
step "dpkg --purge"
DEBIAN_FRONTEND=noninteractive timeout -k 10 600 dpkg --purge gdrcopy gdrcopy-tests libgdsync-dev libgdsync2 libnvm-dev libnvm libgdrapi-dev \
	gdrdrv-dkms libgdrapi2 libnvm-dkms nvidia-peer-memory nvidia-peer-memory-dkms < /dev/null 2>&1 | tee "$VMTEST_OUT/70-dpkg-purge.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || bad "dpkg --purge failed (exit $rc)"
left=$(dpkg-query -W -f='${Package} ${Status}\n' "${PKGS[@]}" 2>/dev/null)
for p in "${PKGS[@]}"; do
	grep -q "^$p .*installed" <<< "$left" && bad "$p still installed"
done
grep -q '^gdrdrv ' /proc/modules && bad "gdrdrv is still loaded after purge"
grep -qw gdrdrv /proc/devices && bad "gdrdrv still registered in /proc/devices"
[ -e /dev/gdrdrv ] && bad "/dev/gdrdrv still exists after purge"
[ -e /var/lib/dkms/gdrdrv ] && bad "/var/lib/dkms/gdrdrv still exists after purge"
left=$(find "/lib/modules/$KVER" -name 'gdrdrv.ko*' 2>/dev/null)
[ -z "$left" ] || bad "built module left behind: $left"
modinfo gdrdrv >/dev/null 2>&1 && bad "modinfo still finds a gdrdrv module"
[ -e /usr/src/gdrdrv-2.6 ] && bad "/usr/src/gdrdrv-2.6 still exists"
for m in "${DKMS_MODS[@]}"; do
	read -r name ver pkg <<< "$m"
	[ "$name" = gdrdrv ] && continue
	grep -q "^$name " /proc/modules && bad "$name is still loaded after purge"
	[ -e "/var/lib/dkms/$name" ] && bad "/var/lib/dkms/$name still exists after purge"
	left=$(find "/lib/modules/$KVER" -name "$name.ko*" 2>/dev/null)
	[ -z "$left" ] || bad "built module left behind: $left"
	[ -e "/usr/src/$name-$ver" ] && bad "/usr/src/$name-$ver still exists"
	# the archive staged in step 2 is not the package's: it goes here
	rm -f "/usr/share/$name-dkms/$name-$ver.dkms.tar.gz"
	rmdir "/usr/share/$name-dkms" || bad "/usr/share/$name-dkms holds more than the staged archive"
done
rm -f /usr/share/gdrdrv-dkms/gdrdrv-2.6.dkms.tar.gz
rmdir /usr/share/gdrdrv-dkms || bad "/usr/share/gdrdrv-dkms holds more than the staged archive"
[ -e /sys/kernel/mm/memory_peers/nv_mem ] && bad "the nv_mem client is still registered after purge"
for f in /etc/infiniband/nv_peer_mem.conf /etc/init.d/nv_peer_mem /etc/systemd/system/multi-user.target.wants/nv_peer_mem.service; do
	[ -e "$f" ] || [ -L "$f" ] && bad "$f still exists after purge"
done
ls /etc/rc?.d/*nv_peer_mem >/dev/null 2>&1 && bad "init links of nv_peer_mem left after purge"
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
