//! Slots at fixed addresses, for the values C holds (`gdr_t`, `gdr_mh_t.h`).
//!
//! C hands those values back to us on every call, and upstream's own test programs dereference
//! them (spec §1.8), so each one is the address of a record with upstream's layout. Keeping the
//! records in one reserved region, instead of individual heap allocations, lets the copy path
//! validate a handle with an address-range check and one load: no hash lookup, no lock. Slot memory
//! is never returned to the system, so reading a stale slot is always safe; what it holds tells
//! whether it is live.
//!
//! The region is reserved once as `PROT_NONE` (no memory, no commit charge) and made accessible
//! in 64 KiB steps as slots are first used. Freed slots are reused first-in first-out, and only
//! once [`QUARANTINE`] other slots have been freed after them, so a stale value keeps failing for
//! a long while before it can alias a new one.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpudirect_common::{Errno, Result};

/// Freed slots wait behind this many others before reuse.
pub(crate) const QUARANTINE: usize = 4096;

const COMMIT_STEP: usize = 64 << 10;

/// A slot type.
///
/// # Safety
/// All-zero bytes must be a valid value, every field must be usable through a shared reference
/// from any thread (atomics or `UnsafeCell`s guarded by the owner's lock), and the alignment must
/// divide 4096.
pub(crate) unsafe trait Slot: Sync {}

/// The index of a slot that exists: made only by [`Region::index_of`] and [`Allocator::alloc`],
/// and regions only grow, so [`Region::get`] needs no bounds check. Each slot type has one region.
pub(crate) struct SlotIndex<T>(usize, PhantomData<T>);

impl<T> SlotIndex<T> {
    pub(crate) fn get(&self) -> usize {
        self.0
    }
}

impl<T> Clone for SlotIndex<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SlotIndex<T> {}

/// A reserved region of `cap` slots of type `T`.
pub(crate) struct Region<T: Slot> {
    cap: usize,
    /// Start of the reservation; 0 until the first slot is allocated (then `committed` is 0 too, so
    /// no address validates).
    base: AtomicUsize,
    /// Slots `[0, committed)` are accessible (only grows, under the owner's lock).
    committed: AtomicUsize,
    _slot: PhantomData<T>,
}

impl<T: Slot> Region<T> {
    pub(crate) const fn new(cap: usize) -> Region<T> {
        Region { cap, base: AtomicUsize::new(0), committed: AtomicUsize::new(0), _slot: PhantomData }
    }

    const STRIDE: usize = size_of::<T>();
    /// `log2(STRIDE)`: slots are a power of two apart, so [`Region::index_of`] is one rotation.
    const SHIFT: u32 = {
        assert!(Self::STRIDE.is_power_of_two(), "slot sizes are powers of two");
        Self::STRIDE.trailing_zeros()
    };

    fn reserve(&self) -> Result<usize> {
        let b = self.base.load(Ordering::Relaxed);
        if b != 0 {
            return Ok(b);
        }
        let len = self.cap * Self::STRIDE;
        // SAFETY: a fresh anonymous reservation at a kernel-chosen address aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = Errno::last();
            gdr_err!("cannot reserve {len} bytes for handle records: {}", std::io::Error::last_os_error());
            return Err(e);
        }
        // The caller holds the owner's lock, so nobody else reserves meanwhile; `committed` is
        // published after this with Release, so readers that see a slot see the base too.
        self.base.store(p as usize, Ordering::Relaxed);
        Ok(p as usize)
    }

    /// The index of the slot at `addr`, if `addr` is exactly a slot that was ever handed out.
    #[inline(always)]
    pub(crate) fn index_of(&self, addr: usize) -> Option<SlotIndex<T>> {
        let (base, count) = self.bounds();
        // SAFETY: bounds of this region, just read.
        unsafe { self.index_within(addr, base, count) }
    }

    /// The region's base and slot count now, for a caller that keeps them for
    /// [`Region::index_within`] (the copy path keeps them per thread). The count only grows.
    #[inline(always)]
    pub(crate) fn bounds(&self) -> (usize, usize) {
        let count = self.committed.load(Ordering::Acquire);
        (self.base.load(Ordering::Relaxed), count)
    }

    /// [`Region::index_of`] against bounds the caller kept.
    ///
    /// One compare checks both the range and the alignment: rotating the offset right by
    /// `log2(STRIDE)` moves any bits of a misaligned offset to the top, far above any count.
    ///
    /// # Safety
    /// `base` and `count` are this region's, as [`Region::bounds`] returned them at some time
    /// (a count read earlier is only smaller), or `count` is 0.
    #[inline(always)]
    pub(crate) unsafe fn index_within(&self, addr: usize, base: usize, count: usize) -> Option<SlotIndex<T>> {
        let i = addr.wrapping_sub(base).rotate_right(Self::SHIFT);
        (i < count).then_some(SlotIndex(i, PhantomData))
    }

    /// The address of slot `i` (C's value for it).
    pub(crate) fn addr_of(&self, i: SlotIndex<T>) -> usize {
        self.base.load(Ordering::Relaxed) + i.0 * Self::STRIDE
    }

    /// Slot `i`.
    #[inline(always)]
    pub(crate) fn get(&self, i: SlotIndex<T>) -> &T {
        // SAFETY: a SlotIndex exists only for a slot below `committed`, which never shrinks, so slot
        // i lies in the committed, never-unmapped part of the reservation; it is aligned
        // (base is page aligned and the alignment of T divides 4096 and STRIDE), and all-zero or
        // previously written bytes are a valid T (trait contract); T is Sync.
        unsafe { &*(self.addr_of(i) as *const T) }
    }

    /// Slot `i` when the caller already has its address (`addr` is what `i` came from): saves
    /// recomputing it on the copy path.
    #[inline(always)]
    pub(crate) fn get_at(&self, i: SlotIndex<T>, addr: usize) -> &T {
        debug_assert_eq!(self.addr_of(i), addr);
        let _ = i;
        // SAFETY: as in `get`: `i` proves the slot at `addr` (from which `index_of` made it) exists.
        unsafe { &*(addr as *const T) }
    }

    /// Makes slots `[0, n)` accessible. Caller holds the owner's lock.
    fn commit(&self, n: usize) -> Result<()> {
        let base = self.reserve()?;
        let have = self.committed.load(Ordering::Relaxed);
        if n <= have {
            return Ok(());
        }
        let from = (have * Self::STRIDE).next_multiple_of(COMMIT_STEP);
        let to = (n * Self::STRIDE).next_multiple_of(COMMIT_STEP).min(self.cap * Self::STRIDE);
        if to > from {
            // SAFETY: [from, to) lies inside our own reservation.
            let r = unsafe {
                libc::mprotect((base + from) as *mut libc::c_void, to - from, libc::PROT_READ | libc::PROT_WRITE)
            };
            if r != 0 {
                let e = Errno::last();
                gdr_err!("cannot commit handle records: {}", std::io::Error::last_os_error());
                return Err(e);
            }
        }
        self.committed.store(to / Self::STRIDE, Ordering::Release);
        Ok(())
    }
}

