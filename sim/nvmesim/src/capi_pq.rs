//! C entry points for the shared-queue tests (compat-tests/libnvm-pq): stall, out-of-order
//! completion and the I/O command count, which the base C API in [`crate::capi`] lacks.
//!
//! ```c
//! void nvmesim_set_stalled(void* sim, int stalled);      // stop / resume fetching commands
//! void nvmesim_set_out_of_order(void* sim, int ooo);      // complete each fetched batch reversed
//! uint64_t nvmesim_io_commands(void* sim);                // I/O commands fetched so far
//! ```

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use crate::SimController;

fn sim_ref<'a>(p: *mut c_void) -> Option<&'a SimController> {
    // SAFETY: a non-NULL `p` is a pointer nvmesim_start returned and nvmesim_stop has not freed
    // (the C API's contract, as in capi.rs).
    (!p.is_null()).then(|| unsafe { &*p.cast::<SimController>() })
}

gpudirect_common::export! {
    unguarded pub fn nvmesim_set_stalled(p: *mut c_void, stalled: i32) {
        if let Some(s) = sim_ref(p) {
            s.set_stalled(stalled != 0);
        }
    }

    unguarded pub fn nvmesim_set_out_of_order(p: *mut c_void, ooo: i32) {
        if let Some(s) = sim_ref(p) {
            s.set_out_of_order(ooo != 0);
        }
    }

    unguarded pub fn nvmesim_io_commands(p: *mut c_void) -> u64 {
        sim_ref(p).map_or(0, |s| s.stats().io_commands.load(Ordering::SeqCst))
    }
}
