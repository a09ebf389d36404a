/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * compat.h - every kernel-version difference the libnvm helper module cares about, decided by
 * the probes in Kbuild. libnvm.c contains no version checks.
 */
#ifndef LNVM_COMPAT_H
#define LNVM_COMPAT_H

#include <linux/device.h>
#include <linux/mm.h>
#include <linux/module.h>

#ifndef LNVM_HAVE_PIN_USER_PAGES
#error "the libnvm helper needs pin_user_pages() (Linux 5.6 or later)"
#endif

/* 6.4: class_create(name); before: class_create(owner, name). */
static inline struct class *lnvm_class_create(const char *name)
{
#ifdef LNVM_HAVE_CLASS_CREATE_NAME_ONLY
	return class_create(name);
#else
	return class_create(THIS_MODULE, name);
#endif
}

/* 6.5: pin_user_pages() lost its vmas argument. Caller holds the mmap lock for reading. */
static inline long lnvm_pin_user_pages(unsigned long start, unsigned long nr,
				       unsigned int gup_flags, struct page **pages)
{
#ifdef LNVM_PIN_USER_PAGES_HAS_VMAS
	return pin_user_pages(start, nr, gup_flags, pages, NULL);
#else
	return pin_user_pages(start, nr, gup_flags, pages);
#endif
}

/* 5.8 named the mmap lock; before, callers took mmap_sem directly. */
static inline void lnvm_mmap_read_lock(struct mm_struct *mm)
{
#ifdef LNVM_HAVE_MMAP_READ_LOCK
	mmap_read_lock(mm);
#else
	down_read(&mm->mmap_sem);
#endif
}

static inline void lnvm_mmap_read_unlock(struct mm_struct *mm)
{
#ifdef LNVM_HAVE_MMAP_READ_LOCK
	mmap_read_unlock(mm);
#else
	up_read(&mm->mmap_sem);
#endif
}

#endif /* LNVM_COMPAT_H */
