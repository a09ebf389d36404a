//! The error type of the whole stack: a positive errno value.
//!
//! Upstream's C APIs report failures as errno numbers (gdrcopy returns them, libgdsync returns them
//! too), so the internal error *is* the errno; conversion to a C return value happens only in each
//! library's C boundary.

use std::fmt;
use std::io;

/// A positive `errno` value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

/// Result with [`Errno`] as the error.
pub type Result<T> = std::result::Result<T, Errno>;

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EFAULT: Errno = Errno(libc::EFAULT);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    pub const ENODEV: Errno = Errno(libc::ENODEV);

    /// The errno the last failed libc call left behind.
    pub fn last() -> Errno {
        Errno(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }

    /// The errno's description exactly as C's `strerror` gives it (no "(os error N)" suffix).
    pub fn describe(self) -> String {
        // SAFETY: strerror returns a pointer to a NUL-terminated string owned by libc; we copy it
        // before any other libc call could overwrite it (glibc's is thread-local for unknown
        // values and static for known ones).
        let p = unsafe { libc::strerror(self.0) };
        if p.is_null() {
            return format!("Unknown error {}", self.0);
        }
        // SAFETY: non-NULL strerror result is a valid C string (see above).
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Turns the return value of a libc call that reports failure as `-1` into a [`Result`].
pub fn check_syscall<T: PartialEq + From<i8>>(ret: T) -> Result<T> {
    if ret == T::from(-1) { Err(Errno::last()) } else { Ok(ret) }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self.describe())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "errno={} ({})", self.0, self.describe())
    }
}

impl std::error::Error for Errno {}

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> Self {
        io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_syscall_becomes_its_errno() {
        // SAFETY: close() on a descriptor number that is certainly not open only sets errno.
        let r = check_syscall(unsafe { libc::close(-5) });
        assert_eq!(r, Err(Errno::EBADF));
        assert_eq!(check_syscall(3i32), Ok(3));
    }

    #[test]
    fn io_error_round_trip_keeps_the_number() {
        let e: Errno = io::Error::from_raw_os_error(libc::EACCES).into();
        assert_eq!(e, Errno::EACCES);
        assert!(e.to_string().contains("errno=13"));
        assert_eq!(Errno::ENOENT.describe(), "No such file or directory");
    }
}
