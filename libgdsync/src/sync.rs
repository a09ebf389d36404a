//! Locking as the whole crate does it.

#![forbid(unsafe_code)]

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also after a panic elsewhere poisoned it: every structure behind these mutexes is
/// kept consistent between statements, so a panic (caught at the C boundary) leaves nothing half
/// done that the next caller could trip on.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
