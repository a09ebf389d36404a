#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Suite: the verbs half of libgdsync on soft-RoCE. Loads rdma_rxe, adds rxe0 on the loopback
# netdev (RoCE v2, GID ::ffff:127.0.0.1), and runs compat-tests/gdsync/verbs_loopback.c: two RC
# QPs from gds_create_qp (CPU-proxy provider) connected over loopback, stream-triggered sends
# of 0..1 MiB, stream waits on both CQs (cudasim stream), batched and CPU-executed descriptors,
# completion errors, teardown with work outstanding, and a ping-pong reporting iterations per
# second (timing under TCG emulation is not meaningful and is not judged), the poll_cq hook
# restored after the last QP, fork() (the child's calls fail with EIO, no deadlock, while another
# thread is inside the library); then again, with smaller counts, built with ASan/UBSan (leak
# check at exit); then a proxy-thread failure (injected panic: stream waits released, EIO
# afterwards, no hang).
# Built on the host by tests/vm/build-host.sh (against include/, the CUDA headers and
# libibverbs-dev), like 30-gdsync's programs.
set -uo pipefail

die() { echo "gdsync-verbs suite FAIL: $*"; cleanup; exit 1; }
RXE_ADDED=0
RXE_LOADED=0
cleanup() {
	[ "$RXE_ADDED" = 1 ] && rdma link delete rxe0 2>/dev/null
	RXE_ADDED=0
	if [ "$RXE_LOADED" = 1 ]; then
		modprobe -r rdma_rxe || echo "warning: cannot unload rdma_rxe"
		RXE_LOADED=0
	fi
	[ -n "${WORK:-}" ] && rm -rf "$WORK"
}

[ -f "$REPO/target/release/libgdsync.so" ] || die "missing target/release/libgdsync.so (cargo build --release)"
[ -e "$STAGE_LIB/libcuda.so.1" ] || die "missing $STAGE_LIB/libcuda.so.1 (cudasim staged by build-host.sh)"
command -v rdma >/dev/null || die "the rdma tool (iproute2) is missing"
for p in verbs_loopback verbs_loopback_asan; do
	[ -x "$STAGE_BIN/$p" ] || die "missing $STAGE_BIN/$p (tests/vm/build-host.sh; it needs libibverbs-dev)"
done

WORK=$(mktemp -d /tmp/gdsync-verbs.XXXXXX)
mkdir -p "$WORK/lib"
# A private copy: the host tree may be rebuilt while we run.
cp "$REPO/target/release/libgdsync.so" "$WORK/lib/libgdsync.so.2"
ln -s libgdsync.so.2 "$WORK/lib/libgdsync.so"
ln -s "$STAGE_LIB/libcuda.so.1" "$WORK/lib/libcuda.so"
ln -s "$STAGE_BIN/verbs_loopback" "$STAGE_BIN/verbs_loopback_asan" "$WORK/"
export LD_LIBRARY_PATH=$WORK/lib:$STAGE_LIB

ip link set lo up
if ! lsmod | grep -q '^rdma_rxe'; then
	modprobe rdma_rxe || die "modprobe rdma_rxe"
	RXE_LOADED=1
fi
rdma link add rxe0 type rxe netdev lo || die "rdma link add rxe0 type rxe netdev lo"
RXE_ADDED=1
for _ in $(seq 50); do
	[ -e /sys/class/infiniband/rxe0/ports/1/gids/1 ] && break
	sleep 0.1
done
rdma link show
for i in 0 1 2; do
	echo "rxe0 gid[$i] $(cat /sys/class/infiniband/rxe0/ports/1/gids/$i 2>/dev/null) $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)"
done

rc=0
timeout 600 "$WORK/verbs_loopback" -d rxe0 -n "${VERBS_ITERS:-10}" -m "${VERBS_MANY:-1000}" -p "${VERBS_PINGPONG:-300}" || rc=$?
echo "verbs_loopback exit status $rc"
if [ $rc -eq 0 ]; then
	# Smaller counts under ASan/UBSan (heap use by the library and the test, leaks at exit).
	ASAN_OPTIONS=detect_leaks=1 timeout 600 "$WORK/verbs_loopback_asan" -d rxe0 -n 2 -m 200 -p 50 || rc=$?
	echo "verbs_loopback under ASan/UBSan exit status $rc"
fi
if [ $rc -eq 0 ]; then
	# Provider selection: the mlx5 direct provider refuses rxe (ENODEV = 19), a bad name is EINVAL.
	GDS_PROVIDER=mlx5 timeout 60 "$WORK/verbs_loopback" -d rxe0 -e 19 || rc=$?
	GDS_PROVIDER=bogus timeout 60 "$WORK/verbs_loopback" -d rxe0 -e 22 || rc=$?
	echo "provider selection checks exit status $rc"
fi
if [ $rc -eq 0 ]; then
	# The proxy thread fails (injected panic after the first posted send): an error, not a hang.
	GDS_TEST_PROXY_PANIC_AFTER=1 timeout 120 "$WORK/verbs_loopback" -d rxe0 -f || rc=$?
	echo "proxy-failure case exit status $rc (124: hang)"
fi
cleanup
if [ $rc -ne 0 ]; then
	echo "gdsync-verbs suite: FAILED"
	exit 1
fi
echo "gdsync-verbs suite: all passed"
