// SPDX-License-Identifier: MIT OR GPL-2.0
/* Probe: procfs entries take struct proc_ops (Linux 5.6+). */
#include <linux/proc_fs.h>

const struct proc_ops gdrdrv_probe_ops = {
	.proc_open = NULL,
};
