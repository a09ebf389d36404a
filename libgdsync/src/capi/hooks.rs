//! libgdsync's side of the C boundary, in a leaf so the per-header export files below `capi`
//! import it without importing their parent.

use std::ffi::c_int;

use gpudirect_common::boundary::Library;
use gpudirect_common::{Errno, Result};

/// libgdsync's side of the C boundary: a panic is logged under the function's name, an error is
/// its errno, and every `int` call first checks that this is not a forked child.
pub(crate) struct Gds;

impl Library for Gds {
    type Error = Errno;
    fn panicked(function: &str, message: &str) {
        gds_err!(function, "internal error (panic): {message}");
    }
    #[inline(always)]
    fn errno(_function: &str, e: Errno) -> c_int {
        e.0
    }
    #[inline(always)]
    fn enter(function: &str) -> Result<()> {
        crate::fork::check(function)
    }
}
