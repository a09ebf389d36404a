// SPDX-License-Identifier: MIT OR GPL-2.0
/* Probe: pat_enabled() is a function (x86, Linux 4.2+). */
#include <linux/types.h>
#include <asm/pgtable.h>
#include <asm/memtype.h>

bool gdrdrv_probe(void);
bool gdrdrv_probe(void)
{
	return pat_enabled();
}
