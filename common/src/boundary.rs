//! The C boundary guard.
//!
//! Every exported function of our libraries runs its body through [`guard`]: a panic is caught,
//! reported through the library's logger and converted into the function's documented failure
//! value, so unwinding never crosses into C (which would be undefined behaviour).
//!
//! Both libraries use this module and nothing else at their C edge: [`guard`] for functions that
//! return a pointer or a value, [`errno_call`] for the `int`-returning ones (0 or an errno).

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::Result;

/// Runs `body`; if it panics, calls `report(message)` and returns `on_panic`.
///
/// `AssertUnwindSafe` is sound here: after a panic the body's partial state is never observed
/// again by this call, and shared state that a panic could leave half-updated lives behind mutexes,
/// which poison.
#[inline(always)]
pub fn guard<T>(on_panic: T, report: impl FnOnce(&str), body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            report(&msg);
            on_panic
        }
    }
}

/// The `int` convention of both C APIs: `Ok` is 0, `Err(e)` is `e`'s errno, a panic is `EIO`
/// (after `report`). Inlined so an exported hot call costs nothing over its body when it does not
/// panic (the unwinding landing pad is off the straight-line path).
#[inline(always)]
pub fn errno_call(report: impl FnOnce(&str), body: impl FnOnce() -> Result<()>) -> c_int {
    guard(libc::EIO, report, || match body() {
        Ok(()) => 0,
        Err(e) => e.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_failure_value_and_is_reported() {
        let mut seen = String::new();
        let v = guard(-1, |m| seen = m.to_owned(), || -> i32 { panic!("boom {}", 7) });
        assert_eq!(v, -1);
        assert_eq!(seen, "boom 7");
    }

    #[test]
    fn errno_call_maps_ok_err_and_panic() {
        assert_eq!(errno_call(|_| unreachable!(), || Ok(())), 0);
        assert_eq!(errno_call(|_| unreachable!(), || Err(crate::Errno::EINVAL)), libc::EINVAL);
        let mut seen = false;
        assert_eq!(errno_call(|_| seen = true, || panic!("x")), libc::EIO);
        assert!(seen);
    }

    #[test]
    fn a_normal_return_passes_through() {
        assert_eq!(guard(-1, |_| unreachable!(), || 42), 42);
    }
}
