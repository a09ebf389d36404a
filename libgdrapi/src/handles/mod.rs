//! The C API's handles and the protocol that keeps a lock-free copy from touching a mapping
//! after it is gone.
//!
//! A `gdr_t` or `gdr_mh_t` is the address of a slot in a reserved region ([`slab`], [`registry`]),
//! so a stale or foreign value is refused, never dereferenced. The public copy calls take no lock
//! on these handles: a copy is the library's reason to exist and costs a few nanoseconds, so its
//! path may take no lock, do no atomic read-modify-write on a shared cache line and make no call
//! into the kernel. Unmapping is rare and costs a system call anyway, so the cost of keeping a
//! mapping alive under a copy is moved to the unmapping side ([`control`]), in five steps:
//!
//! 1. **A copy announces itself**: it stores the handle in its thread's own cache line
//!    ([`grace`], reached through [`thread_words`]; a release store, so the thread's earlier
//!    copies happen before it), then reads the handle's mirror in its slot and copies. The fast
//!    path leaves the announcement in place after the copy (one store per copy, none when the
//!    line names the handle already).
//! 2. **Retract**: the control path clears the handle's mirror first ([`registry`]: the fast
//!    path's window becomes empty, the general path sees the handle unmapped).
//! 3. **membarrier**: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every thread pass a
//!    full barrier, so a copy either saw the retraction (and gives up) or its announcement is
//!    visible now: the asymmetric Dekker pattern of liburcu's membarrier flavour. Where
//!    `membarrier` is missing, copies fence after announcing themselves instead (decided once,
//!    at the first `gdr_open`).
//! 4. **Look for lines naming the handle** ([`grace::retire`], which answers an [`grace::Exit`]).
//!    A line that no longer names it belongs to a thread that has moved on (its later store comes
//!    after its accesses).
//! 5. **Unmap or park**: unmap at once if no line names the handle. Otherwise never wait: a line
//!    naming it may belong to a copy under way or to a thread whose last copy went through it
//!    long ago, and the two look the same. The range is parked instead ([`parking`]): replaced by
//!    anonymous memory at the same addresses, and unmapped once no line names the handle.
//!
//! Layers, bottom to top: [`slab`] and [`thread_words`]; [`grace`]; [`parking`] and
//! [`registry`]; [`control`]. Nothing here imports the copy path (`fastcopy`, `capi`), which
//! reads [`registry::Mirror`] and [`thread_words`] from above; the core gets the parking policy
//! as a disposer from [`control`]. Why this scheme and the alternatives measured:
//! docs/decisions/0002-parking-not-waiting.md and docs/decisions/0003-membarrier.md.

pub(crate) mod control;
pub(crate) mod grace;
pub(crate) mod parking;
pub(crate) mod registry;
pub(crate) mod slab;
pub(crate) mod thread_words;
