//! The process-wide conditions under which copies must take the general path, one bit each
//! ([`Why`]), and the count of live mappings per type that decides one of them.
//!
//! A leaf: the facts are written by `core` (mappings of several types live) and by
//! `handles::grace` (no `membarrier`), read by the registry when it sets the handles' fast-path
//! mirrors (so the fast path itself never reads them), by the general copy path for its fence,
//! and by `grace` for how readers synchronise. Declared here, below all of them, so that none of
//! them imports another to reach them.

#![forbid(unsafe_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::abi::MappingType;

/// Process-wide conditions under which copies must take the general path, one bit each.
static GENERAL_ONLY: AtomicU8 = AtomicU8::new(0);

/// Why copies must take the general path.
#[derive(Clone, Copy)]
pub(crate) enum Why {
    /// `membarrier` is unavailable: copies fence after announcing themselves (`handles::grace`).
    FencedReaders = 1,
    /// Mappings of more than one type are live: every copy ends with a full fence (spec §4.5).
    MixedTypes = 2,
}

/// Sets (`on`) or clears the condition `why`. The handles' mirrors follow when the control lock
/// is released (`handles::registry::lock`); every caller holds it.
pub(crate) fn set_general(why: Why, on: bool) {
    if on {
        GENERAL_ONLY.fetch_or(why as u8, Ordering::SeqCst);
    } else {
        GENERAL_ONLY.fetch_and(!(why as u8), Ordering::SeqCst);
    }
}

/// Sets the condition `why` for good.
pub(crate) fn require_general(why: Why) {
    set_general(why, true);
}

/// Whether the condition `why` holds now.
#[inline(always)]
pub(crate) fn holds(why: Why) -> bool {
    GENERAL_ONLY.load(Ordering::Relaxed) & why as u8 != 0
}

/// Whether copies may take the fast path at all (no [`Why`] holds).
pub(crate) fn allowed() -> bool {
    GENERAL_ONLY.load(Ordering::SeqCst) == 0
}

/// Process-wide count of live CPU mappings per type: with more than one type in use, copies end
/// with a full fence instead of a store fence (spec §4.5). The counts change only on map and
/// unmap; copies read the one derived condition, [`Why::MixedTypes`].
static LIVE_MAPPINGS: Mutex<[usize; 4]> = Mutex::new([0; 4]);

/// Counts a mapping of type `t` in (`delta` 1) or out (-1), and sets [`Why::MixedTypes`] from the
/// counts.
pub(crate) fn count_mapping(t: MappingType, delta: isize) {
    let mut counts = LIVE_MAPPINGS.lock().unwrap_or_else(|p| p.into_inner());
    counts[t as usize] = counts[t as usize].saturating_add_signed(delta);
    let mixed = counts.iter().skip(1).filter(|&&c| c > 0).count() > 1;
    set_general(Why::MixedTypes, mixed);
}
