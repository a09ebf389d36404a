//! The C API's handles and the protocol that keeps a copy from touching a mapping after it is
//! gone.
//!
//! A `gdr_t` or `gdr_mh_t` is the address of a slot in a reserved region ([`slab`], [`registry`]),
//! so a stale or foreign value is refused, never dereferenced. The public copy calls take no lock
//! on these handles (a copy costs a few nanoseconds, an unmap a system call), so the lifetime of a
//! mapping is kept by a protocol between copies and the control path ([`control`]):
//!
//! 1. **A copy announces itself**: it stores the handle in its thread's own cache line
//!    ([`grace`], reached through [`thread_words`]), then reads the handle's mirror in its slot
//!    and copies. The fast path leaves the announcement in place after the copy.
//! 2. **Retract**: the control path clears the handle's mirror first ([`registry`]: the fast
//!    path's window becomes empty, the general path sees the handle unmapped).
//! 3. **membarrier**: `membarrier(PRIVATE_EXPEDITED)` makes every thread pass a full barrier, so
//!    a copy either saw the retraction or its announcement is visible now ([`grace::retire`];
//!    without `membarrier`, copies fence after announcing themselves instead).
//! 4. **Look for lines naming the handle** ([`grace::retire`] returns an [`grace::Exit`]).
//! 5. **Unmap or park**: unmap at once if no line names it; otherwise replace the range with
//!    anonymous memory and unmap it once no line names the handle any more ([`parking`]). Never
//!    wait: a line naming the handle may belong to a copy under way or to a thread whose last
//!    copy went through it long ago, and the two look the same.
//!
//! Layers, bottom to top: [`slab`] and [`thread_words`]; [`grace`]; [`parking`] and
//! [`registry`]; [`control`]. Nothing here imports the copy path (`fastcopy`, `capi`), which
//! reads [`registry::Mirror`] and [`thread_words`] from above. Why this scheme and the
//! alternatives measured: docs/decisions/0002-parking-not-waiting.md and
//! docs/decisions/0003-membarrier.md.

pub(crate) mod control;
pub(crate) mod grace;
pub(crate) mod parking;
pub(crate) mod registry;
pub(crate) mod slab;
pub(crate) mod thread_words;
