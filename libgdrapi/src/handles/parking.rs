//! Removing a mapping that a copy in another thread may still be touching: step 5 of the
//! handle-lifetime protocol ([`super`]).
//!
//! After a mapping is retracted ([`super::registry`]), [`super::grace::retire`] says whether any
//! thread's line still names its handle. Usually none does and the range is unmapped at once. If
//! one does, the range is parked: replaced in one step by anonymous memory, so the device memory
//! behind it is released from the range (and may be unpinned and freed) while the addresses stay
//! ours. A copy still under way then reads zeros or writes into memory nobody reads, exactly as
//! if it had run a moment before the unmap, never into a range that may belong to someone else. A
//! parked range is unmapped once no line names its handle any more (checked at every later
//! retraction and at `gdr_close`), which happens at the named thread's next copy or at its exit.
//!
//! How many ranges can be parked: a thread names one handle at a time, and a handle that is
//! mapped again while its last range is still parked gets that range back ([`take_for_remap`]:
//! the same pin's memory at the same addresses, so a copy still under way from before lands
//! where it would have a moment earlier). So a pinned buffer holds at most one parked range of a
//! given length, however often it is unmapped and mapped while some thread keeps naming it; once
//! it is unpinned its range only waits for the named threads to move on ([`orphan`]). Each range
//! is address space and a VMA, not memory (anonymous, never touched but by a racing copy).

use std::sync::Mutex;

use gpudirect_common::Result;

use super::grace::{self, Exit};
use crate::cpu_mapping::{self, CpuMapping};

struct Parked {
    key: usize,
    /// Whether the handle still holds the pin this range mapped, so a new mapping of it may be
    /// placed here.
    reusable: bool,
    range: CpuMapping,
}

/// Parked ranges. Taken only under the control lock (so never held across `fork`).
static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());

fn parked() -> std::sync::MutexGuard<'static, Vec<Parked>> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes `m` from the address space as `exit` says.
pub(crate) fn remove(m: CpuMapping, exit: Exit) -> Result<()> {
    match exit {
        Exit::Now => cpu_mapping::unmap(m.addr, m.len),
        Exit::Parked(key) => {
            if let Err(e) = cpu_mapping::replace_with_anonymous(m.addr, m.len) {
                // A failed MAP_FIXED may already have removed the old mapping, so the range cannot
                // be handed back as it was: unmap it (what the caller asked for) and say that a
                // copy racing this call may fault.
                gdr_err!(
                    "cannot park the mapping [{:#x}, +{:#x}) of handle {key:#x} ({e}): unmapping it while a copy \
                     may still use it",
                    m.addr,
                    m.len
                );
                return cpu_mapping::unmap(m.addr, m.len);
            }
            gdr_dbg!("parked the mapping [{:#x}, +{:#x}) until no copy names handle {key:#x}", m.addr, m.len);
            parked().push(Parked { key, reusable: true, range: m });
            Ok(())
        }
    }
}

/// Unmaps every parked range whose handle no line names any more.
pub(crate) fn reclaim() {
    parked().retain(|p| {
        if grace::named(p.key) {
            return true;
        }
        if let Err(e) = cpu_mapping::unmap(p.range.addr, p.range.len) {
            gdr_err!("cannot unmap the parked range [{:#x}, +{:#x}): {e}", p.range.addr, p.range.len);
        }
        false
    });
}

/// A parked range of handle `key`'s pin, taken off the list so that a new mapping of the same pin
/// can be placed on it (see the module comment); the caller hands it back with [`put_back`] if it
/// is not used.
pub(crate) fn take_for_remap(key: usize) -> Option<CpuMapping> {
    let mut v = parked();
    let i = v.iter().position(|p| p.key == key && p.reusable)?;
    Some(v.swap_remove(i).range)
}

/// Returns a range from [`take_for_remap`] that the new mapping did not use (still anonymous).
pub(crate) fn put_back(key: usize, range: CpuMapping) {
    parked().push(Parked { key, reusable: true, range });
}

/// Handle `key` no longer holds its pin: its parked ranges only wait to be unmapped.
pub(crate) fn orphan(key: usize) {
    for p in parked().iter_mut().filter(|p| p.key == key) {
        p.reusable = false;
    }
}

/// The number of parked ranges (for tests, through `capi::parked_mappings`).
pub(crate) fn parked_count() -> usize {
    parked().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anonymous range of `len` bytes, standing in for a mapping to park.
    fn anonymous(len: usize) -> CpuMapping {
        // SAFETY: a fresh private mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        CpuMapping { addr: p as usize, len }
    }

    #[test]
    fn a_parked_range_is_reused_by_its_pin_only_and_unmapped_once_unnamed() {
        grace::init();
        let key = 0x7e57_0000usize;
        // Another thread names the key until told to stop, so no other test's reclaim can take
        // the ranges away meanwhile.
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let a = grace::announce(key);
            ready_tx.send(()).unwrap();
            stop_rx.recv().unwrap();
            drop(a);
        });
        ready_rx.recv().unwrap();
        let m = anonymous(8192);
        remove(m, Exit::Parked(key)).unwrap();
        let taken = take_for_remap(key);
        assert_eq!(taken, Some(m), "the same handle's pin takes its parked range back");
        put_back(key, m);
        orphan(key);
        assert_eq!(take_for_remap(key), None, "after the unpin no new mapping may land there");
        reclaim();
        assert!(parked().iter().any(|p| p.key == key), "still named: still parked");
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        reclaim();
        assert!(!parked().iter().any(|p| p.key == key), "no longer named: unmapped");
        let mut v = [0u8; 2];
        // SAFETY: probing only (mincore fails with ENOMEM on an unmapped range); `v` holds one
        // byte per page of the range.
        let r = unsafe { libc::mincore(m.addr as *mut libc::c_void, m.len, v.as_mut_ptr()) };
        assert_eq!(r, -1, "the range was handed back to the system");
    }
}
