#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Sourced by suites that check the kernel log lines their test provoked. A line count taken
# before the test is no anchor: once the ring buffer is full (gdrdrv's info traces fill it),
# `dmesg | wc -l` stops growing and new lines fall outside the count. So mark the log instead:
#   kmsg_mark NAME        writes a unique mark line to the kernel log
#   kmsg_since NAME       prints the log after that mark; nothing if the mark is gone

kmsg_mark() { echo "vmtest-mark: $1.$$" > /dev/kmsg; }
kmsg_since() {
	local klog
	klog=$(dmesg)
	awk -v m="vmtest-mark: $1.$$" 'found { print } index($0, m) { found = 1 }' <<<"$klog"
}
