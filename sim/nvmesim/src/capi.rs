//! A tiny C API so C consumers (compat-tests/libnvm) can run against the simulator:
//!
//! ```c
//! void* nvmesim_start(uint64_t n_blocks);           // 512-byte blocks; NULL on bad input
//! volatile void* nvmesim_bar(void* sim);            // BAR0 region (nvmesim_bar_size() bytes)
//! size_t nvmesim_bar_size(void);
//! uint8_t nvmesim_pattern_byte(uint64_t offset);    // initial namespace contents
//! int nvmesim_read_storage(void* sim, uint64_t offset, void* out, size_t len); // 0 or -1
//! void nvmesim_inject(void* sim, int admin, int opcode, int sct, int sc, int dnr, unsigned count);
//! void nvmesim_stop(void* sim);
//! ```
//!
//! The exports are `gpudirect_common::export!`'s unguarded form: this is a test simulator, and a
//! panic in it is a bug that should stop the test (an `extern "C"` function aborts the process
//! rather than unwind into C), not a failure value the C test might take for a refusal.

use std::ffi::c_void;

use crate::{Config, Injection, Match, SimController};

gpudirect_common::export! {
    unguarded pub fn nvmesim_start(n_blocks: u64) -> *mut c_void {
        if n_blocks == 0 || n_blocks > (1 << 20) {
            return std::ptr::null_mut();
        }
        let sim = SimController::start(Config { n_blocks, ..Config::default() });
        Box::into_raw(Box::new(sim)).cast()
    }
}

fn sim<'a>(p: *mut c_void) -> Option<&'a SimController> {
    // SAFETY: a non-NULL `p` is a pointer nvmesim_start returned and nvmesim_stop has not freed
    // (the C API's contract).
    (!p.is_null()).then(|| unsafe { &*p.cast::<SimController>() })
}

gpudirect_common::export! {
    unguarded pub fn nvmesim_bar(p: *mut c_void) -> *mut c_void {
        sim(p).map_or(std::ptr::null_mut(), |s| s.bar())
    }

    unguarded pub fn nvmesim_bar_size() -> usize {
        crate::BAR_SIZE
    }

    unguarded pub fn nvmesim_pattern_byte(offset: u64) -> u8 {
        crate::pattern_byte(offset)
    }

    /// # Safety
    /// `out` must be NULL or point at `len` writable bytes.
    unguarded pub unsafe fn nvmesim_read_storage(p: *mut c_void, offset: u64, out: *mut c_void, len: usize) -> i32 {
        let Some(s) = sim(p) else { return -1 };
        if out.is_null() {
            return -1;
        }
        let st = s.storage();
        let Some(src) = usize::try_from(offset).ok().and_then(|o| st.get(o..o.checked_add(len)?)) else { return -1 };
        // SAFETY: the caller's contract: `out` has room for len bytes; src is exactly len bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.cast::<u8>(), len) };
        0
    }

    unguarded pub fn nvmesim_inject(p: *mut c_void, admin: i32, opcode: i32, sct: i32, sc: i32, dnr: i32, count: u32) {
        if let Some(s) = sim(p) {
            s.inject(Injection {
                matches: Match { admin: admin != 0, opcode: u8::try_from(opcode).ok() },
                sct: sct as u8,
                sc: sc as u8,
                dnr: dnr != 0,
                count,
            });
        }
    }

    unguarded pub fn nvmesim_stop(p: *mut c_void) {
        if !p.is_null() {
            // SAFETY: made by Box::into_raw in nvmesim_start; the caller stops each simulator once.
            drop(unsafe { Box::from_raw(p.cast::<SimController>()) });
        }
    }
}
