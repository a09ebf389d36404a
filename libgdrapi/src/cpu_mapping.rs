//! CPU mappings of pinned GPU memory: the `mmap`/`munmap` calls, kept in one small unsafe module.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd};

use gpudirect_common::{Errno, Result};

/// A live shared mapping created by [`map_shared`]; plain data, unmapped explicitly with [`unmap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuMapping {
    pub addr: usize,
    pub len: usize,
}

impl CpuMapping {
    /// Whether `[p, p + n)` lies inside this mapping.
    #[inline(always)]
    pub fn contains(&self, p: usize, n: usize) -> bool {
        // One subtraction covers p below the mapping (it wraps to a huge offset) and overflow.
        let off = p.wrapping_sub(self.addr);
        off <= self.len && n <= self.len - off
    }
}

/// `mmap(at or NULL, len, PROT_READ|PROT_WRITE, MAP_SHARED[|MAP_FIXED], fd, offset)`. `at` is
/// a range of `len` bytes this library holds as anonymous memory (a parked range,
/// [`crate::handles::parking`]): the new mapping replaces it in one step. If that fails the range is made
/// anonymous again (a failed `MAP_FIXED` may have removed it), so it stays the caller's.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize, offset: u64, at: Option<usize>) -> Result<CpuMapping> {
    let off = libc::off_t::try_from(offset).map_err(|_| Errno::EINVAL)?;
    let (hint, fixed) = match at {
        Some(a) => (a as *mut c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a fresh mapping at a kernel-chosen address cannot alias any Rust object; with
    // MAP_FIXED it replaces a range the caller owns and nothing references; fd is open.
    let p = unsafe {
        libc::mmap(hint, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | fixed, fd.as_raw_fd(), off)
    };
    if p == libc::MAP_FAILED {
        let e = Errno::last();
        if let Some(a) = at {
            let _ = replace_with_anonymous(a, len);
        }
        return Err(e);
    }
    Ok(CpuMapping { addr: p as usize, len })
}

/// Takes back a mapping [`map_shared`] just made, after a later step failed: unmapped, or made
/// anonymous again if it was placed on a parked range (`at`), which stays the caller's.
pub fn undo_map(m: CpuMapping, at: Option<usize>) {
    let _ = if at.is_some() { replace_with_anonymous(m.addr, m.len) } else { unmap(m.addr, m.len) };
}

/// `munmap(addr, len)` of a range the caller hands back (upstream does not check it either).
pub fn unmap(addr: usize, len: usize) -> Result<()> {
    // SAFETY: munmap only changes the address space; callers pass ranges the user obtained from a
    // gdr_map. No Rust reference into the range is alive (copies hold the handle lock, see core).
    let r = unsafe { libc::munmap(addr as *mut c_void, len) };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// Replaces the mapping at `[addr, addr + len)` with private anonymous memory in one step
/// (`mmap(MAP_FIXED)`): the device memory is no longer reachable through the range, yet the range
/// stays ours, readable and writable, so no other mapping can be placed there. The kernel waits
/// for page faults under way in the range before it replaces it.
pub fn replace_with_anonymous(addr: usize, len: usize) -> Result<()> {
    // SAFETY: MAP_FIXED over a range this library mapped and still owns (the caller's); no Rust
    // reference into it is alive (copies only use raw pointers into mappings).
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(Errno::last())
    } else {
        debug_assert_eq!(p as usize, addr);
        Ok(())
    }
}

/// Host page facts (`sysconf(_SC_PAGESIZE)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPage {
    pub size: usize,
    pub shift: u8,
}

impl HostPage {
    pub fn get() -> HostPage {
        // SAFETY: sysconf has no memory-safety preconditions.
        let size = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        HostPage { size, shift: size.trailing_zeros() as u8 }
    }

    pub fn mask(&self) -> usize {
        !(self.size - 1)
    }

    /// `size` rounded up to whole host pages; None on overflow.
    pub fn round_up(&self, size: usize) -> Option<usize> {
        Some(size.checked_add(self.size - 1)? & self.mask())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_is_exact_at_the_edges_and_never_overflows() {
        let m = CpuMapping { addr: 0x10000, len: 0x1000 };
        assert!(m.contains(0x10000, 0x1000));
        assert!(m.contains(0x10fff, 1));
        assert!(m.contains(0x11000, 0), "empty range at the end");
        assert!(!m.contains(0x10fff, 2));
        assert!(!m.contains(0xffff, 1), "below the mapping");
        assert!(!m.contains(0x11000, 1));
        assert!(!m.contains(0x10001, usize::MAX), "length overflow");
        assert!(!m.contains(usize::MAX, 2), "address overflow");
        assert!(!m.contains(0, 0x10001));
    }
}
