//! The one CUDA driver loader: `dlopen` of libcuda and `cuGetProcAddress` with explicit versions.
//!
//! Neither library links libcuda: a machine without a GPU must be able to load them. Each library
//! declares the typed function table it needs and fills it with [`Driver::resolve`].

use std::ffi::{CStr, c_int, c_void};
use std::ptr::NonNull;

use crate::dl::Library;

/// `CUresult` (an `enum` in cuda.h, 4 bytes).
pub type CuResult = c_int;
pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;

/// `cuGetProcAddress` flag: resolve the default (non per-thread-stream) variants.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;

type GetProcAddressV2 = unsafe extern "C" fn(*const libc::c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;
type GetProcAddressV1 = unsafe extern "C" fn(*const libc::c_char, *mut *mut c_void, c_int, u64) -> CuResult;
type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CuResult;

enum Resolver {
    V2(GetProcAddressV2),
    V1(GetProcAddressV1),
}

/// An opened CUDA driver library.
pub struct Driver {
    lib: Library,
    resolver: Resolver,
}

/// Why the driver could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// dlopen failed (dlerror text).
    Open(String),
    /// The library has no `cuGetProcAddress`.
    NoResolver,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Open(e) => write!(f, "{e}"),
            LoadError::NoResolver => write!(f, "the CUDA driver library has no cuGetProcAddress"),
        }
    }
}

/// Reinterprets a resolved symbol address as the function pointer type `F`.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type whose signature matches the symbol's.
pub unsafe fn as_fn<F: Copy>(p: NonNull<c_void>) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: F is pointer-sized (checked above) and, per the caller's contract, a function
    // pointer type matching the symbol at `p`.
    unsafe { std::mem::transmute_copy::<NonNull<c_void>, F>(&p) }
}

impl Driver {
    /// Opens `name` (e.g. `libcuda.so.1`) and finds its `cuGetProcAddress`.
    pub fn load(name: &str) -> Result<Driver, LoadError> {
        let lib = Library::open(name).map_err(LoadError::Open)?;
        let resolver = if let Some(p) = lib.symbol(c"cuGetProcAddress_v2") {
            // SAFETY: cuGetProcAddress_v2 has this 5-argument signature in every CUDA ≥ 12.
            Resolver::V2(unsafe { as_fn::<GetProcAddressV2>(p) })
        } else if let Some(p) = lib.symbol(c"cuGetProcAddress") {
            // SAFETY: the unversioned symbol is the 4-argument v1 entry point (CUDA 11.3+).
            Resolver::V1(unsafe { as_fn::<GetProcAddressV1>(p) })
        } else {
            return Err(LoadError::NoResolver);
        };
        Ok(Driver { lib, resolver })
    }

    /// The library's file name.
    pub fn name(&self) -> &str {
        self.lib.name()
    }

    /// `cuDriverGetVersion`, looked up directly (it exists in every driver).
    pub fn driver_version(&self) -> Result<c_int, CuResult> {
        let p = self.lib.symbol(c"cuDriverGetVersion").ok_or(CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: cuDriverGetVersion(int *) is the documented signature.
        let f = unsafe { as_fn::<DriverGetVersion>(p) };
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out pointer for the duration of the call.
        let r = unsafe { f(&mut v) };
        if r == CUDA_SUCCESS { Ok(v) } else { Err(r) }
    }

    /// Resolves `symbol` (base name, e.g. `cuMemAlloc`) as the driver exposes it to code built
    /// against CUDA `version` (e.g. 12000): the driver picks the matching `_v2`/`_v3` variant.
    pub fn resolve(&self, symbol: &CStr, version: c_int) -> Result<NonNull<c_void>, CuResult> {
        let mut p: *mut c_void = std::ptr::null_mut();
        let r = match self.resolver {
            Resolver::V2(f) => {
                let mut status: c_int = 0;
                // SAFETY: symbol is NUL-terminated; p and status are valid out pointers.
                unsafe { f(symbol.as_ptr(), &mut p, version, CU_GET_PROC_ADDRESS_DEFAULT, &mut status) }
            }
            // SAFETY: as above, with the 4-argument signature.
            Resolver::V1(f) => unsafe { f(symbol.as_ptr(), &mut p, version, CU_GET_PROC_ADDRESS_DEFAULT) },
        };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        NonNull::new(p).ok_or(CUDA_ERROR_NOT_FOUND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_resolver_is_refused() {
        match Driver::load("libc.so.6") {
            Err(LoadError::NoResolver) => {}
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("libc must not look like a CUDA driver"),
        }
        assert!(matches!(Driver::load("libnot-a-cuda.so.1"), Err(LoadError::Open(_))));
    }
}
