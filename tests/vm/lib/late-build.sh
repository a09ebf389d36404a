# SPDX-License-Identifier: MIT
# Sourced by the suites whose test programs a late build hook makes (tests/vm/build-host.sh,
# LATE_HOOKS): scripts/vmtest runs those hooks on the host while the guest runs the earlier
# suites, and marks each one's end in $VMTEST_LATE/SUITE.ok or SUITE.failed (tests/vm/guest.sh
# sets VMTEST_LATE to the run directory's late/).

# late_build_wait SUITE: returns 0 once SUITE's late hook has succeeded; prints the hook log's
# tail and returns 1 if it failed, or if no mark came within LATE_BUILD_WAIT seconds (600).
late_build_wait() {
	local mark=${VMTEST_LATE:-$VMTEST_OUT/late}/$1 t0=$SECONDS
	while [ ! -e "$mark.ok" ]; do
		if [ -e "$mark.failed" ]; then
			echo "the host's late build for $1 failed ($mark.log):"
			tail -n 40 "$mark.log" 2>/dev/null | sed 's/^/    | /'
			return 1
		fi
		if [ $((SECONDS - t0)) -ge "${LATE_BUILD_WAIT:-600}" ]; then
			echo "the host's late build for $1 did not finish in ${LATE_BUILD_WAIT:-600} s ($mark.log)"
			return 1
		fi
		sleep 2
	done
	[ $((SECONDS - t0)) -lt 2 ] || echo "waited $((SECONDS - t0)) s for the host's late build of $1"
}
