// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * nv-p2p-dummy - build helper (module name "nvidia"), never installed or loaded.
 *
 * When gdrdrv is built without the Module.symvers of a module that really provides the
 * nvidia_p2p_* API (the NVIDIA driver, or the test-only gpusim), modpost needs some module that
 * exports those symbols, and with CONFIG_MODVERSIONS their CRCs. This module exports stubs with
 * the exact prototypes from nv-p2p.h, so the CRCs recorded in gdrdrv.ko match the real
 * provider's. Every stub fails with -EINVAL.
 */
#include <linux/module.h>
#include <linux/errno.h>

#include "nv-p2p.h"

int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address, u64 length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	return -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_get_pages);

int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	return -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_put_pages);

int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	return -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_free_page_table);

#ifdef NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API
int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table, u32 flags)
{
	return -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_get_pages_persistent);

int nvidia_p2p_put_pages_persistent(u64 virtual_address,
				    struct nvidia_p2p_page_table *page_table, u32 flags)
{
	return -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_put_pages_persistent);
#endif

#ifdef NVIDIA_P2P_CAP_PERSISTENT_PAGES
int nvidia_p2p_cap_persistent_pages;
EXPORT_SYMBOL(nvidia_p2p_cap_persistent_pages);
#endif

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("Build-time stand-in for the NVIDIA p2p symbols (do not load)");
