//! Libraries opened for the life of the process and their symbols as typed functions, on
//! `gpudirect_common::dl` (the function pointers taken from them outlive every owner, so none is
//! ever closed).

use std::ffi::CStr;

use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;

/// `dlopen(name)`, never closed.
pub(crate) fn open(name: &str) -> Result<&'static Library, String> {
    Ok(Box::leak(Box::new(Library::open(name)?)))
}

/// Resolves `name` in `lib` as a function pointer of type `F`; the error reads as dlerror's.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type matching the symbol's real signature.
pub(crate) unsafe fn sym<F: Copy>(lib: &Library, name: &CStr) -> Result<F, String> {
    let Some(p) = lib.symbol(name) else {
        let name = name.to_string_lossy();
        return Err(format!("{name}: {}: undefined symbol: {name}", lib.name()));
    };
    // SAFETY: the caller vouches that F is the symbol's type.
    Ok(unsafe { as_fn::<F>(p) })
}
