//! Raw memory accesses performed by stream workers and synchronous copies: the simulated GPU's
//! loads and stores. Every function takes addresses that the caller validated against the
//! range table (or that the CUDA contract makes the API user responsible for).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// # Safety
/// `[src, src+len)` readable and `[dst, dst+len)` writable for the whole call.
pub unsafe fn copy(dst: u64, src: u64, len: u64) {
    // SAFETY: forwarded contract; `copy` (memmove) tolerates overlap, as cuMemcpy on one
    // allocation may.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) }
}

/// Element of a memset.
#[derive(Clone, Copy, Debug)]
pub enum Elem {
    U8(u8),
    U16(u16),
    U32(u32),
}

impl Elem {
    pub fn size(self) -> u64 {
        match self {
            Elem::U8(_) => 1,
            Elem::U16(_) => 2,
            Elem::U32(_) => 4,
        }
    }
}

/// # Safety
/// `[dst, dst + count*elem.size())` writable and aligned to the element size.
pub unsafe fn fill(dst: u64, count: u64, elem: Elem) {
    let n = count as usize;
    // SAFETY: forwarded contract (alignment checked by the API layer).
    unsafe {
        match elem {
            Elem::U8(v) => std::ptr::write_bytes(dst as *mut u8, v, n),
            Elem::U16(v) => std::slice::from_raw_parts_mut(dst as *mut u16, n).fill(v),
            Elem::U32(v) => std::slice::from_raw_parts_mut(dst as *mut u32, n).fill(v),
        }
    }
}

/// Atomic 32-bit load with acquire ordering (a GPU wait's read).
///
/// # Safety
/// `addr` is 4-byte aligned and readable for the whole call.
pub unsafe fn load32(addr: u64) -> u32 {
    // SAFETY: forwarded contract; other parties access the word with atomics or volatiles.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }.load(Ordering::Acquire)
}

/// # Safety
/// `addr` is 8-byte aligned and readable for the whole call.
pub unsafe fn load64(addr: u64) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }.load(Ordering::Acquire)
}

/// Atomic 32-bit store with release ordering, preceded by a full fence unless the caller asked
/// for no memory barrier.
///
/// # Safety
/// `addr` is 4-byte aligned and writable for the whole call.
pub unsafe fn store32(addr: u64, v: u32, barrier: bool) {
    if barrier {
        fence(Ordering::SeqCst);
    }
    // SAFETY: forwarded contract.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }.store(v, Ordering::Release)
}

/// # Safety
/// `addr` is 8-byte aligned and writable for the whole call.
pub unsafe fn store64(addr: u64, v: u64, barrier: bool) {
    if barrier {
        fence(Ordering::SeqCst);
    }
    // SAFETY: forwarded contract.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }.store(v, Ordering::Release)
}

/// Condition of `cuStreamWaitValue32` (cond = GEQ 0, EQ 1, AND 2, NOR 3).
pub fn cond32(cur: u32, want: u32, cond: u32) -> bool {
    match cond {
        0 => (cur.wrapping_sub(want) as i32) >= 0,
        1 => cur == want,
        2 => cur & want != 0,
        _ => !(cur | want) != 0,
    }
}

/// Condition of `cuStreamWaitValue64`.
pub fn cond64(cur: u64, want: u64, cond: u32) -> bool {
    match cond {
        0 => (cur.wrapping_sub(want) as i64) >= 0,
        1 => cur == want,
        2 => cur & want != 0,
        _ => !(cur | want) != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_conditions() {
        // GEQ is cyclic: 0 >= 0xffff_ffff because (int32)(0 - 0xffffffff) = 1.
        assert!(cond32(5, 5, 0));
        assert!(cond32(6, 5, 0));
        assert!(!cond32(4, 5, 0));
        assert!(cond32(0, 0xffff_ffff, 0));
        assert!(!cond32(0x8000_0001, 1, 0));
        assert!(cond32(7, 7, 1) && !cond32(7, 8, 1));
        assert!(cond32(0b1010, 0b0010, 2) && !cond32(0b1000, 0b0111, 2));
        // NOR: ~(cur | want) != 0, i.e. some bit is clear in both.
        assert!(cond32(0, 0, 3));
        assert!(!cond32(0xffff_0000, 0x0000_ffff, 3));
        assert!(cond32(0xfffe_0000, 0x0000_ffff, 3));
        assert!(cond64(1 << 40, 1 << 40, 0) && !cond64((1 << 40) - 1, 1 << 40, 0));
        assert!(cond64(0, u64::MAX, 0));
        assert!(!cond64(u64::MAX, 0, 3) && cond64(u64::MAX - 1, 0, 3));
        assert!(cond64(1 << 63, 1 << 63, 2) && !cond64(1 << 62, 1 << 63, 2));
    }

    #[test]
    fn fill_and_copy() {
        let mut buf = [0u32; 8];
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: p points to 32 writable, aligned bytes.
        unsafe { fill(p + 4, 3, Elem::U32(0xdead_beef)) };
        assert_eq!(buf, [0, 0xdead_beef, 0xdead_beef, 0xdead_beef, 0, 0, 0, 0]);
        // SAFETY: both ranges lie within buf.
        unsafe { copy(p + 16, p + 4, 12) };
        assert_eq!(buf[4..7], [0xdead_beef; 3]);
        // SAFETY: p is aligned and within buf.
        unsafe { store32(p, 9, true) };
        // SAFETY: as above.
        assert_eq!(unsafe { load32(p) }, 9);
    }
}
