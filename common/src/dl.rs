//! Run-time loading of shared libraries (dlopen/dlsym), the only unsafe FFI of this crate.

use std::ffi::{CStr, CString, c_void};
use std::ptr::NonNull;

/// An open shared library; closed on drop.
#[derive(Debug)]
pub struct Library {
    handle: NonNull<c_void>,
    name: String,
}

// SAFETY: a dlopen handle is a process-global reference count; glibc's dl* functions are
// thread-safe, so the handle may be used and dropped from any thread.
unsafe impl Send for Library {}
// SAFETY: see above; `&Library` only allows dlsym, which is thread-safe.
unsafe impl Sync for Library {}

/// The text of the last dl* error of this thread.
fn last_dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until the
    // next dl* call on this thread; we copy it immediately.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dynamic loader error".to_owned()
    } else {
        // SAFETY: non-NULL dlerror result is a valid C string (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`; the error is dlerror's text.
    pub fn open(name: &str) -> Result<Library, String> {
        let c = CString::new(name).map_err(|_| format!("invalid library name {name:?}"))?;
        // SAFETY: `c` is a valid NUL-terminated string; dlopen has no other preconditions.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        match NonNull::new(h) {
            Some(handle) => Ok(Library { handle, name: name.to_owned() }),
            None => Err(last_dl_error()),
        }
    }

    /// The file name this library was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address of `symbol`, or None when the library does not define it.
    pub fn symbol(&self, symbol: &CStr) -> Option<NonNull<c_void>> {
        // SAFETY: the handle is live (owned by self) and `symbol` is NUL-terminated.
        NonNull::new(unsafe { libc::dlsym(self.handle.as_ptr(), symbol.as_ptr()) })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful dlopen and is closed exactly once, here.
        unsafe { libc::dlclose(self.handle.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_resolves_and_missing_library_is_reported() {
        let lib = Library::open("libc.so.6").expect("libc is always present");
        assert!(lib.symbol(c"getpid").is_some());
        assert!(lib.symbol(c"no_such_symbol_here").is_none());
        let err = Library::open("libdefinitely-not-here.so.9").unwrap_err();
        assert!(err.contains("libdefinitely-not-here"), "{err}");
    }
}