/// Which slots of a region are free; kept under the owner's lock.
#[derive(Default)]
pub(crate) struct Allocator {
    /// Never-used slots start here.
    fresh: usize,
    /// Freed slots, oldest first.
    freed: VecDeque<usize>,
}

impl Allocator {
    pub(crate) const fn new() -> Allocator {
        Allocator { fresh: 0, freed: VecDeque::new() }
    }

    /// A free slot: the oldest freed one once the quarantine is full, else a fresh one, else (the
    /// region is full) the oldest freed one anyway. ENOMEM when every slot is live.
    pub(crate) fn alloc<T: Slot>(&mut self, region: &Region<T>) -> Result<SlotIndex<T>> {
        let idx = |i| SlotIndex(i, PhantomData);
        if self.freed.len() > QUARANTINE {
            return Ok(idx(self.freed.pop_front().expect("non-empty")));
        }
        if self.fresh < region.cap {
            region.commit(self.fresh + 1)?;
            self.fresh += 1;
            return Ok(idx(self.fresh - 1));
        }
        self.freed.pop_front().map(idx).ok_or_else(|| {
            gdr_err!("all {} handle records are in use", region.cap);
            Errno::ENOMEM
        })
    }

    pub(crate) fn free<T>(&mut self, i: SlotIndex<T>) {
        self.freed.push_back(i.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[repr(C, align(64))]
    struct S {
        a: AtomicU64,
        _pad: [u64; 7],
    }
    // SAFETY: zero is a valid AtomicU64 and array of u64; align 64 divides 4096.
    unsafe impl Slot for S {}

    #[test]
    fn addresses_validate_and_slots_are_reused_only_after_the_quarantine() {
        static R: Region<S> = Region::new(QUARANTINE + 8);
        let mut a = Allocator::new();
        assert!(R.index_of(0x1000).is_none(), "nothing reserved yet");
        let first = a.alloc(&R).unwrap();
        let addr = R.addr_of(first);
        assert_eq!(R.index_of(addr).map(|i| i.get()), Some(first.get()));
        assert!(R.index_of(addr + 8).is_none(), "inside a slot is not a slot");
        assert!(R.index_of(addr.wrapping_sub(64)).is_none());
        assert!(R.index_of(0).is_none());
        R.get(first).a.store(7, Ordering::Relaxed);
        a.free(first);
        // The freed slot comes back only after QUARANTINE more frees, while fresh slots remain.
        let mut seen = Vec::new();
        for _ in 0..QUARANTINE + 7 {
            let i = a.alloc(&R).unwrap();
            assert_ne!(i.get(), first.get(), "reused before the quarantine ran out");
            seen.push(i);
        }
        // The region is now full: the oldest freed slot is handed out.
        assert_eq!(a.alloc(&R).unwrap().get(), first.get());
        assert_eq!(a.alloc(&R).err(), Some(Errno::ENOMEM));
        for i in seen {
            a.free(i);
        }
        assert!(a.alloc(&R).is_ok());
    }
}
